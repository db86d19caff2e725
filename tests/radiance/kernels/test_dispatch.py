"""Which path a per-step op takes: straight to the Triton launcher in eager mode on plain GPU
tensors, the registered op everywhere else (CPU, traced code, fake tensors)."""
from __future__ import annotations

import pytest
import torch
from radiance.kernels import add_rms_quant as arq
from radiance.kernels import gdn_norm_quant as gnq
from radiance.kernels import quant_fp8 as qf
from radiance.kernels.dispatch import eager_gpu_call
from torch.utils._python_dispatch import TorchDispatchMode



def same(got, want):
    """Every output bit-identical (fp8 codes compared as bytes: torch.equal has no fp8 kernel)."""
    for a, b in zip(got, want, strict=True):
        if a.dtype.itemsize == 1:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        assert torch.equal(a, b)


def test_cpu_tensors_take_the_op():
    assert not eager_gpu_call(torch.zeros(2))
    assert not eager_gpu_call()  # no tensors: nothing to decide on


def test_fake_tensors_take_the_op():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 8)
    assert not eager_gpu_call(x)


def test_traced_code_takes_the_op():
    seen = []

    def f(x):
        seen.append(eager_gpu_call(x))
        return x + 1

    torch.compile(f, backend="eager", fullgraph=True)(torch.zeros(3))
    assert seen == [False]


class _OpsSeen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def test_public_entries_on_cpu_go_through_their_ops():
    """On CPU the public entry must reach the registered op (what torch.compile and CUDA graphs record),
    not a private shortcut: the dispatcher itself says which ops ran."""
    torch.manual_seed(0)
    y, r = torch.randn(4, 256, dtype=torch.bfloat16), torch.randn(4, 256, dtype=torch.bfloat16)
    w = torch.randn(256, dtype=torch.bfloat16)
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    with _OpsSeen() as seen:
        arq.add_rms_quant(y, r, w, 1e-6)
        qf.quant_fp8(x, 0)
    assert "radiance.add_rms_quant" in seen.ops and "radiance.quant_fp8" in seen.ops, seen.ops


@pytest.mark.gpu
def test_eager_gpu_entries_skip_the_dispatcher_and_match_the_ops():
    assert eager_gpu_call(torch.zeros(2, device="cuda"))
    assert not eager_gpu_call(torch.zeros(2, device="cuda"), torch.zeros(2))
    torch.manual_seed(0)
    dev = "cuda"
    y = torch.randn(8, 2048, dtype=torch.bfloat16, device=dev)
    r = torch.randn(8, 2048, dtype=torch.bfloat16, device=dev)
    w = torch.randn(2048, dtype=torch.bfloat16, device=dev)
    fp8 = torch.float8_e4m3fn
    same(arq.add_rms_quant(y, r, w, 1e-6, 128, fp8),
         torch.ops.radiance.add_rms_quant(y, r, w, 1e-6, 128, fp8))
    same(qf.quant_fp8(y, 0, fp8), torch.ops.radiance.quant_fp8(y, 0, fp8))
    x = torch.randn(8, 16 * 128, dtype=torch.bfloat16, device=dev)
    z = torch.randn(8, 16 * 128, dtype=torch.bfloat16, device=dev)
    gw = torch.randn(128, dtype=torch.bfloat16, device=dev)
    same(gnq.gdn_norm_quant(x, z, gw, 1e-6, 0, fp8),
         torch.ops.radiance.gdn_norm_quant(x, z, gw, 1e-6, 0, fp8))


KERNEL_OPS = ("add_rms_quant", "allreduce_add_rms_quant", "gdn_norm_quant", "quant_fp8", "fp8_gemm",
              "w4a16_gemm", "w4a8_gemm")


def test_every_kernel_op_is_registered_one_way():
    """dispatch.register_library_op: a CPU implementation (the reference), a CUDA one and a fake, per op; no
    kernel module registers an op another way."""
    import ast
    import importlib
    from pathlib import Path

    from radiance.kernels import aot

    for mod in aot.KERNEL_MODULES:
        importlib.import_module(mod)
    for name in KERNEL_OPS:
        for key in ("CPU", "CUDA", "Meta"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"radiance::{name}", key), (name, key)
    kernels = Path(aot.__file__).parent
    other = {p.name for p in kernels.glob("*.py")
             for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Attribute) and node.attr in ("custom_op", "Library") and p.name != "dispatch.py"}
    assert other == set()
