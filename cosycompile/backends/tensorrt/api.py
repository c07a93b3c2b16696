"""The one place where TensorRT 10, TensorRT 11 and TensorRT-RTX differ.

What differs (TensorRT ``include/NvInfer.h`` and ``python/src/infer/pyCore.cpp`` @ v10.16 and v11.1;
TensorRT-RTX 1.7.1 as installed):

- Network creation: TensorRT 10 is weakly typed unless ``1 << STRONGLY_TYPED`` is passed; TensorRT 11
  is always strongly typed (``STRONGLY_TYPED`` is deprecated and ignored, ``EXPLICIT_BATCH`` is gone);
  TensorRT-RTX networks are strongly typed with flags 0.
- Precision flags: ``BuilderFlag.FP16`` exists only in TensorRT 10 (deprecated since 10.12).
- Target: TensorRT builds for the GPU it runs on (``hardware_compatibility_level`` widens that);
  TensorRT-RTX compiles ahead of time for the compute capabilities set on the config and has no
  hardware-compatibility level (setting one is ignored).
- Timing cache: TensorRT reads and writes it; in TensorRT-RTX every timing-cache call is a no-op
  ("Deprecated in TensorRT-RTX 1.2"), so it is not used there.
- Version compatibility: TensorRT embeds a lean runtime (``VERSION_COMPATIBLE``); TensorRT-RTX engines
  run only on the release that built them (its flag exists, but the wheel has no lean runtime to embed).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

from cosycompile.backends.tensorrt import MODULES
from cosycompile.errors import BackendUnavailable, RecipeError

_HW_LEVELS = {"none": "NONE", "same_compute_capability": "SAME_COMPUTE_CAPABILITY", "ampere_plus": "AMPERE_PLUS"}


def sm_tag(sm: tuple[int, int]) -> str:
    """``(8, 9)`` -> ``sm89``."""
    return f"sm{sm[0]}{sm[1]}"


@dataclass(frozen=True)
class TrtApi:
    """An imported builder module and what its version allows."""

    trt: Any  # the ``tensorrt`` or ``tensorrt_rtx`` module
    flavour: str  # "tensorrt" or "rtx"
    version: str

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def always_strongly_typed(self) -> bool:
        """TensorRT 11 and TensorRT-RTX have no weakly typed networks."""
        return self.flavour == "rtx" or self.major >= 11

    @property
    def has_precision_flags(self) -> bool:
        """Only TensorRT 10 still has ``BuilderFlag.FP16`` (weakly typed builds)."""
        return self.flavour == "tensorrt" and self.major == 10

    @property
    def uses_timing_cache(self) -> bool:
        """TensorRT-RTX accepts timing-cache calls but ignores them."""
        return self.flavour == "tensorrt"

    @property
    def label(self) -> str:
        return f"{'TensorRT-RTX' if self.flavour == 'rtx' else 'TensorRT'} {self.version}"

    def logger(self) -> Any:
        """A logger that prints errors (and keeps them, ``.errors``), prints each distinct warning once
        (TensorRT repeats some for every layer) and keeps the warnings for the passport (``.warnings``:
        message -> count)."""
        trt = self.trt
        error = int(trt.ILogger.Severity.ERROR)
        warning = int(trt.ILogger.Severity.WARNING)

        class BuildLog(trt.ILogger):  # type: ignore[misc, name-defined]
            def __init__(self) -> None:
                trt.ILogger.__init__(self)
                self.warnings: dict[str, int] = {}
                self.errors: list[str] = []

            def log(self, severity: Any, msg: str) -> None:
                level = int(severity)
                if level <= error:
                    self.errors.append(msg)
                    print(f"[{label}] error: {msg}", file=sys.stderr, flush=True)
                elif level == warning:
                    if msg not in self.warnings:
                        print(f"[{label}] warning: {msg}", file=sys.stderr, flush=True)
                    self.warnings[msg] = self.warnings.get(msg, 0) + 1

        label = self.label
        return BuildLog()

    def network_flags(self, builder_fp16: bool) -> int:
        """Flags for ``Builder.create_network``: strongly typed, unless TensorRT 10 picks FP16 by flag."""
        if builder_fp16 and not self.has_precision_flags:
            raise RecipeError(f"engine.options.builder_fp16: {self.label} has no FP16 builder flag (precision comes "
                              "only from the ONNX); use quantize: {format: fp16} instead")
        if self.always_strongly_typed:
            return 0
        if builder_fp16:
            return 0  # weakly typed: the builder may choose FP16 kernels for FP32 layers
        return 1 << int(self.trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)

    def set_precision_flags(self, config: Any, builder_fp16: bool) -> None:
        """TensorRT 10's weakly typed FP16; nothing otherwise (precision is in the graph)."""
        if builder_fp16:
            config.set_flag(self.trt.BuilderFlag.FP16)

    def set_target(self, config: Any, sm: tuple[int, int], hardware_compatibility: str) -> list[str]:
        """Say which GPUs the engine is for; returns the compute capabilities it will run on.

        TensorRT: the building GPU's, widened by the hardware-compatibility level. TensorRT-RTX: the
        compute capabilities compiled for (the target's, or every Ampere+ one for ``ampere_plus``).
        """
        if self.flavour == "rtx":
            known = {(int(n[2:-1]), int(n[-1])): n for n in self.trt.ComputeCapability.__members__ if n.startswith("SM")}
            if hardware_compatibility == "ampere_plus":
                sms = sorted(s for s in known if s >= (8, 0))
            else:
                sms = [sm]
            if sm not in known:
                raise BackendUnavailable(f"{self.label} cannot compile for {sm_tag(sm)} "
                                         f"(it has {', '.join(sm_tag(s) for s in sorted(known))})")
            config.num_compute_capabilities = len(sms)
            for i, s in enumerate(sms):
                config.set_compute_capability(getattr(self.trt.ComputeCapability, known[s]), i)
            return [sm_tag(s) for s in sms]
        level = _HW_LEVELS[hardware_compatibility]
        config.hardware_compatibility_level = getattr(self.trt.HardwareCompatibilityLevel, level)
        return {"none": [sm_tag(sm)], "same_compute_capability": [sm_tag(sm)], "ampere_plus": ["sm80+"]}[
            hardware_compatibility]

    def set_version_compatible(self, config: Any, on: bool) -> None:
        """Embed the lean runtime so later versions of the same major run the plan (TensorRT only: the
        RTX wheel has no lean runtime, and its engines run only on the release that built them)."""
        if on and self.flavour == "rtx":
            raise RecipeError(f"engine.options.version_compatible: {self.label} engines run only on the release that "
                              "built them")
        if on:
            config.set_flag(self.trt.BuilderFlag.VERSION_COMPATIBLE)

    def set_workspace(self, config: Any, gib: float) -> None:
        config.set_memory_pool_limit(self.trt.MemoryPoolType.WORKSPACE, int(gib * (1 << 30)))

    def load_timing_cache(self, config: Any, blob: bytes) -> bool:
        """Start the config's timing cache from ``blob`` (empty: a new cache); False if ``blob`` was
        refused (another GPU or version) and an empty cache is used instead."""
        cache = config.create_timing_cache(blob)
        if config.set_timing_cache(cache, ignore_mismatch=False):
            return True
        config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)
        return False

    def timing_cache_bytes(self, config: Any) -> bytes:
        return bytes(config.get_timing_cache().serialize())


def import_api(flavour: str) -> TrtApi:
    """Import the builder of ``flavour`` and read its version."""
    name = MODULES[flavour]
    try:
        trt = importlib.import_module(name)
    except ImportError as exc:
        extra = " (pip install 'cosycompile[rtx]')" if flavour == "rtx" else " (NVIDIA's package index or an NGC container)"
        raise BackendUnavailable(f"engine.options.flavour '{flavour}' needs the Python module '{name}': {exc}{extra}") from None
    return api_for(trt, flavour)


def api_for(trt: Any, flavour: str) -> TrtApi:
    """A TrtApi over an already imported module; refuses TensorRT older than 10."""
    version = str(getattr(trt, "__version__", "0"))
    api = TrtApi(trt, flavour, version)
    if flavour == "tensorrt" and api.major < 10:
        raise BackendUnavailable(f"TensorRT {version} is too old: this backend builds with TensorRT 10 or 11")
    return api
