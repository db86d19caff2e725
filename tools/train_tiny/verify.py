"""Check the trained tiny model on real vLLM (CPU): MTP acceptance by content, and output agreement.

    python -m tools.train_tiny.verify --model models/tiny-qwen3next-trained --json results.json

Runs one vLLM engine per configuration (non-speculative, MTP k=2, MTP k=8), each in its own
subprocess, greedy decoding with a fixed length, and compares:
- the torch re-implementation against vLLM's non-speculative greedy output, teacher-forced: at every
  position, does our argmax pick vLLM's token, and if not, by how small a logit gap (is the
  trainer's model the model vLLM runs?);
- speculative vs non-speculative outputs;
- acceptance (spec-decode counters) on code/JSON vs prose prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

MAX_TOKENS = 64

CODE_PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "import os\nimport sys\n\n\ndef main(argv=None):\n    if argv is None:\n",
    "    def __repr__(self):\n        return '%s(%r)' % (self.__class__.__name__,",
    "for key, value in sorted(mapping.items()):\n    if value is None:\n        continue\n",
    "try:\n    import json\nexcept ImportError:\n    json = None\n\n\ndef load(path):\n",
    "x1 = values[1]\nx2 = values[2]\nx3 = values[3]\nx4 = values[4]\n",
    "def _check_arg(name, value, expected):\n    if not isinstance(value, expected):\n        raise TypeError(",
]


def json_prompts() -> list[str]:
    from tools.train_tiny.data import json_document

    rng = random.Random(20240)
    out = []
    while len(out) < 8:
        doc = json_document(rng)
        if len(doc) > 120:
            out.append(doc[: len(doc) // 2])
    return out


def prose_prompts(gsm8k_dir: Path | None) -> list[str]:
    from tools.tinymodel.corpus import default_gsm8k_dir

    path = (gsm8k_dir or default_gsm8k_dir()) / "test.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()[:8]
    return [" ".join(json.loads(line)["question"].split()[:24]) for line in lines]


def run_engine(model: str, spec: int, prompts: dict[str, list[str]]) -> dict:
    """Runs inside a fresh process: one engine, each category generated as one batch."""
    from vllm import LLM, SamplingParams

    kwargs = {}
    if spec:
        kwargs["speculative_config"] = {"method": "mtp", "num_speculative_tokens": spec}
    t0 = time.time()
    llm = LLM(model=model, dtype="bfloat16", enable_prefix_caching=False, max_model_len=1024,
              max_num_seqs=8, kv_cache_memory_bytes=256 << 20, enforce_eager=True,
              disable_log_stats=False, seed=0, **kwargs)
    load_s = time.time() - t0
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)

    def counters() -> dict:
        out = {}
        for m in llm.get_metrics():
            if m.name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                          "vllm:spec_decode_num_accepted_tokens"):
                out[m.name.split(":")[1]] = m.value
            elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
                out["accepted_per_pos"] = list(m.values)
        return out

    result = {"spec": spec, "load_s": round(load_s, 1), "categories": {}}
    for cat, plist in prompts.items():
        before = counters()
        t1 = time.time()
        outs = llm.generate(plist, params, use_tqdm=False)
        gen_s = time.time() - t1
        after = counters()
        entry = {"tokens": [list(o.outputs[0].token_ids) for o in outs],
                 "prompt_ids": [list(o.prompt_token_ids) for o in outs],
                 "gen_s": round(gen_s, 2),
                 "tok_per_s": round(len(plist) * MAX_TOKENS / gen_s, 1)}
        if spec:
            d = {k: after.get(k, 0) - before.get(k, 0) for k in ("spec_decode_num_drafts",
                 "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")}
            per_pos = [a - b for a, b in zip(after.get("accepted_per_pos", []), before.get("accepted_per_pos", [0] * spec))]
            drafts = max(1, d["spec_decode_num_drafts"])
            entry.update(d)
            entry["acceptance_rate"] = round(d["spec_decode_num_accepted_tokens"] / max(1, d["spec_decode_num_draft_tokens"]), 4)
            entry["mean_accepted_len"] = round(1 + d["spec_decode_num_accepted_tokens"] / drafts, 3)
            entry["per_pos_rate"] = [round(x / drafts, 3) for x in per_pos]
        result["categories"][cat] = entry
    return result


class TorchReference:
    """The trainer's torch model on the exported weights, fp32 on CPU."""

    def __init__(self, model_dir: Path):
        import torch
        from safetensors.torch import load_file

        from tools.tinymodel.config import arch_of
        from tools.train_tiny.model import TinyModel, from_checkpoint

        # One thread: on a small, shared CPU the OpenMP pool makes these tiny ops 30x slower.
        torch.set_num_threads(1)
        self.torch = torch
        self.model = TinyModel(arch_of(json.loads((model_dir / "config.json").read_text())))
        from_checkpoint(self.model, load_file(str(model_dir / "model.safetensors")))
        self.model.eval()

    def logits(self, ids: list[int]):
        with self.torch.no_grad():
            return self.model.lm_head(self.model.hidden(self.torch.tensor([ids])))[0].float()

    def teacher_forced(self, prompt: list[int], tokens: list[int]) -> tuple[int, list[float]]:
        """Positions where our argmax equals vLLM's greedy token, and our logit gap where it does not."""
        logits = self.logits(prompt + tokens)[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
        ours = logits.argmax(-1)
        gaps = [round(float(logits[i, ours[i]] - logits[i, t]), 4) for i, t in enumerate(tokens) if ours[i] != t]
        return len(tokens) - len(gaps), gaps

    def gap_at(self, prompt: list[int], a: list[int], i: int, b: list[int]) -> float:
        row = self.logits(prompt + a[:i])[-1]
        return round(abs(float(row[a[i]] - row[b[i]])), 4)


def _first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(a: dict, b: dict, ref: TorchReference | None = None) -> dict:
    """Identical outputs per category; where they differ, the index and (with ``ref``) how close the
    two tokens were in the reference model's logits at that point: a tiny gap means a near-tie that
    bf16 rounding in a different batch shape can flip."""
    out = {}
    for cat in a["categories"]:
        ea, eb = a["categories"][cat], b["categories"][cat]
        entry = {"identical": 0, "of": len(ea["tokens"]), "first_diff": [], "logit_gap_at_diff": []}
        for prompt, ta, tb in zip(ea["prompt_ids"], ea["tokens"], eb["tokens"]):
            d = _first_diff(ta, tb)
            if d is None:
                entry["identical"] += 1
                continue
            entry["first_diff"].append(d)
            if ref is not None and d < min(len(ta), len(tb)):
                entry["logit_gap_at_diff"].append(ref.gap_at(prompt, ta, d, tb))
        out[cat] = entry
    return out


def torch_vs_vllm(ref: TorchReference, run: dict) -> dict:
    out = {}
    for cat, e in run["categories"].items():
        agree, total, gaps, greedy_same = 0, 0, [], 0
        for prompt, tokens in zip(e["prompt_ids"], e["tokens"]):
            n_ok, g = ref.teacher_forced(prompt, tokens)
            agree, total, gaps = agree + n_ok, total + len(tokens), gaps + g
            greedy_same += not g  # teacher-forced agreement everywhere == identical greedy output
        out[cat] = {"argmax_agree": agree, "of_positions": total, "identical_sequences": greedy_same,
                    "of": len(e["tokens"]), "max_logit_gap": max(gaps, default=0.0)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--gsm8k-dir", type=Path, default=None)
    ap.add_argument("--engine", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--specs", default="0,2,8")
    ap.add_argument("--cache-dir", type=Path, default=None, help="keep each engine's raw result here and reuse it")
    args = ap.parse_args()
    prompts = {"code": CODE_PROMPTS, "json": json_prompts(), "prose": prose_prompts(args.gsm8k_dir)}

    if args.engine is not None:  # child process
        print("RESULT " + json.dumps(run_engine(str(args.model), args.engine, prompts)), flush=True)
        return

    runs = {}
    for spec in [int(s) for s in args.specs.split(",")]:
        cached = args.cache_dir / f"engine_k{spec}.json" if args.cache_dir else None
        if cached is not None and cached.is_file():
            runs[spec] = json.loads(cached.read_text())
            continue
        proc = subprocess.run([sys.executable, "-m", "tools.train_tiny.verify", "--model", str(args.model),
                               "--engine", str(spec)], capture_output=True, text=True, env=os.environ.copy(),
                              check=False)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not line:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"engine spec={spec} failed (rc={proc.returncode})")
        runs[spec] = json.loads(line[-1][len("RESULT "):])
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(runs[spec]))
    report: dict = {"model": str(args.model), "max_tokens": MAX_TOKENS, "runs": {}}
    for spec, run in runs.items():
        report["runs"][f"k{spec}"] = {
            "load_s": run["load_s"],
            **{cat: {k: v for k, v in e.items() if k not in ("tokens", "prompt_ids")}
               for cat, e in run["categories"].items()},
        }
    ref = TorchReference(args.model)
    if 0 in runs:
        report["torch_vs_vllm_nonspec"] = torch_vs_vllm(ref, runs[0])
        for spec, run in runs.items():
            if spec:
                report[f"k{spec}_vs_nonspec"] = compare(run, runs[0], ref)
    if 2 in runs and 8 in runs:
        report["k2_vs_k8"] = compare(runs[2], runs[8], ref)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
