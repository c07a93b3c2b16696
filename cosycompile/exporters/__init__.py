"""Exporters as plug-ins: each sub-folder turns a finished build into something deployable
(recipe ``exports: [...]``). The bundle is the first; every recipe writes one by default.

``PLUGIN = ExporterInfo(...)``; the folder's ``export.py`` has ``export(plan, store, result) -> Path``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cosycompile.core.plugins import discover, load_object, resolve_ref


@dataclass(frozen=True)
class ExporterInfo:
    """A deployable output of a build."""

    summary: str
    export: str = ".export:export"
    name: str = ""
    package: str = ""

    def hook(self, attr: str) -> Any:
        return load_object(resolve_ref(self.package, getattr(self, attr)))


def exporter_infos() -> dict[str, ExporterInfo]:
    """Every exporter plug-in by name."""
    return discover("exporters")
