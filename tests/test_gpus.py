"""pcietrace.device.gpus: the GPU record and select(). The user's GPU selection resolves to records (CUDA
ordinals matched to NVML by bus id, or the SIMULATED box), and the saved meta's GPUs keep their layout."""

from __future__ import annotations

import json

import pytest

from pcietrace.device import gpus
from pcietrace.device.gpus import GpuRecord
from pcietrace.errors import ConfigError

from conftest import one_line_exit_2


@pytest.mark.parametrize("spec, want", [("all", [0, 1, 2, 3]), ("2,0", [0, 2]), (3, [3]), ([1, 0], [0, 1]),
                                        ("1", [1])])
def test_ordinals_of_every_spec_the_cli_and_the_api_take(spec, want) -> None:
    assert gpus.ordinals(spec, 4) == want


@pytest.mark.parametrize("spec, said", [("0,0", "0,0: GPU 0 given twice"), ("1,4", "1,4: no CUDA device 4 (4 visible)"),
                                        ("-1", "no CUDA device -1"), ("x", "takes 'all' or CUDA device numbers"),
                                        ([0, 0.5], "takes 'all'"), (True, "takes 'all'"), ("", "takes 'all'")])
def test_a_bad_selection_names_the_gpu_field(spec, said) -> None:
    with pytest.raises(ConfigError) as exc:
        gpus.ordinals(spec, 4)
    assert exc.value.field == "gpu" and said in str(exc.value)


def test_the_form_of_a_selection_is_checked_before_any_device_is_counted() -> None:
    assert gpus.parse("all") is None and gpus.parse("3,1") == [1, 3] and gpus.parse(7) == [7]
    with pytest.raises(ConfigError, match="GPU 1 given twice"):
        gpus.parse([1, 1])


def test_select_matches_cuda_ordinals_to_nvml_by_bus_id(monkeypatch) -> None:
    """Under CUDA_VISIBLE_DEVICES=1,0 CUDA's ordinal 0 is NVML's GPU 1: found by bus id, not by number (stand-in
    driver and NVML)."""
    from pcietrace.collectors import nvml
    from pcietrace.device import cuda

    nvml_order = ["00000000:41:00.0", "00000000:61:00.0"]
    monkeypatch.setattr(cuda, "bus_ids", lambda: list(reversed(nvml_order)))
    monkeypatch.setattr(nvml, "index_for_bus_id", nvml_order.index)
    monkeypatch.setattr(nvml, "gpu_info", lambda i: nvml.GpuInfo(i, f"FAKE{i}", f"GPU-{i}", nvml_order[i], 4, 5, 8,
                                                                   16, i))
    got = gpus.select("all")
    assert [(g.cuda_ordinal, g.nvml_index, g.bus_id) for g in got] == [(0, 1, nvml_order[1]), (1, 0, nvml_order[0])]
    assert got[0].numa_node == 1 and got[0].pcie_gen_max == 5 and not got[0].simulated
    assert gpus.select(1) == [got[1]]
    with pytest.raises(ConfigError, match="no CUDA device 2"):
        gpus.select("2")


def test_select_simulated_gives_the_boxs_gpus() -> None:
    got = gpus.select("1,3", simulate=True, gpus=4)
    assert [g.cuda_ordinal for g in got] == [g.nvml_index for g in got] == [1, 3]
    assert all(g.simulated and "SIMULATED" in g.name for g in got)
    with pytest.raises(ConfigError, match="no CUDA device 4"):
        gpus.select("4", simulate=True, gpus=4)


def test_records_are_frozen_and_with_gives_a_copy() -> None:
    g = GpuRecord(nvml_index=0, cuda_ordinal=0, bus_id="00000000:01:00.0", name="FAKE")
    with pytest.raises(AttributeError):
        g.name = "other"  # type: ignore[misc]
    h = g.with_(compute_capability=(9, 0))
    assert g.compute_capability is None and h.compute_capability == (9, 0)
    assert h.meta()["compute_capability"] == [9, 0] and "compute_capability" not in g.meta()


def test_every_recorded_gpu_makes_the_same_saved_meta(data_dir) -> None:
    """The saved meta's layout does not change: every GPU of every committed recording, made a record and
    saved again, has the same keys in the same order and the same values (the keys a run adds beside the
    record, e.g. a worker's status, aside)."""
    seen = 0
    for report in sorted(data_dir.rglob("report.json")):
        meta = json.loads(report.read_text()).get("meta") or {}
        for saved in meta.get("gpus") or []:
            if not isinstance(saved, dict) or "cuda_ordinal" not in saved:
                continue
            ours = {k: v for k, v in saved.items() if k in GpuRecord.__dataclass_fields__}
            again = GpuRecord.from_meta(saved).with_(simulated=bool(meta.get("simulated"))).meta()
            assert list(again.items()) == list(ours.items()), report
            seen += 1
    assert seen >= 10


def test_a_simulated_run_saves_its_gpus_as_simulated_runs_always_have() -> None:
    import pcietrace

    run = pcietrace.latency(simulate=True, gpus=2, repeats=3)
    assert [list(g) for g in run.meta["gpus"]] == [["nvml_index", "cuda_ordinal", "name", "uuid", "bus_id",
                                                     "pcie_gen_current", "pcie_gen_max", "pcie_width_current",
                                                     "pcie_width_max"]] * 2
    graphs = pcietrace.graphs(simulate=True, kernels=(20,), iterations=2, rounds=1)
    assert list(graphs.meta["gpus"][0]) == ["nvml_index", "cuda_ordinal", "name", "bus_id", "counter"]


def test_simulate_refuses_a_gpu_it_does_not_have(capsys) -> None:
    assert "no CUDA device 5" in one_line_exit_2(["run", "--simulate", "--gpu", "5", "--no-save"], capsys)
