"""Run real vLLM (CPU) once, quantised with radiance_fp8, and dump greedy outputs as JSON.

    python tests/e2e/fp8_stream_greedy.py MODEL_DIR OUT_JSON [--tp 2]

Every prompt is generated alone and then all of them in one batch (different M in every GEMM
and epilogue). The top-2 logprobs of each generated token give the greedy margins. Each
configuration runs in a fresh process, so the radiance plugin reads its RADIANCE_* knobs
exactly as a server would.
"""
from __future__ import annotations

import argparse
import json

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many in May.",
    '{"id": 1, "name": "alpha", "tags": ["x", "y"]}, {"id": 2, "name": "beta", "tags": [',
    "Question: Weng earns $12 an hour for babysitting. How much did she earn?\nAnswer:",
]


def _margins(out) -> list[float]:
    margins = []
    for step in out.outputs[0].logprobs or []:
        top = sorted((lp.logprob for lp in step.values()), reverse=True)
        if len(top) >= 2:
            margins.append(top[0] - top[1])
    return margins


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--quantization", default="radiance_fp8")
    args = p.parse_args()

    from vllm import LLM, SamplingParams

    llm = LLM(model=args.model, dtype="bfloat16", tensor_parallel_size=args.tp,
              quantization=args.quantization or None, enable_prefix_caching=False,
              max_model_len=512, max_num_seqs=8, enforce_eager=True, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True, logprobs=2)
    alone = [llm.generate([prompt], params, use_tqdm=False)[0] for prompt in PROMPTS]
    batched = llm.generate(PROMPTS, params, use_tqdm=False)
    margins = [m for o in alone + batched for m in _margins(o)]
    with open(args.out, "w") as f:
        json.dump({"alone": [list(o.outputs[0].token_ids) for o in alone],
                   "batched": [list(o.outputs[0].token_ids) for o in batched],
                   "texts": [o.outputs[0].text for o in batched],
                   "min_margin": min(margins) if margins else None,
                   "margins_below_0.05": sum(m < 0.05 for m in margins),
                   "n_tokens": len(margins)}, f)


if __name__ == "__main__":
    main()
