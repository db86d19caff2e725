"""Ahead-of-time compilation of radiance's Triton kernels for a named GPU arch: exactly the
variants the launchers launch at the shipped shapes (``radiance.kernels.shipped``).

Triton compiles for a HIP or CUDA target without that GPU present, so a CPU machine can prove
that every kernel builds for gfx1201/gfx942 (tests and the capability report do), and an image
build fills its Triton cache before the first request. For the cache to serve the launches, an
AOT binary must have the launch's cache key: the same signature (argument types, and which ints
the JIT turned into constants), the same specialisation attributes (16-byte alignment, ROCm's
32-bit pointer ranges), the same constexprs and the same compile options. So no signature is
written by hand:

* every kernel module registers a *launch source* (``register``): a function that, for the
  description of a target device (``DEVICES[arch]``, a ``device.DeviceInfo``), calls the
  module's real launcher with CPU tensors of each shipped shape;
* ``capture`` runs such a call with every Triton launch intercepted, recording the kernel,
  grid, positional arguments and keyword arguments exactly as the launcher passed them (the
  launcher plans from ``dispatch.describe``, which ``dispatch.describing`` points at the
  target); tensors are kept as ``TensorArg`` stand-ins (dtype, alignment, storage size);
* the compile is the JIT's own: ``JITFunction.run(..., warmup=True)`` under a compile-only
  stand-in for Triton's driver that reports the target (``_target_driver``), so Triton's binder
  computes the specialisation and ``triton.compile`` the cache key, as at a launch.

Each (kernel, specialisation) is compiled once: ``specs_for(arch)`` de-duplicates the launches
by the specialisation the JIT computes (``specialisation``). Where the target's GPU is present
(the H200 check in benchmarks/check_aot_cache.py), the per-signature launcher modules Triton
builds at a kernel's first launch are built too.

    python -m radiance.kernels.aot --arch gfx1201 [--json] [--only NAME] [--cache-dir DIR] [--jobs N]

``--cache-dir``: keep the results per (arch, Triton version, kernel sources, config tables) there
and reuse them (``radiance check`` asks on every run).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from .device import DeviceInfo

# Modules whose import registers their launch sources (register()). Each kernel module adds itself here.
KERNEL_MODULES: tuple[str, ...] = (
    "radiance.kernels.w4a16_gemm",
    "radiance.kernels.w4a8_gemm",
    "radiance.kernels.add_rms_quant",
    "radiance.kernels.quant_fp8",
    "radiance.kernels.gdn_norm_quant",
    "radiance.kernels.fp8_gemm",
    "radiance.kernels.allreduce_add_rms_quant",
)
# Modules of helpers the kernels share (Triton pieces and the references beside them): no launch
# source of their own, but a kernel's build changes with them.
HELPER_MODULES: tuple[str, ...] = ("fp8_common", "w4_common", "w4_layout")

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

# The device each arch's launches are planned for. Beyond the arch, a launch depends on the SM / CU
# count (split-K, split plans) and the config table the device's name selects; an image for an
# arch serves these devices exactly (another SM count or table can pick other variants, which the
# JIT then compiles at their first launch).
DEVICES: dict[str, DeviceInfo] = {
    "gfx1201": DeviceInfo("hip", "gfx1201", 64, "gfx1201"),    # Radeon AI PRO R9700 (64 CUs)
    "gfx1200": DeviceInfo("hip", "gfx1200", 32, "gfx1200"),    # Radeon RX 9060 XT (32 CUs)
    "gfx942": DeviceInfo("hip", "gfx942", 304, "gfx942"),      # Instinct MI300X (304 CUs)
    "gfx950": DeviceInfo("hip", "gfx950", 256, "gfx950"),      # Instinct MI355X (256 CUs)
    "sm90": DeviceInfo("cuda", "sm90", 132, "nvidia_h200"),    # H200 SXM (the tuned tables)
    "sm89": DeviceInfo("cuda", "sm89", 142, "nvidia_l40s"),
    "sm80": DeviceInfo("cuda", "sm80", 108, "nvidia_a100_sxm4_80gb"),
}


CONFIG_ROOT = Path(__file__).resolve().parent.parent / "configs"


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument as Triton's specialisation sees it: its dtype, whether its address is
    16-byte aligned (``data_ptr``) and its storage size (``ptr_range``: ROCm's buffer loads
    specialise on storages under 2 GiB)."""
    dtype: Any
    misalign: int = 0      # data_ptr() % 16
    nbytes: int = 0

    def data_ptr(self) -> int:
        return self.misalign

    def ptr_range(self) -> int:
        return self.nbytes

    @classmethod
    def of(cls, t) -> "TensorArg":
        return cls(t.dtype, t.data_ptr() % 16, t.untyped_storage().size())


@dataclass
class AotSpec:
    """One launch: what the launcher passed to ``kernel[grid](*args, **kwargs)``."""
    name: str                      # e.g. "w4a16_gemm[bf16,BN128,BM16,SK4,W4,S3]"
    feature: str                   # the feature it serves: dynamic_draft | w4 | fp8_stream
    arch: str                      # the arch it was planned for
    kernel: Any                    # the @triton.jit function
    grid: tuple
    args: tuple
    kwargs: dict
    serves: list[str] = field(default_factory=list)  # the shipped shapes that launch it

    @property
    def constexprs(self) -> dict:
        """The constexpr arguments, passed by position or by name."""
        params = self.kernel.params
        named = {p.name for p in params if p.is_constexpr}
        return {**{p.name: a for p, a in zip(params, self.args) if p.is_constexpr},
                **{k: v for k, v in self.kwargs.items() if k in named}}

    @property
    def options(self) -> dict:
        names = {p.name for p in self.kernel.params}
        return {k: v for k, v in self.kwargs.items() if k not in names}


@dataclass
class Source:
    """Where a kernel's AOT launches come from: ``launches(dev, arch)`` yields (label, call) pairs,
    each call running the kernel's launcher with CPU tensors of one shipped shape."""
    kernel: str
    feature: str
    launches: Callable[[DeviceInfo, str], Iterable[tuple[str, Callable[[], Any]]]]
    archs: tuple[str, ...] = ()    # () = every arch


_SOURCES: dict[str, Source] = {}


def register(kernel: str, feature: str,
             launches: Callable[[DeviceInfo, str], Iterable[tuple[str, Callable[[], Any]]]],
             archs: tuple[str, ...] = ()) -> Source:
    """``launches(dev, arch)``: the (label, call) pairs of the shipped launches on ``dev``."""
    src = _SOURCES[kernel] = Source(kernel, feature, launches, archs)
    return src


def load_sources() -> tuple[dict[str, Source], dict[str, str]]:
    """Import every kernel module; returns (sources, {module: import error})."""
    errors = {}
    for mod in KERNEL_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            errors[mod] = "not built yet" if exc.name == mod else f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            errors[mod] = f"{type(exc).__name__}: {exc}"
    return dict(_SOURCES), errors


# ---------------------------------------------------------------------------------------
# Capturing launches
# ---------------------------------------------------------------------------------------

@dataclass
class Launch:
    kernel: Any
    grid: tuple
    args: tuple
    kwargs: dict


def _stand_in(a):
    import torch

    return TensorArg.of(a) if isinstance(a, torch.Tensor) else a


@contextlib.contextmanager
def capturing():
    """Inside the block no Triton kernel runs: each ``kernel[grid](...)`` is recorded instead (the
    yielded list). A launcher's return value from such a launch is never read."""
    from triton.runtime.jit import JITFunction

    launches: list[Launch] = []

    def run(self, *args, grid, warmup, **kwargs):
        if warmup:
            return orig(self, *args, grid=grid, warmup=warmup, **kwargs)
        launches.append(Launch(self, tuple(grid) if not callable(grid) else grid,
                               tuple(_stand_in(a) for a in args), dict(kwargs)))
        return None

    orig = JITFunction.run
    JITFunction.run = run
    try:
        yield launches
    finally:
        JITFunction.run = orig


def capture(call: Callable[[], Any], dev: DeviceInfo) -> list[Launch]:
    """The launches ``call`` makes when every device is described by ``dev``."""
    from .dispatch import describing

    with describing(dev), capturing() as launches:
        call()
    return launches


# ---------------------------------------------------------------------------------------
# The JIT's specialisation and compile, for a target that need not be present
# ---------------------------------------------------------------------------------------

def target_for(arch: str):
    from triton.backends.compiler import GPUTarget

    try:
        backend, name, warp = ARCHS[arch]
    except KeyError:
        raise ValueError(f"unknown arch {arch!r}; known: {', '.join(ARCHS)}") from None
    return GPUTarget(backend, name, warp)


class _CompileOnlyDriver:
    """What ``JITFunction.run`` asks of Triton's driver, answered for a target instead of a GPU:
    the binder and ``triton.compile`` then run as at a launch. The device is a key of its own per
    (purpose, target), so the JIT's in-memory caches never mix it with a real device's."""

    def __init__(self, target, purpose: str):
        self._target = target
        self._device = ("radiance-aot", purpose, target.backend, str(target.arch), target.warp_size)

    def get_current_target(self):
        return self._target

    def get_current_device(self):
        return self._device

    def get_current_stream(self, device=None):
        return 0


@contextlib.contextmanager
def _target_driver(arch: str, purpose: str):
    from triton.runtime.driver import driver

    previous = getattr(driver, "_active", None)  # None: the real one is made when next asked for
    driver.set_active(_CompileOnlyDriver(target_for(arch), purpose))
    try:
        yield
    finally:
        driver.set_active(previous)


def specialisation(launch: Launch | AotSpec, arch: str) -> dict:
    """What the JIT compiles for this launch on ``arch``: the signature, constants, attributes
    and options of its specialisation data (the in-process cache key, which also depends on the
    keyword order, left out). Equal dicts compile to one cache entry."""
    from triton import knobs

    seen: list[dict] = []

    def hook(**kw):
        seen.append(json.loads(kw["compile"]["specialization_data"]))
        return True  # do not compile

    prev = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = hook
    try:
        with _target_driver(arch, "specialise"):
            launch.kernel.run(*launch.args, grid=launch.grid, warmup=True, **launch.kwargs)
    finally:
        knobs.runtime.jit_cache_hook = prev
    if len(seen) != 1:
        raise RuntimeError(f"expected one specialisation of {launch.kernel}, got {len(seen)}")
    data = seen[0]
    data.pop("key", None)
    return data


def specialisation_key(launch: Launch | AotSpec, arch: str) -> str:
    return json.dumps(specialisation(launch, arch), sort_keys=True)


def compile_spec(spec: AotSpec, arch: str | None = None):
    """Compiles ``spec`` for ``arch`` (default: the arch it was planned for) the way the JIT
    does at its launch, into Triton's cache; returns the CompiledKernel."""
    with _target_driver(arch or spec.arch, "compile"):
        return spec.kernel.run(*spec.args, grid=spec.grid, warmup=True, **spec.kwargs)


def build_launcher(compiled, arch: str) -> str:
    """Where ``arch``'s GPU is present, loads the binary and builds its launcher module (Triton
    compiles one per signature at a kernel's first launch, into the same cache); returns "" or
    why not."""
    try:
        from triton.runtime.driver import driver

        real = driver.active
        if real.get_current_target() != target_for(arch):
            return f"this GPU is not {arch}"
        compiled._init_handles()
        return ""
    except Exception as exc:  # no GPU or no driver here: the first launch builds it
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"


# ---------------------------------------------------------------------------------------
# The list
# ---------------------------------------------------------------------------------------

def specs_for(arch: str, sources: dict[str, Source] | None = None) -> list[AotSpec]:
    """The distinct launches of every source on ``DEVICES[arch]``, in source order."""
    if sources is None:
        sources = load_sources()[0]
    dev = DEVICES[arch]
    out: dict[str, AotSpec] = {}
    names: set[str] = set()
    for src in sources.values():
        if src.archs and arch not in src.archs:
            continue
        for label, call in src.launches(dev, arch):
            for launch in capture(call, dev):
                data = specialisation(launch, arch)
                key = json.dumps(data, sort_keys=True)
                if key in out:
                    out[key].serves.append(label)
                    continue
                base = name = variant_name(src.kernel, launch, data)
                n = 1
                while name in names:  # equal names, other specialisations: never silently merged
                    n += 1
                    name = f"{base}#{n}"
                names.add(name)
                out[key] = AotSpec(name, src.feature, arch, launch.kernel, launch.grid,
                                   launch.args, launch.kwargs, [label])
    return list(out.values())


_SHORT = {"BLOCK_N": "BN", "BLOCK_M": "BM", "SPLIT_K": "SK", "num_warps": "W", "num_stages": "S"}


def variant_name(kernel: str, launch: Launch, data: dict) -> str:
    """``kernel[dtype,...]`` from the specialisation: the first pointer's element type, every
    constexpr (booleans by name when true; fp constants left out: they follow from the fp8
    format, named by FNUZ), ints the JIT made constants (``n=1``) or found not divisible by 16
    (``n%16!=0``), and the options the launcher set."""
    params = launch.kernel.params
    sig = data["signature"]
    parts = [next((t[1:] for t in sig.values() if isinstance(t, str) and t.startswith("*")), "")]
    consts = {params[key[0]].name: val for key, val in zip(data["constant_keys"], data["constant_vals"])
              if len(key) == 1}
    attrs = {key[0]: val for key, val in zip(data["attrs_keys"], data["attrs_vals"]) if len(key) == 1}
    for p in params:
        if p.name in consts:
            v = consts[p.name]
            if not p.is_constexpr:
                parts.append(f"{p.name}={v}")
            elif isinstance(v, bool):
                if v:
                    parts.append(_SHORT.get(p.name, p.name))
            elif not isinstance(v, float):
                parts.append(f"{_SHORT[p.name]}{v}" if p.name in _SHORT else f"{p.name}={v}")
        elif sig.get(p.name) in ("i32", "i64") and not p.do_not_specialize and not attrs.get(p.num):
            parts.append(f"{p.name}%16!=0")
    names = {p.name for p in params}
    for k, v in launch.kwargs.items():
        if k not in names:
            parts.append(f"{_SHORT[k]}{v}" if k in _SHORT else f"{k}={v}")
    return f"{kernel}[{','.join(x for x in parts if x)}]"


def load_all(arch: str) -> tuple[dict[str, AotSpec], dict[str, str]]:
    """({name: spec} for ``arch``, {module: import error})."""
    sources, errors = load_sources()
    return {s.name: s for s in specs_for(arch, sources)}, errors


def binary_kind(arch: str) -> str:
    return "hsaco" if ARCHS[arch][0] == "hip" else "cubin"


def compile_all(arch: str, only: str | None = None, launchers: bool = True, jobs: int = 1) -> list[dict]:
    """Compiles the list for ``arch`` (``jobs`` processes; each plans the list and takes every
    jobs-th variant) and returns one result row per variant, in list order."""
    sources, import_errors = load_sources()
    results = []
    for mod, err in import_errors.items():
        results.append({"name": mod, "feature": "", "ok": False, "error": f"import: {err}"})
    if jobs > 1:
        import concurrent.futures
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # a forked CUDA context would not survive
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            parts = list(pool.map(_compile_part, [(arch, only, launchers, i, jobs) for i in range(jobs)]))
        rows = sorted((r for part in parts for r in part), key=lambda r: r.pop("index"))
        return results + rows
    return results + _compile_specs(arch, only, launchers, 0, 1, sources)


def _compile_part(job: tuple) -> list[dict]:
    from radiance.kernels import aot as package_module  # the registry the kernel modules fill

    arch, only, launchers, part, parts = job
    return package_module._compile_specs(arch, only, launchers, part, parts)


def _compile_specs(arch: str, only: str | None, launchers: bool, part: int, parts: int,
                   sources: dict[str, Source] | None = None) -> list[dict]:
    results = []
    try:
        specs = specs_for(arch, sources)
    except Exception as exc:
        return [] if part else [{"index": -1, "name": "plan", "feature": "", "ok": False,
                                 "error": f"planning the launches: {type(exc).__name__}: {exc}"}]
    for index, spec in enumerate(specs):
        if index % parts != part or (only and only not in spec.name):
            continue
        t0 = time.perf_counter()
        try:
            compiled = compile_spec(spec, arch)
            binary = compiled.asm.get(binary_kind(arch), b"")
            row = {"index": index, "name": spec.name, "feature": spec.feature, "ok": bool(binary),
                   "bytes": len(binary), "seconds": round(time.perf_counter() - t0, 3),
                   "serves": spec.serves}
            if launchers:
                why = build_launcher(compiled, arch)
                row["launcher"] = not why
            results.append(row)
        except Exception as exc:
            results.append({"index": index, "name": spec.name, "feature": spec.feature, "ok": False,
                            "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})
    if parts == 1:
        for r in results:
            r.pop("index")
    return results


def _cache_key(arch: str, only: str | None) -> str:
    import hashlib

    import triton

    h = hashlib.sha256(f"{arch}|{only}|{triton.__version__}".encode())
    here = Path(__file__).resolve().parent
    paths = [here / f"{name}.py" for name in ("aot", "device", "dispatch", "shipped") + HELPER_MODULES]
    paths += sorted(CONFIG_ROOT.glob("*/*.json"))  # the tables choose the variants
    for mod in KERNEL_MODULES:
        spec = importlib.util.find_spec(mod)
        if spec is not None and spec.origin:
            paths.append(Path(spec.origin))
    for path in paths:
        h.update(path.read_bytes())
    return h.hexdigest()[:24]


def cached_compile_all(arch: str, only: str | None, cache_dir: str | None, jobs: int = 1) -> list[dict]:
    import os

    if not cache_dir:
        return compile_all(arch, only, jobs=jobs)
    path = os.path.join(cache_dir, f"aot-{arch}-{_cache_key(arch, only)}.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        pass
    results = compile_all(arch, only, jobs=jobs)
    os.makedirs(cache_dir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(results, f)
    os.replace(path + ".tmp", path)
    return results


def main(argv: list[str] | None = None) -> int:
    if __name__ == "__main__":
        # Run as `python -m`, this file is a second module (__main__); the kernel modules register
        # their sources in radiance.kernels.aot, so hand over to that one.
        from radiance.kernels import aot as package_module

        return package_module.main(argv)
    p = argparse.ArgumentParser(prog="python -m radiance.kernels.aot", description=__doc__.split("\n")[0])
    p.add_argument("--arch", required=True, choices=sorted(ARCHS))
    p.add_argument("--only", default=None, help="compile only variants whose name contains this")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--cache-dir", default=None, help="reuse results kept here for the same sources and Triton")
    p.add_argument("--jobs", type=int, default=1, help="compile in this many processes (0: one per CPU)")
    args = p.parse_args(argv)
    jobs = (os.cpu_count() or 1) if args.jobs == 0 else max(1, args.jobs)
    results = cached_compile_all(args.arch, args.only, args.cache_dir, jobs)
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
