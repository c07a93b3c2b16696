"""The ``snake`` rewrite of the ONNX Runtime backend: each form an optimized HiFT graph holds becomes one
``cosycompile.Snake`` node with the graph's own constants, lookalikes stay, the output does not move;
and a built HiFT engine carries the operator library and runs from wherever its dir is moved."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from cosycompile.backends.onnxruntime.build import load
from cosycompile.backends.onnxruntime.snake import rewrite_snake
from cosycompile.runtime import ort_ops

C, T = 6, 257


def _graph() -> onnx.ModelProto:
    """Three Snake chains in the forms HiFT's optimized graph has (alpha folded away; alpha and scale
    per channel; the Muls' and the Add's operands the other way round, scale one value) and three
    lookalikes: a cube, an Add of another tensor, an alpha per time step."""
    rng = np.random.default_rng(1)
    alpha = rng.uniform(0.2, 3.0, (1, C, 1)).astype(np.float32)
    alpha[0, 2, 0] = -1.5e-5
    inits = {"alpha": alpha, "scale": (1.0 / (alpha + 1e-9)).astype(np.float32),
             "alpha_t": rng.uniform(0.5, 2.0, (1, 1, T)).astype(np.float32), "two": np.array(2.0, np.float32),
             "three": np.array(3.0, np.float32), "half": np.array(0.5, np.float32)}
    nodes = [helper.make_node("Mul", ["X", f"k{i}"], [f"x{i}"]) for i in range(6)]
    inits |= {f"k{i}": np.array(1.0 + 0.1 * i, np.float32) for i in range(6)}

    def chain(i: int, pre: list[str] | None, exponent: str, post: list[str] | None, add: list[str]) -> None:
        x, p = f"x{i}", f"c{i}"
        nodes.append(helper.make_node("Mul", pre, [f"{p}_ax"]) if pre else helper.make_node("Identity", [x], [f"{p}_ax"]))
        nodes.append(helper.make_node("Sin", [f"{p}_ax"], [f"{p}_sin"]))
        nodes.append(helper.make_node("Pow", [f"{p}_sin", exponent], [f"{p}_sq"]))
        last = f"{p}_sq"
        if post:
            nodes.append(helper.make_node("Mul", [w.replace("@", last) for w in post], [f"{p}_scaled"]))
            last = f"{p}_scaled"
        nodes.append(helper.make_node("Add", [w.replace("@", last) for w in add], [f"y{i}"]))

    chain(0, None, "two", None, ["x0", "@"])
    chain(1, ["x1", "alpha"], "two", ["@", "scale"], ["x1", "@"])
    chain(2, ["alpha", "x2"], "two", ["half", "@"], ["@", "x2"])
    chain(3, ["x3", "alpha"], "three", ["@", "scale"], ["x3", "@"])
    chain(4, None, "two", None, ["x0", "@"])
    chain(5, ["x5", "alpha_t"], "two", None, ["x5", "@"])
    graph = helper.make_graph(nodes, "snakes", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, C, T])],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, C, T]) for i in range(6)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    # The optimizer removes the Identity that stands in for a folded alpha; so does this.
    return _drop_identities(model)


def _drop_identities(model: onnx.ModelProto) -> onnx.ModelProto:
    rename = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Identity"}
    kept = [n for n in model.graph.node if n.op_type != "Identity"]
    for n in kept:
        for k, name in enumerate(n.input):
            n.input[k] = rename.get(name, name)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return model


def _run(model: onnx.ModelProto, x: np.ndarray, library: Path | None = None) -> list[np.ndarray]:
    so = ort_ops.register(ort.SessionOptions(), library)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"X": x})


def test_rewrite_replaces_each_snake_form_and_leaves_lookalikes(tmp_path: Path) -> None:
    model = _graph()
    x = (np.random.default_rng(0).standard_normal((1, C, T)) * 4).astype(np.float32)
    want = _run(model, x)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert rewrite_snake(rewritten) == 3
    ops = [(n.op_type, n.domain) for n in rewritten.graph.node]
    assert ops.count(("Snake", ort_ops.DOMAIN)) == 3 and ops.count(("Sin", "")) == 3
    onnx.checker.check_model(rewritten)
    assert rewrite_snake(rewritten) == 0  # nothing left to match
    got = _run(rewritten, x, ort_ops.build_library(tmp_path))
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.abs(g - w).max() <= 2e-6 * np.abs(w).max(), i
    # The lookalikes are the very same nodes, so their outputs are bit-identical.
    for i in (3, 4, 5):
        assert np.array_equal(got[i], want[i]), i


def test_a_half_precision_graph_keeps_its_chains() -> None:
    """The operator computes in float32; a graph with FP16 weights may carry its Snakes in FP16."""
    model = _graph()
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(4, np.float16), "fp16_weight"))
    before = model.SerializeToString()
    assert rewrite_snake(model) == 0
    assert model.SerializeToString() == before


def test_a_graph_without_snakes_is_left_alone() -> None:
    model = _graph()
    del model.graph.node[:]
    model.graph.node.extend([helper.make_node("Sin", ["X"], ["s"]), helper.make_node("Add", ["X", "s"], ["y0"])])
    before = model.SerializeToString()
    assert rewrite_snake(model) == 0
    assert model.SerializeToString() == before


def test_built_hift_engine_carries_the_library_and_runs_moved(seed: Path, tmp_path: Path) -> None:
    """The session seed's tiny cpu-fp32 HiFT engine, built by the real backend with the default rewrites,
    copied to a folder of its own: the copy finds its library and gives the original's output."""
    (bundle,) = (seed / "builds").glob("followup-*")
    engine = bundle / "engines" / "hift"
    passport = json.loads((engine / "engine.json").read_text())
    assert passport["rewrites"]["hift"]["snake"] > 0
    assert ort_ops.library_in(engine) is not None
    moved = Path(shutil.copytree(engine, tmp_path / "elsewhere" / "hift"))
    frames, info = 12, json.loads((engine / "graphs.json").read_text())["info"]
    rng = np.random.default_rng(0)
    feeds = {"mel": rng.standard_normal((1, 80, frames)).astype(np.float32),
             "rand_ini": rng.uniform(-0.5, 0.5, (1, 9)).astype(np.float32),
             "noise": (0.003 * rng.standard_normal((1, frames * info["samples_per_frame"], 9))).astype(np.float32)}
    here, there = load(engine, 1)["hift"].run(feeds), load(moved, 1)["hift"].run(feeds)
    assert set(here) == {"magnitude", "phase"}
    for k in here:
        assert np.array_equal(here[k], there[k]), k
