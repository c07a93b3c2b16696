"""Programs written and read back by runtime/torch_programs.py: the same program, and none of the
two warnings PyTorch prints on every save and load reaches the build's output."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from cosycompile.runtime.torch_programs import load_program, quiet, save_program


class _Shared(torch.nn.Module):
    """Two parameters that are views of one storage: what makes torch.export.save warn."""

    def __init__(self) -> None:
        super().__init__()
        whole = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        self.a = torch.nn.Parameter(whole[:2])
        self.b = torch.nn.Parameter(whole[1:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.a.T + (x @ self.b.T).sum()


def test_a_program_round_trips_without_warnings(tmp_path: Path) -> None:
    x = torch.ones(5, 4)
    program = torch.export.export(_Shared(), (x,))
    path = tmp_path / "p.pt2"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save_program(program, path)
        back = load_program(path)
    assert [str(w.message) for w in caught] == []
    assert torch.equal(back.module()(x), _Shared()(x))


def test_the_callers_warning_filters_are_left_as_they_were(tmp_path: Path) -> None:
    """The two messages are silenced inside the calls only: the caller's filters are untouched."""
    before = list(warnings.filters)
    save_program(torch.export.export(_Shared(), (torch.ones(5, 4),)), tmp_path / "p.pt2")
    load_program(tmp_path / "p.pt2")
    assert warnings.filters == before


def test_a_graph_copied_inside_quiet_prints_no_warning() -> None:
    """AOTInductor deep-copies the graph it compiles, which warned once per graph of every torch engine."""
    import copy

    import torch.utils._pytree as pytree

    _, spec = pytree.tree_flatten(((torch.ones(1),), {}))  # a program's input spec, as the copy meets it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet():
            copy.deepcopy(spec)
    assert [str(w.message) for w in caught] == []
