"""Run real vLLM (CPU) once with the environment it is given and dump greedy outputs as JSON.

    python tests/e2e/run_greedy.py MODEL_DIR OUT_JSON [--k 2] [--tp 1]

Each configuration runs in a fresh process, so the radiance plugin reads its RADIANCE_* knobs
exactly as a server would.
"""
from __future__ import annotations

import argparse
import json

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    '{"id": 1, "name": "alpha", "tags": ["x", "y"]}, {"id": 2, "name": "beta", "tags": [',
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "import os\nimport sys\nimport json\n\n\ndef main():\n",
    "Question: Weng earns $12 an hour for babysitting. How much did she earn?\nAnswer:",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n",
]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()

    from vllm import LLM, SamplingParams

    llm = LLM(model=args.model, dtype="bfloat16", tensor_parallel_size=args.tp,
              speculative_config={"method": "mtp", "num_speculative_tokens": args.k},
              enable_prefix_caching=False, max_model_len=512, max_num_seqs=8,
              kv_cache_memory_bytes=256 << 20, enforce_eager=True, disable_log_stats=False, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()
               if m.name.startswith("vllm:spec_decode") and getattr(m, "value", None) is not None}
    with open(args.out, "w") as f:
        json.dump({"token_ids": [list(o.outputs[0].token_ids) for o in outs],
                   "texts": [o.outputs[0].text for o in outs], "metrics": metrics}, f)


if __name__ == "__main__":
    main()
