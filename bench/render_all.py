"""Every saved recording rendered every way, into one folder: diff two such folders to show that a change moves no
output (CPU only; not a test, ~2 min on 2 cores).

For each recording under tests/data, reports/, docs/lab/reports/ and ../shared/recordings (each folder with a
report.json): the saved report as `run`/`attach`/`graphs` write it (report.json with the results re-analysed), `pcietrace report`'s
console tables (plain and --detail, 100 columns) and --format json/csv/md/prometheus, the --plot PNGs, the
--perfetto trace (attach), the Python API's repr and str; then `compare` of every run and of every graphs run
against the first of its kind (console, json, csv, md), and attach's savings comparison of the eager/graphed pairs.
Three sessions made here from real ones (labelled in their names) add the kinds no recording has: a `latency`
run (h100_run_latency's latency table alone), an attach that never ran its program (``attach-failed``, no samples
or events) and a session with no GPU and no table.

Usage: python3 bench/render_all.py OUT [--code CHECKOUT]   (CHECKOUT: whose pcietrace to import; default this one)
       diff -r OUT_BEFORE OUT_AFTER
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ("json", "csv", "md", "prometheus")
#: Eager/graphed attach pairs of one program (attach's savings comparison).
_LAB = "docs/lab/reports/h100-savings-20261122/"
SAVINGS_PAIRS = [("tests/data/attach_h100_decode/decode-eager-gputime", "tests/data/attach_h100_decode/decode-graph"),
                 (_LAB + "decode-eager", _LAB + "decode-graph"),
                 (_LAB + "demo-cpp-eager", _LAB + "demo-cpp-graph"),
                 (_LAB + "demo-py-eager", _LAB + "demo-py-graph")]


def recordings() -> list[Path]:
    bases = (ROOT / "tests/data", ROOT / "reports", ROOT / "docs/lab/reports", ROOT.parent / "shared/recordings")
    found = [p.parent for base in bases for p in base.rglob("report.json")]
    return sorted(set(found))


def label(path: Path) -> str:
    rel = path.relative_to(ROOT.parent) if not path.is_relative_to(ROOT) else path.relative_to(ROOT)
    return str(rel).replace("/", "__")


def render(session, results, out: Path, path: Path | None) -> None:
    """One session's every rendering into folder ``out``."""
    from pcietrace.report.saved import to_jsonable
    from pcietrace.analysis.summary import summarize
    from pcietrace.errors import UsageError
    from pcietrace.report.output import emit

    out.mkdir(parents=True)
    summary = summarize(session.meta, results)
    for detail in (False, True):
        buf = io.StringIO()
        emit(session.meta, results, summary, "table", detail, out=buf)
        (out / f"table{'-detail' if detail else ''}.txt").write_text(buf.getvalue())
    for fmt in FORMATS:
        buf = io.StringIO()
        try:
            emit(session.meta, results, summary, fmt, out=buf)
        except UsageError as exc:  # (a format a kind has no figures for, e.g. prometheus of `graphs`: its line)
            buf = io.StringIO(f"refused: {exc}\n")
        (out / f"report.{fmt}").write_text(buf.getvalue())
    with tempfile.TemporaryDirectory() as tmp:
        saved = session.save(Path(tmp) / "run", to_jsonable(results))
        shutil.copy(saved, out / "saved-report.json")
        with contextlib.redirect_stderr(io.StringIO()):
            emit(session.meta, results, summary, "json", plot_dir=out / "plots", out=io.StringIO())
    if session.meta.get("kind") == "attach":
        from pcietrace.report.perfetto import write_trace

        write_trace(session, results, out / "perfetto.json")
    if path is not None:
        import pcietrace

        r = pcietrace.load(path)
        (out / "api.txt").write_text(f"{r!r}\n{r}\n")


def made_up(sessions: dict[str, object]) -> dict[str, object]:
    """The kinds no recording has, made from real ones (named for what they are)."""
    from pcietrace.session import Session

    lat = sessions["tests__data__h100_run_latency"]
    att = sessions["tests__data__attach_h100_python"]
    return {
        "MADE-UP__latency-from-h100_run_latency": Session(meta={**lat.meta, "kind": "latency"}, latency=lat.latency),
        "MADE-UP__attach-failed-from-attach_h100_python": Session(
            meta={**att.meta, "kind": "attach-failed", "status": "interrupted before the program ran"}),
        "MADE-UP__no-gpu-no-table": Session(meta={"gpus": [], "status": "failed: made up"}),
    }


def compare_all(sessions: dict[str, object], out: Path) -> None:
    from pcietrace.analysis import analyze
    from pcietrace.analysis.compare import compare
    from pcietrace.analysis.savings import savings
    from pcietrace.analysis.summary import compare_summary
    from pcietrace.report.output import emit_compare, emit_savings

    by_kind: dict[str, list[str]] = {}
    for name, s in sessions.items():
        if not name.startswith("MADE-UP") and not str(s.meta.get("kind")).startswith("attach"):
            by_kind.setdefault(str(s.meta.get("kind") or "run"), []).append(name)
    for kind, names in by_kind.items():
        runs = [(n, analyze(sessions[n]), sessions[n].meta) for n in names]
        for other in runs[1:]:
            pair = [runs[0], other]
            cmp = compare(pair)
            keys = [r[0] for r in pair]
            for fmt in ("table", "json", "csv", "md"):
                buf = io.StringIO()
                emit_compare(cmp, keys, compare_summary(cmp, keys), fmt, out=buf)
                (out / f"compare-{kind}__{other[0]}.{fmt}").write_text(buf.getvalue())
    for eager, graphed in SAVINGS_PAIRS:
        table = savings(analyze(sessions[label(ROOT / eager)]), analyze(sessions[label(ROOT / graphed)]))
        for fmt in ("table", "json", "csv", "md"):
            buf = io.StringIO()
            emit_savings(table, [eager, graphed], fmt, out=buf)
            (out / f"savings__{label(ROOT / eager)}.{fmt}").write_text(buf.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--code", type=Path, default=ROOT)
    args = ap.parse_args()
    os.environ["COLUMNS"] = "100"  # (rich's width off a terminal)
    sys.path.insert(0, str(args.code.resolve()))
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    import pcietrace

    print(f"pcietrace from {Path(pcietrace.__file__).parent}", file=sys.stderr)
    args.out.mkdir(parents=True)
    paths = {label(p): p for p in recordings()}
    sessions = {name: Session.load(p) for name, p in paths.items()}
    sessions.update(made_up(sessions))
    for name, s in sessions.items():
        render(s, analyze(s), args.out / name, paths.get(name))
    compare_all(sessions, args.out)
    print(f"{len(sessions)} sessions rendered to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
