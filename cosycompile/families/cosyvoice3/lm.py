"""CosyVoice3's speech-token LM: a plain Qwen2 body (``transformers``) with CosyVoice3's own speech side.

What differs from CosyVoice2's ``Qwen2LM`` (upstream ``cosyvoice/llm/llm.py::CosyVoice3LM``):
- no ``llm_embedding``: sos and task_id are rows of ``speech_embedding``, which has
  ``speech_token_size + 200`` rows (6,761): sos 6561, eos 6562, task_id 6563, fill 6564, the rest unused;
- ``llm_decoder`` is ``Linear(896, 6761, bias=False)``, so the head loads in stock Qwen2 loaders;
- every id from 6561 to 6760 stops decoding;
- the text must contain ``<|endofprompt|>`` (Qwen token 151646) in the text or the prompt text;
- while fewer than ``min_len`` tokens are out, upstream masks one row, ``speech_token_size`` (which in
  CosyVoice3 is *sos*, not eos): the rule is kept as upstream runs it.

State-dict keys as ``llm.pt``: ``llm.model.model.*`` (the Qwen2 body), ``llm.model.lm_head.weight``
(tied to the text embedding, unused), ``llm_decoder.weight``, ``speech_embedding.weight``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cosycompile.families.qwen2_body import Qwen2Encoder, qwen2_config

from .config import LMConfig

# Qwen's ``<|endofprompt|>``: upstream asserts it is in the text (or prompt text) of every request.
ENDOFPROMPT_ID = 151646


class CosyVoice3LM(nn.Module):
    """The LM of CosyVoice3 (what inference needs; no training losses)."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        S = cfg.speech_token_size
        self.speech_token_size = S
        self.sos, self.eos_token, self.task_id, self.fill_token = S, S + 1, S + 2, S + 3
        self.stop_token_ids = list(range(S, S + cfg.extra_speech_rows))
        # The row upstream's ``sampling_ids(ignore_eos=True)`` sets to -inf before min_len.
        self.ignore_eos_id = S
        self.llm = Qwen2Encoder(qwen2_config(cfg))
        self.llm_decoder = nn.Linear(cfg.hidden_size, S + cfg.extra_speech_rows, bias=False)
        self.speech_embedding = nn.Embedding(S + cfg.extra_speech_rows, cfg.hidden_size)

    @property
    def qwen(self) -> nn.Module:
        """The ``transformers`` Qwen2ForCausalLM."""
        return self.llm.model

    def prompt_embeddings(self, text: torch.Tensor, prompt_text: torch.Tensor | None = None,
                          prompt_speech_token: torch.Tensor | None = None) -> torch.Tensor:
        """``[sos | prompt text, text | task_id | prompt speech tokens]`` embeddings [1, S, H]."""
        if prompt_text is not None and prompt_text.shape[1] > 0:
            text = torch.cat([prompt_text, text], dim=1)
        w = self.speech_embedding.weight
        parts = [w[self.sos].reshape(1, 1, -1), self.qwen.model.embed_tokens(text), w[self.task_id].reshape(1, 1, -1)]
        if prompt_speech_token is not None and prompt_speech_token.shape[1] > 0:
            parts.append(self.speech_embedding(prompt_speech_token))
        return torch.cat(parts, dim=1)

    def step(self, inputs_embeds: torch.Tensor, cache: Any = None) -> tuple[torch.Tensor, Any]:
        """Speech-token logits [B, S, 6761] of the new positions, and the grown KV cache."""
        hidden, cache = self.llm.forward_one_step(inputs_embeds, cache)
        return self.llm_decoder(hidden), cache

    def mask_before_min_len(self, logp: torch.Tensor) -> torch.Tensor:
        """Upstream's ``ignore_eos``: a copy of ``logp`` [..., V] with row ``speech_token_size`` at -inf."""
        logp = logp.clone()
        logp[..., self.ignore_eos_id] = -float("inf")
        return logp
