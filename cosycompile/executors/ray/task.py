"""What a Ray task runs on its node: one step of a recipe, its inputs pulled from the remote cache
and its output pushed there.

The node plans the recipe itself and checks that it computes the driver's key for the step: a
node whose cosycompile, tools (by release) or model files differ from the driver's would otherwise
store its output under a key that does not describe it. Only the step's direct inputs are
materialised here; what they were built from stays wherever it was built.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

ARTIFACTS_ENV = "COSYCOMPILE_NODE_ARTIFACTS"


class StepMismatch(RuntimeError):
    """This node plans the step differently from the driver (other code, tools or files)."""


class InputMissing(RuntimeError):
    """An input the driver saw built is in neither this node's cache nor the remote cache."""


def node_store_root(driver_artifacts: str) -> Path:
    """This node's cache folder: ``$COSYCOMPILE_NODE_ARTIFACTS`` where the node was started with it,
    else the driver's ``--artifacts`` path (the same folder when the node is the driver's machine)."""
    return Path(os.environ.get(ARTIFACTS_ENV) or driver_artifacts)


def run_step(recipe: str, step: str, key: str, remote_url: str | None, artifacts: str,
             on_target: bool = False) -> dict[str, Any]:
    """Build ``step`` of ``recipe`` on this node unless it is cached; returns where and how long, or
    why this node cannot build it (``left``). ``on_target``: the driver planned the recipe as its
    target's machine would (its checks included); a check this node cannot run is left."""
    from cosycompile.cache.local import Store
    from cosycompile.cache.remote import remote_from
    from cosycompile.core.graph import Executor, Reporter, StateFile, node_name, topo_order
    from cosycompile.plan import plan_build, run_problems
    from cosycompile.recipe.schema import load_recipe

    t0 = time.perf_counter()
    store = Store(node_store_root(artifacts))
    loaded = load_recipe(Path(recipe))
    plan = plan_build(loaded, on_target=on_target)
    steps = {s.name: s for s in topo_order(plan.steps)}
    if step not in steps:
        raise StepMismatch(f"node {node_name()}: recipe {recipe} has no step '{step}' when planned here")
    s = steps[step]
    if s.key(store) != key:
        raise StepMismatch(f"node {node_name()} computes key {s.key(store)[:12]} for {step}, the driver {key[:12]}: "
                           "this node's cosycompile, tool releases or model files differ from the driver's")
    if on_target and s.kind.endswith(".check") and (problems := run_problems(loaded)):
        # Placed here for the node's GPU kind, yet its engines do not run here (no driver, no runtime).
        return {"node": node_name(), "left": "; ".join(f"{st}: {why}" for st, why in problems.items()),
                "seconds": time.perf_counter() - t0}
    remote = remote_from(remote_url or "")
    inputs = list(dict.fromkeys(s.deps.values()))
    for d in inputs:
        dk = d.key(store)
        with store.lock(dk):
            if store.lookup(dk) is None and (remote is None or remote.pull(store, dk) is None):
                raise InputMissing(f"node {node_name()}: input {d.name} ({dk[:12]}) of {step} is in neither this "
                                   "node's cache nor the remote cache")
    ex = Executor(store, [s], StateFile(store.root / "state" / "cluster-tasks.json"), Reporter(quiet=True),
                  remote=remote)
    # Only the direct inputs (cached above) and the step: a dependency's own inputs are not needed.
    ex.steps = [*inputs, s]
    result = ex.run()
    if step in result.left:
        return {"node": node_name(), "left": result.left[step], "seconds": time.perf_counter() - t0}
    entry = result.entries[step]
    if remote is not None and not remote.has(key):
        # Cached on this node from an earlier task but not (or no longer) in the remote: the
        # driver and the other nodes only see the remote, so it must get there.
        remote.push(store, entry)
    if remote is not None and not remote.has(key):
        raise RuntimeError(f"node {node_name()}: built {step} ({key[:12]}) but could not push it to {remote.url}")
    return {"node": entry.meta.get("node") or node_name(), "ran": step in result.ran,
            "seconds": time.perf_counter() - t0, "step_seconds": entry.meta.get("seconds")}
