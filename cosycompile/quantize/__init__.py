"""Quantization formats per stage and the rules that say where each can run.

Light on purpose: recipe validation calls :func:`format_problem` without importing ModelOpt.
The step bodies live in ``calibrate.py`` (recording the FP32 reference), ``llm_ptq.py`` (ModelOpt
PyTorch PTQ of the LM) and ``onnx_ptq.py`` (ModelOpt ONNX PTQ of the flow estimator and HiFT).
"""

from __future__ import annotations

from typing import Any

from cosycompile.recipe.targets import Target

STAGE_FORMATS: dict[str, tuple[str, ...]] = {
    "llm": ("fp32", "int8_sq", "int8_wo", "int4_awq", "w4a8_awq", "fp8"),
    "flow": ("fp32", "int8", "fp8", "int4"),
    "hift": ("fp32", "int8", "fp8", "int4"),
}

METHODS: dict[str, tuple[str, ...]] = {
    "int8": ("max", "entropy"),
    "fp8": ("max", "entropy"),
    "int4": ("awq_clip", "awq_lite", "rtn_dq"),
    "int8_sq": ("max",),
    "int8_wo": ("max",),
    "int4_awq": ("awq_lite", "awq_full", "awq_clip", "autoawq"),
    "w4a8_awq": ("awq_lite", "awq_full", "awq_clip"),
}

DEFAULT_METHOD = {"int8": "max", "fp8": "max", "int4": "awq_clip", "int8_sq": "max", "int8_wo": "max",
                  "int4_awq": "awq_lite", "w4a8_awq": "awq_lite"}

# Formats whose compute needs FP8 tensor cores (Ada / Hopper and newer).
_NEEDS_SM89 = ("fp8", "w4a8_awq")


def needs_calibration(fmt: str) -> bool:
    """Weight-only formats are calibrated from weights alone; the rest read recorded activations."""
    return fmt not in ("fp32", "int8_wo")


def autoawq_problem() -> str | None:
    """Why the optional AutoAWQ method cannot run here, or None (checked without importing it)."""
    from importlib.util import find_spec

    if find_spec("awq") is None:
        return ("method 'autoawq' needs the optional AutoAWQ package (pip install 'cosycompile[autoawq]'); "
                "ModelOpt's awq_lite/awq_full need nothing extra")
    return ("method 'autoawq' is installed but not wired into this version: AutoAWQ's packed INT4 kernels "
            "need a GPU and the project is deprecated upstream; use awq_lite or awq_full")


def format_problem(stage: str, quant: Any, target: Target, backend: str, engine_options: dict[str, Any],
                   opset: int) -> tuple[str, str] | None:
    """(key, reason) when ``quant`` cannot be built for this stage/target/backend, else None."""
    fmt = quant.format
    if fmt not in STAGE_FORMATS[stage]:
        return "format", (f"stage '{stage}' cannot use format '{fmt}' "
                          f"(supported: {', '.join(STAGE_FORMATS[stage])})")
    if fmt == "fp32":
        return None
    if quant.method is not None and quant.method not in METHODS[fmt]:
        return "method", f"format '{fmt}' cannot use method '{quant.method}' (supported: {', '.join(METHODS[fmt])})"
    if quant.method == "autoawq":
        problem = autoawq_problem()
        if problem:
            return "method", problem
    if target.kind == "gpu" and fmt in _NEEDS_SM89 and target.sm is not None and target.sm < (8, 9):
        return "format", (f"format '{fmt}' needs FP8 tensor cores (compute capability >= 8.9); "
                          f"target '{target.name}' is {target.sm_tag}")
    if target.kind == "cpu":
        if fmt == "int4" and backend == "onnxruntime":
            return "format", ("ModelOpt's ONNX INT4 output (blocked DequantizeLinear on Gemm weights) is rejected by "
                              "ONNX Runtime CPU at run time; use int8 for flow/hift on cpu (int4 is for TensorRT)")
        if fmt == "w4a8_awq":
            return "format", "format 'w4a8_awq' has no CPU kernels (FP8 activations); use int4_awq or int8_sq on cpu"
        if fmt == "fp8" and backend == "onnxruntime":
            if engine_options.get("optimization", "extended") != "disable" or opset < 21:
                return "format", ("FP8 Q/DQ graphs run on ONNX Runtime CPU only with stages.<stage>.export.opset: 21 "
                                  "and engine option optimization: disable (reference kernels, slow)")
    return None
