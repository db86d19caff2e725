"""Train a tiny DFlash drafter for a trained tiny target (torch only; meant for the GPU machine).

    python -m tools.train_tiny.dflash --target models/tiny-qwen3.5-trained --data .cache/train_tiny/tokens.pt \
        --out OUT --steps N [--seed 0]

What vLLM 0.32 computes for a DFlash drafter (``qwen3_dflash.py``, ``v1/spec_decode/dflash.py``), and so
what is trained here, for a request whose target has processed positions ``< p`` and sampled the token
``x_p``:

* context: the target's residual stream after each layer of ``dflash_config.target_layer_ids``
  (vLLM's auxiliary hidden states), concatenated and projected by ``fc`` -- one vector per position
  ``< p``; each draft layer's K/V of the context come from ``hidden_norm(context)`` through that layer's
  own k / v projections (K with k_norm and rope at the context position);
* query block: ``[x_p, MASK, ..., MASK]`` at positions ``p .. p+K``, embedded with the target's
  embeddings, through the draft layers (pre-norm Qwen3 decoder layers), attending to the whole context
  and, non-causally, to the whole block; ``norm`` then the target's ``lm_head``;
* the drafts: the argmax at each MASK slot, ``p+k`` predicting the token at ``p+k``.
Training minimises the cross entropy of those K predictions, for random anchors ``p``, against the
target's own greedy token at each position given the data before it (``--labels target``, the default:
what speculative decoding accepts) or against the data (``--labels data``); the target (embeddings,
layers, head) stays frozen.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tools.tinymodel import dflash as layout
from tools.train_tiny.model import TinyModel, from_checkpoint


class RMSNorm(nn.Module):
    """Qwen3's plain RMSNorm (scale = weight, starting at one)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


def rope(x, positions, theta: float):
    """NeoX rotary embedding over the whole head: x [..., T, H, D], positions [..., T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    f = positions.float()[..., None] * inv  # [..., T, D/2]
    cos, sin = f.cos()[..., None, :], f.sin()[..., None, :]
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class DraftLayer(nn.Module):
    def __init__(self, dims: layout.Dims, theta: float):
        super().__init__()
        h, nh, nkv, hd = dims.hidden, dims.heads, dims.kv_heads, dims.head_dim
        self.nh, self.nkv, self.hd, self.theta = nh, nkv, hd, theta
        self.input_layernorm = RMSNorm(h)
        self.q_proj = nn.Linear(h, nh * hd, bias=False)
        self.k_proj = nn.Linear(h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)
        self.q_norm = RMSNorm(hd)
        self.k_norm = RMSNorm(hd)
        self.post_attention_layernorm = RMSNorm(h)
        self.gate_proj = nn.Linear(h, dims.intermediate, bias=False)
        self.up_proj = nn.Linear(h, dims.intermediate, bias=False)
        self.down_proj = nn.Linear(dims.intermediate, h, bias=False)

    def context_kv(self, ctx_normed, positions):
        """K/V of the context (already hidden_norm-ed): [B, T, nkv, hd] each."""
        b, t, _ = ctx_normed.shape
        k = self.k_norm(self.k_proj(ctx_normed).view(b, t, self.nkv, self.hd))
        return rope(k, positions, self.theta), self.v_proj(ctx_normed).view(b, t, self.nkv, self.hd)

    def forward(self, x, positions, ctx_k, ctx_v, allowed):
        """x [N, Q, h] query blocks; ctx_k/ctx_v [N, T, nkv, hd]; allowed [N, T] context visibility."""
        n, q, _ = x.shape
        hn = self.input_layernorm(x)
        qh = rope(self.q_norm(self.q_proj(hn).view(n, q, self.nh, self.hd)), positions, self.theta)
        kb = rope(self.k_norm(self.k_proj(hn).view(n, q, self.nkv, self.hd)), positions, self.theta)
        vb = self.v_proj(hn).view(n, q, self.nkv, self.hd)
        k = torch.cat([ctx_k, kb], dim=1)
        v = torch.cat([ctx_v, vb], dim=1)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        mask = torch.cat([allowed, allowed.new_ones(n, q)], dim=1)[:, None, None, :]  # block: non-causal
        o = F.scaled_dot_product_attention(qh.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask).transpose(1, 2).reshape(n, q, -1)
        x = x + self.o_proj(o)
        hn = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(hn)) * self.up_proj(hn))


class Drafter(nn.Module):
    def __init__(self, dims: layout.Dims, layers: int, taps: int, theta: float):
        super().__init__()
        self.fc = nn.Linear(dims.hidden * taps, dims.hidden, bias=False)
        self.hidden_norm = RMSNorm(dims.hidden)
        self.layers = nn.ModuleList(DraftLayer(dims, theta) for _ in range(layers))
        self.norm = RMSNorm(dims.hidden)


@torch.no_grad()
def target_taps(target: TinyModel, ids, taps: tuple[int, ...]):
    """The target's residual stream after each layer in ``taps`` (0-based), concatenated: [B, T, h*len]."""
    x = target.model.embed_tokens(ids)
    out = []
    for i, layer in enumerate(target.model.layers):
        x = layer(x)
        if i in taps:
            out.append(x)
    return torch.cat(out, dim=-1)


def draft_logits(drafter: Drafter, target: TinyModel, ids, anchors, k: int, mask_id: int, taps):
    """Logits of the K mask slots for every anchor: ids [B, T], anchors [B, A] -> [B, A, K, V]."""
    b, t = ids.shape
    a = anchors.shape[1]
    ctx = drafter.fc(target_taps(target, ids, taps))
    ctx_n = drafter.hidden_norm(ctx)
    pos_ctx = torch.arange(t, device=ids.device).expand(b, t)
    offs = torch.arange(k + 1, device=ids.device)
    qpos = (anchors[..., None] + offs).reshape(b * a, k + 1)
    qids = torch.full((b, a, k + 1), mask_id, dtype=ids.dtype, device=ids.device)
    qids[..., 0] = ids.gather(1, anchors)
    x = target.model.embed_tokens(qids.reshape(b * a, k + 1))
    allowed = (torch.arange(t, device=ids.device)[None, None, :] < anchors[..., None]).reshape(b * a, t)
    for layer in drafter.layers:
        ck, cv = layer.context_kv(ctx_n, pos_ctx)
        hd = ck.shape[-2:]
        ck = ck[:, None].expand(b, a, t, *hd).reshape(b * a, t, *hd)
        cv = cv[:, None].expand(b, a, t, *hd).reshape(b * a, t, *hd)
        x = layer(x, qpos, ck, cv, allowed)
    h = drafter.norm(x)[:, 1:]  # the mask slots
    return target.lm_head(h).view(b, a, k, -1)


def to_checkpoint(drafter: Drafter) -> dict:
    """Module state -> the names ``tools.tinymodel.dflash.drafter_layout`` writes (bf16)."""
    sd = {k: v.detach().float().cpu() for k, v in drafter.state_dict().items()}
    out = {}
    for name, t in sd.items():
        parts = name.split(".")
        if parts[0] == "layers":
            i, rest = parts[1], ".".join(parts[2:])
            sub = "mlp" if rest.split(".")[0] in ("gate_proj", "up_proj", "down_proj") else \
                ("self_attn" if rest.split(".")[0] in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
                 else None)
            name = f"layers.{i}.{sub}.{rest}" if sub else f"layers.{i}.{rest}"
        out[name] = t.to(torch.bfloat16).contiguous()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, required=True, help="the trained target's model directory")
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--anchors", type=int, default=32, help="query blocks per sequence per step")
    ap.add_argument("--k", type=int, default=4, help="mask slots per block (num_speculative_tokens)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--labels", choices=("target", "data"), default="target")
    args = ap.parse_args()

    from safetensors.torch import load_file

    from tools.tinymodel.config import arch_of

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tcfg = json.loads((args.target / "config.json").read_text())
    target = TinyModel(arch_of(tcfg))
    from_checkpoint(target, load_file(str(args.target / "model.safetensors")))
    target.to(device).eval().requires_grad_(False)
    dims = layout.DIMS
    n_layers = sum(t == "full_attention" for t in tcfg["layer_types"])
    taps = tuple(layout.TARGET_LAYER_IDS)
    mask_id = tcfg["pad_token_id"]
    drafter = Drafter(dims, n_layers, len(taps), theta=10000.0)
    gen = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():  # the generator's init: N(0, 0.02) linears, unit norms
        for name, p in drafter.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.empty(p.shape).normal_(0.0, layout.INIT_STD, generator=gen))
    drafter.to(device).train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01,
                            fused=device.type == "cuda")
    blob = torch.load(args.data)
    names = sorted(blob["train"])  # code, json, prose
    weights = torch.tensor([{"code": 0.5, "json": 0.3, "prose": 0.2}[n] for n in names])  # the target's mix
    log, start = [], time.time()
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        kind = torch.multinomial(weights, args.batch, replacement=True, generator=gen)
        rows = []
        for kd in kind.tolist():
            data = blob["train"][names[kd]]
            s = int(torch.randint(0, data.numel() - args.seq - 1, (1,), generator=gen))
            rows.append(data[s: s + args.seq])
        ids = torch.stack(rows).to(device=device, dtype=torch.long)
        anchors = torch.randint(1, args.seq - args.k, (args.batch, args.anchors), generator=gen).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = draft_logits(drafter, target, ids, anchors, args.k, mask_id, taps)
        where = (anchors[..., None] + torch.arange(1, args.k + 1, device=device)).flatten(1)
        if args.labels == "target":  # the target's greedy token at p+k, teacher-forced on the data
            with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                greedy = target.lm_head(target.hidden(ids)).argmax(-1)  # [B, T]: prediction for t+1
            labels = greedy.gather(1, where - 1)
        else:
            labels = ids.gather(1, where)
        loss = F.cross_entropy(logits.float().flatten(0, 2), labels.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            with torch.no_grad():
                acc = (logits.argmax(-1).flatten(1) == labels).float().view(args.batch, args.anchors, args.k)
            entry = {"step": step, "loss": round(loss.item(), 4), "elapsed_s": round(time.time() - start, 1),
                     "acc_per_slot": [round(x, 3) for x in acc.mean((0, 1)).tolist()]}
            log.append(entry)
            print(json.dumps(entry), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save(to_checkpoint(drafter.cpu()), args.out / "drafter.pt")
        (args.out / "train_log.json").write_text(json.dumps({
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "log": log, "train_seconds": round(time.time() - start, 1), "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}, indent=1))


if __name__ == "__main__":
    main()
