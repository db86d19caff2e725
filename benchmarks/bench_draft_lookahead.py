"""Benchmark (GPU): dynamic-draft's per-slot decision, waited for (today) vs decided while the next
slot's forward runs (look-ahead), through the plugin's own hooks and controller.

    python benchmarks/bench_draft_lookahead.py [--json out.json] [--steps 40] [--batches 1,8,32] [--ks 2,4,8]

What runs is radiance's code: ``DynamicDraftPatch.start_step``, the proposer's hooks ``propose`` and
``_sample_draft_tokens`` (the capture kernel, the host copy, the controller, the loop-break), around a
stand-in for vLLM's MTP drafting loop (vLLM cannot run on this GPU host): per slot, the forward is
drafter-sized work at Qwen3.5-27B's TP=2 per-rank shapes -- a 17408x5120 bf16 GEMV (the MTP layer's
gate_up) and the 124160x5120 head GEMV -- then the capture. The controller's verdicts follow real
stop patterns: each request's confidences replay a request-step recorded from the trained tiny
Qwen3.5 on vLLM CPU (benchmarks/data/tiny_qwen35_draft_confidences.json, record_draft_confidences.py),
written into the logits the capture reads (a token whose softmax probability is that confidence).
Default policy (tau 0.28, schedule 1:8,2:7,4:6,8:5,16:4).

Per (B, k, eager | graph): wall time per step (until the device is idle again: a forward that ran
ahead is paid for), forwards per step, and the exposed wait per slot: each step's wall time minus
that of vLLM's own loop without the patch running the same number of forwards (argmax per slot, the
drafts read to the host once at the end, as vLLM's synchronous runner does), summed over the steps and
divided by the slots decided. ``graph``: each slot's forward (both GEMVs) is one CUDA-graph replay.
The drafts of both modes are compared step by step: look-ahead must hand vLLM the same drafts.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from radiance.draft import patch_proposer as pp  # noqa: E402
from radiance.draft.controller import DraftPolicy  # noqa: E402
from radiance.draft.lookahead import _HostRing  # noqa: E402
from radiance.draft.slot_capture import ProposerHooks  # noqa: E402

# vLLM's TP group is a boundary that does not exist on this host (no vLLM): one rank. (Asked of
# vLLM, the question costs a cached attribute lookup; a failing import would cost far more.)
pp.DynamicDraftPatch._tp = staticmethod(lambda: (1, 0))

HIDDEN, MLP, VOCAB = 5120, 17408, 124160   # Qwen3.5-27B, per rank at TP=2 (head: 248320 / 2)
DEV = "cuda"
DATA = REPO / "benchmarks" / "data" / "tiny_qwen35_draft_confidences.json"


def _sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def trajectories(path: Path) -> list[list[float]]:
    """Every recorded request-step: its confidences at slots 0..7."""
    steps = json.loads(path.read_text())["steps"]
    out = []
    for s in steps:
        for i in range(len(s[0])):
            out.append([s[j][i] for j in range(len(s))])
    return out


def conf_logit(c: float) -> float:
    """The logit of a token, all others 0, whose softmax probability over VOCAB is ``c``."""
    c = min(max(c, 1.5 / VOCAB), 0.999999)
    return math.log(c * (VOCAB - 1) / (1.0 - c))


class Drafter:
    """vLLM's MTP loop, reduced to what costs time: a forward per slot, then the sampling hook."""

    def __init__(self, b: int, graph: bool):
        g = torch.Generator(device=DEV).manual_seed(0)
        self.w_mlp = torch.randn(MLP, HIDDEN, device=DEV, dtype=torch.bfloat16, generator=g) * 0.01
        self.w_head = torch.randn(VOCAB, HIDDEN, device=DEV, dtype=torch.bfloat16, generator=g) * 0.01
        self.x = torch.randn(b, HIDDEN, device=DEV, dtype=torch.bfloat16, generator=g)
        self.input_ids = torch.zeros(b, dtype=torch.int32, device=DEV)
        self.b = b
        self.device = torch.device(DEV)
        self.model = types.SimpleNamespace(compute_logits=self.compute_logits)
        self.slot_logits: list[torch.Tensor] = []
        self.forwards = 0
        self.timeline: list | None = None   # (start, end) events per forward, when gaps are measured
        self.graph = None
        self.out = torch.empty(b, VOCAB, device=DEV, dtype=torch.bfloat16)
        if graph:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    self._work()
            torch.cuda.current_stream().wait_stream(s)
            graph_ = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph_):
                self._work()
            self.graph = graph_

    def _work(self):
        h = (self.x @ self.w_mlp.T)[:, :HIDDEN]
        torch.matmul(h, self.w_head.T, out=self.out)

    def forward(self):
        self.forwards += 1
        if self.timeline is not None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        if self.graph is not None:
            self.graph.replay()
        else:
            self._work()
        if self.timeline is not None:
            end.record()
            self.timeline.append((start, end))
        return self.x

    def idle_gaps(self) -> list[float]:
        """µs the device sat between one forward's end and the next one's start, this step."""
        t = self.timeline or []
        return [t[i][1].elapsed_time(t[i + 1][0]) * 1e3 for i in range(len(t) - 1)]

    def compute_logits(self, hidden):
        # the head GEMV ran in the forward; the capture reads logits with this slot's recorded confidences
        return self.slot_logits[self.forwards - 1]

    def stock_sample(self, hidden, md):
        return self.compute_logits(hidden).argmax(-1), None

    def stock_propose(self, k, *args, **kwargs):
        h = self.forward()
        tok, _ = self._sample_draft_tokens(h, None)
        out = [tok]
        for _ in range(k - 1):
            self.input_ids.copy_(out[-1])  # vLLM writes the draft into the next forward's inputs
            h = self.forward()
            tok, _ = self._sample_draft_tokens(h, None)
            out.append(tok)
        return torch.stack(out, dim=1)

    # vLLM's names: what the proposer's hooks replace (each mode below hooks them, then reverts)
    propose, _sample_draft_tokens = stock_propose, stock_sample


def make_logits(confs: list[list[float]], k: int) -> list[torch.Tensor]:
    """Per slot, [B, VOCAB] logits whose top-1 probability is each request's recorded confidence."""
    b = len(confs)
    out = []
    for j in range(k):
        z = torch.zeros(b, VOCAB, device=DEV, dtype=torch.bfloat16)
        vals = torch.tensor([conf_logit(confs[i][j]) for i in range(b)], device=DEV, dtype=torch.bfloat16)
        ids = torch.tensor([(17 * i + 101 * j) % VOCAB for i in range(b)], device=DEV)
        z.scatter_(1, ids[:, None], vals[:, None])
        out.append(z)
    return out


def run_config(b: int, k: int, graph: bool, trajs: list[list[float]], steps: int) -> dict:
    drafter = Drafter(b, graph)
    per_mode = {}
    # the device time of one slot: forward + capture, back to back, no host read
    logits = make_logits([trajs[i % len(trajs)] for i in range(b)], 1)[0]
    from radiance.kernels.draft_confidence import draft_top1  # the TP=1 slot's capture + packing

    for _ in range(5):
        drafter.forward()
        draft_top1(logits, VOCAB)
    _sync()
    n = 50
    t0 = time.perf_counter()
    for _ in range(n):
        drafter.forward()
        draft_top1(logits, VOCAB)
    _sync()
    slot_us = (time.perf_counter() - t0) * 1e6 / n  # the host is far ahead: this is device time
    # vLLM's loop without the patch, n forwards: what a step costs with no per-slot decision at all
    drafter.slot_logits = make_logits([trajs[i % len(trajs)] for i in range(b)], k)
    stock_us = {}
    for fw in range(1, k + 1):
        ws = []
        for _ in range(13):
            _sync()
            drafter.forwards = 0
            t0 = time.perf_counter()
            Drafter.stock_propose(drafter, fw).tolist()
            _sync()
            ws.append((time.perf_counter() - t0) * 1e6)
        stock_us[fw] = statistics.median(ws[3:])
    # the device work between two forwards when the host is far ahead (the capture, the packing and
    # the host copy of the slot, the next input): the floor of the gap; above it, the device waited
    floor_gaps = []
    if DEV == "cuda":
        ring = _HostRing()
        for rep in range(3):
            drafter.timeline = []
            for j in range(8):
                drafter.forward()
                t, row = draft_top1(logits, VOCAB)
                ring.copy(ring.SLOT + j, row)
                drafter.input_ids.copy_(t)
            _sync()
            if rep:
                floor_gaps += drafter.idle_gaps()
        drafter.timeline = None
    stock_gaps = []
    if DEV == "cuda":
        for _ in range(10):
            drafter.forwards, drafter.timeline = 0, []
            Drafter.stock_propose(drafter, k).tolist()
            _sync()
            stock_gaps += drafter.idle_gaps()
        drafter.timeline = None
    drafts_by_mode = {}
    for mode in ("0", "1"):
        patch = pp.DynamicDraftPatch()
        patch.policy = DraftPolicy()
        patch.lookahead = mode
        patch.hook(ProposerHooks, owner=Drafter)  # the proposer's hooks, as on vLLM's proposer
        propose = drafter.propose
        walls, fws, decided, all_drafts, excess, hosts, starts, gaps = [], [], [], [], [], [], [], []
        # pass 0 times the steps; pass 1 repeats them with an event around each forward (the device's
        # idle time between forwards; the event records cost host time, so walls come from pass 0)
        for timed in ((False, True) if DEV == "cuda" else (False,)):
            for s in range(steps + 3):
                confs = [trajs[(s * b + i) % len(trajs)] for i in range(b)]
                drafter.slot_logits = make_logits(confs, k)
                ngram = torch.cat([torch.full((b, k), -1, dtype=torch.int32, device=DEV),
                                   torch.zeros(b, 1, dtype=torch.int32, device=DEV)], dim=1)
                _sync()
                drafter.forwards = 0
                drafter.timeline = [] if timed else None
                patch.slots_observed = 0
                t0 = time.perf_counter()
                patch.start_step(drafter, k, True, [f"r{i}" for i in range(b)], ngram)
                t_start = time.perf_counter()
                drafts = propose(k)
                t_host = time.perf_counter()
                _sync()
                wall = (time.perf_counter() - t0) * 1e6
                assert isinstance(drafts, list) and len(drafts) == b, drafts
                if s < 3:  # warm-up steps dropped
                    continue
                if timed:
                    gaps += drafter.idle_gaps()
                    continue
                all_drafts.append(drafts)
                walls.append(wall)
                excess.append(wall - stock_us[drafter.forwards])
                hosts.append((t_host - t0) * 1e6)
                starts.append((t_start - t0) * 1e6)
                fws.append(drafter.forwards)
                decided.append(patch.slots_observed)
        drafter.timeline = None
        patch.revert()
        wall = statistics.median(walls)
        fw = statistics.mean(fws)
        slots = statistics.mean(decided)
        per_mode["lookahead" if mode == "1" else "today"] = {
            "wall_us_per_step": round(wall, 1), "forwards_per_step": round(fw, 2),
            "slots_decided_per_step": round(slots, 2),
            "host_us_per_step": round(statistics.median(hosts), 1),
            "gpu_idle_us_between_slots": round(statistics.mean(gaps), 1) if gaps else None,
            "gpu_idle_us_between_slots_median": round(statistics.median(gaps), 1) if gaps else None,
            "gpu_idle_us_between_slots_p90": round(sorted(gaps)[int(0.9 * len(gaps))], 1) if gaps else None,
            "start_step_us": round(statistics.median(starts), 1),
            "exposed_wait_us_per_slot": round(max(0.0, sum(excess) / max(sum(decided), 1)), 1),
            "exposed_wait_us_per_slot_median_step": round(max(0.0, statistics.median(excess) / max(slots, 1e-9)), 1),
            "patch_applied_state": "latched" if patch.latched_off else "ok"}
        if patch.latched_off:
            raise RuntimeError(f"the patch latched off: {patch.latch_reason}")
        drafts_by_mode[mode] = all_drafts
    # the look-ahead must hand vLLM the very drafts the synchronous path decides
    same = drafts_by_mode["0"] == drafts_by_mode["1"]
    if not same:
        raise RuntimeError(f"B={b} k={k} graph={graph}: look-ahead drafts differ from today's")
    return {"drafts_identical": same, "B": b, "k": k, "graph": graph, "slot_device_us": round(slot_us, 1),
            "stock_loop_us": {n: round(v, 1) for n, v in stock_us.items()},
            "stock_gpu_idle_us_between_slots": round(statistics.mean(stock_gaps), 1) if stock_gaps else None,
            "device_work_us_between_slots": round(statistics.median(floor_gaps), 1) if floor_gaps else None,
            **per_mode}


def host_costs(b: int, k: int) -> dict:
    """Host µs of the pieces a step is made of (mean of 200), to say where per-step time goes."""
    from radiance.draft.controller import StepController

    t = torch.zeros(3 * b, dtype=torch.int32, device=DEV)
    ring = _HostRing()
    pol = DraftPolicy()
    conts, clens = [[-1] * k for _ in range(b)], [0] * b
    toks, confs = list(range(b)), [0.5] * b

    def alloc_copy():
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=DEV == "cuda")
        host.copy_(t, non_blocking=True)
        if DEV == "cuda":
            torch.cuda.Event().record()

    def observe():
        ctl = StepController(pol)
        ctl.begin(k, conts, clens)
        ctl.observe(0, toks, confs)

    from radiance.draft.local_vocab import sample_top1
    from radiance.kernels.draft_confidence import draft_top1

    logits = torch.zeros(b, VOCAB, device=DEV, dtype=torch.bfloat16)

    def capture_then_pack():  # the per-slot launches before the capture packed its own row
        tok, conf = sample_top1(logits, 0, VOCAB)
        torch.cat([tok.to(torch.int32), conf.float().view(torch.int32)])

    out = {}
    for name, fn in (("pinned_alloc_copy_event", alloc_copy), ("ring_copy_event", lambda: ring.copy(3, t)),
                     ("controller_new_begin_observe", observe),
                     ("cat_to_int32", lambda: torch.cat([t[:b].to(torch.int32), t[:b].float().view(torch.int32)])),
                     ("capture_then_pack", capture_then_pack),
                     ("draft_top1_packed_capture", lambda: draft_top1(logits, VOCAB))):
        for _ in range(20):
            fn()
        _sync()
        t0 = time.perf_counter()
        for _ in range(200):
            fn()
        out[name] = round((time.perf_counter() - t0) * 1e6 / 200, 2)
        _sync()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--ks", default="2,4,8")
    ap.add_argument("--data", default=str(DATA), help="recorded confidences (record_draft_confidences.py)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the script runs")
    args = ap.parse_args()
    global DEV, HIDDEN, MLP, VOCAB
    if args.smoke:
        DEV, HIDDEN, MLP, VOCAB = "cpu", 64, 256, 1000
        args.steps, args.batches, args.ks = 3, "1,8", "2,4"
    elif not torch.cuda.is_available():
        print("needs a CUDA or ROCm GPU (or --smoke)", file=sys.stderr)
        return 2
    trajs = trajectories(Path(args.data))
    costs = {b: host_costs(b, 8) for b in map(int, args.batches.split(","))}
    print(f"host costs (us): {costs}", flush=True)
    rows = []
    for graph in ((False,) if args.smoke else (False, True)):
        for b in map(int, args.batches.split(",")):
            for k in map(int, args.ks.split(",")):
                r = run_config(b, k, graph, trajs, args.steps)
                rows.append(r)
                t, la = r["today"], r["lookahead"]
                print(f"{'graph' if graph else 'eager'} B={b:3d} k={k}: slot {r['slot_device_us']:7.1f} us, stock "
                      f"{r['stock_loop_us'][k]:7.1f} us at k | host {t['host_us_per_step']:.0f}/{la['host_us_per_step']:.0f} "
                      f"(start {la['start_step_us']:.0f}) | today "
                      f"{t['wall_us_per_step']:8.1f} us/step, {t['forwards_per_step']:.2f} fw, wait "
                      f"{t['exposed_wait_us_per_slot']:5.1f} us/slot | look-ahead {la['wall_us_per_step']:8.1f} us/step, "
                      f"{la['forwards_per_step']:.2f} fw, wait {la['exposed_wait_us_per_slot']:5.1f} us/slot | gpu idle "
                      f"between slots (device work {r['device_work_us_between_slots']}): stock {r['stock_gpu_idle_us_between_slots']} today "
                      f"{t['gpu_idle_us_between_slots']} look-ahead {la['gpu_idle_us_between_slots']} us", flush=True)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    out = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu (smoke)",
           "torch": torch.__version__, "commit": commit, "trajectories": len(trajs), "host_costs_us": costs, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
