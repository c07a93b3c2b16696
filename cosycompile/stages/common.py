"""Plumbing shared by the stage plug-ins: model dir resolution, ONNX export of a stage's graphs
from their specs, the eval inputs every check uses, and reading the cached reference."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext
from cosycompile.runtime.graphs_dir import GraphsDir


def model_dir(ctx: StepContext) -> Path:
    """The checkpoint dir a step reads: a built-in model's step output, or the real dir on disk."""
    if "model" in ctx.inputs:
        return ctx.inputs["model"]
    return ctx.file_roots["model"]


def export_stage(ctx: StepContext, stage: str) -> dict[str, Any]:
    """Export every graph of ``stage`` to ONNX from its spec; write assets and ``graphs.json``."""
    import torch

    from cosycompile.models.loader import load_models
    from cosycompile.onnx.tools import export_onnx
    from cosycompile.stages import get_stage

    sinfo = get_stage(stage)
    models = load_models(model_dir(ctx), (stage,))
    modules, assets, info = sinfo.hook("modules")(models)
    gd = GraphsDir(ctx.out, stage, {}, {}, dict(info))
    for spec in sinfo.graphs:
        path = ctx.out / f"{spec.name}.onnx"
        ctx.log(f"exporting {spec.name}")
        dummy = spec.dummy_inputs(info)
        args = tuple(torch.from_numpy(dummy[n]) for n in spec.input_names)
        export_onnx(modules[spec.name], args, path, spec.input_names, spec.output_names, spec.dynamic_axes(),
                    ctx.params["opset"])
        gd.graphs[spec.name] = {"file": path.name, "inputs": spec.input_names, "outputs": spec.output_names,
                                "spec": spec.describe(info)}
    for name, arr in assets.items():
        np.save(ctx.out / f"{name}.npy", np.ascontiguousarray(arr))
        gd.assets[name] = f"{name}.npy"
    gd.info.setdefault("precision", "fp32")
    gd.write()
    return {"graphs": sorted(gd.graphs), "assets": sorted(gd.assets)}


def write_check(ctx: StepContext, metrics: dict[str, Any]) -> dict[str, Any]:
    """Store a check's measurements as ``check.json``; thresholds are applied by the gate."""
    workload = ctx.spec.model_dump(mode="json") if ctx.spec is not None else {}
    body = {"stage": ctx.name.split(".")[0], "metrics": metrics, "workload": workload}
    (ctx.out / "check.json").write_text(json.dumps(body, indent=1, sort_keys=True, default=float))
    return {"metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))}}


def eval_inputs(ctx: StepContext) -> list[tuple[np.ndarray, Any]]:
    """(text ids, prompt) of the eval items the checks use: the same head of the set as the reference."""
    from cosycompile.runtime.dataset import load_dataset
    from cosycompile.runtime.frontend import Frontend

    frontend = Frontend(model_dir(ctx))
    items = load_dataset(ctx.file_roots["eval"]).head(ctx.params["max_items"])
    return [frontend.item_inputs(i) for i in items]


def reference_arrays(ctx: StepContext, stage: str) -> dict[str, np.ndarray]:
    """The stage's reference outputs computed once per model by the ``reference`` step."""
    with np.load(ctx.inputs["reference"] / f"{stage}.npz") as z:
        return {k: z[k] for k in z.files}


def engine_runtime(ctx: StepContext, stage: str, which: str = "engine") -> Any:
    """The stage runtime over the engine dir of input ``which`` (the build's own engine is shared
    with the pipeline check that follows; the FP32 comparison engine is not kept)."""
    from cosycompile.runtime.loading import stage_runtime

    return stage_runtime(stage, ctx.inputs[which], ctx.params["threads"], share=which == "engine")


def speed_vs_fp32(ctx: StepContext, stage: str, engine: Any, workload: Any) -> dict[str, float]:
    """Speed of a quantized engine against the FP32 engine of the same backend: interleaved pairs,
    median of per-pair ratios (sequential medians on a shared machine do not measure a ratio)."""
    if "fp32_engine" not in ctx.inputs:
        return {}
    from cosycompile.validate.speed import paired_ratio

    fp32 = engine_runtime(ctx, stage, "fp32_engine")
    r = paired_ratio(lambda: workload(fp32), lambda: workload(engine), pairs=ctx.params.get("pairs", 5),
                     warmup=ctx.params.get("warmup", 1))
    return {"fp32_engine_ms": 1000 * r.reference_s, "engine_ms": 1000 * r.candidate_s, "speedup_vs_fp32": r.ratio,
            "speedup_spread": r.spread, "speed_pairs": r.pairs}
