import json
import os

import pytest

import launcher.hardware as hw
from launcher.hardware import GpuInfo, HardwareReport, check, evaluate, probe_all
from launcher.hardware.types import GIB


def _denying(paths):
    """os.access stand-in: the tests run as root, who can open anything."""
    return lambda p, mode: not any(str(p).endswith(d) for d in paths)


# ---- the live machine


def test_live_probe_never_raises_and_serializes():
    report = probe_all(timeout=5.0)
    json.dumps(report.to_dict())
    assert report.platform in ("rocm", "cuda", "cpu")
    assert {o.name for o in report.probes} == {
        "amd.amdsmi",
        "amd.kfd",
        "amd.rocminfo",
        "nvidia.nvml",
        "nvidia.nvidia-smi",
    }


_GPU_SIGNS = ("/sys/class/kfd", "/dev/kfd", "/sys/module/amdgpu", "/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")


@pytest.mark.skipif(any(os.path.exists(p) for p in _GPU_SIGNS), reason="this machine has a GPU driver")
def test_live_cpu_machine_is_cpu_with_no_problems():
    report = probe_all()
    assert report.platform == "cpu"
    assert report.gpus == [] and report.problems == [] and report.warnings == []
    assert report.host.memory_total_bytes and report.host.cpu_count
    assert check(report, tp=1, min_memory_gib=None, platform_wanted="auto", environ={}) == []
    assert check(report, tp=1, min_memory_gib=None, platform_wanted="cpu", environ=dict(os.environ)) == []


# ---- cpu_only


def test_cpu_only(fixtures):
    report = probe_all(fixtures / "cpu_only")
    assert report.platform == "cpu" and report.gpus == [] and report.problems == []
    assert check(report, tp=1, min_memory_gib=None, platform_wanted="auto", environ={}) == []
    assert check(report, tp=1, min_memory_gib=4, platform_wanted="auto", environ={}) == []
    (problem,) = check(report, tp=1, min_memory_gib=16, platform_wanted="auto", environ={})
    assert "7.8 GiB" in problem and "16.0 GiB" in problem


@pytest.mark.parametrize("wanted, vendor", [("rocm", "AMD"), ("cuda", "NVIDIA")])
def test_platform_wanted_but_absent(fixtures, wanted, vendor):
    report = probe_all(fixtures / "cpu_only")
    (problem,) = check(report, tp=1, min_memory_gib=None, platform_wanted=wanted, environ={})
    assert f"no {vendor} GPU" in problem and wanted in problem
    assert ("no amdgpu driver" if wanted == "rocm" else "no NVIDIA driver") in problem  # says why


# ---- two_gfx1201


def _two(fixtures):
    return probe_all(fixtures / "two_gfx1201", user_groups=["alice", "render", "video"])


def test_two_gfx1201_report(fixtures):
    report = _two(fixtures)
    assert report.platform == "rocm"
    assert [g.arch for g in report.gpus] == ["gfx1201", "gfx1201"]
    assert [d.path for d in report.devices] == ["/dev/kfd", "/dev/dri/renderD128", "/dev/dri/renderD129"]
    assert report.problems == [] and report.warnings == []
    assert report.host.missing_gpu_groups == []


def test_two_gfx1201_fits_tp2(fixtures):
    report = _two(fixtures)
    assert check(report, tp=2, min_memory_gib=15, platform_wanted="auto", environ={}) == []
    assert check(report, tp=2, min_memory_gib=15, platform_wanted="rocm", environ={}) == []
    result = evaluate(report, tp=2, platform_wanted="auto", environ={})
    assert [g.index for g in result.visible] == [0, 1] and result.platform == "rocm"


def test_two_gfx1201_too_few_gpus(fixtures):
    (problem,) = check(_two(fixtures), tp=4, min_memory_gib=None, platform_wanted="auto", environ={})
    assert problem.startswith("tp=4 needs 4 AMD GPU(s) but 2 are visible")
    (problem,) = check(_two(fixtures), tp=2, pp=2, environ={})
    assert "tp=2 x pp=2 needs 4" in problem


def test_two_gfx1201_not_enough_memory(fixtures):
    problems = check(_two(fixtures), tp=2, min_memory_gib=24, platform_wanted="auto", environ={})
    assert len(problems) == 2
    assert "GPU 0" in problems[0] and "15.9 GiB" in problems[0] and "24.0 GiB per GPU" in problems[0]


def test_cpu_wanted_on_a_gpu_machine_warns_only(fixtures):
    result = evaluate(_two(fixtures), tp=1, platform_wanted="cpu", environ={})
    assert result.ok and result.platform == "cpu"
    assert any("stay unused" in w for w in result.warnings)


def test_cuda_wanted_on_amd_machine(fixtures):
    (problem,) = check(_two(fixtures), tp=1, platform_wanted="cuda", environ={})
    assert "no NVIDIA GPU" in problem


# ---- mi300x_gfx942


def test_mi300x_busy_gpu_blocks_a_tp8_group(fixtures):
    report = probe_all(fixtures / "mi300x_gfx942", user_groups=["render", "video"])
    assert report.platform == "rocm" and len(report.gpus) == 8
    assert check(report, tp=8, min_memory_gib=None, environ={}) == []
    (problem,) = check(report, tp=8, min_memory_gib=80, environ={})
    assert problem.startswith("GPU 3 (AMD Instinct MI300X, gfx942) has only") and "free" in problem
    # Steering around the busy GPU clears it.
    result = evaluate(report, tp=4, min_memory_gib=80, environ={"HIP_VISIBLE_DEVICES": "4,5,6,7"})
    assert result.ok and [g.index for g in result.visible] == [4, 5, 6, 7]


# ---- h200_nvidia_smi


def _h200(fixtures, replay):
    return probe_all(fixtures / "h200_nvidia_smi", runner=replay(fixtures / "h200_nvidia_smi"))


def test_h200_report(fixtures, replay):
    report = _h200(fixtures, replay)
    assert report.platform == "cuda" and len(report.gpus) == 8
    assert report.devices == [] and report.problems == []
    assert check(report, tp=8, min_memory_gib=100, platform_wanted="cuda", environ={}) != []  # GPU 5 is busy
    assert check(report, tp=4, min_memory_gib=100, platform_wanted="auto", environ={}) == []
    assert check(report, tp=8, min_memory_gib=None, platform_wanted="auto", environ={}) == []


def test_h200_visibility(fixtures, replay):
    report = _h200(fixtures, replay)
    (problem,) = check(report, tp=2, environ={"CUDA_VISIBLE_DEVICES": ""})
    assert "0 are visible" in problem and "8 present" in problem
    result = evaluate(report, tp=2, environ={"CUDA_VISIBLE_DEVICES": "GPU-9d04e7a2,7"})
    assert result.ok and [g.index for g in result.visible] == [1, 7]  # UUID prefixes work
    result = evaluate(report, tp=1, environ={"HIP_VISIBLE_DEVICES": "0"})
    assert result.ok and any("no effect on NVIDIA" in w for w in result.warnings)


def test_h200_mixed_models_with_indices_warn_about_order(fixtures, replay):
    report = _h200(fixtures, replay)
    report.gpus[7].name = "NVIDIA H100 80GB HBM3"
    result = evaluate(report, tp=1, environ={"CUDA_VISIBLE_DEVICES": "7"})
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in w for w in result.warnings)
    result = evaluate(report, tp=1, environ={"CUDA_VISIBLE_DEVICES": "7", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert not any("CUDA_DEVICE_ORDER" in w for w in result.warnings)


# ---- visibility_conflict


def _conflict(fixtures):
    scenario = json.loads((fixtures / "visibility_conflict/scenario.json").read_text())
    report = probe_all(fixtures / scenario["root"], user_groups=["render", "video"])
    return report, scenario["cases"]


def test_hip_and_cuda_disagree(fixtures):
    report, cases = _conflict(fixtures)
    (problem,) = check(report, tp=1, environ=cases["hip_vs_cuda"])
    assert "HIP_VISIBLE_DEVICES=0,1" in problem and "CUDA_VISIBLE_DEVICES=1" in problem and "disagree" in problem


def test_hip_and_cuda_agree(fixtures):
    report, cases = _conflict(fixtures)
    result = evaluate(report, tp=2, environ=cases["hip_and_cuda_agree"])
    assert result.ok and result.warnings == []


def test_rocr_then_hip_with_physical_ids_sees_nothing(fixtures):
    # The classic mistake: HIP indexes into ROCr's selection, so "1" after ROCR=1 is out of range.
    report, cases = _conflict(fixtures)
    problems = check(report, tp=1, environ=cases["rocr_then_hip_same_ids"])
    assert len(problems) == 2
    assert "ROCR_VISIBLE_DEVICES=1 and HIP_VISIBLE_DEVICES=1 disagree" in problems[0]
    assert "0 are visible" in problems[1] and "ROCR_VISIBLE_DEVICES=1 then HIP_VISIBLE_DEVICES=1" in problems[1]


def test_rocr_then_hip_relative_is_valid_but_warned(fixtures):
    report, cases = _conflict(fixtures)
    result = evaluate(report, tp=1, environ=cases["rocr_then_hip_relative"])
    assert result.ok
    assert [g.index for g in result.visible] == [1]
    assert any("physical 1" in w for w in result.warnings)


def test_rocr_by_uuid(fixtures):
    report, cases = _conflict(fixtures)
    result = evaluate(report, tp=1, environ=cases["rocr_by_uuid"])
    assert result.ok and [g.uuid for g in result.visible] == ["GPU-66246d49248eff91"]


def test_hip_out_of_range_counts_what_is_left(fixtures):
    report, cases = _conflict(fixtures)
    result = evaluate(report, tp=2, environ=cases["hip_out_of_range"])
    assert [g.index for g in result.visible] == [0]
    assert any("entry '2'" in w for w in result.warnings)
    (problem,) = result.problems
    assert "1 is visible" in problem


def test_empty_hip_visible_devices_is_treated_as_unset(fixtures):
    report, _ = _conflict(fixtures)
    result = evaluate(report, tp=2, environ={"HIP_VISIBLE_DEVICES": ""})
    assert result.ok and len(result.visible) == 2
    assert any("set but empty" in w for w in result.warnings)


# ---- kfd_no_access


def _no_access(fixtures):
    spec = json.loads((fixtures / "kfd_no_access/access.json").read_text())
    return probe_all(fixtures / "kfd_no_access", access=_denying(spec["denied"]), user_groups=spec["user_groups"])


def test_kfd_no_access_is_a_problem_with_a_group_hint(fixtures):
    report = _no_access(fixtures)
    assert report.platform == "rocm" and len(report.gpus) == 1  # sysfs stays readable
    (problem,) = report.problems
    assert "cannot open /dev/kfd (read/write denied), /dev/dri/renderD128 (read/write denied);" in problem
    assert "sudo usermod -aG render,video $USER" in problem
    assert check(report, tp=1, environ={}) == report.problems
    assert check(report, tp=1, platform_wanted="cpu", environ={}) == []


def test_kfd_no_access_without_group_hint(fixtures):
    report = probe_all(
        fixtures / "kfd_no_access",
        access=_denying(["/dev/kfd"]),
        user_groups=["render", "video"],
    )
    (problem,) = report.problems
    assert "cannot open /dev/kfd (read/write denied);" in problem and "ls -l /dev/kfd" in problem


def test_kfd_missing(copy_scenario):
    root = copy_scenario("two_gfx1201")
    (root / "dev/kfd").unlink()
    report = probe_all(root, user_groups=["render"])
    (problem,) = report.problems
    assert problem.startswith("/dev/kfd is missing") and "--device /dev/kfd" in problem


def test_render_node_missing(copy_scenario):
    root = copy_scenario("two_gfx1201")
    (root / "dev/dri/renderD129").unlink()
    (problem,) = probe_all(root, user_groups=["render"]).problems
    assert "render node(s) missing: /dev/dri/renderD129" in problem


# ---- several vendors, odd GPUs, robustness


def test_amd_and_nvidia_on_one_host(copy_scenario, fixtures, replay):
    root = copy_scenario("two_gfx1201")
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/version").write_text("NVRM version: 570.124.06\n")
    report = probe_all(root, runner=replay(fixtures / "h200_nvidia_smi"), user_groups=["render"])
    assert len(report.gpus_of("amd")) == 2 and len(report.gpus_of("nvidia")) == 8
    assert report.platform == "cuda"
    assert any("both AMD (2) and NVIDIA (8)" in w for w in report.warnings)
    assert check(report, tp=2, platform_wanted="rocm", environ={}) == []


def _gpu(i, arch, integrated=False, total=16 * GIB):
    return GpuInfo("amd", i, f"gpu{i}", arch, total, None, "amdgpu", integrated=integrated, source="kfd")


def test_mixed_arch_and_integrated_gpus_warn():
    report = HardwareReport("rocm", gpus=[_gpu(0, "gfx1201"), _gpu(1, "gfx1036", integrated=True, total=0)])
    result = evaluate(report, tp=2, min_memory_gib=8, environ={})
    assert result.ok
    text = " | ".join(result.warnings)
    assert "differ in architecture" in text and "integrated GPU" in text and "memory size unknown" in text


def test_a_crashing_vendor_probe_becomes_a_warning(fixtures, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("parser bug")

    monkeypatch.setattr(hw.amd, "probe", boom)
    report = probe_all(fixtures / "cpu_only")
    assert report.platform == "cpu"
    assert report.warnings == ["amd probe crashed: RuntimeError: parser bug"]


@pytest.mark.parametrize("scenario", ["two_gfx1201", "mi300x_gfx942", "cpu_only", "kfd_no_access"])
def test_report_round_trips_through_json(fixtures, scenario):
    report = probe_all(fixtures / scenario, user_groups=["users"])
    again = HardwareReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again == report
    assert again.to_dict() == report.to_dict()


def test_from_dict_ignores_unknown_keys(fixtures):
    data = probe_all(fixtures / "two_gfx1201").to_dict()
    data["gpus"][0]["from_the_future"] = 1
    data["host"]["numa_nodes"] = 2
    assert HardwareReport.from_dict(data).gpus[0].arch == "gfx1201"


def test_absent_platform_lists_each_probe_when_they_differ(tmp_path, replay):
    (tmp_path / "sys/module/amdgpu").mkdir(parents=True)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kfd").touch()
    report = probe_all(tmp_path, runner=replay(None))
    (problem,) = check(report, tp=1, platform_wanted="rocm", environ={})
    assert "[amd.amdsmi: skipped" in problem and "amd.rocminfo: unavailable (rocminfo not installed)" in problem
