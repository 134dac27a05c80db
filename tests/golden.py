"""Golden figures of every committed recording: what ``pcietrace.load(folder)`` and ``report --format json`` give.

``python3 tests/golden.py`` compares the current analysis with ``tests/data/golden/``; ``--update`` rewrites it
(after a change meant to move the figures). ``tests/test_golden.py`` runs the comparison. Floats are kept to
:data:`DIGITS` significant digits and compared with :data:`RTOL`, so a reordered sum does not count as a change.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "golden"
DIGITS = 9
#: Relative tolerance of a float: a few units of the last digit kept.
RTOL = 1e-7
#: Absolute tolerance: figures that are differences of large numbers (bytes net of a floor) near 0.
ATOL = 1e-6


def recordings() -> list[Path]:
    """Every recording folder under tests/data (a folder holding report.json), by path."""
    return sorted(p.parent for p in DATA.rglob("report.json") if GOLDEN not in p.parents)


def _name(folder: Path) -> str:
    return str(folder.relative_to(DATA)).replace("/", "__")


def _value(v: Any) -> Any:
    """One cell as JSON: floats to DIGITS significant digits, NaN/inf as strings, numpy scalars as Python's."""
    if isinstance(v, (np.generic,)):
        v = v.item()
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return float(f"{v:.{DIGITS}g}")
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _value(x) for k, x in v.items()}
    if v is pd.NA or v is pd.NaT:
        return "nan"
    return str(v)


#: Tables longer than this (the per-millisecond timelines) keep each column's aggregates and every k-th row.
MAX_ROWS = 3000
#: Rows kept of a longer table.
KEEP_ROWS = 300


def _column(col: pd.Series) -> Any:
    """A column's values, or, past :data:`MAX_ROWS`, its aggregates and an even sample of its rows."""
    if len(col) <= MAX_ROWS:
        return [_value(v) for v in col.tolist()]
    step = -(-len(col) // KEEP_ROWS)
    out: dict[str, Any] = {"every": step, "rows": [_value(v) for v in col.iloc[::step].tolist()]}
    num = pd.to_numeric(col, errors="coerce") if col.dtype != object else None
    if num is not None and num.notna().any():
        out |= {"sum": _value(float(num.sum())), "min": _value(float(num.min())), "max": _value(float(num.max())),
                "nan": int(num.isna().sum())}
    else:
        out["distinct"] = sorted(str(v) for v in col.astype(str).unique())[:100]
    return out


def _table(df: pd.DataFrame) -> dict[str, Any]:
    return {"columns": [str(c) for c in df.columns], "rows": len(df),
            "values": {str(c): _column(df[c]) for c in df.columns}}


def figures(folder: Path) -> dict[str, Any]:
    """Every result table of ``pcietrace.load(folder)`` and the ``report --format json`` document."""
    import pcietrace
    from pcietrace.report.output import emit

    run = pcietrace.load(folder)
    out = io.StringIO()
    emit(run.meta, run.tables, run.summary, "json", out=out)
    doc = json.loads(out.getvalue())
    results = {k: _table(pd.DataFrame.from_records(v)) for k, v in doc.pop("results").items()}
    return {"tables": {k: _table(v) for k, v in run.tables.items()},
            "json": {k: _value(v) for k, v in doc.items() if k != "meta"} | {"results": results}}


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool) \
            or isinstance(b, float) and isinstance(a, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return a == b


def _first(a: Any, b: Any, where: str) -> str:
    """Where two JSON values first differ, as a path, with both values there."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{where}: keys {sorted(set(a) ^ set(b))} in only one"
        return next(_first(a[k], b[k], f"{where}.{k}") for k in a if not _close(a[k], b[k]))
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where}: {len(b)} items, golden {len(a)}"
        return next(_first(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b)) if not _close(x, y))
    return f"{where}: {b!r}, golden {a!r}"


def differences(golden: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """One line per table column (or JSON key) whose figures differ from the golden ones."""
    out = []
    gt, nt = golden["tables"], now["tables"]
    for t in sorted(set(gt) | set(nt)):
        if t not in gt or t not in nt:
            out.append(f"table {t}: in only one of golden/now")
            continue
        g, n = gt[t], nt[t]
        if g["columns"] != n["columns"]:
            out.append(f"table {t}: columns differ: added {[c for c in n['columns'] if c not in g['columns']]}, "
                       f"removed {[c for c in g['columns'] if c not in n['columns']]}")
        if g["rows"] != n["rows"]:
            out.append(f"table {t}: {n['rows']} rows, golden {g['rows']}")
            continue
        for c in g["columns"]:
            if c in n["values"] and not _close(g["values"][c], n["values"][c]):
                out.append(f"table {t} column {c}: " + _first(g["values"][c], n["values"][c], "row"))
    for k in sorted(set(golden["json"]) | set(now["json"])):
        a, b = golden["json"].get(k), now["json"].get(k)
        if not _close(a, b):
            out.append(f"json {k}: " + _first(a, b, k))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--update", action="store_true", help="rewrite tests/data/golden/ from the current analysis")
    p.add_argument("folders", nargs="*", type=Path, help="recordings (default: every one under tests/data)")
    args = p.parse_args(argv)
    GOLDEN.mkdir(exist_ok=True)
    bad = 0
    for folder in args.folders or recordings():
        file = GOLDEN / f"{_name(folder.resolve())}.json"
        now = figures(folder)
        if args.update:
            file.write_text(json.dumps(now, separators=(",", ":"), allow_nan=False) + "\n")
            continue
        diff = differences(json.loads(file.read_text()), now) if file.is_file() else ["no golden file"]
        for line in diff:
            print(f"{_name(folder.resolve())}: {line}")
        bad += bool(diff)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
