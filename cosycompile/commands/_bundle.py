"""What the bundle commands share: reading a bundle's manifest and checking its file list."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath
from typing import Any

from cosycompile.errors import UserError

MANIFEST = "manifest.json"  # same name as cosycompile.exporters.bundle.export.MANIFEST (not imported: build side)
MAX_MANIFEST_BYTES = 16 << 20  # a manifest lists a few hundred files: kB


def read_manifest(path: Path) -> dict[str, Any]:
    """A bundle manifest with a ``files`` mapping of relative path -> sha256 (and, from bundles written
    since sizes were listed, ``sizes``: the same paths -> bytes); one-line UserError otherwise. Read
    as a regular file of at most :data:`MAX_MANIFEST_BYTES`."""
    from cosycompile.core.bounded_read import BoundError, read_text

    try:
        manifest = json.loads(read_text(path, MAX_MANIFEST_BYTES, "a bundle manifest"))
    except BoundError as exc:
        raise UserError(f"{path}: {exc}") from None
    except FileNotFoundError:
        raise UserError(f"{path}: missing (not a bundle: give a builds/<name>-<key12>/ folder)") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise UserError(f"{path}: not a readable bundle manifest ({exc.__class__.__name__})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise UserError(f"{path}: has no 'files' list of digests (a bundle from an older cosycompile: "
                        f"rebuild it with: cosycompile build <recipe>)")
    unsafe = next((k for k in files if not k or safe_relpath(k) != k or k == MANIFEST), None)
    if unsafe is not None:
        raise UserError(f"{path}: lists {unsafe[:80]!r}, not a plain relative path inside the bundle")
    sizes = manifest.get("sizes")
    if sizes is not None and (not isinstance(sizes, dict) or set(sizes) != set(files) or not all(
            type(v) is int and v >= 0 for v in sizes.values())):
        raise UserError(f"{path}: 'sizes' must give every listed file's byte count")
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
