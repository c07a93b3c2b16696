"""The project's own PyTorch operators (``torch.ops.cosycompile.*``), compiled from C++ on the build machine.

Each ``*.cpp`` here holds one operator, all compiled into one library:

- ``cosycompile::int8_linear(x, w_q, w_scale, bias)``: a linear with INT8 weights per output channel and
  the input quantized per row at run time, the arithmetic of torch_dynamic's ``int8_linear`` in one call;
- ``cosycompile::int8_attention(q, k, v, attn_mask, scale)``: ``scaled_dot_product_attention`` with INT8
  products, the arithmetic of torch_dynamic's composite ``int8_attention`` in one call.

Each source says why it exists; ``vnni.h`` holds what their AVX512-VNNI kernels share. Beside each, for
tests and benchmarks, ``<op>_kernels()`` names the kernels this CPU can run and ``<op>_with(..., kernel)``
runs one of them.

A program that calls them needs the compiled library in every process that loads or runs it, so the
library travels with the programs: the quantize step that writes such a program builds it into its
output dir (:func:`build_library`), the torch backend links it into the engine dir beside the
packages, and :func:`load_library` registers it before a program or package is read. The file name
holds a digest of the sources, the torch version and the flags, so two engine dirs built from the same
code carry the same library, and a process refuses a second, different one.
"""

from __future__ import annotations

import os
import platform
import threading
from pathlib import Path

from cosycompile.errors import UserError
from cosycompile.runtime.native_build import compile_library, library_file_name

SOURCES = tuple(sorted(Path(__file__).parent.glob("*.cpp")))
HEADERS = tuple(sorted(Path(__file__).parent.glob("*.h")))  # included by the sources, so part of the digest
# Whatever the build machine, the library is generic x86-64 code; the AVX512-VNNI and AVX2 kernels are
# compiled for their own ISA (target attributes) and run only where the CPU reports it. No contraction
# into FMAs: the operators round as the ATen composites they replace, so that an 8-bit probability
# on a rounding edge lands where the composite puts it, whatever ISA a kernel is compiled for.
FLAGS = ("-O3", "-shared", "-fPIC", "-std=c++20", "-fopenmp", "-w", "-ffp-contract=off")
COMPILE_TIMEOUT_S = 600
NAMES = ", ".join(source.name for source in SOURCES)

_lock = threading.Lock()
_loaded: dict[str, Path] = {}  # library file name -> where it was loaded from


def library_name() -> str:
    """The library's file name for this source, torch version and set of flags."""
    import torch

    return library_file_name("libcosycompile_ops-", (*SOURCES, *HEADERS),
                             f"{torch.__version__}|{platform.machine()}|{' '.join(FLAGS)}")


def build_library(dest_dir: Path) -> Path:
    """Compile the operators into ``dest_dir`` (written under a temporary name, then renamed, so a
    killed build leaves no half-written library); returns its path. Needs a C++ compiler (``$CXX``,
    else ``g++``), as AOTInductor does."""
    dest = dest_dir / library_name()
    if dest.exists():
        return dest
    return compile_library(dest, lambda out: compile_command(SOURCES, out), NAMES,
                           "the torch backend's INT8 operator is compiled at build time", COMPILE_TIMEOUT_S)


def compile_command(sources: tuple[Path, ...], out: Path) -> list[str]:
    """The compiler command that builds ``sources`` into the shared library ``out`` against this torch."""
    import torch
    from torch.utils import cpp_extension

    return [os.environ.get("CXX", "g++"), *FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            *(f"-I{p}" for p in cpp_extension.include_paths()), *map(str, sources), "-o", str(out),
            *(f"-L{p}" for p in cpp_extension.library_paths()), "-ltorch", "-ltorch_cpu", "-lc10"]


def load_library(path: Path) -> None:
    """Register the operators of the library at ``path`` in this process (once; the same library again
    is a no-op, a different one an error, since an operator can be registered only once)."""
    import torch

    with _lock:
        if path.name in _loaded:
            return
        if _loaded:
            other = next(iter(_loaded.values()))
            raise UserError(f"{path}: this process already runs cosycompile's operators from {other}, built from "
                            "other code; rebuild the engines with one version of cosycompile")
        torch.ops.load_library(str(path))
        _register_fake()
        _loaded[path.name] = path


def library_in(directory: Path) -> Path | None:
    """The operator library a graphs or engine dir carries, if any."""
    found = sorted(directory.glob("libcosycompile_ops-*.so"))
    return found[0] if found else None


def _register_fake() -> None:
    import torch

    @torch.library.register_fake("cosycompile::int8_linear")
    def _int8_linear_shape(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                           bias: torch.Tensor | None) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], w_q.shape[0]))

    @torch.library.register_fake("cosycompile::int8_attention")
    def _int8_attention_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
                              scale: float) -> torch.Tensor:
        return q.new_empty(q.shape)
