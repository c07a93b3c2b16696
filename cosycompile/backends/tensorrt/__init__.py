"""TensorRT backend: each ONNX graph of a stage becomes a serialized TensorRT engine (``.plan``).

Two builders share this folder, picked by ``engine.options.flavour``:

- ``tensorrt`` (TensorRT 10 or 11): builds on the GPU it builds for; data-center targets.
- ``rtx`` (TensorRT for RTX): compiles ahead of time for named compute capabilities, with no GPU
  present, for GeForce RTX / RTX PRO targets; it has no sm90 / sm100 kernels.

Builds are strongly typed: precision comes from the ONNX (ModelOpt Q/DQ for INT8/FP8/INT4, an
autocast FP16 graph for FP16). The one exception is TensorRT 10's ``builder_fp16`` flag on an FP32
graph, which TensorRT 11 and TensorRT-RTX no longer have. Version differences live in ``api.py``.

This module stays light: it imports no TensorRT (``importlib.util.find_spec`` only).
"""

from __future__ import annotations

import re
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cosycompile.backends import BackendInfo, option_error
from cosycompile.core.targets import TARGETS, Target

# Compute capabilities TensorRT-RTX 1.7 compiles for (its ``ComputeCapability`` enum: SM75, SM80,
# SM86, SM89, SM120, SM121); there is no SM90 or SM100, so Hopper and B200 need TensorRT.
RTX_SMS: tuple[tuple[int, int], ...] = ((7, 5), (8, 0), (8, 6), (8, 9), (12, 0), (12, 1))
# Python modules of the two builders.
MODULES = {"tensorrt": "tensorrt", "rtx": "tensorrt_rtx"}
# Where the NVIDIA kernel driver lists the GPUs of this machine (no CUDA or nvidia-smi needed).
PROC_GPUS = Path("/proc/driver/nvidia/gpus")

# LLM formats whose ONNX form TensorRT's ONNX parser cannot read, and why.
_LLM_FORMATS_NOT_ONNX = {
    "int8_wo": "is packed into ONNX Runtime's MatMulNBits (com.microsoft), which TensorRT's ONNX parser does not read",
    "int4_awq": "is packed into ONNX Runtime's MatMulNBits (com.microsoft), which TensorRT's ONNX parser does not read",
    "fp8": "has no ONNX form (only HF / TensorRT-LLM checkpoints)",
    "w4a8_awq": "has no ONNX form (only HF / TensorRT-LLM checkpoints)",
}


def installed(flavour: str) -> bool:
    """Whether the builder module of ``flavour`` can be found (found, not imported: cheap)."""
    try:
        return find_spec(MODULES[flavour]) is not None
    except (ImportError, ValueError):
        return False


def resolve_flavour(flavour: str, target: Target) -> str:
    """``auto`` -> ``rtx`` for an RTX-class target that TensorRT-RTX is installed for, else ``tensorrt``."""
    if flavour != "auto":
        return flavour
    if target.rtx_class and target.sm in RTX_SMS and installed("rtx"):
        return "rtx"
    return "tensorrt"


def _take_target(context: Any) -> Target | None:
    # recipe/schema.py validates engine options with the recipe's target as pydantic context, so a
    # flavour that cannot build for it is an error at the ``flavour`` key.
    if isinstance(context, dict) and isinstance(context.get("target"), Target):
        return context["target"]
    return None


class Options(BaseModel):
    """TensorRT engine options (``stages.<stage>.engine.options``). Every option is read by ``build``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    flavour: Literal["auto", "tensorrt", "rtx"] = Field(
        "auto", description="builder: auto = TensorRT-RTX for RTX-class targets when installed, else TensorRT")
    # 4 GiB failed TensorRT-RTX 1.7's build of the 0.5B LLM's decode step (docs/bench-log/2026-11-30-cluster-
    # simulation-0.5b.md).
    workspace_gib: float = Field(8.0, gt=0, description="builder workspace memory pool limit (GiB)")
    builder_optimization_level: int = Field(3, ge=0, le=5, description="0 builds fastest, 5 searches most")
    hardware_compatibility: Literal["none", "same_compute_capability", "ampere_plus"] = Field(
        "none", description="GPUs the engine may run on besides the target's model (TensorRT-RTX: compute "
                            "capabilities compiled for)")
    version_compatible: bool = Field(False, description="TensorRT only: the engine embeds a lean runtime and runs on "
                                                        "later TensorRT versions of the same major")
    builder_fp16: bool = Field(False, description="TensorRT 10 only: let the builder pick FP16 kernels on an FP32 "
                                                  "graph (weakly typed); TensorRT 11 / RTX take precision from the ONNX")
    profiles: dict[str, tuple[int, int, int]] = Field(
        default_factory=dict, description="dynamic dim name -> [min, opt, max], overriding the graph spec's hints")

    @field_validator("profiles")
    @classmethod
    def _ordered(cls, profiles: dict[str, tuple[int, int, int]]) -> dict[str, tuple[int, int, int]]:
        for name, (lo, opt, hi) in profiles.items():
            if not 0 <= lo <= opt <= hi:
                raise ValueError(f"profile of dim '{name}' must be [min, opt, max] with 0 <= min <= opt <= max")
        return profiles

    # "after", not "wrap": a wrap validator hands the field validation Python data, and in the recipe's
    # strict JSON mode a list is then no tuple (the profiles' [min, opt, max]).
    @model_validator(mode="after")
    def _against_target(self, info: Any) -> "Options":
        target = _take_target(info.context)
        options = self
        flavour = resolve_flavour(options.flavour, target) if target is not None else options.flavour
        if options.builder_fp16 and flavour == "rtx":
            raise option_error("builder_fp16", True, "builder_fp16 is TensorRT 10's FP16 flag; TensorRT-RTX takes precision "
                                                     "from the ONNX only (quantize: {format: fp16})")
        if options.version_compatible and flavour == "rtx":
            raise option_error("version_compatible", True, "TensorRT-RTX engines run only on the TensorRT-RTX release that "
                                                           "built them (no lean runtime to embed)")
        if target is None or target.sm is None:
            return options
        if flavour == "rtx" and target.sm not in RTX_SMS:
            cc = ", ".join(f"sm{a}{b}" for a, b in RTX_SMS)
            raise option_error("flavour", options.flavour, f"TensorRT-RTX cannot build for target '{target.name}' "
                                                           f"({target.sm_tag}; it compiles for {cc}); use flavour tensorrt")
        if options.hardware_compatibility == "ampere_plus" and target.sm < (8, 0):
            raise option_error("hardware_compatibility", "ampere_plus",
                               f"ampere_plus engines run on sm80 and newer; target '{target.name}' is {target.sm_tag}")
        return options


def check_format(stage: str, fmt: str, options: Any, opset: int) -> tuple[str, str] | None:
    """(recipe key, reason) when TensorRT cannot run the ONNX that ``fmt`` produces for ``stage``."""
    if stage == "llm" and fmt in _LLM_FORMATS_NOT_ONNX:
        return "format", (f"the LLM's '{fmt}' ONNX {_LLM_FORMATS_NOT_ONNX[fmt]}; build it with backend trtllm, "
                          "or use int8_sq (ModelOpt Q/DQ) on tensorrt")
    return None


def build_problem(target: Target, options: Any = None) -> str | None:
    """Why no TensorRT builder can build for ``target`` on this machine, or None. With the engine's
    ``options``, only the builder its flavour picks counts (``auto``: TensorRT-RTX for an RTX-class
    target only, so a data-center sm89 target such as the L20 needs TensorRT even where
    TensorRT-RTX is installed)."""
    flavour = getattr(options, "flavour", None)
    if flavour is not None:
        flavour = resolve_flavour(flavour, target)
    can_trt = installed("tensorrt") and bool(gpu_models())
    can_rtx = installed("rtx") and target.sm in RTX_SMS
    if (can_trt and flavour in (None, "tensorrt")) or (can_rtx and flavour in (None, "rtx")):
        return None
    why = []
    if flavour in (None, "tensorrt"):
        why.append("TensorRT is not installed (module 'tensorrt')" if not installed("tensorrt")
                   else "TensorRT builds on the GPU it builds for and this machine has none")
    if flavour in (None, "rtx"):
        if target.sm not in RTX_SMS:
            why.append(f"TensorRT-RTX has no {target.sm_tag} kernels")
        elif not installed("rtx"):
            why.append("TensorRT-RTX is not installed (module 'tensorrt_rtx', pip install 'cosycompile[rtx]')")
    elif target.sm in RTX_SMS and installed("rtx"):
        why.append(f"flavour '{options.flavour}' builds target '{target.name}' with TensorRT, not with the "
                   "TensorRT-RTX installed here (flavour rtx would)")
    return "; ".join(why)


def gpu_models() -> list[str]:
    """Model names of this machine's NVIDIA GPUs, as the kernel driver lists them (empty: none)."""
    try:
        entries = sorted(PROC_GPUS.iterdir())
    except OSError:
        return []
    models = []
    for entry in entries:
        try:
            text = (entry / "information").read_text()
        except OSError:
            continue
        match = re.search(r"^Model:\s*(.+?)\s*$", text, re.MULTILINE)
        models.append(match.group(1) if match else "unknown NVIDIA GPU")
    return models


def sm_of_model(model: str) -> tuple[int, int] | None:
    """Compute capability of a GPU model name, through the targets table (None: not a known model)."""
    for t in TARGETS.values():
        # "NVIDIA L4" must not match "NVIDIA L40S", nor "NVIDIA A10" "NVIDIA A100-SXM4-80GB".
        if t.gpu_name and re.match(re.escape(t.gpu_name) + r"(?![0-9A-Za-z])", model, re.IGNORECASE):
            return t.sm
    return None


def run_problem(target: Target) -> str | None:
    """Why engines built for ``target`` cannot run on this machine, or None (cheap: no CUDA call)."""
    models = gpu_models()
    if not models:
        return f"no NVIDIA GPU on this machine ({PROC_GPUS} is missing or empty)"
    sms = [sm_of_model(m) for m in models]
    if target.sm not in sms and None not in sms:
        here = ", ".join(f"{m} (sm{sm[0]}{sm[1]})" for m, sm in zip(models, sms) if sm)
        return f"engines for target '{target.name}' are {target.sm_tag}; this machine has {here}"
    if not installed("tensorrt") and not installed("rtx"):
        return "neither TensorRT (tensorrt) nor TensorRT-RTX (tensorrt_rtx) is installed to run the engines"
    return None


PLUGIN = BackendInfo(
    options=Options,
    # The libs wheels hold the builder; the plain name covers NGC containers' single wheel.
    tools=("tensorrt", "tensorrt-cu12-libs", "tensorrt-cu13-libs", "tensorrt-rtx-cu12-libs", "tensorrt-rtx-cu13-libs"),
    target_kinds=("gpu",),
    consumes="onnx",
    stages=None,
    check_format=check_format,
    unavailable=None,
    build_problem=build_problem,
    run_problem=run_problem,
)
