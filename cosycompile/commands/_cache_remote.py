"""``cosycompile cache push BUNDLE`` / ``cache pull BUNDLE-or-KEY``: move cache entries to and from
the remote cache tier (:mod:`cosycompile.cache.remote`) outside a build.

A bundle's ``manifest.json`` names the key of every step it was made from; pushing those entries
lets another machine rebuild, re-validate or finish the same recipe without running any of them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from cosycompile.cache.local import Store
from cosycompile.cache.remote import RemoteCache, RemoteCorrupt, RemoteError, remote_from
from cosycompile.errors import UserError
from cosycompile.runtime.bundle import MANIFEST, read_manifest

_KEY = re.compile(r"[0-9a-f]{64}")


def run(args: argparse.Namespace, store: Store) -> int:
    """Dispatch ``cache push`` / ``cache pull``; 0 when every entry moved, 1 otherwise."""
    remote = remote_from(args.cache_remote)
    if remote is None:
        raise UserError(f"cache {args.cache_command}: give --cache-remote URL (or set COSYCOMPILE_CACHE_REMOTE)")
    if args.cache_command == "push":
        return push(store, remote, bundle_keys(args.bundle))
    what = str(args.what)
    if _KEY.fullmatch(what):
        return pull(store, remote, {what: what[:12]})
    if Path(what).is_dir():
        return pull(store, remote, bundle_keys(Path(what)))
    raise UserError(f"cache pull: '{what}' is neither a bundle dir nor a 64-hex step key")


def bundle_keys(bundle: Path) -> dict[str, str]:
    """Step key -> step name for every step ``bundle``'s manifest lists."""
    path = bundle / MANIFEST
    steps = read_manifest(path).get("steps")
    if not isinstance(steps, dict):
        raise UserError(f"{path}: 'steps' must map each step's name to its key")
    keys = {s["key"]: name for name, s in steps.items()
            if isinstance(s, dict) and isinstance(s.get("key"), str) and _KEY.fullmatch(s["key"])}
    if not keys:
        raise UserError(f"{path}: lists no step keys")
    return keys


def push(store: Store, remote: RemoteCache, keys: dict[str, str]) -> int:
    """Push the local entries of ``keys``; entries missing locally are listed and make it fail."""
    missing = []
    published = existing = blobs = 0
    size = 0
    for key, name in sorted(keys.items(), key=lambda kv: kv[1]):
        entry = store.lookup(key)
        if entry is None:
            missing.append(name)
            continue
        try:
            res = remote.push(store, entry)
        except RemoteError as exc:
            # One line, exit 2: the remote is unusable (down, silent, refused), not a step that failed.
            raise UserError(f"remote cache {remote.url}: push of {name} failed ({exc})") from None
        published += res.published
        existing += not res.published
        blobs += res.uploaded
        size += res.bytes
    store.stat_cache.save()
    print(f"pushed {published} entries to {remote.url} ({blobs} blobs, {size / 1e6:.1f} MB uploaded); "
          f"{existing} were there already")
    if missing:
        print(f"not in the local cache, not pushed: {', '.join(missing)}")
        return 1
    return 0


def pull(store: Store, remote: RemoteCache, keys: dict[str, str]) -> int:
    """Pull the entries of ``keys`` the local cache lacks; ones the remote lacks or fails to verify make it fail."""
    store.ensure_writable()
    pulled = present = 0
    absent: list[str] = []
    for key, name in sorted(keys.items(), key=lambda kv: kv[1]):
        with store.lock(key):
            if store.lookup(key) is not None:
                present += 1
                continue
            try:
                entry = remote.pull(store, key)
            except RemoteCorrupt as exc:
                print(f"cosycompile: error: remote cache {remote.url}: {name}: {exc}", file=sys.stderr)
                absent.append(name)
                continue
            except RemoteError as exc:
                raise UserError(f"remote cache {remote.url}: pull of {name} failed ({exc})") from None
        if entry is None:
            absent.append(name)
        else:
            pulled += 1
    store.stat_cache.save()
    print(f"pulled {pulled} entries from {remote.url}; {present} were in the local cache already")
    if absent:
        print(f"not pulled (not on the remote, or failed verification): {', '.join(absent)}")
        return 1
    return 0
