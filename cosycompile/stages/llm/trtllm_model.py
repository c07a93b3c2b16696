"""The TensorRT-LLM (PyTorch backend) model class of the HF rewrite: its Qwen2 with a bias on ``lm_head``.

Written against NVIDIA/TensorRT-LLM's sources as stored at these commits (one file each):

- ``tensorrt_llm/_torch/models/modeling_qwen.py`` at 047098b74c51: ``@register_auto_model("Qwen2ForCausalLM")``
  on ``Qwen2ForCausalLM(DecoderModelForCausalLM)``, ``__init__(self, model_config: ModelConfig[Qwen2Config])``;
  its ``forward`` ends in ``self.logits_processor.forward(output, self.lm_head, attn_metadata,
  return_context_logits)``, which calls ``lm_head(hidden_states)``;
- ``tensorrt_llm/_torch/modules/embedding.py`` at 06d0733f493: ``LMHead(Linear)`` is built with
  ``bias=False`` and ``register_parameter("bias", None)``; its weight is ``(out_features, in_features)``,
  ``out_features`` this rank's share of the vocabulary (column parallel), ``padding_size`` the padding
  the last rank carries;
- ``tensorrt_llm/_torch/modules/linear.py`` at ed53795b33f: ``Linear.forward`` passes ``self.bias`` to
  the GEMM, and ``load_weights_vanilla_helper`` loads a checkpoint's ``bias`` (sharded like the weight)
  whenever ``module.bias is not None``.

So the stock class drops ``lm_head.bias``, and giving the head a bias parameter is enough: the GEMM
adds it and the loader fills it. The rewrite's vocabulary is padded to a multiple of 128, so tensor
parallelism up to 128 ways leaves no padding on any rank (the loader trims only the weight's).

TensorRT-LLM picks the class by ``config.json``'s first architecture (``AutoModelForCausalLM``) and
has no override at load time: serve a copy of the dir whose ``config.json`` names
``CosyVoiceLMForCausalLM``, with ``trtllm-serve COPY --custom_module_dirs <dir>/trtllm_plugin/cosyvoice_trtllm``
(which imports this package and so registers the class).

This file is copied verbatim into every rewrite dir as ``trtllm_plugin/cosyvoice_trtllm/__init__.py``;
it imports nothing from cosycompile, and TensorRT-LLM only when imported as that package.
"""

from __future__ import annotations

from typing import Any

ARCHITECTURE = "CosyVoiceLMForCausalLM"
PACKAGE = "cosyvoice_trtllm"  # the package's name in the rewrite dir


def model_class() -> type:
    """The class, registered with TensorRT-LLM's auto model under :data:`ARCHITECTURE`."""
    import torch
    from tensorrt_llm._torch.models.modeling_qwen import Qwen2ForCausalLM
    from tensorrt_llm._torch.models.modeling_utils import register_auto_model

    class CosyVoiceLMForCausalLM(Qwen2ForCausalLM):
        """TensorRT-LLM's Qwen2ForCausalLM whose ``lm_head`` has a bias, added by its GEMM."""

        def __init__(self, model_config: Any) -> None:
            if model_config.pretrained_config.tie_word_embeddings:
                raise ValueError(f"{ARCHITECTURE}: the rewrite's lm_head is untied (tie_word_embeddings false)")
            super().__init__(model_config)
            head = self.lm_head
            if head.padding_size:
                raise ValueError(f"{ARCHITECTURE}: a vocabulary of {head.num_embeddings} does not split evenly over "
                                 "this tensor-parallel size; the bias would not load")
            # Empty, not zeros: the model is built on the meta device and filled by load_weights.
            head.bias = torch.nn.Parameter(torch.empty(head.out_features, dtype=head.weight.dtype),
                                           requires_grad=False)

    CosyVoiceLMForCausalLM.__module__ = __name__
    return register_auto_model(ARCHITECTURE)(CosyVoiceLMForCausalLM)


if __name__ == PACKAGE:  # imported by TensorRT-LLM from the rewrite dir, not as cosycompile's module
    CosyVoiceLMForCausalLM = model_class()
