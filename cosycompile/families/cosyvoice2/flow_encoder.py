"""CosyVoice2's flow encoder: a conformer over token embeddings that emits two mel frames per token.

Keys follow upstream's ``UpsampleConformerEncoder`` (wenet-style layer names). One utterance per
batch (no padding mask). Non-streaming attention is full; ``streaming=True`` applies upstream's
chunk masks (``static_chunk_size`` tokens before the upsampling, ``stride`` times that after), and
``context`` carries the look-ahead tokens of a not-yet-final chunk.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from cosycompile.families.conformer_blocks import PreNormEncoderLayer, RelPositionalEncoding, RelPositionAttentionWeights


class EspnetRelPositionalEncoding(RelPositionalEncoding):
    """Scales inputs by sqrt(d) and returns relative position embeddings for offsets T-1 .. -(T-1)
    (the shared espnet encoding; no 20 MB table in the exported graph)."""

    def position_encoding(self, size: int | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """[1, 2*size-1, d]: row k encodes relative position size-1-k (keys left of the query first)."""
        return self.embed_offsets(torch.arange(size - 1, -size, -1, device=like.device).to(torch.float32), like)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * self.xscale, self.position_encoding(x.size(1), x)


class LinearNoSubsampling(nn.Module):
    """Linear projection + LayerNorm (+ dropout), then positional encoding; keys ``out.0``, ``out.1``."""

    def __init__(self, idim: int, odim: int) -> None:
        super().__init__()
        self.out = nn.Sequential(nn.Linear(idim, odim), nn.LayerNorm(odim, eps=1e-5), nn.Dropout(0.0))
        self.pos_enc = EspnetRelPositionalEncoding(odim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pos_enc(self.out(x))


class PreLookaheadLayer(nn.Module):
    """Lets each token see ``pre_lookahead_len`` future tokens (zeros past the end, or ``context``)."""

    def __init__(self, channels: int, pre_lookahead_len: int = 3) -> None:
        super().__init__()
        self.pre_lookahead_len = pre_lookahead_len
        self.conv1 = nn.Conv1d(channels, channels, kernel_size=pre_lookahead_len + 1)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=3)

    def forward(self, inputs: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T, C] -> [B, T, C]; ``context`` [B, <=L, C] are the embedded tokens after the chunk."""
        x = inputs.transpose(1, 2)
        n_ctx = 0 if context is None else context.size(1)
        if n_ctx:
            x = torch.cat([x, context.transpose(1, 2)], dim=2)
        x = F.leaky_relu(self.conv1(F.pad(x, (0, self.pre_lookahead_len - n_ctx))))
        x = self.conv2(F.pad(x, (self.conv2.kernel_size[0] - 1, 0)))
        return x.transpose(1, 2) + inputs


class RelPositionMultiHeadedAttention(RelPositionAttentionWeights):
    """Transformer-XL style attention with learned biases u, v over relative positions."""

    @staticmethod
    def rel_shift(x: torch.Tensor) -> torch.Tensor:
        """Scores over offsets (2T-1 columns) -> scores over key positions (T columns)."""
        b, h, t1, n = x.shape
        x = torch.cat([torch.zeros(b, h, t1, 1, dtype=x.dtype, device=x.device), x], dim=-1)
        x = x.view(b, h, n + 1, t1)[:, :, 1:].reshape(b, h, t1, n)
        return x[:, :, :, : n // 2 + 1]

    def forward(self, x: torch.Tensor, pos_emb: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``mask`` (bool, [B, 1 or T, T]) marks the keys each query may attend to; None = all."""
        B, T, _ = x.shape
        q = self.linear_q(x).view(B, T, self.h, self.d_k)
        k = self.linear_k(x).view(B, T, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(x).view(B, T, self.h, self.d_k).transpose(1, 2)
        p = self.linear_pos(pos_emb).view(pos_emb.size(0), -1, self.h, self.d_k).transpose(1, 2)
        ac = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
        bd = self.rel_shift(torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1)))
        return self.attend((ac + bd) / math.sqrt(self.d_k), v, mask)


class ConformerEncoderLayer(PreNormEncoderLayer):
    """Pre-norm layer with self-attention and feed-forward only (no macaron, no conv module)."""

    attention_class = RelPositionMultiHeadedAttention

    def forward(self, x: torch.Tensor, pos_emb: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.norm_mha(x), pos_emb, mask)
        return x + self.feed_forward(self.norm_ff(x))


class Upsample1D(nn.Module):
    """Nearest-neighbour x stride, then a causal (left-padded) conv."""

    def __init__(self, channels: int, out_channels: int, stride: int = 2) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(channels, out_channels, stride * 2 + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=float(self.stride), mode="nearest")
        return self.conv(F.pad(x, (self.stride * 2, 0)))


def chunk_mask(size: int | torch.Tensor, chunk: int, device: torch.device | None = None) -> torch.Tensor:
    """[1, T, T] bool: frame i sees every frame of its own chunk and of all earlier chunks."""
    idx = torch.arange(size, device=device)
    return (idx[None, :] < (torch.div(idx, chunk, rounding_mode="floor") + 1)[:, None] * chunk)[None]


class UpsampleConformerEncoder(nn.Module):
    """Conformer over tokens, x2 upsampling, conformer over frames (keys as upstream)."""

    def __init__(self, input_size: int, output_size: int, attention_heads: int, linear_units: int, num_blocks: int,
                 num_up_blocks: int = 4, pre_lookahead_len: int = 3, up_stride: int = 2,
                 static_chunk_size: int = 25) -> None:
        super().__init__()
        self._output_size = output_size
        self.static_chunk_size = static_chunk_size
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

    def forward(self, xs: torch.Tensor, context: torch.Tensor | None = None, streaming: bool = False) -> torch.Tensor:
        """[B, N, input_size] token embeddings -> [B, stride*N, output_size].

        ``context`` [B, <=pre_lookahead_len, input_size]: embeddings of the tokens that follow
        (only the look-ahead conv reads them; they produce no frames).
        """
        xs, pos_emb = self.embed(xs)
        if context is not None and context.size(1) > 0:
            context = self.embed.out(context) * self.embed.pos_enc.xscale
        mask = chunk_mask(xs.size(1), self.static_chunk_size, xs.device) if streaming else None
        xs = self.pre_lookahead_layer(xs, context)
        for layer in self.encoders:
            xs = layer(xs, pos_emb, mask)
        xs = self.up_layer(xs.transpose(1, 2)).transpose(1, 2)
        xs, pos_emb = self.up_embed(xs)
        if streaming:
            mask = chunk_mask(xs.size(1), self.static_chunk_size * self.up_layer.stride, xs.device)
        for layer in self.up_encoders:
            xs = layer(xs, pos_emb, mask)
        return self.after_norm(xs)
