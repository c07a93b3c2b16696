"""Local content-addressed store for step outputs.

Layout under the artifacts dir::

    cache/objects/<k[:2]>/<key>/entry.json   # written last, inside the staging dir
    cache/objects/<k[:2]>/<key>/data/...     # the step's output files
    cache/tmp/<key>.<pid>.<nonce>/          # staging; renamed into objects/ on success
    cache/locks/<key>.lock                  # flock held while a key is being built

An entry exists only after an atomic rename of a complete staging dir, so a killed build can
leave garbage in ``tmp/`` but never a half-written entry. Entries are verified against their
recorded digests before reuse; a file whose stats changed since it was stored is re-hashed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import re
import os
import shutil
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from cosycompile.errors import UserError
from cosycompile.core.hashing import StatCache, sha256_file
from cosycompile.core.store import Entry

ENTRY_FILE = "entry.json"
ENTRY_VERSION = 1


class StoreFull(UserError):
    """The artifacts disk filled up while a step wrote its output."""


class CorruptEntry(Exception):
    """An entry whose files do not match its recorded digests, or whose entry.json is not one."""


MAX_ENTRY_BYTES = 16 << 20  # an entry.json lists a step's files: kB
_SHA256 = re.compile(r"[0-9a-f]{64}")


def read_entry(entry_file: Path) -> dict[str, Any]:
    """The body of an ``entry.json``, checked for shape: this cache's version, the key its folder is
    named after, and ``files`` mapping safe relative paths to ``[size, sha256]``. Anything else is a
    :class:`CorruptEntry` (so every cache tool reports and removes it rather than failing on it)."""
    from cosycompile.core.bounded_read import BoundError, read_text

    try:
        meta = json.loads(read_text(entry_file, MAX_ENTRY_BYTES, "an entry.json"))
    except (BoundError, ValueError, RecursionError) as exc:
        raise CorruptEntry(f"entry.json unreadable ({exc.__class__.__name__})") from None
    if not isinstance(meta, dict) or meta.get("version") != ENTRY_VERSION or meta.get("key") != entry_file.parent.name:
        raise CorruptEntry("entry header does not match its key")
    files = meta.get("files")
    if not isinstance(files, dict):
        raise CorruptEntry("entry has no file list")
    for rel, rec in files.items():
        parts = rel.split("/") if isinstance(rel, str) else [".."]
        if rel.startswith("/") or any(x in ("", ".", "..") for x in parts) or not (
                isinstance(rec, list) and len(rec) == 2 and type(rec[0]) is int and rec[0] >= 0
                and isinstance(rec[1], str) and _SHA256.fullmatch(rec[1])):
            raise CorruptEntry(f"file record {str(rel)[:80]!r} is not a safe path with [size, sha256]")
    return meta


class Store:
    """The local tier of the cache (a remote tier can wrap the same interface)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        if os.path.lexists(self.root) and not self.root.is_dir():
            from cosycompile.core.bounded_read import kind_of

            # An artifacts dir that is a file, a FIFO or a device would make every read of it fail
            # in its own way (or, listed as empty, look like a cache with nothing in it).
            raise UserError(f"--artifacts {self.root}: is {kind_of(os.stat(self.root).st_mode)}, not a folder")
        self.cache_dir = self.root / "cache"
        self.objects = self.cache_dir / "objects"
        self.tmp = self.cache_dir / "tmp"
        self.locks = self.cache_dir / "locks"
        self.stat_cache = StatCache(self.cache_dir / "statcache.json")

    # -- setup ---------------------------------------------------------------------------
    def ensure_writable(self) -> None:
        """Create the store's folders, or fail with a one-line error naming the artifacts dir."""
        try:
            for d in (self.objects, self.tmp, self.locks):
                d.mkdir(parents=True, exist_ok=True)
            probe = self.tmp / f".probe.{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise UserError(f"{self.root}: artifacts dir is not writable ({exc.strerror or exc})") from None

    def entry_dir(self, key: str) -> Path:
        return self.objects / key[:2] / key

    # -- read ----------------------------------------------------------------------------
    def lookup(self, key: str, verify: bool = True) -> Entry | None:
        """The entry for ``key`` if present and intact; a corrupt entry is removed and reported as absent."""
        path = self.entry_dir(key)
        entry_file = path / ENTRY_FILE
        if not entry_file.exists():
            return None
        try:
            meta = read_entry(entry_file)
            if verify:
                self._verify(path, meta)
        except (CorruptEntry, OSError, ValueError):
            self._discard(path)
            return None
        _touch(path)
        return Entry(key, path, meta)

    def _verify(self, path: Path, meta: dict[str, Any]) -> None:
        files: dict[str, list[Any]] = meta["files"]
        data = path / "data"
        present = {str(p.relative_to(data)) for p in data.rglob("*") if p.is_file()}
        if present != set(files):
            raise CorruptEntry("file list differs")
        for rel, (size, digest) in files.items():
            f = data / rel
            if f.stat().st_size != size or self.stat_cache.digest(f) != digest:
                raise CorruptEntry(f"{rel} does not match its digest")

    def bodies(self) -> Iterator[dict[str, Any]]:
        """The body of every readable entry (a corrupt or vanishing one is passed over: ``cache verify``
        is what reports and removes those)."""
        for entry_file in self.objects.glob(f"*/*/{ENTRY_FILE}"):
            try:
                yield read_entry(entry_file)
            except (CorruptEntry, OSError):
                continue

    def verify_all(self, full: bool = False) -> tuple[int, list[str]]:
        """Check every entry; ``full`` re-hashes every file. Returns (count, bad keys) and removes bad ones."""
        bad: list[str] = []
        count = 0
        for entry_file in sorted(self.objects.glob(f"*/*/{ENTRY_FILE}")):
            count += 1
            path = entry_file.parent
            try:
                meta = read_entry(entry_file)
                if full:
                    for rel, (size, digest) in meta["files"].items():
                        if sha256_file(path / "data" / rel) != digest:
                            raise CorruptEntry(rel)
                else:
                    self._verify(path, meta)
            except (CorruptEntry, OSError, ValueError, KeyError):
                bad.append(path.name)
                self._discard(path)
        self.stat_cache.save()
        return count, bad

    def discard(self, path: Path) -> None:
        """Remove an entry dir (moved aside first, so no reader ever sees half of it)."""
        self._discard(path)

    def _discard(self, path: Path) -> None:
        # Move aside first so a concurrent reader never sees a half-deleted entry.
        trash = self.tmp / f"discard.{path.name}.{uuid.uuid4().hex[:8]}"
        try:
            os.replace(path, trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    # -- write ---------------------------------------------------------------------------
    @contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Exclusive per-key lock (released by the kernel if the process dies)."""
        self.locks.mkdir(parents=True, exist_ok=True)
        with open(self.locks / f"{key}.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def clean_staging(self, key: str) -> None:
        """Remove staging dirs left by killed builds of ``key`` (call while holding its lock)."""
        for stale in self.tmp.glob(f"{key}.*"):
            shutil.rmtree(stale, ignore_errors=True)

    @contextmanager
    def staging(self, key: str) -> Iterator[Path]:
        """A fresh staging dir whose ``data/`` the caller fills; removed on error."""
        self.clean_staging(key)
        stage = self.tmp / f"{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        (stage / "data").mkdir(parents=True)
        try:
            yield stage
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise

    @contextmanager
    def space_errors(self, step: str) -> Iterator[None]:
        """Turn a full disk (or quota) while ``step`` writes into one clear error; the staging dir
        is removed by :meth:`staging`, so no half-written entry remains."""
        try:
            yield
        except Exception as exc:
            if not _out_of_space(exc):
                raise
            raise StoreFull(f"{self.root}: no space left while step '{step}' wrote its output "
                            f"({_first_line(exc)}); nothing was cached for it. Free space "
                            "(`cosycompile cache gc --max-size ...`) or use --artifacts on a larger disk") from None

    def commit(self, key: str, stage: Path, meta: dict[str, Any]) -> Entry:
        """Record digests, write entry.json last, fsync, and atomically publish the staging dir."""
        data = stage / "data"
        files: dict[str, list[Any]] = {}
        for f in sorted(p for p in data.rglob("*") if p.is_file()):
            files[str(f.relative_to(data))] = [f.stat().st_size, self.stat_cache.digest(f)]
            _fsync_file(f)
        body = {"version": ENTRY_VERSION, "key": key, "created": time.time(), "files": files, **meta}
        entry_tmp = stage / (ENTRY_FILE + ".tmp")
        entry_tmp.write_text(json.dumps(body, indent=1, sort_keys=True))
        _fsync_file(entry_tmp)
        os.replace(entry_tmp, stage / ENTRY_FILE)
        final = self.entry_dir(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():  # left by an older run that failed verification; replace it
            self._discard(final)
        os.replace(stage, final)
        _fsync_dir(final.parent)
        for rel, (_, digest) in files.items():
            self.stat_cache.remember(final / "data" / rel, digest)
        self.stat_cache.save()
        return Entry(key, final, body)


def _touch(path: Path) -> None:
    """Mark an entry as used now (``cache gc`` drops the least recently used first)."""
    try:
        os.utime(path)
    except OSError:
        pass  # a read-only cache still works; gc then goes by creation time


def _out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it: exporters and savers wrap OSError) is a full disk or quota."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(cur) or "Disk quota exceeded" in str(cur):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text.strip().splitlines()[0][:160]


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
