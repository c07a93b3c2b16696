"""Executors as plug-ins: where a build's steps run (``cosycompile build --executor NAME[://ADDRESS]``).

``local`` runs every step in this process, in dependency order (the default); ``ray`` turns the
steps into tasks on a Ray cluster, each placed on a node that has the hardware the step needs.
Either way an executor only produces each recipe's :class:`~cosycompile.core.graph.BuildResult`;
the command exports the bundles and applies the gates.

``PLUGIN = ExecutorInfo(...)``; the folder's ``build.py`` has
``build(plans, store, reporter, *, remote, address) -> list[BuildResult]``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from cosycompile.core.plugins import discover, load_object, resolve_ref
from cosycompile.errors import UserError


@dataclass(frozen=True)
class ExecutorInfo:
    """Where the steps of a build run."""

    summary: str
    build: str = ".build:build"
    # The environment variable that names the cluster when ``--executor NAME`` gives no address
    # (the one its users already set), and the extra that installs what the executor imports.
    address_env: str = ""
    extra: str = ""
    takes_force: bool = True  # whether ``--force`` means something to it
    name: str = ""
    package: str = ""

    def hook(self, attr: str) -> Any:
        return load_object(resolve_ref(self.package, getattr(self, attr)))


def executor_infos() -> dict[str, ExecutorInfo]:
    """Every executor plug-in by name."""
    return discover("executors")


def parse_executor(value: str) -> tuple[ExecutorInfo, str | None]:
    """``--executor`` as (plug-in, address): ``local``, ``ray`` (address from ``$RAY_ADDRESS``) or
    ``ray://HOST:PORT`` (passed to the executor as written). A bad value is a one-line error."""
    text = value.strip()
    name = text.split("://", 1)[0]
    infos = executor_infos()
    if name not in infos:
        raise UserError(f"--executor {value!r}: unknown executor '{name}' (known: {', '.join(sorted(infos))})")
    info = infos[name]
    address: str | None = text if "://" in text else None
    if address is not None and not info.address_env:
        raise UserError(f"--executor {value!r}: executor '{name}' takes no address")
    if address is None and info.address_env:
        address = os.environ.get(info.address_env, "").strip() or None
        if address is None:
            raise UserError(f"--executor {name}: no cluster named: give --executor {name}://HOST:PORT "
                            f"or set ${info.address_env}")
    return info, address
