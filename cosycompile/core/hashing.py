"""Content digests for build keys: files (with a stat cache), source code, tool versions.

Keys hash inputs, never outputs. Hashing a 2 GB checkpoint on every no-op build would make a
cache hit slow, so file digests are remembered against (size, mtime, inode) and recomputed only
when those change.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

_CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def canonical_json(obj: Any) -> str:
    """Stable JSON text for hashing (sorted keys, no whitespace variance)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def digest_obj(obj: Any) -> str:
    """sha256 of the canonical JSON of ``obj``."""
    return sha256_bytes(canonical_json(obj).encode())


def sha256_file(path: Path) -> str:
    """Hex sha256 of a regular file's bytes, streamed. Anything else (a FIFO would block the open, a
    device never end) is an OSError saying so, which callers word as an unreadable file."""
    import errno
    import stat

    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    with open(path, "rb") as f:
        return sha256_stream(f.read)


def sha256_stream(read: Any, sink: Any = None, chunk: int = _CHUNK) -> str:
    """sha256 of everything ``read(chunk)`` returns, writing each chunk to ``sink`` when given."""
    h = hashlib.sha256()
    while data := read(chunk):
        h.update(data)
        if sink is not None:
            sink(data)
    return h.hexdigest()


class StatCache:
    """Remembers file digests keyed by (path, size, mtime_ns, inode) in one JSON file.

    A stale or unreadable cache file only costs re-hashing; it is rewritten atomically.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._data: dict[str, list[Any]] = {}
        self._dirty = False
        if path and path.exists():
            try:
                self._data = json.loads(path.read_text())
            except (OSError, ValueError):
                self._data = {}

    def digest(self, file: Path) -> str:
        """sha256 of ``file``, reusing the remembered one when its stats are unchanged."""
        st = file.stat()
        key = str(file.resolve())
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        hit = self._data.get(key)
        if hit and hit[:3] == stamp:
            return hit[3]
        digest = sha256_file(file)
        self._data[key] = stamp + [digest]
        self._dirty = True
        return digest

    def remember(self, file: Path, digest: str) -> None:
        """Record a digest computed elsewhere (e.g. before the file was renamed into place)."""
        st = file.stat()
        self._data[str(file.resolve())] = [st.st_size, st.st_mtime_ns, st.st_ino, digest]
        self._dirty = True

    def save(self) -> None:
        """Write the cache back if anything changed (atomic replace)."""
        if not (self._dirty and self.path):
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self._data))
        os.replace(tmp, self.path)
        self._dirty = False


def digest_files(files: Iterable[Path], stat_cache: StatCache, root: Path | None = None) -> str:
    """One digest over named files: relative name + content digest of each, sorted."""
    entries = []
    for f in files:
        name = str(f.relative_to(root)) if root else f.name
        entries.append((name, stat_cache.digest(f)))
    return digest_obj(sorted(entries))


@lru_cache(maxsize=None)
def tool_version(dist: str) -> str:
    """Installed version of a distribution, without importing it ('absent' when not installed)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def tool_versions(dists: Iterable[str]) -> dict[str, str]:
    """Versions of several distributions (see :func:`tool_version`)."""
    return {d: tool_version(d) for d in sorted(set(dists))}


# A tool shipped as several distributions of one module (ONNX Runtime: ``onnxruntime``,
# ``onnxruntime-gpu``, ``onnxruntime-openvino``, ...): tool name -> the module they all provide.
# The variants of one release are built from the same source (they differ in the execution
# providers compiled in), so a GPU server with ``onnxruntime-gpu`` must not re-key a CPU runner's steps.
_MODULE_VARIANTS: dict[str, str] = {"onnxruntime": "onnxruntime"}


@lru_cache(maxsize=None)
def tool_identity(dist: str) -> str:
    """The release of a tool that a step key names: what changes outputs, not how it was built.

    The PEP 440 local version label is dropped (``2.13.0+cu128`` and ``2.13.0+cpu`` are both
    ``2.13.0``): it names the build (CUDA or CPU wheels of the same source), not the source that
    decides what a step computes. Keys must be portable between a CPU runner
    and a GPU server, or a split build re-runs every export and quantization on the GPU machine.
    For a tool in ``_MODULE_VARIANTS`` the release is that of whichever variant provides the module
    first on ``sys.path`` (the one ``import`` would load). 'absent' when not installed.
    """
    module = _MODULE_VARIANTS.get(dist)
    version = _variant_version(dist, module) if module else tool_version(dist)
    return version.split("+", 1)[0]


def tool_identities(dists: Iterable[str]) -> dict[str, str]:
    """Tool identities of several distributions, the ``tools`` component of a step key."""
    return {d: tool_identity(d) for d in sorted(set(dists))}


def _variant_version(prefix: str, module: str) -> str:
    """Version of the first distribution on ``sys.path`` named ``prefix`` or ``prefix-*`` that
    provides ``module`` (``onnxruntime-extensions`` is named alike but ships another module).

    Folder names are matched before any metadata is read: one ``listdir`` per path entry keeps a
    no-op build fast. Within one folder the names are taken in sorted order, so the answer is
    stable even where two variants were (wrongly) installed side by side.
    """
    for entry in sys.path:
        folder = entry or "."
        try:
            names = sorted(os.listdir(folder))
        except OSError:  # a zip file or a missing folder on the path holds no dist-info
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            stem = name.split("-", 1)[0].lower().replace("_", "-").replace(".", "-")
            if stem != prefix and not stem.startswith(prefix + "-"):
                continue
            dist = metadata.PathDistribution(Path(folder) / name)
            top = dist.read_text("top_level.txt")
            provides = (module in top.split()) if top is not None else any(
                f.parts and f.parts[0] == module for f in (dist.files or []))
            if provides and dist.version:
                return dist.version
    return "absent"
