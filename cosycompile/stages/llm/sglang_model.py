"""The SGLang model class of the HF rewrite: SGLang's own Qwen2 with a bias on ``lm_head``, applied.

Written against sglang 0.5.23 (the release's wheel; line numbers from its sources):

- ``sglang.srt.models.qwen2.Qwen2ForCausalLM.__init__(config, quant_config=None, prefix="")``
  (qwen2.py:520) builds ``ParallelLMHead(vocab, hidden, quant_config=..., prefix=...)`` without a bias
  on the last pipeline rank (``self.pp_group.is_last_rank``, :535) and its weight loader skips a
  checkpoint's ``*.bias`` that has no parameter (:708), so the stock class drops ``lm_head.bias``
  without a word;
- ``ParallelLMHead(..., *, bias=False, ...)`` (vocab_parallel_embedding.py:562) registers and loads
  a bias when asked, sized as this rank's padded share of the vocabulary;
- ``LogitsProcessor._compute_lm_head(hidden_states, lm_head, embedding_bias=None, *, out=None)``
  (logits_processor.py:1144) multiplies by ``lm_head.weight`` only: no path adds ``lm_head.bias``.

So the class builds the head with ``bias=True`` and its logits processor adds the head's bias after
SGLang's own product. SGLang finds it through ``SGLANG_EXTERNAL_MODEL_PACKAGE`` (environ.py:325):
``registry.import_model_classes`` imports each submodule of that package and takes its
``EntryClass`` (registry.py:117-140), keyed by the class's name; the server then loads the rewrite
with ``--json-model-override-args '{"architectures": ["CosyVoiceLMForCausalLM"]}'``.

This file is copied verbatim into every rewrite dir as ``sglang_plugin/cosyvoice_sglang/model.py``.
It imports nothing from cosycompile and nothing of SGLang until SGLang asks for ``EntryClass``.
"""

from __future__ import annotations

from typing import Any

ARCHITECTURE = "CosyVoiceLMForCausalLM"
PACKAGE = "cosyvoice_sglang"  # the package's name once installed from the rewrite dir
_built: dict[str, Any] = {}


def _model_class() -> type:
    from sglang.srt.layers.logits_processor import LogitsProcessor
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead
    from sglang.srt.models.qwen2 import Qwen2ForCausalLM
    from sglang.srt.utils import add_prefix

    class BiasedLogitsProcessor(LogitsProcessor):
        """SGLang's logits processor, plus the head's bias on every logit it computes."""

        def _compute_lm_head(self, hidden_states: Any, lm_head: Any, embedding_bias: Any = None, **kwargs: Any) -> Any:
            logits = super()._compute_lm_head(hidden_states, lm_head, embedding_bias, **kwargs)
            bias = getattr(lm_head, "bias", None)
            # In place: a caller that passed ``out`` reads its logits from that buffer.
            return logits if bias is None else logits.add_(bias.to(logits.dtype))

    class CosyVoiceLMForCausalLM(Qwen2ForCausalLM):
        """SGLang's Qwen2ForCausalLM whose ``lm_head`` has a bias, added to every logit."""

        def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
            if config.tie_word_embeddings:
                raise ValueError(f"{ARCHITECTURE}: the rewrite's lm_head is untied (tie_word_embeddings false)")
            super().__init__(config, quant_config=quant_config, prefix=prefix)
            if self.pp_group.is_last_rank:
                self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, bias=True,
                                              quant_config=quant_config, prefix=add_prefix("lm_head", prefix))
            self.logits_processor = BiasedLogitsProcessor(config)

    CosyVoiceLMForCausalLM.__module__ = __name__
    return CosyVoiceLMForCausalLM


def __getattr__(name: str) -> Any:
    # SGLang's registry asks ``hasattr(module, "EntryClass")``; the class subclasses SGLang's, so it
    # is built on that first access, never at import.
    if name not in ("EntryClass", ARCHITECTURE):
        raise AttributeError(name)
    if ARCHITECTURE not in _built:
        _built[ARCHITECTURE] = _model_class()
    return _built[ARCHITECTURE]
