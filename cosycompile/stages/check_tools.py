"""Plumbing shared by the stage plug-ins' checks: the cached reference, the engine runtimes, the
speed ratio against the FP32 engine and the check's output file.

Kept apart from common (the exports' plumbing): a step's cache key covers every module its code
can import, and a change to how checks time engines must not rebuild every export.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext


def write_check(ctx: StepContext, metrics: dict[str, Any]) -> dict[str, Any]:
    """Store a check's measurements as ``check.json``; thresholds are applied by the gate."""
    workload = ctx.spec.model_dump(mode="json") if ctx.spec is not None else {}
    body = {"stage": ctx.name.split(".")[0], "metrics": metrics, "workload": workload}
    (ctx.out / "check.json").write_text(json.dumps(body, indent=1, sort_keys=True, default=float))
    return {"metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))}}


def reference_arrays(ctx: StepContext, stage: str) -> dict[str, np.ndarray]:
    """The stage's reference outputs computed once per model by the ``reference`` step."""
    with np.load(ctx.inputs["reference"] / f"{stage}.npz") as z:
        return {k: z[k] for k in z.files}


def engine_runtime(ctx: StepContext, stage: str, which: str = "engine") -> Any:
    """The stage runtime over the engine dir of input ``which`` (the build's own engine is shared
    with the pipeline check that follows; the FP32 comparison engine is not kept)."""
    from cosycompile.runtime.loading import stage_runtime

    return stage_runtime(stage, ctx.inputs[which], ctx.params["threads"], share=which == "engine")


def speed_vs_fp32(ctx: StepContext, stage: str, engine: Any, workload: Any) -> dict[str, Any]:
    """Speed of a quantized engine against the FP32 engine of the same backend: interleaved pairs,
    median of per-pair ratios (sequential medians on a shared machine do not measure a ratio); with
    the recipe's ``validation.speed.machine_state``, also per state of the machine."""
    if "fp32_engine" not in ctx.inputs:
        return {}
    from cosycompile.validate.machine_state import probe, ratio_by_state
    from cosycompile.validate.speed import paired_ratio

    fp32 = engine_runtime(ctx, stage, "fp32_engine")
    threads = ctx.params["threads"]
    by_state = ctx.params.get("machine_state", False)
    r = paired_ratio(lambda: workload(fp32), lambda: workload(engine), pairs=ctx.params.get("pairs", 5),
                     warmup=ctx.params.get("warmup", 1), min_seconds=ctx.params.get("min_seconds", 0.0),
                     probe=(lambda: probe(threads)) if by_state else None)
    out: dict[str, Any] = {"fp32_engine_ms": 1000 * r.reference_s, "engine_ms": 1000 * r.candidate_s,
                           "speedup_vs_fp32": r.ratio, "speedup_spread": r.spread, "speed_pairs": r.pairs}
    if by_state:
        out["speedup_vs_fp32_by_state"] = ratio_by_state(r)
    return out
