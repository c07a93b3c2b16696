"""Reading a file a user named: a regular file only, never more than a byte cap.

``stat`` cannot bound a read: ``/dev/zero`` and ``/proc`` files report size 0 and read forever (or
whatever they hold), and a FIFO blocks on open. So the type is checked before the file is opened
and the cap is enforced on what is read, one byte past it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class BoundError(ValueError):
    """The file is not a regular file, or holds more than the cap; the message says which."""


def read_bytes(path: Path, limit: int, what: str) -> bytes:
    """The bytes of regular file ``path`` (symbolic links followed), at most ``limit`` of them; ``what``
    names the file's role in the message. FileNotFoundError and other OSErrors pass through."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise BoundError(f"is {kind}, not a regular file" if kind != "not a regular file" else kind)
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise BoundError(f"over the {limit:,}-byte limit for {what}")
    return data


def read_text(path: Path, limit: int, what: str) -> str:
    """:func:`read_bytes` decoded as UTF-8 (UnicodeDecodeError passes through)."""
    return read_bytes(path, limit, what).decode("utf-8")
