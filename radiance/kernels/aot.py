"""Ahead-of-time compilation of radiance's Triton kernels for a named GPU arch.

Triton compiles for a HIP or CUDA target without that GPU present, so a CPU machine can
prove that every kernel builds for gfx1201/gfx942 (tests and the capability report do),
and an image build can fill its Triton cache before the first request.

Each kernel module declares the specialisations it ships with ``register(...)``; the
registry is filled by importing the modules listed in ``KERNEL_MODULES``.

    python -m radiance.kernels.aot --arch gfx1201 [--json] [--only NAME] [--cache-dir DIR]

``--cache-dir``: keep the results per (arch, Triton version, kernel sources) there and reuse them
(``radiance check`` asks on every run; a full compile for one arch takes ~15 s on 2 cores).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

# Modules that call register() at import. Each kernel module adds itself here.
KERNEL_MODULES: tuple[str, ...] = (
    "radiance.kernels.w4a16_gemm",
    "radiance.kernels.add_rms_quant",
    "radiance.kernels.silu_mul_quant",
    "radiance.kernels.quant_fp8",
    "radiance.kernels.gdn_norm_quant",
    "radiance.kernels.fp8_gemm",
    "radiance.fp8_stream.fused_allreduce",
    "radiance.kernels.draft_confidence",
    "radiance.kernels.ngram_match",
)

# arch name -> (backend, arch, warp size)
ARCHS: dict[str, tuple[str, Any, int]] = {
    "gfx1201": ("hip", "gfx1201", 32),   # RDNA4, Radeon AI PRO R9700 / RX 9070
    "gfx1200": ("hip", "gfx1200", 32),
    "gfx942": ("hip", "gfx942", 64),     # CDNA3, MI300
    "gfx950": ("hip", "gfx950", 64),
    "sm90": ("cuda", 90, 32),
    "sm89": ("cuda", 89, 32),
    "sm80": ("cuda", 80, 32),
}


@dataclass
class AotSpec:
    name: str                      # variant name, e.g. "w4a16_gemm[bf16,BM16,BN64]"
    feature: str                   # feature it serves: dynamic_draft | w4 | fp8_stream
    kernel: Any                    # a @triton.jit function
    signature: dict[str, str]      # Triton signature strings, constexprs marked "constexpr"
    constexprs: dict[str, Any] = field(default_factory=dict)
    archs: tuple[str, ...] = ()    # restrict to these archs; () = all
    num_warps: int | None = None
    num_stages: int | None = None
    options: dict[str, Any] = field(default_factory=dict)  # other compile options, e.g. enable_fp_fusion
    # Specialisation hints ({(arg_index,): [["tt.divisibility", 16]]}), so the AOT binary is the variant
    # the JIT would launch for aligned tensors (vectorised loads), not a scalar-load fallback.
    attrs: dict[Any, Any] | None = None


_REGISTRY: dict[str, AotSpec] = {}


def register(spec: AotSpec) -> AotSpec:
    _REGISTRY[spec.name] = spec
    return spec


def load_all() -> tuple[dict[str, AotSpec], dict[str, str]]:
    """Import every kernel module; returns (specs, {module: import error})."""
    errors = {}
    for mod in KERNEL_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name == mod:
                errors[mod] = "not built yet"
            else:
                errors[mod] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            errors[mod] = f"{type(exc).__name__}: {exc}"
    return dict(_REGISTRY), errors


def target_for(arch: str):
    from triton.backends.compiler import GPUTarget

    try:
        backend, name, warp = ARCHS[arch]
    except KeyError:
        raise ValueError(f"unknown arch {arch!r}; known: {', '.join(ARCHS)}") from None
    return GPUTarget(backend, name, warp)


def compile_spec(spec: AotSpec, arch: str):
    import triton
    from triton.compiler import ASTSource

    src = ASTSource(fn=spec.kernel, signature=spec.signature, constexprs=spec.constexprs, attrs=spec.attrs)
    options = dict(spec.options)
    if spec.num_warps is not None:
        options["num_warps"] = spec.num_warps
    if spec.num_stages is not None:
        options["num_stages"] = spec.num_stages
    return triton.compile(src, target=target_for(arch), options=options or None)


def binary_kind(arch: str) -> str:
    return "hsaco" if ARCHS[arch][0] == "hip" else "cubin"


def compile_all(arch: str, only: str | None = None) -> list[dict]:
    specs, import_errors = load_all()
    results = []
    for mod, err in import_errors.items():
        results.append({"name": mod, "feature": "", "ok": False, "error": f"import: {err}"})
    for spec in specs.values():
        if only and only not in spec.name:
            continue
        if spec.archs and arch not in spec.archs:
            continue
        t0 = time.perf_counter()
        try:
            compiled = compile_spec(spec, arch)
            binary = compiled.asm.get(binary_kind(arch), b"")
            results.append({"name": spec.name, "feature": spec.feature, "ok": bool(binary),
                            "bytes": len(binary), "seconds": round(time.perf_counter() - t0, 3)})
        except Exception as exc:
            results.append({"name": spec.name, "feature": spec.feature, "ok": False,
                            "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})
    return results


def _cache_key(arch: str, only: str | None) -> str:
    import hashlib

    import triton

    h = hashlib.sha256(f"{arch}|{only}|{triton.__version__}".encode())
    for mod in KERNEL_MODULES:
        spec = importlib.util.find_spec(mod)
        if spec is not None and spec.origin:
            with open(spec.origin, "rb") as f:
                h.update(f.read())
    return h.hexdigest()[:24]


def cached_compile_all(arch: str, only: str | None, cache_dir: str | None) -> list[dict]:
    import os

    if not cache_dir:
        return compile_all(arch, only)
    path = os.path.join(cache_dir, f"aot-{arch}-{_cache_key(arch, only)}.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        pass
    results = compile_all(arch, only)
    os.makedirs(cache_dir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(results, f)
    os.replace(path + ".tmp", path)
    return results


def main(argv: list[str] | None = None) -> int:
    if __name__ == "__main__":
        # Run as `python -m`, this file is a second module (__main__); the kernel modules register
        # their specs in radiance.kernels.aot, so hand over to that one.
        from radiance.kernels import aot as package_module

        return package_module.main(argv)
    p = argparse.ArgumentParser(prog="python -m radiance.kernels.aot", description=__doc__.split("\n")[0])
    p.add_argument("--arch", required=True, choices=sorted(ARCHS))
    p.add_argument("--only", default=None, help="compile only variants whose name contains this")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--cache-dir", default=None, help="reuse results kept here for the same sources and Triton")
    args = p.parse_args(argv)
    results = cached_compile_all(args.arch, args.only, args.cache_dir)
    if args.json:
        print(json.dumps({"arch": args.arch, "results": results}, indent=1))
    else:
        for r in results:
            status = "ok " if r["ok"] else "ERR"
            detail = f"{r.get('bytes', 0)} B in {r.get('seconds', 0)} s" if r["ok"] else r["error"]
            print(f"{status} {args.arch:8s} {r['name']}: {detail}")
    real = [r for r in results if not r.get("error", "").startswith("import: not built yet")]
    return 0 if all(r["ok"] for r in real) else 1


if __name__ == "__main__":
    sys.exit(main())
