"""--plot at 1, 2 and 8 GPUs on the committed recordings: bounded image sizes, one rate panel per GPU on the
program's span, the NVTX ranges labelled by name, and the Python example that draws one line per GPU; the PNGs each
kind writes, and a plot folder that cannot be made refused before measuring."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcietrace.analysis import analyze
from pcietrace.cli import main
from pcietrace.report import plots
from pcietrace.session import Session

from conftest import DATA, ROOT, one_line_exit_2

pytest.importorskip("matplotlib")
RECORDINGS = [DATA / "h100_run_latency", DATA / "h200x2_run", DATA / "attach_h100_python",
              DATA / "attach_h200x2_threads", DATA / "attach_h200x8_torchrun", DATA / "h200x8_run"]


@pytest.mark.parametrize("rec", RECORDINGS, ids=lambda p: p.name)
def test_plots_stay_bounded_at_one_to_eight_gpus(rec: Path, tmp_path) -> None:
    # was: the 8-GPU latency.png 990 x 4,919 px, ~130 bars in one column
    from PIL import Image

    s = Session.load(rec)
    paths = plots.write(s.meta, analyze(s), tmp_path)
    assert paths
    for p in paths:
        w, h = Image.open(p).size
        assert w <= 1700 and h <= 1700, (p.name, w, h)


def test_the_timeline_has_a_panel_per_gpu_on_the_programs_span() -> None:
    # was: one axis for every GPU, ranges as black blobs no legend entry matched, traffic in the last 1.3 s of 13
    plt = plots._plt()
    s = Session.load(DATA / "attach_h200x8_torchrun")
    res = analyze(s)
    fig = plots.attach_timeline(plt, s.meta, res["rates"], res["range_instances"])
    axes = fig.get_axes()
    gpus = sorted(res["rates"]["nvml_index"].unique())
    assert [a.get_ylabel().split()[0] for a in axes[:len(gpus)]] == [f"GPU{i}" for i in gpus]
    assert all(a.get_yscale() == "log" for a in axes[:len(gpus)])
    names = [t.get_text() for t in axes[-1].get_yticklabels()]
    assert "eager_3000" in names and len(names) == len(set(names))
    inst = res["range_instances"]
    lo, hi = axes[-1].get_xlim()
    first, last = [(t - s.meta["t_app_start_ns"]) / 1e9 for t in (inst["t_start_ns"].min(), inst["t_end_ns"].max())]
    assert lo <= first and last <= hi and (hi - lo) < 1.1 * (last - first)
    plt.close(fig)


def test_the_timeline_draws_an_emit_nvtx_op_on_one_row() -> None:
    # was: a row per op call, labelled "aten::linear, op_id = 8, sizes = " (the 12 calls with the most time of 15,558)
    plt = plots._plt()
    s = Session.load(DATA / "attach_h100_emit_nvtx")
    res = analyze(s)
    fig = plots.attach_timeline(plt, s.meta, res["rates"], res["range_instances"])
    rows = [t.get_text() for t in fig.get_axes()[-1].get_yticklabels()]
    groups = res["range_instances"]["group"].astype(str)
    assert "aten::linear" in rows and "fwd_emit" in rows and len(rows) == len(set(rows)) == plots.MAX_RANGE_ROWS
    assert set(rows) <= {g[:32] for g in groups} and not any("op_id" in r for r in rows)  # (labels cut at 32)
    assert f"{groups.nunique() - len(rows):,} more in the tables" in fig.get_axes()[-1].get_title()
    plt.close(fig)


def test_the_python_example_draws_one_line_per_gpu() -> None:
    # was: the README's sim.speedup.plot(x="kernel_us", y="speedup") drew one zig-zag through both GPUs
    plt = plots._plt()
    sp = analyze(Session.load(DATA / "h200x2_run"))["speedup"]
    example = (ROOT / "docs" / "plots.md").read_text()
    assert 'sim.speedup.pivot(index="kernel_us", columns="nvml_index", values="speedup")' in example
    ax = sp.pivot(index="kernel_us", columns="nvml_index", values="speedup").add_prefix("GPU").plot(logx=True)
    assert [line.get_label() for line in ax.get_lines()] == ["GPU0", "GPU1"]
    assert all(list(line.get_xdata()) == sorted(sp["kernel_us"].unique()) for line in ax.get_lines())
    plt.close(ax.figure)


@pytest.mark.parametrize("report,pngs", [
    ("h100_run_latency", {"bytes_vs_launches.png", "bytes_vs_duration.png", "time_per_kernel.png", "latency.png"}),
    ("attach_h100_python", {"attach_timeline.png"}),
    ("graphs_h100", {"graph_strategies.png"})])
def test_plot_writes_the_pngs(report: str, pngs: set[str], tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    assert main(["report", str(ROOT / "tests/data" / report), "--plot", str(tmp_path), "--format", "json"]) == 0
    written = {p.name for p in tmp_path.iterdir()}
    assert written == pngs
    for name in written:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@pytest.mark.parametrize("argv", [["graphs", "--simulate", "--kernels", "20", "--iterations", "4", "--rounds", "1"],
                                  ["latency"]])
def test_a_plot_folder_that_cannot_be_made_is_refused_before_measuring(argv, tmp_path, capsys) -> None:
    # was (graphs): measured and saved, then 'cannot create plot folder' (exit 2 after the work); latency the same
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = one_line_exit_2(argv + ["--plot", str(blocker), "-o", str(tmp_path / "run")], capsys)
    assert "cannot create plot folder" in line and not (tmp_path / "run").exists()
