"""Shared by the benchmarks: a built-in model materialised once through the build's own cached
``model`` step, then loaded like any checkpoint dir; and the cached steps of a derived recipe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# The calibration of the benchmarks' builds (4 short items: the 0.5B LLM's calibration is the slow
# part of a build); one value, so a script that reuses another's engines finds them cached.
BENCH_CALIBRATION: dict[str, Any] = {"max_items": 4, "sampling": {"mode": "greedy", "seed": 0, "max_tokens": 60}}


def machine() -> str:
    """The machine line every benchmark's JSON carries: CPU model, family/model, vCPUs, ISA, Python."""
    import platform
    import sys

    sys.path.insert(0, str(REPO))
    from cosycompile.runtime.host import describe_host, host_line

    return f"{host_line(describe_host())}, Python {platform.python_version()}"


def write_result(artifacts: Path, name: str, out: dict[str, Any]) -> Path:
    """``out`` as ``<artifacts>/bench/<name>.json`` (the folder made if missing); returns the path."""
    dest = Path(artifacts) / "bench" / f"{name}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1, default=float))
    return dest


def add_min_seconds(ap: Any, default: float = 30.0) -> None:
    """The ``--min-seconds`` option of every script that times a ratio: pairs go on past ``--pairs``
    until that long has passed, since a slow spell of a shared machine moves a median of a few pairs
    (docs/bench-log/2026-11-24-ratios-run-twice.md)."""
    ap.add_argument("--min-seconds", type=float, default=default,
                    help="time each ratio's pairs for at least this long (0: just the set number of pairs)")


def load_builtin(model: str, stages: tuple[str, ...], artifacts: Path, threads: int, name: str) -> Any:
    """The reference networks of ``stages`` of ``model`` (e.g. ``builtin:random-0.5b``), read from the
    cache entry of the model step of a throwaway recipe called ``name`` under ``artifacts/bench``."""
    import yaml

    from cosycompile.cache.local import Store
    from cosycompile.core.graph import Executor, Reporter, StateFile
    from cosycompile.plan import plan_build
    from cosycompile.recipe.schema import load_recipe
    from cosycompile.reference.runners import load_reference

    path = artifacts / "bench" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"extends": str(REPO / "recipes" / "cpu-fp32.yaml"), "name": name, "model": model}))
    plan = plan_build(load_recipe(path))
    model_step = plan.stage_steps[stages[0]]["export"].deps["model"]
    store = Store(artifacts)
    result = Executor(store, [model_step], StateFile(store.root / "state" / f"{name}.json"), Reporter()).run()
    return load_reference(result.entries["model"].data, stages, threads)


def build_steps(recipe_body: dict[str, Any], name: str, steps: list[str], artifacts: Path) -> dict[str, Path]:
    """Output dirs of ``steps`` (e.g. ``flow.engine``, ``model``) of the recipe ``recipe_body`` called
    ``name``, written under ``artifacts/bench`` and run through the normal cached build graph."""
    import yaml

    from cosycompile.cache.local import Store
    from cosycompile.core.graph import Executor, Reporter, StateFile
    from cosycompile.plan import plan_build
    from cosycompile.recipe.schema import load_recipe

    path = artifacts / "bench" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({**recipe_body, "name": name}))
    plan = plan_build(load_recipe(path))
    by_name = {s.name: s for stage in plan.stage_steps.values() for s in stage.values()}
    model_step = next(iter(by_name.values())).deps.get("model")
    if model_step is not None:
        by_name["model"] = model_step
    store = Store(artifacts)
    result = Executor(store, [by_name[s] for s in steps], StateFile(store.root / "state" / f"{name}.json"),
                      Reporter()).run()
    return {s: result.entries[s].data for s in steps}


def rewrite_variants(recipe: Path, model: str, artifacts: Path, stage: str, variants: dict[str, list[str]],
                     tag: str) -> dict[str, Path]:
    """``recipe``'s ``stage`` engine built once for each set of the ONNX Runtime backend's rewrites in
    ``variants`` (the other stages are not built), by variant name."""
    others = {s: {"enabled": False} for s in ("llm", "flow", "hift") if s != stage}
    out = {}
    for name, rewrites in variants.items():
        body = {"extends": str(recipe.resolve()), "model": model,
                "stages": {**others, stage: {"engine": {"backend": "onnxruntime", "options": {"rewrites": rewrites}}}}}
        out[name] = build_steps(body, f"bench-{tag}-{recipe.stem}-{name}", [f"{stage}.engine"],
                                artifacts)[f"{stage}.engine"]
    return out


def estimator_inputs(rng: Any, frames: int) -> dict[str, Any]:
    """One flow-estimator call's inputs at ``frames`` frames, batch 2 (CFG), drawn from ``rng``: x, an
    all-ones mask, mu, t = 0.5, spks, cond, keyed by the graph spec's input names."""
    import numpy as np

    from cosycompile.stages.flow import FLOW_ESTIMATOR

    T = frames
    arrays = (rng.standard_normal((2, 80, T), dtype=np.float32), np.ones((2, 1, T), np.float32),
              rng.standard_normal((2, 80, T), dtype=np.float32), np.full(2, 0.5, np.float32),
              rng.standard_normal((2, 80), dtype=np.float32), rng.standard_normal((2, 80, T), dtype=np.float32))
    return dict(zip(FLOW_ESTIMATOR.input_names, arrays))


def flow_engine(recipe: Path, model: str, artifacts: Path) -> Path:
    """The flow engine dir of ``recipe`` on ``model`` (LLM and HiFT off), through the cached build graph."""
    body = {"extends": str(recipe.resolve()), "model": model,
            "stages": {"llm": {"enabled": False}, "hift": {"enabled": False}}}
    return build_steps(body, f"bench-flow-profile-{recipe.stem}", ["flow.engine"], artifacts)["flow.engine"]


def native_bf16(torch: Any) -> bool:
    """Whether oneDNN runs BF16 matmuls natively on this CPU (AVX-512 BF16 or AMX), not emulated."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else False


def machine_probes(torch: Any, threads: int, a: Any) -> dict[str, float]:
    """``cosycompile.validate.machine_state.probe`` (copy throughput of a 256 MiB buffer, the small
    op on one thread and on ``threads``, ``threads_lose``) plus a fixed FP32 matmul on one thread
    and on ``threads``, each the best of three (a core's speed, and whether the threads get cores of
    their own; ``a``: a 1024 x 1024 FP32 tensor, made once by the caller), and, on a CPU with native
    BF16 (:func:`native_bf16`), the same matmul in BF16 on one thread (the AVX-512 BF16 path, whose
    speed moved between runs while FP32 held). Without it BF16 is emulated, some 40 times slower than
    FP32: a probe of that would take tens of seconds and say nothing about the machine's state."""
    from cosycompile.validate.machine_state import best_of, probe

    def best_of_3(n: int, x: Any = a) -> float:
        torch.set_num_threads(n)
        return best_of(lambda: [torch.mm(x, x) for _ in range(4)])

    was = torch.get_num_threads()
    try:
        out = {"matmul_1_thread_ms": 1000 * best_of_3(1), f"matmul_{threads}_threads_ms": 1000 * best_of_3(threads)}
        if native_bf16(torch):
            out["matmul_bf16_1_thread_ms"] = 1000 * best_of_3(1, a.to(torch.bfloat16))
    finally:
        torch.set_num_threads(was)
    return {**probe(threads, copy_mib=256), **out}
