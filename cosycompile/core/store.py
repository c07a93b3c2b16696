"""What the build graph needs of a store of step outputs: :class:`Entry` and the
:class:`ArtifactStore` interface. ``cache/local.py`` implements it; the graph names no store."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cosycompile.core.hashing import StatCache


@dataclass
class Entry:
    """A verified cache entry."""

    key: str
    path: Path
    meta: dict[str, Any]

    @property
    def data(self) -> Path:
        return self.path / "data"


class ArtifactStore(Protocol):
    """A content-addressed store the executor plans and runs against."""

    cache_dir: Path
    stat_cache: StatCache

    def ensure_writable(self) -> None:
        """Raise a one-line error if nothing can be written (checked before any step runs)."""

    def lookup(self, key: str, verify: bool = True) -> Entry | None:
        """The entry for ``key`` if present (and intact, with ``verify``), else None."""

    def lock(self, key: str) -> AbstractContextManager[None]:
        """Held while ``key`` is being built, across processes."""

    def staging(self, key: str) -> AbstractContextManager[Path]:
        """A fresh folder for a step's output, removed on exit unless committed."""

    def space_errors(self, step: str) -> AbstractContextManager[None]:
        """Turns a full disk during ``step`` into a one-line error."""

    def commit(self, key: str, stage: Path, meta: dict[str, Any]) -> Entry:
        """Moves a complete staging folder into the store as ``key``'s entry."""
