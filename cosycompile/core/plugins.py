"""Discovery of plug-ins: every extension point is a folder named by the value a recipe writes.

A kind of plug-in (``stages``, ``backends``, ``quantize``, ``exporters``, ``families``) is a package of this
project; each sub-package of it is one plug-in whose light ``__init__.py`` defines ``PLUGIN``, an
info object of that kind. Third-party packages add plug-ins through the entry-point group
``cosycompile.<kind>`` whose object is such a module or info object. The plug-in's name is its
folder's (or entry point's) name, so a renamed copy of a folder is a new plug-in with no edit.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from functools import lru_cache
from importlib import metadata
from types import ModuleType
from typing import Any

KINDS = ("stages", "backends", "quantize", "exporters", "families", "executors")


class PluginError(RuntimeError):
    """A plug-in folder or entry point that does not define a usable ``PLUGIN``."""


def _info(obj: Any, name: str, origin: str) -> Any:
    info = getattr(obj, "PLUGIN", obj) if isinstance(obj, ModuleType) else obj
    if not dataclasses.is_dataclass(info):
        raise PluginError(f"{origin}: defines no PLUGIN info object")
    package = obj.__name__ if isinstance(obj, ModuleType) else type(obj).__module__
    return dataclasses.replace(info, name=name, package=package)


@lru_cache(maxsize=None)
def discover(kind: str) -> dict[str, Any]:
    """Every plug-in of ``kind``, by name: the package's sub-folders, then entry points."""
    if kind not in KINDS:
        raise KeyError(kind)
    pkg = importlib.import_module(f"cosycompile.{kind}")
    found: dict[str, Any] = {}
    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if not mod.ispkg or mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"{pkg.__name__}.{mod.name}")
        found[mod.name] = _info(module, mod.name, module.__name__)
    for ep in _entry_points().select(group=f"cosycompile.{kind}"):
        if ep.name in found:
            raise PluginError(f"entry point {ep.value} ({ep.group}) reuses the name '{ep.name}' of a built-in plug-in")
        found[ep.name] = _info(ep.load(), ep.name, ep.value)
    return found


@lru_cache(maxsize=1)
def _entry_points() -> metadata.EntryPoints:
    # One scan of the installed distributions for every kind: each scan reads every dist-info, and a
    # no-op build discovers several kinds.
    return metadata.entry_points()


def load_object(ref: str) -> Any:
    """``"package.module:attr"`` -> the attribute (imports the module: heavy imports happen here)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def resolve_ref(package: str, ref: str) -> str:
    """A plug-in's ``".module:attr"`` made absolute against its own package (so a copied folder works)."""
    return package + ref if ref.startswith(".") else ref
