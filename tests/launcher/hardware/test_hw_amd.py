import json
from pathlib import Path

import pytest

from launcher.hardware import amd
from launcher.hardware._proc import CommandResult
from launcher.hardware.types import GIB, ProbeLog

NAVI48_VRAM = 17095983104


def _topology(root: Path):
    nodes = amd.read_kfd_topology(root)
    assert nodes is not None
    return nodes


def test_parse_kfd_properties_reads_integers_and_skips_junk(fixtures):
    text = (fixtures / "two_gfx1201/sys/class/kfd/kfd/topology/nodes/1/properties").read_text()
    props = amd.parse_kfd_properties(text + "garbage line here\nname_without_value\nkey notanumber\n")
    assert props["gfx_target_version"] == 120001
    assert props["simd_count"] == 128
    assert props["local_mem_size"] == 0
    assert props["unique_id"] == 11021289331541287936  # 64-bit values survive
    assert "garbage" not in props and "key" not in props


def test_two_gfx1201_from_kfd(fixtures):
    root = fixtures / "two_gfx1201"
    gpus = amd.gpus_from_kfd(_topology(root), amd.amdgpu_driver(root))
    assert [g.index for g in gpus] == [0, 1]
    assert [g.kfd_node for g in gpus] == [1, 2]  # node 0 is the CPU
    g0, g1 = gpus
    assert g0.arch == "gfx1201" and g0.vendor == "amd" and g0.source == "kfd"
    assert g0.memory_total_bytes == NAVI48_VRAM  # from mem_banks/0, local_mem_size is 0
    assert g0.memory_free_bytes == NAVI48_VRAM - 452018176
    assert g0.compute_units == 64
    assert g0.pci_bus_id == "0000:03:00.0" and g1.pci_bus_id == "0000:83:00.0"
    assert g0.uuid == "GPU-98f37c40f5522400"
    assert (g0.render_minor, g1.render_minor) == (128, 129)
    assert g0.driver == "amdgpu"
    assert not g0.integrated
    assert g0.name == "AMD GPU 0x7550"  # consumer boards have no product_name; the node name is "ip discovery"


def test_mi300x_from_kfd(fixtures):
    root = fixtures / "mi300x_gfx942"
    gpus = amd.gpus_from_kfd(_topology(root), amd.amdgpu_driver(root))
    assert len(gpus) == 8
    assert [g.kfd_node for g in gpus] == list(range(2, 10))  # two CPU sockets first
    assert {g.arch for g in gpus} == {"gfx942"}
    assert {g.name for g in gpus} == {"AMD Instinct MI300X"}
    assert {g.compute_units for g in gpus} == {304}
    assert gpus[0].driver == "amdgpu 6.10.5"
    assert gpus[0].memory_total_bytes / GIB == pytest.approx(192, abs=0.1)
    assert gpus[3].memory_free_gib < 30  # another job holds GPU 3


def test_gpu_node_without_gpu_id_file_and_apu_detection():
    cpu = amd.KfdNode(0, {"cpu_cores_count": 16, "simd_count": 0, "gfx_target_version": 0})
    apu = amd.KfdNode(
        1,
        {"cpu_cores_count": 4, "simd_count": 24, "simd_per_cu": 2, "gfx_target_version": 90012},
        mem_banks=[{"heap_type": 0, "size_in_bytes": 8 * GIB}],
    )
    assert not amd.is_gpu_node(cpu) and amd.is_gpu_node(apu)
    (g,) = amd.gpus_from_kfd([cpu, apu])
    assert g.arch == "gfx90c" and g.integrated and g.compute_units == 12
    assert g.memory_total_bytes == 0 and g.pci_bus_id is None


def test_old_kernel_reports_vram_in_local_mem_size():
    node = amd.KfdNode(1, {"simd_count": 240, "gfx_target_version": 90010, "local_mem_size": 64 * GIB}, gpu_id=7)
    (g,) = amd.gpus_from_kfd([node])
    assert g.arch == "gfx90a" and g.memory_total_bytes == 64 * GIB


def test_unreadable_node_is_skipped(copy_scenario):
    # The kernel answers EPERM for a GPU the device cgroup hides; any OSError behaves alike.
    root = copy_scenario("two_gfx1201")
    props = root / "sys/class/kfd/kfd/topology/nodes/2/properties"
    props.unlink()
    props.mkdir()
    gpus = amd.gpus_from_kfd(_topology(root))
    assert [g.kfd_node for g in gpus] == [1]


def test_no_kfd_tree(tmp_path):
    assert amd.read_kfd_topology(tmp_path) is None


def test_parse_rocminfo_matches_kfd(fixtures):
    root = fixtures / "two_gfx1201"
    from_rocminfo = amd.parse_rocminfo((root / "commands/rocminfo.txt").read_text())
    from_kfd = amd.gpus_from_kfd(_topology(root))
    assert len(from_rocminfo) == 2  # the CPU agent is not a GPU
    for r, k in zip(from_rocminfo, from_kfd, strict=True):
        assert (r.arch, r.uuid, r.pci_bus_id, r.kfd_node, r.compute_units) == (
            k.arch,
            k.uuid,
            k.pci_bus_id,
            k.kfd_node,
            k.compute_units,
        )
        assert r.memory_total_bytes == NAVI48_VRAM
    assert from_rocminfo[0].name == "AMD Radeon RX 9070 XT"
    assert from_rocminfo[0].driver == "amdgpu 6.12.12"
    assert from_rocminfo[0].source == "rocminfo"


def test_parse_rocminfo_strips_target_features_and_placeholder_uuid():
    text = """ROCk module is loaded
*******
Agent 1
*******
  Name:                    gfx942
  Uuid:                    GPU-XX
  Marketing Name:          AMD Instinct MI300X
  Device Type:             GPU
  Compute Unit:            304
  Pool Info:
    Pool 1
      Segment:                 GLOBAL; FLAGS: COARSE GRAINED
      Size:                    201310208(0xbffc000) KB
  ISA Info:
    ISA 1
      Name:                    amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-
*** Done ***
"""
    (g,) = amd.parse_rocminfo(text)
    assert g.arch == "gfx942"
    assert g.uuid is None
    assert g.memory_total_bytes == 201310208 * 1024
    assert g.driver == "amdgpu"


def test_parse_amdsmi_records_and_merge_take_kfd_order_and_ids(fixtures):
    root = fixtures / "mi300x_gfx942"
    records = json.loads((root / "amdsmi.json").read_text())["gpus"]
    smi = amd.parse_amdsmi_records(records)
    assert [g.pci_bus_id for g in smi][:2] == ["0000:85:00.0", "0000:a6:00.0"]  # amdsmi's own order
    assert smi[0].source == "amdsmi" and smi[0].driver == "amdgpu 6.10.5"
    kfd = amd.gpus_from_kfd(_topology(root))
    merged = amd.merge_with_kfd(smi, kfd)
    assert [g.index for g in merged] == list(range(8))
    assert [g.pci_bus_id for g in merged] == [g.pci_bus_id for g in kfd]
    assert [g.uuid for g in merged] == [g.uuid for g in kfd]  # the runtime's UUIDs, not amdsmi's
    assert [g.render_minor for g in merged] == list(range(128, 136))
    assert merged[3].memory_free_bytes == kfd[3].memory_free_bytes
    assert {g.source for g in merged} == {"amdsmi"}


@pytest.mark.parametrize("value", ["gfx942", "GFX942", 90402, 0x942, "0x942"])
def test_amdsmi_arch_spellings(value):
    assert amd._arch_from_amdsmi(value) == "gfx942"


def test_amdsmi_arch_unknown():
    assert amd._arch_from_amdsmi(None) == "unknown"
    assert amd._arch_from_amdsmi("N/A") == "unknown"


def test_probe_kfd_tree_skips_library_and_rocminfo(fixtures, replay):
    log = ProbeLog()
    runner = replay(fixtures / "two_gfx1201")
    gpus = amd.probe(fixtures / "two_gfx1201", runner=runner, log=log)
    assert len(gpus) == 2
    assert [(o.name, o.status) for o in log.outcomes] == [
        ("amd.amdsmi", "skipped"),
        ("amd.kfd", "ok"),
        ("amd.rocminfo", "skipped"),
    ]
    assert runner.calls == [] and log.warnings == []


def _driver_without_topology(tmp_path: Path) -> Path:
    (tmp_path / "sys/module/amdgpu").mkdir(parents=True)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kfd").touch()
    return tmp_path


def test_probe_falls_back_to_rocminfo(tmp_path, fixtures, replay):
    root = _driver_without_topology(tmp_path)
    log = ProbeLog()
    gpus = amd.probe(root, runner=replay(fixtures / "two_gfx1201"), log=log)
    assert [g.source for g in gpus] == ["rocminfo", "rocminfo"]
    status = {o.name: o.status for o in log.outcomes}
    assert status == {"amd.amdsmi": "skipped", "amd.kfd": "unavailable", "amd.rocminfo": "ok"}


def test_rocminfo_permission_failure_is_a_warning(tmp_path, replay):
    root = _driver_without_topology(tmp_path)
    denied = CommandResult(
        ("rocminfo",),
        1,
        "ROCk module version 6.12.12 is loaded\nUnable to open /dev/kfd read-write: Permission denied\n"
        'alice is not member of "render" group, the default DRM access group. Users must be a member of '
        'the "render" group or another DRM access group in order for ROCm applications to run successfully.\n',
        "",
    )
    log = ProbeLog()
    assert amd.probe(root, runner=replay(None, {"rocminfo": denied}), log=log) == []
    assert any("Unable to open /dev/kfd" in w for w in log.warnings)


def test_rocminfo_timeout_is_a_warning_not_an_exception(tmp_path, replay):
    root = _driver_without_topology(tmp_path)
    log = ProbeLog()
    hung = CommandResult(("rocminfo",), None, failure="timeout")
    assert amd.probe(root, timeout=0.1, runner=replay(None, {"rocminfo": hung}), log=log) == []
    assert log.outcomes[-1].status == "timeout"
    assert "amd.rocminfo probe timeout: rocminfo: no answer within the timeout" in log.warnings


def test_no_driver_means_every_step_unavailable_and_no_warning(tmp_path, replay):
    log = ProbeLog()
    runner = replay(None)
    assert amd.probe(tmp_path, runner=runner, use_library=True, log=log) == []
    assert {o.status for o in log.outcomes} == {"unavailable"}
    assert runner.calls == [] and log.warnings == []


def test_driver_without_kfd_warns(tmp_path, replay):
    (tmp_path / "sys/module/amdgpu").mkdir(parents=True)
    log = ProbeLog()
    assert amd.probe(tmp_path, runner=replay(None), log=log) == []
    assert any("HSA_AMD" in w for w in log.warnings)


# ---- the amdsmi step, end to end through a child interpreter and a stand-in module


def test_amdsmi_library_probe(fixtures, fake_libs):
    log = ProbeLog()
    gpus = amd.probe(fixtures / "two_gfx1201", timeout=20, use_library=True, log=log)
    status = {o.name: (o.status, o.detail) for o in log.outcomes}
    assert status["amd.amdsmi"][0] == "ok"
    assert "partial" in status["amd.amdsmi"][1]  # driver info is not supported by the stand-in
    assert status["amd.kfd"][0] == "ok" and status["amd.rocminfo"][0] == "skipped"
    assert [g.pci_bus_id for g in gpus] == ["0000:03:00.0", "0000:83:00.0"]  # KFD order, not amdsmi's
    assert [g.uuid for g in gpus] == ["GPU-98f37c40f5522400", "GPU-66246d49248eff91"]
    assert gpus[0].name == "AMD Radeon RX 9070 XT" and gpus[0].source == "amdsmi"
    assert gpus[0].memory_free_bytes == NAVI48_VRAM - 452018176
    assert log.warnings == []


def test_amdsmi_init_failure_falls_back_to_kfd(fixtures, fake_libs, monkeypatch):
    monkeypatch.setenv("FAKE_AMDSMI", "fail")
    log = ProbeLog()
    gpus = amd.probe(fixtures / "two_gfx1201", timeout=20, use_library=True, log=log)
    assert [g.source for g in gpus] == ["kfd", "kfd"]
    assert log.outcomes[0].status == "failed"
    assert any("DRIVER_NOT_LOADED" in w for w in log.warnings)


def test_amdsmi_hang_times_out(fixtures, fake_libs, monkeypatch):
    monkeypatch.setenv("FAKE_AMDSMI", "hang")
    log = ProbeLog()
    gpus = amd.probe(fixtures / "two_gfx1201", timeout=1.0, use_library=True, log=log)
    assert [g.source for g in gpus] == ["kfd", "kfd"]
    assert log.outcomes[0].status == "timeout"
    assert len(log.warnings) == 1


def test_device_nodes(fixtures):
    root = fixtures / "two_gfx1201"
    gpus = amd.gpus_from_kfd(_topology(root))
    nodes = amd.device_nodes(root, gpus, access=lambda p, mode: not p.name.endswith("129"))
    assert [n.path for n in nodes] == ["/dev/kfd", "/dev/dri/renderD128", "/dev/dri/renderD129"]
    assert [n.usable for n in nodes] == [True, True, False]


def test_amdsmi_gpu_hidden_from_kfd_is_dropped_with_a_warning(copy_scenario, fake_libs):
    # The kernel answers EPERM on the properties of a GPU the container was not given.
    root = copy_scenario("two_gfx1201")
    props = root / "sys/class/kfd/kfd/topology/nodes/1/properties"
    props.unlink()
    props.mkdir()
    log = ProbeLog()
    gpus = amd.probe(root, timeout=20, use_library=True, log=log)
    assert [(g.index, g.pci_bus_id, g.source) for g in gpus] == [(0, "0000:83:00.0", "amdsmi")]
    assert any("amdsmi lists 2 AMD GPU(s) but the KFD topology shows 1" in w for w in log.warnings)
