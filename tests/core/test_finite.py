"""No step commits NaN or Inf (issue 37, item 6): the executor checks a step's arrays before its entry exists."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from cosycompile.cache.local import Store
from cosycompile.core.finite import NonFiniteOutput
from cosycompile.core.graph import Executor, Reporter, StateFile, Step, StepContext


def _onnx(path: Path, value: np.ndarray, external: bool) -> None:
    import onnx
    from onnx import helper, numpy_helper

    init = numpy_helper.from_array(value.astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(value.shape))],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, list(value.shape))], [init])
    model = helper.make_model(graph)
    if external:
        onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data", size_threshold=0)
    else:
        onnx.save(model, str(path))


def _weights(n: int = 64) -> np.ndarray:
    return np.linspace(-1, 1, n, dtype=np.float32)


def _poisoned(value: float, at: int = 17) -> np.ndarray:
    w = _weights()
    w[at] = value
    return w


WRITERS: dict[str, tuple[Callable[[Path], None], str | None]] = {
    "npy-nan": (lambda d: np.save(d / "emb.npy", _poisoned(np.nan)), "emb.npy"),
    "npz-inf": (lambda d: np.savez(d / "ref.npz", ok=_weights(), mel=_poisoned(np.inf)), "ref.npz ('mel')"),
    "onnx-inline-nan": (lambda d: _onnx(d / "m.onnx", _poisoned(np.nan), external=False), "m.onnx ('w')"),
    "onnx-external-inf": (lambda d: _onnx(d / "m.onnx", _poisoned(-np.inf), external=True), "m.onnx ('w')"),
    "onnx-mask-fill-value": (lambda d: _onnx(d / "m.onnx", np.array([-np.inf]), external=False), None),
    "onnx-external-finite": (lambda d: _onnx(d / "m.onnx", _weights(), external=True), None),
    "npy-integers": (lambda d: np.save(d / "ids.npy", np.arange(10)), None),
}


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_step_that_writes_nan_or_inf_commits_nothing(name: str, tmp_path: Path) -> None:
    write, refused_where = WRITERS[name]

    def body(ctx: StepContext) -> dict:
        write(ctx.out)
        return {}

    store = Store(tmp_path / "art")
    ex = Executor(store, [Step("s", "test.finite", body, params={"case": name})], StateFile(tmp_path / "state.json"),
                  Reporter(quiet=True))
    if refused_where is None:
        assert ex.run().ran == ["s"]
        return
    with pytest.raises(NonFiniteOutput) as info:
        ex.run()
    assert f"step s: {refused_where} holds NaN or Inf" in str(info.value)
    assert not list(store.objects.glob("*/*/entry.json")), "a poisoned entry was committed"
    assert not [p for p in store.tmp.iterdir() if not p.name.startswith(".")], "a staging dir was left"
