"""What upstream's Conformer/Transformer encoders (``cosyvoice/transformer/``, wenet's layout) share
across the families that run them: espnet's relative positional encoding, the weights of the
relative-position attention, the position-wise feed-forward and the modules of a pre-norm layer.
Each family's encoder keeps its own attention arithmetic (CosyVoice2's flow encoder shifts the
scores over offsets; CosyVoice-300M's projects each query through ``linear_pos`` and attends after
a key/value cache) and picks the offsets it embeds."""

from __future__ import annotations

import math

import torch
from torch import nn


class RelPositionalEncoding(nn.Module):
    """espnet's relative positional encoding (upstream's ``EspnetRelPositionalEncoding``): the sqrt(d)
    input scale and sinusoidal embeddings of relative offsets, interleaved sin, cos.

    Upstream slices a precomputed table of 2 * 5000 - 1 rows (not a buffer, so never in a checkpoint);
    the families compute the rows a call needs instead: the same values, no length limit, and an
    exported graph without a large constant.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.xscale = math.sqrt(d_model)
        div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model))
        self.register_buffer("div_term", div, persistent=False)

    def embed_offsets(self, pos: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """[1, len(pos), d] in ``like``'s dtype: the embeddings of the offsets ``pos`` (float32)."""
        ang = pos[:, None] * self.div_term[None, :]
        return torch.stack([ang.sin(), ang.cos()], dim=-1).reshape(1, -1, self.d_model).to(like.dtype)


class RelPositionAttentionWeights(nn.Module):
    """The parameters of upstream's ``RelPositionMultiHeadedAttention`` (Transformer-XL attention with
    learned biases u, v): ``linear_q/k/v/out``, ``linear_pos`` (no bias), ``pos_bias_u/v`` [heads, d_k]."""

    def __init__(self, n_head: int, n_feat: int, key_bias: bool = True) -> None:
        super().__init__()
        self.h, self.d_k = n_head, n_feat // n_head
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k = nn.Linear(n_feat, n_feat, bias=key_bias)
        self.linear_v = nn.Linear(n_feat, n_feat)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(self.h, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(self.h, self.d_k))
        nn.init.xavier_uniform_(self.pos_bias_u)
        nn.init.xavier_uniform_(self.pos_bias_v)

    def attend(self, scores: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Softmax of ``scores`` [B, H, S, T] over the keys ``mask`` (bool, [B|1, S, T]; None: all) lets
        each query see (a query that sees none gets zeros), applied to ``v`` [B, H, T, d_k], heads
        merged, through ``linear_out``: [B, S, H * d_k]."""
        if mask is None:
            attn = torch.softmax(scores, dim=-1)
        else:
            blocked = ~mask[:, None]
            attn = torch.softmax(scores.masked_fill(blocked, -float("inf")), dim=-1).masked_fill(blocked, 0.0)
        B, _, S, _ = scores.shape
        return self.linear_out(torch.matmul(attn, v).transpose(1, 2).reshape(B, S, self.h * self.d_k))


class PositionwiseFeedForward(nn.Module):
    """w_1 -> activation -> w_2 on every position (swish in the Conformers, ReLU in the 300M LM)."""

    def __init__(self, idim: int, hidden: int, activation: nn.Module) -> None:
        super().__init__()
        self.w_1 = nn.Linear(idim, hidden)
        self.activation = activation
        self.w_2 = nn.Linear(hidden, idim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., idim] -> [..., idim]."""
        return self.w_2(self.activation(self.w_1(x)))


class PreNormEncoderLayer(nn.Module):
    """The modules of upstream's ``ConformerEncoderLayer`` as CosyVoice configures it (pre-norm, no
    macaron, no convolution module): ``self_attn`` (the family's ``attention_class``), a swish
    ``feed_forward``, then the two LayerNorms, made in upstream's order (so the seeded weights and the
    state dict's order are upstream's). A family's subclass brings the forward its attention needs."""

    attention_class: type[RelPositionAttentionWeights]
    activation_class: type[nn.Module] = nn.SiLU

    def __init__(self, size: int, heads: int, units: int) -> None:
        super().__init__()
        self.self_attn = self.attention_class(heads, size)
        self.feed_forward = PositionwiseFeedForward(size, units, self.activation_class())
        self.add_norms(size)

    def add_norms(self, size: int) -> None:
        """The Conformer's LayerNorms: ``norm_ff`` (before the feed-forward), then ``norm_mha``."""
        self.norm_ff = nn.LayerNorm(size, eps=1e-12)
        self.norm_mha = nn.LayerNorm(size, eps=1e-12)

    def norms(self) -> tuple[nn.LayerNorm, nn.LayerNorm]:
        """(the norm before the attention, the norm before the feed-forward)."""
        return self.norm_mha, self.norm_ff
