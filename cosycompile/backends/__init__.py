"""Engine backends as plug-ins.

Each backend module exposes the same two verbs::

    build(src: Path, options: dict, target: Target, out: Path) -> dict   # graphs dir -> engine dir
    load(engine_dir: Path, threads: int) -> dict[str, Runner]           # engine dir -> runners

This registry only holds light metadata (no runtime imports), so validating a recipe or
planning a build never imports ONNX Runtime, TensorRT or torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from cosycompile.recipe.targets import Target
from cosycompile.backends.options import OnnxRuntimeOptions, TensorRTOptions, TrtLLMOptions


@dataclass(frozen=True)
class BackendInfo:
    """What the planner needs to know about a backend without importing it."""

    name: str
    module: str
    options: type[BaseModel]
    tools: tuple[str, ...]
    target_kinds: tuple[str, ...]
    extra_check: Callable[[Target], str | None] | None = field(default=None)
    unavailable: str | None = None  # why this cosycompile cannot build with it yet

    def check_target(self, target: Target) -> str | None:
        """A reason the backend cannot build for ``target``, or None."""
        if target.kind not in self.target_kinds:
            return f"it builds for {'/'.join(self.target_kinds)} targets only"
        if self.extra_check:
            return self.extra_check(target)
        return None

    def check_options(self, options: dict[str, Any]) -> tuple[str, str] | None:
        """(key, message) for the first bad engine option, or None."""
        try:
            self.options.model_validate(options)
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(str(p) for p in err["loc"]) or "options"
            if err["type"] == "extra_forbidden":
                known = ", ".join(self.options.model_fields)
                return key, f"unknown engine option '{key}' for backend '{self.name}' (known: {known})"
            return key, f"engine option '{key}': {err['msg']} (got {err.get('input')!r})"
        return None

    def resolved_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """Options with defaults filled in (what goes into the step key)."""
        return self.options.model_validate(options).model_dump()

    def impl(self) -> ModuleType:
        """Import the backend's implementation module (heavy imports happen here)."""
        return importlib.import_module(self.module)


BACKENDS: dict[str, BackendInfo] = {
    "onnxruntime": BackendInfo(
        name="onnxruntime",
        module="cosycompile.backends.onnxruntime",
        options=OnnxRuntimeOptions,
        tools=("onnxruntime", "onnx"),
        target_kinds=("cpu",),
    ),
    "tensorrt": BackendInfo(
        name="tensorrt",
        module="cosycompile.backends.tensorrt",
        options=TensorRTOptions,
        tools=("tensorrt",),
        target_kinds=("gpu",),
        unavailable="the TensorRT backend is not part of this version of cosycompile yet",
    ),
    "trtllm": BackendInfo(
        name="trtllm",
        module="cosycompile.backends.trtllm",
        options=TrtLLMOptions,
        tools=("tensorrt-llm",),
        target_kinds=("gpu",),
        unavailable="the TensorRT-LLM backend is not part of this version of cosycompile yet",
    ),
}


def get_backend_info(name: str) -> BackendInfo | None:
    """Registry lookup; None for an unknown backend."""
    return BACKENDS.get(name)
