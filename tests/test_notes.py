"""Notes (pcietrace/analysis/notes.py, pcietrace/report/notes.py): analysis says what a report must note as coded
records, the report words them; every code the analysis can emit has a sentence whose fields are exactly the
parameters it is given, and no sentence is left without a code that uses it."""

from __future__ import annotations

import ast
import string

import pandas as pd
import pytest

from pcietrace.analysis import AttachResult, Note, analyze
from pcietrace.report.notes import SENTENCES, merge_gpu_notes, sentence, sentences, with_sentences
from pcietrace.session import Session

from conftest import DATA, ROOT


def _emitted() -> dict[str, set[frozenset[str]]]:
    """Every ``Note(CODE, **params)`` written in the analysis: its code and each call's parameter names."""
    out: dict[str, set[frozenset[str]]] = {}
    for path in (ROOT / "pcietrace" / "analysis").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Note":
                assert node.args and isinstance(node.args[0], ast.Constant), f"{path}:{node.lineno}: a code literal"
                assert all(k.arg for k in node.keywords), f"{path}:{node.lineno}: parameters by name"
                out.setdefault(node.args[0].value, set()).add(frozenset(k.arg for k in node.keywords))
    return out


def _fields(template: str) -> frozenset[str]:
    return frozenset(name for _, name, _, _ in string.Formatter().parse(template) if name)


def test_every_note_code_has_a_sentence_with_its_parameters() -> None:
    emitted = _emitted()
    assert len(emitted) >= 20, "the analysis' notes were not found: the layout moved"
    for code, calls in emitted.items():
        assert code in SENTENCES, f"note {code!r} has no sentence in pcietrace/report/notes.py"
        for params in calls:
            assert params == _fields(SENTENCES[code]), f"note {code!r}: parameters {sorted(params)}"


def test_every_sentence_has_a_code_that_uses_it() -> None:
    assert set(SENTENCES) == set(_emitted())


def test_analysis_words_nothing_the_report_words_everything() -> None:
    """A recording with notes: the analysis gives records, every renderer's input their sentences."""
    res = analyze(Session.load(DATA / "attach_h100_nocount"))
    assert isinstance(res, AttachResult) and res.notes and all(isinstance(n, Note) for n in res.notes)
    assert "launches_not_counted" in {n.code for n in res.notes}
    worded = with_sentences(res)["notes"]["note"].tolist()
    assert worded == sentences(res.notes) and all(isinstance(n, str) for n in worded)
    assert SENTENCES["launches_not_counted"] in worded


def test_a_sentence_is_its_template_filled() -> None:
    note = Note("floor_without_error", gpu=3, windows=1)
    assert note == Note("floor_without_error", gpu=3, windows=1) != Note("floor_without_error", gpu=2, windows=1)
    assert sentence(note) == ("GPU3: its floor rests on 1 idle window(s), too few to estimate its error: its ± "
                              "covers the edges only")
    assert sentence("already worded") == "already worded"  # (a saved report's notes read back)
    nested = Note("node_note", node="host-a", note=Note("no_floor", gpu=0))
    assert sentence(nested) == "host-a: " + sentence(Note("no_floor", gpu=0))


def test_notes_of_several_gpus_that_differ_in_their_figures_become_one() -> None:
    notes = [Note("sampler_stalled", gpu=i, gaps=g, longest_span_ms=1.0, longest_read_ms=0.5)
             for i, g in ((0, 3), (1, 5), (2, 4))] + [Note("launches_not_counted")]
    worded = sentences(notes)
    assert len(worded) == 2 and worded[0].startswith("GPU0-2: the sampler stalled: 3-5 interval(s)")
    assert worded == merge_gpu_notes([sentence(n) for n in notes])


def test_with_sentences_leaves_worded_and_noteless_tables_as_they_are() -> None:
    worded = {"notes": pd.DataFrame({"note": ["a", "b"]}), "x": pd.DataFrame()}
    assert with_sentences(worded)["notes"] is worded["notes"]
    assert with_sentences({"x": pd.DataFrame()}).keys() == {"x"}


@pytest.mark.parametrize("code", sorted(SENTENCES))
def test_a_sentence_names_no_figure_it_is_not_given(code) -> None:
    """Each template formats with its own fields and nothing else (a typo in a field name fails here)."""
    params = {f: 1 for f in _fields(SENTENCES[code])}
    if code == "node_note":
        params["note"] = "x"
    assert SENTENCES[code].format(**params)
