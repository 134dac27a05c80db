"""The sysfs walker on fixture trees that mirror real machines (tests/data/topo/README.md), garbage in their files,
and `pcietrace topo` on them and on JSON fixtures."""

from __future__ import annotations

import io
import json
import os

import pytest
from rich.console import Console

from pcietrace.cli import main
from pcietrace.collectors import sysfs
from pcietrace.report.console import topology_tables

from conftest import ROOT, one_line_exit_2
from sysfs_fixture import build


@pytest.fixture()
def tree(tmp_path, data_dir):
    return lambda name: build(data_dir / "topo" / f"{name}.json", tmp_path / name)


def test_lent_vm_gpu_sits_on_the_root_bus(tree) -> None:
    root = tree("lent_h100_vm")
    assert sysfs.nvidia_gpus(root) == ["0000:00:06.0"]
    p = sysfs.placement("0000:00:06.0", root)
    assert p.host_bridge == "pci0000:00" and p.switch_levels == 0 and p.numa_node == -1
    assert [h.role for h in p.hops] == ["endpoint"]
    assert p.hops[0].link_speed == "32.0 GT/s PCIe" and p.hops[0].link_width == 16 and p.local_cpulist == "0-15"


def test_gpus_on_root_ports(tree) -> None:
    root = tree("wrx80_two_gpus_root_ports")
    gpus = sysfs.nvidia_gpus(root)
    assert gpus == ["0000:01:00.0", "0000:02:00.0"]  # the audio functions are not GPUs
    a, b = (sysfs.placement(g, root) for g in gpus)
    assert [h.role for h in a.hops] == ["root port", "endpoint"] and a.switch_levels == 0
    assert sysfs.pcie_relation(a, b) == "PHB"


def test_two_switch_levels_per_gpu_and_the_published_matrix(tree) -> None:
    root = tree("dgx2_half_two_switch_levels")
    gpus = sysfs.nvidia_gpus(root)
    assert len(gpus) == 8
    p = {g: sysfs.placement(g, root) for g in gpus}
    assert all(x.switch_levels == 2 for x in p.values())
    assert [h.role for h in p[gpus[0]].hops] == ["root port", "switch upstream", "switch downstream",
                                                 "switch upstream", "switch downstream", "endpoint"]
    rel = [[sysfs.pcie_relation(p[a], p[b]) for b in gpus] for a in gpus]
    # As published for DGX-2: pairs share a second-level switch (PIX), pairs of pairs a first-level
    # switch (PXB), the two root ports of one socket meet at NODE.
    assert rel[0][:8] == ["X", "PIX", "PXB", "PXB", "NODE", "NODE", "NODE", "NODE"]
    assert rel[5][4] == "PIX" and rel[5][7] == "PXB" and rel[7][0] == "NODE"


def test_roles_fall_back_to_position_without_config_space(tree) -> None:
    root = tree("dgx2_half_two_switch_levels")
    for cfg in root.rglob("config"):
        cfg.write_bytes(cfg.read_bytes()[:64])  # what a non-root user can read
    p = sysfs.placement(sysfs.nvidia_gpus(root)[0], root)
    assert p.switch_levels == 2 and p.hops[0].role == "root port" and p.hops[-1].role == "endpoint"


def test_port_type_parser() -> None:
    from sysfs_fixture import config_space

    assert sysfs.port_type(config_space(5)) == 5
    assert sysfs.port_type(config_space(None)) is None and sysfs.port_type(b"") is None


def test_missing_device(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        sysfs.placement("0000:00:09.0", tmp_path)


def test_topo_command_on_a_fixture(tree, capsys, monkeypatch) -> None:
    import json

    from pcietrace.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    root = tree("dgx2_half_two_switch_levels")
    assert main(["topo", "--sysfs-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "PCIe placement (source: sysfs)" in out and "switch upstream" in out and "PXB" in out
    assert main(["topo", "--sysfs-root", str(root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [g["switch_levels"] for g in doc["gpus"]] == [2] * 8 and doc["matrix"][0][1] == "PIX"


def test_topo_command_without_gpus_is_one_line(tmp_path, capsys) -> None:
    from pcietrace.cli import main

    assert main(["topo", "--sysfs-root", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def _hgx(tree, data_dir, monkeypatch, remote_type=None):
    """The lent 4x H200 (HGX, NVSwitch) VM: its sysfs tree and a fake NVML answering as recorded there."""
    import json

    from fake_nvml import fake_pynvml
    from pcietrace.collectors import nvml, topology

    doc = json.loads((data_dir / "topo" / "hgx_h200_4gpu_nvswitch.json").read_text())["nvml"]
    if remote_type is not None:  # a bare-metal box: NVML names the far end of every link
        for g in doc["gpus"]:
            g["nvlinks"] = [{"remote_bus_id": f"0000:{0x80 + i % 4:02x}:00.0", "remote_type": remote_type}
                            for i in range(len(g["nvlinks"]))]
    monkeypatch.setattr(nvml, "_nvml", fake_pynvml(doc))
    root = tree("hgx_h200_4gpu_nvswitch")
    gpus = [{"nvml_index": g["nvml_index"], "bus_id": g["bus_id"], "name": g["name"]} for g in doc["gpus"]]
    return topology.collect(gpus, str(root)), json.loads((data_dir / "topo" / "hgx_h200_4gpu_nvswitch.json").read_text())


@pytest.mark.parametrize("remote_type", [None, "switch"], ids=["vm-unmatched-remote-ids", "nvswitch-remote-type"])
def test_nvswitch_links_count_toward_every_peer_as_nvidia_smi_shows(tree, data_dir, monkeypatch, remote_type) -> None:
    topo, fixture = _hgx(tree, data_dir, monkeypatch, remote_type)
    assert topo["matrix"] == fixture["nvml"]["nvidia_smi_topo"]  # NV18 between every pair, as recorded
    links = [len(g["nvlinks"]) for g in fixture["nvml"]["gpus"]]
    assert all(topo["nvlinks"][i][j] == links[i] for i in range(4) for j in range(4) if i != j)
    assert len(topo["notes"]) == 4 and ("NVSwitches" in topo["notes"][0]) == (remote_type == "switch")
    # NVLink is not PCIe: every GPU still sits directly on the root bus, no switch levels.
    assert [g["switch_levels"] for g in topo["gpus"]] == [0] * 4
    assert all([h["role"] for h in g["hops"]] == ["endpoint"] for g in topo["gpus"])


def test_nvlinks_to_a_peer_gpu_are_not_fanned_out(tree, data_dir, monkeypatch) -> None:
    import json

    from fake_nvml import fake_pynvml
    from pcietrace.collectors import nvml, topology

    # Two GPUs wired to each other directly (remote ids match the peer): counted once, not per peer.
    doc = json.loads((data_dir / "topo" / "hgx_h200_4gpu_nvswitch.json").read_text())["nvml"]
    for g, peer in zip(doc["gpus"][:2], ("0000:00:07.0", "0000:00:06.0")):
        g["nvlinks"] = [{"remote_bus_id": peer, "remote_type": "gpu"}] * 6
    for g in doc["gpus"][2:]:
        g["nvlinks"] = []
    monkeypatch.setattr(nvml, "_nvml", fake_pynvml(doc))
    gpus = [{"nvml_index": g["nvml_index"], "bus_id": g["bus_id"], "name": g["name"]} for g in doc["gpus"]]
    topo = topology.collect(gpus, str(tree("hgx_h200_4gpu_nvswitch")))
    assert topo["matrix"][0][1] == topo["matrix"][1][0] == "NV6" and topo["notes"] == []
    assert topo["matrix"][0][2] == "PHB" and topo["nvlinks"][2][3] == 0


def _cpus(root, bdf: str, local: str | None, cores: dict[int, tuple[int, int]]) -> None:
    """A made-up sysfs: GPU ``bdf``'s local_cpulist, and each CPU's (package, core)."""
    dev = root / "bus" / "pci" / "devices" / bdf
    dev.mkdir(parents=True)
    if local is not None:
        (dev / "local_cpulist").write_text(local + "\n")
    for cpu, (pkg, core) in cores.items():
        topo = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{pkg}\n")
        (topo / "core_id").write_text(f"{core}\n")


def test_cpulists_parse_and_garbage_is_empty() -> None:
    assert sysfs.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert sysfs.parse_cpulist(None) == sysfs.parse_cpulist("") == sysfs.parse_cpulist("0-x") == set()


def test_timing_cpu_is_one_core_per_slot_near_the_gpu(tmp_path) -> None:
    # made-up box: 2 packages of 4 cores, SMT siblings numbered +8 (cpu0 and cpu8 share a core)
    cores = {c: (c // 4 % 2, c % 4) for c in range(16)}
    _cpus(tmp_path, "0000:1a:00.0", "4-7,12-15", cores)
    allowed = set(range(16))
    picks = [sysfs.timing_cpu("0000:1A:00.0", slot, allowed, tmp_path) for slot in range(4)]
    assert picks == [5, 6, 7, 4]  # package 1's cores, siblings counted once; its first only when all are needed
    assert sysfs.timing_cpu("0000:1a:00.0", 0, {0, 1}, tmp_path) == 1  # near CPUs not allowed: the allowed ones
    assert sysfs.timing_cpu("0000:1a:00.0", 0, {6}, tmp_path) == 6  # already pinned: the same CPU again
    assert sysfs.timing_cpu("0000:1a:00.0", 0, set(), tmp_path) is None
    assert sysfs.timing_cpu("0000:ff:00.0", 0, {2, 3}, tmp_path) == 3  # no local_cpulist: among the allowed


def test_topo_takes_format_json_as_every_command_does(data_dir, capsys) -> None:
    # was: 'unrecognized arguments: --format json'
    import json as _json

    from pcietrace.cli import main as _main

    fixture = str(data_dir / "topo" / "hgx_h200_4gpu_nvswitch.json")
    assert _main(["topo", "--fixture", fixture, "--format", "json"]) == 0
    doc = _json.loads(capsys.readouterr().out)
    assert _main(["topo", "--fixture", fixture, "--json"]) == 0
    assert _json.loads(capsys.readouterr().out) == doc and doc["gpus"]
    assert _main(["topo", "--fixture", fixture, "--format", "table"]) == 0
    assert "PCIe placement" in capsys.readouterr().out
    with pytest.raises(SystemExit) as ex:  # two formats asked for: one line, exit 2
        _main(["topo", "--fixture", fixture, "--json", "--format", "table"])
    assert ex.value.code == 2


def test_topo_renders_json_fixtures(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    fixture = ROOT / "tests/data/topo/dgx2_half_two_switch_levels.json"
    assert main(["topo", "--fixture", str(fixture)]) == 0
    out = capsys.readouterr().out
    assert "GPU7" in out and "PXB" in out and "switch downstream" in out and "…" not in out
    assert main(["topo", "--fixture", str(fixture), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [g["switch_levels"] for g in doc["gpus"]] == [2] * 8
    assert main(["topo", "--fixture", str(ROOT / "README.md")]) == 2


def test_a_fixture_s_recorded_nvlinks_are_in_its_matrix_as_nvidia_smi_showed_them(capsys) -> None:
    """The 4x H200 fixture recorded 18 NVLinks per GPU, all to NVSwitches, and NVLink P2P between every pair:
    its matrix is what `nvidia-smi topo -m` showed there (NV18 everywhere), not the PCIe relation (PHB); a
    fixture that recorded no NVLink keeps its PCIe relations."""
    fixture = ROOT / "tests/data/topo/hgx_h200_4gpu_nvswitch.json"
    assert main(["topo", "--fixture", str(fixture), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["matrix"] == json.loads(fixture.read_text())["nvml"]["nvidia_smi_topo"]
    assert main(["topo", "--fixture", str(ROOT / "tests/data/topo/dgx2_half_two_switch_levels.json"), "--json"]) == 0
    assert not any("NV" in cell for row in json.loads(capsys.readouterr().out)["matrix"] for cell in row)


def test_garbage_sysfs_files_keep_the_gpus_and_print_no_none(tmp_path, data_dir) -> None:
    from pcietrace.collectors import topology

    root = build(data_dir / "topo" / "wrx80_two_gpus_root_ports.json", tmp_path / "t")
    gpus = sorted((root / "bus" / "pci" / "devices").iterdir())
    clean = topology.collect(None, root)
    for dev in gpus:
        for name, junk in (("numa_node", b"\xff\xfe\x80"), ("current_link_width", b"-1\n"),
                           ("max_link_width", b"\x00\x01x16"), ("local_cpulist", b"\xc3\x28"),
                           ("current_link_speed", b"32.0 GT/s PCIe\x07"), ("device", b"0xZZ")):
            if (dev / name).exists():
                (dev.resolve() / name).write_bytes(junk)
    topo = topology.collect(None, root)
    assert [g["bdf"] for g in topo["gpus"]] == [g["bdf"] for g in clean["gpus"]] and len(topo["gpus"]) == 2
    hop = topo["gpus"][0]["hops"][-1]
    assert hop["link_width"] is None and hop["max_link_width"] is None and topo["gpus"][0]["numa_node"] is None
    buf = io.StringIO()
    for t in topology_tables(topo):
        Console(file=buf, width=200).print(t)
    text = buf.getvalue()
    assert "None" not in text and "x-1" not in text and "x?" in text


def test_topo_command_on_a_garbage_tree_is_not_a_traceback(tmp_path, data_dir, capsys) -> None:
    root = build(data_dir / "topo" / "lent_h100_vm.json", tmp_path / "t")
    gpu = (root / "bus" / "pci" / "devices" / "0000:00:06.0").resolve()
    (gpu / "class").write_bytes(os.urandom(64) + b"\xff")
    assert main(["topo", "--sysfs-root", str(root)]) == 0  # an NVIDIA function of unknown class is still listed
    assert "0000:00:06.0" in capsys.readouterr().out


@pytest.mark.parametrize("root", ["tmp", "/sys"])
def test_topo_refuses_a_fixture_beside_a_sysfs_root(root, data_dir, tmp_path, capsys) -> None:
    # (not exit 0 showing the fixture with the --sysfs-root given silently ignored: both at once is an error)
    line = one_line_exit_2(["topo", "--fixture", str(data_dir / "topo" / "lent_h100_vm.json"),
                            "--sysfs-root", str(tmp_path) if root == "tmp" else root], capsys)
    assert "--fixture and --sysfs-root" in line
