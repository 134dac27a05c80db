"""The bad-input corpus: >= 1,000 cases tried as a hostile or unlucky user would, each judged for tracebacks, hangs,
data loss, injected output and refusals that are not one line with exit 2. No GPU: `run`/`graphs --simulate`,
attach on stand-in samplers (as tests/test_attach.py's ``attach_stand_ins``), reports from tests/data.

    PYTHONPATH=$PWD python3 tests/fuzz_corpus.py [--seed 39] [--only CLASS,..] [--jobs 4] [--out corpus.json]

Classes: options (bad option values), damaged (damaged reports), hostile (hostile strings in every field and
format), attach (misbehaving programs under attach), signals (SIGINT/SIGTERM/SIGHUP at random moments),
concurrent (writers into one folder), api (the Python API), json (deep or odd JSON). Prints one line per class
(cases, clean, failing by kind) and writes every failing case to ``--out``. Not collected by pytest (a corpus,
not a test: tests/test_bad_input.py holds the tests of each class).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
REPORTS = sorted(p.parent.name for p in DATA.glob("*/report.json"))
QUICK = ["run", "--simulate", "--quick", "--window-s", "0.02", "--no-latency"]
GRAPHS = ["graphs", "--simulate", "--kernels", "10", "--iterations", "3", "--rounds", "1", "--param-sets", "2"]
#: Text a hostile program, GPU or user could put anywhere.
HOSTILE = ["\x1b[2J\x1b[31mred", "\x1b]0;title\x07", "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "a\rb", "a\nb",
           "\n# table: fake\nx,y\n1,2", "A|B\r\n|C", "\u202eevil", "\udc80lone", "\x00nul", "\x9b31m", "\x7fdel",
           "é" * 300, "x" * 5000, "[bold]markup[/]", "\t", ""]
BAD_VALUES = ["", "-1", "0", "-0", "nan", "inf", "-inf", "1e309", "1e-309", str(2**40), str(2**64), "0x10", "1,,2",
              ",", "abc", "\x1b[2J", "\udc80", "1" * 400, "--", "-", " 1 ", "1.5", "1e3", "3600.1", "all", "0,1,2,3,4,5,6,7,8"]
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
FORMATS = ["table", "csv", "md", "json", "prometheus"]


# --- running one case ----------------------------------------------------------------------------------------

def in_process(argv: list[str], cwd: Path | None = None) -> tuple[int | None, str, str, str | None]:
    """``pcietrace argv`` in this process with a strict UTF-8 stdout/stderr (as a terminal's): exit code, output,
    errors, and the exception that escaped main (None)."""
    from pcietrace.cli import main

    # real files (a program under attach inherits the descriptors), strict UTF-8 (a terminal's encoding)
    out_b, err_b = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    out = io.TextIOWrapper(out_b, encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(err_b, encoding="utf-8", errors="strict", write_through=True)
    escaped = None
    rc: int | None = None
    old = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 2
    except BaseException as exc:  # noqa: BLE001  (what escaped main is what the corpus looks for)
        escaped = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        os.chdir(old)
    texts = []
    for w in (out, err):
        with contextlib.suppress(OSError, ValueError):
            w.flush()
        try:  # (main points a failed stdout at /dev/null: then nothing can be read back)
            w.buffer.seek(0)
            texts.append(w.buffer.read().decode("utf-8", "replace"))
        except OSError:
            texts.append("")
        with contextlib.suppress(OSError, ValueError):
            w.close()
    return rc, texts[0], texts[1], escaped


def as_subprocess(argv: list[str], timeout_s: float = 90, cwd: Path | None = None,
                  signal_after: tuple[float, int] | None = None) -> tuple[int | None, str, str, str | None]:
    """``python -m pcietrace argv`` (a signal ``(delay_s, signum)`` sent to it); None exit code: it hung."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    p = subprocess.Popen([sys.executable, "-m", "pcietrace", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, preexec_fn=_terminal)
    if signal_after is not None:
        time.sleep(signal_after[0])
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal_after[1])
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return None, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), "hang"
    return p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), None


def _terminal() -> None:
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


def judge(rc: int | None, out: str, err: str, escaped: str | None, *, expect_refusal: bool = False,
          allowed_rc: tuple[int, ...] = (0, 2)) -> list[str]:
    """The kinds of failure one result shows (empty: clean)."""
    kinds = []
    if escaped == "hang" or rc is None and escaped is None:
        return ["hang"]
    if escaped is not None or "Traceback" in err:
        return [f"traceback ({escaped or err.strip().splitlines()[-1][:120]})"]
    if CONTROL.search(out.replace("\n", "")) or CONTROL.search(err.replace("\n", "")):
        kinds.append("injection")
    errors = [ln for ln in err.splitlines() if "error" in ln]
    if rc == 2 and (len(errors) != 1 or len([ln for ln in err.splitlines() if ln.strip()]) > 3):
        kinds.append("refusal not one line")
    if rc not in allowed_rc:
        kinds.append(f"exit {rc}")
    if expect_refusal and rc != 2:
        kinds.append("silently wrong")
    return kinds


# --- the classes ---------------------------------------------------------------------------------------------

Case = tuple[str, str, Callable[[Path], list[str]]]  # (class, name, run in a fresh folder -> failure kinds)


def options_cases(rng: random.Random) -> list[Case]:
    """Every option of every command with odd values (parse and validation; accepted values run for real)."""
    from pcietrace.cli import build_parser

    cases = []
    sub = build_parser()._subparsers._group_actions[0].choices
    base = {"run": QUICK + ["--no-save"], "graphs": GRAPHS + ["--no-save"], "report": ["report", str(DATA / "h100_run")],
            "compare": ["compare", str(DATA / "h100_run"), str(DATA / "h200x2_run")], "topo": ["topo"],
            "latency": ["latency", "--no-save"],
            "attach": ["attach", "--no-calibrate", "--idle-s", "0.01"]}
    for cmd, parser in sub.items():
        opts = [a.option_strings[-1] for a in parser._actions if a.option_strings and a.nargs != 0
                and a.option_strings[-1] not in ("--help",)]
        for opt in opts:
            for value in rng.sample(BAD_VALUES, 8):
                argv = base[cmd] + [opt, value] + (["--", sys.executable, "-c", "pass"] if cmd == "attach" else [])
                if cmd in ("latency",) or (cmd == "attach"):  # no GPU: parse-level only (they need one to run)
                    cases.append(("options", f"{cmd} {opt} {value!r}", _parse_only(argv)))
                else:
                    cases.append(("options", f"{cmd} {opt} {value!r}", _cli(argv, sub_process=False)))
    return cases


def _parse_only(argv: list[str]) -> Callable[[Path], list[str]]:
    def run(tmp: Path) -> list[str]:
        rc, out, err, esc = in_process(argv + [], cwd=tmp)
        return judge(rc, out, err, esc)  # (no GPU: "needs a GPU" is a one-line refusal too)
    return run


def _cli(argv: list[str], sub_process: bool = False, expect_refusal: bool = False,
         check: Callable[[Path, int | None], list[str]] | None = None) -> Callable[[Path], list[str]]:
    def run(tmp: Path) -> list[str]:
        rc, out, err, esc = (as_subprocess if sub_process else in_process)(argv, cwd=tmp)
        kinds = judge(rc, out, err, esc, expect_refusal=expect_refusal)
        return kinds + (check(tmp, rc) if check is not None and not kinds else [])
    return run


def _damage_json(rng: random.Random, doc: dict[str, Any]) -> str:
    """One random damage to a report.json document; returns what it did."""
    tables = [t for t, rows in doc["tables"].items() if rows]
    how = rng.choice(["del", "type", "huge", "neg", "surrogate", "nan", "dup", "deep", "meta-gpu", "exit", "list"])
    if how in ("del", "type", "huge", "neg", "surrogate", "nan") and tables:
        t = rng.choice(tables)
        row = rng.choice(doc["tables"][t])
        key = rng.choice(list(row))
        if how == "del":
            for r in doc["tables"][t]:
                r.pop(key, None)
        else:
            if how == "huge" and not isinstance(row[key], (int, float)):
                how = "huge-in-text"  # (a number where text was: no figure to refuse)
            row[key] = {"type": "text", "huge-in-text": 1e300, "huge": 1e300, "neg": -abs(row[key]) - 1 if isinstance(row[key], (int, float))
                        and not isinstance(row[key], bool) else -1, "surrogate": "\udc80", "nan": float("nan")}[how]
        return f"{how} tables.{t}[].{key}"
    if how == "dup" and tables:
        t = rng.choice(tables)
        doc["tables"][t] = doc["tables"][t] + doc["tables"][t][: max(1, len(doc["tables"][t]) // 10)]
        return f"dup rows of {t}"
    if how == "deep":
        depth = rng.choice([70, 950, 5000])
        doc["meta"]["x"] = json.loads("[" * 60 + "]" * 60)
        doc["meta"]["y"] = "DEEP%d" % depth
        return f"deep {depth}"
    if how == "meta-gpu":
        doc["meta"]["gpus"][0]["nvml_index"] = rng.choice([5, -1, 2**40])
        return "meta names another GPU"
    if how == "exit":
        doc["meta"]["exit_code"] = rng.choice([-1, 256, 2**40, "0", 1.5])
        return "odd exit code"
    key = rng.choice(list(doc["meta"]))
    doc["meta"][key] = rng.choice([[], {}, None, "x", 1e300, -1])
    return f"meta.{key} = odd"


def _damage_parquet(rng: random.Random, run: Path) -> str:
    f = run / rng.choice(["samples.parquet"] + (["events.parquet"] if (run / "events.parquet").exists() else []))
    df = pd.read_parquet(f)
    how = rng.choice(["truncate", "garbage", "shuffle", "dup10", "neg", "back", "other-run", "empty", "depth",
                      "launch-back", "drop-pop"])
    if how == "truncate":
        raw = f.read_bytes()
        f.write_bytes(raw[: len(raw) // 2])
        return f"truncate {f.name}"
    if how == "garbage":
        f.write_bytes(os.urandom(1000))
        return f"garbage {f.name}"
    if how == "empty":
        df.iloc[:0].to_parquet(f, index=False)
        return f"empty {f.name}"
    if how == "shuffle":
        df = df.sample(frac=1.0, random_state=rng.randrange(1000))
    elif how == "dup10":
        df = pd.concat([df, df.sample(frac=0.1, random_state=1)]).sort_values([c for c in ("nvml_index", "t_ns")
                                                                               if c in df], kind="stable")
    elif how == "neg":
        col = rng.choice([c for c in df.columns if df[c].dtype.kind in "iu"])
        df[col] = df[col].astype(np.int64) - 2**40
    elif how == "back" and "tx_raw" in df:
        i = rng.randrange(1, len(df))
        df["tx_raw"] = df["tx_raw"].astype(np.int64)
        df.loc[df.index[i], "tx_raw"] = max(int(df["tx_raw"].iloc[i - 1]) - 1000, 0)
    elif how == "other-run" and "tx_raw" in df:
        other = pd.read_parquet(DATA / rng.choice(["h100_run", "h200x2_run", "attach_h100_python"]) / "samples.parquet")
        df = other
    elif how == "depth" and "depth" in df:
        df["depth"] = df["depth"] - 3
    elif how == "launch-back" and "eager_thread" in df:
        i = df.index[df["eager_thread"] > 0]
        if len(i):
            df.loc[i[len(i) // 2], "eager_thread"] = 0
    elif how == "drop-pop" and "event" in df:
        pops = df.index[df["event"] == "pop"]
        if len(pops):
            df = df.drop(pops[0])
    df.to_parquet(f, index=False)
    return f"{how} {f.name}"


#: Damages that always leave an impossible value a report must not print figures from.
REFUSE = ("neg tables.latency[].value_us", "huge tables", "odd exit code", "meta names another GPU",
          "dup rows of graphs")


def damaged_cases(rng: random.Random, n: int) -> list[Case]:
    cases = []
    for i in range(n):
        name = rng.choice(REPORTS)
        seed = rng.randrange(2**31)
        fmt = rng.choice(FORMATS)

        def run(tmp: Path, name=name, seed=seed, fmt=fmt) -> list[str]:
            r = random.Random(seed)
            dst = tmp / name
            shutil.copytree(DATA / name, dst)
            what = []
            if r.random() < 0.6:
                doc = json.loads((dst / "report.json").read_text())
                what.append(_damage_json(r, doc))
                text = json.dumps(doc)
                m = re.search(r'"DEEP(\d+)"', text)
                if m:
                    d = int(m.group(1))
                    text = text.replace(m.group(0), "[" * d + "]" * d)
                (dst / "report.json").write_text(text)
            else:
                what.append(_damage_parquet(r, dst))
            rc, out, err, esc = in_process(["report", str(dst), "--format", fmt, "--detail"], cwd=tmp)
            must = any(what[0].startswith(k) or k in what[0] for k in REFUSE) and not what[0].endswith("[].source")
            kinds = judge(rc, out, err, esc, expect_refusal=must)
            return [f"{k} ({what[0]})" for k in kinds]
        cases.append(("damaged", f"{name} #{i} {fmt}", run))
    return cases


def hostile_cases(rng: random.Random) -> list[Case]:
    """Each hostile string in each string field of a report (meta and events) in each format."""
    fields = ["gpus[0].name", "gpus[0].bus_id", "host", "driver", "created", "command", "events.message",
              "events.domain", "topology.gpus[0].name"]
    cases = []
    for text in HOSTILE:
        for field in fields:
            fmt = rng.choice(FORMATS)

            def run(tmp: Path, text=text, field=field, fmt=fmt) -> list[str]:
                name = "attach_h100_python"
                dst = tmp / name
                shutil.copytree(DATA / name, dst)
                doc = json.loads((dst / "report.json").read_text())
                m = doc["meta"]
                if field == "command":
                    m["command"] = [text, text]
                elif field.startswith("gpus"):
                    m["gpus"][0][field.split(".")[1]] = text
                elif field.startswith("topology"):
                    if m.get("topology") and m["topology"].get("gpus"):
                        m["topology"]["gpus"][0]["name"] = text
                elif field.startswith("events"):
                    ev = pd.read_parquet(dst / "events.parquet")
                    col = field.split(".")[1]
                    mask = ev["event"].isin(["push", "pop"])
                    ev.loc[mask, col] = ev.loc[mask, col] + text.replace("\udc80", "\ufffd")
                    ev.to_parquet(dst / "events.parquet", index=False)
                else:
                    m[field] = text
                (dst / "report.json").write_text(json.dumps(doc))
                rc, out, err, esc = in_process(["report", str(dst), "--format", fmt, "--detail"], cwd=tmp)
                kinds = judge(rc, out, err, esc)
                if fmt == "csv" and not kinds:  # only the renderer's own blocks start a line with "# table:"
                    bad = [ln for ln in out.splitlines() if ln.startswith("# table:") and not ln[9:].isidentifier()]
                    kinds += ["injection (csv block)"] if bad else []
                return kinds
            cases.append(("hostile", f"{field} {text[:12]!r} {fmt}", run))
    return cases


def _attach_patches() -> contextlib.ExitStack:
    """attach on a stand-in GPU with stand-in samplers (tests/test_attach.py's attach_stand_ins)."""
    import pytest
    from test_attach import _StandInAttachSampler

    from pcietrace import collectors
    from pcietrace.collectors import nvml, topology
    from pcietrace.device import cuda

    mp = pytest.MonkeyPatch()
    mp.setattr(collectors, "CounterSampler", type("S", (_StandInAttachSampler,), {}))
    mp.setattr(cuda, "bus_ids", lambda: ["0000:00:06.0"])
    mp.setattr(nvml, "index_for_bus_id", lambda bus_id: 0)
    mp.setattr(nvml, "gpu_info", lambda i: nvml.GpuInfo(i, "FAKE (no GPU)", "none", "0000:00:06.0", *[None] * 5))
    mp.setattr(nvml, "driver_version", lambda: "none (stand-in)")
    mp.setattr(topology, "collect", lambda gpus=None, sysfs_root="/sys": None)
    stack = contextlib.ExitStack()
    stack.callback(mp.undo)
    return stack


PROGRAMS = {
    "exit": "import sys; sys.exit({code})",
    "signal": "import os, signal; os.kill(os.getpid(), {sig})",
    "cr-name": "import nvtx\nnvtx.push_range('a\\rb{text}')\nnvtx.pop_range()",
    "cut-utf8": "import nvtx\nnvtx.push_range('x' * {n} + '\\u00e9' * 3)\nnvtx.pop_range()",
    "long-domain": "import nvtx\nnvtx.push_range('r', domain='\\u00e9' * {n})\nnvtx.pop_range(domain='\\u00e9' * {n})",
    "unbalanced": "import nvtx\nfor i in range({n}): nvtx.push_range(f'r{{i}}')\nfor i in range({n} // 2 + 3): nvtx.pop_range()",
    "foreign": "import os\nopen(os.path.join(os.environ['PCIETRACE_TRACE_DIR'], 'trace-{text}.tsv'), 'wb')"
               ".write(os.urandom({n}))",
    "garbage-own": "import os, nvtx\nnvtx.push_range('r')\nnvtx.pop_range()\nopen(os.path.join(os.environ["
                   "'PCIETRACE_TRACE_DIR'], 'trace-%d.tsv' % (os.getpid() + 100000)), 'wb').write(b'1\\t2\\n' * {n})",
    "hostile-name": "import nvtx\nnvtx.push_range({text!r})\nnvtx.pop_range()",
    "fork": "import os, nvtx\npid = os.fork()\nnvtx.push_range('c' if pid == 0 else 'p')\nnvtx.pop_range()\n"
            "os._exit(0) if pid == 0 else os.waitpid(pid, 0)",
    "close-stdout": "import os; os.close(1); print('x')",
    "missing": None,
}


def attach_cases(rng: random.Random, n: int) -> list[Case]:
    cases = []
    for i in range(n):
        kind = rng.choice(list(PROGRAMS))
        params = {"code": rng.choice([0, 1, 3, 127, 255]), "sig": rng.choice([6, 9, 11, 15]),
                  "n": rng.choice([1, 5, 300, 1022, 1023, 5000]), "text": rng.choice(["x", "é", "\\x1b[2J", "-1"])}
        if kind == "hostile-name":
            params["text"] = rng.choice([h.replace("\udc80", "") for h in HOSTILE])

        def run(tmp: Path, kind=kind, params=params) -> list[str]:
            prog = PROGRAMS[kind]
            cmd = ["/nonexistent/program"] if prog is None else [sys.executable, "-c", prog.format(**params)]
            argv = ["attach", "--gpu", "0", "--no-calibrate", "--idle-s", "0.01", "-o", str(tmp / "rec"),
                    "--format", rng.choice(FORMATS[:4]), "--", *cmd]
            with _attach_patches():
                rc, out, err, esc = in_process(argv, cwd=tmp)
            kinds = judge(rc, out, err, esc, allowed_rc=tuple(range(256)))
            if kinds:
                return kinds
            if prog is not None:  # the recording is kept, the program's own exit code passes through
                from pcietrace.session import Session

                try:
                    meta = Session.load(tmp / "rec").meta
                except Exception as exc:  # noqa: BLE001
                    return [f"data loss ({type(exc).__name__}: {str(exc)[:80]})"]
                if kind == "exit" and rc != params["code"]:
                    kinds.append(f"exit code replaced ({rc} for {params['code']})")
                if kind in ("foreign", "garbage-own") and not (meta.get("trace_bad") or {}).get("lines", 0) + \
                        len((meta.get("trace_bad") or {}).get("files", [])):
                    kinds.append("bad lines not said")
            leftovers = [p.name for p in tmp.iterdir() if p.name.startswith(".")]
            return kinds + (["leftovers"] if leftovers else [])
        cases.append(("attach", f"{kind} {params}", run))
    return cases


def signal_cases(rng: random.Random, n: int) -> list[Case]:
    cases = []
    for i in range(n):
        cmd = rng.choice(["run", "run-force", "graphs"])
        delay = rng.uniform(0.3, 4.0)
        sig = rng.choice([signal.SIGINT, signal.SIGTERM, signal.SIGHUP])

        def run(tmp: Path, cmd=cmd, delay=delay, sig=sig) -> list[str]:
            from pcietrace.session import Session

            argv = (GRAPHS if cmd == "graphs" else QUICK) + ["-o", str(tmp / "r"), "--format", "json"]
            before = None
            if cmd == "run-force":  # a complete run there first: it must never be replaced by a partial one
                as_subprocess(QUICK + ["-o", str(tmp / "r"), "--format", "json"])
                before = json.loads((tmp / "r" / "report.json").read_text())["meta"]["created"]
                argv += ["--force"]
            rc, out, err, esc = as_subprocess(argv, signal_after=(delay, sig))
            # (-sig: the signal came while Python started or ended, before or after any handler: the shell's 128+sig)
            kinds = judge(rc, out, err, esc, allowed_rc=(0, 2, 128 + sig, -sig))
            if kinds:
                return kinds
            last = err.strip().splitlines()[-1] if err.strip() else ""
            m = re.search(r"(?:saved .* to|saved run to|saved to) (\S+?)(?:;|$| \()", last)
            if rc == -sig and (tmp / "r").exists():
                try:
                    Session.load(tmp / "r")
                except Exception:  # noqa: BLE001
                    kinds.append("data loss (killed with an unreadable run in place)")
            started = (tmp / "r").exists() or any(p.name.startswith(".") for p in tmp.iterdir())
            if rc == 128 + sig and "nothing saved" not in last and not m and (started or last != "pcietrace: interrupted"):
                kinds.append(f"unclear interrupted line: {last[:80]}")
            if m:
                where = Path(m.group(1))
                where = where if where.is_absolute() else tmp / where
                try:
                    Session.load(where)
                except Exception:  # noqa: BLE001
                    kinds.append("said saved but not loadable")
            if before is not None:
                meta = json.loads((tmp / "r" / "report.json").read_text())["meta"]
                if meta.get("status") != "complete":
                    kinds.append("data loss (complete run replaced by a partial one)")
            if [p.name for p in tmp.iterdir() if p.name.startswith(".") and "partial" in p.name]:
                kinds.append("leftovers")
            return kinds
        cases.append(("signals", f"{cmd} {signal.Signals(sig).name} at {delay:.2f}s", run))
    return cases


def concurrent_cases(rng: random.Random, n: int) -> list[Case]:
    cases = []
    for i in range(n):
        force = rng.random() < 0.7
        k = rng.choice([2, 3])

        def run(tmp: Path, force=force, k=k) -> list[str]:
            from pcietrace.session import Session

            argv = QUICK + ["-o", str(tmp / "r"), "--format", "json"] + (["--force"] if force else [])
            if force:
                as_subprocess(QUICK + ["-o", str(tmp / "r"), "--format", "json"])
            with ThreadPoolExecutor(k) as ex:
                results = list(ex.map(lambda _: as_subprocess(argv), range(k)))
            kinds = [k2 for r in results for k2 in judge(*r)]
            claimed = []
            for rc, out, err, _ in results:
                m = re.search(r"saved run to (\S+)", err)
                if rc == 0 and m:
                    claimed.append(m.group(1))
            # (with --force a run that took the lock after another published replaces it, as asked: only without
            # --force must every run that says it saved be in a folder of its own)
            if not force and len(claimed) != len(set(claimed)):
                kinds.append("data loss (two runs claim one folder)")
            if force and claimed:
                try:
                    Session.load(tmp / "r")
                except Exception:  # noqa: BLE001
                    kinds.append("data loss (the forced folder does not load)")
            for c in claimed:
                try:
                    Session.load(Path(c) if Path(c).is_absolute() else tmp / c)
                except Exception:  # noqa: BLE001
                    kinds.append("said saved but not loadable")
            return sorted(set(kinds))
        cases.append(("concurrent", f"{k} writers force={force} #{i}", run))
    return cases


def api_cases(rng: random.Random) -> list[Case]:
    import pcietrace
    from pcietrace.errors import PcietraceError

    calls: list[tuple[str, Callable[[Path], Any]]] = []
    for key in ["gpus", "window_s", "durations", "graph_k", "contexts", "sample_interval_ms", "repeats", "seed",
                "us_per_level", "plot", "format", "nonsense_option"]:
        for value in [0, -1, 1e309, "x", "\x1b[2J", [1, -2], True, 2**40, None, "1,,2"]:
            calls.append((f"measure({key}={value!r})", lambda tmp, key=key, value=value: pcietrace.measure(
                simulate=True, quick=True, latency=False, window_s=0.02, **{key: value})
                if key != "window_s" else pcietrace.measure(simulate=True, quick=True, latency=False, window_s=value)))
    for target in ["", "/nonexistent", str(DATA), str(DATA / "h100_run" / "samples.parquet"), "\udc80", "x" * 5000]:
        calls.append((f"load({target[:20]!r})", lambda tmp, t=target: pcietrace.load(t)))
    calls.append(("measure(gpu=-1)", lambda tmp: pcietrace.measure(-1, simulate=True, quick=True, latency=False)))
    calls.append(("measure(output=tmp/r twice)", lambda tmp: [pcietrace.measure(
        simulate=True, quick=True, latency=False, window_s=0.02, output=tmp / "r") for _ in range(2)]))

    def wrap(call: Callable[[Path], Any]) -> Callable[[Path], list[str]]:
        def run(tmp: Path) -> list[str]:
            old = os.getcwd()
            try:  # (in the case's folder: plots and runs land there)
                os.chdir(tmp)
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    call(tmp)
            except PcietraceError as exc:
                return ["refusal not one line"] if "\n" in str(exc) else []
            except BaseException as exc:  # noqa: BLE001
                return [f"traceback ({type(exc).__name__}: {str(exc)[:80]})"]
            finally:
                os.chdir(old)
            return []
        return run
    return [("api", name, wrap(call)) for name, call in calls]


def json_cases(rng: random.Random) -> list[Case]:
    cases = []
    for depth in [10, 65, 100, 500, 950, 999, 1000, 1500, 5000, 20_000, 100_000]:
        for where in ["report", "meta", "fixture", "fixture-devices"]:
            def run(tmp: Path, depth=depth, where=where) -> list[str]:
                deep = "[" * depth + "]" * depth
                if where == "report":
                    (tmp / "report.json").write_text(deep)
                    argv = ["report", str(tmp)]
                elif where == "meta":
                    (tmp / "report.json").write_text('{"schema": "pcietrace.report/1", "meta": {"gpus": [], "x": %s},'
                                                     ' "tables": {}}' % deep)
                    argv = ["report", str(tmp)]
                else:
                    (tmp / "f.json").write_text(deep if where == "fixture" else '{"devices": %s}' % deep)
                    argv = ["topo", "--fixture", str(tmp / "f.json")]
                rc, out, err, esc = in_process(argv, cwd=tmp)
                return judge(rc, out, err, esc, expect_refusal=True)
            cases.append(("json", f"{where} depth {depth}", run))
    for text in ['{"a": 1', "\xff\xfe", "null", "[]", '"x"', "1e999", '{"schema": "pcietrace.report/1"}', "{" * 3]:
        for argv_of in (lambda p: ["report", str(p.parent)], lambda p: ["topo", "--fixture", str(p)]):
            def run(tmp: Path, text=text, argv_of=argv_of) -> list[str]:
                f = tmp / "report.json"
                f.write_bytes(text.encode("latin-1", "replace"))
                rc, out, err, esc = in_process(argv_of(f), cwd=tmp)
                return judge(rc, out, err, esc, expect_refusal=True)
            cases.append(("json", f"odd {text[:10]!r} {argv_of(Path('x/y'))[0]}", run))
    return cases


def build(seed: int) -> list[Case]:
    rng = random.Random(seed)
    return (options_cases(rng) + damaged_cases(rng, 300) + hostile_cases(rng) + attach_cases(rng, 90)
            + signal_cases(rng, 45) + concurrent_cases(rng, 15) + api_cases(rng) + json_cases(rng))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=39)
    ap.add_argument("--only", default="", help="comma-separated classes")
    ap.add_argument("--jobs", type=int, default=4, help="parallel cases for the subprocess classes")
    ap.add_argument("--out", type=Path, default=Path("corpus-failures.json"))
    ap.add_argument("--limit", type=int, default=0, help="at most this many cases per class (0: all)")
    args = ap.parse_args()
    cases = build(args.seed)
    only = set(filter(None, args.only.split(",")))
    cases = [c for c in cases if not only or c[0] in only]
    if args.limit:
        per: Counter[str] = Counter()
        cases = [c for c in cases if (per.update([c[0]]) or per[c[0]] <= args.limit)]
    stats: dict[str, Counter[str]] = defaultdict(Counter)
    failures = []
    t0 = time.monotonic()

    def one(case: Case) -> tuple[Case, list[str]]:
        with tempfile.TemporaryDirectory(prefix="corpus-") as tmp:
            try:
                return case, case[2](Path(tmp))
            except BaseException as exc:  # noqa: BLE001  (the case's own set-up failed: counted, not hidden)
                return case, [f"corpus error ({type(exc).__name__}: {str(exc)[:100]})"]

    serial = [c for c in cases if c[0] not in ("signals", "concurrent")]
    parallel = [c for c in cases if c[0] in ("signals", "concurrent")]
    results = [one(c) for c in serial]
    with ThreadPoolExecutor(args.jobs) as ex:
        results += list(ex.map(one, parallel))
    for (cls, name, _), kinds in results:
        stats[cls]["cases"] += 1
        stats[cls]["clean"] += not kinds
        for k in kinds:
            stats[cls][re.sub(r" \(.*", "", k)] += 1
        if kinds:
            failures.append({"class": cls, "case": name, "kinds": kinds})
    total = Counter()
    for cls, c in stats.items():
        total.update(c)
        kinds = ", ".join(f"{k} {v}" for k, v in c.items() if k not in ("cases", "clean"))
        print(f"{cls:11s} cases {c['cases']:5d}  clean {c['clean']:5d}  {kinds or 'no failures'}")
    print(f"{'all':11s} cases {total['cases']:5d}  clean {total['clean']:5d}  ({time.monotonic() - t0:,.0f} s)")
    args.out.write_text(json.dumps(failures, indent=1, ensure_ascii=True))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
