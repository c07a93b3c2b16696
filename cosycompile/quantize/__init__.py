"""Quantizers as plug-ins: each sub-folder is one quantizer (``stages.<stage>.quantize.quantizer``,
chosen by stage and format when the recipe does not name one).

A quantizer folder's ``__init__.py`` is light: ``PLUGIN = QuantizerInfo(...)`` with its typed spec,
the formats and stages it handles and the rules its spec must follow; ``quantize.py`` holds the
step body ``quantize(ctx)``. ``calibrate.py`` here records every stage's real inputs from the FP32
reference for all quantizers to read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from cosycompile.core.plugins import discover, load_object, resolve_ref
from cosycompile.core.targets import Target

# Formats whose compute needs FP8 tensor cores (Ada / Hopper and newer).
NEEDS_SM89 = ("fp8", "w4a8_awq")


class NoQuantization(BaseModel):
    """``format: fp32``: the exported graphs go to the engine as they are."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["fp32"] = Field("fp32", description="fp32: no quantization")


@dataclass(frozen=True)
class QuantizerInfo:
    """What recipes and the planner need to know about a quantizer without importing it."""

    spec: type[BaseModel]  # must have ``format`` (and accept ``quantizer``)
    formats: tuple[str, ...]
    tools: tuple[str, ...]
    stages: tuple[str, ...] | None = None  # None: every stage with quantizable ONNX graphs
    weight_only: tuple[str, ...] = ()  # formats calibrated from weights alone (no recorded activations)
    check: Callable[[Any, str, Target], tuple[str, str] | None] | None = None  # (spec, stage, target) -> (key, reason)
    backends: tuple[str, ...] | None = None  # the engine backends that run what it writes (None: any)
    quantize: str = ".quantize:quantize"
    name: str = ""
    package: str = ""

    def handles(self, stage: str, fmt: str, stage_has_quantizable_graphs: bool) -> bool:
        """Whether this quantizer can produce ``fmt`` for ``stage``."""
        if fmt not in self.formats:
            return False
        return stage in self.stages if self.stages is not None else stage_has_quantizable_graphs

    def needs_calibration(self, fmt: str) -> bool:
        return fmt not in self.weight_only

    def serves(self, backend: str, consumes: str) -> bool:
        """Whether ``backend`` (consuming ``consumes`` graphs) runs what this quantizer writes: torch
        programs only go through quantizers that name the backend, other graphs through any quantizer
        not restricted to other backends."""
        return backend in (self.backends or ()) or (self.backends is None and consumes != "program")

    def ref(self, attr: str) -> str:
        return resolve_ref(self.package, getattr(self, attr))

    def hook(self, attr: str) -> Any:
        return load_object(self.ref(attr))


def quantizer_infos() -> dict[str, QuantizerInfo]:
    """Every quantizer plug-in by name."""
    return discover("quantize")


def choose_quantizer(stage: str, fmt: str, named: str | None, backend: str | None = None,
                     consumes: str = "onnx") -> QuantizerInfo | str:
    """The quantizer for ``fmt`` on ``stage`` (the one named, else the first that handles it and whose
    output ``backend`` runs), or the reason there is none."""
    from cosycompile.stages import get_stage

    quantizable = any(g.quantizable for g in get_stage(stage).graphs)
    infos = quantizer_infos()
    if named is not None:
        q = infos.get(named)
        if q is None:
            return f"unknown quantizer '{named}' (known: {', '.join(infos)})"
        if not q.handles(stage, fmt, quantizable):
            return f"quantizer '{named}' cannot produce '{fmt}' for stage '{stage}' (formats: {', '.join(q.formats)})"
        return q
    # One whose output the backend can run first, then one written for this stage over a generic one.
    ranked = sorted(infos.values(), key=lambda q: (backend is not None and not q.serves(backend, consumes),
                                                   q.stages is None))
    for q in ranked:
        if q.handles(stage, fmt, quantizable):
            return q
    known = sorted({f for q in ranked for f in q.formats if q.handles(stage, f, quantizable)})
    return f"stage '{stage}' cannot use format '{fmt}' (supported: fp32, {', '.join(known)})"


def formats_for(stage: str, backend: str, consumes: str = "onnx") -> list[str]:
    """The formats some quantizer produces for ``stage`` in a form ``backend`` runs, in registry order."""
    from cosycompile.stages import get_stage

    quantizable = any(g.quantizable for g in get_stage(stage).graphs)
    out: list[str] = []
    for q in quantizer_infos().values():
        if q.serves(backend, consumes):
            out += [f for f in q.formats if f not in out and q.handles(stage, f, quantizable)]
    return out


class CalibratedSpec(BaseModel):
    """A quantizer spec whose ``format`` chooses among calibration methods (its optional ``method``).

    Subclasses set ``METHODS``: format -> the methods it accepts, the first being its default.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    METHODS: ClassVar[dict[str, tuple[str, ...]]] = {}

    @property
    def resolved_method(self) -> str:
        """The recipe's method, or the format's default."""
        return self.method or self.METHODS[self.format][0]  # type: ignore[attr-defined]

    def method_problem(self) -> tuple[str, str] | None:
        """("method", reason) when the recipe's method is not one its format accepts, else None."""
        fmt, method = self.format, self.method  # type: ignore[attr-defined]
        if method is not None and method not in self.METHODS[fmt]:
            return "method", f"format '{fmt}' cannot use method '{method}' (supported: {', '.join(self.METHODS[fmt])})"
        return None


def target_problem(fmt: str, target: Target) -> str | None:
    """A reason ``target`` cannot run ``fmt`` at all, or None."""
    if target.kind == "gpu" and fmt in NEEDS_SM89 and target.sm is not None and target.sm < (8, 9):
        return (f"format '{fmt}' needs FP8 tensor cores (compute capability >= 8.9); "
                f"target '{target.name}' is {target.sm_tag}")
    return None
