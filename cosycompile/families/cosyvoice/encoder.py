"""CosyVoice-300M's wenet-style encoders with espnet relative-position self-attention.

Three networks of the first generation are built from these: the LM's text encoder (a Conformer
whose positions see only themselves and the past: upstream runs it with a chunk of 1), the LM itself
(a Transformer over [sos, speaker, text, task_id, speech], decoded one token at a time with a KV
cache) and the flow's token encoder (a Conformer with full attention). Keys follow upstream's
``cosyvoice.transformer`` classes (``embed.out.0``, ``encoders.N.self_attn.linear_pos``,
``encoders.N.norm_mha`` or ``norm1``, ``after_norm``). One utterance per batch, no padding.

Relative positions are computed for the positions a call needs instead of sliced from upstream's
10k-row table (not a buffer, so never in a checkpoint): the same values, no length limit, and an
exported graph without a large constant. Queries may start after a cache of any length, which
upstream's ``rel_shift`` only gets right for the two cases it runs (a prefill without a cache, one
token after one); here every query reads the row of its own offset.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cosycompile.families.conformer_blocks import PreNormEncoderLayer, RelPositionAttentionWeights
from cosycompile.families.conformer_blocks import RelPositionalEncoding as SharedRelPositionalEncoding

from .config import EncoderConfig


class RelPositionalEncoding(SharedRelPositionalEncoding):
    """The shared espnet encoding over any run of offsets, row order from the largest offset down
    (queries after a cache of any length)."""

    def offsets(self, first: int | torch.Tensor, last: int | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """[1, first-last+1, d]: embeddings of offsets first, first-1, ..., last."""
        return self.embed_offsets(torch.arange(first, last - 1, -1, device=like.device).to(torch.float32), like)


class InputLayer(nn.Module):
    """Linear, LayerNorm (and ReLU for upstream's ``linear_legacy``), then the sqrt(d) scaling."""

    def __init__(self, idim: int, odim: int, legacy: bool = False) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(idim, odim), nn.LayerNorm(odim, eps=1e-5), nn.Dropout(0.0)]
        if legacy:
            layers.append(nn.ReLU())
        self.out = nn.Sequential(*layers)
        self.pos_enc = RelPositionalEncoding(odim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x) * self.pos_enc.xscale


class RelPositionMultiHeadedAttention(RelPositionAttentionWeights):
    """Transformer-XL attention (learned biases u, v) with an optional key/value cache."""

    def heads(self, lin: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """[B, T, D] -> [B, H, T, d_k]."""
        return lin(x).view(x.size(0), x.size(1), self.h, self.d_k).transpose(1, 2)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
                past: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Attend ``x`` [B, S, D] (positions P..P+S-1 after ``past`` keys/values [B, H, P, d_k]) to all
        T = P+S keys. ``pos`` [1, S+T-1, D] embeds offsets T-1 .. -(S-1); ``mask`` (bool, [B|1, S, T])
        marks the keys each query may see (None: all). Returns the output and the keys/values [B, H, T, d_k]."""
        B, S, _ = x.shape
        q = self.linear_q(x).view(B, S, self.h, self.d_k)
        k, v = self.heads(self.linear_k, x), self.heads(self.linear_v, x)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        T = k.size(2)
        ac = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
        # (q + v) . W_pos e_k, taken as ((q + v) W_pos) . e_k: each query's [H, D] projection instead of every
        # offset's embedding through linear_pos, which costs a D x D product per cached position per step
        # (upstream's order: the 300M LM's decode step spent most of its time there).
        w_pos = self.linear_pos.weight.view(self.h, self.d_k, -1)  # [H, d_k, D]
        u = torch.matmul((q + self.pos_bias_v).transpose(1, 2), w_pos)  # [B, H, S, D]
        bd_all = torch.matmul(u, pos.transpose(1, 2)[:, None])  # [B, H, S, S+T-1]
        # Query i (position T-S+i) and key j are (T-S+i-j) apart: column S-1-i+j of ``pos``.
        col = (S - 1 - torch.arange(S, device=x.device))[:, None] + torch.arange(T, device=x.device)[None, :]
        bd = torch.gather(bd_all, 3, col[None, None].expand(B, self.h, S, T))
        return self.attend((ac + bd) / math.sqrt(self.d_k), v, mask), (k, v)


class ConformerEncoderLayer(PreNormEncoderLayer):
    """Pre-norm self-attention and swish feed-forward (no macaron, no convolution module) after a cache."""

    attention_class = RelPositionMultiHeadedAttention

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
                past: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        norm_att, norm_ff = self.norms()
        att, kv = self.self_attn(norm_att(x), pos, mask, past)
        x = x + att
        return x + self.feed_forward(norm_ff(x)), kv


class TransformerEncoderLayer(ConformerEncoderLayer):
    """The same pre-norm layer with a ReLU feed-forward and upstream's ``norm1``/``norm2`` names."""

    activation_class = nn.ReLU

    def add_norms(self, size: int) -> None:
        """Upstream's TransformerEncoderLayer: ``norm1`` (before the attention), then ``norm2``."""
        self.norm1 = nn.LayerNorm(size, eps=1e-12)
        self.norm2 = nn.LayerNorm(size, eps=1e-12)

    def norms(self) -> tuple[nn.LayerNorm, nn.LayerNorm]:
        """(``norm1``, ``norm2``)."""
        return self.norm1, self.norm2


def visible_keys(queries: int | torch.Tensor, past: int | torch.Tensor, chunk: int,
                 device: torch.device | None = None) -> torch.Tensor | None:
    """[1, S, P+S] bool: the keys each of S queries after P cached positions may see; None for full
    attention (``chunk`` 0). Query at position P+i sees every key of its own chunk and earlier ones."""
    if chunk <= 0:
        return None
    q = past + torch.arange(queries, device=device)
    k = torch.arange(past + queries, device=device)
    return (k[None, :] < (torch.div(q, chunk, rounding_mode="floor") + 1)[:, None] * chunk)[None]


class RelPosEncoder(nn.Module):
    """Input layer, N layers, after_norm; ``forward`` over a whole sequence, ``step`` after a cache."""

    layer_class: type[ConformerEncoderLayer] = ConformerEncoderLayer
    legacy_input: bool = False

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = InputLayer(cfg.input_size, cfg.output_size, self.legacy_input)
        self.encoders = nn.ModuleList(self.layer_class(cfg.output_size, cfg.attention_heads, cfg.linear_units)
                                      for _ in range(cfg.num_blocks))
        self.after_norm = nn.LayerNorm(cfg.output_size, eps=1e-5)

    def output_size(self) -> int:
        return self.cfg.output_size

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        """[1, T, input_size] -> [1, T, output_size] (the chunk mask of ``static_chunk_size``)."""
        out, _ = self.step(xs, None)
        return out

    def step(self, xs: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]] | None
             ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """``xs`` [1, S, input_size] after ``past`` (per layer keys, values [1, H, P, d_k]; None: none)
        -> (outputs [1, S, output_size], per-layer keys and values [1, H, P+S, d_k])."""
        x = self.embed(xs)
        S = x.size(1)
        P = past[0][0].size(2) if past is not None else 0
        pos = self.embed.pos_enc.offsets(P + S - 1, 1 - S, x)
        mask = visible_keys(S, P, self.cfg.static_chunk_size, x.device)
        present = []
        for i, layer in enumerate(self.encoders):
            x, kv = layer(x, pos, mask, past[i] if past is not None else None)
            present.append(kv)
        return self.after_norm(x), present


class ConformerEncoder(RelPosEncoder):
    """Upstream's ``ConformerEncoder`` as CosyVoice-300M configures it (``input_layer: linear``)."""


class TransformerEncoder(RelPosEncoder):
    """Upstream's ``TransformerEncoder`` as the 300M LM configures it (``input_layer: linear_legacy``)."""

    layer_class = TransformerEncoderLayer
    legacy_input = True
