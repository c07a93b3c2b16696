"""The vLLM model class of the HF rewrite: vLLM's own Qwen2 with a bias on ``lm_head``.

vLLM (0.32, ``vllm/model_executor/models/qwen2.py``) builds ``ParallelLMHead(vocab, hidden)`` without
a bias, and its weight loader skips the checkpoint's ``lm_head.bias``: loaded as the stock
``Qwen2ForCausalLM`` that ``config.json`` names, the rewrite gives logits without
``llm_decoder``'s bias and 0 instead of ``-inf`` on every text id, with no warning. This class keeps
everything of vLLM's Qwen2 (paged attention, batching, quantized linears) and only builds the head
with ``bias=True`` (``ParallelLMHead`` registers and loads it) and passes it to the logits processor
(``LogitsProcessor.forward(lm_head, hidden_states, embedding_bias)``), as upstream CosyVoice's vLLM
path does with its own architecture.

This file is copied verbatim into every rewrite dir as ``vllm_plugin/cosyvoice_vllm.py``, beside a
``pyproject.toml`` that registers :func:`register` under vLLM's ``vllm.general_plugins`` entry point:
``pip install <dir>/vllm_plugin`` in the serving environment, then load the dir with
``hf_overrides={"architectures": ["CosyVoiceLMForCausalLM"]}``. It imports nothing from cosycompile
and nothing of vLLM until vLLM asks for the class, so it also imports where vLLM is not installed.
"""

from __future__ import annotations

from typing import Any

ARCHITECTURE = "CosyVoiceLMForCausalLM"
MODULE = "cosyvoice_vllm"  # the module's name once installed from the rewrite dir
# The ModelOpt checkpoint kinds vLLM 0.32 loads (its ModelOptConfig refuses the others at load:
# "ModelOpt currently only supports: [...]"). FP8 kinds need its GPU kernels too: its CPU build takes
# the config, then fails while loading the weights (``requantize_with_max_scale`` calls
# ``static_scaled_fp8_quant``, an op its CPU build registers without arguments).
VLLM_MODELOPT_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "MXFP8",
                       "MIXED_PRECISION")
_built: dict[str, Any] = {}


def serving_note(quantization: dict[str, Any] | None, plugin_dir: str) -> dict[str, Any]:
    """How (and whether) vLLM loads a rewrite with ``quantization`` (its ``quantization_config``),
    for the dir's ``cosycompile_llm.json``."""
    algo = (quantization or {}).get("quant_algo")
    if algo is not None and algo not in VLLM_MODELOPT_ALGOS:
        return {"loads": False, "why": f"vLLM 0.32 loads ModelOpt checkpoints of {', '.join(VLLM_MODELOPT_ALGOS)} "
                                       f"only, not {algo}: serve this one with TensorRT-LLM"}
    return {"loads": True, "install": f"pip install ./{plugin_dir}",
            "load": {"hf_overrides": {"architectures": [ARCHITECTURE]},
                     **({"dtype": "bfloat16 or float16 (ModelOpt checkpoints)"} if algo else {})}}


def register() -> None:
    """vLLM's plugin hook: make :data:`ARCHITECTURE` loadable (lazily, by module path)."""
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, f"{MODULE}:{ARCHITECTURE}")


def _keep_fp32_int8_linears_off_the_amx_kernel() -> None:
    """vLLM 0.32's CPU W8A8 kernel (``kernels/linear/scaled_mm/cpu.py``) sends symmetric INT8 linears to
    ``int8_scaled_mm_with_quant`` whenever the CPU has AMX, asking ``check_cpu_sgl_kernel`` about the
    weight's dtype (INT8) only; that kernel takes BF16 or FP16 activations, so an FP32 model dies at its
    first forward ("expect A to be bfloat16 or half"). FP32 models stay on the oneDNN kernel, which the
    same vLLM uses on every CPU without AMX."""
    import torch

    try:
        from vllm.model_executor.kernels.linear.scaled_mm import cpu
    except ImportError:  # another vLLM layout: its own choice stands
        return
    original = getattr(cpu, "check_cpu_sgl_kernel", None)
    if original is None:
        return

    def check(n: int, k: int, dtype: Any) -> bool:
        # The kernel is chosen while the weights load, under the model's dtype as torch's default.
        return torch.get_default_dtype() in (torch.bfloat16, torch.float16) and original(n, k, dtype)

    cpu.check_cpu_sgl_kernel = check  # once per process: the class is built once (``_built``)


def _model_class() -> type:
    from vllm.distributed import get_pp_group
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
    from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
    from vllm.model_executor.models.utils import maybe_prefix

    class CosyVoiceLMForCausalLM(Qwen2ForCausalLM):
        """vLLM's Qwen2ForCausalLM whose ``lm_head`` has a bias, applied to every logit."""

        def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            if get_pp_group().is_last_rank:
                config = self.config
                if config.tie_word_embeddings:
                    raise ValueError(f"{ARCHITECTURE}: the rewrite's lm_head is untied (tie_word_embeddings false)")
                self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, bias=True,
                                              quant_config=vllm_config.quant_config,
                                              prefix=maybe_prefix(prefix, "lm_head"))

        def compute_logits(self, hidden_states: Any) -> Any:
            return self.logits_processor(self.lm_head, hidden_states, self.lm_head.bias)

    CosyVoiceLMForCausalLM.__module__ = __name__
    _keep_fp32_int8_linears_off_the_amx_kernel()
    return CosyVoiceLMForCausalLM


def __getattr__(name: str) -> Any:
    # The class subclasses vLLM's, so it is built on first access (vLLM's registry does
    # ``getattr(module, "CosyVoiceLMForCausalLM")``), never at import.
    if name != ARCHITECTURE:
        raise AttributeError(name)
    if name not in _built:
        _built[name] = _model_class()
    return _built[name]
