"""``pcietrace attach``: idle windows before and after the program give each GPU's floor (per counter read +
background); each NVTX range is charged its own GPUs' bytes; the whole run; and :class:`Note` s on what the
figures leave out."""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from pcietrace import memory
from pcietrace.analysis import attribution, counters, floor, gpu_time, names, nesting, overlap, savings, validate
from pcietrace.analysis.kinds import shared
from pcietrace.analysis.launch import DIRECTIONS
from pcietrace.analysis.notes import Note
from pcietrace.analysis.results import AttachResult
from pcietrace.analysis.timelines import idle_interval_ns, launch_timeline, quiet_interval_ns, span_ns, timeline_bin_ns
from pcietrace.schema import NO_LAUNCH_COUNTER, SECOND_COPY, TRACE_FULL
from pcietrace.session import Session

#: Launch counts of a range instance, unknown (NaN) where the program ran with ``--no-count-launches``.
LAUNCH_COUNTS = ("eager_launches", "graph_launches", "eager_launches_process", "graph_launches_process",
                 "captured_launches", "captured_launches_process")
#: The same for the whole run's rows.
WHOLE_RUN_LAUNCHES = ("eager_launches", "graph_launches", "program_eager_launches", "program_graph_launches",
                      "program_captured_launches")


def analyze(s: Session, options: shared.Options) -> AttachResult:
    """An attach session's result; one whose program never ran ("attach-failed") or that has no samples has
    none of the attribution tables."""
    if s.meta.get("kind") == "attach" and (len(s.samples) or s.sample_file is not None):
        out = {**shared.host_costs(s), **attribute(s, options)}  # ("sampling" among them)
    else:
        out = {**shared.sampling(s, counters.cumulative_bytes(s.samples, s.counters)), **shared.host_costs(s)}
    out.update(shared.round_trips(s, out.get("gpu_time"), options.us_per_level))
    return AttachResult.of(out)


@dataclass
class _ByGpu:
    """What :func:`_by_gpu` found, each GPU's samples read in turn: ``sampling`` (:func:`counters.sample_gaps`),
    ``median_gap_ns`` (per GPU, :func:`attribution.sampling_gaps`' ``median_ns``), ``floor`` and ``whole_floor``
    (:func:`floor.floor_model`, of the ranges' state and of the windows only), ``sums`` and ``whole_sums``
    (:func:`attribution.gpu_sums` of the ranges and of :func:`attribution.run_spans`), ``resets``, ``wrap_gaps``,
    ``bounds`` (:func:`attribution.whole_run_bounds`), ``rates`` and ``elsewhere`` (per GPU whose idle windows saw
    it only in another state than its ranges: :func:`floor.windows_elsewhere`, with its index; where other GPUs
    measured its ranges' read time, which (``peers``) and the cost per read charged: :func:`floor.peer_read_cost`)."""

    sampling: pd.DataFrame
    median_gap_ns: dict[int, float]
    floor: pd.DataFrame
    whole_floor: pd.DataFrame
    sums: dict[str, Any] | None
    whole_sums: dict[str, Any] | None
    resets: pd.Series
    wrap_gaps: pd.DataFrame
    bounds: pd.DataFrame
    rates: pd.DataFrame
    elsewhere: list[dict[str, float]]

    def take(self, name: str) -> Any:
        """Field ``name``, no longer held here (the sums per range: what reads them lets each go as it is used)."""
        value = getattr(self, name)
        setattr(self, name, None)
        return value


def _by_gpu(s: Session, ranges: pd.DataFrame, in_range: pd.DataFrame, groups: np.ndarray) -> _ByGpu:
    """Every figure read from the counter samples of an attach session ``s``, one GPU's samples at a time: a long
    run's cumulative counters (16 bytes a sample) are never all held at once. ``ranges``: with their ``gpus``
    (:func:`attribution.range_gpus`); ``in_range``: the stretches of time (``t_start_ns``, ``t_end_ns``, each
    sorted: :func:`floor.union_spans`) that any of those that held the sampler's fast rate (its median gap) was open;
    ``groups``: each range's group in the summary, a code (:func:`_summary_groups`)."""
    sampled = [int(g["nvml_index"]) for g in s.meta.get("gpus", [])]
    t0, t1 = s.meta["t_app_start_ns"], s.meta["t_app_end_ns"]
    spans = floor.spans_by_gpu(ranges)
    on_disk = s.sample_file if not len(s.samples) else None

    def gpu_samples(only: set[int] | None = None) -> Any:  # (each GPU's samples: held, or read and checked)
        if on_disk is None:
            return ((i, g) for i, g in counters.per_gpu(s.samples) if only is None or int(i) in only)
        return ((i, validate.gpu_samples(i, on_disk.read(i), s.counters)) for i in on_disk.gpus
                if only is None or int(i) in only)
    have = list(on_disk.gpus) if on_disk is not None else [int(i) for i, _ in counters.per_gpu(s.samples)]
    whole_spans = attribution.run_spans(have, t0, t1)
    span = on_disk.t_max_ns - on_disk.t_min_ns if on_disk is not None else span_ns(s.samples["t_ns"])
    bin_ns = timeline_bin_ns(s.meta, span)  # (checked below against the samples kept)
    sampling, resets, wraps, bounds, rates, elsewhere = [], [], [], [], [], []
    window_us: dict[int, float] = {}  # (each GPU's reading windows' mean read time: what its cost per read is at)
    gaps: dict[int, dict[str, Any]] = {}
    rows: dict[int, list[dict[str, Any]]] = {}
    whole_rows: dict[int, list[dict[str, Any]]] = {}
    sums = whole_sums = None
    kept = [math.inf, -math.inf]  # (the earliest and latest sample kept: the timeline's span)
    for idx, samples in gpu_samples():
        idx = int(idx)
        cum = counters.cumulative_bytes(samples, s.counters)
        sampling.append(counters.sample_gaps(samples, s.counters, cum))
        del samples  # (its raw counter columns: not beside the sums below)
        t = cum["t_ns"].to_numpy()
        kept = [min(kept[0], int(t[0])), max(kept[1], int(t[-1]))]
        gaps.update(attribution.sampling_gaps(cum, s.counters, idle_interval_ns(s.meta), in_range,
                                              quiet_interval_ns(s.meta)))
        mine = [idx] if idx in sampled else []  # (the session's GPUs have floors; a GPU only sampled has none)
        rows[idx] = floor.floor_rows(cum, s.windows, mine, spans)
        per_window, window_us[idx] = floor.reading_windows_us(cum, s.windows, idx)
        apart = floor.windows_elsewhere(rows[idx][0], cum, per_window, spans.get(idx)) if mine and len(ranges) \
            else None
        if apart:  # (its ranges' sums, and its gaps' flags, wait for the other GPUs' floors: their reads may serve)
            elsewhere.append({"gpu": idx, **apart})
        whole_rows[idx] = floor.floor_rows(cum, s.windows, mine, windows_only=True)
        fl, whole_fl = (pd.DataFrame(r[idx], columns=floor.FLOOR_COLUMNS) for r in (rows, whole_rows))
        if len(ranges) and not apart:
            sums = attribution.gpu_sums(ranges, cum, fl, s.counters, gaps, sums, groups)
        whole_sums = attribution.gpu_sums(whole_spans, cum, whole_fl, s.counters, gaps, whole_sums)
        if not apart:
            gaps[idx] = {"median_ns": gaps[idx]["median_ns"]}  # (its flags read: let go)
        resets.append(counters.resets(cum))
        wraps.append(counters.wrap_gaps(cum, s.counters, t0, t1))
        bounds.append(attribution.whole_run_bounds(cum, t0, t1, whole_fl, s.counters))
        rates.append(counters.rates(cum, bin_ns))
        del cum, t
    model = {int(g["nvml_index"]): g.get("name") for g in s.meta.get("gpus", [])}
    waited = {e["gpu"] for e in elsewhere}
    for e in elsewhere:  # (read again: a GPU's samples are never held beside another's)
        idx = e["gpu"]
        peers = [(rows[i][0], window_us[i]) for i in sorted(rows)
                 if i not in waited and rows[i] and model.get(idx) is not None and model.get(i) == model.get(idx)]
        borrow = floor.peer_read_cost(peers, e["ranges_us"])
        for _, samples in gpu_samples({idx}):
            cum = counters.cumulative_bytes(samples, s.counters)
            del samples
            if borrow is not None:  # (the note says which GPUs, and the cost per read charged)
                rows[idx] = floor.floor_rows(cum, s.windows, [idx], spans, borrow=borrow)
                e.update(peers=", ".join(map(str, borrow["nvml_indices"])),
                         **{f"{d}_per_read": rows[idx][0][f"{d}_bytes_per_read_program"] for d in DIRECTIONS})
            fl = pd.DataFrame(rows[idx], columns=floor.FLOOR_COLUMNS)
            sums = attribution.gpu_sums(ranges, cum, fl, s.counters, gaps, sums, groups)
            gaps[idx] = {"median_ns": gaps[idx]["median_ns"]}
            del cum
    if timeline_bin_ns(s.meta, kept[1] - kept[0]) != bin_ns:  # (samples left out moved the span: binned again)
        bin_ns = timeline_bin_ns(s.meta, kept[1] - kept[0])
        rates = [counters.rates(counters.cumulative_bytes(samples, s.counters), bin_ns)
                 for _, samples in gpu_samples()]
    none = counters.cumulative_bytes(s.samples.iloc[:0], s.counters)  # (a session's GPU with no samples: no floor)
    fl, whole_fl = (pd.DataFrame([row for i in sampled for row in (r[i] if i in r else floor.floor_rows(
        none, s.windows, [i], windows_only=whole))], columns=floor.FLOOR_COLUMNS)
        for r, whole in ((rows, False), (whole_rows, True)))
    return _ByGpu(sampling=_joined(sampling), median_gap_ns={i: g["median_ns"] for i, g in gaps.items()}, floor=fl,
                  whole_floor=whole_fl, sums=sums, whole_sums=whole_sums, resets=pd.concat(resets),
                  wrap_gaps=_joined(wraps), bounds=_joined(bounds), rates=_joined(rates), elsewhere=elsewhere)


def _summary_groups(ranges: pd.DataFrame, group: pd.Series) -> tuple[np.ndarray, pd.DataFrame]:
    """Each range's (``domain``, ``group``) as a code (:func:`nesting.codes`; -1 where either is missing: no
    group's call), and per code its ``domain`` and ``group`` (a row each)."""
    dom = ranges["domain"] if isinstance(ranges["domain"].dtype, pd.CategoricalDtype) else \
        ranges["domain"].astype("category")
    dom_codes, group_codes = dom.cat.codes.to_numpy(), group.cat.codes.to_numpy()
    code = nesting.codes(dom_codes, group_codes)
    code[(dom_codes < 0) | (group_codes < 0)] = -1
    first = np.flatnonzero(~pd.Series(code, copy=False).duplicated().to_numpy() & (code >= 0))  # (each code's first)
    keys = pd.DataFrame({"domain": dom.iloc[first].astype(str).to_numpy(),
                         "group": group.iloc[first].astype(str).to_numpy()}, index=code[first])
    return code, keys


def _joined(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Per-GPU tables in one, rows in GPU order (those with none left out, so that their columns' types stay)."""
    rows = [p for p in parts if len(p)]
    return pd.concat(rows, ignore_index=True) if rows else parts[0]


def _unplaced_launches(whole: pd.DataFrame) -> list[Note]:
    """A note where the per-GPU launch counts of the whole run do not add up to the program's."""
    w = whole.iloc[0]
    if whole["eager_launches"].isna().any():
        return [Note("launches_per_gpu_unknown")]
    left = {m: int(w[f"program_{m}_launches"] - whole[f"{m}_launches"].sum()) for m in ("eager", "graph")}
    if not any(left.values()):
        return []
    return [Note("launches_unplaced", eager=left["eager"], graph=left["graph"])]


def _untraced_launches(events: pd.DataFrame) -> list[Note]:
    """A note where threads with no NVTX event made launches: no push/pop range counts them."""
    u = attribution.launches_by_untraced_threads(events)
    u = u[u["untraced"] > 0.01 * u["launches"]]  # (a few set-up launches after a thread's last event: no note)
    if not len(u):
        return []
    return [Note("launches_untraced", untraced=int(u["untraced"].sum()), launches=int(u["launches"].sum()),
                 processes=len(u))]


def attribute(s: Session, options: shared.Options = shared.Options()) -> dict[str, object]:
    """Attribution for an attach session with samples: idle windows before/after the program give each GPU's
    floor (per counter read + background); each range is charged to its own GPUs. Its GPUs' samples are read
    one at a time (:func:`_by_gpu`); the sampler's figures (``sampling``) are among the tables.
    ``options.release_events``, ``options.release_samples``: ``s.events`` emptied once what is read from them is
    made, ``s.samples`` once read (:func:`pcietrace.analysis.analyze`)."""
    release_events = options.release_events
    events = gpu_time.host_events(s.events)
    # (what is read from every event first: the untraced launches, the run's launches per GPU, the launch rates,
    # the GPU's kernels and the notes the events make; then the ranges, which may take the events apart as they go)
    untraced = _untraced_launches(events) if s.meta.get("launch_counter") != NO_LAUNCH_COUNTER else []
    launches = attribution.run_launches(events, s.meta.get("gpus", []))
    launch_rates = launch_timeline(s)
    pids = gpu_time.recording_pids(s.events)
    kernels = gpu_time.kernels(s.events) if pids else None
    gpu_notes = gpu_time.notes(s.events) if pids else []
    said = []  # (the notes the events make, in their place below)
    for r in events[events["event"] == TRACE_FULL].itertuples() if len(events) else []:
        said.append(Note("trace_full", pid=r.pid, mib=int(r.id) / 2**20, t_s=(r.t_ns - s.meta["t_app_start_ns"]) / 1e9))
    for r in events[events["event"] == SECOND_COPY].itertuples() if len(events) else []:
        said.append(Note("second_copy", pid=r.pid, library=r.message))
    devices_known = "devmask" in events.columns
    if release_events:
        s.release_events()
    ranges = attribution.process_ranges(events, s.meta.get("gpus", []), consume=release_events)
    del events
    if release_events:
        gc.collect()  # (a frame lies in reference cycles of its own: freed now, not at the next full collection)
    notes = [Note("no_device_information")] if len(ranges) and not devices_known else []
    slow = [d for d in str(s.meta.get("slow_domains") or "").split(",") if d]  # ranges that did not hold the fast rate
    fast = ranges[~ranges["domain"].isin(slow)] if slow else ranges  # (only their edges count: sorted once for all GPUs)
    # (where any was open: a long run's nested ranges held as the stretches of their outermost ones)
    spans = np.column_stack([fast[c].to_numpy(np.int64) for c in ("t_start_ns", "t_end_ns")])
    in_range = pd.DataFrame(floor.union_spans(spans), columns=["t_start_ns", "t_end_ns"])
    del spans, fast
    parent = nesting.parents(ranges)  # (before the samples are read: its working arrays never lie beside the sums)
    memory.release_freed()  # (the events' and the nesting's arrays: their holes fit the sums badly)
    group = names.group_names(ranges["name"], options.group_by)  # (the summary's groups: their calls' edges shared)
    codes, keys = _summary_groups(ranges, group)
    # (the counters are per GPU: ranges of threads working at once each hold the others' bytes)
    up = nesting.parent_rows(ranges.index, parent)
    concurrent = [] if s.meta.get("launch_counter") == NO_LAUNCH_COUNTER else overlap.concurrent(ranges, up, group)
    for c in concurrent:
        notes.append(Note("ranges_concurrent", gpu=c["gpu"], threads=c["threads"], processes=c["processes"],
                          at_once=c["at_once"], shared_ms=c["shared_ms"], open_ms=c["open_ms"],
                          share_pct=100 * c["shared_ms"] / c["open_ms"],
                          names=", ".join(c["names"]) or "unnamed ranges"))
    del ranges["worked"]  # (read here alone)
    # (a call inside another of its group is in that call's total: its edges pair with none of the group's)
    inner = nesting.inside_own_group(up, codes)
    del up
    codes[inner] = -1
    found = _by_gpu(s, ranges, in_range, codes)
    del in_range, codes
    if options.release_samples:
        s.release_samples()
    memory.release_freed()  # (each GPU's samples in turn: their holes fit the instances' columns badly)
    gaps = found.median_gap_ns
    gap_ns = max(gaps.values(), default=0.0)  # the in-range gap: what edges rest on
    if idle_interval_ns(s.meta) and len(gaps):
        notes.append(Note("idle_sampling", idle_ms=idle_interval_ns(s.meta) / 1e6, gap_ms=gap_ns / 1e6))
    fast_ms = s.meta.get("sample_interval_ms")  # (None in a report.json edited without it: no such note)
    if fast_ms is not None and quiet_interval_ns(s.meta) > float(fast_ms) * 1e6:
        notes.append(Note("quiet_sampling", quiet_ms=quiet_interval_ns(s.meta) / 1e6, fast_ms=float(fast_ms)))
    fl = found.floor
    sums = found.take("sums")
    shared = sums.pop("shared") if sums is not None else None
    shared_by = keys.assign(**{f"{d}_shared_bytes": shared[d][keys.index] for d in DIRECTIONS}) if shared else None
    del shared
    inst = attribution.attribute(ranges, None, fl, s.counters, sums=sums, parent=parent) \
        if len(ranges) else pd.DataFrame(columns=attribution.INSTANCE_COLUMNS)
    del parent, sums
    inst["group"] = group
    del group
    costs = s.meta.get("launch_costs")
    if pids and len(inst):  # attach --gpu-time: the GPU's busy time per range
        inst = gpu_time.busy(inst, kernels, pids, (costs or {}).get("wall_us_per_kernel_graph", 0.0) * 1e3)
        notes += gpu_notes
    notes += said
    del kernels
    never = int((~inst["closed"].astype(bool)).sum()) if len(inst) and "closed" in inst else 0
    if never:  # (attribution.ranges_from_events closes them at their process's last event)
        notes.append(Note("ranges_never_popped", ranges=never))
    bad = s.meta.get("trace_bad") or {}
    if bad.get("files"):  # (record/trace.py: read_traces) left out, the rest kept
        notes.append(Note("trace_lines_and_files_bad", lines=bad.get("lines", 0), files=len(bad["files"]),
                          first_files=", ".join(map(str, bad["files"][:3]))))
    elif bad.get("lines"):
        notes.append(Note("trace_lines_bad", lines=bad.get("lines", 0)))
    for idx, n in found.resets.items():
        if n:
            notes.append(Note("counter_reset", gpu=idx, jumps=int(n)))
    for r in found.wrap_gaps.itertuples():
        notes.append(Note("sampler_stalled", gpu=r.nvml_index, gaps=r.gaps, longest_span_ms=r.longest_span_ms,
                          longest_read_ms=r.longest_read_ms))
    for r in fl[fl["status"] == "no floor"].itertuples():
        notes.append(Note("no_floor", gpu=r.nvml_index))
    for r in fl[(fl["status"] != "no floor") & (fl["dof"] == 0)].itertuples():
        notes.append(Note("floor_without_error", gpu=r.nvml_index, windows=r.windows))
    for e in found.elsewhere:
        if "peers" in e:
            notes.append(Note("floor_read_time_borrowed", gpu=e["gpu"], windows_us_min=e["windows_us_min"],
                              windows_us_max=e["windows_us_max"], ranges_us=e["ranges_us"], peers=e["peers"],
                              h2d_per_read=e["h2d_per_read"], d2h_per_read=e["d2h_per_read"]))
        else:
            notes.append(Note("floor_windows_elsewhere", gpu=e["gpu"], windows_us_min=e["windows_us_min"],
                              windows_us_max=e["windows_us_max"], ranges_us=e["ranges_us"],
                              h2d_per_read=e["h2d_per_read"], d2h_per_read=e["d2h_per_read"]))
    whole = attribution.whole_run(None, launches, s.meta["t_app_start_ns"], s.meta["t_app_end_ns"], found.whole_floor,
                                  s.counters, sums=found.take("whole_sums"))
    if s.meta.get("launch_counter") == NO_LAUNCH_COUNTER:  # --no-count-launches: the counts are unknown, not 0
        inst = inst.assign(**{c: math.nan for c in LAUNCH_COUNTS if c in inst})
        whole = whole.assign(**{c: math.nan for c in WHOLE_RUN_LAUNCHES})
        notes.append(Note("launches_not_counted"))
    else:
        notes += _unplaced_launches(whole) if len(whole) else []
        notes += untraced
    unrecorded = sum(p.get("ranges_unrecorded", 0) for p in s.meta.get("processes") or [])
    if unrecorded:
        notes.append(Note("ranges_unrecorded", ranges=unrecorded, depth=s.meta.get("max_depth")))
    if s.meta.get("launch_counter") == "cupti":
        notes.append(Note("cupti_launch_counter"))
    if s.meta.get("gpu_time"):
        notes.append(Note("gpu_time_traffic"))
    if costs and len(inst):  # attach's "graphs save" figure, per call and for the run (one prediction each)
        p = savings.predict_ms(inst, costs)
        inst = inst.assign(graph_savings_ms=p["predicted_ms"], launch_bound=p["launch_bound"])
        whole["program_graph_savings_ms"] = savings.outermost_ms(p)
        del p  # (its own figures per instance: not kept beside the instances)
        memory.release_freed()  # (the prediction's working arrays, gone before the summary's)
    tree = names.group_tree(inst).rename(columns={"group": "name"})
    memory.release_freed()  # (the tree's walks up every instance's ancestors, gone before the summary's arrays)
    ranges_table = attribution.summarize(inst, costs, short_ns=2 * gap_ns, shared=shared_by, inner=inner)
    del inner
    if len(ranges_table):
        ranges_table = ranges_table.drop(columns=["parent_domain", "parent_name", "level", "parent_calls"]).merge(
            tree, on=["domain", "name"], how="left")
        # (a trace with lines left out can pair a push with another pop than its recorded depth says: two calls of
        # a group, one inside the other, would both sit directly in one parent call, so no parent bounds them)
        whole_trace = not bad.get("lines")
        ranges_table = (attribution.within_parents(ranges_table) if whole_trace else ranges_table).drop(
            columns="within_parent")
    bounds = found.bounds
    return {"sampling": found.sampling, "floor": fl, "range_instances": inst, "rates": found.rates,
            "launch_rates": launch_rates,
            "ranges": ranges_table, "whole_run": whole,
            "whole_run_bounds": bounds[bounds["nvml_index"].isin(whole.loc[whole["status"] == "wrap risk", "nvml_index"])],
            "notes": tuple(notes)}
