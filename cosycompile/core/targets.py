"""Deployment targets: what hardware a recipe builds for.

The target is part of every engine step's key (an engine built for sm89 is not an engine for
sm90), and backends use it to refuse formats the hardware cannot run and to pick a builder
(TensorRT-RTX for GeForce / RTX PRO cards, TensorRT for data-center GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass

# What a GPU of a given compute capability can run, by the format names recipes write
# (``stages.<stage>.quantize.format``). Each entry is the lowest compute capability that runs it.
# Sources: TensorRT-LLM support-matrix.md (FP8 and W4A8 need sm89; INT4 weight-only from Ampere),
# ModelOpt ONNX PTQ ("FP8 ... compute capability >= 8.9"), TensorRT-RTX support matrix (BF16 and INT4
# weight-only GEMMs from sm80/86, FP4 GEMMs on Blackwell only).
FORMAT_MIN_SM: dict[str, tuple[int, int]] = {
    "fp32": (7, 5),
    "fp16": (7, 5),
    "int8": (7, 5),  # Q/DQ INT8 (flow, HiFT) and SmoothQuant W8A8 (LLM)
    "int8_sq": (7, 5),
    "int8_wo": (7, 5),
    "bf16": (8, 0),
    "int4": (8, 0),  # ModelOpt ONNX INT4: blocked weight-only DequantizeLinear on GEMM weights
    "int4_awq": (8, 0),
    "fp8": (8, 9),
    "w4a8_awq": (8, 9),
    "nvfp4": (10, 0),
}


@dataclass(frozen=True)
class Target:
    """A deployment target; ``sm`` is the CUDA compute capability as (major, minor), None for CPUs.

    ``rtx_class``: a GeForce RTX / RTX PRO card, which TensorRT-RTX builds for (ahead of time,
    without that GPU); data-center GPUs are built for with TensorRT on the GPU itself.
    """

    name: str
    kind: str  # "cpu" or "gpu"
    sm: tuple[int, int] | None = None
    gpu_name: str = ""
    rtx_class: bool = False

    @property
    def sm_tag(self) -> str:
        """``sm89``-style tag, or ``cpu``."""
        return f"sm{self.sm[0]}{self.sm[1]}" if self.sm else "cpu"

    @property
    def formats(self) -> tuple[str, ...]:
        """The formats this GPU's hardware runs (empty for CPUs: there the backend decides)."""
        if self.sm is None:
            return ()
        return tuple(f for f, need in FORMAT_MIN_SM.items() if self.sm >= need)

    def format_problem(self, fmt: str) -> str | None:
        """Why this GPU cannot run ``fmt`` at all, or None (None for CPUs and unknown formats)."""
        need = FORMAT_MIN_SM.get(fmt)
        if self.sm is None or need is None or self.sm >= need:
            return None
        return (f"format '{fmt}' needs compute capability >= {need[0]}.{need[1]}; "
                f"target '{self.name}' ({self.gpu_name}) is {self.sm_tag}")


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("cpu", "cpu"),
        Target("t4", "gpu", (7, 5), "Tesla T4"),
        Target("a10", "gpu", (8, 6), "NVIDIA A10"),
        Target("a100", "gpu", (8, 0), "NVIDIA A100"),
        Target("l4", "gpu", (8, 9), "NVIDIA L4"),
        Target("l20", "gpu", (8, 9), "NVIDIA L20"),
        Target("l40s", "gpu", (8, 9), "NVIDIA L40S"),
        Target("rtx3090", "gpu", (8, 6), "NVIDIA GeForce RTX 3090", rtx_class=True),
        Target("rtx4090", "gpu", (8, 9), "NVIDIA GeForce RTX 4090", rtx_class=True),
        Target("rtx5090", "gpu", (12, 0), "NVIDIA GeForce RTX 5090", rtx_class=True),
        Target("h100", "gpu", (9, 0), "NVIDIA H100"),
        Target("h200", "gpu", (9, 0), "NVIDIA H200"),
        Target("b200", "gpu", (10, 0), "NVIDIA B200"),
    )
}


def targets_with_sm(sm: tuple[int, int]) -> list[Target]:
    """Every known GPU target of compute capability ``sm`` (e.g. L4, L20, L40S and RTX 4090 for 8.9)."""
    return [t for t in TARGETS.values() if t.sm == sm]
