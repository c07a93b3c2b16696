"""Reading and writing ``torch.export`` programs (``.pt2``), the one way the build does either.

PyTorch 2.13 warns whenever it copies a program's graph (its own tree specs use a deprecated
``isinstance`` check; AOTInductor copies the graph it compiles) and on every save of a program
whose weights share storage ("No complete tensor found in the group"). Neither says anything
about the program, and both reached the build's output as a Python warning with a source line,
once per graph. :func:`quiet` silences only those two messages, and only inside its block.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

_NOISE = (
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
    (UserWarning, r"No complete tensor found in the group"),
)


@contextmanager
def quiet() -> Iterator[None]:
    """A block in which PyTorch's two warnings about program internals are not printed."""
    with warnings.catch_warnings():
        for category, message in _NOISE:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield


def load_program(path: Path) -> Any:
    """The ExportedProgram saved at ``path`` (with the operator library its dir carries registered first:
    a program that calls ``torch.ops.cosycompile.*`` does not deserialize without it)."""
    import torch

    from cosycompile.runtime.torch_ops import library_in, load_library

    library = library_in(Path(path).parent)
    if library is not None:
        load_library(library)
    with quiet():
        return torch.export.load(str(path))


def save_program(program: Any, path: Path) -> None:
    """Write ``program`` to ``path`` (a ``.pt2`` archive)."""
    import torch

    with quiet():
        torch.export.save(program, str(path))
