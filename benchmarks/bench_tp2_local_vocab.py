"""Benchmark: draft token + confidence at TP=2 from vocabulary shards, local vs gathered.

Each rank holds a [B, V_shard] bf16 logits shard (vocab-parallel lm_head layout, padding at
the end of the last shard, excluded by ``n_valid``; the padding holds a huge logit so a leak
would show). Providers:
  local        radiance.draft.local_vocab.sample_top1: draft_confidence on the shard, an
               all_gather of a [B, 3] fp32 tensor, the cross-rank logsumexp combine
  gather_stock all_gather of the shard, the full row, fp32 softmax + max, argmax (stock)
  gather_ours  all_gather of the shard, then draft_confidence on the full row (same kernel
               as local: isolates the cost of moving the row)
Checks (every rank): token ids identical across the three and equal to the fp64 argmax of the
full row; confidence max abs diff against the gathered softmax and against fp64.
Times: "eager" (calls back to back, host launch cost included) and "graph" (calls replayed
from a CUDA graph: no host cost), median over trials, the slower rank.

    python benchmarks/bench_tp2_local_vocab.py [--json out.json]        # spawns 2 processes
    torchrun --nproc-per-node 2 benchmarks/bench_tp2_local_vocab.py ...
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _tp2_common import device, launch, report, time_providers

VOCABS = (151936, 248320)
# Both vocabularies are multiples of 64 * 2, so vLLM's own padding is empty at TP=2; shards are
# padded to a multiple of this many columns instead, to put padding on the last shard.
PAD_TO = 1024
PAD_VALUE = 1e4


def make_case(vocab: int, b: int, rank: int, world: int, device, pad_to: int = PAD_TO):
    """(full row on CPU, this rank's padded shard on device, vocab_start, n_valid), the same
    full row on every rank (seeded by the vocabulary size)."""
    g = torch.Generator().manual_seed(vocab + b)
    full = (torch.randn(b, vocab, generator=g) * 4).to(torch.bfloat16)
    per = -(-vocab // (pad_to * world)) * pad_to
    start = rank * per
    n_valid = max(0, min(per, vocab - start))
    shard = torch.full((b, per), PAD_VALUE, dtype=torch.bfloat16)
    shard[:, :n_valid] = full[:, start:start + n_valid]
    return full, shard.to(device), start, n_valid


def providers(shard: torch.Tensor, start: int, n_valid: int, vocab: int, world: int):
    from radiance.draft.local_vocab import sample_top1
    from radiance.kernels.draft_confidence import draft_confidence

    b, per = shard.shape
    stats_all = torch.empty(world * b, 3, dtype=torch.float32, device=shard.device)
    rows_all = torch.empty(world * b, per, dtype=shard.dtype, device=shard.device)

    def gather_stats(stats):
        dist.all_gather_into_tensor(stats_all, stats)
        return stats_all.view(world, b, 3).transpose(0, 1)

    def gather_row():
        dist.all_gather_into_tensor(rows_all, shard)
        return rows_all.view(world, b, per).transpose(0, 1).reshape(b, world * per)[:, :vocab]

    def local():
        return sample_top1(shard, start, n_valid, gather_stats)

    def gather_stock():
        row = gather_row()
        conf = torch.softmax(row, dim=-1, dtype=torch.float32).max(dim=-1).values
        return row.argmax(dim=-1), conf

    def gather_ours():
        _, total, idx = draft_confidence(gather_row(), -1)
        return idx, 1.0 / total

    return {"local": local, "gather_stock": gather_stock, "gather_ours": gather_ours}


def check(rank: int, world: int, vocab: int, b: int = 8) -> dict:
    """Correctness of the local path against the gathered ones on this rank."""
    dev = device()
    full, shard, start, n_valid = make_case(vocab, b, rank, world, dev)
    fns = providers(shard, start, n_valid, vocab, world)
    out = {k: fn() for k, fn in fns.items()}
    x = full.double()
    ref_tok = x.argmax(dim=-1)
    ref_conf = torch.softmax(x, dim=-1).max(dim=-1).values
    tok = {k: v[0].cpu() for k, v in out.items()}
    conf = {k: v[1].float().cpu() for k, v in out.items()}
    return {
        "vocab": vocab, "B": b, "n_valid": n_valid, "shard_cols": shard.shape[1],
        "tokens_equal": all(torch.equal(t, ref_tok) for t in tok.values()),
        "conf_maxabs_local_vs_gather_stock": float((conf["local"] - conf["gather_stock"]).abs().max()),
        "conf_maxabs_local_vs_gather_ours": float((conf["local"] - conf["gather_ours"]).abs().max()),
        "conf_maxabs_local_vs_fp64": float((conf["local"].double() - ref_conf).abs().max()),
        "conf_maxrel_local_vs_fp64": float(((conf["local"].double() - ref_conf).abs() / ref_conf).max()),
        "conf_min": float(ref_conf.min()), "conf_max": float(ref_conf.max()),
    }


def _worker(rank: int, world: int, json_path, b: int, quick: bool):
    rows, checks = [], []
    for vocab in VOCABS:
        c = check(rank, world, vocab, b)
        checks.append(c)
        if rank == 0:
            print(f"V={vocab}: tokens equal={c['tokens_equal']}, conf max|diff| local vs "
                  f"gathered softmax {c['conf_maxabs_local_vs_gather_stock']:.3g}, vs fp64 "
                  f"{c['conf_maxabs_local_vs_fp64']:.3g} (rel {c['conf_maxrel_local_vs_fp64']:.3g})",
                  flush=True)
        dev = device()
        _, shard, start, n_valid = make_case(vocab, b, rank, world, dev)
        rows += time_providers(providers(shard, start, n_valid, vocab, world), quick, vocab=vocab, B=b)
    if rank == 0:
        report("tp2_local_vocab", rows, ("vocab", "B"), json_path, world, pad_to=PAD_TO, checks=checks)
    ok = all(c["tokens_equal"] for c in checks)
    if not ok:
        raise SystemExit(f"rank {rank}: token ids differ")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if torch.cuda.device_count() < 2:
        print("needs two GPUs", file=sys.stderr)
        return 2
    launch(_worker, (args.json, args.batch, args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
