"""``cosycompile unpack FILE DIR``: a bundle archive into DIR, all or nothing.

An archive is untrusted input, read as a stream and checked member by member before a byte of
that member is written. ``manifest.json`` comes first (``cosycompile pack`` writes it so); it is
read, bounded, before anything else. Every later member must be a plain file or folder (no
symbolic or hard links, devices, fifos, sparse files) with a relative path inside DIR (no ``..``,
no absolute path), listed in the manifest, not seen before, and no larger than the manifest's size
for it; one member more than the manifest lists is refused. Files are written into a temporary
sibling of DIR and hashed as they are written; each must have its listed digest and every listed
file must be there. Only then is the temporary folder renamed to DIR, so a refused archive leaves
DIR as it was (absent or empty). So a small archive that would expand to gigabytes, or that holds
100,000 unlisted members, is refused at its first offending header.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import tarfile
import uuid
import zlib
from pathlib import Path
from typing import Any, Iterator

from cosycompile.core.hashing import sha256_stream
from cosycompile.runtime.bundle import MANIFEST, MAX_MANIFEST_BYTES, read_manifest, safe_relpath
from cosycompile.errors import UserError

_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)
_KINDS = {tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link", tarfile.CHRTYPE: "a character device",
          tarfile.BLKTYPE: "a block device", tarfile.FIFOTYPE: "a fifo", tarfile.GNUTYPE_SPARSE: "a sparse file"}
_LEADING_DIRS = 2  # folder members an archive may hold before its manifest (its top folder)


def member_path(archive: Path, m: tarfile.TarInfo) -> str:
    """The member's clean relative path; refuses unsafe paths and anything but plain files and folders."""
    rel = safe_relpath(m.name)
    if rel is None:
        why = "has an absolute path" if m.name.startswith("/") else "leaves the folder ('..' or '\\' in its path)"
        raise UserError(f"{archive}: member {m.name!r} {why}; refusing to unpack")
    if m.type in _KINDS or m.issparse():
        raise UserError(f"{archive}: member {m.name!r} is {_KINDS.get(m.type, 'a sparse file')}; refusing to unpack "
                        f"(bundles hold plain files only)")
    if m.type != tarfile.DIRTYPE and m.type not in _FILE_TYPES:
        raise UserError(f"{archive}: member {m.name!r} has tar type {m.type!r}, not a plain file; refusing to unpack")
    return rel


def _manifest_member(archive: Path, members: Iterator[tarfile.TarInfo]) -> tuple[str, tarfile.TarInfo]:
    """(top folder, the manifest's member): the first file member, after at most a top folder."""
    for _ in range(_LEADING_DIRS + 1):
        m = next(members, None)
        if m is None:
            break
        rel = member_path(archive, m)
        if m.type == tarfile.DIRTYPE:
            continue
        top, _, name = rel.rpartition("/")
        if name != MANIFEST or "/" in top:
            break
        if m.size > MAX_MANIFEST_BYTES:
            raise UserError(f"{archive}: its {MANIFEST} is {m.size} bytes (at most {MAX_MANIFEST_BYTES}); refusing "
                            f"to unpack")
        return top, m
    raise UserError(f"{archive}: no {MANIFEST} at the top of the archive, first; not a bundle made by cosycompile pack")


def unpack(archive: Path, dest: Path) -> int:
    """Extract and verify ``archive`` into ``dest``; returns the number of files written."""
    tmp = dest.parent / f".{dest.name}.unpack.{os.getpid()}.{uuid.uuid4().hex[:6]}"
    try:
        # "r|*": a stream, so headers are read one by one as the files are written, never all up front.
        with tarfile.open(archive, "r|*") as tar:
            members = iter(tar)
            top, first = _manifest_member(archive, members)
            tmp.mkdir()
            _extract(tar, first, tmp / MANIFEST)
            try:
                manifest = read_manifest(tmp / MANIFEST)
            except UserError as exc:  # it names the temporary copy: name the archive's member instead
                why = str(exc).split(": ", 1)[-1]
                raise UserError(f"{archive}: {_name(top, MANIFEST)} {why}; refusing to unpack") from None
            written = _extract_listed(archive, tar, members, top, manifest, tmp)
        listed: dict[str, str] = manifest["files"]
        missing = sorted(set(listed) - set(written))
        if missing:
            raise UserError(f"{archive}: {missing[0]!r} is listed in its {MANIFEST} but not in the archive; "
                            f"refusing to unpack")
        bad = sorted(rel for rel, digest in listed.items() if written[rel] != digest)
        if bad:
            raise UserError(f"{archive}: {_name(top, bad[0])!r} does not match its digest in {MANIFEST} "
                            f"(damaged archive); refusing to unpack")
        if dest.exists():
            dest.rmdir()  # checked empty before; rmdir refuses if something appeared since
        os.replace(tmp, dest)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        # tarfile's ReadError lists every compression it tried, one per line: keep the first line.
        why = (str(exc).splitlines() or [""])[0].rstrip(":") or exc.__class__.__name__
        raise UserError(f"{archive}: not a readable .tar.gz ({why})") from None
    except OSError as exc:
        raise UserError(f"{archive}: cannot unpack into {dest} ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return len(written)


def _extract_listed(archive: Path, tar: tarfile.TarFile, members: Iterator[tarfile.TarInfo], top: str,
                    manifest: dict[str, Any], tmp: Path) -> dict[str, str]:
    """Write every member after the manifest, each checked against the manifest first; rel -> sha256."""
    listed: dict[str, str] = manifest["files"]
    sizes: dict[str, int] | None = manifest.get("sizes")
    folders = {f.rsplit("/", i)[0] for f in listed for i in range(1, f.count("/") + 1)}
    prefix = f"{top}/" if top else ""
    written: dict[str, str] = {}
    budget = len(listed) + len(folders)  # members the manifest accounts for
    for n, m in enumerate(members):
        rel = member_path(archive, m)
        if n >= budget:
            raise UserError(f"{archive}: more members than its {MANIFEST} lists ({m.name!r} is one too many); "
                            f"refusing to unpack")
        if prefix and not rel.startswith(prefix):
            raise UserError(f"{archive}: member {m.name!r} is outside the bundle's folder {top!r}; refusing to unpack")
        inner = rel[len(prefix):]
        if m.type == tarfile.DIRTYPE:
            if inner not in folders:
                raise UserError(f"{archive}: folder {m.name!r} is not in its {MANIFEST}; refusing to unpack")
            continue
        if inner not in listed:
            raise UserError(f"{archive}: member {m.name!r} is not in its {MANIFEST}; refusing to unpack")
        if inner in written:
            raise UserError(f"{archive}: member {m.name!r} appears twice; refusing to unpack")
        if sizes is not None and m.size != sizes[inner]:
            raise UserError(f"{archive}: member {m.name!r} is {m.size} bytes, its {MANIFEST} says {sizes[inner]}; "
                            f"refusing to unpack")
        written[inner] = _extract(tar, m, tmp / inner)
    return written


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> str:
    """Write one member's bytes to ``path`` (a new file, never through a link); returns their sha256."""
    src = tar.extractfile(member)
    if src is None:  # not reachable for the plain files member_path lets through
        raise UserError(f"{member.name!r}: cannot be read from the archive")
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_EXCL | O_NOFOLLOW: the file is created here, never written through something already there.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with src, os.fdopen(fd, "wb") as out:
        return sha256_stream(src.read, out.write)


def _name(top: str, rel: str) -> str:
    return f"{top}/{rel}" if top else rel


ORDER = 100
EXAMPLES = (
    ('cosycompile unpack bundle.tar.gz DIR', 'unpack it on another machine (all or nothing)'),
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """This command's entry in the ``cosycompile`` parser."""
    p = sub.add_parser("unpack", help="unpack a bundle archive into DIR, verifying every digest (all or nothing)",
                       description="Extract FILE into DIR (must not exist, or be empty). Refuses links, devices, "
                                   "paths leaving DIR and files not in the manifest, checks every digest, and leaves "
                                   "DIR untouched on any refusal.")
    p.add_argument("archive", type=Path, metavar="FILE", help="archive written by cosycompile pack")
    p.add_argument("dir", type=Path, metavar="DIR", help="folder to create (or an empty one)")
    return p


def run(args: argparse.Namespace) -> int:
    """The ``unpack`` command."""
    archive: Path = args.archive
    dest: Path = args.dir
    if not archive.is_file():
        raise UserError(f"{archive}: archive not found")
    if dest.exists() and (not dest.is_dir() or dest.is_symlink() or any(dest.iterdir())):
        raise UserError(f"{dest}: exists and is not an empty folder")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{dest.parent}: cannot create ({exc.strerror or exc})") from None
    n = unpack(archive, dest)
    print(f"unpacked {n} files into {dest} (every digest matches its manifest)")
    return 0
