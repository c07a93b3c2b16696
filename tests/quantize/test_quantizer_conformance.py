"""Every quantizer plug-in keeps the registry's promises, checked over the registry: each of its
formats makes a valid spec, a key it does not read and a format it does not write are refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cosycompile.backends import backend_infos
from cosycompile.quantize import quantizer_infos
from cosycompile.stages import stage_infos

QUANTIZERS = sorted(quantizer_infos())


def test_the_shipped_quantizers_are_found() -> None:
    assert {"modelopt_torch", "modelopt_onnx", "ort_dynamic", "torch_dynamic"} <= set(QUANTIZERS)


@pytest.mark.parametrize("name", QUANTIZERS)
def test_quantizer_keeps_the_registry_promises(name: str) -> None:
    info = quantizer_infos()[name]
    assert info.name == name and info.package == f"cosycompile.quantize.{name}"
    assert callable(info.hook("quantize"))
    assert info.formats and set(info.weight_only) <= set(info.formats)
    assert info.stages is None or set(info.stages) <= set(stage_infos())
    assert info.backends is None or set(info.backends) <= set(backend_infos())
    for fmt in info.formats:
        spec = info.spec.model_validate({"format": fmt})
        assert spec.format == fmt
        with pytest.raises(ValidationError):
            info.spec.model_validate({"format": fmt, "no_such_key": 1})
    with pytest.raises(ValidationError):
        info.spec.model_validate({"format": "no_such_format"})
