"""Compiling one of the project's C++ operator libraries (``torch_ops``, ``ort_ops``) on the build machine."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from cosycompile.errors import UserError


def library_file_name(prefix: str, files: tuple[Path, ...], build: str) -> str:
    """``<prefix><digest>.so``: the digest of ``files`` (names and contents) and ``build`` (what else
    decides the binary: flags, machine, a linked library's version)."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    h.update(build.encode())
    return f"{prefix}{h.hexdigest()[:16]}.so"


def compile_library(dest: Path, command: Callable[[Path], list[str]], sources: str, needed_for: str,
                    timeout_s: int) -> Path:
    """Run ``command(out)`` (a compiler command line writing the library ``out``) into a temporary name
    beside ``dest``, then rename it to ``dest``, so a killed build leaves no half-written library.
    ``sources`` and ``needed_for`` name the library's sources and what needs them in the one-line
    errors: no compiler, a compile past ``timeout_s``, a failed compile."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    cmd = command(tmp)
    compiler = cmd[0]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise UserError(f"no C++ compiler '{compiler}' on this machine (set CXX, or install g++): {needed_for}") from None
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        raise UserError(f"compiling {sources} took more than {timeout_s} s; stopped") from None
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"compiling {sources} with {compiler} failed: {last}")
    os.replace(tmp, dest)
    return dest
