"""The answer-first lines: a run's from its result tables, printed first and in the JSON; attach's top ranges, what
a graph could capture, repeated notes merged (on the 8x H200 torchrun recording: NCCL's communicator set-up holds
most of its launches)."""

from __future__ import annotations

import json

import pytest

from pcietrace.analysis import analyze, savings
from pcietrace.analysis.summary import summarize
from pcietrace.cli import main
from pcietrace.report.notes import merge_gpu_notes
from pcietrace.session import Session

from conftest import DATA, REPORTS, as_text, notes_text


@pytest.fixture(scope="module")
def torchrun8():
    s = Session.load(DATA / "attach_h200x8_torchrun")
    res = analyze(s)
    return s, res, summarize(s.meta, res)


def test_the_headline_charges_launch_overhead_to_what_a_graph_can_capture(torchrun8) -> None:
    # was: 'ncclCommInitRankConfig 689.6 ms of launch overhead (graphs could save up to 888.9 ms)' led the run
    s, res, summary = torchrun8
    rg = res["ranges"]
    nccl = rg[~savings.capturable(rg)]
    assert "ncclCommInitRankConfig" in set(nccl["name"]) and nccl["eager_launches"].max() > 100_000
    assert not set(summary["ranges"]["name"]) & set(nccl["name"])
    lines = " ".join(summary["lines"])
    top = lines.split("Top ranges by launch overhead")[1].split(".")[0]
    assert "ncclComm" not in top and "eager_3000" in top
    assert "Left out of the above (no graph captures them): NCCL's communicator set-up" in lines
    # the run's saving: the outermost capturable ranges (here nested inside NCCL's set-up range), not NCCL's
    whole = res["whole_run"]["program_graph_savings_ms"].iloc[0]
    eager = rg.set_index("name").loc["eager_3000", "graph_savings_ms"]
    assert eager <= whole < nccl["graph_savings_ms"].max()


def test_near_identical_gpu_notes_become_one_line(torchrun8) -> None:
    # was: eight stall notes, one per GPU, differing only in their figures
    _, res, _ = torchrun8
    stalls = [n for n in notes_text(res) if "the sampler stalled" in n]
    assert len(stalls) == 1 and stalls[0].startswith("GPU0-7: ")


def test_merge_keeps_different_notes_apart_and_gives_ranges() -> None:
    notes = ["GPU0: 3 gaps (1.5 ms)", "other", "GPU1: 5 gaps (1.5 ms)", "GPU3: 4 gaps (2.0 ms)", "GPU2: no floor"]
    assert merge_gpu_notes(notes) == ["GPU0,1,3: 3-5 gaps (1.5-2.0 ms)", "other", "GPU2: no floor"]


def test_the_whole_run_bytes_are_bounded_across_sampling_gaps(torchrun8) -> None:
    # was: every whole-run byte figure 'wrap risk', so the user never learnt the run's bytes
    import json

    s, res, summary = torchrun8
    assert (res["whole_run"]["status"] == "wrap risk").all()
    b = res["whole_run_bounds"].set_index("nvml_index")
    assert sorted(b.index) == sorted(res["whole_run"]["nvml_index"]) and (b["hidden_max_bytes"] >= 2**32).all()
    # the least each GPU moved is at least what the app's own NVML reads saw inside its truth ranges
    truth = json.loads((DATA / "attach_h200x8_torchrun" / "truth.json").read_text())["ranges"]
    for d in ("h2d", "d2h"):
        per_rank = {}
        for r in truth:
            per_rank[r["rank"]] = per_rank.get(r["rank"], 0.0) + r[f"{d}_truth"] * r["calls"]
        assert all(b.loc[rank, f"{d}_seen_bytes"] >= 0.9 * v for rank, v in per_rank.items()), d
    first = summary["lines"][0]
    assert "at least" in first and "GB more" in first and "bytes unknown" not in first


def test_a_name_with_a_few_calls_over_a_wrap_risk_shows_the_rest_as_the_least_it_moved(torchrun8) -> None:
    # was: one call of a name over a sampling stall that could hide a counter wrap (a long run has dozens: NVML reads
    # of 100+ ms) made the name's every total 'wrap risk': a 10-minute job's table said nothing else
    from pcietrace.report import console

    s, res, summary = torchrun8
    rg, inst = res["ranges"], res["range_instances"]
    partly = rg[(rg["unknown_calls"] > 0) & (rg["unknown_calls"] < rg["calls"])]
    assert len(partly) and (partly["status"] == "wrap risk").all() and partly["h2d_bytes"].isna().all()
    for r in rg.itertuples():
        mine = inst[(inst["domain"] == r.domain) & (inst["name"] == r.name)]
        ok = mine[mine["status"] == "ok"]
        assert r.unknown_calls == len(mine) - len(ok)
        for d in ("h2d", "d2h"):
            want = ok[f"{d}_bytes"].sum() if len(ok) else float("nan")
            assert getattr(r, f"{d}_measured_bytes") == pytest.approx(want, rel=1e-12, nan_ok=True)
            if r.status == "ok":
                assert getattr(r, f"{d}_measured_bytes") == pytest.approx(getattr(r, f"{d}_bytes"), rel=1e-12)
    text = as_text(console.parts(s.meta, res, summary, view=console.RangeView(top=None)), 200)
    for r in partly.itertuples():  # (its row in the bytes table: the name first, then its figures)
        assert any(x.strip().startswith(r.name) and f"≥ {r.h2d_measured_bytes / 1e6:,.3f}" in x
                   for x in text.splitlines()), r.name
    assert f"{partly['unknown_calls'].iloc[0]:,} wrap risk" in text and "≥: the other calls' total" in text


def test_run_summary_comes_from_the_tables(loaded) -> None:
    s, res = loaded["h100_run_defaults"]
    summ = summarize(s.meta, res)
    pl = res["per_launch"]
    eager = pl[(pl["mode"] == "eager") & (pl["direction"] == "h2d")].iloc[0]
    row = summ["gpus"].iloc[0]
    assert row["eager_h2d_bytes"] == eager["bytes_per_call"] and row["gpu"] == "GPU0"
    sp = res["speedup"].sort_values("kernel_us")
    line = summ["lines"][0]
    assert line.startswith("One eager launch on GPU0 (H100")
    assert f"{eager['bytes_per_call']:,.0f} ± {eager['ci95']:,.0f} B H2D" in line
    assert f"{sp['speedup'].iloc[0]:.1f}x faster at {sp['kernel_us'].iloc[0]:g} us" in line
    rtt = res["latency"].set_index("test").loc["host_read_rtt", "median_us"]
    assert f"{rtt:.2f} us" in line


def test_attach_summary_names_the_top_ranges(loaded) -> None:
    s, res = loaded["attach_h100_python"]
    summ = summarize(s.meta, res)
    top = res["ranges"].sort_values("launch_overhead_ms", ascending=False).iloc[0]
    assert summ["ranges"].iloc[0]["name"] == top["name"]
    assert f"{top['name']} {top['launch_overhead_ms']:,.1f} ms of launch overhead" in " ".join(summ["lines"])


def test_summary_is_printed_first_and_in_json(capsys) -> None:
    assert main(["report", str(REPORTS[0])]) == 0
    out = capsys.readouterr().out
    assert out.startswith("One eager launch on GPU0")
    assert main(["report", str(REPORTS[0]), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["lines"][0].startswith("One eager launch") and doc["summary"]["gpus"][0]["gpu"] == "GPU0"
    assert main(["report", str(REPORTS[0]), "--json"]) == 0  # the alias
    assert json.loads(capsys.readouterr().out) == doc
