"""Every exporter plug-in keeps the registry's promises, checked over the registry."""

from __future__ import annotations

import inspect

import pytest

from cosycompile.exporters import exporter_infos
from cosycompile.recipe.schema import Recipe

EXPORTERS = sorted(exporter_infos())


def test_the_default_export_is_an_exporter() -> None:
    assert set(Recipe.model_fields["exports"].default_factory()) <= set(EXPORTERS)


@pytest.mark.parametrize("name", EXPORTERS)
def test_exporter_keeps_the_registry_promises(name: str) -> None:
    info = exporter_infos()[name]
    assert info.name == name and info.package == f"cosycompile.exporters.{name}" and info.summary
    export = info.hook("export")
    assert list(inspect.signature(export).parameters)[:3] == ["plan", "store", "result"]
