"""CosyVoice3's flow estimator: a diffusion transformer (DiT) over 80-bin mels, inference only.

Module names follow upstream's ``cosyvoice.flow.DiT`` so that ``flow.pt``'s ``decoder.estimator.*``
keys load strictly: ``time_embed.time_mlp.{0,2}``, ``input_embed.proj``,
``input_embed.conv_pos_embed.conv{1,2}.0``, ``rotary_embed.inv_freq``,
``transformer_blocks.N.{attn_norm.linear, attn.to_{q,k,v}, attn.to_out.0, ff.ff.0.0, ff.ff.2}``,
``norm_out.linear``, ``proj_out``. Dropout layers hold no weights and are left out (inference).

Two upstream quirks are kept on purpose, since the checkpoint was trained with them:
- the rotary embedding (x-transformers' ``apply_rotary_pos_emb``) is applied to the projected
  queries and keys *before* they are split into heads, and it rotates only the first ``dim_head``
  channels: only head 0 sees positions, the others rely on the causal convolutional position embedding;
- its rotation pairs neighbouring channels (2k, 2k+1), not the two halves as Qwen2's does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import DiTConfig


class SinusPositionEmbedding(nn.Module):
    """[sin | cos] features of ``scale * t`` over log-spaced frequencies (no weights)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor, scale: float = 1000.0) -> torch.Tensor:
        half = self.dim // 2
        step = math.log(10000) / (half - 1)
        freqs = torch.exp(torch.arange(half, device=t.device).float() * -step)
        # (scale * t) first, then the frequencies: upstream's order of rounding.
        angles = scale * t.unsqueeze(1) * freqs.unsqueeze(0)
        return torch.cat((angles.sin(), angles.cos()), dim=-1)


class TimestepEmbedding(nn.Module):
    """Flow time t [B] -> conditioning vector [B, dim] (sinusoid, then a two-layer SiLU MLP)."""

    def __init__(self, dim: int, freq_embed_dim: int = 256) -> None:
        super().__init__()
        self.time_embed = SinusPositionEmbedding(freq_embed_dim)
        self.time_mlp = nn.Sequential(nn.Linear(freq_embed_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.time_mlp(self.time_embed(t).to(t.dtype))


class CausalConvPositionEmbedding(nn.Module):
    """Two grouped convolutions with Mish, each padded on the left only, so frame i sees frames <= i."""

    def __init__(self, dim: int, kernel_size: int = 31, groups: int = 16) -> None:
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        self.kernel_size = kernel_size
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups, padding=0), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups, padding=0), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, D] -> [B, T, D]."""
        h = x.transpose(1, 2)
        h = self.conv1(F.pad(h, (self.kernel_size - 1, 0)))
        h = self.conv2(F.pad(h, (self.kernel_size - 1, 0)))
        return h.transpose(1, 2)


class InputEmbedding(nn.Module):
    """Noisy mel, prompt mel, token features and speaker vector -> model width, plus conv positions."""

    def __init__(self, mel_dim: int, mu_dim: int, out_dim: int, spk_dim: int, cfg: DiTConfig) -> None:
        super().__init__()
        self.spk_dim = spk_dim
        # Input order is fixed by the trained weights: x, cond, mu, spks.
        self.proj = nn.Linear(mel_dim * 2 + mu_dim + spk_dim, out_dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(out_dim, cfg.conv_pos_kernel, cfg.conv_pos_groups)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, mu: torch.Tensor, spks: torch.Tensor) -> torch.Tensor:
        parts = [x, cond, mu]
        if self.spk_dim > 0:
            parts.append(spks[:, None, :].expand(-1, x.shape[1], -1))
        h = self.proj(torch.cat(parts, dim=-1))
        return self.conv_pos_embed(h) + h


class RotaryEmbedding(nn.Module):
    """x-transformers' rotary table: angles t * inv_freq, each repeated for a channel pair.

    ``inv_freq`` is a persistent buffer there, hence a key of the checkpoint.
    """

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq)

    def forward(self, seq_len: int) -> torch.Tensor:
        """Angles [1, T, dim]: channel 2k and 2k+1 share frequency k."""
        t = torch.arange(seq_len, device=self.inv_freq.device).to(self.inv_freq.dtype)
        freqs = t[None, :, None] * self.inv_freq[None, None, :]
        return torch.stack((freqs, freqs), dim=-1).flatten(-2)


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)."""
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def apply_rotary(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``angles.shape[-1]`` channels of x [B, T, C]; the rest pass unchanged."""
    width = angles.shape[-1]
    angles = angles[:, -x.shape[-2]:, :]
    head, tail = x[..., :width], x[..., width:]
    head = head * angles.cos() + _rotate_pairs(head) * angles.sin()
    return torch.cat((head, tail), dim=-1).to(x.dtype)


class Attention(nn.Module):
    """Multi-head self-attention with a boolean mask [B, 1, T, T]; padded query rows come out zero."""

    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        self.heads, self.dim_head = heads, dim_head
        inner = heads * dim_head
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])

    def forward(self, x: torch.Tensor, mask: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        q = apply_rotary(self.to_q(x), angles)
        k = apply_rotary(self.to_k(x), angles)
        v = self.to_v(x)
        q, k, v = (t.view(B, -1, self.heads, self.dim_head).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
        out = self.to_out[0](out.transpose(1, 2).reshape(B, -1, self.heads * self.dim_head))
        # Upstream zeroes the rows of keys the *last* query cannot see, i.e. the padded frames.
        return out.masked_fill(~mask[:, 0, -1].unsqueeze(-1), 0.0)


class AdaLayerNorm(nn.Module):
    """What upstream's two adaptive LayerNorms share: a LayerNorm without affine weights, and ``linear``
    over the SiLU of the time vector, which makes ``parts`` modulation vectors."""

    parts: int

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(dim, dim * self.parts)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def modulation(self, emb: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The ``parts`` modulation vectors [B, dim] of the time vector ``emb`` [B, dim]."""
        return self.linear(self.silu(emb)).chunk(self.parts, dim=1)


class AdaLayerNormZero(AdaLayerNorm):
    """LayerNorm modulated by the time vector; also returns the gates and the MLP's modulation."""

    parts = 6

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> tuple[torch.Tensor, ...]:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.modulation(emb)
        return self.norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None], gate_msa, shift_mlp, scale_mlp, gate_mlp


class AdaLayerNormZeroFinal(AdaLayerNorm):
    """The output LayerNorm, modulated by the time vector (scale first, then shift, as trained)."""

    parts = 2

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        scale, shift = self.modulation(emb)
        return self.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]


class FeedForward(nn.Module):
    """Linear -> tanh-GELU -> Linear; nested as upstream's so keys read ``ff.ff.0.0`` / ``ff.ff.2``."""

    def __init__(self, dim: int, mult: int) -> None:
        super().__init__()
        inner = int(dim * mult)
        self.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")),
                                nn.Identity(), nn.Linear(inner, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class DiTBlock(nn.Module):
    """adaLN-Zero transformer block: modulated attention and modulated MLP, each gated."""

    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: int) -> None:
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim)
        self.attn = Attention(dim, heads, dim_head)
        self.ff_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff = FeedForward(dim, ff_mult)

    def forward(self, x: torch.Tensor, t: torch.Tensor, mask: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        h, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.attn_norm(x, t)
        x = x + gate_msa.unsqueeze(1) * self.attn(h, mask, angles)
        h = self.ff_norm(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        return x + gate_mlp.unsqueeze(1) * self.ff(h)


def chunk_mask(size: int, chunk: int, device: torch.device | None = None) -> torch.Tensor:
    """[T, T] bool: frame i sees every frame up to the end of its own ``chunk``-frame block.

    Upstream's ``subsequent_chunk_mask`` (the export-friendly form, which always keeps all left chunks).
    """
    pos = torch.arange(size, device=device)
    block_end = (torch.div(pos, chunk, rounding_mode="trunc") + 1) * chunk
    return pos.unsqueeze(0) < block_end.unsqueeze(1)


def attention_mask(mask: torch.Tensor, streaming: bool, static_chunk_size: int) -> torch.Tensor:
    """Boolean attention mask [B, 1, T, T] from the frame mask [B, 1, T], as upstream's DiT builds it.

    Streaming keeps upstream's static chunks (frame i sees the rest of its 50-frame chunk and all
    before); otherwise every valid frame sees every valid frame. Rows that would see nothing are
    opened fully, as ``add_optional_chunk_mask`` does, so attention never softmaxes an empty row.
    """
    valid = mask.bool()
    T = valid.shape[-1]
    if streaming and static_chunk_size > 0:
        rows = valid & chunk_mask(T, static_chunk_size, valid.device).unsqueeze(0)  # [B, T, T]
    else:
        rows = valid  # [B, 1, T]; upstream opens empty rows before repeating them over queries
    # An empty row opens whole: ``rows | ~any`` rather than a Where over booleans, which ONNX Runtime's
    # CPU kernels do not implement.
    rows = rows | ~rows.any(dim=-1, keepdim=True)
    if rows.shape[1] != T:
        rows = rows.expand(-1, T, -1)
    return rows.unsqueeze(1)


class DiT(nn.Module):
    """The estimator: velocity [B, 80, T] from noisy mel x, frame mask, token features mu, time t,
    speaker vector and prompt mel ``cond`` (all channel-first, as the CFM passes them)."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.time_embed = TimestepEmbedding(cfg.dim, cfg.freq_embed_dim)
        self.input_embed = InputEmbedding(cfg.mel_dim, cfg.mu_dim, cfg.dim, cfg.spk_dim, cfg)
        self.rotary_embed = RotaryEmbedding(cfg.dim_head)
        self.transformer_blocks = nn.ModuleList(
            DiTBlock(cfg.dim, cfg.heads, cfg.dim_head, cfg.ff_mult) for _ in range(cfg.depth))
        self.long_skip_connection = nn.Linear(cfg.dim * 2, cfg.dim, bias=False) if cfg.long_skip_connection else None
        self.norm_out = AdaLayerNormZeroFinal(cfg.dim)
        self.proj_out = nn.Linear(cfg.dim, cfg.mel_dim)
        self.static_chunk_size = cfg.static_chunk_size

    def forward(self, x: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, spks: torch.Tensor,
                cond: torch.Tensor, streaming: bool = False) -> torch.Tensor:
        """x, mu, cond [B, 80, T]; mask [B, 1, T]; t [B] (or a scalar); spks [B, 80] -> [B, 80, T]."""
        x, mu, cond = x.transpose(1, 2), mu.transpose(1, 2), cond.transpose(1, 2)
        B, T = x.shape[0], x.shape[1]
        if t.ndim == 0:
            t = t.repeat(B)
        temb = self.time_embed(t)
        h = self.input_embed(x, cond, mu, spks)
        angles = self.rotary_embed(T)
        residual = h
        attn_mask = attention_mask(mask, streaming, self.static_chunk_size)
        for block in self.transformer_blocks:
            h = block(h, temb, attn_mask, angles)
        if self.long_skip_connection is not None:
            h = self.long_skip_connection(torch.cat((h, residual), dim=-1))
        return self.proj_out(self.norm_out(h, temb)).transpose(1, 2)
