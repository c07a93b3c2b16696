"""What the rewrites of exported programs share: reading a constant, dropping the ones left unread."""

from __future__ import annotations

from typing import Any

import torch


def get_attr(gm: torch.nn.Module, dotted: str) -> torch.Tensor:
    """The tensor a ``get_attr`` node with target ``dotted`` reads."""
    obj: Any = gm
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def drop_unread(gm: torch.fx.GraphModule, names: set[str]) -> None:
    """Delete the attributes among ``names`` that no ``get_attr`` node of ``gm`` reads any more (a
    rewritten program then carries no FP32 copy of what it stores in another precision)."""
    read = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for name in names - read:
        parent, _, leaf = name.rpartition(".")
        delattr(gm.get_submodule(parent) if parent else gm, leaf)
