"""One engine of `radiance bench`, in a process of its own (its environment is the feature set's).

    python -m launcher.bench.worker JOB.json RESULT.json

The engine is vLLM's offline one (``vllm.LLM``, what ``vllm bench latency`` and ``throughput`` drive),
built from the same server arguments `radiance up` passes, read by vLLM's own parser. Per batch size B
it times B greedy requests of ``max_tokens`` tokens (``ignore_eos``) and the same B requests of one
token, so the difference is the decode alone; vLLM's speculative-decoding counters give the steps and
the acceptance. The outputs of the batches named in ``lossless_batches`` are re-scored in one prefill
(``launcher.bench.lossless``). Everything lands in RESULT.json, also when the engine fails.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

from ..engine_report import counter_key
from . import lossless, worker_extension
from .rounds import acceptance_label

GREEDY = dict(temperature=0.0, ignore_eos=True)   # every timed request: the same tokens, max_tokens of them
SPEC = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens")


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    model = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU: {model} ({os.cpu_count()} logical cores)"


def compile_cache_keys() -> list[str]:
    """The compile caches vLLM keeps on this machine (torch_compile_cache/<key>, .../torch_aot_compile/<key>)."""
    root = Path(os.environ.get("VLLM_CACHE_ROOT") or Path.home() / ".cache" / "vllm") / "torch_compile_cache"
    keys = []
    for d in (root, root / "torch_aot_compile"):
        if d.is_dir():
            keys += sorted(f"{d.name}/{p.name}" for p in d.iterdir() if p.is_dir() and p.name != "torch_aot_compile")
    return keys


def _metrics(llm) -> tuple[dict[str, float], list[dict]]:
    """vLLM's speculative-decoding counters (its own reader) and radiance's counters and patch rows
    (the same Prometheus registry, which vLLM's reader filters to ``vllm:`` names)."""
    import prometheus_client

    counters: dict[str, float] = {}
    for m in llm.get_metrics():
        if m.name in SPEC:
            counters[m.name] = counters.get(m.name, 0.0) + float(getattr(m, "value", 0) or 0)
    status: list[dict] = []
    for family in prometheus_client.REGISTRY.collect():
        if not family.name.startswith("radiance:"):
            continue
        for sample in family.samples:
            if family.name == "radiance:patch_status":
                if sample.value:
                    status.append({k: sample.labels.get(k, "") for k in ("rank", "feature", "patch", "status",
                                                                          "reason")})
            elif sample.name.endswith("_total"):
                key = counter_key(sample.name, sample.labels)
                counters[key] = counters.get(key, 0.0) + float(sample.value)
    return counters, status


def _delta(after: dict, before: dict) -> dict:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def _prompts(tok, texts: list[str], b: int, prompt_tokens: int) -> list[list[int]]:
    out = []
    for i in range(b):
        ids = tok.encode(texts[i % len(texts)])
        out.append(ids[:prompt_tokens] if prompt_tokens else ids)
    return out


def rescore_passes(n: int) -> list[tuple[list[int], bool]]:
    """The re-scoring passes over ``n`` prompts: (batch order, whether a companion sequence joins it). In
    order, then reversed; a lone prompt's reversal is itself, so its second pass gets a companion instead:
    no two passes prefill the same batch shape (a lone re-scored request disagreed with the engine's own
    prefill on the H200 in every pass of two sessions; see lossless.check)."""
    return [(list(range(n)), False), (list(reversed(range(n))), n == 1)]


def _rescore(llm, SamplingParams, prompts: list[list[int]], outputs: list[list[int]], eps: float):
    """Two re-scorings of every prompt + output (rescore_passes), judged by lossless.check."""
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    passes = []
    for order, companion in rescore_passes(len(prompts)):
        llm.reset_prefix_cache()
        seqs = [prompts[i] + outputs[i] for i in order]
        if companion:  # the same tokens backwards: as long, another sequence, its scores unread
            seqs.append(seqs[0][::-1])
        res = llm.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
        scored: list = [None] * len(prompts)
        for i, r in zip(order, res):
            rows = (r.prompt_logprobs or [])[len(prompts[i]):]
            scored[i] = [{int(t): (float(lp.logprob), int(lp.rank)) for t, lp in row.items()} if row else None
                         for row in rows]
        passes.append(scored)
    return lossless.check(outputs, passes, eps)


def start(job: dict):
    """The engine built from the job's server arguments; (llm, the result's engine fields)."""
    result: dict = {"set": job["set"], "device": None, "results": [], "keys_before": compile_cache_keys()}
    t0 = time.perf_counter()
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    import torch
    import vllm

    result.update(vllm=vllm.__version__, torch=torch.__version__, device=device_name())
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(job["server_args"])
    engine_args = EngineArgs.from_cli_args(ns)
    engine_args.disable_log_stats = False  # the spec-decode counters are the step count
    llm = LLM.from_engine_args(engine_args)
    result["load_s"] = round(time.perf_counter() - t0, 1)
    result["keys_after"] = compile_cache_keys()
    return llm, result


def measure(llm, job: dict, result: dict, lossless_batches: list[int], rates_now: list[float] | None):
    """Every acceptance profile in turn, every batch timed at each; rows into ``result``. ``rates_now``: the
    synthetic rates the engine runs now (the first profile's at start). Returns the rates it leaves set."""
    from vllm import SamplingParams

    tok = llm.get_tokenizer()
    verdicts = {}
    profiles = job.get("acceptance") or [None]
    job = {**job, "lossless_batches": lossless_batches}
    for rates in profiles:
        if rates is not None and rates != rates_now:
            llm.collective_rpc(worker_extension.RATES, args=(rates,))
            rates_now = rates
        if len(profiles) > 1:
            # untimed: what each profile's steps measure is not the previous profile's tail, and a policy
            # that learns acceptance from finished steps (dynamic-draft) has seen this one
            b = max(job["batches"])
            inputs = [{"prompt_token_ids": p} for p in _prompts(tok, job["prompts"], b, job.get("prompt_tokens", 0))]
            llm.generate(inputs, SamplingParams(max_tokens=job["max_tokens"], **GREEDY), use_tqdm=False)
        _batches(llm, SamplingParams, tok, job, rates, result, verdicts)
    if verdicts:
        result["lossless"] = lossless.merge(verdicts).as_dict()
    result["patch_status"] = _metrics(llm)[1]
    return rates_now


def run(job: dict) -> dict:
    llm, result = start(job)
    measure(llm, job, result, job.get("lossless_batches", []), (job.get("acceptance") or [None])[0])
    return result


TURNS = ("sleep", "wake")


def turn(llm, op: str) -> dict:
    """``--take-turns``: put the engine to sleep or wake it. vLLM's level 2: the weights are dropped with the KV
    cache and GDN state, not parked in host memory (two parked 27B engines overran the host's 125 GiB); the
    CUDA graphs stay, since the memory comes back at the same addresses. On waking the weights are drawn
    again as the dummy loader drew them (worker_extension: the profile's weights are dummy, bench's check) and
    the prefix cache is reset: the blocks it names were dropped. {"s": seconds} or {"error": ...}."""
    t = time.perf_counter()
    try:
        if op == "sleep":
            llm.collective_rpc(worker_extension.KEEP)
            llm.sleep(level=2)
        else:
            if llm.wake_up() is False:   # vLLM: some of its memory is still asleep
                return {"error": "vLLM's wake_up left the engine partly asleep"}
            llm.collective_rpc(worker_extension.REDRAW)
            llm.reset_prefix_cache()
    except Exception as exc:
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}"}
    s = round(time.perf_counter() - t, 2)
    print(f"radiance bench: {op} took {s} s", file=sys.stderr, flush=True)
    return {"s": s}


def serve(job: dict, out: Path) -> int:
    """The engine kept loaded (``--keep-reference``): ``ready`` beside RESULT once it is up (or RESULT with
    the error), then one command per line read from stdin, each answered into RESULT.N, until stdin closes: a
    measurement (``{"n": N, "lossless": bool}``) or, under ``--take-turns``, ``{"n": N, "op": "sleep"|"wake"}``.
    The driver times another engine between two measurements."""
    try:
        llm, base = start(job)
    except Exception as exc:
        traceback.print_exc()
        out.write_text(json.dumps({"set": job.get("set"), "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    (out.parent / "ready").write_text("")
    rates_now = (job.get("acceptance") or [None])[0]
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("op") in TURNS:
            result = turn(llm, cmd["op"])
            if cmd["op"] == "wake":
                # the sampler's synthetic rates live in memory vLLM allocated with the weights (Model Runner
                # V2 builds its rejection sampler in load_model), which a level-2 sleep discards: on the H100
                # every set's first profile after a wake ran at acceptance 0 until they were sent again
                rates_now = None
        else:
            result = {**base, "results": []}
            try:
                rates_now = measure(llm, job, result, job.get("lossless_batches", []) if cmd.get("lossless") else [],
                                    rates_now)
            except Exception as exc:
                traceback.print_exc()
                result = {"set": job.get("set"), "error": f"{type(exc).__name__}: {exc}"}
        tmp = out.parent / f"{out.name}.{cmd['n']}.tmp"
        tmp.write_text(json.dumps(result, indent=1))
        tmp.rename(out.parent / f"{out.name}.{cmd['n']}")  # whole or absent: the driver polls for it
    return 0


FIRST_TOKEN_RUNS = 2


def _first_token_s(llm, inputs, params) -> float:
    """The batch's time to its first token (prefill alone, ``max_tokens=1``), the shortest of two runs. It is
    taken off the timed run to leave its decode time, so a pause inside it inflates the decode speed: on the
    H100 (twenty-second session) one such run of a dynamic-draft engine waited 9.6 s before its first step,
    longer than the whole timed run, and the row read 5e11 tok/s."""
    times = []
    for _ in range(FIRST_TOKEN_RUNS):
        llm.reset_prefix_cache()
        t = time.perf_counter()
        llm.generate(inputs, params, use_tqdm=False)
        times.append(time.perf_counter() - t)
    return min(times)


def _batches(llm, SamplingParams, tok, job: dict, rates: list[float] | None, result: dict, verdicts: dict) -> None:
    """Each batch size timed at the acceptance now in force; rows appended to ``result``."""
    n = job["max_tokens"]
    for b in job["batches"]:
        prompts = _prompts(tok, job["prompts"], b, job.get("prompt_tokens", 0))
        inputs = [{"prompt_token_ids": p} for p in prompts]
        # untimed, as long as a timed run: with vLLM's JIT warm-up off, a first-seen shape compiles inside the
        # first run that meets it (on the H100, stock's first code-like B = 8 repeat ran 359 tok/s, the next two
        # 925 and 995), and a policy that learns per batch size (dynamic-draft) has seen this one
        llm.generate(inputs, SamplingParams(max_tokens=n, **GREEDY), use_tqdm=False)
        runs = []
        for _ in range(max(1, job.get("repeat", 1))):
            llm.reset_prefix_cache()
            before, _ = _metrics(llm)
            t = time.perf_counter()
            outs = llm.generate(inputs, SamplingParams(max_tokens=n, **GREEDY), use_tqdm=False)
            t_full = time.perf_counter() - t
            spec = _delta(_metrics(llm)[0], before)
            t_first = _first_token_s(llm, inputs, SamplingParams(max_tokens=1, **GREEDY))
            runs.append((t_full, t_first, spec, outs))
        t_full, t_first, spec, outs = sorted(runs, key=lambda r: r[0] - r[1])[len(runs) // 2]
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        decode_s = max(t_full - t_first, 1e-9)
        drafts = spec.get("vllm:spec_decode_num_drafts", 0.0)
        accepted = spec.get("vllm:spec_decode_num_accepted_tokens", 0.0)
        steps = drafts / b if drafts else float(n)
        row = {
            "batch": b, "output_tokens": tokens, "wall_s": round(t_full, 4), "first_token_s": round(t_first, 4),
            "tok_s": round(tokens / t_full, 1), "decode_tok_s": round(b * (n - 1) / decode_s, 1),
            "steps_per_request": round(steps, 1), "ms_per_step": round(1e3 * decode_s / max(steps - 1, 1), 3),
            "mean_acceptance_length": round(1 + accepted / drafts, 3) if drafts else None,
            "draft_tokens_per_step": round(spec.get("vllm:spec_decode_num_draft_tokens", 0.0) / drafts, 3)
            if drafts else None,
            "counters": {k: v for k, v in spec.items() if k.startswith("radiance:") and v},
            # every repeat's decode tok/s: the median above is one of them, the spread is theirs
            "decode_tok_s_repeats": sorted(round(b * (n - 1) / max(f - first, 1e-9), 1) for f, first, _, _ in runs),
        }
        if rates is not None:
            row["acceptance"] = acceptance_label(rates)
        if b in job.get("lossless_batches", []) and b not in verdicts:
            v = _rescore(llm, SamplingParams, prompts, [list(o.outputs[0].token_ids) for o in outs], job["eps"])
            row["lossless"] = v.as_dict()
            verdicts[b] = v
        result["results"].append(row)
        print(f"radiance bench: {job['set']} B={b}{' at ' + row['acceptance'] if rates is not None else ''}: "
              f"{row['decode_tok_s']} decode tok/s, {row['ms_per_step']} ms/step", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    if job.get("serve"):
        return serve(job, out)
    try:
        result = run(job)
        code = 0
    except Exception as exc:  # the parent reports it and goes on with the next set
        traceback.print_exc()
        result = {"set": job.get("set"), "error": f"{type(exc).__name__}: {exc}"}
        code = 1
    out.write_text(json.dumps(result, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
