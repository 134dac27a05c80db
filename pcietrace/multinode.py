"""``pcietrace merge``: one report from the attach recordings of a job's nodes (one ``attach`` per node).

Each node's recording is loaded and analysed in a worker of its own, so no process ever holds more than one
node's raw samples: local processes (:class:`concurrent.futures.ProcessPoolExecutor`) by default, or the
workers of a Dask distributed cluster (``scheduler``: its address; ``pip install 'pcietrace[dask]'``) through
Dask's own executor. The workers hand back the small result tables and write each node's timelines into
its folder; :func:`pcietrace.analysis.merge.combine` puts them together.

On disk (docs/multinode.md) a merged report is a folder::

    report.json              schema, meta (kind "attach", meta["merged"]: the nodes), results as JSON
                             (but the range instances)
    results/<table>.parquet  the merged result tables, as `report` and `pcietrace.load` read them
    nodes/<node>/meta.json   the node recording's own meta (GPUs, topology, processes, launcher)
    nodes/<node>/rates.parquet, launches.parquet, range_instances.parquet
                             its PCIe-rate and launch timelines and its ranges (wall-clock times)
    nodes/<node>/trace-events.json   its part of the Perfetto trace
    trace.json               the Perfetto trace: the nodes' parts, each node's processes named by it
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import contextlib
import datetime
import json
import multiprocessing
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pandas as pd

from pcietrace import schema
from pcietrace.analysis import merge as combine_nodes
from pcietrace.errors import PcietraceError, ReportError, UsageError, one_line
from pcietrace.report.perfetto import merged_header
from pcietrace.session import REPORT_FILE, Session, _json_default

#: The environment variable Dask's own tools read the scheduler's address from.
SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
NODES_DIR = "nodes"
RESULTS_DIR = "results"
TRACE_FILE = "trace.json"
RATES_FILE = "rates.parquet"
LAUNCHES_FILE = "launches.parquet"
INSTANCES_FILE = "range_instances.parquet"
TRACE_PART = "trace-events.json"
#: Merged tables kept only in the nodes' folders (they grow with the run; `load` stacks them).
NODE_ONLY = ("range_instances", "rates")
DASK_MISSING = "--scheduler needs Dask's distributed scheduler: pip install 'pcietrace[dask]'"


@dataclass
class Merged:
    """A loaded merged report: ``meta`` and ``results`` (every result table, the PCIe-rate timeline included)."""

    meta: dict[str, Any]
    results: dict[str, pd.DataFrame]


def read_meta(path: Path) -> dict[str, Any]:
    """A recording's meta, read without its tables (to name its node before any worker starts)."""
    report = path / REPORT_FILE if path.is_dir() else path
    try:
        meta = json.loads(report.read_bytes())["meta"]
    except FileNotFoundError:
        raise ReportError(f"no pcietrace report at {path}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReportError(f"{report} is not a readable pcietrace report ({one_line(exc)})") from None
    if not isinstance(meta, dict):
        raise ReportError(f"{report}: meta is not an object")
    return meta


def is_merged(path: Path) -> bool:
    """Whether ``path`` (a folder or its report.json) is a merged report."""
    folder = path if path.is_dir() else path.parent
    return (folder / NODES_DIR).is_dir() and (folder / RESULTS_DIR).is_dir() and (folder / REPORT_FILE).is_file()


def analyze_node(path: str, node_dir: str, info: dict[str, Any]) -> tuple[dict[str, pd.DataFrame], int | None]:
    """One node, in a worker: its recording loaded and analysed; its meta and (wall-clock) timelines and range
    instances written into ``node_dir`` for :func:`trace_part`. Returns its
    :data:`~pcietrace.analysis.merge.NODE_TABLES` and its first time (None: nothing sampled)."""
    from pcietrace.analysis import analyze
    from pcietrace.report.notes import with_sentences

    session = Session.load(Path(path))
    if not str(session.meta.get("kind", "")).startswith("attach"):
        raise UsageError(f"{path} is a {session.meta.get('kind') or 'run'} report: merge takes attach recordings")
    results = with_sentences(analyze(session))
    folder = Path(node_dir)
    folder.mkdir(parents=True)
    rates = combine_nodes.tag(results["rates"], info)
    instances = combine_nodes.tag(results["range_instances"], info)
    rates.to_parquet(folder / RATES_FILE, index=False)
    instances.to_parquet(folder / INSTANCES_FILE, index=False)
    launches = results["launch_rates"]
    if len(launches):
        combine_nodes.tag(launches, info).to_parquet(folder / LAUNCHES_FILE, index=False)
    (folder / "meta.json").write_text(json.dumps(session.meta, indent=1, default=_json_default) + "\n")
    firsts = [int(df[c].min()) for df, c in ((rates, "t_ns"), (instances, "t_start_ns")) if len(df)]
    return {t: results[t] for t in combine_nodes.NODE_TABLES}, min(firsts, default=None)


def trace_part(node_dir: str, k: int, t0_ns: int, meta: dict[str, Any]) -> None:
    """In a worker: node ``k``'s events of the merged trace (:func:`pcietrace.report.perfetto.node_events`) into
    ``node_dir``, as the items of a JSON list."""
    from pcietrace.report.perfetto import node_events

    folder = Path(node_dir)
    launches = folder / LAUNCHES_FILE
    node = meta["merged"]["nodes"][k - 1]["node"]
    events = node_events(meta, node, k, pd.read_parquet(folder / RATES_FILE), pd.read_parquet(folder / INSTANCES_FILE),
                         pd.read_parquet(launches) if launches.is_file() else None, t0_ns)
    (folder / TRACE_PART).write_text(json.dumps(events)[1:-1])


def write_trace(folder: Path, meta: dict[str, Any], target: Path) -> None:
    """The nodes' trace parts streamed into one Perfetto trace at ``target`` (never all in memory at once)."""
    import shutil

    head = json.dumps(merged_header(meta))
    parts = [folder / NODES_DIR / _folder_name(n["node"]) / TRACE_PART for n in meta["merged"]["nodes"]]
    with open(target, "w") as out:
        out.write(head[:-1] + ', "traceEvents": [')
        first = True
        for part in parts:
            if part.stat().st_size:
                out.write("" if first else ",")
                with open(part) as f:
                    shutil.copyfileobj(f, out)
                first = False
        out.write("]}")


@contextlib.contextmanager
def executor(workers: int | None, scheduler: str | None) -> Iterator[concurrent.futures.Executor]:
    """Where the nodes are analysed: a Dask cluster's executor with ``scheduler``, else ``workers`` local
    processes (spawned: pandas' and pyarrow's threads do not survive a fork)."""
    if scheduler:
        try:
            from distributed import Client
        except ImportError:
            raise UsageError(DASK_MISSING) from None
        try:
            client = Client(scheduler, timeout="20s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise UsageError(f"cannot reach the Dask scheduler at {scheduler} ({one_line(exc)})") from None
        with client:
            yield client.get_executor()
        return
    if workers == 1:  # one at a time: in this process, no worker to start
        yield _InProcess()
        return
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                                initializer=_leave_ctrl_c_to_the_parent) as ex:
        try:
            yield ex
        except concurrent.futures.process.BrokenProcessPool:
            raise PcietraceError("a merge worker process died (out of memory, or killed); --workers 1 analyses "
                                 "one node at a time in this process") from None
        except BaseException:  # (Ctrl-C, SIGTERM's exception, an error: the workers stopped, not waited for)
            _stop_workers(ex)
            raise


def _leave_ctrl_c_to_the_parent() -> None:
    """A merge worker's start: Ctrl-C reaches the whole process group, and it is the parent's to handle (it
    stops the workers); a worker that took it printed its own traceback, or died holding the pool's queue lock
    and left the parent waiting for it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop_workers(ex: concurrent.futures.ProcessPoolExecutor) -> None:
    """Stop ``ex``'s worker processes now: its queued work cancelled, the work running ended (a node's analysis
    can take minutes)."""
    procs = list((getattr(ex, "_processes", None) or {}).values())  # (no public way before Python 3.14)
    ex.shutdown(wait=False, cancel_futures=True)  # (which lets go of its list of processes)
    for proc in procs:
        proc.terminate()


class _InProcess(concurrent.futures.Executor):
    """``map`` in the calling process (``--workers 1``)."""

    def map(self, fn: Any, *iterables: Any, timeout: float | None = None, chunksize: int = 1) -> Iterator[Any]:
        return map(fn, *iterables)


def _folder_name(node: str) -> str:
    """A node's name as a folder name (a host name may hold anything a label may)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", node) or "node"


def node_infos(paths: list[Path]) -> list[dict[str, Any]]:
    """Each recording's :func:`~pcietrace.analysis.merge.node_info`; two of one name are refused (their rows
    could not be told apart)."""
    infos = [combine_nodes.node_info(read_meta(p), str(p)) for p in paths]
    seen: dict[str, str] = {}
    for info in infos:
        key = _folder_name(info["node"])
        if key in seen:
            raise UsageError(f"{seen[key]} and {info['path']} are both node {info['node']!r} (same host, same "
                             "label): record each with its own `attach --label`")
        seen[key] = info["path"]
    return infos


def merge(paths: list[Path], out: Path, workers: int | None = None, scheduler: str | None = None,
          force: bool = False) -> Path:
    """Analyse every recording of ``paths`` in parallel and save the merged report into ``out`` (published in
    one rename, as every saved run); returns where it went."""
    from pcietrace.store import RunFolder, discard_on_error

    if not paths:
        raise UsageError("merge needs at least one attach recording")
    infos = node_infos(paths)
    folder = RunFolder(out, explicit=True, force=force)
    with discard_on_error(folder):
        dirs = [str(folder.staging / NODES_DIR / _folder_name(i["node"])) for i in infos]
        with executor(workers or min(len(paths), os.cpu_count() or 1), scheduler) as ex:
            done = list(ex.map(analyze_node, [str(p) for p in paths], dirs, infos))
            metas = [json.loads((Path(d) / "meta.json").read_bytes()) for d in dirs]
            meta = merged_meta(infos, metas, "dask " + scheduler if scheduler else "processes")
            t0 = min((t for _, t in done if t is not None), default=0)
            list(ex.map(trace_part, dirs, range(1, len(dirs) + 1), [t0] * len(dirs), [meta] * len(dirs)))
        save(folder.staging, meta, combine_nodes.combine([(i, tables) for i, (tables, _) in zip(infos, done)]))
    return folder.publish()


def apart(meta: dict[str, Any]) -> list[str]:
    """The nodes of a merged report's ``meta`` whose program ran at no time another node's did (runs on the wall
    clock, from nodes that recorded its offset): recordings of another job, most likely. Empty for one node."""
    nodes = [n for n in (meta.get("merged") or {}).get("nodes", [])
             if n.get("offset_ns") is not None and n.get("t_app_start_ns") is not None
             and n.get("t_app_end_ns") is not None]
    return [n["node"] for n in nodes if len(nodes) > 1 and not any(
        m is not n and m["t_app_start_ns"] <= n["t_app_end_ns"] and n["t_app_start_ns"] <= m["t_app_end_ns"]
        for m in nodes)]


def merged_meta(infos: list[dict[str, Any]], metas: list[dict[str, Any]], engine: str) -> dict[str, Any]:
    """The merged report's meta: an attach meta (the first node's settings) whose ``gpus`` and ``processes``
    name their node, ``t_app_*`` the span of every node's run on the wall clock, ``exit_code`` the first
    non-zero, and ``merged``: ``nodes`` (each node's :func:`~pcietrace.analysis.merge.node_info`, status, exit
    code, command, date and run span), ``engine`` and ``created`` (the merge's time; the report's own ``created`` is
    the earliest node's recording's)."""
    from pcietrace.record.run import CREATED_FORMAT, RunPlan, base_meta

    nodes = []
    for info, m in zip(infos, metas):
        shift = int(info.get("offset_ns") or 0)
        nodes.append({**info, "status": m.get("status"), "kind": m.get("kind"), "exit_code": m.get("exit_code"),
                      "command": m.get("command"), "created": m.get("created"), "gpus": len(m.get("gpus", [])),
                      "t_app_start_ns": m["t_app_start_ns"] + shift if "t_app_start_ns" in m else None,
                      "t_app_end_ns": m["t_app_end_ns"] + shift if "t_app_end_ns" in m else None})
    first = metas[0]
    meta = base_meta(RunPlan(), any(m.get("simulated") for m in metas))
    meta.pop("plan")
    bad = [n["node"] for n in nodes if n["status"] != "complete"]
    starts = [n["t_app_start_ns"] for n in nodes if n["t_app_start_ns"] is not None]
    ends = [n["t_app_end_ns"] for n in nodes if n["t_app_end_ns"] is not None]
    # (only what the first node recorded: a key an older recording lacks stays absent, never null)
    meta.update({k: first[k] for k in ("command", "driver", "launch_costs", "sample_interval_ms", "launch_counter",
                                       "exact_edges", "idle_sample_interval_ms", "quiet_sample_interval_ms",
                                       "slow_domains", "gpu_time", "max_depth") if k in first})
    meta.update(kind="attach", status="complete" if not bad else f"incomplete: {', '.join(bad)}",
                exit_code=next((n["exit_code"] for n in nodes if n["exit_code"]), 0),
                gpus=[{**g, "node": i["node"], "host": i["host"]} for i, m in zip(infos, metas) for g in m.get("gpus", [])],
                processes=[{**p, "node": i["node"]} for i, m in zip(infos, metas) for p in m.get("processes", [])],
                merged={"nodes": nodes, "engine": engine, "created": meta["created"]})
    recorded = [t for m in metas if (t := _created(m)) is not None]
    if recorded:  # (the report's date is its recording's, the earliest node's; the merge's is in "merged")
        meta["created"] = min(recorded).strftime(CREATED_FORMAT)
    if starts and ends:
        meta.update(t_app_start_ns=min(starts), t_app_end_ns=max(ends))
    return meta


def _created(meta: dict[str, Any]) -> datetime.datetime | None:
    """When a node's recording began (its ``created``), or None where it is missing or unreadable."""
    from pcietrace.record.run import CREATED_FORMAT

    try:
        return datetime.datetime.strptime(str(meta.get("created")), CREATED_FORMAT)
    except ValueError:
        return None


def save(folder: Path, meta: dict[str, Any], results: dict[str, pd.DataFrame]) -> None:
    """The merged report into ``folder`` (the nodes' folders already there): report.json, results/*.parquet,
    trace.json."""
    from pcietrace.analysis import empty_results
    from pcietrace.report.notes import with_sentences
    from pcietrace.report.saved import to_jsonable

    tables = {k: v for k, v in with_sentences({**empty_results("attach"), **results}).items() if k not in NODE_ONLY}
    (folder / RESULTS_DIR).mkdir()
    for name, df in tables.items():
        if len(df):
            df.to_parquet(folder / RESULTS_DIR / f"{name}.parquet", index=False)
    doc = {"schema": schema.SCHEMA, "meta": meta, "tables": {}, "results": to_jsonable(tables)}
    (folder / REPORT_FILE).write_text(json.dumps(doc, indent=1, default=_json_default) + "\n")
    write_trace(folder, meta, folder / TRACE_FILE)


def load(path: Path, timelines: bool = True) -> Merged:
    """A merged report (its folder or report.json); ``timelines``: with every node's PCIe-rate timeline
    (``rates``, one row per GPU and ms: left empty without it). Damaged or from another schema: a
    ReportError naming the file."""
    from pcietrace.analysis import empty_results

    folder = path if path.is_dir() else path.parent
    report = folder / REPORT_FILE
    try:
        doc = json.loads(report.read_bytes())
        version = schema.schema_version(doc.get("schema"))
        meta = doc["meta"]
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        raise ReportError(f"{report} is not a readable merged report ({one_line(exc)})") from None
    if version != schema.SCHEMA_VERSION:
        raise ReportError(f"{report}: schema {doc.get('schema')!r}; this pcietrace reads {schema.SCHEMA}")
    if not isinstance(meta, dict) or not isinstance(meta.get("merged"), dict):
        raise ReportError(f"{report}: meta.merged is missing: not a merged report")
    results = empty_results("attach")
    try:
        for f in sorted((folder / RESULTS_DIR).glob("*.parquet")):
            with open(f, "rb") as fh:
                results[f.stem] = _lists(pd.read_parquet(fh))
        nodes = [folder / NODES_DIR / _folder_name(n["node"]) for n in meta["merged"]["nodes"]]
        results["range_instances"] = _lists(_stack([n / INSTANCES_FILE for n in nodes]))
        if timelines:
            results["rates"] = _stack([n / RATES_FILE for n in nodes])
    except Exception as exc:  # pyarrow raises its own types for damaged files
        raise ReportError(f"{folder} holds a damaged or missing table ({one_line(exc)})") from None
    return Merged(meta, results)


def _stack(files: list[Path]) -> pd.DataFrame:
    """The nodes' tables of one kind, in the nodes' order (an empty table has no columns to add)."""
    frames = [pd.read_parquet(f) for f in files]
    return pd.concat([f for f in frames if len(f)] or frames[:1], ignore_index=True)


def _lists(df: pd.DataFrame) -> pd.DataFrame:
    """List columns (``gpus``) back as Python lists, as the analysis makes them (Parquet gives numpy arrays)."""
    for c in df.columns:
        if df[c].dtype == object and len(df) and hasattr(df[c].iloc[0], "tolist"):
            df[c] = [v.tolist() if hasattr(v, "tolist") else v for v in df[c]]
    return df
