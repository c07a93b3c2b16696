"""The project's own ONNX Runtime operators (domain ``cosycompile``), compiled from C++ on the build machine.

Each ``*.cpp`` here holds one operator, all compiled into one library that ONNX Runtime loads with
``SessionOptions.register_custom_ops_library``:

- ``cosycompile.Snake(x, alpha, scale)``: ``x + scale * sin(alpha * x)^2`` per channel in one
  vectorized pass, in place of the Mul -> Sin -> Pow -> Mul -> Add chain whose scalar Sin dominates
  HiFT on ONNX Runtime (``backends/onnxruntime/snake.py`` rewrites the chain into it).

``ort_abi.h`` declares the part of ONNX Runtime's C ABI the library calls (the wheel has no headers).
The library links nothing but the C++ runtime and picks its loop's ISA at load time, so an engine dir
that carries it runs on any x86-64 machine. An ONNX Runtime engine whose graphs use the operators
keeps the library beside them; ``session_options_for`` registers it for every session over that dir.
The file name holds a digest of the sources and flags, so two engines built from the same code carry
the same library.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

from cosycompile.errors import UserError

DOMAIN = "cosycompile"
SOURCES = tuple(sorted(Path(__file__).parent.glob("*.cpp")))
HEADERS = tuple(sorted(Path(__file__).parent.glob("*.h")))  # included by the sources, so part of the digest
FLAGS = ("-O3", "-shared", "-fPIC", "-std=c++17", "-fvisibility=hidden", "-w")
COMPILE_TIMEOUT_S = 300
PREFIX = "libcosycompile_ort_ops-"


def library_name() -> str:
    """The library's file name for these sources and flags."""
    h = hashlib.sha256()
    for source in (*SOURCES, *HEADERS):
        h.update(source.name.encode() + b"\0" + source.read_bytes())
    h.update(f"{platform.machine()}|{' '.join(FLAGS)}".encode())
    return f"{PREFIX}{h.hexdigest()[:16]}.so"


def build_library(dest_dir: Path, cache_dir: Path | None = None) -> Path:
    """The compiled library in ``dest_dir`` (compiled once into ``cache_dir`` when given, then copied);
    written under a temporary name and renamed, so a killed build leaves no half-written library.
    Needs a C++ compiler (``$CXX``, else ``g++``)."""
    name = library_name()
    dest = dest_dir / name
    if dest.exists():
        return dest
    if cache_dir is not None and dest_dir != cache_dir:
        _place(build_library(cache_dir), dest)
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{name}.{os.getpid()}.tmp")
    compiler = os.environ.get("CXX", "g++")
    cmd = [compiler, *FLAGS, f"-I{Path(__file__).parent}", *map(str, SOURCES), "-o", str(tmp)]
    names = ", ".join(s.name for s in SOURCES)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except FileNotFoundError:
        raise UserError(f"no C++ compiler '{compiler}' on this machine: ONNX Runtime's Snake operator is compiled "
                        "at build time (set CXX, install g++, or drop 'snake' from the engine's rewrites)") from None
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        raise UserError(f"compiling {names} took more than {COMPILE_TIMEOUT_S} s; stopped") from None
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"compiling {names} with {compiler} failed: {last}")
    os.replace(tmp, dest)
    return dest


def _place(src: Path, dest: Path) -> None:
    # A hard link where the two dirs share a file system, a copy elsewhere; renamed into place either way.
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


def library_in(directory: Path) -> Path | None:
    """The operator library an engine dir carries, if any."""
    found = sorted(directory.glob(f"{PREFIX}*.so"))
    return found[0] if found else None


def register(so: Any, library: Path | None) -> Any:
    """``so`` (an ``onnxruntime.SessionOptions``) with ``library``'s operators registered, when given."""
    if library is not None:
        so.register_custom_ops_library(str(library))
    return so
