"""The I/O contract of one compiled graph, declared once in its stage's folder.

Exporters derive dynamic axes and dummy inputs from it, backends derive optimisation profiles
from its named dynamic dims, quantizers crop calibration records along its calibration axis,
and ``graphs.json`` carries it (resolved for the model) to every engine and runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where arrays are made: planning a cached build needs none
    import numpy as np


@dataclass(frozen=True)
class Dim:
    """A named dynamic dimension with optimisation-profile hints and the size used for export."""

    name: str
    min: int
    opt: int
    max: int
    example: int


@dataclass(frozen=True)
class Tensor:
    """A graph input or output. ``shape`` holds ints, dynamic dim names, model-info keys, or
    ``"dim*key"`` products (e.g. HiFT's noise has ``frames*samples_per_frame`` samples)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    # [low, high) of dummy values; an end may be a model-info key (a token input's vocabulary size)
    value_range: tuple[float | str, float | str] | None = None


@dataclass(frozen=True)
class GraphSpec:
    """One exported graph: its tensors, dynamic dims, accuracy tolerance and calibration crop axis."""

    name: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    dims: tuple[Dim, ...] = ()
    tolerance: float = 1e-3  # max abs error of an FP32 engine against PyTorch
    calib_crop_dim: str | None = None  # dynamic dim along which calibration records are cropped to agree
    quantizable: bool = False  # whether ONNX quantizers should quantize this graph
    fixed: dict[str, int] = field(default_factory=dict)  # constant dims not taken from model info
    # Exported only as a torch program, never to ONNX: for a GPU target always, for a CPU target when
    # the torch backend's ``static_cache`` asks (the static-cache decode step, a CUDA graph on a GPU).
    torch_program_only: bool = False

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    def dim(self, name: str) -> Dim:
        return next(d for d in self.dims if d.name == name)

    def _size(self, entry: int | str, info: dict[str, Any], sizes: dict[str, int]) -> int | str:
        if isinstance(entry, int):
            return entry
        parts = entry.split("*")
        if any(p in self._dynamic() and p not in sizes for p in parts):
            return entry
        total = 1
        for p in parts:
            if p in sizes:
                total *= sizes[p]
            elif p in self.fixed:
                total *= self.fixed[p]
            elif p in info:
                total *= int(info[p])
            else:
                raise KeyError(f"graph {self.name}: dim '{p}' is neither dynamic nor in the model info")
        return total

    def _dynamic(self) -> set[str]:
        return {d.name for d in self.dims}

    def shape(self, tensor: Tensor, info: dict[str, Any], sizes: dict[str, int] | None = None) -> list[int | str]:
        """The tensor's shape with model constants filled in; dynamic dims stay names unless sized."""
        return [self._size(e, info, sizes or {}) for e in tensor.shape]

    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        """``{tensor: {axis: dim name}}`` for every axis that depends on a dynamic dim."""
        dyn = self._dynamic()
        out: dict[str, dict[int, str]] = {}
        for t in self.inputs + self.outputs:
            axes = {i: e for i, e in enumerate(t.shape) if isinstance(e, str) and e.split("*")[0] in dyn}
            if axes:
                out[t.name] = {i: e.replace("*", "_x_") for i, e in axes.items()}
        return out

    def dummy_inputs(self, info: dict[str, Any], seed: int = 0,
                     sizes: dict[str, int] | None = None) -> dict[str, np.ndarray]:
        """Inputs at each dynamic dim's ``example`` size (what the exporter traces with), or at ``sizes``."""
        import numpy as np

        rng = np.random.default_rng(seed)
        sizes = sizes or {d.name: d.example for d in self.dims}
        out = {}
        for t in self.inputs:
            shape = tuple(int(s) for s in self.shape(t, info, sizes))
            lo, hi = (info[e] if isinstance(e, str) else e for e in t.value_range or (0, 100))
            if t.dtype.startswith("int"):
                out[t.name] = rng.integers(int(lo), int(hi), shape).astype(t.dtype)
            elif t.value_range is not None:
                out[t.name] = rng.uniform(lo, hi, shape).astype(t.dtype)
            else:
                out[t.name] = rng.standard_normal(shape).astype(t.dtype)
        return out

    def describe(self, info: dict[str, Any]) -> dict[str, Any]:
        """The JSON form written into ``graphs.json`` (model constants resolved)."""

        def tensors(ts: tuple[Tensor, ...]) -> list[dict[str, Any]]:
            return [{"name": t.name, "dtype": t.dtype, "shape": self.shape(t, info)} for t in ts]

        return {
            "inputs": tensors(self.inputs),
            "outputs": tensors(self.outputs),
            "dims": {d.name: {"min": d.min, "opt": d.opt, "max": d.max} for d in self.dims},
            "tolerance": self.tolerance,
            "calib_crop_dim": self.calib_crop_dim,
        }


def crop_records(spec: GraphSpec, records: list[dict[str, np.ndarray]], info: dict[str, Any]) -> list[dict[str, np.ndarray]]:
    """Crop calibration records along the spec's crop dim to the shortest record (some quantizers
    concatenate activations across records, so the dynamic axes must agree)."""
    import numpy as np

    if spec.calib_crop_dim is None or not records:
        return records
    dim = spec.calib_crop_dim

    def length(r: dict[str, np.ndarray]) -> int:
        for t in spec.inputs:
            for axis, e in enumerate(t.shape):
                if e == dim:
                    return int(r[t.name].shape[axis])
        raise KeyError(dim)

    n = min(length(r) for r in records)
    out = []
    for r in records:
        cropped = {}
        for t in spec.inputs:
            arr = r[t.name]
            for axis, e in enumerate(t.shape):
                if isinstance(e, str) and e.split("*")[0] == dim:
                    size = int(spec._size(e, info, {dim: n}))
                    arr = np.take(arr, np.arange(size), axis=axis)
            cropped[t.name] = arr
        out.append(cropped)
    return out
