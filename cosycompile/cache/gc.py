"""Garbage collection of the local cache: drop entries no kept bundle needs, oldest use first.

An entry's last use is the modification time of its directory, touched by every lookup that
reuses it (:meth:`Store.lookup`). The bundles under ``builds/`` name the entries they were made
from (``manifest.json`` ``steps.*.key``); those entries are never collected, so any kept bundle
can still be rebuilt, re-validated or pushed without re-running its steps. Stale staging dirs
of killed builds are removed too (only when no live build holds their key's lock).
"""

from __future__ import annotations

import fcntl
import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from cosycompile.cache.claims import GC_AGE_S
from cosycompile.cache.local import ENTRY_FILE, CorruptEntry, Store, read_entry
from cosycompile.cache.remote import RemoteCache, RemoteCorrupt
from cosycompile.core.bounded_read import MAX_MANIFEST_BYTES, read_text
from cosycompile.errors import UserError

# A push uploads its blobs before its action entry: a blob younger than this may belong to a push
# under way, so remote gc keeps it even when no entry names it yet.
BLOB_GRACE_S = 6 * 3600
_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass
class GCResult:
    """What a collection removed and kept."""

    removed: list[str] = field(default_factory=list)
    removed_bytes: int = 0
    kept: int = 0
    kept_bytes: int = 0
    pinned: int = 0  # entries kept because a bundle under builds/ needs them
    stale_staging: int = 0


def parse_size(text: str) -> int:
    """``500M``, ``2G``, ``1.5g``, ``123`` (bytes) -> bytes; anything else is a UserError."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not m:
        raise UserError(f"--max-size: '{text}' is not a size (examples: 500M, 2G, 1000000)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``2w`` -> seconds; anything else is a UserError."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if not m:
        raise UserError(f"--older-than: '{text}' is not an age (examples: 30d, 12h, 90m, 2w)")
    return float(m.group(1)) * _AGE_UNITS[m.group(2)]


def bundle_step_keys(manifest: Path) -> set[str]:
    """The step keys a bundle's ``manifest.json`` names; none for an unreadable one (it pins nothing:
    it cannot be used anyway). Read bounded, as a regular file."""
    try:
        steps = json.loads(read_text(manifest, MAX_MANIFEST_BYTES, "a bundle manifest")).get("steps", {})
    except (OSError, ValueError, RecursionError, AttributeError):  # BoundError is a ValueError
        return set()
    if not isinstance(steps, dict):
        return set()
    return {s["key"] for s in steps.values() if isinstance(s, dict) and isinstance(s.get("key"), str)}


def pinned_keys(store: Store) -> set[str]:
    """Keys of every entry a bundle under ``<artifacts>/builds`` was made from."""
    keys: set[str] = set()
    for manifest in (store.root / "builds").glob("*/manifest.json"):
        keys |= bundle_step_keys(manifest)
    return keys


def collect(store: Store, max_size: int | None = None, older_than: float | None = None,
            dry_run: bool = False, now: float | None = None) -> GCResult:
    """Remove unpinned entries last used more than ``older_than`` seconds ago, then the least
    recently used unpinned ones until the cache holds at most ``max_size`` bytes."""
    now = time.time() if now is None else now
    pins = pinned_keys(store)
    rows = []  # (last used, key, path, bytes)
    for entry_file in store.objects.glob(f"*/*/{ENTRY_FILE}"):
        path = entry_file.parent
        try:
            meta = read_entry(entry_file)
            size = sum(s for s, _ in meta["files"].values())
            used = path.stat().st_mtime
        except (OSError, CorruptEntry):
            continue  # half-visible or corrupt: `cache verify` removes those
        rows.append((used, path.name, path, size))
    res = GCResult()
    total = sum(r[3] for r in rows)
    doomed: list[tuple[str, Path, int]] = []
    for used, key, path, size in sorted(rows):  # least recently used first
        if key in pins:
            res.pinned += 1
            continue
        too_old = older_than is not None and now - used > older_than
        too_big = max_size is not None and total > max_size
        if too_old or too_big:
            doomed.append((key, path, size))
            total -= size
    for key, path, size in doomed:
        # Under the key's lock, so a build that is reading or writing this key is not pulled from under.
        with store.lock(key):
            if not dry_run:
                store.discard(path)
        res.removed.append(key)
        res.removed_bytes += size
    res.kept = len(rows) - len(doomed)
    res.kept_bytes = sum(r[3] for r in rows) - res.removed_bytes
    if not dry_run:
        res.stale_staging = _clean_staging(store)
    return res


def _clean_staging(store: Store) -> int:
    """Staging dirs whose key no live build holds (a killed build's leftovers)."""
    n = 0
    for stage in list(store.tmp.glob("*")):
        key = stage.name.split(".", 1)[0]
        if stage.name.startswith(".") or len(key) != 64:
            continue
        lock = store.locks / f"{key}.lock"
        with open(lock, "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a build is writing it right now
            try:
                shutil.rmtree(stage, ignore_errors=True)
                n += 1
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
    return n


@dataclass
class RemoteGCResult(GCResult):
    """What a remote collection removed and kept: entries (``removed``, ``kept``, ``pinned``) and blobs."""

    removed_blobs: int = 0
    young_blobs: int = 0  # unreferenced, but within BLOB_GRACE_S: maybe a push under way
    removed_claims: int = 0  # left by builds killed while they held them


def collect_remote(remote: RemoteCache, older_than: float, pins: set[str], dry_run: bool = False,
                   now: float | None = None) -> RemoteGCResult:
    """The retention rule of a shared remote: action entries published more than ``older_than``
    seconds ago are removed unless ``pins`` (the step keys of bundles to keep) names them; then
    every blob that no remaining entry names and that is older than :data:`BLOB_GRACE_S`; then every
    claim no heartbeat has rewritten for :data:`~cosycompile.cache.claims.GC_AGE_S`.

    Entries go first, so no remaining entry ever names a removed blob. A remote has no cheap
    "last used" time (a pull is a read), so age is time since publication: a step still in use is
    built and pushed again by the next build that misses it.
    """
    now = time.time() if now is None else now
    res = RemoteGCResult()
    for key, (_, published) in sorted(remote.listing("ac").items()):
        if key in pins:
            res.pinned += 1
        elif now - published > older_than:
            if not dry_run:
                remote.remove("ac", key)
            res.removed.append(key)
            continue
        res.kept += 1
    needed: set[str] = set()
    for key in remote.listing("ac"):
        if dry_run and key in res.removed:
            continue
        try:
            body = remote.read_entry(key)
        except RemoteCorrupt:
            continue  # a pull refuses it anyway; its blobs are not needed by it
        if body is not None:
            needed.update(sha for _, sha in body["files"].values())
    for sha, (size, modified) in sorted(remote.listing("cas").items()):
        if sha in needed:
            continue
        if now - modified <= BLOB_GRACE_S:
            res.young_blobs += 1
            continue
        if not dry_run:
            remote.remove("cas", sha)
        res.removed_blobs += 1
        res.removed_bytes += size
    for name, (_, modified) in sorted(remote.listing("claims").items()):
        if now - modified > GC_AGE_S:
            if not dry_run:
                remote.remove("claims", name)
            res.removed_claims += 1
    return res
