"""Record the MTP drafter's per-slot top-1 confidences of the trained tiny Qwen3.5 on real vLLM (CPU),
for benchmarks that replay real stop patterns (bench_draft_lookahead.py).

    python benchmarks/record_draft_confidences.py [--out benchmarks/data/tiny_qwen35_draft_confidences.json]

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) with dynamic-draft on, tau 0 and
no forward cap, so every step runs all k = 8 slots and the controller sees every slot's numbers; what
it is given is recorded (``StepController.observe``): per step, per slot, each request's confidence.
The n-gram matcher is switched off here, so no request stops early on a match.
Prompts: code, JSON and prose, alone and 8 at a time, 96 tokens each, greedy.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "models" / "tiny-qwen3.5-trained"
PROMPTS = [
    "def f0(x):\n    return x + 0\n\ndef f1(x):\n    return x + 1\n\ndef f2(x):\n",
    "import json\nimport os\nimport sys\n\n\ndef main(argv=None):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n",
    '[{"id": 1, "name": "a", "ok": true}, {"id": 2, "name": "b", "ok": true}, {"id": 3, "name": ',
    '{"users": [{"name": "x", "age": 3}, {"name": "y", "age": 4}, {"name": "z", "age": ',
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
]
K = 8


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "data" / "tiny_qwen35_draft_confidences.json"))
    args = ap.parse_args()
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", RADIANCE_ENABLE="1", RADIANCE_DYNAMIC_DRAFT="1",
                      RADIANCE_DRAFT_TAU="0", RADIANCE_DRAFT_SCHEDULE="", VLLM_TARGET_DEVICE="cpu")
    from radiance.draft import controller

    steps: list[list[list[float]]] = []
    current: list[list[float]] = []
    real_observe = controller.StepController.observe

    def observe(self, j, tokens, confs):
        nonlocal current
        if j == 0 and current:
            steps.append(current)
            current = []
        current.append([round(float(c), 5) for c in confs])
        return real_observe(self, j, tokens, confs)

    controller.StepController.observe = observe
    # No n-gram continuations: a row that matched one would stop drafting and its later slots would
    # go unrecorded; the replay decides with the drafter's confidences alone.
    import torch

    from radiance.kernels import ngram_match as nm

    def no_ngram(ctx, n, k, size):
        b = ctx.shape[0]
        return torch.full((b, k), -1, dtype=torch.int32), torch.zeros(b, dtype=torch.int32)

    nm.ngram_match = no_ngram
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(MODEL), dtype="bfloat16", speculative_config={"method": "mtp", "num_speculative_tokens": K},
              enable_prefix_caching=False, max_model_len=512, max_num_seqs=8, kv_cache_memory_bytes=256 << 20,
              enforce_eager=True, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    t0 = time.time()
    for p in PROMPTS:
        llm.generate([p], params, use_tqdm=False)
    llm.generate(PROMPTS, params, use_tqdm=False)
    if current:
        steps.append(current)
    full = [s for s in steps if len(s) == K]
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    out = {"what": "per step, per draft slot (k=8), each request's top-1 draft confidence",
           "model": "models/tiny-qwen3.5-trained (MTP, vLLM 0.32 CPU)", "date": time.strftime("%Y-%m-%d"),
           "commit": commit, "prompts": len(PROMPTS), "seconds": round(time.time() - t0, 1),
           "steps": full}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, separators=(",", ":")))
    rows = sum(len(s[0]) for s in full)
    print(f"recorded {len(full)} steps ({rows} request-steps) to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
