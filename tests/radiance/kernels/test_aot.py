"""The AOT list is exactly what the launchers launch at the shipped shapes, arch by arch.

For every arch the images build for and every shipped shape (``radiance.kernels.shipped``), each
kernel's launcher is called the way its caller calls it on a GPU (every M, batch or width the
shape can take), with CPU tensors, the device described as the arch's (``aot.DEVICES``), and
Triton's JIT left to do what it does at a launch: bind the arguments, specialise them for the
target and compute the compile. A cache hook records that specialisation and stops before
anything compiles or runs. The set of those specialisations must equal the set the AOT list
compiles (``aot.specs_for``): nothing launched is missing, nothing compiled is never launched.
"""
from __future__ import annotations

import contextlib
import json

import pytest
import torch

from radiance.kernels import aot, shipped
from radiance.kernels.dispatch import describing

triton = pytest.importorskip("triton")

from radiance.kernels import allreduce_add_rms_quant as far  # noqa: E402
from radiance.kernels import add_rms_quant as arq  # noqa: E402
from radiance.kernels import fp8_gemm as fg  # noqa: E402
from radiance.kernels import gdn_norm_quant as gnq  # noqa: E402
from radiance.kernels import quant_fp8 as qf  # noqa: E402
from radiance.kernels import w4a16_gemm as wk  # noqa: E402
from radiance.kernels import w4a8_gemm as w8  # noqa: E402
from radiance.kernels import w4_layout as layout  # noqa: E402

BF16 = torch.bfloat16
# M beyond the kernels' tiles repeats their classes; a few large ones stand for prefill steps
FP8_GEMM_M = list(range(1, 300)) + [511, 512, 1000, 1024, 4095, 4096, 8191, 8192]


@contextlib.contextmanager
def jit_launches(arch: str):
    """Inside, every Triton launch goes through the JIT as usual, specialised for ``arch``, and
    stops at the JIT's cache hook before compiling; yields the list of their specialisations."""
    from triton import knobs

    seen: list[str] = []

    def hook(**kw):
        data = json.loads(kw["compile"]["specialization_data"])
        data.pop("key")  # the in-process key, which also depends on the keyword order
        seen.append(json.dumps(data, sort_keys=True))
        return True  # no compile, no launch

    prev = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = hook
    try:
        with describing(aot.DEVICES[arch]), aot._target_driver(arch, "test"):
            yield seen
    finally:
        knobs.runtime.jit_cache_hook = prev


def launch_w4a16(arch):
    group = shipped.W4A16_GROUP
    for n, k in shipped.W4A16.values():
        qshape, sshape = layout.packed_shapes(n, k, group)
        qw, sc = torch.empty(qshape, dtype=torch.int32), torch.empty(sshape, dtype=BF16)
        for m in range(1, wk.LARGE_M + 1):  # the op's kernel band (above it: dequantise + matmul)
            wk.w4a16_gemm_triton(torch.empty((m, k), dtype=BF16), qw, sc, group)


def launch_w4a8(arch):
    """radiance_w4's consumers: an epilogue's (or quant_fp8's) per-token codes, every M of the kernel band.
    The 16-bit MMA's operand is a fresh bf16 tensor of the codes' shape either way; converting 7168
    uninitialised CPU tensors of up to 1024 x 17408 codes to make it was 70 % of this test's time, and its
    values never reach the JIT's specialisation (shape, strides, alignment do), so here it is only allocated."""
    dev = aot.DEVICES[arch]
    if not dev.has_fp8:
        return
    group = shipped.W4A8_GROUP
    real = w8._mma16_operand
    w8._mma16_operand = lambda a_q: torch.empty(a_q.shape, dtype=torch.bfloat16)
    try:
        for n, k in shipped.W4A8.values():
            qshape, sshape = layout.packed_shapes(n, k, group)
            qw, sc = torch.empty(qshape, dtype=torch.int32), torch.empty(sshape, dtype=BF16)
            for m in range(1, wk.LARGE_M + 1):
                w8.w4a8_gemm_triton(torch.empty((m, k), dtype=dev.fp8_dtype), torch.empty((m, 1)), qw, sc, group)
    finally:
        w8._mma16_operand = real


def launch_fp8_stream(arch):
    if not aot.DEVICES[arch].has_fp8:  # no radiance_fp8 there (sm_80): no fp8-stream
        return
    fp8 = aot.DEVICES[arch].fp8_dtype
    k = shipped.FP8_HIDDEN
    for group in shipped.FP8_GROUPS:
        for m in (1, 7, 64, 300):
            y = torch.empty((m, k), dtype=BF16)
            w = torch.empty(k, dtype=BF16)
            arq.add_rms_quant_triton(y, torch.empty_like(y), w, 1e-6, group, fp8)
            far.allreduce_add_rms_quant_triton(y, torch.empty_like(y), torch.empty_like(y), w, 1e-6, group, fp8)
            for kq in shipped.QUANT_FP8_K:
                qf.quant_fp8_triton(torch.empty((m, kq), dtype=BF16), group, fp8)
            h, d = shipped.GDN_HEADS, shipped.GDN_HEAD_DIM
            qkvz = torch.empty((m, 2 * h * d + 2 * 1024), dtype=BF16)
            gnq.gdn_norm_quant_triton(torch.empty((m, h * d), dtype=BF16), qkvz[:, h * d + 2048:],
                                      torch.empty(d, dtype=BF16), 1e-6, group, fp8)


def launch_fp8_gemm(arch):
    """The op's choice (``scaled_mm_supported`` on a GPU tensor), then the Triton launcher."""
    dev = aot.DEVICES[arch]
    if not dev.has_fp8:
        return
    fp8 = dev.fp8_dtype
    for n, k in shipped.FP8_GEMM.values():
        w_q = torch.empty((n, k), dtype=fp8)
        scales = {"block": torch.empty((-(-n // 128), k // 128)), "channel": torch.empty((n, 1))}
        for a_l, w_l in (("group", "block"), ("token", "channel")):
            for m in FP8_GEMM_M:
                a_scale = torch.empty((m, k // 128) if a_l == "group" else (m, 1))
                w_scale = scales[w_l]
                if fg.scaled_mm_takes(fg._a_layout(a_scale, m, k), fg._w_layout(w_scale, n, k), n, k, BF16, dev):
                    continue
                fg.fp8_gemm_triton(torch.empty((m, k), dtype=fp8), a_scale, w_q, w_scale, BF16)


LAUNCHERS = {"w4a16_gemm": launch_w4a16, "w4a8_gemm": launch_w4a8, "fp8_gemm": launch_fp8_gemm,
             "fp8 stream epilogues": launch_fp8_stream}
KERNELS = {"w4a16_gemm": ("w4a16_gemm",), "w4a8_gemm": ("w4a8_gemm",), "fp8_gemm": ("fp8_gemm",),
           "fp8 stream epilogues": ("add_rms_quant", "allreduce_add_rms_quant", "quant_fp8", "gdn_norm_quant")}


def aot_keys(arch: str, kernels: tuple[str, ...]) -> set[str]:
    specs = [s for s in aot.specs_for(arch) if s.name.split("[")[0] in kernels]
    return {aot.specialisation_key(s, arch) for s in specs}


def describe_keys(keys) -> str:
    return "\n".join(sorted(keys))[:4000]


@pytest.mark.parametrize("arch", sorted(aot.ARCHS))
@pytest.mark.parametrize("group", sorted(LAUNCHERS))
def test_aot_list_is_exactly_the_launches(arch, group):
    with jit_launches(arch) as seen:
        LAUNCHERS[group](arch)
    launched = set(seen)
    compiled = aot_keys(arch, KERNELS[group])
    fp8_only = group in ("fp8_gemm", "fp8 stream epilogues", "w4a8_gemm")
    assert launched or (fp8_only and not aot.DEVICES[arch].has_fp8), "no launch recorded"
    assert not launched - compiled, "launched, not in the AOT list:\n" + describe_keys(launched - compiled)
    assert not compiled - launched, "in the AOT list, never launched:\n" + describe_keys(compiled - launched)


def test_every_registered_kernel_is_checked():
    covered = {k for ks in KERNELS.values() for k in ks}
    assert set(aot.load_sources()[0]) == covered


@pytest.mark.parametrize("arch", sorted(aot.ARCHS))
def test_fp8_format_is_the_devices(arch):
    """fnuz only on gfx94x (the only place it exists); every other target gets e4m3fn."""
    specs = aot.specs_for(arch)
    fnuz = {s.name for s in specs if s.constexprs.get("FNUZ")
            or any(getattr(a, "dtype", None) == torch.float8_e4m3fnuz for a in s.args)}
    if arch.startswith("gfx94"):
        assert fnuz and not any(getattr(a, "dtype", None) == torch.float8_e4m3fn for s in specs for a in s.args)
    else:
        assert not fnuz


def test_names_are_unique_and_say_what_differs():
    specs = aot.specs_for("sm90")
    assert len({s.name for s in specs}) == len(specs)
    assert all("#" not in s.name for s in specs)  # every variant told apart by its own name


def test_stand_ins_specialise_like_tensors():
    """A TensorArg (what the AOT list keeps of a captured tensor) and the tensor it stands for
    give the JIT the same specialisation, misaligned views and the HIP pointer range included."""
    base = torch.empty(4096 + 8, dtype=BF16)
    for t in (base[:4096], base[1:4097], base[8:]):
        a = aot.Launch(qf._quant_fp8_group_kernel, (1, 4), (t, t, torch.empty(4), 4096, 4096), dict(
            FMAX=448.0, MIN_SCALE=1.0, GROUP=128, FNUZ=False, BLOCK=1024, num_warps=4))
        b = aot.Launch(a.kernel, a.grid, tuple(aot._stand_in(x) for x in a.args), a.kwargs)
        for arch in ("sm90", "gfx1201"):
            assert aot.specialisation(a, arch) == aot.specialisation(b, arch)


def test_cache_key_follows_the_tables(tmp_path, monkeypatch):
    """The tables pick the variants, so the cached AOT results are keyed by them too."""
    import shutil

    shutil.copytree(aot.CONFIG_ROOT, tmp_path / "configs")
    monkeypatch.setattr(aot, "CONFIG_ROOT", tmp_path / "configs")
    key = aot._cache_key("sm90", None)
    table = tmp_path / "configs" / "w4a16_gemm" / "nvidia_h200.json"
    table.write_bytes(table.read_bytes() + b"\n")
    assert aot._cache_key("sm90", None) != key


@pytest.mark.parametrize("arch", ["sm90"])
def test_sm90_list_compiles(arch, aot_compile):
    """`python -m radiance.kernels.aot --arch sm90` must exit 0 (no fnuz on NVIDIA): one variant
    of each kernel here; `make aot` style runs compile them all."""
    specs = aot.specs_for(arch)
    first = {}
    for s in specs:
        first.setdefault(s.name.split("[")[0], s)
    for spec in first.values():
        aot_compile(spec, arch)
