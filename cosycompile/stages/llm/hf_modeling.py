"""Qwen2ForCausalLM with a bias on ``lm_head``: the transformers class of the HF rewrite.

CosyVoice2's speech head (``llm_decoder``) has a bias (CosyVoice3's has none), and every family's
rewrite needs one more: ``-inf`` on every id that is not a speech or stop token. No stock Qwen2 implementation has an lm_head bias
(transformers 5.23 builds ``nn.Linear(..., bias=False)``; TensorRT-LLM's PyTorch ``LMHead`` and
vLLM's ``ParallelLMHead`` for Qwen2 take none either), and a Qwen2 body cannot fold one into its
weights (the final RMSNorm leaves no constant channel). Upstream's vLLM export uses its own
architecture for the same reason; its HF export sets ``config.use_bias``, which transformers ignores.

This file is copied verbatim into every rewrite dir as ``modeling_cosyvoice_lm.py`` and named in
``config.json``'s ``auto_map``, so ``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)``
gives the exact logits; ``architectures`` stays ``Qwen2ForCausalLM`` so servers load the body.
It must import nothing from cosycompile.
"""

from __future__ import annotations

from torch import nn
from transformers import Qwen2ForCausalLM


class CosyVoiceLMForCausalLM(Qwen2ForCausalLM):
    """Qwen2ForCausalLM whose ``lm_head`` is ``Linear(hidden, vocab, bias=True)``."""

    def __init__(self, config) -> None:  # noqa: ANN001 (a transformers Qwen2Config)
        super().__init__(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=True)
        self.post_init()
