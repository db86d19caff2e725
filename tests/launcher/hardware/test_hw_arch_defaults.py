"""The arch table (launcher/hardware/arch_defaults.py): what gfx12 gets at TP >= 2, who wins over it, how the
engine gets it (launcher.engine_args.build) and how `radiance check` names it (launcher.preflight)."""
from pathlib import Path

import pytest

from launcher import engine_args, preflight
from launcher.hardware import GpuInfo, HardwareReport
from launcher.hardware import arch_defaults as ad
from launcher.hardware.types import GIB
from launcher.profile import load_profile, parse_profile

REPO = Path(__file__).resolve().parents[3]
GFX12_TP2 = ("qwen3next-tp2", "qwen3.5-27b-w4-tp2", "qwen3.5-27b-dflash-tp2", "qwen3next-80b-tp2")
TINY = "name: t\nmodel:\n  path: builtin:tiny-qwen3next\nparallel:\n  tp: {tp}\n"


def test_every_row_carries_its_source_and_reason():
    for row in (*ad.DEFAULTS, *ad.TRAPS):
        assert row.source.strip() and row.why.strip(), row


@pytest.mark.parametrize("arch", ["gfx1201", "gfx1200", "amdgcn-amd-amdhsa--gfx1201:xnack-"])
def test_gfx12_at_tp2_gets_nccl_simple_no_custom_all_reduce_and_no_aiter(arch):
    rows = {d.name: (d.value, d.source) for d in ad.defaults_for(arch, 2)}
    assert rows == {
        "NCCL_PROTO": ("Simple", "vLLM issue 40980 (root cause ROCm/rocm-systems issue 5480)"),
        "disable-custom-all-reduce": (True, "ROCm/vllm issue 287"),
        "VLLM_ROCM_USE_AITER": ("0", "ROCm/TransformerEngine issue 520"),
    }


def test_collective_rows_need_tp2_and_other_archs_get_nothing():
    assert [d.name for d in ad.defaults_for("gfx1201", 1)] == ["VLLM_ROCM_USE_AITER"]  # kernels, any tp
    for arch in ("gfx942", "gfx1100", "sm90", "sm120"):
        assert ad.defaults_for(arch, 8) == []


def test_the_profile_wins_then_the_environment_then_the_table():
    got = {r.default.name: (r.decided_by, r.value) for r in ad.resolve(
        "gfx1201", 2, env={"NCCL_PROTO": "LL128"}, vllm_args={"disable-custom-all-reduce": False},
        environ={"NCCL_PROTO": "ignored", "VLLM_ROCM_USE_AITER": "1"})}
    assert got == {"NCCL_PROTO": ("profile", "LL128"), "disable-custom-all-reduce": ("profile", False),
                   "VLLM_ROCM_USE_AITER": ("environment", "1")}
    (r,) = [r for r in ad.resolve("gfx1201", 2, {}, {"no-disable-custom-all-reduce": True})
            if r.default.kind == "vllm_arg"]
    assert (r.decided_by, r.value) == ("profile", False)
    env, args = ad.to_apply(ad.resolve("gfx1201", 2, {"NCCL_PROTO": "LL"}, {}, {"VLLM_ROCM_USE_AITER": "1"}))
    assert env == {} and args == {"disable-custom-all-reduce": True}


def test_pcie_p2p_is_a_trap_at_four_cards_avoided_by_its_fix():
    assert ad.detect_traps("gfx1201", 2, {}) == []
    assert ad.detect_traps("gfx942", 8, {}) == []
    (t,) = ad.detect_traps("gfx1201", 4, {})
    assert not t.avoided and "11348" in t.describe() and "NCCL_P2P_DISABLE" in t.describe()
    assert ad.detect_traps("gfx1201", 4, {"NCCL_P2P_DISABLE": "1"})[0].avoided
    assert ad.detect_traps("gfx1201", 4, {}, environ={"NCCL_P2P_DISABLE": "1"})[0].avoided
    assert not ad.detect_traps("gfx1201", 4, {"NCCL_P2P_DISABLE": "0"}, {"NCCL_P2P_DISABLE": "1"})[0].avoided


# ---- the engine gets them


def _build(profile, platform="rocm", arch="gfx1201", environ=None):
    return engine_args.build(profile, platform=platform, model_arg="/m", model_dir=None,
                             environ={} if environ is None else environ, arch=arch)


@pytest.mark.parametrize("name", GFX12_TP2)
def test_gfx12_tp2_profiles_get_the_defaults_from_the_table_not_their_own_env(name):
    prof = load_profile(REPO / "profiles" / f"{name}.yaml")
    assert not set(prof.env) & {d.name for d in ad.DEFAULTS}  # no copies left in the profiles
    cfg = _build(prof)
    assert cfg.env["NCCL_PROTO"] == "Simple" and cfg.env["VLLM_ROCM_USE_AITER"] == "0"
    assert cfg.server_args.count("--disable-custom-all-reduce") == 1


def test_the_profiles_own_line_wins_and_other_platforms_and_archs_get_nothing():
    own = parse_profile(TINY.format(tp=2) + "env:\n  NCCL_PROTO: LL128\nvllm_args:\n"
                        "  disable-custom-all-reduce: false\n", "x.yaml")
    cfg = _build(own)
    assert cfg.env["NCCL_PROTO"] == "LL128" and cfg.env["VLLM_ROCM_USE_AITER"] == "0"
    assert "--no-disable-custom-all-reduce" in cfg.server_args
    assert "--disable-custom-all-reduce" not in cfg.server_args
    assert _build(own, environ={"NCCL_PROTO": "LL"}).env["NCCL_PROTO"] == "LL128"  # the profile's over all
    plain = parse_profile(TINY.format(tp=2), "x.yaml")
    assert "NCCL_PROTO" not in _build(plain, environ={"NCCL_PROTO": "LL"}).env  # the launcher's env, inherited
    for platform, arch in (("cpu", "gfx1201"), ("rocm", "gfx942"), ("cuda", "sm90"), ("rocm", None)):
        cfg = _build(plain, platform, arch)
        assert "NCCL_PROTO" not in cfg.env and "--disable-custom-all-reduce" not in cfg.server_args


def test_engine_arch_is_the_gpu_here_else_the_images_arch():
    def gpu(i, arch):
        return GpuInfo("amd", i, "R9700", arch, 32 * GIB, None, None)

    here = HardwareReport("rocm", gpus=[gpu(0, "gfx942"), gpu(1, "gfx1201")])
    assert engine_args.engine_arch("rocm", {}, here) == "gfx942"
    assert engine_args.engine_arch("rocm", {"HIP_VISIBLE_DEVICES": "1"}, here) == "gfx1201"
    assert engine_args.engine_arch("rocm", {}, HardwareReport("cpu")) == "gfx1201"
    assert engine_args.engine_arch("cuda", {}, HardwareReport("cpu")) == "sm90"
    assert engine_args.engine_arch("cpu", {}, here) is None


# ---- radiance check names each one


def _assess_rows(profile, gpus):
    hw = HardwareReport("rocm", gpus=[GpuInfo("amd", i, "R9700", "gfx1201", 32 * GIB, None, None)
                                      for i in range(gpus)])
    rep = preflight.PreflightReport(profile=profile.name, profile_hash="", platform="rocm", runtime="local")
    preflight.arch_findings(rep, profile, hw, "rocm", {})
    return rep


def test_check_names_each_default_and_the_trap_in_one_row_with_its_source():
    rep = _assess_rows(load_profile(REPO / "profiles/qwen3next-tp2.yaml"), 2)
    rows = [f for f in rep.findings if f.check == "gfx1201 default"]
    assert len(rows) == 3 and all(f.status == "ok" and "source:" in f.detail for f in rows)
    assert {d["name"]: d["decided_by"] for d in rep.arch_defaults} == {
        "NCCL_PROTO": "default", "disable-custom-all-reduce": "default", "VLLM_ROCM_USE_AITER": "default"}
    assert rep.arch_traps == [] and rep.compatible

    four = parse_profile(TINY.format(tp=4) + "env:\n  NCCL_PROTO: LL\n", "x.yaml")
    rep = _assess_rows(four, 4)
    (trap,) = [f for f in rep.findings if f.check == "gfx1201 trap"]
    assert trap.status == "warn" and "11348" in trap.detail and rep.compatible  # a warning, not exit 4
    (nccl,) = [f for f in rep.findings if "NCCL_PROTO" in f.detail]
    assert "profile setting wins" in nccl.detail
