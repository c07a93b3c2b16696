"""vLLM backend for the speech-token LM: the HF rewrite checkpoint (FP32, or INT8 W8A8 from the
``compressed_tensors`` quantizer) with the dir's vLLM plug-in installed beside it, vLLM's load
options and a ``vllm serve`` command.

vLLM is usually installed in an environment of its own (its CPU and CUDA builds pin their own
torch): ``COSYCOMPILE_VLLM_PYTHON`` names that environment's Python; without it, this Python if it
imports vLLM. The build's one call into vLLM is a smoke decode in that Python (``smoke.py``, run by
file path, importing nothing of cosycompile): it loads the engine dir as a server would and decodes
greedily from the quantizer's reference prompt, and the passport records how many tokens equal the
reference's.

Names checked against vLLM 0.32's ``LLM`` (``vllm/entrypoints/llm.py``: ``hf_overrides``, ``dtype``,
``max_model_len``, ``max_num_seqs``, ``gpu_memory_utilization``, ``kv_cache_memory_bytes``,
``enforce_eager``, ``skip_tokenizer_init``) and ``vllm serve`` (the same names as flags).

The engine key holds the versions of the tools this process imports; vLLM's own version (another
environment's) is not in it. The passport records it: rebuild with ``--force`` after changing vLLM.

This module stays light: no vLLM import.
"""

from __future__ import annotations

import os
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cosycompile.backends import BackendInfo
from cosycompile.core.targets import Target

PYTHON_ENV = "COSYCOMPILE_VLLM_PYTHON"


class Options(BaseModel):
    """vLLM options for the speech-token LM (``stages.llm.engine.options``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="activations and unquantized weights (auto: the checkpoint's)")
    max_model_len: int = Field(2048, ge=16, description="prompt + generated tokens per request")
    max_num_seqs: int = Field(16, ge=1, description="requests scheduled together")
    gpu_memory_utilization: float = Field(
        0.5, gt=0, lt=1, description="share of the device's memory for weights and KV cache (CPU: of RAM)")
    kv_cache_memory_bytes: int | None = Field(
        None, ge=1, description="KV cache size in bytes, instead of the utilization share")
    enforce_eager: bool = Field(False, description="no CUDA graphs / torch.compile (faster start, slower decode)")


def vllm_python() -> str | None:
    """The Python that runs vLLM: ``COSYCOMPILE_VLLM_PYTHON``, else this one if it imports vLLM."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        return named if Path(named).is_file() else None
    return sys.executable if find_spec("vllm") is not None else None


def build_problem(target: Target, options: Any = None) -> str | None:
    """Why vLLM cannot load the checkpoint here: no Python that imports it."""
    named = os.environ.get(PYTHON_ENV)
    if named and not Path(named).is_file():
        return f"{PYTHON_ENV} names {named}, which is not a file"
    if vllm_python() is None:
        return (f"vLLM is not installed (pip install vllm, or its CPU build, in an environment of its own and name "
                f"that environment's python in {PYTHON_ENV})")
    return None


def run_problem(target: Target) -> str | None:
    """The checks do not run vLLM in-process: its build decodes the reference prompt instead."""
    return ("this version of cosycompile does not run vLLM in its checks; the engine's smoke decode (engine.json) "
            "compares vLLM's greedy tokens with the quantized reference's")


PLUGIN = BackendInfo(
    options=Options,
    tools=(),
    target_kinds=("cpu", "gpu"),
    consumes="checkpoint",
    stages=("llm",),
    build_problem=build_problem,
    run_problem=run_problem,
    checks_run=False,
)
