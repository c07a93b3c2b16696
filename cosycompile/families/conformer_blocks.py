"""What upstream's Conformer/Transformer encoders (``cosyvoice/transformer/``, wenet's layout) share
across the families that run them: the weights of the relative-position attention and the
position-wise feed-forward. Each family's encoder keeps its own attention arithmetic (CosyVoice2's
flow encoder shifts the scores over offsets; CosyVoice-300M's projects each query through
``linear_pos`` and attends after a key/value cache)."""

from __future__ import annotations

import torch
from torch import nn


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
