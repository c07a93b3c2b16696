"""Whether engine threads spin while idle is a per-process choice that ONNX Runtime sessions take when
they are created: the default spins (a build's timed runs), a server's models turn it off."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from cosycompile.runtime import idle_wait

SPIN_KEY = "session.intra_op.allow_spinning"


@pytest.fixture
def restored() -> Iterator[None]:
    """The process-wide setting as it was before the test."""
    was = idle_wait.spinning()
    try:
        yield
    finally:
        idle_wait.set_spinning(was)


def _graph(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def _allows_spinning(session_options) -> bool:
    try:
        return session_options.get_session_config_entry(SPIN_KEY) != "0"
    except RuntimeError:  # never set: ONNX Runtime's default, which spins
        return True


def test_sessions_created_after_the_switch_sleep_and_earlier_ones_keep_spinning(tmp_path: Path, restored: None) -> None:
    from cosycompile.backends.onnxruntime.build import OrtRunner

    path = _graph(tmp_path / "relu.onnx")
    idle_wait.set_spinning(True)
    before = OrtRunner(path, 2)
    idle_wait.set_spinning(False)
    after = OrtRunner(path, 2)
    assert _allows_spinning(before.session.get_session_options())
    assert not _allows_spinning(after.session.get_session_options())
    x = np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32)
    assert np.array_equal(after.run({"x": x})["y"], before.run({"x": x})["y"])  # the same results either way
    idle_wait.set_spinning(True)
    assert _allows_spinning(OrtRunner(path, 2).session.get_session_options())
