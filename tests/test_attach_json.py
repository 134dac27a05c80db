"""What `pcietrace report DIR --format json` gives for real attach recordings: one shape for ``gpus`` in every
table, counts as JSON integers (null where unknown), and a JSON reference (docs/json.md) that names every key of the
attach tables."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest

from pcietrace.cli import main
from pcietrace.schema import is_count

from conftest import DATA, ROOT, notes_text

#: Real recordings: one GPU (PyTorch, launches counted), 2x H200 torchrun (a process per GPU), launches not
#: counted, and one with --gpu-time (CUPTI kernel records: the gpu_* columns).
RECORDINGS = ("attach_h100_torch_outside", "attach_h200x2_torchrun_outside", "attach_h100_nocount",
              "attach_h100_decode/decode-eager-gputime")


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    """Each recording's JSON, as a user gets it from the command line."""
    out = {}
    for name in RECORDINGS:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(["report", str(DATA / name), "--format", "json"]) == 0
        out[name] = json.loads(buf.getvalue())
    return out


@pytest.mark.parametrize("name", RECORDINGS)
def test_gpus_is_a_list_of_ints_in_ranges_as_in_range_instances(docs, name: str) -> None:
    res = docs[name]["results"]
    assert res["ranges"] and res["range_instances"]
    for table in ("ranges", "range_instances"):
        for r in res[table]:
            assert isinstance(r["gpus"], list) and r["gpus"], (table, r)
            assert all(type(g) is int for g in r["gpus"]) and r["gpus"] == sorted(set(r["gpus"])), (table, r)
    # a range's GPUs are those its calls were charged to
    union: dict[tuple[str, str], set[int]] = {}
    for i in res["range_instances"]:
        union.setdefault((i["domain"], i["name"]), set()).update(i["gpus"])
    assert {(r["domain"], r["name"]): r["gpus"] for r in res["ranges"]} == {k: sorted(v) for k, v in union.items()}


def test_a_range_of_every_rank_holds_both_gpus_each_call_its_own(docs) -> None:
    """2x H200 torchrun: each rank's calls hold its own GPU; the range row (both ranks) holds both."""
    res = docs["attach_h200x2_torchrun_outside"]["results"]
    sampled = sorted(w["nvml_index"] for w in res["whole_run"])
    truth = [i for i in res["range_instances"] if i["domain"] == "truth"]
    assert len(sampled) == 2 and {len(i["gpus"]) for i in truth} == {1}
    row = next(r for r in res["ranges"] if r["domain"] == "truth" and r["name"] == truth[0]["name"])
    assert row["gpus"] == sampled


def _counts(table: list[dict]) -> dict[str, list]:
    return {k: [r[k] for r in table] for k in (table[0] if table else {}) if is_count(k)}


@pytest.mark.parametrize("name", RECORDINGS)
def test_counts_are_json_integers_or_null(docs, name: str) -> None:
    doc = docs[name]
    tables = {**doc["results"], **{f"summary.{k}": v for k, v in doc["summary"].items() if isinstance(v, list)
                                   and v and isinstance(v[0], dict)}}
    seen = 0
    for table, rows in tables.items():
        for col, values in _counts(rows).items():
            assert all(v is None or type(v) is int for v in values), (table, col, values[:5])
            seen += sum(v is not None for v in values)
    assert seen  # the check above ran on figures, not only on nulls


def test_whole_run_launches_are_ints_as_the_programs_totals(docs) -> None:
    """The real H100 PyTorch run: one GPU, so its row holds every launch of the program; both are integers
    (pandas keeps the per-GPU column float because it may be unknown)."""
    row, = docs["attach_h100_torch_outside"]["results"]["whole_run"]
    for mode in ("eager", "graph"):
        assert type(row[f"{mode}_launches"]) is int and row[f"{mode}_launches"] == row[f"program_{mode}_launches"]
    assert row["eager_launches"] > 0


def test_unknown_counts_are_null_not_zero(docs) -> None:
    """--no-count-launches (real H100 run): the launch counts are unknown: null in JSON, never 0."""
    res = docs["attach_h100_nocount"]["results"]
    for table in ("ranges", "range_instances", "whole_run"):
        launches = [v for col, vals in _counts(res[table]).items() if col.endswith("launches") for v in vals]
        assert launches and all(v is None for v in launches), table
    assert all(type(r["calls"]) is int for r in res["ranges"])  # counted all the same


def test_a_count_with_a_fraction_is_left_as_it_is(docs) -> None:
    import pandas as pd

    from pcietrace.schema import counts_as_ints

    whole = pd.DataFrame(docs["attach_h100_torch_outside"]["results"]["whole_run"]).astype({"eager_launches": float})
    assert counts_as_ints(whole)["eager_launches"].dtype == "Int64"
    half = whole.assign(eager_launches=whole["eager_launches"] + 0.5)
    assert counts_as_ints(half)["eager_launches"].tolist() == half["eager_launches"].tolist()


def test_the_json_reference_names_every_key_of_the_attach_tables(docs) -> None:
    """The JSON reference's attach section (docs/json.md) lists each key of ``ranges``, ``range_instances`` and
    ``whole_run`` that the real recordings carry (--gpu-time's included)."""
    text = (ROOT / "docs" / "json.md").read_text()
    section = text[text.index("## attach's JSON"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    named = set(re.findall(r"`([a-z0-9_]+)`", section))
    for table in ("ranges", "range_instances", "whole_run"):
        keys = {k for doc in docs.values() for r in doc["results"][table] for k in r}
        assert keys and not keys - named, (table, sorted(keys - named))


def test_ranges_with_no_domain_are_in_domain_default(tmp_path) -> None:
    """The real injection library, driven by the nvtx package (no GPU needed): ranges opened without a domain
    (the package's "NVTX" domain, a NULL domain handle in C) are named ``default``, as docs/json.md says; a
    named domain keeps its name."""
    from pcietrace.analysis import attribution
    from pcietrace.record.trace import read_traces
    from injected import run_nvtx_program

    prog = ("import nvtx\n"
            "nvtx.push_range('pushed')\nnvtx.pop_range()\n"
            "with nvtx.annotate('annotated'):\n    pass\n"
            "nvtx.end_range(nvtx.start_range('started'))\n"
            "with nvtx.annotate('mine', domain='mine'):\n    pass\n")
    run_nvtx_program(tmp_path, prog)
    r = attribution.ranges_from_events(read_traces(tmp_path)).set_index("name")["domain"].to_dict()
    assert r == {"pushed": "default", "annotated": "default", "started": "default", "mine": "mine"}


def test_a_saved_report_s_results_hold_counts_as_integers(data_dir) -> None:
    """The folder's report.json keeps `results` as analysed when recorded (:func:`pcietrace.report.saved.to_jsonable`):
    its counts are integers too, as in `report --format json`, and unknown ones null."""
    from pcietrace.analysis import analyze
    from pcietrace.report.saved import to_jsonable
    from pcietrace.session import Session

    saved = to_jsonable(analyze(Session.load(data_dir / "attach_h100_torch_outside")))
    whole = saved["whole_run"][0]
    assert isinstance(whole["eager_launches"], int) and whole["eager_launches"] == whole["program_eager_launches"]
    assert all(isinstance(r["calls"], int) for r in saved["ranges"])
    nocount = to_jsonable(analyze(Session.load(data_dir / "attach_h100_nocount")))
    assert all(r["eager_launches"] is None for r in nocount["range_instances"])


def test_the_console_names_a_ranges_domain_only_where_it_is_not_the_default(monkeypatch, capsys) -> None:
    """The C++ blind oracle's recording has ranges in NVTX's default domain and in the named domain ``blind``:
    the console marks the named one, not the default ones."""
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["report", str(DATA / "attach_h100_blind_cpp")]) == 0
    text = capsys.readouterr().out
    assert re.search(r"h2d_pinned_40MiB \(blind\)", text)
    assert "(default)" not in text and "idle_12ms" in text


def test_a_run_with_cupti_on_says_cupti_moved_bytes_of_its_own(data_dir) -> None:
    """CUPTI's launch callbacks (H100: +2.6-3.0 % H2D per launch) and its kernel records (--gpu-time: +13 % D2H)
    add PCIe bytes, which the ranges then hold: a run with either on says so, naming which; an interposed run
    without --gpu-time says neither. (A real H100 recording, its meta set: the notes depend on nothing else.)"""
    from pcietrace.analysis import analyze
    from pcietrace.report.notes import CUPTI_NOTE, GPU_TIME_NOTE
    from pcietrace.session import Session

    s = Session.load(data_dir / "attach_h100_torch_outside")
    assert not {CUPTI_NOTE, GPU_TIME_NOTE} & set(notes_text(analyze(s)))
    s.meta["launch_counter"] = "cupti"
    assert CUPTI_NOTE in notes_text(analyze(s))
    s.meta.update(launch_counter="interpose", gpu_time=True)
    notes = notes_text(analyze(s))
    assert GPU_TIME_NOTE in notes and CUPTI_NOTE not in notes
