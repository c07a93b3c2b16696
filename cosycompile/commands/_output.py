"""Checks on what a command's ``--out`` / ``-o`` names, made before any work and again before the rename.

An output is written next to its target and renamed into place, so the target is replaced only by a
complete file. That rename would as readily replace a device node, a FIFO or a file of a bundle or
of the cache as a plain file: ``--out /dev/null`` run as root would destroy the device, and
``--out BUNDLE/manifest.json`` would overwrite the manifest every later check trusts. So a target
that exists must be a plain file (not a link), and no target may lie inside a bundle or a cache.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cosycompile.errors import UserError

# A bundle folder holds both (exporters/bundle writes them; `unpack` keeps them): manifest.json alone
# is too common a name to mark one.
_BUNDLE_MARKS = ("manifest.json", "recipe.json")
# A cache folder (cache/local.py's Store) holds these folders.
_CACHE_MARKS = ("objects", "locks")

_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"))


def kind_of(mode: int) -> str:
    """What a file of ``mode`` (from ``os.lstat``) is, in words."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a plain file" if stat.S_ISREG(mode) else "not a plain file"


def _guarded_by(folder: Path) -> str | None:
    """'a bundle' or 'the cache' when ``folder`` or one of its parents is one, else None."""
    for d in (folder, *folder.parents):
        if all((d / m).is_file() for m in _BUNDLE_MARKS):
            return f"the bundle {d}"
        if all((d / m).is_dir() for m in _CACHE_MARKS):
            return f"the cache {d}"
    return None


def _lstat(path: Path, flag: str) -> os.stat_result | None:
    """``path``'s own status (a link is not followed), None when nothing is there."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot check the output ({exc.strerror or exc})") from None


def check_out_file(path: Path, flag: str = "--out", hint: str = "give a new or plain file's path") -> None:
    """Refuse ``path`` as an output file unless it is absent or a plain file, in an existing folder
    outside every bundle and cache; one-line :class:`UserError` naming ``flag`` otherwise.

    Checked with ``lstat`` so a symbolic link is refused as such, never followed to a device.
    """
    st = _lstat(path, flag)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UserError(f"{flag} {path}: is {kind_of(st.st_mode)}, not a plain file; refusing to replace it ({hint})")
    parent = path.parent
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: its folder does not exist")
    guard = _guarded_by(parent.resolve())
    if guard is not None:
        raise UserError(f"{flag} {path}: inside {guard}, whose files are checked against their digests; "
                        f"write the output elsewhere")


def check_out_dir(path: Path, flag: str = "--out", need_parent: bool = True) -> None:
    """Refuse ``path`` as an output folder unless it is absent or an empty folder (not a link), with an
    existing parent (unless not ``need_parent``: the command creates it), outside every bundle and
    cache; one-line :class:`UserError` naming ``flag`` otherwise."""
    st = _lstat(path, flag)
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise UserError(f"{flag} {path}: is {kind_of(st.st_mode)}; give a new or empty folder")
        if any(path.iterdir()):
            raise UserError(f"{flag} {path}: output exists and is not an empty folder")
    if need_parent and not path.parent.is_dir():
        raise UserError(f"{flag} {path}: its parent folder does not exist")
    existing = next((d for d in path.absolute().parents if d.is_dir()), Path("/"))
    guard = _guarded_by(existing.resolve())
    if guard is not None:
        raise UserError(f"{flag} {path}: inside {guard}, whose files are checked against their digests; "
                        f"write the output elsewhere")
