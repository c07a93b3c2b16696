"""cosycompile/onnx/tools.py: the piecewise model writer and simplification with the weights set aside."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from cosycompile.onnx.tools import _ASIDE_BYTES, load_structure, save_model, simplify

D = 160  # a D x D FP32 weight is over the set-aside size; a D vector is under it


def _model(dead_branch: bool = False) -> onnx.ModelProto:
    """x [1, D] -> MatMul(w1) -> Mul(ones) -> Add(zeros) -> MatMul(w2) -> y: the Mul and the Add are what
    onnxslim removes, the matrices what it must not copy. ``dead_branch`` adds a MatMul on w3 read by
    nothing."""
    rng = np.random.default_rng(0)
    weights = {n: rng.standard_normal((D, D)).astype(np.float32) for n in ("w1", "w2", "w3")}
    inits = [numpy_helper.from_array(weights["w1"], "w1"), numpy_helper.from_array(weights["w2"], "w2"),
             numpy_helper.from_array(np.ones(D, np.float32), "ones"),
             numpy_helper.from_array(np.zeros(D, np.float32), "zeros")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
             helper.make_node("Mul", ["a", "ones"], ["b"], name="mul"),
             helper.make_node("Add", ["b", "zeros"], ["c"], name="add"),
             helper.make_node("MatMul", ["c", "w2"], ["y"], name="mm2")]
    if dead_branch:
        inits.append(numpy_helper.from_array(weights["w3"], "w3"))
        nodes.append(helper.make_node("MatMul", ["c", "w3"], ["unused"], name="mm3"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, D])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _initializers(model: onnx.ModelProto) -> dict[str, bytes]:
    return {t.name: t.SerializeToString() for t in model.graph.initializer}


def test_piecewise_file_loads_as_the_same_model(tmp_path: Path) -> None:
    model = _model()
    extra = numpy_helper.from_array(np.full((3,), 7.0, np.float32), "extra")
    save_model(model, tmp_path / "m.onnx", [extra])
    back = onnx.load(str(tmp_path / "m.onnx"))
    assert [n.SerializeToString() for n in back.graph.node] == [n.SerializeToString() for n in model.graph.node]
    assert _initializers(back) == _initializers(model) | {"extra": extra.SerializeToString()}
    assert back.opset_import == model.opset_import and back.ir_version == model.ir_version
    assert back.graph.input == model.graph.input and back.graph.output == model.graph.output
    # Without extra tensors the pieces parse to exactly what onnx.save writes.
    save_model(model, tmp_path / "same.onnx")
    onnx.save(model, str(tmp_path / "ref.onnx"))
    assert onnx.load(str(tmp_path / "same.onnx")) == onnx.load(str(tmp_path / "ref.onnx"))
    x = np.random.default_rng(1).standard_normal((1, D)).astype(np.float32)
    np.testing.assert_array_equal(_run(tmp_path / "same.onnx", x), _run(tmp_path / "ref.onnx", x))


def test_simplify_with_weights_aside_writes_what_it_would_with_them_in(tmp_path: Path) -> None:
    assert D * D * 4 >= _ASIDE_BYTES > D * 4
    onnx.save(_model(), str(tmp_path / "src.onnx"))
    aside = simplify(tmp_path / "src.onnx", tmp_path / "aside.onnx", "onnxslim")
    inline = simplify(tmp_path / "src.onnx", tmp_path / "inline.onnx", "onnxslim", aside_bytes=1 << 40)
    assert aside == inline and aside["nodes_after"] < aside["nodes_before"]
    a, b = onnx.load(str(tmp_path / "aside.onnx")), onnx.load(str(tmp_path / "inline.onnx"))
    assert [(n.op_type, list(n.input)) for n in a.graph.node] == [(n.op_type, list(n.input)) for n in b.graph.node]
    assert _initializers(a) == _initializers(b)
    assert [i.name for i in a.graph.input] == ["x"]  # no stand-in input left behind
    x = np.random.default_rng(2).standard_normal((1, D)).astype(np.float32)
    np.testing.assert_allclose(_run(tmp_path / "aside.onnx", x), _run(tmp_path / "src.onnx", x), rtol=1e-6, atol=1e-5)


def test_a_weight_the_simplifier_left_unread_is_not_written(tmp_path: Path) -> None:
    onnx.save(_model(dead_branch=True), str(tmp_path / "src.onnx"))
    simplify(tmp_path / "src.onnx", tmp_path / "out.onnx", "onnxslim")
    out = onnx.load(str(tmp_path / "out.onnx"))
    assert "w3" not in _initializers(out) and {"w1", "w2"} <= set(_initializers(out))
    onnx.checker.check_model(out)


def _without_weights(model: onnx.ModelProto) -> bytes:
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.graph.initializer[:]
    return bare.SerializeToString()


def test_structure_is_the_model_without_its_initializers(tmp_path: Path) -> None:
    """Whether the file was written whole (onnx.save) or a piece at a time (save_model)."""
    model = _model(dead_branch=True)
    whole, pieces = tmp_path / "whole.onnx", tmp_path / "pieces.onnx"
    onnx.save(model, str(whole))
    save_model(model, pieces)
    for path in (whole, pieces):
        got = load_structure(path)
        assert not got.graph.initializer and [n.name for n in got.graph.node] == ["mm1", "mul", "add", "mm2", "mm3"]
        assert got.SerializeToString() == _without_weights(onnx.load(str(path)))


def test_structure_of_a_large_model_does_not_read_its_weights(tmp_path: Path) -> None:
    """A model of 144 MB of weights: reading its structure in a fresh process grows the RSS by far less
    than one copy of them (onnx.load grows it by more than one)."""
    import subprocess
    import sys

    n = 6_000
    w = np.ones((n, n), np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              [numpy_helper.from_array(w, "w")])
    path = tmp_path / "big.onnx"
    save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    # VmHWM, not ru_maxrss: a child's ru_maxrss starts at its forking parent's (pytest's) peak.
    probe = ("import sys, onnx\n"
             "from cosycompile.onnx.tools import load_structure\n"
             "hwm = lambda: int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]) // 1024\n"
             "before = hwm()\n"
             "m = load_structure(sys.argv[2]) if sys.argv[1] == 'structure' else onnx.load(sys.argv[2])\n"
             "assert [n.op_type for n in m.graph.node] == ['MatMul']\n"
             "print(hwm() - before)\n")
    grew = {how: int(subprocess.run([sys.executable, "-c", probe, how, str(path)], capture_output=True, text=True,
                                    check=True).stdout) for how in ("structure", "load")}
    assert grew["structure"] < 20 and grew["load"] > w.nbytes >> 20, grew


def test_a_truncated_or_empty_file(tmp_path: Path) -> None:
    import pytest

    path = tmp_path / "m.onnx"
    save_model(_model(), path)
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(ValueError, match="not an ONNX model"):
        load_structure(cut)
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert load_structure(tmp_path / "empty.onnx") == onnx.ModelProto()
