"""``cosycompile cache verify|ls|gc|push|pull``: inspect, check, trim and share the local cache."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cosycompile.commands._args import add_common, add_remote
from cosycompile.errors import UserError

ORDER = 80
EXAMPLES = (
    ('cosycompile cache verify --full', 're-hash every cache entry'),
    ('cosycompile cache push BUNDLE --cache-remote URL', 'upload the cache entries a bundle was built from'),
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """This command's entry in the ``cosycompile`` parser."""
    p = sub.add_parser("cache", help="inspect or check the local cache")
    p.set_defaults(cache_parser=p)
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION")
    v = csub.add_parser("verify", help="check every entry against its digests; remove bad ones")
    v.add_argument("--full", action="store_true", help="re-hash every file, not only changed ones")
    add_common(v)
    ls = csub.add_parser("ls", help="list cache entries")
    add_common(ls)
    gc = csub.add_parser("gc", help="remove entries no bundle under builds/ needs, least recently used first",
                         description="Remove cache entries that no bundle under <artifacts>/builds was made from: "
                                     "those unused for longer than --older-than, then the least recently used "
                                     "until the cache fits --max-size. Entries of kept bundles always stay. "
                                     "Staging dirs left by killed builds are removed too.")
    gc.add_argument("--max-size", metavar="SIZE", help="largest total size to keep, e.g. 20G, 500M")
    gc.add_argument("--older-than", metavar="AGE", help="remove entries unused for longer than this, e.g. 30d, 12h")
    gc.add_argument("--dry-run", action="store_true", help="print what would be removed, remove nothing")
    # Not add_remote: deleting from a shared cache is asked for by name, never by $COSYCOMPILE_CACHE_REMOTE.
    gc.add_argument("--cache-remote", metavar="URL",
                    help="collect this remote cache instead of the local one, by --older-than (time since each "
                         "entry was pushed); entries of bundles under builds/ and of --keep bundles stay, then "
                         "blobs no entry names are removed (not taken from $COSYCOMPILE_CACHE_REMOTE)")
    gc.add_argument("--keep", metavar="BUNDLE", type=Path, action="append", default=[],
                    help="with --cache-remote: a bundle whose entries stay on the remote (repeatable)")
    add_common(gc)
    push = csub.add_parser("push", help="upload a bundle's cache entries to the remote cache",
                           description="Push every cache entry BUNDLE was built from (its manifest's steps) to the "
                                       "remote cache: blobs the remote lacks, then each action entry unless the "
                                       "remote already has one for that key (the first writer wins).")
    push.add_argument("bundle", type=Path, help="bundle dir (builds/<name>-<key12>/)")
    add_common(push)
    add_remote(push)
    pull = csub.add_parser("pull", help="download a bundle's (or one key's) cache entries from the remote cache",
                           description="Pull the cache entries BUNDLE was built from (or the entry of KEY) into the "
                                       "local cache, verifying every blob, so later builds reuse them.")
    pull.add_argument("what", metavar="BUNDLE-or-KEY", help="bundle dir, or a full 64-hex step key")
    add_common(pull)
    add_remote(pull)
    return p


def run(args: argparse.Namespace) -> int:
    """The ``cache`` command and its actions."""
    from cosycompile.cache.local import Store

    if args.cache_command is None:
        args.cache_parser.print_help()
        return 2
    store = Store(args.artifacts)
    if args.cache_command == "verify":
        count, bad = store.verify_all(full=args.full)
        print(f"{count} entries checked, {len(bad)} bad" + (f" (removed: {', '.join(b[:12] for b in bad)})" if bad else ""))
        return 1 if bad else 0
    if args.cache_command == "ls":
        from cosycompile.cache.local import ENTRY_FILE, CorruptEntry, read_entry

        for entry_file in sorted(store.objects.glob(f"*/*/{ENTRY_FILE}")):
            try:
                meta = read_entry(entry_file)
            except (OSError, CorruptEntry) as exc:
                print(f"{entry_file.parent.name[:12]}  BROKEN ({exc}; `cosycompile cache verify` removes it)")
                continue
            size = sum(s for s, _ in meta["files"].values())
            step, seconds = meta.get("step"), meta.get("seconds")
            step = step if isinstance(step, str) else "?"
            seconds = float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else 0.0
            print(f"{meta['key'][:12]}  {step[:40]:<16} {size / 1e6:9.1f} MB  {seconds:6.1f}s")
        return 0
    if args.cache_command == "gc":
        from cosycompile.cache.gc import collect, parse_age, parse_size

        if args.cache_remote is not None:
            return _gc_remote(args, store)
        if args.keep:
            raise UserError("cache gc: --keep is for --cache-remote (the local cache keeps every bundle under builds/)")
        if args.max_size is None and args.older_than is None:
            raise UserError("cache gc: give --max-size SIZE and/or --older-than AGE (nothing to decide by otherwise)")
        res = collect(store, parse_size(args.max_size) if args.max_size else None,
                      parse_age(args.older_than) if args.older_than else None, dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        print(f"{verb} {len(res.removed)} entries ({res.removed_bytes / 1e6:.1f} MB); kept {res.kept} "
              f"({res.kept_bytes / 1e6:.1f} MB, {res.pinned} needed by bundles under builds/)"
              + (f"; {res.stale_staging} stale staging dirs removed" if res.stale_staging else ""))
        return 0
    if args.cache_command in ("push", "pull"):
        from cosycompile.commands import _cache_remote

        return _cache_remote.run(args, store)
    return 2


def _gc_remote(args: argparse.Namespace, store: Any) -> int:
    """``cache gc --cache-remote URL --older-than AGE [--keep BUNDLE]...``."""
    from cosycompile.cache.gc import bundle_step_keys, collect_remote, parse_age, pinned_keys
    from cosycompile.cache.remote import RemoteCache, RemoteError
    from cosycompile.runtime.bundle import MANIFEST, read_manifest

    if args.older_than is None or args.max_size is not None:
        raise UserError("cache gc --cache-remote: give --older-than AGE (a remote is collected by age; "
                        "--max-size is for the local cache)")
    remote = RemoteCache(args.cache_remote, where="--cache-remote")
    pins = pinned_keys(store)
    for bundle in args.keep:
        read_manifest(bundle / MANIFEST)  # a --keep that is not a bundle is an error, not an empty pin
        pins |= bundle_step_keys(bundle / MANIFEST)
    try:
        res = collect_remote(remote, parse_age(args.older_than), pins, dry_run=args.dry_run)
    except RemoteError as exc:
        raise UserError(f"remote cache {remote.url}: gc failed ({exc})") from None
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {len(res.removed)} entries and {res.removed_blobs} blobs ({res.removed_bytes / 1e6:.1f} MB) "
          f"from {remote.url}; kept {res.kept} entries ({res.pinned} needed by kept bundles)"
          + (f"; {res.young_blobs} unnamed blobs younger than the push grace kept" if res.young_blobs else "")
          + (f"; {res.removed_claims} claims of killed builds {verb}" if res.removed_claims else ""))
    return 0
