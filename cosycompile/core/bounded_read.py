"""Reading a file a user named: a regular file only, never more than a byte cap.

``stat`` cannot bound a read: ``/dev/zero`` and ``/proc`` files report size 0 and read forever (or
whatever they hold), and a FIFO blocks on open. So the type is checked before the file is opened
and the cap is enforced on what is read, one byte past it.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

MAX_MANIFEST_BYTES = 16 << 20  # a manifest (of a bundle, a data set) or a bundle's JSON file: kB in practice

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class BoundError(ValueError):
    """The file is not a regular file, or holds more than the cap; the message says which."""


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words ("a FIFO", "a directory", ...; "a regular file")."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def require_regular(path: Path) -> None:
    """A BoundError unless ``path`` (symbolic links followed) is a regular file: checked before it is
    opened, since opening a FIFO blocks and a device never ends. OSErrors pass through."""
    kind = kind_of(os.stat(path).st_mode)
    if kind != "a regular file":
        raise BoundError(f"is {kind}, not a regular file" if kind != "not a regular file" else kind)


def read_bytes(path: Path, limit: int, what: str) -> bytes:
    """The bytes of regular file ``path`` (symbolic links followed), at most ``limit`` of them; ``what``
    names the file's role in the message. FileNotFoundError and other OSErrors pass through."""
    require_regular(path)
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise BoundError(f"over the {limit:,}-byte limit for {what}")
    return data


def read_text(path: Path, limit: int, what: str) -> str:
    """:func:`read_bytes` decoded as UTF-8 (UnicodeDecodeError passes through)."""
    return read_bytes(path, limit, what).decode("utf-8")


def read_json(path: Path, limit: int, what: str) -> Any:
    """The JSON value in regular file ``path`` (at most ``limit`` bytes); any failure is a one-line
    UserError naming the file: missing, not a regular file, too big, not UTF-8 JSON, nested too deep."""
    from cosycompile.errors import UserError

    try:
        return json.loads(read_text(path, limit, what))
    except FileNotFoundError:
        raise UserError(f"{path}: missing ({what})") from None
    except BoundError as exc:
        raise UserError(f"{path}: {exc}") from None
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise UserError(f"{path}: not valid JSON ({str(exc)[:200] or exc.__class__.__name__})") from None
    except OSError as exc:
        raise UserError(f"{path}: unreadable ({exc.strerror or exc.__class__.__name__})") from None
