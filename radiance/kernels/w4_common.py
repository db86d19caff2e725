"""What the two 4-bit GEMMs (w4a16_gemm, w4a8_gemm) share: the Triton pieces that turn the packed
words of ``w4_layout`` into codes, the split-K store of a finished tile, and the launcher's buffers
that store uses (per-stream ticket counters, the unused workspace of a launch without split-K).

Nothing here imports a kernel; both GEMMs import from here. The layout itself, and why nibble ``i``
of a word is one 16-wide K slab, is documented in w4_layout.py.
"""
from __future__ import annotations

import torch

try:  # Triton is optional: the references serve CPU-only installs
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - exercised only where triton is absent
    triton = tl = None


# --------------------------------------------------------------------------------------
# Triton pieces
# --------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def unpack_asm(w, FP16: tl.constexpr):
        # Two K-adjacent words in, eight registers out; register i holds the two codes of
        # nibble i (k = 16 i + j, 16 i + j + 1) as a bf16x2/f16x2 pair. prmt puts byte b of
        # each word into the low byte of each half, lop3 keeps one nibble and ORs it into
        # the mantissa of 128.0 (bf16) / 1024.0 (fp16), and the fma subtracts 136 / 1032,
        # which is exact: the result is the code q in -8..7.
        if FP16:
            return tl.inline_asm_elementwise(
                asm="""
                {
                .reg .b32 t, u, one, bias;
                mov.b32 one, 0x3C003C00;
                mov.b32 bias, 0xE408E408;
                prmt.b32 t, $8, $9, 0x5410;
                lop3.b32 $0, t, 0x000F000F, 0x64006400, 0xEA;
                shr.b32 u, t, 4;
                lop3.b32 $1, u, 0x000F000F, 0x64006400, 0xEA;
                shr.b32 u, t, 8;
                lop3.b32 $2, u, 0x000F000F, 0x64006400, 0xEA;
                shr.b32 u, t, 12;
                lop3.b32 $3, u, 0x000F000F, 0x64006400, 0xEA;
                prmt.b32 t, $8, $9, 0x7632;
                lop3.b32 $4, t, 0x000F000F, 0x64006400, 0xEA;
                shr.b32 u, t, 4;
                lop3.b32 $5, u, 0x000F000F, 0x64006400, 0xEA;
                shr.b32 u, t, 8;
                lop3.b32 $6, u, 0x000F000F, 0x64006400, 0xEA;
                shr.b32 u, t, 12;
                lop3.b32 $7, u, 0x000F000F, 0x64006400, 0xEA;
                fma.rn.f16x2 $0, $0, one, bias;
                fma.rn.f16x2 $1, $1, one, bias;
                fma.rn.f16x2 $2, $2, one, bias;
                fma.rn.f16x2 $3, $3, one, bias;
                fma.rn.f16x2 $4, $4, one, bias;
                fma.rn.f16x2 $5, $5, one, bias;
                fma.rn.f16x2 $6, $6, one, bias;
                fma.rn.f16x2 $7, $7, one, bias;
                }
                """,
                constraints="=r,=r,=r,=r,=r,=r,=r,=r,r,r",
                args=[w], dtype=(tl.float16,) * 8, is_pure=True, pack=2)
        else:
            return tl.inline_asm_elementwise(
                asm="""
                {
                .reg .b32 t, u, one, bias;
                mov.b32 one, 0x3F803F80;
                mov.b32 bias, 0xC308C308;
                prmt.b32 t, $8, $9, 0x4400;
                lop3.b32 $0, t, 0x000F000F, 0x43004300, 0xEA;
                shr.b32 u, t, 4;
                lop3.b32 $1, u, 0x000F000F, 0x43004300, 0xEA;
                prmt.b32 t, $8, $9, 0x5511;
                lop3.b32 $2, t, 0x000F000F, 0x43004300, 0xEA;
                shr.b32 u, t, 4;
                lop3.b32 $3, u, 0x000F000F, 0x43004300, 0xEA;
                prmt.b32 t, $8, $9, 0x6622;
                lop3.b32 $4, t, 0x000F000F, 0x43004300, 0xEA;
                shr.b32 u, t, 4;
                lop3.b32 $5, u, 0x000F000F, 0x43004300, 0xEA;
                prmt.b32 t, $8, $9, 0x7733;
                lop3.b32 $6, t, 0x000F000F, 0x43004300, 0xEA;
                shr.b32 u, t, 4;
                lop3.b32 $7, u, 0x000F000F, 0x43004300, 0xEA;
                fma.rn.bf16x2 $0, $0, one, bias;
                fma.rn.bf16x2 $1, $1, one, bias;
                fma.rn.bf16x2 $2, $2, one, bias;
                fma.rn.bf16x2 $3, $3, one, bias;
                fma.rn.bf16x2 $4, $4, one, bias;
                fma.rn.bf16x2 $5, $5, one, bias;
                fma.rn.bf16x2 $6, $6, one, bias;
                fma.rn.bf16x2 $7, $7, one, bias;
                }
                """,
                constraints="=r,=r,=r,=r,=r,=r,=r,=r,r,r",
                args=[w], dtype=(tl.bfloat16,) * 8, is_pure=True, pack=2)

    @triton.jit
    def unpack_one(w, i: tl.constexpr, FP16: tl.constexpr, INTERPRET: tl.constexpr):
        # portable form of the same magic-number trick, one code per int32 lane. The
        # interpreter mishandles int->bf16 casts and bf16 dots, so there it is plain fp32.
        if INTERPRET:
            return (((w >> (4 * i)) & 0xF) - 8).to(tl.float32)
        elif FP16:
            v = (((w >> (4 * i)) & 0xF) | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)
            return v - 1032.0
        else:
            v = (((w >> (4 * i)) & 0xF) | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)
            return v - 136.0

    @triton.jit
    def store_tile(acc, out_ptr, ws_ptr, cnt_ptr, offs_m, offs_n, m_in, n_in, stride_om, M, N,
                    pid_n, pid_k, pid_m, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                    SPLIT_K: tl.constexpr):
        """The fp32 [BLOCK_N, BLOCK_M] tile out (W4A16 and W4A8 end the same way). Split-K: each
        program publishes its partial, and the tile's last to arrive (an atomic ticket) sums them
        in split order -- the same order every time, so the result is reproducible -- and resets
        the ticket, valid across launches and graph replays."""
        out_offs = offs_m[None, :] * stride_om + offs_n[:, None]
        o_mask = n_in[:, None] & m_in[None, :]
        if SPLIT_K == 1:
            tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=o_mask)
        else:
            ws_offs = offs_m[None, :] * N + offs_n[:, None]
            tl.store(ws_ptr + pid_k * M * N + ws_offs, acc, mask=o_mask)
            # every thread's partial is issued before the (single-thread) release below
            tl.debug_barrier()
            tile = pid_m * tl.num_programs(0) + pid_n
            ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if ticket == SPLIT_K - 1:
                total = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
                for sk in tl.static_range(SPLIT_K):
                    total += tl.load(ws_ptr + sk * M * N + ws_offs, mask=o_mask, other=0.0,
                                     cache_modifier=".cg")
                tl.store(out_ptr + out_offs, total.to(out_ptr.dtype.element_ty), mask=o_mask)
                tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")


# --------------------------------------------------------------------------------------
# launcher buffers
# --------------------------------------------------------------------------------------
_COUNTERS: dict[tuple, torch.Tensor] = {}


def split_k_counters(device: torch.device, n: int) -> torch.Tensor:
    """At least ``n`` zeroed int32 tickets for ``store_tile``'s split-K sum, which leaves them zero."""
    # Per (device, stream): two split-K launches on one stream are ordered, on two streams
    # they could interleave tickets. Sized to a power of two so capture-time growth is rare.
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device.type, device.index, stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        size = 1 << max(12, (n - 1).bit_length())
        buf = torch.zeros(size, dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


_DUMMY: dict[tuple, torch.Tensor] = {}


def dummy_workspace(device: torch.device) -> torch.Tensor:
    """The workspace argument of a launch without split-K: never read, typed as the split-K one's."""
    key = (device.type, device.index)
    if key not in _DUMMY:
        _DUMMY[key] = torch.zeros(1, dtype=torch.float32, device=device)
    return _DUMMY[key]
