"""A minimal PyTorch model of the Qwen3-Next family (GDN + gated attention + MoE or dense MLP + one MTP
layer) for training.

It mirrors what vLLM 0.32 computes for ``Qwen3NextForCausalLM`` / ``Qwen3NextMTP`` and
``Qwen3_5ForCausalLM`` / ``Qwen3_5MTP`` with the layouts in ``tools.tinymodel.config`` (one ``Arch``
each); ``tools/train_tiny/verify.py`` checks it against vLLM on CPU. Torch only, so it runs on the GPU
machine where neither vLLM nor transformers is installed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tools.tinymodel import config as C


class GemmaRMSNorm(nn.Module):
    """The family's RMSNorm: scale is ``1 + weight`` and the weight starts at zero."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)


def _rope(a: C.Arch, x, positions):
    """NeoX-style rotary embedding on the first partial_rotary * head_dim channels."""
    rot = int(a.head_dim * a.partial_rotary)
    inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, rot, 2, device=x.device, dtype=torch.float32) / rot))
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, rot/2]
    cos, sin = freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]
    xr, xp = x[..., :rot].float(), x[..., rot:]
    x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
    return torch.cat((out, xp), dim=-1)


class GatedAttention(nn.Module):
    def __init__(self, a: C.Arch):
        super().__init__()
        self.a = a
        self.q_proj = nn.Linear(a.hidden, 2 * a.heads * a.head_dim, bias=False)
        self.k_proj = nn.Linear(a.hidden, a.kv_heads * a.head_dim, bias=False)
        self.v_proj = nn.Linear(a.hidden, a.kv_heads * a.head_dim, bias=False)
        self.o_proj = nn.Linear(a.heads * a.head_dim, a.hidden, bias=False)
        self.q_norm = GemmaRMSNorm(a.head_dim, a.rms_eps)
        self.k_norm = GemmaRMSNorm(a.head_dim, a.rms_eps)

    def forward(self, x):
        a = self.a
        b, t, _ = x.shape
        q, gate = self.q_proj(x).view(b, t, a.heads, 2 * a.head_dim).chunk(2, dim=-1)
        k = self.k_proj(x).view(b, t, a.kv_heads, a.head_dim)
        v = self.v_proj(x).view(b, t, a.kv_heads, a.head_dim)
        pos = torch.arange(t, device=x.device)
        q = _rope(a, self.q_norm(q), pos)
        k = _rope(a, self.k_norm(k), pos)
        rep = a.heads // a.kv_heads
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        ).transpose(1, 2)
        o = o.reshape(b, t, -1) * torch.sigmoid(gate.reshape(b, t, -1))
        return self.o_proj(o)


def chunk_gated_delta_rule(q, k, v, g, beta, chunk: int = 64):
    """Gated delta rule over whole sequences, chunked (WY form); fp32 inside.

    q, k: [B, T, H, Dk] (already L2-normalised, q scaled); v: [B, T, H, Dv]; g (log decay), beta: [B, T, H].
    Per head, the state S [Dk, Dv] follows S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T
    and o_t = S_t^T q_t. Within a chunk the deltas solve a unit lower-triangular system; only the
    state hand-over between chunks is sequential.
    """
    in_dtype = v.dtype
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    pad = (-t) % chunk
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
    n = (t + pad) // chunk
    # -> [B, H, N, C, D]
    q, k, v = (x.view(b, n, chunk, h, -1).permute(0, 3, 1, 2, 4) for x in (q, k, v))
    g, beta = (x.view(b, n, chunk, h).permute(0, 3, 1, 2) for x in (g, beta))
    G = g.cumsum(-1)  # [B, H, N, C]
    diff = G[..., :, None] - G[..., None, :]
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    strict = causal.clone().fill_diagonal_(False)
    decay = torch.where(causal, diff, torch.full_like(diff, -torch.inf)).exp()  # exp(G_i - G_j), j <= i
    kk = k @ k.transpose(-1, -2)
    a = torch.where(strict, decay * kk, torch.zeros_like(kk)) * beta[..., :, None]
    eye = torch.eye(chunk, device=q.device, dtype=q.dtype)
    lhs = eye + a
    u = torch.linalg.solve_triangular(lhs, beta[..., None] * v, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(lhs, (beta * G.exp())[..., None] * k, upper=False, unitriangular=True)
    qk = torch.where(causal, (q @ k.transpose(-1, -2)) * decay, torch.zeros_like(kk))
    q_dec = q * G.exp()[..., None]
    k_dec = k * (G[..., -1:] - G).exp()[..., None]
    g_last = G[..., -1].exp()  # [B, H, N]
    state = q.new_zeros(b, h, dk, dv)
    outs = []
    for c in range(n):
        delta = u[:, :, c] - w[:, :, c] @ state
        outs.append(q_dec[:, :, c] @ state + qk[:, :, c] @ delta)
        state = g_last[:, :, c, None, None] * state + k_dec[:, :, c].transpose(-1, -2) @ delta
    o = torch.stack(outs, dim=2)  # [B, H, N, C, Dv]
    o = o.permute(0, 2, 3, 1, 4).reshape(b, n * chunk, h, dv)[:, :t]
    return o.to(in_dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, arch: C.Arch):
        super().__init__()
        self.arch = arch
        self.key_dim, self.value_dim = arch.key_dim, arch.value_dim
        conv_dim = 2 * self.key_dim + self.value_dim
        h, nv = arch.hidden, arch.linear_v_heads
        if arch.interleaved_gdn:
            self.in_proj_qkvz = nn.Linear(h, 2 * self.key_dim + 2 * self.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(h, 2 * nv, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(h, 2 * self.key_dim + self.value_dim, bias=False)
            self.in_proj_z = nn.Linear(h, self.value_dim, bias=False)
            self.in_proj_b = nn.Linear(h, nv, bias=False)
            self.in_proj_a = nn.Linear(h, nv, bias=False)
        self.conv1d = nn.Parameter(torch.empty(conv_dim, 1, arch.conv_kernel))
        self.dt_bias = nn.Parameter(torch.ones(nv))
        self.A_log = nn.Parameter(torch.zeros(nv))
        self.norm = nn.Parameter(torch.ones(arch.linear_v_dim))
        self.out_proj = nn.Linear(self.value_dim, h, bias=False)

    def _project(self, x):
        """(q, k, v as one [B, T, 2*Dk*nk + Dv*nv] stream, z [B, T, nv, dv], b, a [B, T, nv])."""
        arch = self.arch
        bsz, t, _ = x.shape
        nk, nv, dk, dv = arch.linear_k_heads, arch.linear_v_heads, arch.linear_k_dim, arch.linear_v_dim
        if not arch.interleaved_gdn:
            return (self.in_proj_qkv(x), self.in_proj_z(x).view(bsz, t, nv, dv),
                    self.in_proj_b(x), self.in_proj_a(x))
        r = nv // nk
        # Qwen3-Next's checkpoint interleaves q, k, v, z (and b, a) per key-head group.
        qkvz = self.in_proj_qkvz(x).view(bsz, t, nk, 2 * dk + 2 * r * dv)
        q, k, v, z = qkvz.split([dk, dk, r * dv, r * dv], dim=-1)
        b, a = self.in_proj_ba(x).view(bsz, t, nk, 2 * r).split([r, r], dim=-1)
        mixed = torch.cat([q.reshape(bsz, t, -1), k.reshape(bsz, t, -1), v.reshape(bsz, t, -1)], dim=-1)
        return mixed, z.reshape(bsz, t, nv, dv), b.reshape(bsz, t, nv), a.reshape(bsz, t, nv)

    def forward(self, x):
        arch = self.arch
        bsz, t, _ = x.shape
        nk, nv, dk, dv = arch.linear_k_heads, arch.linear_v_heads, arch.linear_k_dim, arch.linear_v_dim
        r = nv // nk
        mixed, z, b, a = self._project(x)
        mixed = F.conv1d(mixed.transpose(1, 2), self.conv1d.to(mixed.dtype), groups=mixed.shape[-1],
                         padding=arch.conv_kernel - 1)[..., :t]
        mixed = F.silu(mixed).transpose(1, 2)
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(bsz, t, nk, dk).float()
        k = k.reshape(bsz, t, nk, dk).float()
        v = v.reshape(bsz, t, nv, dv)
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) / math.sqrt(dk)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        q, k = q.repeat_interleave(r, dim=2), k.repeat_interleave(r, dim=2)
        beta = torch.sigmoid(b.float())
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        o = chunk_gated_delta_rule(q, k, v, g, beta)  # [B, T, nv, dv]
        of = o.float()
        of = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + arch.rms_eps)
        of = of.to(o.dtype) * self.norm.to(o.dtype)
        of = of.float() * F.silu(z.float())
        return self.out_proj(of.to(x.dtype).reshape(bsz, t, -1))


class SparseMoE(nn.Module):
    """Top-k softmax router (renormalised) over a few experts, plus a sigmoid-gated shared expert.

    With four experts the experts run densely and unselected ones get weight zero: cheaper on a GPU
    than a dispatch, and the same function.
    """

    def __init__(self, a: C.Arch):
        super().__init__()
        self.a = a
        e, i, h = a.num_experts, a.moe_intermediate, a.hidden
        self.gate = nn.Linear(h, e, bias=False)
        self.experts_gate_up = nn.Parameter(torch.empty(e, 2 * i, h))
        self.experts_down = nn.Parameter(torch.empty(e, h, i))
        self.shared_gate_up = nn.Linear(h, 2 * a.shared_intermediate, bias=False)
        self.shared_down = nn.Linear(a.shared_intermediate, h, bias=False)
        self.shared_expert_gate = nn.Linear(h, 1, bias=False)

    def forward(self, x):
        a = self.a
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        top_w, top_i = probs.topk(a.experts_per_tok, dim=-1)
        top_w = top_w / top_w.sum(-1, keepdim=True)
        weights = torch.zeros_like(probs).scatter(1, top_i, top_w)  # [N, E]
        gu = torch.einsum("nh,eih->eni", x, self.experts_gate_up.to(x.dtype))
        g_, u_ = gu.chunk(2, dim=-1)
        y = torch.einsum("eni,ehi->enh", F.silu(g_) * u_, self.experts_down.to(x.dtype))
        out = torch.einsum("enh,ne->nh", y.float(), weights)
        sg, su = self.shared_gate_up(x).chunk(2, dim=-1)
        shared = self.shared_down(F.silu(sg) * su)
        out = out + torch.sigmoid(self.shared_expert_gate(x).float()) * shared.float()
        # Switch-style balance term: fraction routed times mean probability, per expert.
        frac = torch.zeros_like(probs).scatter(1, top_i, 1.0).mean(0) / a.experts_per_tok
        self.aux_loss = a.num_experts * (frac * probs.mean(0)).sum()
        return out.to(x.dtype).reshape(shape)


class DenseMLP(nn.Module):
    """Qwen3.5's MLP (vLLM's Qwen2MoeMLP): down(silu(gate(x)) * up(x)); names as in the checkpoint."""

    def __init__(self, a: C.Arch):
        super().__init__()
        self.gate_proj = nn.Linear(a.hidden, a.dense_intermediate, bias=False)
        self.up_proj = nn.Linear(a.hidden, a.dense_intermediate, bias=False)
        self.down_proj = nn.Linear(a.dense_intermediate, a.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, a: C.Arch, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.input_layernorm = GemmaRMSNorm(a.hidden, a.rms_eps)
        if layer_type == "full_attention":
            self.self_attn = GatedAttention(a)
        else:
            self.linear_attn = GatedDeltaNet(a)
        self.post_attention_layernorm = GemmaRMSNorm(a.hidden, a.rms_eps)
        self.mlp = SparseMoE(a) if a.moe else DenseMLP(a)

    def forward(self, x):
        mixer = self.self_attn if self.layer_type == "full_attention" else self.linear_attn
        x = x + mixer(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, a: C.Arch):
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab, a.hidden)
        self.layers = nn.ModuleList(DecoderLayer(a, kind) for kind in C.layer_types(a))
        self.norm = GemmaRMSNorm(a.hidden, a.rms_eps)


class MTP(nn.Module):
    def __init__(self, a: C.Arch):
        super().__init__()
        self.fc = nn.Linear(2 * a.hidden, a.hidden, bias=False)
        self.pre_fc_norm_embedding = GemmaRMSNorm(a.hidden, a.rms_eps)
        self.pre_fc_norm_hidden = GemmaRMSNorm(a.hidden, a.rms_eps)
        self.layers = nn.ModuleList(DecoderLayer(a, "full_attention") for _ in range(a.num_mtp_layers))
        self.norm = GemmaRMSNorm(a.hidden, a.rms_eps)


class TinyModel(nn.Module):
    def __init__(self, arch: C.Arch = C.QWEN3_NEXT):
        super().__init__()
        self.arch = arch
        self.model = Backbone(arch)
        self.lm_head = nn.Linear(arch.hidden, arch.vocab, bias=False)
        self.mtp = MTP(arch)

    def hidden(self, ids):
        """Final (normed) hidden states of the target: what vLLM hands the MTP drafter."""
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x)
        return self.model.norm(x)

    def mtp_hidden(self, hidden, next_ids):
        """One MTP step: row i combines the hidden state at i with the embedding of token i+1."""
        e = self.mtp.pre_fc_norm_embedding(self.model.embed_tokens(next_ids))
        x = self.mtp.fc(torch.cat([e, self.mtp.pre_fc_norm_hidden(hidden)], dim=-1))
        x = self.mtp.layers[0](x)
        return self.mtp.norm(x)

    def aux_loss(self):
        return sum((m.aux_loss for m in self.modules() if isinstance(m, SparseMoE)), torch.zeros(()))

    @torch.no_grad()
    def greedy(self, ids: list[int], max_new: int) -> list[int]:
        """Reference greedy decode without a cache (recomputes the prefix each step)."""
        dev = self.lm_head.weight.device
        seq = list(ids)
        for _ in range(max_new):
            h = self.hidden(torch.tensor([seq], device=dev))
            seq.append(int(self.lm_head(h[0, -1]).float().argmax()))
        return seq[len(ids):]


# ---- checkpoint names <-> module parameters --------------------------------------------------------
# Dense MLPs and the flat GDN projections already carry their checkpoint names; only the fused MoE
# experts and the GDN parameters that are bare tensors here are renamed.

def _prefixes(a: C.Arch) -> list[str]:
    return [f"model.layers.{i}" for i in range(a.num_layers)] + [f"mtp.layers.{j}" for j in range(a.num_mtp_layers)]


def _moe_to_ckpt(a: C.Arch, prefix: str, sd: dict, out: dict) -> None:
    i = a.moe_intermediate
    gu, down = sd.pop(f"{prefix}.mlp.experts_gate_up"), sd.pop(f"{prefix}.mlp.experts_down")
    for e in range(a.num_experts):
        out[f"{prefix}.mlp.experts.{e}.gate_proj.weight"] = gu[e, :i]
        out[f"{prefix}.mlp.experts.{e}.up_proj.weight"] = gu[e, i:]
        out[f"{prefix}.mlp.experts.{e}.down_proj.weight"] = down[e]
    s = a.shared_intermediate
    sgu = sd.pop(f"{prefix}.mlp.shared_gate_up.weight")
    out[f"{prefix}.mlp.shared_expert.gate_proj.weight"] = sgu[:s]
    out[f"{prefix}.mlp.shared_expert.up_proj.weight"] = sgu[s:]
    out[f"{prefix}.mlp.shared_expert.down_proj.weight"] = sd.pop(f"{prefix}.mlp.shared_down.weight")


def to_checkpoint(model: TinyModel) -> dict:
    """Module state -> tensors named and shaped as in ``config.tensor_layout()`` (storage dtypes)."""
    from tools.tinymodel.weights import to_storage_dtype

    a = model.arch
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    out: dict = {}
    for p in _prefixes(a):
        if a.moe:
            _moe_to_ckpt(a, p, sd, out)
        for name in ("conv1d", "dt_bias", "A_log"):
            if f"{p}.linear_attn.{name}" in sd:
                key = f"{p}.linear_attn.{name}"
                out[key + (".weight" if name == "conv1d" else "")] = sd.pop(key)
        if f"{p}.linear_attn.norm" in sd:
            out[f"{p}.linear_attn.norm.weight"] = sd.pop(f"{p}.linear_attn.norm")
    out.update(sd)
    layout = C.tensor_layout(arch=a)
    roles = {name: (shape, role) for name, shape, role in layout}
    if set(out) != set(roles):
        raise RuntimeError(f"layout mismatch: {sorted(set(out) ^ set(roles))}")
    for name, (shape, role) in roles.items():
        if tuple(out[name].shape) != shape:
            raise RuntimeError(f"{name}: {tuple(out[name].shape)} != {shape}")
        out[name] = to_storage_dtype(name, role, out[name])
    return {name: out[name] for name, _, _ in layout}


def from_checkpoint(model: TinyModel, tensors: dict) -> None:
    """Load checkpoint-named tensors (e.g. the generator's random weights) into the module."""
    a = model.arch
    t = {k: v.float() for k, v in tensors.items()}
    sd: dict = {}
    for p in _prefixes(a):
        if a.moe:
            sd[f"{p}.mlp.experts_gate_up"] = torch.stack([
                torch.cat([t.pop(f"{p}.mlp.experts.{e}.gate_proj.weight"),
                           t.pop(f"{p}.mlp.experts.{e}.up_proj.weight")])
                for e in range(a.num_experts)
            ])
            sd[f"{p}.mlp.experts_down"] = torch.stack(
                [t.pop(f"{p}.mlp.experts.{e}.down_proj.weight") for e in range(a.num_experts)]
            )
            sd[f"{p}.mlp.shared_gate_up.weight"] = torch.cat(
                [t.pop(f"{p}.mlp.shared_expert.gate_proj.weight"), t.pop(f"{p}.mlp.shared_expert.up_proj.weight")]
            )
            sd[f"{p}.mlp.shared_down.weight"] = t.pop(f"{p}.mlp.shared_expert.down_proj.weight")
        if f"{p}.linear_attn.conv1d.weight" in t:
            sd[f"{p}.linear_attn.conv1d"] = t.pop(f"{p}.linear_attn.conv1d.weight")
            sd[f"{p}.linear_attn.norm"] = t.pop(f"{p}.linear_attn.norm.weight")
    sd.update(t)
    model.load_state_dict(sd, strict=True)


def init_weights(model: TinyModel, seed: int) -> None:
    """Start from the generator's random weights for the same seed (same roles, same init)."""
    from tools.tinymodel.weights import random_state_dict

    from_checkpoint(model, random_state_dict(seed, arch=model.arch))
