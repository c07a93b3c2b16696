"""What each step asks Ray for (cosycompile/executors/ray/build.py): its CPUs from its threads, its GPU
kind, and the memory its kind peaked at in the driver's cache, capped at what a node that can run it
offers. Real steps of a planned recipe, a real cache, the nodes as ``ray.nodes()`` describes them; no
cluster is needed to decide a request."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosycompile.cache.local import Store
from cosycompile.executors.ray.build import (MEMORY_MARGIN, describe_request, recorded_peaks, step_threads,
                                             task_options)
from cosycompile.executors.ray.cluster import Node
from helpers import REPO

GB = 2**30


@pytest.fixture(scope="module")
def steps() -> dict:
    """cpu-int8's steps by name, and rtx4090-fp16's flow engine (a step that needs an sm89 GPU)."""
    from cosycompile.core.graph import topo_order
    from cosycompile.plan import plan_build
    from cosycompile.recipe.schema import load_recipe

    def named(recipe: str) -> dict:
        return {s.name: s for s in topo_order(plan_build(load_recipe(REPO / "recipes" / recipe)).steps)}

    cpu, gpu = named("cpu-int8.yaml"), named("rtx4090-fp16.yaml")
    return {**cpu, "gpu.flow.engine": gpu["flow.engine"]}


def _commit(store: Store, tmp: Path, key: str, step: str, kind: str, peak: float | None) -> None:
    stage = tmp / f"stage-{key}"
    (stage / "data").mkdir(parents=True)
    store.commit(key, stage, {"step": step, "components": {"kind": kind}, "seconds": 1.0, "peak_rss_mb": peak})


def test_the_cache_gives_each_kind_its_largest_recorded_peak(tmp_path: Path) -> None:
    store = Store(tmp_path / "art")
    _commit(store, tmp_path, "a" * 64, "reference", "reference", 900.0)
    _commit(store, tmp_path, "b" * 64, "reference", "reference", 1500.0)
    _commit(store, tmp_path, "c" * 64, "llm.export", "llm.export.onnx", None)  # a peak nobody measured
    (store.objects / "dd" / ("d" * 64)).mkdir(parents=True)
    (store.objects / "dd" / ("d" * 64) / "entry.json").write_text("{not json")  # corrupt: passed over
    assert recorded_peaks(store) == {("reference", "reference"): 1500.0}


def test_cpu_steps_ask_for_their_threads_and_their_recorded_memory(steps: dict) -> None:
    ref, export = steps["reference"], steps["llm.export"]
    threads = step_threads(ref)
    assert threads == ref.params["threads"] >= 2 and step_threads(steps["pipeline.check"]) == threads
    assert step_threads(export) == 1
    nodes = [Node("cpu", "127.0.0.1", {"CPU": 8.0, "memory": 20.0 * GB}),
             Node("gpu", "127.0.0.1", {"CPU": 0.0, "sm89": 1.0, "memory": 60.0 * GB})]
    peaks = {("reference", ref.kind): 2000.0}
    assert task_options(ref, peaks, nodes) == {"num_cpus": threads, "resources": {},
                                               "memory": int(2000.0 * MEMORY_MARGIN * 2**20)}
    # No peak recorded for the export's kind, nor for any llm.export: no memory request, one CPU.
    assert task_options(export, peaks, nodes) == {"num_cpus": 1, "resources": {}}
    assert describe_request(task_options(ref, peaks, nodes)) == f"CPU x{threads}, 2.4 GB"
    assert describe_request(task_options(export, peaks, nodes)) == "CPU x1"


def test_requests_are_capped_at_the_largest_node_that_can_run_the_step(steps: dict) -> None:
    ref, engine = steps["reference"], steps["gpu.flow.engine"]
    assert engine.hardware == "sm89"
    nodes = [Node("small-cpu", "127.0.0.1", {"CPU": 1.0, "memory": 4.0 * GB}),
             Node("gpu", "127.0.0.1", {"CPU": 0.0, "sm89": 1.0, "memory": 60.0 * GB})]
    huge = {("reference", ref.kind): 100_000.0, ("flow.engine", engine.kind): 100_000.0}
    # The CPU step: one CPU (the only CPU node has one), the CPU node's memory, not the GPU node's.
    assert task_options(ref, huge, nodes) == {"num_cpus": 1, "resources": {}, "memory": int(4.0 * GB)}
    # The GPU step: counted in its GPU kind, capped at the GPU node's memory.
    assert task_options(engine, huge, nodes) == {"num_cpus": 0, "resources": {"sm89": 1}, "memory": int(60.0 * GB)}
    assert describe_request(task_options(engine, huge, nodes)) == "sm89, 60.0 GB"
    # Nodes that report no memory: nothing to cap at, and nothing asked.
    bare = [Node("cpu", "127.0.0.1", {"CPU": 2.0})]
    assert task_options(ref, huge, bare) == {"num_cpus": min(2, step_threads(ref)), "resources": {}}


def test_a_kind_never_built_asks_what_its_stage_step_needed_with_another_kind(steps: dict) -> None:
    """An ``llm.engine`` of a format this cache never built asks for the largest peak recorded by an
    ``llm.engine`` of another kind, not for nothing; a step whose name was never built asks nothing."""
    engine, export = steps["llm.engine"], steps["llm.export"]
    nodes = [Node("cpu", "127.0.0.1", {"CPU": 8.0, "memory": 20.0 * GB})]
    peaks = {("llm.engine", "another.kind"): 3000.0, ("llm.engine", "a.third.kind"): 1000.0}
    assert engine.kind not in {k for _, k in peaks}
    assert task_options(engine, peaks, nodes)["memory"] == int(3000.0 * MEMORY_MARGIN * 2**20)
    # Its own kind's record, when there is one, wins over the others'.
    own = {**peaks, ("llm.engine", engine.kind): 500.0}
    assert task_options(engine, own, nodes)["memory"] == int(500.0 * MEMORY_MARGIN * 2**20)
    assert "memory" not in task_options(export, peaks, nodes)
