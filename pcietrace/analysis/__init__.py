"""Analysis: pure functions from a recorded :class:`~pcietrace.session.Session` to named DataFrames.

Never imports rich or touches a GPU. :func:`analyze` is the one entry point the CLI and tests use.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from pcietrace.analysis import attribution, counters, floor, gpu_time, launch, names, savings, summary, validate
from pcietrace.analysis import graphs as graphs_analysis
from pcietrace.analysis import latency as latency_analysis
from pcietrace.schema import NO_LAUNCH_COUNTER, SECOND_COPY, TABLE_COLUMNS, TRACE_FULL, empty_table, records
from pcietrace.session import Session

#: Result tables in display order; each is a DataFrame documented in its producing function.
RESULT_TABLES = ("sampling", "per_gpu", "floor", "calibration", "per_launch", "per_node", "by_duration",
                 "cpu_cost", "host_cost_by_language", "gpu_time", "speedup", "latency", "topology_model", "ranges",
                 "range_instances", "whole_run", "whole_run_bounds", "notes", "graphs", "fit_windows", "rates")

#: Column groups ``range_instances`` has all of or none of, beside :data:`attribution.INSTANCE_COLUMNS`, in this
#: order: ``gpu_time`` where the GPU's busy time was recorded (``attach --gpu-time``), ``savings`` where launch costs
#: are known (attach's "graphs save" figure).
INSTANCE_EXTRAS = {"gpu_time": gpu_time.BUSY_COLUMNS, "savings": ["graph_savings_ms", "launch_bound"]}
#: attach --launch-counter cupti: CUPTI's driver callbacks move bytes of their own, which every range then holds
#: (docs/lab/bench/launch_counter_bytes.py: the app's own NVML reads around 20,000 launches, with and without them;
#: H100, two runs: +2.98 % and +2.63 % H2D, +1.58 and +1.56 % D2H).
CUPTI_NOTE = ("launches were counted through CUPTI's driver callbacks, which add PCIe traffic of their own: an empty "
              "kernel's launch moved 2.6-3.0 % more H2D and 1.6 % more D2H bytes with them on (H100), and they cost "
              "~0.6-0.9 us of host time per launch; these figures include both (--launch-counter interpose adds "
              "< 0.1 %)")
#: attach --gpu-time: CUPTI's kernel activity records reach the host over PCIe (the same probe, its "gpu-time"
#: configuration, H100: +1.60 % H2D [95 % CI +1.52, +2.64], +12.96 % D2H [+12.67, +13.22]).
GPU_TIME_NOTE = ("--gpu-time: CUPTI's kernel records add PCIe traffic of their own: an empty kernel's launch moved "
                 "1.6 % more H2D and 13 % more D2H bytes with them on (H100), which these figures include; leave "
                 "--gpu-time off for per-launch bytes")
#: Columns of the ``notes`` table (attach: one sentence per row).
NOTES_COLUMNS = ["note"]


def declared_columns(kind: str | None) -> dict[str, list[str]]:
    """Each result table's columns, as its producer declares them, in a session of ``kind`` (``meta["kind"]``;
    None: a run): the columns every table has, with rows or without. Two tables name more: ``calibration`` is
    the session's own table (its declared columns, :data:`pcietrace.schema.TABLE_COLUMNS`, and whatever else the
    recording holds) and ``range_instances`` gains :data:`INSTANCE_EXTRAS` where measured."""
    attach = str(kind or "").startswith("attach")
    return {"sampling": counters.SAMPLING_COLUMNS, "per_gpu": summary.GPU_COLUMNS,
            "floor": floor.FLOOR_COLUMNS if attach else counters.RATE_FLOOR_COLUMNS,
            "calibration": list(TABLE_COLUMNS["calibration"]), "per_launch": launch.PER_LAUNCH_COLUMNS,
            "per_node": launch.PER_NODE_COLUMNS, "by_duration": launch.BY_DURATION_COLUMNS,
            "cpu_cost": launch.CPU_COST_COLUMNS, "host_cost_by_language": launch.HOST_COST_BY_LANGUAGE_COLUMNS,
            "gpu_time": launch.GPU_TIME_COLUMNS, "speedup": launch.SPEEDUP_COLUMNS,
            "latency": latency_analysis.SUMMARY_COLUMNS, "topology_model": latency_analysis.TOPOLOGY_MODEL_COLUMNS,
            "ranges": attribution.SUMMARY_COLUMNS, "range_instances": attribution.INSTANCE_COLUMNS,
            "whole_run": attribution.WHOLE_RUN_COLUMNS, "whole_run_bounds": attribution.WHOLE_RUN_BOUND_COLUMNS,
            "notes": NOTES_COLUMNS, "graphs": graphs_analysis.SUMMARY_COLUMNS,
            "fit_windows": launch.FIT_WINDOW_COLUMNS, "rates": counters.RATES_COLUMNS}


def empty_results(kind: str | None) -> dict[str, pd.DataFrame]:
    """Every result table with no rows and its :func:`declared_columns` (what :func:`analyze` starts from)."""
    columns = declared_columns(kind)
    out = {t: pd.DataFrame(columns=columns[t]) for t in RESULT_TABLES}
    out["calibration"] = empty_table(TABLE_COLUMNS["calibration"])  # (as a saved session's empty table loads)
    return out


def analyze(session: Session, us_per_level: float = latency_analysis.DEFAULT_US_PER_LEVEL,
            group_by: str = names.DEFAULT_GROUP_BY) -> dict[str, pd.DataFrame]:
    """All result tables of a session (tables whose inputs are missing come back empty, with their
    :func:`declared_columns`).
    ``us_per_level``: round trip added per PCIe switch level, for the topology model; ``group_by``: how attach's
    ``ranges`` table groups range names (:data:`names.GROUP_BY`; ``range_instances`` keeps every full name). A
    session that breaks an invariant the figures rely on raises :class:`~pcietrace.errors.DataError` first."""
    if group_by not in names.GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(names.GROUP_BY)}, not {group_by!r}")
    validate.check(session)
    s = session
    out = empty_results(s.meta.get("kind"))
    cum = counters.cumulative_bytes(s.samples, s.counters)
    if len(s.samples):
        out["sampling"] = counters.sample_gaps(s.samples, s.counters, cum)
    if s.meta.get("kind") == "graphs":
        out.update(_graphs(s, cum))
        return out
    attach = str(s.meta.get("kind", "")).startswith("attach")
    if len(s.windows) and len(s.samples) and not attach:
        wb = counters.window_bytes(cum, s.windows)
        fl = counters.floor(wb)
        wb = counters.subtract_floor(wb, fl)
        out["floor"] = fl
        out["per_launch"] = launch.per_launch_fits(wb, fl)
        if len(out["per_launch"]):
            out["per_node"] = launch.per_node(out["per_launch"])
        out["by_duration"] = launch.by_duration(wb)
        out["fit_windows"] = launch.fit_windows(wb)
    if len(s.calibration):
        out["calibration"] = s.calibration
    if len(s.bursts):
        out["cpu_cost"] = launch.cpu_cost(s.bursts)
        out["host_cost_by_language"] = launch.host_cost_by_language(s.bursts)
        if len(s.calibration):
            out["gpu_time"] = launch.gpu_time(s.bursts, s.calibration, s.contexts)
    if len(s.e2e):
        out["speedup"] = launch.speedup(s.e2e)
    if s.meta.get("kind") == "attach" and len(s.samples):  # ("attach-failed": the program never ran)
        out.update(_attach(s, cum, group_by))
    if len(s.latency):
        out["latency"] = latency_analysis.summary(s.latency)
        if len(out["gpu_time"]):
            levels = {g["nvml_index"]: g["switch_levels"] for g in (s.meta.get("topology") or {}).get("gpus", [])
                      if g.get("nvml_index") is not None}
            out["topology_model"] = latency_analysis.topology_model(out["gpu_time"], out["latency"], levels, us_per_level)
    if not attach:
        out["per_gpu"] = summary.gpu_figures(s.meta, out)
    return out


#: Timelines recomputed from the raw samples whenever needed (plots, Perfetto): one row per GPU and
#: millisecond, so saving them would multiply a long run's report.json (21 MB for 8 GPUs x 20 s).
TIMELINES = ("rates",)


#: The most bins a timeline has per GPU (or process): a longer run gets longer bins (whole ms), so an hour on
#: 8 GPUs is 8 x 100,000 rows, not 8 x 3.6 million.
MAX_TIMELINE_BINS = 100_000


def timeline_bin_ns(meta: dict[str, Any], span_ns: int = 0, max_bins: int = MAX_TIMELINE_BINS) -> int:
    """Bin of the attach timelines (PCIe rates, launch rates): the sampling interval, at least 1 ms, and long
    enough that ``span_ns`` (the timeline's length) makes at most ``max_bins`` bins (in whole ms)."""
    fine = max(int(float(meta.get("sample_interval_ms") or 1.0) * 1e6), 1_000_000)
    return max(fine, -(-int(span_ns) // max_bins // 1_000_000) * 1_000_000)


def _span_ns(t: pd.Series) -> int:
    return int(t.max() - t.min()) if len(t) else 0


def launch_timeline(session: Session, max_bins: int = MAX_TIMELINE_BINS) -> pd.DataFrame | None:
    """An attach run's launches per ms per process over time (:func:`attribution.launch_rate`, binned by
    :func:`timeline_bin_ns`: at most ``max_bins`` bins per process), or None where launches were not counted
    (``--no-count-launches``: no launch track rather than a flat 0)."""
    if session.meta.get("launch_counter") == NO_LAUNCH_COUNTER:
        return None
    events = gpu_time.host_events(session.events)
    span = _span_ns(events["t_ns"]) if len(events) else 0
    return attribution.launch_rate(events, timeline_bin_ns(session.meta, span, max_bins))


def idle_interval_ns(meta: dict[str, Any]) -> int:
    """The sampler's interval while no range was open (attach's idle-aware sampling; 0 = off, also for
    recordings made before it): never shorter than the sampling interval, as in the sampler."""
    idle = float(meta.get("idle_sample_interval_ms") or 0.0)
    return int(max(idle, float(meta.get("sample_interval_ms") or 0.0)) * 1e6) if idle > 0 else 0


def to_jsonable(results: dict[str, pd.DataFrame]) -> dict[str, Any]:
    """Result tables as lists of records (:func:`pcietrace.schema.records`: NaN -> null, counts as integers), for
    the JSON report and ``--json`` (timelines left out: :data:`TIMELINES`)."""
    return {k: records(v) for k, v in results.items() if k not in TIMELINES}


def saved_tables(results: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Result tables as ``report.json`` saves them (:func:`to_jsonable`'s, timelines left out) but still as
    DataFrames, which :meth:`pcietrace.session.Session.save` writes as records a chunk of rows at a time: a long
    attach run's range instances never become one list of dicts or one string."""
    return {k: v for k, v in results.items() if k not in TIMELINES}


#: Launch counts of a range instance, unknown (NaN) where the program ran with ``--no-count-launches``.
LAUNCH_COUNTS = ("eager_launches", "graph_launches", "eager_launches_process", "graph_launches_process",
                 "captured_launches", "captured_launches_process")
#: The same for the whole run's rows.
WHOLE_RUN_LAUNCHES = ("eager_launches", "graph_launches", "program_eager_launches", "program_graph_launches",
                      "program_captured_launches")


def _unplaced_launches(whole: pd.DataFrame) -> list[str]:
    """A note where the per-GPU launch counts of the whole run do not add up to the program's."""
    w = whole.iloc[0]
    if whole["eager_launches"].isna().any():
        return ["launches per GPU are unknown (this recording has no device information): the whole-run rows "
                "leave them out; the program's totals are in the summary"]
    left = {m: int(w[f"program_{m}_launches"] - whole[f"{m}_launches"].sum()) for m in ("eager", "graph")}
    if not any(left.values()):
        return []
    return [f"{left['eager']:,} eager and {left['graph']:,} graph launches are in no GPU's whole-run row: they were "
            "made on a GPU not sampled, or in a process that launched on several GPUs by a thread that launched on "
            "several between two of its events or had no event after them"]


def _untraced_launches(events: pd.DataFrame) -> list[str]:
    """A note where threads with no NVTX event made launches: no push/pop range counts them."""
    u = attribution.launches_by_untraced_threads(events)
    u = u[u["untraced"] > 0.01 * u["launches"]]  # (a few set-up launches after a thread's last event: no note)
    if not len(u):
        return []
    return [f"{int(u['untraced'].sum()):,} of {int(u['launches'].sum()):,} launches ({len(u)} process(es)) were made by "
            "threads with no NVTX range (e.g. PyTorch's autograd threads, which launch the backward pass): a push/pop "
            "range counts its own thread's launches only; range_instances' eager_launches_process and "
            "graph_launches_process count the whole process's while it was open"]


def _attach(s: Session, cum: pd.DataFrame, group_by: str = names.DEFAULT_GROUP_BY) -> dict[str, pd.DataFrame]:
    """Attribution for an attach session (``cum``: its :func:`counters.cumulative_bytes`): idle windows
    before/after the program give each GPU's floor (per counter read + background); each range is charged to
    its own GPUs."""
    sampled = [int(g["nvml_index"]) for g in s.meta.get("gpus", [])]
    events = gpu_time.host_events(s.events)
    ranges = attribution.ranges_from_events(events) if len(events) else pd.DataFrame(columns=attribution.RANGE_COLUMNS)
    slow = [d for d in str(s.meta.get("slow_domains") or "").split(",") if d]  # ranges that did not hold the fast rate
    gaps = attribution.sampling_gaps(cum, s.counters, idle_interval_ns(s.meta), ranges[~ranges["domain"].isin(slow)])
    gap_ns = max((g["median_ns"] for g in gaps.values()), default=0.0)  # the in-range gap: what edges rest on
    notes = []
    if len(ranges) and "devmask" not in events.columns:
        notes.append("this recording has no device information (made before pcietrace recorded it): every range "
                     "is charged all sampled GPUs")
    if idle_interval_ns(s.meta) and len(gaps):
        notes.append(f"idle-aware sampling: counters read every {idle_interval_ns(s.meta) / 1e6:g} ms while no range "
                     f"was open; median gap while one was: {gap_ns / 1e6:.2f} ms (the sampling table mixes both)")
    ranges = attribution.range_gpus(ranges, events, s.meta.get("gpus", []))
    fl = floor.floor_model(cum, s.windows, sampled, floor.spans_by_gpu(ranges))
    inst = attribution.attribute(ranges, cum, fl, s.counters, gaps) if len(ranges) else \
        pd.DataFrame(columns=attribution.INSTANCE_COLUMNS)
    inst["group"] = names.group_names(inst["name"], group_by)
    costs = s.meta.get("launch_costs")
    pids = gpu_time.recording_pids(s.events)
    if pids and len(inst):  # attach --gpu-time: the GPU's busy time per range
        inst = gpu_time.busy(inst, gpu_time.kernels(s.events), pids, (costs or {}).get("wall_us_per_kernel_graph", 0.0) * 1e3)
        notes += gpu_time.notes(s.events)
    for r in events[events["event"] == TRACE_FULL].itertuples() if len(events) else []:
        notes.append(f"process {r.pid}: its trace file filled up ({int(r.id) / 2**20:,.0f} MiB) at t = "
                     f"{(r.t_ns - s.meta['t_app_start_ns']) / 1e9:,.3f} s; later events were lost (ranges still open are "
                     "closed there, later launches uncounted): set PCIETRACE_TRACE_BYTES higher")
    for r in events[events["event"] == SECOND_COPY].itertuples() if len(events) else []:
        notes.append(f"process {r.pid}: a second copy of the injection library was loaded ({r.message}); it only "
                     "forwarded to the first copy, which counted each launch once and wrote this trace")
    never = int((~inst["closed"].astype(bool)).sum()) if len(inst) and "closed" in inst else 0
    if never:  # (attribution.ranges_from_events closes them at their process's last event)
        notes.append(f"{never} range(s) were never popped (ended, closed=false in range_instances): each is closed at "
                     "its process's last event, so its time, bytes and launches run to there")
    bad = s.meta.get("trace_bad") or {}
    if bad.get("lines") or bad.get("files"):  # (record/trace.py: read_traces) left out, the rest kept
        notes.append(f"the traces held {bad.get('lines', 0):,} line(s) that were not trace lines"
                     + (f" and {len(bad['files'])} file(s) that were not traces ({', '.join(map(str, bad['files'][:3]))})"
                        if bad.get("files") else "") + ": left out; the ranges and launches come from the rest")
    for idx, n in counters.resets(cum).items():
        if n:
            notes.append(f"GPU{idx}: its counters jumped {int(n)} time(s) by more than the link could move (a "
                         "counter reset): the bytes across a jump are unknown; ranges over one are 'wrap risk'")
    for r in counters.wrap_gaps(cum, s.counters, s.meta["t_app_start_ns"], s.meta["t_app_end_ns"]).itertuples():
        notes.append(f"GPU{r.nvml_index}: the sampler stalled: {r.gaps} interval(s) between counter reads while the "
                     f"program ran could hide a wrap of its counter (the longest: {r.longest_span_ms:,.1f} ms from the "
                     f"start of one read to the end of the next, the longer read {r.longest_read_ms:,.1f} ms); the "
                     "whole run and the ranges over them are 'wrap risk'")
    for r in fl[fl["status"] == "no floor"].itertuples():
        notes.append(f"GPU{r.nvml_index}: no floor (no idle window covered by its samples); its bytes are shown raw only")
    for r in fl[(fl["status"] != "no floor") & (fl["dof"] == 0)].itertuples():
        notes.append(f"GPU{r.nvml_index}: its floor rests on {r.windows} idle window(s), too few to estimate its "
                     "error: its ± covers the edges only")
    whole_floor = floor.floor_model(cum, s.windows, sampled, windows_only=True)  # (see floor_model)
    whole = attribution.whole_run(cum, events, s.meta["t_app_start_ns"], s.meta["t_app_end_ns"], whole_floor,
                                  s.meta.get("gpus", []), s.counters)
    if s.meta.get("launch_counter") == NO_LAUNCH_COUNTER:  # --no-count-launches: the counts are unknown, not 0
        inst = inst.assign(**{c: math.nan for c in LAUNCH_COUNTS if c in inst})
        whole = whole.assign(**{c: math.nan for c in WHOLE_RUN_LAUNCHES})
        notes.append("launches were not counted (--no-count-launches): no launch overhead or graph-savings figures")
    else:
        notes += _unplaced_launches(whole) if len(whole) else []
        notes += _untraced_launches(events)
    if s.meta.get("launch_counter") == "cupti":
        notes.append(CUPTI_NOTE)
    if s.meta.get("gpu_time"):
        notes.append(GPU_TIME_NOTE)
    if costs and len(inst):  # attach's "graphs save" figure, per call and for the run (one prediction each)
        p = savings.predict_ms(inst, costs)
        inst = inst.assign(graph_savings_ms=p["predicted_ms"], launch_bound=p["launch_bound"])
        whole["program_graph_savings_ms"] = savings.outermost_ms(p)
    tree = names.group_tree(inst).rename(columns={"group": "name"})
    ranges_table = attribution.summarize(inst, costs, short_ns=2 * gap_ns)
    if len(ranges_table):
        ranges_table = ranges_table.drop(columns=["parent_domain", "parent_name", "level"]).merge(tree, on=["domain", "name"], how="left")
    bounds = attribution.whole_run_bounds(cum, s.meta["t_app_start_ns"], s.meta["t_app_end_ns"], whole_floor, s.counters)
    return {"floor": fl, "range_instances": inst, "rates": counters.rates(cum, timeline_bin_ns(s.meta, _span_ns(cum["t_ns"]))),
            "ranges": ranges_table, "whole_run": whole,
            "whole_run_bounds": bounds[bounds["nvml_index"].isin(whole.loc[whole["status"] == "wrap risk", "nvml_index"])],
            "notes": pd.DataFrame(summary.merge_gpu_notes(notes), columns=NOTES_COLUMNS, dtype=str)}


def _graphs(s: Session, cum: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """A ``pcietrace graphs`` session (``cum``: its :func:`counters.cumulative_bytes`): the floor from its idle
    windows, then the per-strategy summary."""
    per_window = not s.meta.get("graphs_plan", {}).get("sync", True)
    if not len(s.windows) or not len(s.samples):
        return {"graphs": graphs_analysis.summary(s.graphs, pd.DataFrame(), per_window)}
    wb = counters.window_bytes(cum, s.windows)
    fl = counters.floor(wb)
    return {"floor": fl, "graphs": graphs_analysis.summary(s.graphs, counters.subtract_floor(wb, fl), per_window)}
