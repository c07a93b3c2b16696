"""Plumbing shared by the stage plug-ins' checks: the eval inputs, the cached reference, the engine
runtimes, the speed ratio against the FP32 engine and the check's output file.

Kept apart from common (the exports' plumbing): a step's cache key covers every module its code
can import, and a change to how checks time engines must not rebuild every export.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext
from cosycompile.stages.common import model_dir


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
                     warmup=ctx.params.get("warmup", 1), min_seconds=ctx.params.get("min_seconds", 0.0))
    return {"fp32_engine_ms": 1000 * r.reference_s, "engine_ms": 1000 * r.candidate_s, "speedup_vs_fp32": r.ratio,
            "speedup_spread": r.spread, "speed_pairs": r.pairs}
