"""The ``<stage>.quantize`` step of ``torch_autocast``: program -> program traced under autocast."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cosycompile.core.graph import StepContext
from cosycompile.quantize.graphs import rewrite_graphs
from cosycompile.runtime.graphs_dir import GraphsDir
from cosycompile.runtime.torch_programs import load_program, save_program

_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def quantize(ctx: StepContext) -> dict[str, Any]:
    """Re-export each chosen program of the stage under autocast; the others are linked through."""
    from cosycompile.stages import get_stage
    from cosycompile.stages.common import export_program

    stage, fmt = ctx.params["stage"], ctx.spec.format
    dtype = getattr(torch, _DTYPES[fmt])

    def one(name: str, src: GraphsDir, dst: Path) -> dict[str, Any]:
        ctx.log(f"{name}: autocast {fmt}")
        inner = load_program(src.graph_path(name)).module()
        program, _ = export_program(Autocast(inner, dtype), get_stage(stage).graph(name), src.info)
        # Decomposing turns the autocast region into explicit casts, which do not depend on the device.
        save_program(program.run_decompositions({}), dst)
        return {"dtype": str(dtype)}

    return rewrite_graphs(ctx, fmt, list(ctx.spec.graphs) if ctx.spec.graphs is not None else None, one)


class Autocast(torch.nn.Module):
    """Wraps a program's module: autocast inside, FP32 floating outputs (the graph spec's dtypes)."""

    def __init__(self, inner: torch.nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.inner, self.dtype = inner, dtype

    def forward(self, *args: torch.Tensor) -> Any:
        with torch.autocast("cpu", dtype=self.dtype):
            outs = self.inner(*args)
        if isinstance(outs, torch.Tensor):
            return outs.float() if outs.is_floating_point() else outs
        return tuple(o.float() if o.is_floating_point() else o for o in outs)
