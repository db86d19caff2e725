"""Train a tiny target of the Qwen3-Next family and its MTP layer (torch only; meant for the GPU machine).

    python -m tools.train_tiny.train --data .cache/train_tiny/tokens.pt --out OUT --steps N [--seed 0]
        [--arch tiny-qwen3next | tiny-qwen3.5]

Each batch mixes fixed shares of Python stdlib source, generated JSON and GSM8K questions. The loss is
next-token CE for the target plus CE for two unrolled MTP steps (predicting t+2 and t+3), so drafts
at depth 1 and 2 both learn to agree with the target. Data order and init follow ``--seed``; GPU
reductions may still differ in the last bits between runs. ``--probe K`` times K steps and exits.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tools.tinymodel.config import ARCHS
from tools.train_tiny.model import TinyModel, init_weights, to_checkpoint

MIX = {"code": 0.5, "json": 0.3, "prose": 0.2}
MTP_WEIGHTS = (0.5, 0.25)  # loss weight of MTP depth 1 and 2
AUX_WEIGHT = 0.001
EXTRA = 1 + len(MTP_WEIGHTS)  # tokens past the window that the targets need


def batch_rows(batch: int) -> dict[str, int]:
    rows = {k: round(batch * v) for k, v in MIX.items()}
    rows["code"] += batch - sum(rows.values())
    return rows


def sample(streams: dict, rows: dict, seq: int, gen: torch.Generator, device) -> torch.Tensor:
    parts = []
    for name in sorted(rows):
        data = streams[name]
        starts = torch.randint(0, data.numel() - seq - EXTRA, (rows[name],), generator=gen)
        idx = starts[:, None] + torch.arange(seq + EXTRA)[None, :]
        parts.append(data[idx])
    return torch.cat(parts).to(device=device, dtype=torch.long, non_blocking=True)


def losses(model: TinyModel, win: torch.Tensor, seq: int) -> tuple[torch.Tensor, dict]:
    ids = win[:, :seq]
    h = model.hidden(ids)
    logits = model.lm_head(h)
    main = F.cross_entropy(logits.float().flatten(0, 1), win[:, 1 : seq + 1].flatten())
    total = main
    parts = {"main": main.detach()}
    hid = h
    for depth, weight in enumerate(MTP_WEIGHTS, start=1):
        hid = model.mtp_hidden(hid, win[:, depth : seq + depth])
        ce = F.cross_entropy(model.lm_head(hid).float().flatten(0, 1), win[:, depth + 1 : seq + depth + 1].flatten())
        total = total + weight * ce
        parts[f"mtp{depth}"] = ce.detach()
    if model.arch.moe:
        total = total + AUX_WEIGHT * model.aux_loss()
    return total, parts


@torch.no_grad()
def evaluate(model: TinyModel, heldout: dict, device, seq: int = 256) -> dict:
    """Per domain: target next-token accuracy and how often MTP depth d equals the target's argmax."""
    model.eval()
    out = {}
    for name, data in sorted(heldout.items()):
        n = (data.numel() - EXTRA) // seq
        if n == 0:
            continue
        idx = torch.arange(n)[:, None] * seq + torch.arange(seq + EXTRA)[None, :]
        win = data[idx].to(device=device, dtype=torch.long)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            h = model.hidden(win[:, :seq + EXTRA - 1])
            target = model.lm_head(h).argmax(-1)  # target greedy token after position i
            res = {"acc": (target[:, :seq] == win[:, 1 : seq + 1]).float().mean().item()}
            hid = h[:, :seq]
            for depth in range(1, len(MTP_WEIGHTS) + 1):
                # Greedy drafting feeds the target's own tokens; agreement = acceptance per position.
                hid = model.mtp_hidden(hid, target[:, depth - 1 : seq + depth - 1] if depth > 1 else win[:, 1 : seq + 1])
                draft = model.lm_head(hid).argmax(-1)
                res[f"mtp{depth}_agree"] = (draft == target[:, depth : seq + depth]).float().mean().item()
        out[name] = {k: round(v, 4) for k, v in res.items()}
    model.train()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arch", choices=sorted(ARCHS), default="tiny-qwen3next")
    ap.add_argument("--probe", type=int, default=0, help="time this many steps, print s/step, exit")
    args = ap.parse_args()

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    blob = torch.load(args.data)
    streams = {k: v for k, v in blob["train"].items()}
    heldout = blob["heldout"]

    model = TinyModel(ARCHS[args.arch])
    init_weights(model, args.seed)
    model.to(device).train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "conv1d" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "conv1d" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda",
    )

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        frac = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    gen = torch.Generator().manual_seed(args.seed)
    rows = batch_rows(args.batch)
    steps = args.probe or args.steps
    log = []
    start = time.time()
    for step in range(steps):
        if args.probe and step == 3:
            torch.cuda.synchronize() if device.type == "cuda" else None
            start = time.time()
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        win = sample(streams, rows, args.seq, gen, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss, parts = losses(model, win, args.seq)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            entry = {"step": step, "lr": round(lr_at(step), 6), "elapsed_s": round(time.time() - start, 1),
                     **{k: round(v.item(), 4) for k, v in parts.items()}}
            log.append(entry)
            print(json.dumps(entry), flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.time() - start
    if args.probe:
        print(json.dumps({"probe_s_per_step": round(elapsed / max(1, steps - 3), 4)}), flush=True)
        return

    result = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "mix": MIX, "mtp_weights": MTP_WEIGHTS, "data_info": blob.get("info"),
        "train_seconds": round(elapsed, 1), "final": log[-1], "log": log,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "heldout": evaluate(model, heldout, device),
    }
    print(json.dumps({"heldout": result["heldout"]}), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        tensors = to_checkpoint(model)
        names = list(tensors)
        half = len(names) // 2  # two files: each must stay under the 16 MB the device returns
        torch.save({n: tensors[n] for n in names[:half]}, args.out / "weights_a.pt")
        torch.save({n: tensors[n] for n in names[half:]}, args.out / "weights_b.pt")
        (args.out / "train_log.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
