"""w4-drafter with a DFlash drafter on real vLLM 0.32 (CPU).

A tiny dense Qwen3 target and a 2-layer DFlash drafter (``tools.tinymodel.dflash``, random
weights built so that drafts are sometimes accepted) run stock DFlash speculative decoding and
then the same with RADIANCE_W4_DRAFTER=1, each in a fresh process. The drafter-load bracket must
cover DFlashProposer's load: the drafter's qkv / o / gate_up / down are converted (logged by
shape), its ``fc`` is declined with the reason, nothing of the target is converted, and greedy
outputs equal stock DFlash (the target verifies every token). A probe inside the worker reads
which layers carry the 4-bit method and how many rows each drafter linear was fed, which is the
reason ``fc`` is declined: it is fed the target's token count, prefill included.
A pair whose drafter has no convertible linear must decline the feature cleanly and still serve.

The file is also the child script: ``python tests/e2e/test_w4_dflash.py TARGET DRAFTER OUT``.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from .run_greedy import PROMPTS
except ImportError:  # run as the child script (python tests/e2e/test_w4_dflash.py ...)
    from run_greedy import PROMPTS

pytestmark = pytest.mark.e2e
HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
K = 4
MAX_TOKENS = 32
# The drafter's layers sit after the target's 4 (vLLM numbers them from start_layer_id = 4).
DRAFTER_LINEARS = [f"model.layers.{i}.{name}" for i in (4, 5)
                   for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")]


# -- worker-side probe (shipped by collective_rpc; self-contained) -------------------------------
def _install_probe(worker) -> bool:
    from vllm.model_executor.layers.linear import LinearBase

    rows: dict[str, int] = {}
    worker._w4_probe_rows = rows
    for mod in worker.model_runner.drafter.model.modules():
        if isinstance(mod, LinearBase):
            def seen(module, args, name=mod.prefix):
                rows[name] = max(rows.get(name, 0), args[0].reshape(-1, args[0].shape[-1]).shape[0])
            mod.register_forward_pre_hook(seen)
    return True


def _read_probe(worker) -> dict:
    from vllm.model_executor.layers.linear import LinearBase

    # by vLLM prefix, which numbers the drafter's layers after the target's (not the module path)
    def converted(model) -> list[str]:
        return sorted(m.prefix for m in model.modules()
                      if isinstance(m, LinearBase) and type(m.quant_method).__name__ == "W4Method")

    drafter = worker.model_runner.drafter.model
    fused = getattr(drafter.model, "_fused_kv_weight", None)
    return {
        "target_converted": converted(worker.model_runner.model),
        "drafter_converted": converted(drafter),
        "drafter_linears": sorted(m.prefix for m in drafter.modules() if isinstance(m, LinearBase)),
        "rows": dict(worker._w4_probe_rows),
        "fused_kv": None if fused is None else [list(fused.shape), str(fused.dtype)],
        "proposer": type(worker.model_runner.drafter).__name__,
    }


def child(target: str, drafter: str, out: str, k: int) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=target, dtype="bfloat16",
              speculative_config={"method": "dflash", "model": drafter, "num_speculative_tokens": k},
              enable_prefix_caching=False, max_model_len=512, max_num_seqs=8,
              kv_cache_memory_bytes=256 << 20, enforce_eager=True, disable_log_stats=False, seed=0)
    llm.collective_rpc(_install_probe)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True),
                        use_tqdm=False)
    probe = llm.collective_rpc(_read_probe)[0]
    metrics = {m.name: m.value for m in llm.get_metrics()
               if m.name.startswith("vllm:spec_decode") and isinstance(getattr(m, "value", None), (int, float))}
    Path(out).write_text(json.dumps({"token_ids": [list(o.outputs[0].token_ids) for o in outs],
                                     "metrics": metrics, "probe": probe}))


# -- tests ---------------------------------------------------------------------------------------
def run(pair: tuple[Path, Path], tmp: Path, tag: str, w4: bool) -> tuple[dict, str]:
    out = tmp / f"{tag}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADIANCE_")}
    env.update(RADIANCE_ENABLE="1", RADIANCE_W4_DRAFTER="1" if w4 else "0", PYTHONUNBUFFERED="1",
               VLLM_ALLOW_INSECURE_SERIALIZATION="1")  # collective_rpc ships the probe by pickle
    proc = subprocess.run([sys.executable, str(HERE), str(pair[0]), str(pair[1]), str(out), "--k", str(K)],
                          check=False, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    return json.loads(out.read_text()), log


def _w4_lines(log: str) -> list[str]:
    return sorted({m.group(1) for m in re.finditer(r"radiance: (w4-drafter.*)", log)})


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tools.tinymodel import dflash

    return dflash.write_pair(tmp_path_factory.mktemp("dflash"))


@pytest.fixture(scope="module")
def stock(pair, tmp_path_factory):
    return run(pair, tmp_path_factory.mktemp("stock"), "stock", w4=False)


def test_stock_dflash_runs_on_cpu_and_accepts_drafts(stock):
    got, log = stock
    assert got["probe"]["proposer"] == "DFlashProposer"
    assert got["probe"]["drafter_converted"] == [] and not _w4_lines(log)
    assert all(len(t) == MAX_TOKENS for t in got["token_ids"])
    m = got["metrics"]
    # the agreeing pair: some drafts accepted, not all, so the verify path sees both
    assert 0 < m["vllm:spec_decode_num_accepted_tokens"] < m["vllm:spec_decode_num_draft_tokens"], m


def test_w4_drafter_converts_dflash_drafter_only_and_is_lossless(pair, stock, tmp_path):
    base, _ = stock
    got, log = run(pair, tmp_path, "w4", w4=True)
    lines = _w4_lines(log)
    probe = got["probe"]
    # the bracket covers DFlashProposer's load: exactly the drafter's decoder linears, 4-bit
    assert probe["drafter_converted"] == sorted(DRAFTER_LINEARS), probe
    assert probe["target_converted"] == [], probe
    for shape, name in (("512x256", "self_attn.qkv_proj"), ("256x256", "self_attn.o_proj"),
                        ("1024x256", "mlp.gate_up_proj"), ("256x512", "mlp.down_proj")):
        assert f"w4-drafter: bf16 {shape} model.layers.4.{name}: converted" in log, lines
    assert ("w4-drafter: bf16 256x512 model.fc: declined: fc sees the step's whole token count "
            "(prefill chunks) every step") in log, lines
    assert "w4-drafter converted 8 drafter linears" in log, lines
    assert not any(re.search(r"model\.layers\.[0-3]\.", line) for line in lines), lines
    assert "w4-drafter declined" not in log and "Traceback" not in log
    # why fc is declined: it is fed the target's token count (the prompts' prefill), the
    # converted layers only the draft block, num_reqs * (1 + K), num_reqs <= max_num_seqs = 8
    rows = probe["rows"]
    block = 8 * (1 + K)
    assert max(rows[n] for n in DRAFTER_LINEARS if n in rows) <= block, rows
    assert rows["model.fc"] > block, rows
    # lossless: the target verifies every token
    assert got["token_ids"] == base["token_ids"]
    print(f"\nw4-drafter (DFlash): outputs identical to stock on {len(PROMPTS)} prompts x {MAX_TOKENS} tokens; "
          f"spec metrics w4 {got['metrics']} vs stock {base['metrics']}; rows seen {rows}; "
          f"fused context-KV weight {probe['fused_kv']}")
    for line in lines:
        print("  " + line)


def test_dflash_drafter_without_convertible_linears_declines_cleanly(tmp_path):
    from tools.tinymodel import dflash

    pair = dflash.write_pair(tmp_path / "pair", dims=dflash.UNCONVERTIBLE)
    got, log = run(pair, tmp_path, "w4", w4=True)
    assert got["probe"]["drafter_converted"] == [] and got["probe"]["target_converted"] == []
    assert "w4-drafter declined: the drafter has no convertible linears (9 declined)" in log, _w4_lines(log)
    assert "not a multiple of the group size" in log
    assert all(len(t) == MAX_TOKENS for t in got["token_ids"])


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("target")
    p.add_argument("drafter")
    p.add_argument("out")
    p.add_argument("--k", type=int, default=K)
    a = p.parse_args()
    child(a.target, a.drafter, a.out, a.k)
