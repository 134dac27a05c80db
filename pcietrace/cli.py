"""Command line: the parser and ``main``. Each command lives in :mod:`pcietrace.commands`. Expected
failures print one line and exit 2."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Callable, NoReturn, Sequence

from pcietrace import __version__, memory, signals
from pcietrace.config import MAX_US, MIN_US
from pcietrace.errors import ConfigError, PcietraceError, one_line
from pcietrace.text import clean


def _numbers(text: str) -> tuple[float, ...] | None:
    """A comma-separated list of numbers, or None where an item is not one."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        return None


def _float_list(text: str) -> tuple[float, ...]:
    vals = _numbers(text)
    if vals is None:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    if not vals or any(not math.isfinite(v) or v < 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected non-negative numbers, got {text!r}")
    return vals


def _us_list(text: str) -> tuple[float, ...]:
    vals = _float_list(text)
    if any(v != 0 and not MIN_US <= v <= MAX_US for v in vals):
        raise argparse.ArgumentTypeError(f"expected durations of 0 or {MIN_US:g}..{MAX_US:g} us, got {text!r}")
    return vals


def _int_list(text: str) -> tuple[int, ...]:
    vals = _numbers(text)  # (not _float_list: a negative count is not "a negative number", it is not a count)
    if not vals or any(not math.isfinite(v) or v != int(v) or v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return tuple(int(v) for v in vals)


def _repeats(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 3:
        raise argparse.ArgumentTypeError("at least 3 repeats are needed for a median with a spread")
    if v > 100_000:
        raise argparse.ArgumentTypeError(f"at most 100000 repeats, got {v}")
    return v


def _gpu_count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise argparse.ArgumentTypeError(f"expected 1..64 GPUs, got {text!r}")
    return int(text)


def _int_count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 4096:
        raise argparse.ArgumentTypeError(f"expected 1..4096, got {text!r}")
    return int(text)


def _contexts(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 16:
        raise argparse.ArgumentTypeError(f"expected 1..16 contexts, got {text!r}")
    return int(text)


def _number(low: float, high: float, low_open: bool = True) -> Callable[[str], float]:
    """A finite number in (low, high] (``low_open``) or [low, high]; nan, inf and out-of-range are errors."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (math.isfinite(v) and (v > low if low_open else v >= low) and v <= high):
            raise argparse.ArgumentTypeError(f"expected a number {'>' if low_open else '>='} {low:g} and "
                                             f"<= {high:g}, got {text!r}")
        return v
    return parse


_positive = _number(0, 1e6)


def _seed(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= v < 2**63:
        raise argparse.ArgumentTypeError(f"expected a seed >= 0, got {text!r}")
    return v


def _us_per_level(p: argparse.ArgumentParser) -> None:
    # the literal is analysis.latency.DEFAULT_US_PER_LEVEL (not imported: the parser loads no pandas)
    p.add_argument("--us-per-level", type=_positive, default=0.3,
                   help="round trip added per PCIe switch level (us), for the topology model")


def _save_options(p: argparse.ArgumentParser, suffix: str = "", no_save: bool = True, more: str = "") -> None:
    """-o, --force (and --no-save) the same on every command that saves a run (see pcietrace/store.py); ``more``:
    what else -o takes on this command."""
    where = p.add_mutually_exclusive_group() if no_save else p  # (-o with --no-save: refused, not ignored)
    where.add_argument("-o", "--output", type=Path, default=None,
                       help="folder to save in: new, empty, or a saved run with --force (default "
                            f"runs/<time>-<gpu>-gpu<N>{suffix}, with -2, -3... if taken){more}")
    if no_save:
        where.add_argument("--no-save", action="store_true", help="do not save")
    p.add_argument("--force", action="store_true", help="replace a run already saved in the -o folder")


#: What one counter read costs (both sampling options say so); the floor table shows this machine's figure.
READ_COST = ("Each NVML read is itself PCIe traffic (a firmware call, tens of kB; the floor table shows this "
             "machine's cost per read)")


def _output_options(p: argparse.ArgumentParser, json_help: str = "the same as --format json",
                    metrics: bool = True) -> None:
    """--format (``--json`` stays as its alias), --detail and --plot, the same on every command that renders;
    ``metrics``: whether its figures have an OpenMetrics form (--format prometheus)."""
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument("--format", choices=["table", "json", "csv", "md"] + ["prometheus"] * metrics, default=None,
                   help="output format: rich tables (the default), JSON, CSV or Markdown tables"
                        + (", or OpenMetrics text for node_exporter's textfile collector" if metrics else ""))
    p.add_argument("--detail", action="store_true", help="on the console, every per-GPU table even with many GPUs")
    p.add_argument("--plot", type=Path, default=None, metavar="DIR", help="also write PNG plots to DIR")


def _top(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def _regex(text: str) -> str:
    import re

    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression ({exc}): {text!r}") from None
    return text


def _range_view_options(p: argparse.ArgumentParser) -> None:
    """How attach's ranges are grouped (every output) and which the console shows (the other formats hold all);
    the choices are pcietrace.analysis.names' (not imported: the parser loads no pandas)."""
    p.add_argument("--group-by", choices=["op", "numbered", "name"], default="op",
                   help="group range names: op = PyTorch's emit_nvtx names by op ('aten::linear, seq = 3, op_id = 9, "
                        "sizes = [...]' -> 'aten::linear'; 'autograd::engine::evaluate_function: MmBackward0' -> "
                        "'evaluate_function: MmBackward0'), other names as they are; numbered = also fold a trailing "
                        "number ('layer0'...'layer31' -> 'layer#'); name = every distinct name. Each call keeps its "
                        "full name in range_instances")
    p.add_argument("--top", type=_top, default=None, metavar="N",
                   help="on the console, the first N ranges by --sort, nested ranges under their parents (default: "
                        "up to 15, as many as keep the report within 120 lines)")
    p.add_argument("--all", action="store_true", help="on the console, every range (overrides --top)")
    p.add_argument("--sort", choices=["incl_ms", "excl_ms", "h2d", "d2h", "launches", "calls", "name"],
                   default="incl_ms", help="which ranges come first on the console")
    p.add_argument("--filter", type=_regex, default=None, metavar="REGEX",
                   help="on the console, only ranges whose (grouped) name matches REGEX (searched, case-sensitive)")


#: The commands that save a run (the ones given _save_options).
SAVING = ("run", "latency", "attach", "graphs")


#: Help is wrapped to the terminal, but never wider than this (long lines read badly on a wide terminal).
HELP_WIDTH = 100


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except None/False ones (whose help text says what happens instead). Descriptions and
    epilogs are wrapped to the terminal (at most :data:`HELP_WIDTH` columns), each paragraph on its own; lines
    that begin with spaces (examples) are kept as written."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        width = min(width or shutil.get_terminal_size().columns - 2, HELP_WIDTH)
        super().__init__(prog, indent_increment, max_help_position, width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(line if line.startswith(" ") or not line else
                         textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent,
                                       break_long_words=False, break_on_hyphens=False)
                         for line in text.splitlines())

    def _split_lines(self, text: str, width: int) -> list[str]:
        # an option's help wraps at spaces only: "--idle-sample-interval-ms" stays whole
        return textwrap.wrap(" ".join(text.split()), width, break_long_words=False, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False:
            return action.help or ""
        return super()._get_help_string(action) or ""


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr and exit code 2 (argparse would print the usage block too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """The whole command line, then what no single option can check: --json beside a different --format.
        (Subcommands are parsed by ``parse_known_args``, so this runs once, on the top parser.)"""
        ns = super().parse_args(args, namespace)
        if not hasattr(ns, "format"):  # no command given
            return ns
        if ns.json and ns.format not in (None, "json"):  # said as the subcommand's parser says its errors
            prog = f"{self.prog} {ns.command}"
            self.exit(2, f"{prog}: error: --json and --format {ns.format} ask for different output formats: "
                         f"give one of them (see {prog} --help)\n")
        if ns.format is None:  # the default is None so that a --format given is told from none given
            ns.format = "table"
        return ns


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="pcietrace", formatter_class=_Formatter,
        description="What one kernel launch costs on this machine (PCIe bytes, CPU time, GPU time) "
                    "and what CUDA graphs save, measured with NVML's PCIe byte counters.",
        epilog="examples:\n  pcietrace run                 measure this machine's GPUs (about 30 s)\n"
               "  pcietrace run --simulate      the same pipeline on a SIMULATED device (no GPU)\n"
               "  pcietrace report runs/RUN     re-analyse and re-render a saved run")
    p.add_argument("--version", action="version", version=f"pcietrace {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    r = sub.add_parser("run", formatter_class=_Formatter, help="measure per-launch PCIe bytes and launch cost",
                       description="Launch calibrated spin kernels eager and as CUDA graphs at several rates while "
                                   "sampling the PCIe counters; print the analysis and save the run.")
    r.add_argument("--gpu", default="all", help="CUDA device numbers to measure, e.g. 0,1, or 'all'")
    r.add_argument("--simulate", action="store_true", help="use a SIMULATED device modelled on a recorded H100 run")
    r.add_argument("--gpus", type=_gpu_count, default=1, metavar="N", help="with --simulate: simulate a box of N GPUs")
    r.add_argument("--quick", action="store_true",
                   help="shorter windows and fewer durations/graph sizes: 0.1 s windows, kernels of 0,5,50 us, graphs "
                        "of 1 and 100 kernels, one end-to-end repeat")
    r.add_argument("--window-s", type=_number(0.001, 3600, low_open=False), default=None,
                   help="length of each counter window in seconds, 0.001..3600 (default 0.4, quick 0.1)")
    r.add_argument("--durations", type=_us_list, default=None, metavar="US,US,..",
                   help="kernel durations in us (default 0,2,5,10,20,50)")
    r.add_argument("--graph-k", type=_int_list, default=None, metavar="K,K,..",
                   help="kernels per graph for the graph fits (default 1,10,100,1000)")
    r.add_argument("--contexts", type=_contexts, default=None, metavar="N",
                   help="CUDA contexts the GPU time per empty eager kernel is measured in, 1..16 (default 5; 1: the "
                        "run's own). Each context can draw its own level: the figure is their median, with their range")
    r.add_argument("--sample-interval-ms", type=_number(0, 60_000, low_open=False), default=10.0,
                   help="background counter sampling interval (0 = as fast as NVML answers). "
                        f"{READ_COST}, so fast sampling adds a large floor; window edges are always read exactly")
    r.add_argument("--throughput-api", action="store_true",
                   help="force NVML's low-resolution throughput API instead of the byte counters")
    _save_options(r)
    _output_options(r)
    r.add_argument("--seed", type=_seed, default=0, help="random seed of the simulated device")
    r.add_argument("--no-latency", action="store_true", help="skip the latency suite (a third of the run's time)")
    r.add_argument("--repeats", type=_repeats, default=11, help="repeats of each latency test (host-timed ones do 20x)")
    _us_per_level(r)
    r.set_defaults(func="cmd_run")

    rp = sub.add_parser("report", formatter_class=_Formatter, help="re-analyse and re-render a saved run (no GPU needed)",
                        description="Load a report saved by run, latency, graphs or attach (report.json and the Parquet "
                                    "tables beside it), analyse it again and render it in any format; no GPU needed. "
                                    "--format json prints schema, meta, summary and results (analysed now); the "
                                    "folder's report.json is the recording itself (meta, the recorded tables, and "
                                    "results as analysed when it was recorded, never updated; no summary). "
                                    "A damaged report, or one from an older or newer pcietrace, is refused in one "
                                    "line naming the file and the field.")
    rp.add_argument("path", type=Path, help="a run folder or its report.json")
    _output_options(rp)
    _us_per_level(rp)
    _range_view_options(rp)
    rp.add_argument("--perfetto", type=Path, default=None, metavar="FILE",
                    help="also write the attach run's Chrome/Perfetto trace (PCIe counter tracks + NVTX ranges) to FILE")
    rp.add_argument("--instances", type=Path, default=None, metavar="FILE",
                    help="write the range_instances table (one row per range call) to FILE as Parquet and leave its "
                         "rows out of the output: --format json then names the file and its row count "
                         "(docs/json-outputs.md)")
    rp.set_defaults(func="cmd_report")

    tp = sub.add_parser("topo", formatter_class=_Formatter, help="where each GPU sits on PCIe, and the GPU<->GPU matrix",
                        description="Each GPU's bus id, NUMA node, CPU affinity and PCIe path from the root port down "
                                    "(link speed/width per hop, switch levels), and a GPU<->GPU matrix like "
                                    "`nvidia-smi topo -m`. Works without a driver from sysfs alone.")
    tp.add_argument("--sysfs-root", default=None, metavar="DIR",
                    help="read this sysfs tree instead of /sys (e.g. a test fixture); a tree other than /sys implies no NVML")
    tp.add_argument("--fixture", type=Path, default=None, metavar="JSON",
                    help="show the machine a topology fixture describes, e.g. tests/data/topo/dgx2_half_two_switch_levels.json")
    tp.add_argument("--json", action="store_true", help="the same as --format json")
    tp.add_argument("--format", choices=["table", "json"], default=None,
                    help="output format: rich tables (the default) or the machine-readable result")
    tp.set_defaults(func="cmd_topo")

    lt = sub.add_parser("latency", formatter_class=_Formatter, help="PCIe round trips and launch/completion latencies",
                        description="Per GPU: host-memory read round trip (pointer chase), the same chase in device "
                                    "memory, peer reads for every GPU pair with peer access, 4 B copies, launch+sync "
                                    "(eager and graph of 1), launch -> first instruction and kernel end -> host "
                                    "notices; median with spread over repeats. Saved like a run, for `compare`.")
    lt.add_argument("--gpu", default="all", help="CUDA device numbers, e.g. 0,1, or 'all'")
    lt.add_argument("--simulate", action="store_true", help="use a SIMULATED device modelled on a recorded H100 run")
    lt.add_argument("--gpus", type=_gpu_count, default=1, metavar="N", help="with --simulate: simulate a box of N GPUs")
    lt.add_argument("--seed", type=_seed, default=0, help="random seed of the simulated device")
    lt.add_argument("--repeats", type=_repeats, default=11, help="repeats of each test (host-timed ones do 20x)")
    _save_options(lt, "-latency")
    _output_options(lt)
    lt.set_defaults(func="cmd_latency")

    at = sub.add_parser("attach", formatter_class=_Formatter, help="PCIe bytes and launches per NVTX range of a program",
                        description="Run an unmodified program (Python with nvtx or torch.cuda.nvtx, or C/C++ with NVTX3) "
                                    "while sampling the PCIe counters; NVTX ranges and kernel launches are captured through "
                                    "NVTX's and CUDA's injection hooks. The program's exit code is passed through. "
                                    "Per NVTX range (by domain and name; ranges with no domain, e.g. torch.cuda.nvtx's "
                                    "or nvtxRangePushA's, are in domain 'default') every figure is a total over its "
                                    "calls; JSON's range_instances has each call. docs/json.md names "
                                    "every key.",
                        epilog="example:\n  pcietrace attach -- python train.py --steps 10")
    at.add_argument("--gpu", default="all", help="CUDA device numbers whose counters to sample, e.g. 0,1, or 'all'")
    at.add_argument("--sample-interval-ms", type=_number(0, 60_000, low_open=False), default=0.5, metavar="MS",
                    help="counter sampling interval while an NVTX range is open and the GPU's counters moved > 2 GB/s "
                         "over the last interval (a copy; 0 = as fast as NVML answers; see --quiet-sample-interval-ms "
                         "and --idle-sample-interval-ms for the rest). A GPU is read at most once per interval however "
                         "many ranges open and close meanwhile, so nested or per-op ranges add no reads. A range's "
                         "edges fall between two samples, which bound how far its bytes can be off (its ± error). "
                         f"{READ_COST}")
    # 20 ms: collectors.sampler.MAX_IDLE_INTERVAL_NS (not imported: the parser loads no numpy)
    at.add_argument("--quiet-sample-interval-ms", type=_number(0, 20, low_open=False), default=2.0, metavar="MS",
                    help="while an NVTX range is open but the GPU's counters moved < 2 GB/s over the last interval "
                         "(kernel launches, small copies), read them only this often (0 = off: always "
                         "--sample-interval-ms); a copy brings back --sample-interval-ms until 5 ms after it, and a "
                         "range opening in a process with none open is read at once. Each read moves tens of kB "
                         "itself: at 0.5 ms the reads outweigh a launch stream's own bytes, and a range's figure "
                         "rests on their cost (docs/method.md)")
    at.add_argument("--idle-sample-interval-ms", type=_number(0, 20, low_open=False), default=5.0, metavar="MS",
                    help="while no NVTX range is open in any traced process, read the counters only this often "
                         "(0 = off: never slower than while one is). A range opening wakes the samplers at once, "
                         "and a GPU whose counters moved > 2 GB/s over its last interval (a copy) is read fast. "
                         "Reads are firmware calls that queue with the program's own driver work (NCCL's "
                         "communicator set-up slows at fast rates)")
    at.add_argument("--slow-domains", default="NCCL", metavar="D1,D2",
                    help="NVTX domains whose open ranges do not hold the fast rate (their bytes are still measured, "
                         "with the wider edge error stated); default NCCL, whose own ranges cover its communicator "
                         "set-up; '' = none")
    at.add_argument("--idle-s", type=_number(0, 3600), default=0.5, metavar="S",
                    help="seconds of idle time sampled before and again after the program, for the floor")
    at.add_argument("--baseline", type=Path, default=None,
                    help="take per-launch costs from this saved `pcietrace run` instead of measuring them on the spot")
    at.add_argument("--no-calibrate", action="store_true", help="skip the per-launch cost measurement (no overhead columns)")
    at.add_argument("--launch-counter", choices=["interpose", "cupti"], default="interpose",
                    help="how launches are counted: trampolines handed out by an LD_PRELOAD-ed dlsym/cuGetProcAddress "
                         "(a fraction of a microsecond per launch: one cuCtxGetDevice to charge ranges the GPUs they "
                         "launched on, the call's timing and, once the program has begun a graph capture, a capture "
                         "check; code linked against libcuda is counted too), or CUPTI driver callbacks (about ten "
                         "times the cost per launch, and a few %% more H2D bytes per launch, which the figures then "
                         "include; sees launches however they reach the driver)")
    at.add_argument("--no-count-launches", action="store_true",
                    help="do not count kernel launches at all (lowest overhead)")
    at.add_argument("--sampler-duty", type=_number(0, 1), default=1.0, metavar="FRACTION",
                    help="the largest share of time a GPU's sampler may spend in NVML reads (0 < f <= 1; 1 = no cap). "
                         "Reads are firmware calls that queue with the program's own driver work (fast sampling can "
                         "slow NCCL's barriers); a cap slows that less but makes range edges coarser. Use "
                         "--sample-interval-ms 10 or a cap where the program's runtime matters more than short ranges")
    at.add_argument("--exact-edges", action="store_true",
                    help="the injection library also reads the counters itself at every range edge (costs the program "
                         "an NVML read, under a millisecond, per edge, and threads at an edge at once take turns; for "
                         "short critical ranges). Without it, a range that opens wakes the samplers, "
                         "which read right after it without the program waiting")
    at.add_argument("--max-depth", type=_int_count, default=None, metavar="N",
                    help="record push/pop ranges only to N levels deep in each thread (1: the outermost only); deeper "
                         "ones cost the program a few ns an edge instead of an event each and are left out of every "
                         "table, their launches and bytes kept in the ranges around them. For emit_nvtx or per-layer "
                         "programs whose run time matters more than per-op figures (default: every range)")
    at.add_argument("--gpu-time", action="store_true",
                    help="also record when each kernel ran on the GPU (CUPTI kernel activity): per range the GPU's busy "
                         "time, and a graph-savings prediction from it (the host time a graph would remove). Costs the "
                         "program a few us per launch, which the range times and the prediction include, and the "
                         "records add D2H (and some H2D) bytes per launch, which the byte figures include")
    at.add_argument("--label", default=None, metavar="NAME",
                    help="a name for this recording among a job's (e.g. node0, or one per GPU set where two share a "
                         "host): kept in its meta for `pcietrace merge`, and %%l in -o")
    _save_options(at, "-attach", no_save=False,
                  more="; for one folder per node of a job: %%h (host name), %%q{VAR} (an environment variable, "
                       "e.g. %%q{SLURM_NODEID} or %%q{NODE_RANK}), %%l (--label), %%p (process id), %%%% (a %%)")
    _output_options(at, json_help="the same as --format json. With any --format but table the program's own stdout "
                                  "is sent to stderr, so stdout carries the report alone: the document `pcietrace "
                                  "report DIR --format json` prints, not the folder's report.json (the recording: "
                                  "meta, recorded tables, results as analysed then, no summary)")
    _range_view_options(at)
    at.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]", help="the program to run")
    at.set_defaults(func="cmd_attach")

    cp = sub.add_parser("compare", formatter_class=_Formatter, help="saved runs side by side, with significant deltas marked",
                        description="Headline figures of saved runs side by side; deltas against the first run are "
                                    "marked significant only beyond the 95 % intervals and, for figures that move with the "
                                    "host's speed, beyond how far two runs of one machine differ; the host round-trip "
                                    "delta is set against what the switch-level difference predicts.")
    cp.add_argument("paths", type=Path, nargs="+", help="run folders or report.json files (the first is the baseline)")
    _us_per_level(cp)
    cp.add_argument("--json", action="store_true", help="the same as --format json")
    cp.add_argument("--format", choices=["table", "json", "csv", "md"], default=None, help="output format (default table)")
    cp.set_defaults(func="cmd_compare")

    mg = sub.add_parser("merge", formatter_class=_Formatter, help="one report from the attach recordings of a job's nodes",
                        description="Merge the attach recordings of a multi-node job (one `pcietrace attach` per node, "
                                    "e.g. -o runs/job-%h) into one report: each node's recording is analysed in a "
                                    "worker of its own (local processes, or a Dask cluster's workers with "
                                    "--scheduler), never all nodes' samples in one process. Ranges, range instances "
                                    "and whole-run rows name their node and host; the ranges table sums each range "
                                    "over the nodes, ranges_by_host has each node's. Times are put on the wall clock "
                                    "through the offset each node recorded. `report`, `compare` and "
                                    "pcietrace.load read the result like any report. docs/multinode.md: the layout.",
                        epilog="example:\n  pcietrace merge runs/job-node* -o runs/job")
    mg.add_argument("paths", type=Path, nargs="+", metavar="DIR", help="attach recordings, one per node")
    mg.add_argument("-o", "--output", type=Path, required=True, help="folder to save the merged report in: new, "
                    "empty, or a saved report with --force")
    mg.add_argument("--force", action="store_true", help="replace a report already saved in the -o folder")
    mg.add_argument("--workers", type=_int_count, default=None, metavar="N",
                    help="local worker processes (default: one per recording, at most one per CPU core)")
    mg.add_argument("--scheduler", default=None, metavar="ADDRESS",
                    help="analyse on this Dask distributed cluster (e.g. tcp://head:8786; default: the "
                         "DASK_SCHEDULER_ADDRESS environment variable, else local processes); its workers must see "
                         "the recordings and -o at the same paths. Needs pip install 'pcietrace[dask]'")
    _output_options(mg)
    mg.set_defaults(func="cmd_merge")

    gr = sub.add_parser("graphs", formatter_class=_Formatter, help="what each way of using CUDA graphs costs when parameters change",
                        description="Iterations of N short spin kernels (durations drawn from --kernel-us) whose parameters "
                                    "change between iterations among P parameter sets, run by each strategy: eager launches, "
                                    "recapture (capture + instantiate every time), exec_update (capture + cuGraphExecUpdate), "
                                    "node_update (cuGraphExecKernelNodeSetParams on changed nodes) and recognize (one executable "
                                    "graph cached per parameter set). Iterations are timed in native C, pipelined by default "
                                    "(see --sync-each-iteration); PCIe bytes come from counter windows. Saved like a "
                                    "run, for `report` and `compare`.")
    gr.add_argument("--gpu", type=int, default=0, help="CUDA device number")
    gr.add_argument("--simulate", action="store_true", help="use a SIMULATED device (a cost model from published figures)")
    gr.add_argument("--kernels", type=_int_list, default="500,2500", metavar="N,N,..",
                    help="kernels per iteration (workload sizes)")
    gr.add_argument("--param-sets", type=int, default=5, metavar="P", help="distinct parameter sets the iterations draw from")
    gr.add_argument("--order", choices=["cycle", "random", "all-new"], default="cycle",
                    help="which parameter set each iteration uses (all-new: a fresh one every iteration)")
    gr.add_argument("--strategies", default="eager,recapture,exec_update,node_update,recognize", metavar="S,S,..",
                    help="strategies to run (eager is always needed)")
    gr.add_argument("--kernel-us", type=_us_list, default="2,8", metavar="MIN,MAX",
                    help="range of kernel durations (us)")
    gr.add_argument("--iterations", type=int, default=40, metavar="N", help="iterations per window (at least 2)")
    gr.add_argument("--rounds", type=int, default=3, metavar="N",
                    help="windows per strategy and size (strategies interleaved)")
    pace = gr.add_mutually_exclusive_group()
    pace.add_argument("--pipelined", dest="sync_each_iteration", action="store_false",
                      help="the default: no synchronize per iteration; the host captures, updates and launches the "
                           "next iteration while the GPU runs the previous one, as a training loop does. Times are "
                           "per window (an iteration's own time is then not defined)")
    pace.add_argument("--sync-each-iteration", dest="sync_each_iteration", action="store_true",
                      help="synchronize after every iteration: each iteration timed on its own, but capture and "
                           "update can no longer hide behind the GPU's work (update-type strategies then gain less)")
    gr.set_defaults(sync_each_iteration=False)
    gr.add_argument("--sample-interval-ms", type=_number(0, 60_000, low_open=False), default=10.0,
                    help="background counter sampling interval (0 = as fast as NVML answers); window edges are "
                         "always read exactly")
    _save_options(gr, "-graphs")
    _output_options(gr, metrics=False)  # (per strategy and graph size: no metric a monitor would scrape)
    gr.add_argument("--seed", type=_seed, default=0, help="seed of the parameter sets (and of the simulated device)")
    gr.set_defaults(func="cmd_graphs")
    return p


#: The flag a config field is set by, where it is not the field's name as a flag (``window_s`` -> ``--window-s``).
FLAGS = {"durations_us": "--durations", "graph_ks": "--graph-k", "latency": "--no-latency", "save": "--no-save",
         "calibrate": "--no-calibrate", "command": "-- CMD", "output": "-o"}


def flag(field: str) -> str:
    """The command-line flag of a config field (:mod:`pcietrace.config`)."""
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def _standard_streams() -> None:
    """A standard stream pcietrace was started without (``2>&-``; or, through a launcher script, holding a file
    that is only read) opened on the null device: else the next file opened takes its number, and what pcietrace,
    its samplers or the program write there lands in that file (with stderr closed, attach ended at its spinner:
    nothing run, nothing saved)."""
    import fcntl

    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        except OSError:
            mode = None
        if mode is not None and (fd == 0 or mode != os.O_RDONLY):
            continue
        null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))


def main(argv: list[str] | None = None) -> int:
    _standard_streams()
    # the command's name, known before parsing (an interrupt may come during it); no top-level option takes a value
    command = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    if command != "attach":  # (attach's end is held to a memory bound: memory kept freed raised its peak ~4 %)
        memory.keep_freed()
    try:
        with signals.caught():  # SIGTERM/SIGHUP during the imports and set-up: one line, not a silent end
            return _main(argv, command)
    except KeyboardInterrupt as exc:  # one that came between the handler's start and _main's own (a traceback was)
        return _interrupted(exc, command)


def _interrupted(exc: KeyboardInterrupt, command: str | None) -> int:
    print(f"pcietrace: {signals.interrupted_line(command in SAVING)}", file=sys.stderr)
    return 128 + int(getattr(exc, "signum", 2))


def _main(argv: list[str] | None, command: str | None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        from pcietrace import commands  # imported here: `pcietrace --help` stays light

        rc = int(getattr(commands, args.func)(args))
        if sys.stdout is not None:  # (None: started with standard output closed)
            sys.stdout.flush()  # (stdout on a full disk fails here, not silently in the interpreter's flush at exit)
        return rc
    except ConfigError as exc:  # said by the flag the value came from
        print(f"pcietrace: error: {clean(exc.say(flag))}", file=sys.stderr)
        return 2
    except PcietraceError as exc:
        print(f"pcietrace: error: {clean(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # also during the imports above; SIGTERM/SIGHUP carry their signal
        return _interrupted(exc, command)
    except BrokenPipeError:
        return 1
    except MemoryError:  # (outside the analysis, which says what was saved: a format, a plot)
        print("pcietrace: error: out of memory", file=sys.stderr)
        return 2
    except OSError as exc:  # stdout on a full disk or a gone terminal (files we open raise PcietraceErrors)
        _drop_stdout()
        print(f"pcietrace: error: {clean(one_line(exc))}", file=sys.stderr)
        return 2


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit does not fail a second time."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout without a descriptor (captured, closed)
        pass
