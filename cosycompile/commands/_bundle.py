"""What the bundle commands share: reading a bundle's manifest and checking its file list."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath
from typing import Any

from cosycompile.errors import UserError

MANIFEST = "manifest.json"  # same name as cosycompile.exporters.bundle.export.MANIFEST (not imported: build side)


def read_manifest(path: Path) -> dict[str, Any]:
    """A bundle manifest with a ``files`` mapping of relative path -> sha256; one-line UserError otherwise."""
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: missing (not a bundle: give a builds/<name>-<key12>/ folder)") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable bundle manifest ({exc.__class__.__name__}: {exc})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise UserError(f"{path}: has no 'files' list of digests (a bundle from an older cosycompile: "
                        f"rebuild it with: cosycompile build <recipe>)")
    return manifest


def safe_relpath(name: str) -> str | None:
    """``name`` as a clean relative POSIX path, or None if it is absolute or climbs out with ``..``.

    ``.`` components and a leading ``./`` are dropped; an empty result is returned as ``""``.
    Backslashes are refused too: they are separators on Windows, so a name with one means different
    paths on different machines.
    """
    if name.startswith("/") or "\\" in name or "\x00" in name:
        return None
    parts = [p for p in PurePosixPath(name).parts if p != "."]
    if any(p == ".." for p in parts):
        return None
    return "/".join(parts)


def sha256_stream(read: Any, sink: Any = None, chunk: int = 1 << 20) -> str:
    """sha256 of everything ``read(chunk)`` returns, writing each chunk to ``sink`` when given."""
    h = hashlib.sha256()
    while data := read(chunk):
        h.update(data)
        if sink is not None:
            sink(data)
    return h.hexdigest()
