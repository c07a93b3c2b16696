"""ONNX Runtime backend rewrites: fused attention and the rational Mish, on the tiny estimator's real graph."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from cosycompile.backends.onnxruntime import Options
from cosycompile.backends.onnxruntime.attention import fuse_attention
from cosycompile.backends.onnxruntime.build import OrtRunner, build
from cosycompile.backends.onnxruntime.mish import rewrite_mish
from cosycompile.families.cosyvoice2.loader import load_models
from cosycompile.onnx.tools import export_onnx, simplify
from cosycompile.core.targets import Target
from cosycompile.runtime.graphs_dir import GraphsDir

INPUTS = ["x", "mask", "mu", "t", "spks", "cond"]
T = 40


class _Streaming(torch.nn.Module):
    """The estimator with its chunk-causal attention bias, so the bias is not all zeros."""

    def __init__(self, est: torch.nn.Module) -> None:
        super().__init__()
        self.est = est

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.est(*args, streaming=True)


@pytest.fixture(scope="module")
def estimator(tiny_model_dir: Path) -> torch.nn.Module:
    est = load_models(tiny_model_dir).flow.decoder.estimator.eval()
    est.static_chunk_size = 8  # several chunks in T frames
    return _Streaming(est)


def _inputs(seed: int, valid: int = T) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.zeros((2, 1, T), np.float32)
    mask[:, :, :valid] = 1.0
    return {"x": rng.standard_normal((2, 80, T), dtype=np.float32), "mask": mask,
            "mu": rng.standard_normal((2, 80, T), dtype=np.float32), "t": np.full(2, 0.3, np.float32),
            "spks": rng.standard_normal((2, 80), dtype=np.float32),
            "cond": rng.standard_normal((2, 80, T), dtype=np.float32)}


@pytest.fixture(scope="module")
def engines(estimator: torch.nn.Module, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The estimator exported and simplified as the flow stage does, then built by the real backend
    twice: with the default rewrites and with none."""
    src = tmp_path_factory.mktemp("graphs")
    args = tuple(torch.from_numpy(v) for v in _inputs(0).values())
    exported = src / "exported.onnx"
    export_onnx(estimator, args, exported, INPUTS, ["out"], {n: {2: "T"} for n in ("x", "mask", "mu", "cond", "out")},
                opset=18)
    # onnxslim folds the head-size scale the exporter computes from shapes into a constant.
    simplify(exported, src / "est.onnx", "onnxslim")
    GraphsDir(src, "flow", {"flow_estimator": {"file": "est.onnx"}}).write()
    out = {}
    for name, opts in (("rewritten", Options()), ("plain", Options(rewrites=()))):
        out[name] = tmp_path_factory.mktemp(name)
        passport = build(src, opts, Target("cpu", "cpu"), out[name])
        (out[name] / "passport.json").write_text(json.dumps(passport))
    return out


def _ops(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in onnx.load(str(path)).graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


def _run(engine: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return OrtRunner(engine / "est.onnx", threads=2).run(feeds)["out"]


def test_build_rewrites_every_attention_and_mish(engines: dict[str, Path]) -> None:
    rewritten, plain = _ops(engines["rewritten"] / "est.onnx"), _ops(engines["plain"] / "est.onnx")
    # tiny: (1 down + 1 mid + 1 up) blocks of 1 transformer each. Mish: 2 per resnet block, the final
    # block's, and the one on the time embedding every resnet block's MLP shares after the optimizer.
    assert plain["Softmax"] == 3 and plain["Softplus"] == 8
    assert rewritten.get("MultiHeadAttention") == 3 and "Softmax" not in rewritten and "Softplus" not in rewritten
    passport = json.loads((engines["rewritten"] / "passport.json").read_text())
    assert passport["rewrites"] == {"flow_estimator": {"attention": 3, "mish": 8}}
    assert json.loads((engines["plain"] / "passport.json").read_text())["rewrites"] == {}


@pytest.mark.parametrize("valid", [T, 29])
def test_rewritten_engine_matches_torch_and_the_plain_engine(engines: dict[str, Path], estimator: torch.nn.Module,
                                                             valid: int) -> None:
    feeds = _inputs(1, valid)
    with torch.no_grad():
        ref = estimator(*(torch.from_numpy(v) for v in feeds.values())).numpy()
    fused, plain = _run(engines["rewritten"], feeds), _run(engines["plain"], feeds)
    assert float(np.abs(fused - plain).max()) < 1e-5
    assert float(np.abs(fused - ref).max()) < 1e-4
    assert float(ref.std()) > 1e-2


def test_the_fused_kernel_applies_the_bias(engines: dict[str, Path], estimator: torch.nn.Module) -> None:
    """Without the chunk-causal bias the outputs move: the match above is not a bias-free accident."""
    feeds = _inputs(2)
    model = onnx.load(str(engines["rewritten"] / "est.onnx"))
    for n in model.graph.node:
        if n.op_type == "MultiHeadAttention":
            del n.input[3:]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    unbiased = sess.run(None, feeds)[0]
    assert float(np.abs(unbiased - _run(engines["rewritten"], feeds)).max()) > 1e-3


def _attention_graph(bias_rank: int, score_is_output: bool = False) -> onnx.ModelProto:
    """A hand-written exported-SDPA chain: heads 2 x 4, scale 0.5, bias of rank ``bias_rank``."""
    init = [helper.make_tensor("split", TensorProto.INT64, [4], [1, -1, 2, 4]),
            helper.make_tensor("merge", TensorProto.INT64, [3], [1, -1, 8]),
            helper.make_tensor("axis1", TensorProto.INT64, [1], [1])]
    nodes = []
    for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("Reshape", [name, "split"], [f"{name}4"]),
                  helper.make_node("Transpose", [f"{name}4"], [f"{name}t"], perm=perm)]
    bias = "b"
    if bias_rank == 4:
        nodes.append(helper.make_node("Unsqueeze", ["b", "axis1"], ["b4"]))
        bias = "b4"
    nodes += [helper.make_node("FusedMatMul", ["qt", "kt"], ["s"], domain="com.microsoft", alpha=0.5),
              helper.make_node("Add", ["s", bias], ["sb"]),
              helper.make_node("Softmax", ["sb"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vt"], ["o4"]),
              helper.make_node("Transpose", ["o4"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "merge"], ["y"])]
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, f, [1, 6, 8]) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("b", f, [1, 6, 6]))
    outputs = [helper.make_tensor_value_info("y", f, [1, 6, 8])]
    if score_is_output:
        outputs.append(helper.make_tensor_value_info("s", f, None))
    graph = helper.make_graph(nodes, "attn", inputs, outputs, init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])


def _session(model: onnx.ModelProto) -> Any:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_hand_written_chain_fuses_exactly_and_drops_its_shapes() -> None:
    model = _attention_graph(bias_rank=4)
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal((1, 6, 8), dtype=np.float32) for n in "qkv"}
    feeds["b"] = np.where(rng.random((1, 6, 6)) < 0.3, -1e10, 0.0).astype(np.float32)
    ref = _session(model).run(None, feeds)[0]
    assert fuse_attention(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Unsqueeze", "MultiHeadAttention"]
    assert {i.name for i in model.graph.initializer} == {"axis1"}
    assert float(np.abs(_session(model).run(None, feeds)[0] - ref).max()) < 1e-6


@pytest.mark.parametrize("bias_rank, score_is_output", [(3, False), (4, True)])
def test_chains_the_kernel_cannot_take_are_left_alone(bias_rank: int, score_is_output: bool) -> None:
    model = _attention_graph(bias_rank, score_is_output)
    before = model.SerializeToString()
    assert fuse_attention(model) == 0
    assert model.SerializeToString() == before


def test_rational_mish_is_exact_over_the_float_range() -> None:
    x = np.array([-1e30, -200, -60, -20, -3, -1, -1e-6, 0, 1e-6, 0.5, 3, 19.9, 20, 20.1, 50, 1e30],
                 np.float32).reshape(1, -1)
    x = np.concatenate([x, np.random.default_rng(4).standard_normal((1, 4096), dtype=np.float32) * 6], axis=1)
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Softplus", ["x"], ["sp"]), helper.make_node("Tanh", ["sp"], ["th"]),
         helper.make_node("Mul", ["th", "x"], ["y"])], "mish",
        [helper.make_tensor_value_info("x", f, list(x.shape))], [helper.make_tensor_value_info("y", f, list(x.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert rewrite_mish(model) == 1
    assert "Softplus" not in {n.op_type for n in model.graph.node}
    y = _session(model).run(None, {"x": x})[0].astype(np.float64)
    x64 = x.astype(np.float64)
    want = x64 * np.tanh(np.logaddexp(0.0, x64))
    assert np.isfinite(y).all()
    # Below float32's smallest normal both forms flush to (signed) zero.
    assert (np.abs(y - want) <= 2e-6 * np.abs(want) + 1e-37).all()
