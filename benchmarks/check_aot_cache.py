"""Does the AOT fill serve every shipped launch? Count what a GPU run compiles after it.

    python benchmarks/check_aot_cache.py [--arch sm90] [--tree DIR] [--jobs N] [--json out.json]

1. A fresh, empty ``TRITON_CACHE_DIR``.
2. ``python -m radiance.kernels.aot --arch ARCH`` into it (``--tree``: run that checkout's AOT and
   kernels instead of this one's, e.g. an older commit for a before/after comparison; a checkout
   whose aot module has no ``--jobs`` is compiled by this script's own loop over its registry,
   in parallel, spec by spec as its CLI would).
3. A new process on the same cache launches every shipped kernel at every shipped shape
   (``radiance/kernels/shipped.py`` of *this* checkout) through its public entry, kernel by
   kernel, and lists the cache entries each kernel added: kernel binaries (the JIT compiled a
   variant the AOT list does not hold), launcher modules (Triton's per-signature C launcher)
   and driver modules. The goal is none at all.

Also checks that this GPU's description (``dispatch.describe``) is the one the AOT list plans
for (``aot.DEVICES[arch]``). Writes JSON with date, device, commit and Triton version.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "radiance" / "kernels" / "shipped.py"


def entries(cache: Path) -> dict[str, str]:
    """{entry: kind} for every entry (one folder per key) in a Triton cache."""
    out = {}
    for d in sorted(p for p in cache.iterdir() if p.is_dir()) if cache.is_dir() else []:
        files = [f.name for f in d.iterdir()]
        if any(f.endswith((".cubin", ".hsaco")) for f in files):
            meta = next((d / f for f in files if f.endswith(".json") and not f.startswith("__grp")), None)
            name = json.loads(meta.read_text()).get("name", "?") if meta else "?"
            out[d.name] = f"kernel {name}"
        elif any("launcher" in f for f in files):
            out[d.name] = "launcher module"
        elif any(f.endswith(".so") for f in files):
            out[d.name] = "driver module " + ",".join(f for f in files if f.endswith(".so"))
        else:
            out[d.name] = "other " + ",".join(files)
    return out


# ---------------------------------------------------------------------------------------------
# step 2: the AOT fill
# ---------------------------------------------------------------------------------------------

_OLD_REGISTRY_COMPILE = r"""
import json, sys, concurrent.futures, multiprocessing
arch, jobs = sys.argv[1], int(sys.argv[2])

def part(i):
    from radiance.kernels import aot
    specs, _ = aot.load_all()
    names = [n for n, s in specs.items() if not s.archs or arch in s.archs]
    rows = []
    for n in names[i::jobs]:
        try:
            c = aot.compile_spec(specs[n], arch)
            rows.append({"name": n, "ok": bool(c.asm.get(aot.binary_kind(arch)))})
        except Exception as exc:
            rows.append({"name": n, "ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"})
    return rows

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        rows = [r for p in pool.map(part, range(jobs)) for r in p]
    print(json.dumps({"arch": arch, "results": rows}))
"""


def aot_fill(tree: Path, arch: str, cache: Path, jobs: int) -> dict:
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "PYTHONPATH": str(tree)}
    has_jobs = "--jobs" in (tree / "radiance" / "kernels" / "aot.py").read_text()
    if has_jobs:
        cmd = [sys.executable, "-m", "radiance.kernels.aot", "--arch", arch, "--json", "--jobs", str(jobs)]
    else:  # a file, not -c: spawned workers import their main module
        script = cache.parent / f"{cache.name}-registry-compile.py"
        script.write_text(_OLD_REGISTRY_COMPILE)
        cmd = [sys.executable, str(script), arch, str(jobs)]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1200)
    seconds = round(time.time() - t0, 1)
    try:
        results = json.loads(proc.stdout)["results"]
    except Exception:
        return {"rc": proc.returncode, "seconds": seconds, "error": proc.stderr[-3000:]}
    failed = [r for r in results if not r["ok"]]
    return {"rc": proc.returncode, "seconds": seconds, "variants": len(results),
            "failed": [f"{r['name']}: {r.get('error', '')[:160]}" for r in failed],
            "launchers_built": sum(bool(r.get("launcher")) for r in results),
            "command": " ".join(cmd[1:]) if has_jobs else f"the registry loop for {arch}"}


# ---------------------------------------------------------------------------------------------
# step 3: the launches (a separate process: a fresh JIT whose only cache is the filled one)
# ---------------------------------------------------------------------------------------------

def _load_shipped():
    spec = importlib.util.spec_from_file_location("radiance_shipped_shapes", SHIPPED)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def launch_all(cache: Path) -> dict:
    """Every shipped kernel at every shipped shape through its public entry; the cache entries
    each one added."""
    import torch

    sh = _load_shipped()
    dev = torch.device("cuda", 0)
    bf16 = torch.bfloat16
    groups: dict[str, list] = {}

    def group(name):
        def deco(fn):
            groups[name] = fn
            return fn
        return deco

    @group("w4a16_gemm")
    def _w4a16():
        import radiance.kernels.w4a16_gemm  # noqa: F401  (registers torch.ops.radiance.w4a16_gemm)
        from radiance.kernels import w4_layout as layout

        g = sh.W4A16_GROUP
        # decode batches, verification (batch x (k + 1), k = 4 MTP / 8 DFlash), prefill chunks
        ms = sorted(set(sh.W4A16_DECODE_M) | {b * (k + 1) for b in (1, 8, 16, 64) for k in (4, 8)}
                    | {2, 17, 33, 65, 100, 1024})
        for n, k in sh.W4A16.values():
            qshape, sshape = layout.packed_shapes(n, k, g)
            qw = torch.randint(-2**31, 2**31 - 1, qshape, dtype=torch.int32, device=dev)
            sc = torch.rand(sshape, device=dev).to(bf16) * 0.01
            for m in ms:
                torch.ops.radiance.w4a16_gemm(torch.randn(m, k, device=dev, dtype=bf16), qw, sc, g)
            del qw, sc

    @group("fp8-stream epilogues")
    def _epilogues():
        from radiance.kernels.allreduce_add_rms_quant import allreduce_add_rms_quant_triton
        from radiance.kernels.add_rms_quant import add_rms_quant
        from radiance.kernels.dispatch import fp8_dtype_for_device
        from radiance.kernels.gdn_norm_quant import gdn_norm_quant
        from radiance.kernels.quant_fp8 import quant_fp8

        fp8 = fp8_dtype_for_device(dev)
        k = sh.FP8_HIDDEN
        h, d = sh.GDN_HEADS, sh.GDN_HEAD_DIM
        w = torch.randn(k, device=dev, dtype=bf16) * 0.1
        for grp in sh.FP8_GROUPS:
            for m in (1, 8, 64, 320):
                y, r = torch.randn(m, k, device=dev, dtype=bf16), torch.randn(m, k, device=dev, dtype=bf16)
                add_rms_quant(y, r, w, 1e-6, grp, fp8)
                allreduce_add_rms_quant_triton(y, torch.randn_like(y), r, w, 1e-6, grp, fp8)
                for kq in sh.QUANT_FP8_K:
                    quant_fp8(torch.randn(m, kq, device=dev, dtype=bf16), grp, fp8)
                qkvz = torch.randn(m, 2 * h * d + 2 * 1024, device=dev, dtype=bf16)
                gdn_norm_quant(torch.randn(m, h * d, device=dev, dtype=bf16), qkvz[:, h * d + 2048:],
                               torch.ones(d, device=dev, dtype=bf16), 1e-6, grp, fp8)

    @group("fp8_gemm")
    def _fp8_gemm():
        from radiance.kernels.fp8_common import quantize_reference
        from radiance.kernels.dispatch import fp8_dtype_for_device
        from radiance.kernels.fp8_gemm import scaled_mm

        fp8 = fp8_dtype_for_device(dev)
        for n, k in sh.FP8_GEMM.values():
            w_q = (torch.randn(n, k, device=dev) * 0.1).to(fp8)
            block = torch.rand(-(-n // 128), k // 128, device=dev) * 0.01
            channel = torch.rand(n, 1, device=dev) * 0.01
            for m in (1, 2, 8, 16, 40, 64, 72, 320, 576, 1024, 4096, 4097):
                x = torch.randn(m, k, device=dev, dtype=bf16)
                qg, sg = quantize_reference(x, 128, fp8)
                scaled_mm(qg, sg, w_q, block, bf16)
                qt, st = quantize_reference(x, 0, fp8)
                scaled_mm(qt, st, w_q, channel, bf16)

    out = {}
    import triton

    before = entries(cache)
    torch.cuda.synchronize()
    triton.runtime.driver.active.get_current_device()  # the driver's own module, if not cached
    driver_new = {e: k for e, k in entries(cache).items() if e not in before}
    out["driver start"] = {"new": len(driver_new), "entries": sorted(driver_new.values())}
    for name, fn in groups.items():
        before = entries(cache)
        t0 = time.time()
        try:
            fn()
            torch.cuda.synchronize()
            err = ""
        except Exception as exc:  # a kernel the old tree cannot launch is reported, not fatal
            err = f"{type(exc).__name__}: {str(exc)[:300]}"
        new = {e: k for e, k in entries(cache).items() if e not in before}
        kinds = sorted(new.values())
        out[name] = {"new": len(new), "kernels": sum(k.startswith("kernel") for k in kinds),
                     "launchers": sum(k == "launcher module" for k in kinds), "entries": kinds,
                     "seconds": round(time.time() - t0, 1), **({"error": err} if err else {})}
        torch.cuda.empty_cache()
    try:
        from radiance.kernels import aot, dispatch

        arch = os.environ["RADIANCE_CHECK_ARCH"]
        out["device"] = {"describe": repr(dispatch.describe(dev)), "planned_for": repr(aot.DEVICES[arch]),
                         "same": dispatch.describe(dev) == aot.DEVICES[arch]}
    except Exception as exc:  # an older tree has no DeviceInfo
        out["device"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", default="sm90")
    p.add_argument("--tree", default=str(REPO), help="the checkout whose AOT and kernels to check")
    p.add_argument("--jobs", type=int, default=max(1, min(16, (os.cpu_count() or 2))))
    p.add_argument("--json", default=None)
    p.add_argument("--launch-phase", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.launch_phase:
        print("RESULT " + json.dumps(launch_all(Path(args.launch_phase))), flush=True)
        return 0
    import torch
    from _fp8_epilogue_common import commit

    tree = Path(args.tree).resolve()
    cache = Path(tempfile.mkdtemp(prefix="triton-aot-check-"))
    report = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(0),
              "tree": str(tree), "commit": commit(tree, unknown="unknown"), "arch": args.arch,
              "triton": __import__("triton").__version__, "torch": torch.__version__}
    print(f"[check] {report}", flush=True)
    report["aot"] = aot_fill(tree, args.arch, cache, args.jobs)
    report["after_aot_entries"] = len(entries(cache))
    print(f"[check] AOT: {json.dumps(report['aot'])[:2000]}", flush=True)
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "PYTHONPATH": str(tree),
           "RADIANCE_CHECK_ARCH": args.arch}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--launch-phase", str(cache)],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    report["launches"] = json.loads(line[7:]) if line else {"error": proc.stderr[-3000:]}
    report["new_entries_total"] = sum(v.get("new", 0) for v in report["launches"].values()
                                      if isinstance(v, dict))
    for name, v in report["launches"].items():
        print(f"[check] {name:22s} {json.dumps(v)[:600]}", flush=True)
    print(f"[check] new cache entries after the AOT fill: {report['new_entries_total']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["new_entries_total"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
