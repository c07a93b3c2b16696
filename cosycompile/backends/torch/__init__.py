"""PyTorch backend: each graph of a stage, exported with ``torch.export``, is compiled ahead of time
by AOTInductor into a ``.pt2`` package (C++/OpenMP kernels for CPU, Triton kernels for CUDA) that
loads without Python-level tracing or recompilation.

The engine's precision comes from the programs it consumes: FP32 as exported, or BF16/FP16 from the
``torch_autocast`` quantizer. CPU packages use the build machine's vector ISA (AVX-512 here), which
the passport records and ``load`` checks. CUDA packages are compiled on the GPU they are built for.

This module stays light: it imports no torch (``importlib.util.find_spec`` only).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cosycompile.backends import BackendInfo, option_error
from cosycompile.core.targets import Target

# Formats whose programs this backend compiles: bf16/fp16 from torch_autocast, int8/fp8 linears
# (torch._int_mm / torch._scaled_mm) from torch_dynamic.
FORMATS = ("fp32", "bf16", "fp16", "int8", "fp8")


class Options(BaseModel):
    """PyTorch AOTInductor engine options (``stages.<stage>.engine.options``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Off by default: a frozen FP32 0.5B LLM package needs gigabytes more memory to compile and to
    # load, and only the flow gains on every CPU class measured
    # (docs/bench-log/2026-12-06-frozen-packages-cpu-torch-int8-twice-zen4.md).
    freezing: bool = Field(False, description="fold weights into the compiled graph as constants and let Inductor "
                                              "pre-pack them for oneDNN, 1-D convolutions included (more build and "
                                              "load memory; on CPUs, gains a few percent on the flow)")
    max_autotune: bool = Field(False, description="benchmark GEMM/conv kernel choices while compiling (slow builds)")
    static_cache: bool = Field(False, description="llm stage on a CPU target: also compile the one-token decode step "
                                                  "over a KV cache of fixed size that the runtime writes in place "
                                                  "(no new cache each token; a second package, so a longer build "
                                                  "and a larger engine). GPU targets always carry it, as a CUDA graph")

    @model_validator(mode="after")
    def _llm_only(self, info: Any) -> "Options":
        # recipe/schema.py validates engine options with the stage's name as pydantic context.
        stage = info.context.get("stage") if isinstance(info.context, dict) else None
        if self.static_cache and stage is not None and stage != "llm":
            raise option_error("static_cache", True, f"only the llm stage decodes over a KV cache; stage '{stage}' "
                                                     "has none to keep")
        return self


def check_format(stage: str, fmt: str, options: Any, opset: int) -> tuple[str, str] | None:
    """(recipe key, reason) when the torch backend cannot compile ``fmt``."""
    if fmt not in FORMATS:
        return "format", (f"backend 'torch' compiles {', '.join(FORMATS)} programs, not '{fmt}': use onnxruntime "
                          "or tensorrt for it")
    return None


def _torch_cuda() -> str | None:
    from importlib.util import find_spec

    if find_spec("torch") is None:
        return "PyTorch is not installed"
    import torch

    if not torch.cuda.is_available():
        return f"this PyTorch ({torch.__version__}) sees no CUDA device; AOTInductor compiles CUDA kernels on the GPU"
    return None


def build_problem(target: Target, options: Any = None) -> str | None:
    """Why this machine cannot compile for ``target``: CUDA packages need the GPU they run on."""
    if target.kind == "cpu":
        return None
    problem = _torch_cuda()
    if problem:
        return problem
    import torch

    cc = torch.cuda.get_device_capability()
    if target.sm is not None and tuple(cc) != tuple(target.sm):
        return f"this GPU is sm{cc[0]}{cc[1]}, target '{target.name}' is {target.sm_tag}"
    return None


def run_problem(target: Target) -> str | None:
    """Why engines for ``target`` cannot run on this machine."""
    return build_problem(target)


PLUGIN = BackendInfo(
    options=Options,
    tools=("torch",),
    target_kinds=("cpu", "gpu"),
    consumes="program",
    check_format=check_format,
    build_problem=build_problem,
    run_problem=run_problem,
)
