"""The ``triton`` exporter: ``<artifacts>/triton/<bundle name>/``, the model repository of the build's bundle.

It sits next to ``builds/`` rather than inside the bundle (whose manifest lists every file). Like
the bundle, it is written into a temp dir and renamed into place, and it is a no-op when the
repository of this bundle is present and intact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosycompile.cache.local import Store
from cosycompile.core.graph import BuildResult
from cosycompile.exporters.triton.repository import read_repository_json, write_repository

FOLDER = "triton"


def export(plan: Any, store: Store, result: BuildResult) -> Path:
    """Write (or keep) the Triton repository of the plan's bundle; the bundle is exported first if needed."""
    from cosycompile.exporters.bundle.export import export as export_bundle

    bundle = export_bundle(plan, store, result)  # a no-op when the bundle is already there
    dest = store.root / FOLDER / bundle.name
    if _intact(dest, store):
        return dest
    with store.lock(f"triton.{bundle.name}"):  # concurrent builds: one writes, the others find it intact
        if _intact(dest, store):
            return dest
        return write_repository(bundle, dest)


def _intact(dest: Path, store: Store) -> bool:
    """Whether ``dest`` holds exactly the files its ``repository.json`` lists, with their digests."""
    info = read_repository_json(dest)
    files = info.get("files") if info else None
    if not isinstance(files, dict):
        return False
    on_disk = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()} - {"repository.json"}
    if on_disk != set(files):
        return False
    ok = all(store.stat_cache.digest(dest / rel) == digest for rel, digest in files.items())
    store.stat_cache.save()
    return ok
