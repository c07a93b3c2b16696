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


def test_a_gpu_step_asks_for_a_gpu_where_a_node_of_its_kind_has_one(steps: dict) -> None:
    engine = steps["gpu.flow.engine"]
    fake = Node("sm89-no-gpu", "127.0.0.1", {"CPU": 0.0, "sm89": 1.0})
    real = Node("sm89-gpu", "127.0.0.1", {"CPU": 16.0, "GPU": 1.0, "sm89": 1.0})
    assert task_options(engine, {}, [fake]) == {"num_cpus": 0, "resources": {"sm89": 1}}
    assert task_options(engine, {}, [fake, real]) == {"num_cpus": 0, "resources": {"sm89": 1}, "num_gpus": 1}
    assert describe_request(task_options(engine, {}, [real])) == "sm89, GPU"


def _plans(*names: str) -> list:
    from cosycompile.plan import plan_build
    from cosycompile.recipe.schema import load_recipe

    return [plan_build(load_recipe(REPO / "recipes" / f"{n}.yaml")) for n in names]


class _Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, text: str) -> None:
        self.lines.append(text)


def test_checks_are_planned_for_gpu_nodes_only_where_the_cluster_has_one_that_runs_them(tmp_path: Path) -> None:
    from cosycompile.core.graph import topo_order
    from cosycompile.executors.ray.build import plan_checks_on_gpu_nodes

    # On this GPU-less machine every GPU recipe is planned "built, not validated".
    plans = _plans("rtx4090-fp16", "l20-int8", "cpu-int8")
    assert plans[0].not_validated and plans[1].not_validated and not plans[2].not_validated
    fake = [Node("sm89", "127.0.0.1", {"CPU": 0.0, "sm89": 1.0})]
    assert not plan_checks_on_gpu_nodes(plans, fake, _Lines())  # no node with a GPU: unchanged
    gpu = [Node("sm89", "127.0.0.1", {"CPU": 4.0, "GPU": 1.0, "sm89": 1.0})]
    said = _Lines()
    before = list(plans)
    assert plan_checks_on_gpu_nodes(plans, gpu, said)
    # rtx4090-fp16 (TensorRT everywhere) gets its checks, on sm89; l20-int8 serves its LLM with
    # TensorRT-LLM, which the checks never run: it stays unvalidated; the CPU recipe is untouched.
    assert plans[0] is not before[0] and plans[1] is before[1] and plans[2] is before[2]
    assert plans[0].on_target and not plans[0].not_validated
    store = Store(tmp_path / "keys")
    old = {s.name: s for s in topo_order(before[0].steps)}
    new = {s.name: s for s in topo_order(plans[0].steps)}
    checks = {n for n in new if n.endswith(".check")}
    assert checks == {"llm.check", "flow.check", "hift.check", "pipeline.check"}
    assert all(new[n].hardware == "sm89" for n in checks)
    assert new["pipeline.check"].kind == "pipeline.check" and old["pipeline.check"].kind == "pipeline.unvalidated"
    # The engines and everything before them keep their keys: what was built for the unvalidated plan serves.
    assert {n: s.key(store) for n, s in old.items() if n != "pipeline.check"} == \
        {n: new[n].key(store) for n in old if n != "pipeline.check"}
    assert said.lines == ["rtx4090-fp16: its checks go to the cluster's sm89 GPU nodes (this machine cannot run its "
                          "engines)"]
