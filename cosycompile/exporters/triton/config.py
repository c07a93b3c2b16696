"""``config.pbtxt`` text from plain data: one small writer, so every model's config reads the same.

Only what cosycompile's models need: tensors, instance groups, decoupled policy, parameters,
backend or platform, default model file. The output parses with Triton's ``ModelConfig`` proto.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

# Graph-spec / numpy dtype names -> Triton data types.
TRITON_DTYPES = {
    "float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "float64": "TYPE_FP64",
    "int64": "TYPE_INT64", "int32": "TYPE_INT32", "int16": "TYPE_INT16", "int8": "TYPE_INT8",
    "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32", "uint64": "TYPE_UINT64",
    "bool": "TYPE_BOOL", "string": "TYPE_STRING", "bytes": "TYPE_STRING",
}


@dataclass(frozen=True)
class TensorConfig:
    """One model input or output; ``dims`` exclude the batch dim when ``max_batch_size > 0``; -1 = dynamic."""

    name: str
    dtype: str  # a key of TRITON_DTYPES
    dims: tuple[int, ...]
    optional: bool = False


@dataclass
class ModelConfig:
    """The fields of a Triton model config that the generated repositories set."""

    name: str
    inputs: list[TensorConfig]
    outputs: list[TensorConfig]
    backend: str | None = None  # "python", "tensorrtllm"
    platform: str | None = None  # "tensorrt_plan"
    max_batch_size: int = 0
    instance_kind: str = "KIND_CPU"
    instance_count: int = 1
    decoupled: bool = False
    default_model_filename: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)

    def text(self) -> str:
        """The ``config.pbtxt`` text."""
        lines = [f"name: {_q(self.name)}"]
        if self.backend:
            lines.append(f"backend: {_q(self.backend)}")
        if self.platform:
            lines.append(f"platform: {_q(self.platform)}")
        if self.default_model_filename:
            lines.append(f"default_model_filename: {_q(self.default_model_filename)}")
        lines.append(f"max_batch_size: {self.max_batch_size}")
        if self.decoupled:
            lines.append("model_transaction_policy { decoupled: true }")
        lines += _tensors("input", self.inputs) + _tensors("output", self.outputs)
        lines.append(f"instance_group [ {{ count: {self.instance_count} kind: {self.instance_kind} }} ]")
        for key in sorted(self.parameters):
            lines.append(f"parameters {{ key: {_q(key)} value: {{ string_value: {_q(self.parameters[key])} }} }}")
        return "\n".join(lines) + "\n"


def triton_dtype(dtype: str) -> str:
    """``TYPE_*`` of a graph-spec dtype name; ValueError for one Triton has no type for."""
    try:
        return TRITON_DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype '{dtype}' has no Triton data type") from None


def spec_dims(shape: list[int | str]) -> tuple[int, ...]:
    """Triton dims of a graph-spec shape: numbers stay, named (dynamic) dims become -1."""
    return tuple(d if isinstance(d, int) else -1 for d in shape)


def _tensors(kind: str, tensors: list[TensorConfig]) -> list[str]:
    if not tensors:
        return []
    body = []
    for t in tensors:
        dims = ", ".join(str(d) for d in t.dims)
        opt = " optional: true" if t.optional else ""
        body.append(f"  {{ name: {_q(t.name)} data_type: {triton_dtype(t.dtype)} dims: [ {dims} ]{opt} }}")
    return [f"{kind} ["] + [",\n".join(body)] + ["]"]


def _q(s: str) -> str:
    # JSON string escaping is valid protobuf text-format escaping for the characters we write.
    return json.dumps(s)
