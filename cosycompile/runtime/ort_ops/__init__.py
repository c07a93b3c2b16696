"""The project's own ONNX Runtime operators (domain ``cosycompile``), compiled from C++ on the build machine.

Each ``*.cpp`` here holds one operator, all compiled into one library that ONNX Runtime loads with
``SessionOptions.register_custom_ops_library``:

- ``cosycompile.Snake(x, alpha, scale)``: ``x + scale * sin(alpha * x)^2`` per channel in one
  vectorized pass, in place of the Mul -> Sin -> Pow -> Mul -> Add chain whose scalar Sin dominates
  HiFT on ONNX Runtime (``backends/onnxruntime/snake.py`` rewrites the chain into it).

``ort_abi.h`` declares the part of ONNX Runtime's C ABI the library calls (the wheel has no headers).
The library links nothing but the C++ runtime and picks its loop's ISA at load time, so an engine dir
that carries it runs on any x86-64 machine. An ONNX Runtime engine whose graphs use the operators
keeps the library beside them; ``register`` adds it to the options of every session for every session over that dir.
The file name holds a digest of the sources and flags, so two engines built from the same code carry
the same library.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from cosycompile.core.files import link_or_copy
from cosycompile.runtime.native_build import compile_library, library_file_name

DOMAIN = "cosycompile"
SOURCES = tuple(sorted(Path(__file__).parent.glob("*.cpp")))
HEADERS = tuple(sorted(Path(__file__).parent.glob("*.h")))  # included by the sources, so part of the digest
FLAGS = ("-O3", "-shared", "-fPIC", "-std=c++17", "-fvisibility=hidden", "-w")
COMPILE_TIMEOUT_S = 300
PREFIX = "libcosycompile_ort_ops-"


def library_name() -> str:
    """The library's file name for these sources and flags."""
    return library_file_name(PREFIX, (*SOURCES, *HEADERS), f"{platform.machine()}|{' '.join(FLAGS)}")


def build_library(dest_dir: Path, cache_dir: Path | None = None) -> Path:
    """The compiled library in ``dest_dir`` (compiled once into ``cache_dir``/ort_ops when given, then
    linked or copied); written under a temporary name and renamed, so a killed build leaves no
    half-written library. Needs a C++ compiler (``$CXX``, else ``g++``)."""
    name = library_name()
    dest = dest_dir / name
    if dest.exists():
        return dest
    if cache_dir is not None:
        _place(build_library(cache_dir / "ort_ops"), dest)
        return dest
    compiler = os.environ.get("CXX", "g++")
    return compile_library(dest, lambda out: [compiler, *FLAGS, f"-I{Path(__file__).parent}", *map(str, SOURCES),
                                              "-o", str(out)],
                           ", ".join(s.name for s in SOURCES),
                           "ONNX Runtime's Snake operator is compiled at build time, or drop 'snake' from the "
                           "engine's rewrites", COMPILE_TIMEOUT_S)


def _place(src: Path, dest: Path) -> None:
    # Linked (or copied) under a temporary name, then renamed: no half-placed library.
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    link_or_copy(src, tmp)
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


def snake_session(library: Path, shape: list[int], alpha: Any, scale: Any, threads: int = 0) -> Any:
    """An ``onnxruntime.InferenceSession`` of one ``Snake`` node over float32 ``x`` of ``shape``, with
    ``alpha`` and ``scale`` (numpy float32) as initializers: the library checked and timed alone.
    ``threads`` is the session's intra-op thread count (0: ONNX Runtime's default)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("Snake", ["x", "alpha", "scale"], ["y"], domain=DOMAIN)
    graph = helper.make_graph([node], "snake", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              [numpy_helper.from_array(alpha, "alpha"), numpy_helper.from_array(scale, "scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    so = register(ort.SessionOptions(), library)
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
