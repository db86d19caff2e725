import pytest

from launcher.hardware.arch import (
    FP8_E4M3FN,
    FP8_E4M3FNUZ,
    arch_family,
    arch_to_gfx_target_version,
    cuda_capability,
    fp8_dtype_for_arch,
    gfx_target_version_to_arch,
    normalize_arch,
)


@pytest.mark.parametrize(
    "version, arch",
    [
        (120001, "gfx1201"),
        (120000, "gfx1200"),
        (90402, "gfx942"),
        (90500, "gfx950"),
        (90010, "gfx90a"),  # stepping 10 is the hex digit "a"
        (90012, "gfx90c"),
        (90008, "gfx908"),
        (90000, "gfx900"),
        (100300, "gfx1030"),
        (110000, "gfx1100"),
        (110501, "gfx1151"),
    ],
)
def test_gfx_target_version_decodes_like_llvm(version, arch):
    assert gfx_target_version_to_arch(version) == arch
    assert arch_to_gfx_target_version(arch) == version


@pytest.mark.parametrize("bad", [0, -1, 91600, 90016])
def test_gfx_target_version_rejects_what_names_no_gpu(bad):
    with pytest.raises(ValueError):
        gfx_target_version_to_arch(bad)


@pytest.mark.parametrize(
    "spelling, arch",
    [
        ("amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-", "gfx942"),
        ("gfx90a:xnack+", "gfx90a"),
        ("GFX1201", "gfx1201"),
        ("9.0", "sm90"),
        ("sm_90a", "sm90"),
        ("sm89", "sm89"),
        ("12.0", "sm120"),
        ("compute_100", "sm100"),
    ],
)
def test_normalize_arch(spelling, arch):
    assert normalize_arch(spelling) == arch


def test_cuda_capability_is_none_for_amd_and_bare_numbers():
    assert cuda_capability("gfx942") is None
    assert cuda_capability("942") is None
    assert cuda_capability("sm120") == (12, 0)


@pytest.mark.parametrize(
    "arch, dtype",
    [
        ("gfx942", FP8_E4M3FNUZ),
        ("gfx940", FP8_E4M3FNUZ),
        ("gfx942:sramecc+:xnack-", FP8_E4M3FNUZ),
        ("gfx1201", FP8_E4M3FN),
        ("gfx1200", FP8_E4M3FN),
        ("gfx950", FP8_E4M3FN),
        ("sm89", FP8_E4M3FN),
        ("sm90", FP8_E4M3FN),
        ("sm_100a", FP8_E4M3FN),
        ("sm120", FP8_E4M3FN),
        ("sm86", None),
        ("sm80", None),
        ("gfx1100", None),
        ("gfx90a", None),
        ("unknown", None),
    ],
)
def test_fp8_dtype_per_arch(arch, dtype):
    assert fp8_dtype_for_arch(arch) == dtype


@pytest.mark.parametrize(
    "arch, family",
    [
        ("gfx942", "cdna3"),
        ("gfx950", "cdna4"),
        ("gfx90a", "cdna2"),
        ("gfx908", "cdna1"),
        ("gfx1201", "rdna4"),
        ("gfx1100", "rdna3"),
        ("gfx1151", "rdna3.5"),
        ("gfx1030", "rdna2"),
        ("sm80", "ampere"),
        ("sm89", "ada"),
        ("sm90", "hopper"),
        ("sm120", "blackwell"),
        ("banana", "unknown"),
    ],
)
def test_arch_family(arch, family):
    assert arch_family(arch) == family
