"""The Qwen2 body of the speech LM that CosyVoice2 and CosyVoice3 share (upstream's ``Qwen2Encoder``,
``cosyvoice/llm/llm.py``): its ``transformers`` config, built from :class:`Qwen2LMConfig` without a
download, and the module that holds the Hugging Face model, so that a family's LM keeps upstream's keys
(``llm.model.model.layers...``). transformers is imported only when a body is built.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from cosycompile.families.qwen2_config import Qwen2LMConfig


def qwen2_config(cfg: Qwen2LMConfig, **extra: Any) -> Any:
    """The ``transformers.Qwen2Config`` of the body (built locally: nothing is downloaded; architectures
    set for ModelOpt export); ``extra`` are further fields of the config a family writes."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        hidden_act="silu", max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_word_embeddings, use_sliding_window=False,
        attention_dropout=0.0, architectures=["Qwen2ForCausalLM"], **extra,
    )


class Qwen2Encoder(nn.Module):
    """Holds the HF model under ``.model`` so that keys read ``llm.model.model.layers...``."""

    def __init__(self, hf_cfg: Any) -> None:
        """``hf_cfg``: the body's ``transformers.Qwen2Config`` (:func:`qwen2_config`)."""
        super().__init__()
        from transformers import Qwen2ForCausalLM

        # Eager attention: the same arithmetic on every backend and in every export path.
        hf_cfg._attn_implementation = "eager"
        self.model = Qwen2ForCausalLM(hf_cfg)

    def forward_one_step(self, inputs_embeds: torch.Tensor, cache: Any = None) -> tuple[torch.Tensor, Any]:
        """Last hidden states [B, S, H] of new positions attending to the whole cache, and the new cache.

        No attention mask is passed: with batch 1 and no padding, causal attention over past and
        new positions is what upstream means. (Upstream passes a mask as long as the *new* positions
        only; transformers 4.51 ignored it, transformers >= 5 honours it and then sees a wrong length.)
        """
        body = self.model.model
        # transformers renamed ``past_key_values`` to ``cache`` during 5.x; pass whichever this one takes.
        name = "cache" if "cache" in inspect.signature(body.forward).parameters else "past_key_values"
        out = body(inputs_embeds=inputs_embeds, use_cache=True, **{name: cache})
        new_cache = getattr(out, "cache", None)
        return out.last_hidden_state, new_cache if new_cache is not None else out.past_key_values
