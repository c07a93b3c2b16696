"""The Qwen2 LM's static-cache decode step as five hand-fused Triton kernels a layer (CUDA only).

Compiled by Inductor, the BF16 step of the 0.5B LM launches hundreds of kernels a token, and on an
H100 their count, not the bytes they read, bounds it (docs/bench-log/2026-11-27-h100-fp8.md): most of
them are norms, rotary, casts, bias adds and slices around matrix-vector products that each take a
few microseconds. Here each layer is

1. RMSNorm + the merged q/k/v product + bias + rotary, writing the new key and value into the cache;
2. attention of each query head over the cache (online softmax, the cache read once per head);
3. o_proj + the residual add;
4. RMSNorm + the merged gate/up product + SiLU(gate) * up;
5. down_proj + the residual add;

and the head is one more (RMSNorm + product + bias): 5 L + 2 launches a token; :class:`Tiling`
says how each launch is cut into programs. With ``Tiling(fuse_o=True)`` kernels 2 and 3 are one:
each program attends for one head and adds that head's share of o_proj to a block of the residual
(the attention is recomputed once per row block, from L2). With ``fuse_mlp=True`` kernels 4 and 5 are
one: each program makes a block of the MLP's intermediate rows and adds their share of down_proj to
the whole residual (down_proj kept transposed, so that a block's columns are contiguous rows). Both
sum across programs with atomic adds, so the sum's order, and its last bits, vary from run to run;
with both a layer is 3 launches. The residual stream stays float32 between kernels;
weights are BF16, or FP8 (e4m3) / INT8 with one scale per output row (weight-only: the activations
stay float32, so a step reads half the weight bytes). The cache keeps the step's dtype.

:class:`FusedDecodeStep` has the call signature of ``LLMStaticStep`` (``(inputs_embeds, key_values,
position) -> (logits, new_key_values)``), so ``StaticCacheDecoder`` captures it as one CUDA graph
unchanged. It writes the new keys and values into slot ``position`` of ``key_values`` itself (the
attention kernel must see them) and also returns them, which the decoder writes again, harmlessly.
On a CPU the kernels run only under Triton's interpreter (``TRITON_INTERPRET=1``), which is how the
tests check them against ``LLMStaticStep``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.3; a kernel calls these only when its PDL flag is set
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: Tiling(pdl=True) fails at the first launch
    gdc_launch_dependents = gdc_wait = None

WEIGHT_FORMATS = ("fp32", "bf16", "fp8", "int8")


@dataclass(frozen=True)
class Tiling:
    """Launch shapes of the kernels: rows of a weight matrix per program (``*_rows``; for the q/k/v
    kernel, rotary pairs per program), the slice of the reduction read per loop turn (``*_k``), cache
    positions per attention loop turn, warps and pipelining depth.

    ``o_split`` / ``down_split`` cut the reduction of o_proj / down_proj into that many programs a
    row block, each adding its part into the residual stream atomically (more programs in flight for
    matrices of few rows; the sum's order, so its last bits, then varies from run to run). ``pdl``
    launches every kernel as a programmatic dependent launch (Hopper on): each waits for its
    predecessor inside the kernel, so the launch overlaps the previous kernel's tail.

    ``fuse_o`` / ``fuse_mlp`` (see the module's docstring): ``fuse_o_rows`` residual rows per fused
    attention program; ``mlp_rows`` intermediate rows per fused MLP program (any multiple of
    ``mlp_sub``: it sets how many programs share the machine), made ``mlp_sub`` at a time."""

    # The defaults read a whole 896-wide row of the 0.5B LM per loop turn, the fastest shape timed on
    # an H200 (docs/bench-log/2026-11-28-h200-fused-triton-decode.md; slices of 256 were the shape
    # before it).
    qkv_pairs: int = 4
    qkv_k: int = 1024
    o_rows: int = 4
    o_k: int = 1024
    gate_up_rows: int = 8
    gate_up_k: int = 1024
    down_rows: int = 4
    down_k: int = 1024
    head_rows: int = 16
    head_k: int = 1024
    attn_positions: int = 64
    o_split: int = 1
    down_split: int = 1
    attn_warps: int = 4
    fuse_o: bool = False
    fuse_o_rows: int = 128
    fuse_mlp: bool = False
    mlp_rows: int = 16
    mlp_sub: int = 8
    num_warps: int = 8
    num_stages: int = 3
    pdl: bool = False

    def blocks(self) -> dict[str, int]:
        """The block sizes (each must be a power of two)."""
        return {k: v for k, v in vars(self).items()
                if k.endswith(("_pairs", "_k", "_rows", "_positions", "_sub")) and k != "mlp_rows"}


@triton.jit
def _grid_dependency(PDL: tl.constexpr):
    """Under a programmatic dependent launch: wait until the previous kernel's writes are visible,
    then let the next kernel's programs start launching."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _inv_rms(x_ptr, x_stride, B, K: tl.constexpr, eps, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr):
    """1 / RMS of each of the ``B`` rows of ``x`` (float32 [BLOCK_B])."""
    bs = tl.arange(0, BLOCK_B)
    ks = tl.arange(0, BLOCK_H)
    x = tl.load(x_ptr + bs[:, None] * x_stride + ks[None, :], mask=(bs[:, None] < B) & (ks[None, :] < K),
                other=0.0).to(tl.float32)
    return 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / K + eps)


@triton.jit
def _matvec(x_ptr, x_stride, B, inv, nw_ptr, w_ptr, ws_ptr, rows, row_mask, K: tl.constexpr,
            NORM: tl.constexpr, SCALED: tl.constexpr,
            BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, k_lo, k_hi):
    """``x @ W[rows].T`` for the ``B`` rows of ``x`` (float32 [BLOCK_B, BLOCK_N]) over reduction
    columns ``k_lo`` up to ``k_hi``; with ``NORM`` the rows of ``x`` are RMS-normalised
    first (``inv``: their 1/RMS, ``nw``: the norm's weight), with ``SCALED`` the weight rows are
    multiplied by their scales ``ws``."""
    bs = tl.arange(0, BLOCK_B)
    acc = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < k_hi
        x = tl.load(x_ptr + bs[:, None] * x_stride + ks[None, :], mask=(bs[:, None] < B) & kmask[None, :],
                    other=0.0).to(tl.float32)
        if NORM:
            nw = tl.load(nw_ptr + ks, mask=kmask, other=0.0).to(tl.float32)
            x = x * inv[:, None] * nw[None, :]
        w = tl.load(w_ptr + rows[:, None] * K + ks[None, :], mask=row_mask[:, None] & kmask[None, :],
                    other=0.0).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    if SCALED:
        acc = acc * tl.load(ws_ptr + rows, mask=row_mask, other=0.0)[None, :]
    return acc


@triton.jit
def _normed_row_pair(h_ptr, B, H: tl.constexpr, eps, nw_ptr, w_ptr, ws_ptr, rows, OFFSET: tl.constexpr, ok,
                     SCALED: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """RMS-normed ``h`` times weight rows ``rows`` and ``rows + OFFSET`` (the two halves of a merged
    matrix: RoPE's rotated pairs, or gate and up)."""
    inv = _inv_rms(h_ptr, H, B, H, eps, BLOCK_B, BLOCK_H)
    a = _matvec(h_ptr, H, B, inv, nw_ptr, w_ptr, ws_ptr, rows, ok, H, True, SCALED, BLOCK_B, BLOCK_N, BLOCK_K, 0, H)
    b = _matvec(h_ptr, H, B, inv, nw_ptr, w_ptr, ws_ptr, rows + OFFSET, ok, H, True, SCALED, BLOCK_B, BLOCK_N,
                BLOCK_K, 0, H)
    return a, b


@triton.jit
def _qkv_rope_kernel(h_ptr, B, H: tl.constexpr, eps, nw_ptr, w_ptr, ws_ptr, bias_ptr, inv_freq_ptr, pos_ptr,
                     q_ptr, kv_ptr, kv_sl, kv_st, kv_sb, kv_sh, kv_sm, new_ptr, new_sl, new_st, new_sb, new_sh,
                     layer, zero_ptr, NUM_HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                     SCALED: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr,
                     PAIRS: tl.constexpr, BLOCK_K: tl.constexpr, ZERO: tl.constexpr, PDL: tl.constexpr):
    """One program: ``PAIRS`` rotary pairs (rows d and d + HEAD_DIM/2) of one q, k or v head. With
    ``ZERO``, program 0 also clears ``zero_ptr`` [B, H] (the fused MLP's output, read by no one now)."""
    _grid_dependency(PDL)
    if ZERO:
        if tl.program_id(0) == 0:
            zb = tl.arange(0, BLOCK_B)
            zh = tl.arange(0, BLOCK_H)
            tl.store(zero_ptr + zb[:, None] * H + zh[None, :], tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32),
                     mask=(zb[:, None] < B) & (zh[None, :] < H))
    HALF: tl.constexpr = HEAD_DIM // 2
    per_head: tl.constexpr = HALF // PAIRS
    pid = tl.program_id(0)
    head = pid // per_head
    d = (pid % per_head) * PAIRS + tl.arange(0, PAIRS)
    rows = head * HEAD_DIM + d
    ok = d < HALF
    x1, x2 = _normed_row_pair(h_ptr, B, H, eps, nw_ptr, w_ptr, ws_ptr, rows, HALF, ok, SCALED, BLOCK_B, BLOCK_H,
                              PAIRS, BLOCK_K)
    x1 += tl.load(bias_ptr + rows).to(tl.float32)[None, :]
    x2 += tl.load(bias_ptr + rows + HALF).to(tl.float32)[None, :]
    pos = tl.load(pos_ptr)
    bs = tl.arange(0, BLOCK_B)
    bmask = (bs[:, None] < B) & ok[None, :]
    if head < NUM_HEADS + KV_HEADS:  # q and k turn; v does not
        angle = pos.to(tl.float32) * tl.load(inv_freq_ptr + d)
        c = tl.cos(angle)[None, :]
        s = tl.sin(angle)[None, :]
        r1 = x1 * c - x2 * s
        r2 = x2 * c + x1 * s
    else:
        r1 = x1
        r2 = x2
    if head < NUM_HEADS:
        q = q_ptr + bs[:, None] * (NUM_HEADS * HEAD_DIM) + head * HEAD_DIM + d[None, :]
        tl.store(q, r1, mask=bmask)
        tl.store(q + HALF, r2, mask=bmask)
    else:
        which = (head - NUM_HEADS) // KV_HEADS  # 0: key, 1: value
        kvh = (head - NUM_HEADS) % KV_HEADS
        slot = kv_ptr + layer * kv_sl + which * kv_st + bs[:, None] * kv_sb + kvh * kv_sh + pos * kv_sm + d[None, :]
        tl.store(slot, r1.to(kv_ptr.dtype.element_ty), mask=bmask)
        tl.store(slot + HALF, r2.to(kv_ptr.dtype.element_ty), mask=bmask)
        new = new_ptr + layer * new_sl + which * new_st + bs[:, None] * new_sb + kvh * new_sh + d[None, :]
        tl.store(new, r1.to(new_ptr.dtype.element_ty), mask=bmask)
        tl.store(new + HALF, r2.to(new_ptr.dtype.element_ty), mask=bmask)


@triton.jit
def _attend(q_ptr, kv_ptr, kv_sl, kv_st, kv_sb, kv_sh, kv_sm, pos_ptr, layer, scale,
            NUM_HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """(attention output as float32 [HEAD_DIM], batch row, head) of the query head that the program's
    first index names (``b * NUM_HEADS + head``), over cache slots 0..position (inclusive)."""
    pid = tl.program_id(0)
    b = pid // NUM_HEADS
    head = pid % NUM_HEADS
    kvh = head // (NUM_HEADS // KV_HEADS)
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + b * (NUM_HEADS * HEAD_DIM) + head * HEAD_DIM + d) * scale
    seen = (tl.load(pos_ptr) + 1).to(tl.int32)
    keys = kv_ptr + layer * kv_sl + b * kv_sb + kvh * kv_sh
    values = keys + kv_st
    # Scalars made by reductions: a loop-carried value must keep one type from the first turn on.
    m_i = tl.max(tl.full((BLOCK_M,), float("-inf"), tl.float32), axis=0)
    l_i = tl.sum(tl.zeros((BLOCK_M,), dtype=tl.float32), axis=0)
    acc = tl.zeros((HEAD_DIM,), dtype=tl.float32)
    for m0 in range(0, seen, BLOCK_M):
        ms = m0 + tl.arange(0, BLOCK_M)
        valid = ms < seen
        k = tl.load(keys + ms[:, None] * kv_sm + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        score = tl.where(valid, tl.sum(k * q[None, :], axis=1), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(score, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(score - m_new)
        v = tl.load(values + ms[:, None] * kv_sm + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    return acc / l_i, b, head


@triton.jit
def _attention_kernel(q_ptr, kv_ptr, kv_sl, kv_st, kv_sb, kv_sh, kv_sm, pos_ptr, ctx_ptr, layer, scale,
                      NUM_HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_M: tl.constexpr, PDL: tl.constexpr):
    """One program: one query head of one batch row over cache slots 0..position (inclusive)."""
    _grid_dependency(PDL)
    ctx, b, head = _attend(q_ptr, kv_ptr, kv_sl, kv_st, kv_sb, kv_sh, kv_sm, pos_ptr, layer, scale,
                           NUM_HEADS, KV_HEADS, HEAD_DIM, BLOCK_M)
    tl.store(ctx_ptr + b * (NUM_HEADS * HEAD_DIM) + head * HEAD_DIM + tl.arange(0, HEAD_DIM), ctx)


@triton.jit
def _attention_o_kernel(q_ptr, kv_ptr, kv_sl, kv_st, kv_sb, kv_sh, kv_sm, pos_ptr, layer, scale, wo_ptr, wos_ptr,
                        h_ptr, H: tl.constexpr, NUM_HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, ROWS: tl.constexpr, SCALED: tl.constexpr,
                        PDL: tl.constexpr):
    """Program (b * NUM_HEADS + head, j): that head's attention output times its ``HEAD_DIM`` columns
    of o_proj, rows ``j * ROWS`` on, added atomically into the residual ``h``."""
    _grid_dependency(PDL)
    ctx, b, head = _attend(q_ptr, kv_ptr, kv_sl, kv_st, kv_sb, kv_sh, kv_sm, pos_ptr, layer, scale,
                           NUM_HEADS, KV_HEADS, HEAD_DIM, BLOCK_M)
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    ok = rows < H
    cols = head * HEAD_DIM + tl.arange(0, HEAD_DIM)
    w = tl.load(wo_ptr + rows[:, None] * (NUM_HEADS * HEAD_DIM) + cols[None, :], mask=ok[:, None],
                other=0.0).to(tl.float32)
    part = tl.sum(w * ctx[None, :], axis=1)
    if SCALED:
        part = part * tl.load(wos_ptr + rows, mask=ok, other=0.0)
    tl.atomic_add(h_ptr + b * H + rows, part, mask=ok, sem="relaxed")


@triton.jit
def _mlp_kernel(h_ptr, out_ptr, B, H: tl.constexpr, eps, nw_ptr, gu_ptr, gus_ptr, dt_ptr, ds_ptr,
                INTER: tl.constexpr, SCALED: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr,
                ROWS: tl.constexpr, SUB: tl.constexpr, PDL: tl.constexpr):
    """Program i: ``silu(gate) * up`` of intermediate rows ``i * ROWS`` on (``SUB`` at a time) times
    the same rows of the transposed down_proj ``dt`` [INTER, H], added atomically into ``out``, which
    holds zeros; program 0 also adds the residual ``h`` itself."""
    _grid_dependency(PDL)
    bs = tl.arange(0, BLOCK_B)
    hs = tl.arange(0, BLOCK_H)
    hmask = hs < H
    mask = (bs[:, None] < B) & hmask[None, :]
    x = tl.load(h_ptr + bs[:, None] * H + hs[None, :], mask=mask, other=0.0)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / H + eps)
    xn = x * inv[:, None] * tl.load(nw_ptr + hs, mask=hmask, other=0.0).to(tl.float32)[None, :]
    acc = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
    for r0 in range(0, ROWS, SUB):
        rows = tl.program_id(0) * ROWS + r0 + tl.arange(0, SUB)
        ok = rows < INTER
        wmask = ok[:, None] & hmask[None, :]
        g = tl.load(gu_ptr + rows[:, None] * H + hs[None, :], mask=wmask, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + (rows + INTER)[:, None] * H + hs[None, :], mask=wmask, other=0.0).to(tl.float32)
        gate = tl.sum(xn[:, None, :] * g[None, :, :], axis=2)
        up = tl.sum(xn[:, None, :] * u[None, :, :], axis=2)
        if SCALED:
            gate = gate * tl.load(gus_ptr + rows, mask=ok, other=0.0)[None, :]
            up = up * tl.load(gus_ptr + rows + INTER, mask=ok, other=0.0)[None, :]
        a = gate / (1.0 + tl.exp(-gate)) * up
        dw = tl.load(dt_ptr + rows[:, None] * H + hs[None, :], mask=wmask, other=0.0).to(tl.float32)
        # Summed over the slice's rows every turn: an elementwise [SUB, H] accumulator summed once at
        # the end was slower on an H200 (docs/bench-log/2026-12-04-h200-fused-mlp-decode.md).
        acc += tl.sum(a[:, :, None] * dw[None, :, :], axis=1)
    if SCALED:  # down_proj's scales belong to its output rows: the residual's columns here
        acc = acc * tl.load(ds_ptr + hs, mask=hmask, other=0.0)[None, :]
    if tl.program_id(0) == 0:
        acc += x
    tl.atomic_add(out_ptr + bs[:, None] * H + hs[None, :], acc, mask=mask, sem="relaxed")


@triton.jit
def _linear_kernel(x_ptr, B, K: tl.constexpr, N: tl.constexpr, eps, nw_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr,
                   NORM: tl.constexpr, SCALED: tl.constexpr, BIAS: tl.constexpr, RESIDUAL: tl.constexpr,
                   BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   SPLIT: tl.constexpr, PDL: tl.constexpr):
    """``out[:, rows] (+)= [norm](x) @ W[rows].T (+ bias)`` for ``BLOCK_N`` rows of ``W`` [N, K]; with
    ``SPLIT`` > 1 (residual only) program (i, j) adds the j-th of ``SPLIT`` column slices atomically."""
    _grid_dependency(PDL)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = rows < N
    inv = tl.zeros((BLOCK_B,), dtype=tl.float32)
    if NORM:
        inv = _inv_rms(x_ptr, K, B, K, eps, BLOCK_B, BLOCK_H)
    bs = tl.arange(0, BLOCK_B)
    out = out_ptr + bs[:, None] * N + rows[None, :]
    mask = (bs[:, None] < B) & ok[None, :]
    if SPLIT > 1:
        # Slices a whole number of BLOCK_K wide, so that only the last one ends on a partial turn.
        width: tl.constexpr = ((K + SPLIT - 1) // SPLIT + BLOCK_K - 1) // BLOCK_K * BLOCK_K
        k_lo = tl.program_id(1) * width
        acc = _matvec(x_ptr, K, B, inv, nw_ptr, w_ptr, ws_ptr, rows, ok, K, NORM, SCALED, BLOCK_B, BLOCK_N,
                      BLOCK_K, k_lo, tl.minimum(k_lo + width, K))
        if BIAS:
            if tl.program_id(1) == 0:
                acc += tl.load(bias_ptr + rows, mask=ok, other=0.0).to(tl.float32)[None, :]
        tl.atomic_add(out, acc, mask=mask, sem="relaxed")
    else:
        acc = _matvec(x_ptr, K, B, inv, nw_ptr, w_ptr, ws_ptr, rows, ok, K, NORM, SCALED, BLOCK_B, BLOCK_N,
                      BLOCK_K, 0, K)
        if BIAS:
            acc += tl.load(bias_ptr + rows, mask=ok, other=0.0).to(tl.float32)[None, :]
        if RESIDUAL:
            acc += tl.load(out, mask=mask, other=0.0)
        tl.store(out, acc, mask=mask)


@triton.jit
def _gate_up_kernel(h_ptr, B, H: tl.constexpr, eps, nw_ptr, w_ptr, ws_ptr, act_ptr, INTER: tl.constexpr,
                    SCALED: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """``act[:, rows] = silu(gate) * up`` with gate and up from the merged matrix [2 INTER, H]."""
    _grid_dependency(PDL)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = rows < INTER
    gate, up = _normed_row_pair(h_ptr, B, H, eps, nw_ptr, w_ptr, ws_ptr, rows, INTER, ok, SCALED, BLOCK_B, BLOCK_H,
                                BLOCK_N, BLOCK_K)
    bs = tl.arange(0, BLOCK_B)
    tl.store(act_ptr + bs[:, None] * INTER + rows[None, :], gate / (1.0 + tl.exp(-gate)) * up,
             mask=(bs[:, None] < B) & ok[None, :])


def quantize_rows(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``w`` [N, K] in ``fmt``: FP32 or BF16 as it is, or FP8 e4m3 / INT8 with one float32 scale per row
    (the row's largest magnitude maps to the format's largest value)."""
    if fmt in ("fp32", "bf16"):
        return w.to(torch.float32 if fmt == "fp32" else torch.bfloat16).contiguous(), None
    top = {"fp8": torch.finfo(torch.float8_e4m3fn).max, "int8": 127.0}[fmt]
    scale = (w.float().abs().amax(dim=1) / top).clamp_min(1e-12)
    q = w.float() / scale[:, None]
    q = q.round().clamp(-127, 127).to(torch.int8) if fmt == "int8" else q.to(torch.float8_e4m3fn)
    return q.contiguous(), scale.contiguous()


class _Matrix:
    """A weight matrix as the kernels read it: the (maybe quantized) rows and their scales; with
    ``transposed`` the quantized matrix is kept as its transpose (the scales still one per row of ``w``)."""

    def __init__(self, w: torch.Tensor, fmt: str, transposed: bool = False) -> None:
        self.w, self.scale = quantize_rows(w.detach(), fmt)
        if transposed:
            self.w = self.w.t().contiguous()
        self.rows, self.cols = w.shape

    @property
    def nbytes(self) -> int:
        return self.w.numel() * self.w.element_size() + (0 if self.scale is None else self.scale.numel() * 4)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class FusedDecodeStep:
    """A static decode step (``LLMStaticStep``: merged q/k/v and gate/up) run by the kernels above.

    ``weights`` is ``bf16``, ``fp8`` or ``int8`` for the layers' four matrices; norms, biases and the
    head stay BF16 (``fp32`` keeps every weight FP32: the tests' exact check of the kernels). Buffers
    for a batch size are made at its first call and kept, so a CUDA graph captured around a call
    replays over the same addresses.
    """

    def __init__(self, step: torch.nn.Module, weights: str = "bf16", tiling: Tiling | None = None) -> None:
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, not '{weights}'")
        self.weights, self.tiling = weights, tiling or Tiling()
        self.num_heads, self.kv_heads, self.head_dim = step.num_heads, step.kv_heads, step.head_dim
        odd = [f"{k}={v}" for k, v in self.tiling.blocks().items() if v < 1 or v & (v - 1)]
        if odd:
            raise ValueError(f"tiling: block sizes must be powers of two ({', '.join(odd)})")
        few = [f"{k}={v}" for k in ("o_split", "down_split", "attn_warps", "num_warps", "num_stages")
               if (v := getattr(self.tiling, k)) < 1]
        if few:
            raise ValueError(f"tiling: counts must be at least 1 ({', '.join(few)})")
        if self.tiling.mlp_rows % self.tiling.mlp_sub:
            raise ValueError(f"tiling: mlp_rows ({self.tiling.mlp_rows}) must be a multiple of mlp_sub "
                             f"({self.tiling.mlp_sub})")
        if self.head_dim & (self.head_dim - 1) or (self.head_dim // 2) % self.tiling.qkv_pairs:
            raise ValueError(f"head_dim {self.head_dim}: a power of two whose half the rotary pairs per program "
                             f"({self.tiling.qkv_pairs}) divide")
        first = step.layers[0]
        act = getattr(first.act_fn, "__class__", type(None)).__name__
        if act not in ("SiLU", "SiLUActivation"):
            raise ValueError(f"the fused MLP computes SiLU, the LM uses {act}")
        self.hidden = first.qkv_proj.in_features
        self.inter = first.down_proj.in_features
        self.eps = float(first.input_layernorm.variance_epsilon)
        # FP32 weights (a check of the kernels' arithmetic) keep everything FP32; otherwise the small
        # tensors are BF16.
        bf16 = torch.float32 if weights == "fp32" else torch.bfloat16
        self.layers = []
        for layer in step.layers:
            self.layers.append({
                "ln1": layer.input_layernorm.weight.detach().to(bf16), "qkv": _Matrix(layer.qkv_proj.weight, weights),
                "qkv_bias": layer.qkv_proj.bias.detach().to(bf16), "o": _Matrix(layer.o_proj.weight, weights),
                "ln2": layer.post_attention_layernorm.weight.detach().to(bf16),
                "gate_up": _Matrix(layer.gate_up_proj.weight, weights),
                "down": _Matrix(layer.down_proj.weight, weights, transposed=self.tiling.fuse_mlp),
            })
        self.norm = step.norm.weight.detach().to(bf16)
        self.head = _Matrix(step.head.weight, "fp32" if weights == "fp32" else "bf16")
        self.head_bias = step.head.bias.detach().to(bf16)
        self.inv_freq = step.inv_freq.detach().float().contiguous()
        self.vocab = step.head.out_features
        self._buffers: dict[tuple[int, torch.dtype, Any], dict[str, torch.Tensor]] = {}

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights a step reads (every matrix, norm and bias once)."""
        mats = [m for layer in self.layers for m in (layer["qkv"], layer["o"], layer["gate_up"], layer["down"])]
        small = [t for layer in self.layers for t in (layer["ln1"], layer["ln2"], layer["qkv_bias"])]
        return sum(m.nbytes for m in [*mats, self.head]) + sum(t.numel() * t.element_size() for t in [*small, self.norm,
                                                                                          self.head_bias])

    def _scratch(self, B: int, kv: torch.Tensor) -> dict[str, torch.Tensor]:
        key = (B, kv.dtype, kv.device)
        if key not in self._buffers:
            f32 = dict(dtype=torch.float32, device=kv.device)
            qd = self.num_heads * self.head_dim
            self._buffers[key] = {
                "h": torch.empty(B, self.hidden, **f32), "h2": torch.empty(B, self.hidden, **f32),
                "q": torch.empty(B, qd, **f32),
                "ctx": torch.empty(B, qd, **f32), "act": torch.empty(B, self.inter, **f32),
                "logits": torch.empty(B, 1, self.vocab, **f32),
                "new": torch.empty(len(self.layers), 2, B, self.kv_heads, 1, self.head_dim, dtype=kv.dtype,
                                   device=kv.device)}
        return self._buffers[key]

    def __call__(self, inputs_embeds: torch.Tensor, key_values: torch.Tensor,
                 position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, 1, V] (float32) of the token at ``position`` and its keys and values
        [L, 2, B, KVH, 1, D], also written into slot ``position`` of ``key_values`` [L, 2, B, KVH, M, D]."""
        B = inputs_embeds.shape[0]
        if not key_values.is_contiguous() or key_values.shape[4] < 1:
            raise ValueError("key_values must be a contiguous cache of at least one slot")
        buf = self._scratch(B, key_values)
        t = self.tiling
        h, q, ctx, act, new = buf["h"], buf["q"], buf["ctx"], buf["act"], buf["new"]
        h.copy_(inputs_embeds.reshape(B, self.hidden))
        BB, BH = _pow2(B), _pow2(self.hidden)
        kw: dict[str, Any] = dict(num_warps=t.num_warps, num_stages=t.num_stages)
        if t.pdl:
            kw["launch_pdl"] = True
        kvs, news = key_values.stride(), new.stride()
        heads = self.num_heads + 2 * self.kv_heads
        qkv_grid = (heads * (self.head_dim // 2 // t.qkv_pairs),)
        scale = 1.0 / math.sqrt(self.head_dim)
        H, inter = self.hidden, self.inter
        other = buf["h2"]  # the fused MLP's output; the two swap roles every layer
        for i, L in enumerate(self.layers):
            qkv, o, gu, down = L["qkv"], L["o"], L["gate_up"], L["down"]
            _qkv_rope_kernel[qkv_grid](
                h, B, H, self.eps, L["ln1"], qkv.w, _or(qkv.scale, qkv.w), L["qkv_bias"], self.inv_freq, position,
                q, key_values, kvs[0], kvs[1], kvs[2], kvs[3], kvs[4], new, news[0], news[1], news[2], news[3],
                i, other, self.num_heads, self.kv_heads, self.head_dim, qkv.scale is not None, BB, BH, t.qkv_pairs,
                t.qkv_k, t.fuse_mlp, t.pdl, **kw)
            if t.fuse_o:
                _attention_o_kernel[(B * self.num_heads, triton.cdiv(H, t.fuse_o_rows))](
                    q, key_values, kvs[0], kvs[1], kvs[2], kvs[3], kvs[4], position, i, scale, o.w, _or(o.scale, o.w),
                    h, H, self.num_heads, self.kv_heads, self.head_dim, t.attn_positions, t.fuse_o_rows,
                    o.scale is not None, t.pdl, **{**kw, "num_warps": t.attn_warps})
            else:
                _attention_kernel[(B * self.num_heads,)](
                    q, key_values, kvs[0], kvs[1], kvs[2], kvs[3], kvs[4], position, ctx, i, scale,
                    self.num_heads, self.kv_heads, self.head_dim, t.attn_positions, t.pdl,
                    **{**kw, "num_warps": t.attn_warps})
                self._linear(ctx, B, o, h, False, None, None, True, t.o_rows, t.o_k, t.o_split, kw)
            if t.fuse_mlp:
                _mlp_kernel[(triton.cdiv(inter, t.mlp_rows),)](
                    h, other, B, H, self.eps, L["ln2"], gu.w, _or(gu.scale, gu.w), down.w, _or(down.scale, down.w),
                    inter, gu.scale is not None, BB, BH, t.mlp_rows, t.mlp_sub, t.pdl, **kw)
                h, other = other, h
                continue
            _gate_up_kernel[(triton.cdiv(inter, t.gate_up_rows),)](
                h, B, H, self.eps, L["ln2"], gu.w, _or(gu.scale, gu.w), act, inter, gu.scale is not None, BB, BH,
                t.gate_up_rows, t.gate_up_k, t.pdl, **kw)
            self._linear(act, B, down, h, False, None, None, True, t.down_rows, t.down_k, t.down_split, kw)
        logits = buf["logits"]
        self._linear(h, B, self.head, logits, True, self.norm, self.head_bias, False, t.head_rows, t.head_k, 1, kw)
        # On CUDA the buffer is the captured graph's output, as StaticCacheDecoder documents; on a CPU
        # (the interpreter) callers keep each step's logits, which a shared buffer would overwrite.
        return (logits if logits.is_cuda else logits.clone()), new

    def _linear(self, x: torch.Tensor, B: int, m: _Matrix, out: torch.Tensor, norm: bool, nw: torch.Tensor | None,
                bias: torch.Tensor | None, residual: bool, rows: int, k: int, split: int, kw: dict[str, Any]) -> None:
        # More slices than turns of the reduction would leave programs with nothing to add.
        split = min(split, triton.cdiv(m.cols, k)) if residual else 1
        _linear_kernel[(triton.cdiv(m.rows, rows), split)](
            x, B, m.cols, m.rows, self.eps, _or(nw, m.w), m.w, _or(m.scale, m.w), _or(bias, m.w), out,
            norm, m.scale is not None, bias is not None, residual, _pow2(B), _pow2(m.cols), rows, k, split,
            self.tiling.pdl, **kw)


def _or(t: torch.Tensor | None, stand_in: torch.Tensor) -> torch.Tensor:
    # A pointer argument a constexpr flag leaves unread still needs a tensor.
    return stand_in if t is None else t
