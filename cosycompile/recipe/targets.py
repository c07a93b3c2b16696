"""Deployment targets: what hardware a recipe builds for.

The target is part of every engine step's key (an engine built for sm89 is not an engine for
sm90), and backends use it to refuse formats the hardware cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """A deployment target; ``sm`` is the CUDA compute capability as (major, minor), None for CPUs."""

    name: str
    kind: str  # "cpu" or "gpu"
    sm: tuple[int, int] | None = None
    gpu_name: str = ""

    @property
    def sm_tag(self) -> str:
        """``sm89``-style tag, or ``cpu``."""
        return f"sm{self.sm[0]}{self.sm[1]}" if self.sm else "cpu"


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
        Target("rtx4090", "gpu", (8, 9), "NVIDIA GeForce RTX 4090"),
        Target("h100", "gpu", (9, 0), "NVIDIA H100"),
        Target("h200", "gpu", (9, 0), "NVIDIA H200"),
    )
}
