"""``cosycompile pack BUNDLE -o FILE``: one deterministic .tar.gz of a verified bundle.

The archive holds one top folder named like the bundle, with ``manifest.json`` first and then
every file the manifest lists in sorted order, each as a plain file with fixed metadata (mode
0644, owner 0, the manifest's creation time), in a gzip stream with no name or time in its
header: packing the same bundle twice gives the same bytes. Files are hashed while they are
written, and a bundle whose files do not match its manifest (edited, truncated, missing, extra,
a symlink) is refused with nothing written at FILE.
"""

from __future__ import annotations

import argparse
import calendar
import gzip
import hashlib
import os
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any, BinaryIO

from cosycompile.runtime.bundle import MANIFEST, read_manifest
from cosycompile.commands._output import check_out_file
from cosycompile.errors import UserError


class _HashingReader:
    """A file object for ``TarFile.addfile`` that hashes what the archive reads from it."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.h = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        return data


def bundle_listing(bundle: Path, files: dict[str, str]) -> None:
    """Refuse a bundle whose tree is not exactly its manifest's files (plus the manifest), all plain files."""
    present: set[str] = set()
    for root, dirs, names in os.walk(bundle):
        for name in dirs + names:
            path = Path(root) / name
            rel = str(path.relative_to(bundle))
            if path.is_symlink():
                raise UserError(f"{path}: a symbolic link in the bundle; refusing to pack (bundles hold plain files only)")
            if name in names:
                if not path.is_file():
                    raise UserError(f"{path}: not a plain file; refusing to pack")
                present.add(rel)
    extra = sorted(present - set(files) - {MANIFEST})
    if extra:
        raise UserError(f"{bundle / extra[0]}: not listed in {bundle / MANIFEST}; refusing to pack "
                        f"({len(extra)} unlisted file(s))")
    missing = sorted(set(files) - present)
    if missing:
        raise UserError(f"{bundle / missing[0]}: listed in {bundle / MANIFEST} but missing; refusing to pack")


def pack(bundle: Path, out: Path) -> dict[str, Any]:
    """Write the archive of ``bundle`` to ``out`` (atomically); returns counts for the summary line."""
    manifest_path = bundle / MANIFEST
    manifest = read_manifest(manifest_path)
    files: dict[str, str] = manifest["files"]
    bundle_listing(bundle, files)
    top = bundle.resolve().name
    mtime = _created(manifest)
    tmp = out.parent / f".{out.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}.tmp"
    total = 0
    try:
        with open(tmp, "wb") as raw:
            # filename="" and mtime=0 keep the build's path and time out of the gzip header (determinism).
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
                with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                    for rel in [MANIFEST, *sorted(files)]:
                        path = bundle / rel
                        info = tarfile.TarInfo(f"{top}/{rel}")
                        info.size = path.stat().st_size
                        info.mtime = mtime
                        info.mode = 0o644
                        info.uid = info.gid = 0
                        info.uname = info.gname = ""
                        with path.open("rb") as f:
                            reader = _HashingReader(f)
                            tar.addfile(info, reader)  # type: ignore[arg-type]  # reads exactly info.size bytes
                        if rel != MANIFEST and reader.h.hexdigest() != files[rel]:
                            raise UserError(f"{path}: digest mismatch with {manifest_path} (changed or truncated "
                                            f"since the build); refusing to pack; rebuild with: cosycompile build "
                                            f"{manifest.get('recipe_source') or '<recipe>'}")
                        total += info.size
        check_out_file(out, "-o", "give the archive's file name, e.g. bundle.tar.gz")  # again: packing takes a while
        os.replace(tmp, out)
    except OSError as exc:
        # tarfile raises OSError("unexpected end of data") when a file shrinks while it is read.
        raise UserError(f"{out}: cannot write the archive ({exc.strerror or exc})") from None
    finally:
        tmp.unlink(missing_ok=True)
    return {"files": len(files) + 1, "bytes": total, "archive_bytes": out.stat().st_size}


def _created(manifest: dict[str, Any]) -> int:
    """The manifest's creation time as a Unix time (0 if absent): the archive's member times."""
    try:
        return calendar.timegm(time.strptime(str(manifest.get("created")), "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return 0


ORDER = 90
EXAMPLES = (
    ('cosycompile pack BUNDLE -o bundle.tar.gz', 'one verified archive of a bundle'),
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """This command's entry in the ``cosycompile`` parser."""
    p = sub.add_parser("pack", help="pack a bundle into one deterministic .tar.gz (every file checked against "
                                    "manifest.json)",
                       description="Write BUNDLE as one .tar.gz: the bundle's folder with manifest.json first, then "
                                   "every file it lists in sorted order, with fixed metadata (the same bundle gives "
                                   "the same bytes). A bundle whose files do not match their digests is refused.")
    p.add_argument("bundle", type=Path, help="bundle dir (builds/<name>-<key12>/)")
    p.add_argument("-o", "--out", type=Path, required=True, metavar="FILE", help="archive to write (.tar.gz)")
    return p


def run(args: argparse.Namespace) -> int:
    """The ``pack`` command."""
    bundle: Path = args.bundle
    out: Path = args.out
    if not bundle.is_dir():
        raise UserError(f"{bundle}: not a bundle folder")
    check_out_file(out, "-o", "give the archive's file name, e.g. bundle.tar.gz")
    if out.resolve().is_relative_to(bundle.resolve()):
        raise UserError(f"{out}: inside the bundle being packed; write the archive elsewhere")
    stats = pack(bundle, out)
    print(f"packed {stats['files']} files ({stats['bytes'] / 1e6:.1f} MB) into {out} "
          f"({stats['archive_bytes'] / 1e6:.1f} MB)")
    return 0
