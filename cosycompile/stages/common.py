"""Plumbing shared by the stage modules: model dir resolution, ONNX export of a stage's graphs,
and the inputs every stage check needs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext
from cosycompile.runtime.graphs_dir import GraphsDir
from cosycompile.stage_io import STAGE_GRAPHS


def model_dir(ctx: StepContext) -> Path:
    """The checkpoint dir a step reads: a built-in model's step output, or the real dir on disk."""
    if "model" in ctx.inputs:
        return ctx.inputs["model"]
    return ctx.file_roots["model"]


def export_stage(ctx: StepContext, stage: str, modules: dict[str, Any], examples: dict[str, tuple[Any, ...]],
                 dynamic_axes: dict[str, dict[str, dict[int, str]]], assets: dict[str, np.ndarray],
                 info: dict[str, Any]) -> dict[str, Any]:
    """Export every graph of ``stage`` to ONNX and write its assets and ``graphs.json``."""
    from cosycompile.onnx.tools import export_onnx

    gd = GraphsDir(ctx.out, stage, {}, {}, dict(info))
    for io in STAGE_GRAPHS[stage]:
        path = ctx.out / f"{io.name}.onnx"
        ctx.log(f"exporting {io.name}")
        export_onnx(modules[io.name], examples[io.name], path, list(io.inputs), list(io.outputs),
                    dynamic_axes[io.name], ctx.params["opset"])
        gd.graphs[io.name] = {"file": path.name, "inputs": list(io.inputs), "outputs": list(io.outputs)}
    for name, arr in assets.items():
        np.save(ctx.out / f"{name}.npy", np.ascontiguousarray(arr))
        gd.assets[name] = f"{name}.npy"
    gd.info.setdefault("precision", "fp32")
    gd.write()
    return {"graphs": sorted(gd.graphs), "assets": sorted(gd.assets)}


def write_check(ctx: StepContext, metrics: dict[str, Any], failures: list[str]) -> dict[str, Any]:
    """Store a check's result as ``check.json`` (a failed check is a result, not an error)."""
    body = {"stage": ctx.name.split(".")[0], "passed": not failures, "failures": failures, "metrics": metrics,
            "thresholds": ctx.params.get("check", {})}
    (ctx.out / "check.json").write_text(json.dumps(body, indent=1, sort_keys=True, default=float))
    for f in failures:
        ctx.log(f"FAILED: {f}")
    return {"passed": not failures}


def eval_items(ctx: StepContext) -> list[Any]:
    """The eval items the check uses (same head of the set as the pipeline check)."""
    from cosycompile.runtime.dataset import load_dataset

    files = ctx.files["eval"]
    root = ctx.file_roots["eval"]
    assert files, "eval files are part of every check's key"
    return list(load_dataset(root).head(ctx.params["max_items"]))


def engine_runtime(ctx: StepContext, stage: str) -> Any:
    from cosycompile.runtime.loading import stage_runtime

    return stage_runtime(stage, ctx.inputs["engine"], ctx.params["backend"], ctx.params["threads"])


def speed_vs_fp32(ctx: StepContext, stage: str, engine: Any, workload: Any) -> dict[str, float]:
    """Speed of a quantized engine against the FP32 engine of the same backend, same run, same input."""
    if "fp32_engine" not in ctx.inputs:
        return {}
    from cosycompile.runtime.loading import stage_runtime
    from cosycompile.validate.speed import timed

    fp32 = stage_runtime(stage, ctx.inputs["fp32_engine"], ctx.params["backend"], ctx.params["threads"])
    fp32_ms = 1000 * timed(lambda: workload(fp32))[0]
    q_ms = 1000 * timed(lambda: workload(engine))[0]
    return {"fp32_engine_ms": fp32_ms, "engine_ms": q_ms, "speedup_vs_fp32": fp32_ms / q_ms if q_ms else 0.0}
