"""The Matcha-TTS blocks both UNet estimators are built of (CosyVoice-300M's non-causal
``ConditionalDecoder``, CosyVoice2's ``CausalConditionalDecoder``): the flow time's embedding and the
transformer block, with diffusers' attention and feed-forward names so the keys are upstream's
(``time_mlp.linear_1``, ``...attn1.to_q.weight``, ``...ff.net.0.proj.weight``).

Upstream: Matcha-TTS ``matcha/models/components/decoder.py`` and ``transformer.py`` (dd9105b), as
FunAudioLLM/CosyVoice's ``flow/decoder.py`` uses them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class SinusoidalPosEmb(nn.Module):
    """Sinusoidal embedding of the flow time t in [0, 1], scaled by 1000 (Matcha-TTS)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"the time embedding needs an even width, got {dim}")
        self.dim = dim

    def forward(self, t: torch.Tensor, scale: float = 1000.0) -> torch.Tensor:
        """[B] -> [B, dim]: sin half, then cos half."""
        half = self.dim // 2
        freqs = torch.exp(torch.arange(half, dtype=torch.float32, device=t.device) * -(math.log(10000.0) / (half - 1)))
        emb = scale * t[:, None] * freqs[None, :]
        return torch.cat([emb.sin(), emb.cos()], dim=-1)


class TimestepEmbedding(nn.Module):
    """Linear, SiLU, linear on the time embedding; keys ``linear_1``, ``linear_2``."""

    def __init__(self, in_channels: int, time_embed_dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, time_embed_dim)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(time_embed_dim, time_embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, in_channels] -> [B, time_embed_dim]."""
        return self.linear_2(self.act(self.linear_1(x)))


class Attention(nn.Module):
    """diffusers' self-attention as Matcha configures it: to_q/k/v without bias, to_out.0 with bias."""

    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        inner = heads * dim_head
        self.heads, self.dim_head = heads, dim_head
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """x [B, T, dim], additive bias [B, T, T] (broadcast over the heads) -> [B, T, dim]."""
        B, T, _ = x.shape
        q, k, v = (lin(x).view(B, T, self.heads, self.dim_head).transpose(1, 2)
                   for lin in (self.to_q, self.to_k, self.to_v))
        # SDPA as upstream's diffusers processor runs it: compiled backends get a fused CPU/GPU attention
        # kernel that never materialises the [B, heads, T, T] scores (faster on the whole estimator,
        # eager: docs/bench-log/2026-11-24-torch-backend-after-sdpa.md).
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias[:, None])
        return self.to_out[0](out.transpose(1, 2).reshape(B, T, self.heads * self.dim_head))


class GELUProj(nn.Module):
    """diffusers' ``GELU`` activation module: a projection, then exact GELU; key ``proj``."""

    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., dim_in] -> [..., dim_out]."""
        return F.gelu(self.proj(x))


class FeedForward(nn.Module):
    """Matcha's feed-forward with ``act_fn: gelu``: ``net.0`` GELU projection x4, ``net.2`` back."""

    def __init__(self, dim: int, mult: int = 4) -> None:
        super().__init__()
        self.net = nn.ModuleList([GELUProj(dim, dim * mult), nn.Dropout(0.0), nn.Linear(dim * mult, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., dim] -> [..., dim]."""
        for m in self.net:
            x = m(x)
        return x


class BasicTransformerBlock(nn.Module):
    """Matcha's transformer block without cross-attention: pre-norm self-attention, pre-norm feed-forward."""

    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads, dim_head)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """x [B, T, dim], additive bias [B, T, T] -> [B, T, dim]."""
        x = x + self.attn1(self.norm1(x), bias)
        return x + self.ff(self.norm3(x))
