"""ONNX export and simplification shared by every stage."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Iterable

from cosycompile.errors import BackendUnavailable

# Graphs above this size need ONNX external data (protobuf's 2 GiB limit).
_EXTERNAL_DATA_BYTES = 1_800_000_000


def export_onnx(module: Any, args: tuple[Any, ...], path: Path, input_names: list[str],
                output_names: list[str], dynamic_axes: dict[str, dict[int, str]], opset: int) -> None:
    """Export a torch module with the TorchScript-based exporter (fast, and exact for these nets).

    torch 2.13's dynamo exporter silently rewrites opset 17 graphs into invalid ones and takes
    ~30x longer on these models, so the legacy path with explicit dynamic axes is used.
    """
    import torch

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, args, str(path),
            input_names=input_names, output_names=output_names,
            dynamic_axes=dynamic_axes, opset_version=opset,
            do_constant_folding=True, dynamo=False,
        )


def save_model(model: Any, path: Path, initializers: Iterable[Any] = ()) -> None:
    """Save an ONNX ModelProto (plus ``initializers`` kept outside it, appended to its graph), switching to
    external data for very large graphs.

    The file is written a piece at a time: the model without its initializers, then each initializer as a
    ModelProto holding only that tensor in its graph. Protobuf merges repeated occurrences of an embedded
    message field, so every reader (onnx, ONNX Runtime, TensorRT's parser) loads the same model. Serializing
    a whole model at once in the upb runtime needs several times its size in transient buffers
    (``ByteSize`` included), which made this the largest allocation of a 0.5B build.
    """
    import onnx

    tensors = [*model.graph.initializer, *initializers]
    head = onnx.ModelProto()
    _copy_fields(model, head, skip="graph")
    _copy_fields(model.graph, head.graph, skip="initializer")
    if sum(_tensor_bytes(t) for t in tensors) > _EXTERNAL_DATA_BYTES:
        head.graph.initializer.extend(tensors)
        onnx.save_model(head, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data")
        return
    with open(path, "wb") as f:
        f.write(head.SerializeToString())
        for t in tensors:
            f.write(onnx.ModelProto(graph=onnx.GraphProto(initializer=[t])).SerializeToString())


def _copy_fields(src: Any, dst: Any, skip: str) -> None:
    """Copy every set field of protobuf message ``src`` but ``skip`` into ``dst`` (one level deep)."""
    for fd, value in src.ListFields():
        if fd.name == skip:
            continue
        if fd.is_repeated:
            getattr(dst, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def _tensor_bytes(t: Any) -> int:
    """A TensorProto's serialized size, without serializing a large one (raw data plus a margin)."""
    return len(t.raw_data) + 1024 if t.raw_data else t.ByteSize()


# While a graph is simplified its initializers at least this large stand aside as graph inputs (shape
# and type only): the simplifier then never copies a weight matrix (its copies were most of a 0.5B
# build's peak memory), and whatever it would have folded through one is folded by the engine build.
_ASIDE_BYTES = 64 * 1024


def simplify(src: Path, dst: Path, method: str, aside_bytes: int = _ASIDE_BYTES) -> dict[str, int]:
    """Simplify ``src`` into ``dst`` with onnxslim / onnxsim (or copy for 'none'); returns node counts."""
    import onnx

    model = onnx.load(str(src))
    before = len(model.graph.node)
    aside = _set_aside(model, aside_bytes) if method != "none" else {}
    if method == "onnxslim":
        import onnxslim

        model = onnxslim.slim(model)
    elif method == "onnxsim":
        try:
            import onnxsim
        except ImportError:
            raise BackendUnavailable("simplify: 'onnxsim' is not installed (pip install onnxsim), "
                                     "or use simplify: onnxslim") from None
        model, ok = onnxsim.simplify(model)
        if not ok:
            raise RuntimeError(f"onnxsim could not validate the simplified {src.name}")
    onnx.checker.check_model(model)
    save_model(model, dst, _take_back(model, aside))
    return {"nodes_before": before, "nodes_after": len(model.graph.node)}


def _set_aside(model: Any, min_bytes: int) -> dict[str, Any]:
    """Move the initializers of at least ``min_bytes`` out of ``model`` and declare each as a graph input
    of its type and shape; returns them by name. Detaching does not copy the tensors."""
    from onnx import helper

    graph = model.graph
    big = [t for t in graph.initializer if len(t.raw_data) >= min_bytes]
    if not big:
        return {}
    names = {t.name for t in big}
    rest = [t for t in graph.initializer if t.name not in names]
    del graph.initializer[:]
    graph.initializer.extend(rest)
    graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in big)
    return {t.name: t for t in big}


def _take_back(model: Any, aside: dict[str, Any]) -> list[Any]:
    """Drop the stand-in inputs of :func:`_set_aside` from ``model``; returns the tensors it still reads
    (a simplifier may have removed the only reader of some)."""
    inputs = model.graph.input
    kept = [i for i in inputs if i.name not in aside]
    used = [aside[i.name] for i in inputs if i.name in aside]
    if len(kept) != len(inputs):
        del inputs[:]
        inputs.extend(kept)
    return used


# Field numbers of onnx.proto3 that load_structure walks: ModelProto.graph, and the GraphProto fields it
# leaves out (initializer, sparse_initializer).
_MODEL_GRAPH = 7
_GRAPH_WEIGHTS = (5, 15)


def load_structure(path: Path) -> Any:
    """The ModelProto at ``path`` without its graph's initializers: nodes, inputs, outputs, value info
    and opsets, for reading a graph's structure.

    The file is walked at the protobuf wire level and only the parts kept are parsed, so a 2 GB LLM step
    costs its nodes' bytes, not a copy of its weights (``onnx.load`` parses every tensor, which put the
    op count at the end of the 0.5B INT8 quantize step above the build's memory bound).
    """
    import mmap

    import onnx

    model = onnx.ModelProto()
    with open(path, "rb") as f:
        if not f.seek(0, 2):
            return model
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            kept = bytearray()
            for num, start, payload, end in _wire_fields(buf, 0, len(buf)):
                if num != _MODEL_GRAPH or payload == start:
                    kept += buf[start:end]
                    continue
                graph = bytearray()
                for gnum, gstart, _, gend in _wire_fields(buf, payload, end):
                    if gnum not in _GRAPH_WEIGHTS:
                        graph += buf[gstart:gend]
                kept += _varint_bytes(_MODEL_GRAPH << 3 | 2) + _varint_bytes(len(graph)) + graph
    model.ParseFromString(bytes(kept))
    return model


def _wire_fields(buf: Any, start: int, end: int) -> Iterable[tuple[int, int, int, int]]:
    """(field number, where the field starts, where its length-delimited payload starts (the field's
    start for other wire types), where it ends) of each field of the message in ``buf[start:end]``."""
    i = start
    while i < end:
        first = i
        key, i = _read_varint(buf, i)
        wire = key & 7
        payload = first
        if wire == 0:
            _, i = _read_varint(buf, i)
        elif wire == 1:
            i += 8
        elif wire == 2:
            size, payload = _read_varint(buf, i)
            i = payload + size
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"not an ONNX model: wire type {wire} at byte {first}")
        if i > end:
            raise ValueError(f"not an ONNX model: a field at byte {first} runs past its message")
        yield key >> 3, first, payload, i


def _read_varint(buf: Any, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf):
            raise ValueError("not an ONNX model: it ends inside a field")
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def check_node_patterns(onnx_paths: list[Path], patterns: list[str], key: str) -> list[str]:
    """Every regex must match (``re.search``) a node name of one of the graphs; a bad or dead pattern
    is a RecipeError naming ``key`` (a recipe never carries a setting that does nothing)."""
    import re

    from cosycompile.errors import RecipeError

    names = [n.name for p in onnx_paths for n in load_structure(p).graph.node]
    for pat in patterns:
        try:
            rx = re.compile(pat)
        except re.error as exc:
            raise RecipeError(f"{key}: bad regex '{pat}' ({exc})") from None
        if not any(rx.search(n) for n in names):
            files = ", ".join(p.name for p in onnx_paths)
            raise RecipeError(f"{key}: '{pat}' matches no node of {files} (node names look like: {', '.join(names[:3])}, ...)")
    return patterns
