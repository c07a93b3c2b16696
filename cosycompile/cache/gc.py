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

from cosycompile.cache.local import ENTRY_FILE, CorruptEntry, Store, read_entry
from cosycompile.errors import UserError

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


def pinned_keys(store: Store) -> set[str]:
    """Keys of every entry a bundle under ``<artifacts>/builds`` was made from."""
    keys: set[str] = set()
    for manifest in (store.root / "builds").glob("*/manifest.json"):
        try:
            steps = json.loads(manifest.read_text()).get("steps", {})
        except (OSError, ValueError):
            continue  # an unreadable bundle pins nothing; it cannot be used anyway
        keys.update(s["key"] for s in steps.values() if isinstance(s, dict) and isinstance(s.get("key"), str))
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
