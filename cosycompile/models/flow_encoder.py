"""CosyVoice2's flow encoder: a conformer over token embeddings that emits two mel frames per token.

Keys follow upstream's ``UpsampleConformerEncoder`` (wenet-style layer names). Only the
non-streaming, unpadded (batch of one utterance) path is implemented: it is what offline
synthesis and the exported graph use.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class EspnetRelPositionalEncoding(nn.Module):
    """Scales inputs by sqrt(d) and returns relative position embeddings for offsets -(T-1)..T-1."""

    def __init__(self, d_model: int, max_len: int = 5000) -> None:
        super().__init__()
        self.d_model = d_model
        self.xscale = math.sqrt(d_model)
        pos = torch.arange(max_len, dtype=torch.float32)[:, None]
        div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model))
        pe_pos = torch.zeros(max_len, d_model)
        pe_neg = torch.zeros(max_len, d_model)
        pe_pos[:, 0::2], pe_pos[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        pe_neg[:, 0::2], pe_neg[:, 1::2] = torch.sin(-pos * div), torch.cos(-pos * div)
        # Not a buffer upstream, so it is not in the checkpoint either.
        self.pe = torch.cat([torch.flip(pe_pos, [0]), pe_neg[1:]], dim=0)[None]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        T = x.size(1)
        center = self.pe.size(1) // 2
        pos_emb = self.pe[:, center - T + 1: center + T].to(x.dtype)
        return x * self.xscale, pos_emb


class LinearNoSubsampling(nn.Module):
    """Linear projection + LayerNorm (+ dropout), then positional encoding; keys ``out.0``, ``out.1``."""

    def __init__(self, idim: int, odim: int) -> None:
        super().__init__()
        self.out = nn.Sequential(nn.Linear(idim, odim), nn.LayerNorm(odim, eps=1e-5), nn.Dropout(0.0))
        self.pos_enc = EspnetRelPositionalEncoding(odim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pos_enc(self.out(x))


class PreLookaheadLayer(nn.Module):
    """Lets each frame see ``pre_lookahead_len`` future tokens (right zero padding at the end)."""

    def __init__(self, channels: int, pre_lookahead_len: int = 3) -> None:
        super().__init__()
        self.pre_lookahead_len = pre_lookahead_len
        self.conv1 = nn.Conv1d(channels, channels, kernel_size=pre_lookahead_len + 1)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=3)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = F.pad(inputs.transpose(1, 2), (0, self.pre_lookahead_len))
        x = F.leaky_relu(self.conv1(x))
        x = self.conv2(F.pad(x, (self.conv2.kernel_size[0] - 1, 0)))
        return x.transpose(1, 2) + inputs


class RelPositionMultiHeadedAttention(nn.Module):
    """Transformer-XL style attention with learned biases u, v over relative positions."""

    def __init__(self, n_head: int, n_feat: int) -> None:
        super().__init__()
        self.h, self.d_k = n_head, n_feat // n_head
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k = nn.Linear(n_feat, n_feat)
        self.linear_v = nn.Linear(n_feat, n_feat)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(self.h, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(self.h, self.d_k))

    @staticmethod
    def rel_shift(x: torch.Tensor) -> torch.Tensor:
        """Turn scores over offsets (2T-1 columns) into scores over key positions (T columns)."""
        b, h, t1, n = x.shape
        x = torch.cat([torch.zeros(b, h, t1, 1, dtype=x.dtype), x], dim=-1)
        x = x.view(b, h, n + 1, t1)[:, :, 1:].reshape(b, h, t1, n)
        return x[:, :, :, : n // 2 + 1]

    def forward(self, x: torch.Tensor, pos_emb: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.linear_q(x).view(B, T, self.h, self.d_k)
        k = self.linear_k(x).view(B, T, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(x).view(B, T, self.h, self.d_k).transpose(1, 2)
        p = self.linear_pos(pos_emb).view(pos_emb.size(0), -1, self.h, self.d_k).transpose(1, 2)
        ac = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
        bd = self.rel_shift(torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1)))
        attn = torch.softmax((ac + bd) / math.sqrt(self.d_k), dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(B, T, self.h * self.d_k)
        return self.linear_out(out)


class PositionwiseFeedForward(nn.Module):
    def __init__(self, idim: int, hidden: int) -> None:
        super().__init__()
        self.w_1 = nn.Linear(idim, hidden)
        self.w_2 = nn.Linear(hidden, idim)
        self.activation = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.activation(self.w_1(x)))


class ConformerEncoderLayer(nn.Module):
    """Pre-norm layer with self-attention and feed-forward only (no macaron, no conv module)."""

    def __init__(self, size: int, heads: int, units: int) -> None:
        super().__init__()
        self.self_attn = RelPositionMultiHeadedAttention(heads, size)
        self.feed_forward = PositionwiseFeedForward(size, units)
        self.norm_ff = nn.LayerNorm(size, eps=1e-12)
        self.norm_mha = nn.LayerNorm(size, eps=1e-12)

    def forward(self, x: torch.Tensor, pos_emb: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.norm_mha(x), pos_emb)
        return x + self.feed_forward(self.norm_ff(x))


class Upsample1D(nn.Module):
    """Nearest-neighbour x2 then a causal (left-padded) conv."""

    def __init__(self, channels: int, out_channels: int, stride: int = 2) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(channels, out_channels, stride * 2 + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=float(self.stride), mode="nearest")
        return self.conv(F.pad(x, (self.stride * 2, 0)))


class UpsampleConformerEncoder(nn.Module):
    def __init__(self, input_size: int, output_size: int, attention_heads: int, linear_units: int, num_blocks: int,
                 num_up_blocks: int = 4, pre_lookahead_len: int = 3, up_stride: int = 2) -> None:
        super().__init__()
        self._output_size = output_size
        self.embed = LinearNoSubsampling(input_size, output_size)
        self.pre_lookahead_layer = PreLookaheadLayer(output_size, pre_lookahead_len)
        self.encoders = nn.ModuleList(
            ConformerEncoderLayer(output_size, attention_heads, linear_units) for _ in range(num_blocks))
        self.up_layer = Upsample1D(output_size, output_size, up_stride)
        self.up_embed = LinearNoSubsampling(output_size, output_size)
        self.up_encoders = nn.ModuleList(
            ConformerEncoderLayer(output_size, attention_heads, linear_units) for _ in range(num_up_blocks))
        self.after_norm = nn.LayerNorm(output_size, eps=1e-5)

    def output_size(self) -> int:
        return self._output_size

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        """[B, N, input_size] token embeddings -> [B, 2N, output_size] (all frames valid)."""
        xs, pos_emb = self.embed(xs)
        xs = self.pre_lookahead_layer(xs)
        for layer in self.encoders:
            xs = layer(xs, pos_emb)
        xs = self.up_layer(xs.transpose(1, 2)).transpose(1, 2)
        xs, pos_emb = self.up_embed(xs)
        for layer in self.up_encoders:
            xs = layer(xs, pos_emb)
        return self.after_norm(xs)
