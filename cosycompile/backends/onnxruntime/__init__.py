"""ONNX Runtime backend: the engine is the offline-optimized graph plus its session settings.

Offline optimization moves graph rewriting out of every server's start-up. Levels up to
'extended' stay portable across x86 CPUs; 'all' adds layout transforms tied to the build CPU,
which is recorded in the passport. After it, exact rewrites of our own replace what the optimizer
leaves slow: separate kernels for attention (``attention.py``) and Mish (``mish.py``), the LLM
step's stacked cache, which every step copied whole (``kv_cache.py``), and HiFT's Snake activations,
which become one operator of the project's own (``snake.py``, ``runtime/ort_ops``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cosycompile.backends import BackendInfo


class Options(BaseModel):
    """ONNX Runtime engine options (``stages.<stage>.engine.options``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    optimization: Literal["disable", "basic", "extended", "all"] = Field(
        "extended", description="graph optimizations applied offline and saved; 'all' adds layout changes "
                                "specific to the build machine's CPU")
    execution_mode: Literal["sequential", "parallel"] = Field(
        "sequential", description="ONNX Runtime's execution mode: parallel runs independent branches at once")
    rewrites: tuple[Literal["attention", "mish", "kv_cache", "snake"], ...] = Field(
        ("attention", "mish", "kv_cache", "snake"),
        description="exact graph rewrites applied after the offline optimization (not with 'disable'): 'attention' "
                    "fuses exported scaled-dot-product attention into the MultiHeadAttention kernel, 'mish' computes "
                    "x*tanh(softplus(x)) without ONNX Runtime's scalar Softplus, 'kv_cache' gives the LLM step one "
                    "cache input and output per layer so a decode step stops copying the whole cache, 'snake' computes "
                    "HiFT's x + sin^2(alpha x)/alpha in one vectorized operator of the project's own (a C++ library "
                    "compiled at build time and kept in the engine dir); [] keeps the optimizer's graph")


def check_format(stage: str, fmt: str, options: Options, opset: int) -> tuple[str, str] | None:
    """(recipe key, reason) when ONNX Runtime CPU cannot run ``fmt`` as exported, else None."""
    if fmt == "int4" and stage != "llm":
        return "format", ("ModelOpt's ONNX INT4 output (blocked DequantizeLinear on Gemm weights) is rejected by "
                          "ONNX Runtime CPU at run time; use int8 for flow/hift on cpu (int4 is for TensorRT)")
    if fmt == "w4a8_awq":
        return "format", "format 'w4a8_awq' has no CPU kernels (FP8 activations); use int4_awq or int8_sq on cpu"
    if fmt == "fp8" and (options.optimization != "disable" or opset < 21):
        return "format", ("FP8 Q/DQ graphs run on ONNX Runtime CPU only with stages.<stage>.export.opset: 21 "
                          "and engine option optimization: disable (reference kernels, slow)")
    return None




PLUGIN = BackendInfo(
    options=Options,
    tools=("onnxruntime", "onnx"),
    target_kinds=("cpu",),
    consumes="onnx",
    check_format=check_format,
)
