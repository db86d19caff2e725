"""dynamic-draft vs stock MTP end to end on real vLLM (CPU), trained tiny Qwen3-Next.

For k in {1, 2, 4, 8} and both modes, one engine each; code/JSON prompts and prose prompts are
generated one request at a time (greedy, 48 tokens). Reported per (k, mode, kind): MTP forwards
per accepted token, acceptance, tokens/s, and whether the outputs equal stock MTP at the same k.
Stock runs k serial MTP forwards per step (drafts × k); dynamic's forwards are the controller's own
count (tests/e2e/test_dynamic_draft_lossless.py shows it equals an independent hook count).

    python benchmarks/bench_dynamic_draft_e2e.py [--ks 1,2,4,8] [--json out.json]
    python benchmarks/bench_dynamic_draft_e2e.py --ks 4,8 --variants "tau=0.5;schedule=1:4"

``--variants`` adds dynamic runs with other knob values at every k, compared with stock at the
same k: variants are ``;``-separated, each a ``&``-joined list of ``tau=..`` / ``schedule=..``.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-qwen3next-trained"
PROMPTS = {
    "code/json": [
        "def f0(x):\n    return x + 0\n\ndef f1(x):\n    return x + 1\n\ndef f2(x):\n",
        "for i in range(10):\n    print(i)\nfor j in range(10):\n",
        '[{"id": 1, "name": "a", "ok": true}, {"id": 2, "name": "b", "ok": true}, {"id": 3, ',
        '{"users": [{"name": "x", "age": 3}, {"name": "y", "age": 4}, {"name": ',
    ],
    "prose": [
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
        "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
        "Betty is saving money for a new wallet which costs $100. Betty has only half of the money",
        "James writes a 3-page letter to 2 different friends twice a week. How many pages",
    ],
}
MAX_TOKENS = 48


def _controller_forwards(worker) -> int:
    from radiance.draft.patch_proposer import DYNAMIC_DRAFT

    c = DYNAMIC_DRAFT.counters
    return int(c.snapshot().get("mtp_forwards_run", 0)) if c is not None else -1


def _spec(llm) -> dict:
    return {m.name.split(":")[-1]: m.value for m in llm.get_metrics()
            if m.name.startswith("vllm:spec_decode") and isinstance(getattr(m, "value", None), (int, float))}


def run(k: int, dynamic: bool, knobs: dict[str, str] | None = None) -> dict:
    os.environ["RADIANCE_DYNAMIC_DRAFT"] = "1" if dynamic else "0"
    for name in ("RADIANCE_DRAFT_TAU", "RADIANCE_DRAFT_SCHEDULE"):
        os.environ.pop(name, None)
    os.environ.update(knobs or {})
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc ships _controller_forwards
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(MODEL), dtype="bfloat16", speculative_config={"method": "mtp", "num_speculative_tokens": k},
              enable_prefix_caching=False, max_model_len=512, max_num_seqs=8, kv_cache_memory_bytes=256 << 20,
              enforce_eager=True, disable_log_stats=False, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    out = {}
    try:
        for kind, prompts in PROMPTS.items():
            s0 = _spec(llm)
            f0 = llm.collective_rpc(_controller_forwards)[0] if dynamic else 0
            t0 = time.perf_counter()
            toks = [list(llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids) for p in prompts]
            dt = time.perf_counter() - t0
            s1 = _spec(llm)
            d = {key: s1.get(key, 0) - s0.get(key, 0) for key in s1}
            drafts = d.get("spec_decode_num_drafts", 0)
            accepted = d.get("spec_decode_num_accepted_tokens", 0)
            forwards = (llm.collective_rpc(_controller_forwards)[0] - f0) if dynamic else drafts * k
            if dynamic and forwards == 0 and drafts:
                forwards = drafts * k  # the controller did not engage (k=1: one forward, nothing to cut)
            out[kind] = {"tokens": toks, "forwards": forwards, "accepted": accepted, "drafts": drafts,
                         "draft_tokens": d.get("spec_decode_num_draft_tokens", 0),
                         "tok_s": len(prompts) * MAX_TOKENS / dt}
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ks", default="1,2,4,8")
    ap.add_argument("--json", default=None)
    ap.add_argument("--variants", default="", help='e.g. "tau=0.5;tau=0.5&schedule=1:4"')
    args = ap.parse_args()
    variants = {"dynamic": {}}
    for spec in filter(None, args.variants.split(";")):
        knobs = dict(item.split("=", 1) for item in spec.split("&"))
        variants[f"dyn[{spec}]"] = {f"RADIANCE_DRAFT_{name.upper()}": value for name, value in knobs.items()}
    results = {}
    for k in [int(x) for x in args.ks.split(",")]:
        results[f"{k}/stock"] = run(k, False)
        for mode, knobs in variants.items():
            results[f"{k}/{mode}"] = run(k, True, knobs)
    rows = []
    print(f"{'k':>2} {'mode':24} {'kind':10} {'fwd/acc':>8} {'acc rate':>8} {'tok/s':>7} same-as-stock")
    for key, res in results.items():
        k, mode = key.split("/", 1)
        for kind, r in res.items():
            same = r["tokens"] == results[f"{k}/stock"][kind]["tokens"]
            fpa = r["forwards"] / r["accepted"] if r["accepted"] else float("inf")
            rate = r["accepted"] / r["draft_tokens"] if r["draft_tokens"] else 0.0
            rows.append({"k": int(k), "mode": mode, "kind": kind, "forwards": r["forwards"],
                         "accepted": r["accepted"], "forwards_per_accepted": fpa, "acceptance_rate": rate,
                         "tok_s": r["tok_s"], "identical_to_stock": same})
            print(f"{k:>2} {mode:24} {kind:10} {fpa:8.2f} {rate:8.3f} {r['tok_s']:7.1f} {same}")
    if args.json:
        Path(args.json).write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
