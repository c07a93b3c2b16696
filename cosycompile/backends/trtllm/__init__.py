"""TensorRT-LLM backend for the speech-token LM, built from the HF rewrite checkpoint.

Two builds, chosen by the installed ``tensorrt_llm`` version (``importlib.metadata``):

- **>= 1.3** (the TensorRT engine path is removed on main, PR #15767): the "engine" is the rewrite
  checkpoint itself plus an LLM-API options YAML for
  ``trtllm-serve serve <dir> --extra_llm_api_options <yaml>``; the build smoke-loads it with
  ``tensorrt_llm.LLM``.
- **<= 1.2**: a TensorRT-LLM checkpoint of the rewrite (ModelOpt's ``trtllm`` export for quantized
  LMs, a conversion here for FP32) and ``trtllm-build`` with the recipe's flags, as CosyVoice's
  ``runtime/triton_trtllm/run.sh`` does in ``nvidia/tritonserver:25.06-trtllm-python-py3``.

Names checked against TensorRT-LLM's source: LlmArgs fields ``max_batch_size``, ``max_num_tokens``,
``max_seq_len``, ``dtype``, ``kv_cache_config.free_gpu_memory_fraction``, ``cuda_graph_config``
(``batch_sizes``, ``max_batch_size``, ``enable_padding``) in ``tensorrt_llm/llmapi/llm_args.py``
@fcd3f31682808ae56118ae43c1d7864a3a945e6f; ``trtllm-serve serve MODEL --extra_llm_api_options
(alias --config) --host --port --trust_remote_code`` in ``tensorrt_llm/commands/serve.py``
@00209af149e7774406881a37283dce303571eb11; ``trtllm-build`` flags from ``tensorrt_llm/commands/build.py``
(shared/reference/toolchain.md section 2b).

This module stays light: no TensorRT-LLM import (``importlib.metadata`` / ``find_spec`` only).
"""

from __future__ import annotations

import shutil
from importlib import metadata
from importlib.util import find_spec
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cosycompile.backends import BackendInfo
from cosycompile.core.targets import Target

DISTRIBUTION = "tensorrt_llm"
LEGACY_CONTAINER = "nvidia/tritonserver:25.06-trtllm-python-py3"
# The first release without the TensorRT engine path (trtllm-build); <= 1.2 still has it.
LLM_API_ONLY = (1, 3)


class Options(BaseModel):
    """TensorRT-LLM options for the speech-token LM (``stages.llm.engine.options``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_batch_size: int = Field(16, ge=1, description="requests scheduled together")
    max_input_len: int = Field(1024, ge=1, description="prompt tokens (trtllm-build, <= 1.2 only)")
    max_seq_len: int = Field(2560, ge=1, description="prompt + generated tokens per request")
    max_num_tokens: int = Field(32768, ge=1, description="batched tokens per iteration after padding removal")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="activations and unquantized weights (CosyVoice serves bf16)")
    free_gpu_memory_fraction: float = Field(
        0.5, gt=0, lt=1, description="KV cache share of the free GPU memory (kv_cache_config; >= 1.3)")
    cuda_graphs: bool = Field(True, description="capture decode-only batches as CUDA graphs (>= 1.3)")
    cuda_graph_batch_sizes: list[int] | None = Field(
        None, description="batch sizes captured (None: TensorRT-LLM's defaults up to max_batch_size)")
    gemm_plugin: Literal["auto", "float16", "bfloat16", "float32", "disable"] = Field(
        "auto", description="trtllm-build --gemm_plugin (<= 1.2 only; auto = dtype)")


def version() -> str | None:
    """The installed TensorRT-LLM version, or None."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def version_tuple(v: str) -> tuple[int, int]:
    """(major, minor) of a version string such as ``1.2.1`` or ``1.4.0rc1``."""
    parts = [int("".join(ch for ch in p if ch.isdigit()) or 0) for p in v.split(".")[:2]]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def flow(v: str) -> str:
    """``llmapi`` (>= 1.3: checkpoint + trtllm-serve options) or ``legacy`` (<= 1.2: trtllm-build)."""
    return "llmapi" if version_tuple(v) >= LLM_API_ONLY else "legacy"


def build_problem(target: Target, options: Any = None) -> str | None:
    """Why TensorRT-LLM cannot build here: not installed (the fix named), or ``trtllm-build`` missing."""
    v = version()
    if v is None or find_spec("tensorrt_llm") is None:
        return ("TensorRT-LLM is not installed (pip install tensorrt-llm for >= 1.3, which serves the HF rewrite "
                f"through trtllm-serve; or build in {LEGACY_CONTAINER} for the <= 1.2 trtllm-build engines)")
    if flow(v) == "legacy" and shutil.which("trtllm-build") is None:
        return f"TensorRT-LLM {v} is installed but its trtllm-build command is not on PATH"
    return None


def run_problem(target: Target) -> str | None:
    """The checks cannot run TensorRT-LLM in-process: its engines are validated by serving them."""
    from cosycompile.backends.tensorrt import gpu_models

    if not gpu_models():
        return "no NVIDIA GPU on this machine (TensorRT-LLM runs on the GPU only)"
    return ("this version of cosycompile does not run TensorRT-LLM in its checks; serve the engine with the command "
            "in its engine.json and validate the served tokens")


PLUGIN = BackendInfo(
    options=Options,
    tools=("tensorrt-llm",),
    target_kinds=("gpu",),
    consumes="checkpoint",
    stages=("llm",),
    unavailable=None,
    build_problem=build_problem,
    run_problem=run_problem,
    checks_run=False,
)
