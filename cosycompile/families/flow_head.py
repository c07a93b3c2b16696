"""The token embedding and x-vector projection that upstream's three flows open with
(``cosyvoice/flow/flow.py``: ``MaskedDiffWithXvec``, ``CausalMaskedDiffWithXvec``,
``CausalMaskedDiffWithDiT``), the base of every family's flow network. Keys are upstream's
(``input_embedding``, ``spk_embed_affine_layer``), made first as upstream makes them, so that the
seeded weights and the state dict's order stay as they were.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cosycompile.families.flow_config import FlowConfig


class FlowHead(nn.Module):
    """``cfg``, the speech-token embedding and the speaker projection of a flow network."""

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)

    def embed(self, token: torch.Tensor) -> torch.Tensor:
        """Speech tokens [B, N] -> [B, N, input_size] (negative ids read as 0, as upstream)."""
        return self.input_embedding(torch.clamp(token, min=0))

    def speaker(self, embedding: torch.Tensor) -> torch.Tensor:
        """x-vector [B, spk_embed_dim] -> spks [B, output_size] (L2-normalised, then projected)."""
        return self.spk_embed_affine_layer(F.normalize(embedding, dim=1))
