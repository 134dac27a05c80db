"""Exhaustive damage sweep over the real saved reports (CPU only; not a test, ~5 min on 2 cores).

Every key path of ``meta`` (lists: their first two items) and of the first record of every table, the
top-level keys and the tables themselves, each deleted and retyped to 10 values (null, a string, 1.5, -1,
[], {}, true, 2**70, NaN, "[/x]"); and every column of samples.parquet/events.parquet dropped, turned into
strings, given a NaN, negated, overflowed, made fractional or zeroed, plus whole-table changes (shuffled,
duplicated, empty, reversed, one row, second half). Each case goes through what `pcietrace report` does
(load, analyse, JSON, console tables with markup off: escaping is the console's business) and is
counted as rendered, refused with a typed error (one line, exit 2 at the CLI) or crashed.

Usage: python3 bench/sweep_reports.py            (prints counts and every distinct crash)
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tempfile
import traceback
import warnings
from collections import Counter
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from rich.console import Console  # noqa: E402

from pcietrace.analysis import analyze  # noqa: E402
from pcietrace.report.saved import to_jsonable  # noqa: E402
from pcietrace.errors import PcietraceError  # noqa: E402
from pcietrace.report.console import render  # noqa: E402
from pcietrace.session import Session  # noqa: E402
from test_fuzz import DOCS, REPORTS, _copy  # noqa: E402

VALUES: list[Any] = [None, "x", 1.5, -1, [], {}, True, 2**70, float("nan"), "[/x]"]
COLUMN_OPS = ["drop", "str", "nan", "neg", "huge", "float", "zero"]
TABLE_OPS = ["shuffle", "dup", "empty", "reverse", "one", "half"]


def _paths(node: Any, prefix: list[Any]) -> Any:
    items = node.items() if isinstance(node, dict) else enumerate(node[:2]) if isinstance(node, list) else []
    for k, v in items:
        yield prefix + [k]
        yield from _paths(v, prefix + [k])


def cases() -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for r in REPORTS:
        doc = DOCS[r]
        ps = [["schema"], ["meta"], ["tables"], ["results"]] + list(_paths(doc["meta"], ["meta"]))
        for t, recs in doc["tables"].items():
            ps.append(["tables", t])
            ps += [["tables", t, 0, k] for k in (recs[0] if recs else {})]
        for p in ps:
            out += [("json", str(r), p, "delete", None)] + [("json", str(r), p, "retype", i) for i in range(len(VALUES))]
        for f in ("samples.parquet", "events.parquet"):
            if (r / f).exists():
                for c in pd.read_parquet(r / f).columns:
                    out += [("parquet", str(r), f, c, op) for op in COLUMN_OPS]
                out += [("parquet", str(r), f, None, op) for op in TABLE_OPS]
    return out


def _mutate_table(df: pd.DataFrame, c: str | None, op: str) -> pd.DataFrame:
    if c is None:
        return {"shuffle": lambda: df.sample(frac=1, random_state=0), "dup": lambda: pd.concat([df, df]),
                "empty": lambda: df.iloc[:0], "reverse": lambda: df.iloc[::-1], "one": lambda: df.iloc[:1],
                "half": lambda: df.iloc[len(df) // 2:]}[op]()
    df = df.copy()
    if op == "drop":
        return df.drop(columns=[c])
    num = pd.to_numeric(df[c], errors="coerce")
    if op == "str":
        df[c] = df[c].astype(str)
    elif op == "nan":
        df[c] = num.astype(float)
        df.loc[df.index[len(df) // 2], c] = np.nan
    elif op == "neg":
        df[c] = -num.fillna(1).astype("int64") - 1
    elif op == "huge":
        df[c] = np.uint64(2**63 + 5) if df[c].dtype.kind in "iuf" else "x" * 10000
    elif op == "float":
        df[c] = num.astype(float) + 0.5
    elif op == "zero":
        df[c] = 0
    return df


def run(case: tuple[Any, ...]) -> tuple[str, str | None]:
    warnings.simplefilter("ignore")
    kind, r = case[0], Path(case[1])
    tmp = Path(tempfile.mkdtemp())
    try:
        if kind == "json":
            _, _, p, op, vi = case
            doc = json.loads(json.dumps(DOCS[r]))
            node = doc
            for k in p[:-1]:
                node = node[k]
            if op == "delete":
                del node[p[-1]]
            else:
                node[p[-1]] = VALUES[vi]
            run_dir = _copy(r, tmp / "run")
            (run_dir / "report.json").write_text(json.dumps(doc))
        else:
            _, _, f, c, op = case
            run_dir = tmp / "run"
            shutil.copytree(r, run_dir)
            try:
                _mutate_table(pd.read_parquet(run_dir / f), c, op).to_parquet(run_dir / f, index=False)
            except Exception:
                return ("not writable", None)
        try:
            s = Session.load(run_dir)
            res = analyze(s)
            json.dumps(to_jsonable(res))
            render(s.meta, res, Console(file=io.StringIO(), width=200, markup=False))
            return ("rendered", None)
        except PcietraceError:
            return ("typed error", None)
        except Exception as exc:
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            return ("crash", f"{type(exc).__name__}: {str(exc)[:80]} @ {Path(tb.filename).name}:{tb.lineno} "
                             f"| {r.name} {case[2:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    cs = cases()
    with Pool(os.cpu_count() or 2) as pool:
        out = pool.map(run, cs, chunksize=16)
    print(f"{len(cs)} cases over {len(REPORTS)} real reports:", dict(Counter(o[0] for o in out)))
    crashes = Counter(o[1].split(" | ")[0] for o in out if o[0] == "crash" and o[1])
    for what, n in crashes.most_common():
        print(n, next(o[1] for o in out if o[1] and o[1].startswith(what)))
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
