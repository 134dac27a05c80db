"""The sentences of the analysis' notes (:class:`~pcietrace.analysis.notes.Note`): one template per code, filled
with the note's parameters (``str.format``); these may name the CLI's options and environment variables, which
analysis never does."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import pandas as pd

from pcietrace.analysis.notes import Note
from pcietrace.analysis.summary import index_runs

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

#: The sentence of each note code (``str.format`` templates over the note's parameters; literal braces doubled).
SENTENCES: dict[str, str] = {
    # attach (pcietrace.analysis.kinds.attach)
    "no_device_information": "this recording has no device information (made before pcietrace recorded it): every "
                             "range is charged all sampled GPUs",
    "idle_sampling": "idle-aware sampling: counters read every {idle_ms:g} ms while no range was open (median gap "
                     "while one was: {gap_ms:.2f} ms)",
    "quiet_sampling": "while a range was open, the counters were read every {quiet_ms:g} ms, every {fast_ms:g} ms "
                      "while the link moved >= 2 GB/s (copies)",
    "trace_full": "process {pid}: its trace file filled up ({mib:,.0f} MiB) at t = {t_s:,.3f} s; later events were "
                  "lost (ranges still open are closed there, later launches uncounted): set PCIETRACE_TRACE_BYTES "
                  "higher",
    "second_copy": "process {pid}: a second copy of the injection library was loaded ({library}); it only forwarded "
                   "to the first copy, which counted each launch once and wrote this trace",
    "ranges_never_popped": "{ranges} range(s) were never popped (ended, closed=false in range_instances): each is "
                           "closed at its process's last event, so its time, bytes and launches run to there",
    "trace_lines_bad": "the traces held {lines:,} line(s) that were not trace lines: left out; the ranges and "
                       "launches come from the rest",
    "trace_lines_and_files_bad": "the traces held {lines:,} line(s) that were not trace lines and {files} file(s) "
                                 "that were not traces ({first_files}): left out; the ranges and launches come from "
                                 "the rest",
    "counter_reset": "GPU{gpu}: its counters jumped {jumps} time(s) by more than the link could move (a counter "
                     "reset): the bytes across a jump are unknown; ranges over one are 'wrap risk'",
    "sampler_stalled": "GPU{gpu}: the sampler stalled: {gaps} interval(s) between counter reads while the program "
                       "ran could hide a wrap of its counter (the longest: {longest_span_ms:,.1f} ms from the start "
                       "of one read to the end of the next, the longer read {longest_read_ms:,.1f} ms); the whole "
                       "run and the ranges over them are 'wrap risk'",
    "no_floor": "GPU{gpu}: no floor (no idle window covered by its samples); its bytes are shown raw only",
    "floor_windows_elsewhere": "GPU{gpu}: its idle windows found it only in another state than its ranges did "
                               "(counter reads of {windows_us_min:,.0f}-{windows_us_max:,.0f} us there, "
                               "{ranges_us:,.0f} us in its ranges: a GPU without a CUDA context, as when its "
                               "processes end before the others'); each read in its ranges is charged the windows' "
                               "cost ({h2d_per_read:,.0f} B H2D, {d2h_per_read:,.0f} B D2H), which on the lent H200s "
                               "was 9-27 % above a read's in busy ranges: their bytes may read low by that much of "
                               "their reads'",
    "floor_read_time_borrowed": "GPU{gpu}: its idle windows found it only in another state than its ranges did "
                                "(counter reads of {windows_us_min:,.0f}-{windows_us_max:,.0f} us there, "
                                "{ranges_us:,.0f} us in its ranges: a GPU without a CUDA context, as when its "
                                "processes end before the others'), so each read in its ranges is charged what a read "
                                "of that time cost GPU(s) {peers} (the same model): {h2d_per_read:,.0f} B H2D, "
                                "{d2h_per_read:,.0f} B D2H, their spread in its error",
    "floor_without_error": "GPU{gpu}: its floor rests on {windows} idle window(s), too few to estimate its error: "
                           "its ± covers the edges only",
    "ranges_unrecorded": "at least {ranges:,} push ranges opened {depth} or more deep in their thread were not "
                         "recorded (--max-depth {depth}): their launches, time and bytes are in the ranges around "
                         "them",
    "launches_not_counted": "launches were not counted (--no-count-launches): no launch overhead or graph-savings "
                            "figures",
    "launches_per_gpu_unknown": "launches per GPU are unknown (this recording has no device information): the "
                                "whole-run rows leave them out; the program's totals are in the summary",
    "launches_unplaced": "{eager:,} eager and {graph:,} graph launches are in no GPU's whole-run row: they were made "
                         "on a GPU not sampled, or in a process that launched on several GPUs by a thread that "
                         "launched on several between two of its events or had no event after them",
    "launches_untraced": "{untraced:,} of {launches:,} launches ({processes} process(es)) were made by threads with "
                         "no NVTX range (e.g. PyTorch's autograd threads, which launch the backward pass): each "
                         "range counts those made while it was open, unless another thread's own range crossed "
                         "its start or end (then its own thread's alone)",
    "ranges_concurrent": "GPU{gpu}: ranges whose own thread launched kernels or made copies, on {threads} threads "
                         "of {processes} process(es), were open at the same time for {shared_ms:,.1f} ms, up to "
                         "{at_once} at once ({share_pct:.0f} % of the {open_ms:,.1f} ms any was; most: {names}): the "
                         "counters are per GPU, so each such range, and each range holding one, is charged what the "
                         "others moved meanwhile too, and their bytes can add up to more than the GPU moved",
    "cupti_launch_counter": CUPTI_NOTE,
    "gpu_time_traffic": GPU_TIME_NOTE,
    # attach --gpu-time (pcietrace.analysis.gpu_time)
    "kernel_records_untimed": "process {pid}: {records:,} kernel records had no timestamps (CUPTI could not time "
                              "them); GPU busy times leave them out, so its ranges' busy times may be low and their "
                              "graph savings high",
    "kernel_records_dropped": "process {pid}: CUPTI dropped {records:,} kernel records (no buffer room); its ranges' "
                              "GPU busy times may be low and their graph savings high",
    "kernel_records_lost": "process {pid}: {records:,} kernel records for {eager_launches:,} eager launches; the rest "
                           "were lost when it ended without its exit handlers (os._exit, a crash, a kill): busy times "
                           "of its last ranges may be low and their graph savings high",
    # merge (pcietrace.analysis.merge)
    "node_note": "{node}: {note}",
    "wall_clock": "times are wall-clock (each node's monotonic clock plus its recorded offset, read to within "
                  "{uncertainty_us:,.1f} us); nodes line up only as well as their clocks are synchronised (NTP/PTP)",
    "no_clock_offset": "{nodes}: recorded no clock offset (an older pcietrace): its times are its own monotonic "
                       "clock, not lined up with the other nodes'",
}


def sentence(note: Note | str) -> str:
    """``note`` as the report words it (a note read back from a saved report is its sentence already)."""
    if isinstance(note, str):
        return note
    params = {k: sentence(v) if isinstance(v, Note) else v for k, v in note.params.items()}
    return SENTENCES[note.code].format(**params)


def sentences(notes: Iterable[Note | str]) -> list[str]:
    """Every note's :func:`sentence`, those of several GPUs that differ only in their figures merged into one
    (:func:`merge_gpu_notes`)."""
    return merge_gpu_notes([sentence(n) for n in notes])


def with_sentences(results: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """``results`` (result tables by name) with the ``notes`` table's notes as their :func:`sentences`: what every
    renderer and the saved report show."""
    out = dict(results)
    notes = out.get("notes")
    if notes is not None and "note" in notes and any(isinstance(n, Note) for n in notes["note"]):
        out["notes"] = pd.DataFrame({"note": sentences(notes["note"])}, columns=["note"], dtype=str)
    return out


_GPU_NOTE = re.compile(r"^GPU(\d+): (.*)$", re.S)
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def merge_gpu_notes(notes: list[str]) -> list[str]:
    """Notes that differ only in their ``GPUn:`` prefix and their figures, merged into one: ``GPU0-7: ...``
    with each figure that differs given as its range (``41-52 interval(s)``); order kept (a merged note where
    its first one stood). Eight near-identical per-GPU stall notes become one line."""
    groups: dict[str, list[tuple[int, str]]] = {}
    order: list[str] = []
    for note in notes:
        m = _GPU_NOTE.match(note)
        key = _NUMBER.sub("#", m.group(2)) if m else "\0" + note
        if key not in groups:
            order.append(key)
            groups[key] = []
        groups[key].append((int(m.group(1)), m.group(2)) if m else (-1, note))
    out = []
    for key in order:
        items = groups[key]
        if items[0][0] < 0 or len(items) == 1:
            out.extend(note if i < 0 else f"GPU{i}: {note}" for i, note in items)
            continue
        figures = [_NUMBER.findall(body) for _, body in items]
        pieces = iter(_NUMBER.split(items[0][1]))
        text = next(pieces)
        for slot, piece in zip(zip(*figures), pieces):
            values = [float(x.replace(",", "")) for x in slot]
            lo, hi = slot[values.index(min(values))], slot[values.index(max(values))]
            text += (lo if lo == hi else f"{lo}-{hi}") + piece
        out.append(f"GPU{index_runs([i for i, _ in items])}: {text}")
    return out


def _check_templates() -> None:
    """Every template's fields are plain names (a typo shows at import, not in a user's report)."""
    import string

    for code, template in SENTENCES.items():
        for _, name, _, _ in string.Formatter().parse(template):
            if name is not None and not name.isidentifier():
                raise ValueError(f"note {code!r}: field {name!r} is not a parameter name")


_check_templates()
