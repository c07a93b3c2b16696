"""ONNX export and simplification shared by every stage."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

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


def save_model(model: Any, path: Path) -> None:
    """Save an ONNX ModelProto, switching to external data for very large graphs."""
    import onnx

    if model.ByteSize() > _EXTERNAL_DATA_BYTES:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data")
    else:
        onnx.save_model(model, str(path))


def simplify(src: Path, dst: Path, method: str) -> dict[str, int]:
    """Simplify ``src`` into ``dst`` with onnxslim / onnxsim (or copy for 'none'); returns node counts."""
    import onnx

    model = onnx.load(str(src))
    before = len(model.graph.node)
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
    save_model(model, dst)
    return {"nodes_before": before, "nodes_after": len(model.graph.node)}


def check_node_patterns(onnx_paths: list[Path], patterns: list[str], key: str) -> list[str]:
    """Every regex must match (``re.search``) a node name of one of the graphs; a bad or dead pattern
    is a RecipeError naming ``key`` (a recipe never carries a setting that does nothing)."""
    import re

    import onnx

    from cosycompile.errors import RecipeError

    names = [n.name for p in onnx_paths for n in onnx.load(str(p), load_external_data=False).graph.node]
    for pat in patterns:
        try:
            rx = re.compile(pat)
        except re.error as exc:
            raise RecipeError(f"{key}: bad regex '{pat}' ({exc})") from None
        if not any(rx.search(n) for n in names):
            files = ", ".join(p.name for p in onnx_paths)
            raise RecipeError(f"{key}: '{pat}' matches no node of {files} (node names look like: {', '.join(names[:3])}, ...)")
    return patterns
