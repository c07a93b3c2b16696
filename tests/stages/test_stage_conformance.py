"""Every stage plug-in keeps the registry's promises, checked over the registry: a place in the
pipeline, graphs, hooks that resolve, and specs that refuse keys they do not read."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cosycompile.stages import pipeline_stages, stage_infos

STAGES = list(stage_infos())


def test_the_pipeline_runs_text_to_wav_in_order() -> None:
    assert STAGES == list(pipeline_stages()) == ["llm", "flow", "hift"]
    orders = [stage_infos()[s].order for s in STAGES]
    assert orders == sorted(set(orders))


@pytest.mark.parametrize("name", STAGES)
def test_stage_keeps_the_registry_promises(name: str) -> None:
    info = stage_infos()[name]
    assert info.name == name and info.package == f"cosycompile.stages.{name}" and info.summary
    assert info.graphs and len({g.name for g in info.graphs}) == len(info.graphs)
    assert info.metrics
    for attr in ("export", "modules", "check", "reference"):
        assert callable(info.hook(attr)), attr
    if info.checkpoint_export is not None:
        assert callable(info.hook("checkpoint_export"))
    for spec in (info.check_spec, info.runtime_spec):
        if spec is None:
            continue
        spec.model_validate({})
        with pytest.raises(ValidationError):
            spec.model_validate({"no_such_key": 1})
