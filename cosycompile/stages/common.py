"""Plumbing shared by the stage plug-ins' exports: model dir resolution and the export of a stage's
graphs from their specs (ONNX or torch.export programs). The checks' plumbing is in check_tools,
so that timing or runtime code never enters an export's cache key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext
from cosycompile.runtime.graphs_dir import GraphsDir
from cosycompile.runtime.torch_programs import save_program


def model_dir(ctx: StepContext) -> Path:
    """The checkpoint dir a step reads: a built-in model's step output, or the real dir on disk."""
    if "model" in ctx.inputs:
        return ctx.inputs["model"]
    return ctx.file_roots["model"]


def export_stage(ctx: StepContext, stage: str) -> dict[str, Any]:
    """Export every graph of ``stage`` to ONNX from its spec; write assets and ``graphs.json``."""
    import torch

    from cosycompile.onnx.tools import export_onnx

    def write(spec: Any, module: Any, info: dict[str, Any]) -> tuple[str, dict[str, int]]:
        path = ctx.out / f"{spec.name}.onnx"
        dummy = spec.dummy_inputs(info)
        args = tuple(torch.from_numpy(dummy[n]) for n in spec.input_names)
        export_onnx(module, args, path, spec.input_names, spec.output_names, spec.dynamic_axes(), ctx.params["opset"])
        return path.name, {}

    return _export_graphs(ctx, stage, write)


def export_programs(ctx: StepContext) -> dict[str, Any]:
    """The export for backends that compile torch programs (``BackendInfo.consumes == "program"``):
    every graph of the stage as a ``torch.export`` ExportedProgram (``<graph>.pt2``) whose dynamic
    dims are the graph spec's, next to the same assets and ``graphs.json`` as an ONNX export."""

    def write(spec: Any, module: Any, info: dict[str, Any]) -> tuple[str, dict[str, int]]:
        path = ctx.out / f"{spec.name}.pt2"
        bake_parametrizations(module)
        program, mins = export_program(module, spec, info)
        save_program(program, path)
        return path.name, mins

    return _export_graphs(ctx, ctx.params["stage"], write, fmt="torch.export")


def bake_parametrizations(module: Any) -> int:
    """Replace, in place, every parametrized tensor of ``module`` (HiFT's weight norm) by a plain
    parameter holding its value; returns how many. Exported as they are, such weights are computed
    in the program from their parts on every call, so a quantizer that rewrites the layers whose
    weights are constants (torch_dynamic's BF16 convolutions) passes over them; Inductor's freezing
    would fold the computation anyway, so the FP32 engine computes the same."""
    from torch.nn.utils import parametrize

    baked = 0
    for m in module.modules():
        if parametrize.is_parametrized(m):
            for name in list(m.parametrizations):
                parametrize.remove_parametrizations(m, name, leave_parametrized=True)
                baked += 1
    return baked


def program_dynamic_shapes(spec: Any, info: dict[str, Any], auto: frozenset[str] = frozenset(),
                           ) -> dict[str, dict[int, Any] | None]:
    """``torch.export`` dynamic shapes from a graph spec: one ``Dim`` per named dynamic dim (or
    ``Dim.AUTO`` for the dims in ``auto``), products such as HiFT's ``frames*samples_per_frame``
    as derived dims."""
    import torch

    names = {d.name: d for d in spec.dims}
    dims: dict[str, Any] = {}
    out: dict[str, dict[int, Any] | None] = {}
    for t in spec.inputs:
        axes = {}
        for axis, entry in enumerate(t.shape):
            if not isinstance(entry, str) or entry.split("*")[0] not in names:
                continue
            head, *rest = entry.split("*")
            d = names[head]
            if head not in dims:
                dims[head] = torch.export.Dim.AUTO if head in auto else torch.export.Dim(head, min=d.min, max=d.max)
            factor = 1
            for part in rest:
                factor *= int(spec.fixed.get(part, info.get(part, part)))
            # An AUTO dim has no expression to derive from: its products are AUTO too.
            axes[axis] = dims[head] * factor if factor != 1 and head not in auto else dims[head]
        out[t.name] = axes or None
    return out


def program_example_inputs(spec: Any, info: dict[str, Any]) -> tuple[Any, ...]:
    """Inputs to trace a program with: every dynamic dim at its optimisation point and at least 2.

    ``torch.export`` specializes any size it sees at 0 or 1, intermediate ones included: HiFT's
    phase is summed in blocks of 64 frames, and traced at 20 frames the program held one block
    only, and AOTInductor checks no guard at run time (the HiFT check caught it at 20 dB).
    """
    import torch

    sizes = {d.name: max(d.opt, 2) for d in spec.dims}
    dummy = spec.dummy_inputs(info, sizes=sizes)
    return tuple(torch.from_numpy(dummy[n]) for n in spec.input_names)


def export_program(module: Any, spec: Any, info: dict[str, Any]) -> tuple[Any, dict[str, int]]:
    """``torch.export`` of one graph module with the spec's dynamic dims: (program, raised minimums).

    Some networks make guards the exporter cannot prove over a spec's range (the flow encoder's
    ``(2n - 1) % n != 0`` on tokens, false only at n = 1); such dims are exported again as
    ``Dim.AUTO``, which holds from 2 up, and the graph's spec in ``graphs.json`` says so. A module
    that names such dims itself (``export_from_two``) is exported that way at once, without the failed
    attempt, which traces the whole graph first.
    """
    import inspect
    import re

    import torch

    names = {d.name for d in spec.dims}
    auto = frozenset(getattr(module, "export_from_two", ())) & names
    varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in inspect.signature(module.forward).parameters.values())
    while True:
        try:
            shapes = tuple(program_dynamic_shapes(spec, info, auto).values())
            if varargs:
                shapes = (shapes,)  # forward(*args): the exporter sees one tuple argument
            with torch.no_grad():
                program = torch.export.export(module, program_example_inputs(spec, info), strict=False,
                                              dynamic_shapes=shapes)
            return program, {n: 2 for n in auto}
        except torch._dynamo.exc.UserError as exc:
            match = re.search(r"Constraints violated \(([\w, ]+)\)", str(exc))
            violated = {n.strip() for n in match.group(1).split(",")} & names if match else set()
            if not violated - auto:
                raise
            auto = auto | violated


def _export_graphs(ctx: StepContext, stage: str, write: Any, fmt: str = "onnx") -> dict[str, Any]:
    """Load the stage's network, write each graph with ``write(spec, module, info) -> (file name,
    raised dim minimums)``, then its assets and ``graphs.json``."""
    from cosycompile.families import load_models
    from cosycompile.stages import get_stage

    sinfo = get_stage(stage)
    models = load_models(model_dir(ctx), (stage,), ctx.params.get("family"))
    modules, assets, info = sinfo.hook("modules")(models)
    # The recipe's runtime settings (validated by the stage's runtime spec) override the model's; the
    # family tells a loader of the graphs dir which runtime runs them.
    info = {**info, "family": models.family, **ctx.params.get("runtime", {})}
    gd = GraphsDir(ctx.out, stage, {}, {}, dict(info))
    for spec in sinfo.graphs:
        if spec.torch_program_only and (fmt == "onnx" or (ctx.params.get("target_kind") != "gpu"
                                                           and not ctx.params.get("static_cache"))):
            continue
        ctx.log(f"exporting {spec.name}")
        file, mins = write(spec, modules[spec.name], info)
        described = spec.describe(info)
        for dim, low in mins.items():
            described["dims"][dim]["min"] = low
        gd.graphs[spec.name] = {"file": file, "inputs": spec.input_names, "outputs": spec.output_names,
                                "spec": described}
        if fmt != "onnx":
            gd.graphs[spec.name]["format"] = fmt
    for name, arr in assets.items():
        np.save(ctx.out / f"{name}.npy", np.ascontiguousarray(arr))
        gd.assets[name] = f"{name}.npy"
    gd.info.setdefault("precision", "fp32")
    gd.write()
    return {"graphs": sorted(gd.graphs), "assets": sorted(gd.assets)}
