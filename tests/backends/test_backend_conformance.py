"""Every backend plug-in keeps the registry's promises (structure, options, targets), checked over
the registry so that a new backend folder is held to them with no edit here."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cosycompile.backends import backend_infos
from cosycompile.core.targets import TARGETS

BACKENDS = sorted(backend_infos())


def test_the_shipped_backends_are_found() -> None:
    assert {"onnxruntime", "tensorrt", "trtllm", "torch"} <= set(BACKENDS)


@pytest.mark.parametrize("name", BACKENDS)
def test_backend_keeps_the_registry_promises(name: str) -> None:
    info = backend_infos()[name]
    assert info.name == name and info.package == f"cosycompile.backends.{name}"
    assert callable(info.hook("build")) and callable(info.hook("load"))
    assert info.target_kinds and set(info.target_kinds) <= {"cpu", "gpu"}
    assert info.consumes in ("onnx", "checkpoint", "program")
    # Its options: the defaults are a valid spec, a key it does not read is refused.
    info.options.model_validate({})
    with pytest.raises(ValidationError):
        info.options.model_validate({"no_such_option": 1})
    # A target of a kind it does not build for is refused with a reason, one it does is judged by it.
    for target in TARGETS.values():
        problem = info.target_problem(target)
        if target.kind not in info.target_kinds:
            assert problem, target.name
        assert problem is None or isinstance(problem, str)
