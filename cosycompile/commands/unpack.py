"""``cosycompile unpack FILE DIR``: a bundle archive into DIR, all or nothing.

An archive is untrusted input. Every member header is checked before anything is written:
plain files and folders only (no symbolic or hard links, devices, fifos), relative paths that
stay inside DIR (no ``..``, no absolute path), no name twice. Files are then written into a
temporary sibling of DIR and hashed as they are written; the manifest they carry must list
exactly those files, each with the digest it was written with. Only then is the temporary folder
renamed to DIR, so a refused archive leaves DIR as it was (absent or empty).
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

from cosycompile.commands._bundle import MANIFEST, read_manifest, safe_relpath, sha256_stream
from cosycompile.errors import UserError

_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)
_KINDS = {tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link", tarfile.CHRTYPE: "a character device",
          tarfile.BLKTYPE: "a block device", tarfile.FIFOTYPE: "a fifo"}


def check_members(archive: Path, members: list[tarfile.TarInfo]) -> tuple[str, dict[str, tarfile.TarInfo], set[str]]:
    """(top folder, files by path inside the bundle, folders) of a bundle archive's members; refuses unsafe ones.

    The bundle may sit at the archive's root or in one top folder (``cosycompile pack`` writes
    ``<bundle-name>/...``); the folder that holds ``manifest.json`` is the bundle's root.
    """
    files: dict[str, tarfile.TarInfo] = {}
    dirs: set[str] = set()
    for m in members:
        rel = safe_relpath(m.name)
        if rel is None:
            why = "has an absolute path" if m.name.startswith("/") else "leaves the folder ('..' or '\\' in its path)"
            raise UserError(f"{archive}: member {m.name!r} {why}; refusing to unpack")
        if m.type in _KINDS:
            raise UserError(f"{archive}: member {m.name!r} is {_KINDS[m.type]}; refusing to unpack (bundles hold plain "
                            f"files only)")
        if m.type == tarfile.DIRTYPE:
            if rel:
                dirs.add(rel)
            continue
        if m.type not in _FILE_TYPES:
            raise UserError(f"{archive}: member {m.name!r} has tar type {m.type!r}, not a plain file; refusing to unpack")
        if not rel or rel in files:
            raise UserError(f"{archive}: member {m.name!r} {'names no file' if not rel else 'appears twice'}; "
                            f"refusing to unpack")
        files[rel] = m
    if MANIFEST in files:
        top = ""
    else:
        tops = {rel.split("/", 1)[0] for rel in (*files, *dirs)}
        top = tops.pop() if len(tops) == 1 else ""
        if not top or f"{top}/{MANIFEST}" not in files:
            raise UserError(f"{archive}: no {MANIFEST} at the top of the archive; not a bundle made by cosycompile pack")
    if top and top in files:
        raise UserError(f"{archive}: member {top!r} is a file where the bundle's folder should be; refusing to unpack")
    cut = len(top) + 1 if top else 0
    inner = {rel[cut:]: m for rel, m in files.items()}
    inner_dirs = {d[cut:] for d in dirs if d != top}
    return top, inner, inner_dirs


def unpack(archive: Path, dest: Path) -> int:
    """Extract and verify ``archive`` into ``dest``; returns the number of files written."""
    tmp = dest.parent / f".{dest.name}.unpack.{os.getpid()}.{uuid.uuid4().hex[:6]}"
    try:
        with tarfile.open(archive, "r:*") as tar:
            top, files, dirs = check_members(archive, tar.getmembers())
            tmp.mkdir()
            written: dict[str, str] = {}
            for rel, member in files.items():
                written[rel] = _extract(tar, member, tmp / rel)
        try:
            manifest = read_manifest(tmp / MANIFEST)
        except UserError as exc:  # it names the temporary copy: name the archive's member instead
            raise UserError(f"{archive}: {_name(top, MANIFEST)} {str(exc).split(': ', 1)[-1]}; refusing to unpack") from None
        listed: dict[str, str] = manifest["files"]
        extra = sorted(set(written) - set(listed) - {MANIFEST})
        if extra:
            raise UserError(f"{archive}: member {_name(top, extra[0])!r} is not in its {MANIFEST}; refusing to unpack")
        stray = sorted(d for d in dirs if not any(f.startswith(d + "/") for f in listed))
        if stray:
            raise UserError(f"{archive}: folder {_name(top, stray[0])!r} is not in its {MANIFEST}; refusing to unpack")
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
    return len(files)


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> str:
    """Write one member's bytes to ``path`` (a new file, never through a link); returns their sha256."""
    src = tar.extractfile(member)
    if src is None:  # not reachable for the plain files check_members lets through
        raise UserError(f"{member.name!r}: cannot be read from the archive")
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_EXCL | O_NOFOLLOW: the file is created here, never written through something already there.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with src, os.fdopen(fd, "wb") as out:
        return sha256_stream(src.read, out.write)


def _name(top: str, rel: str) -> str:
    return f"{top}/{rel}" if top else rel


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
