"""Bounds on YAML input (recipes, model configs): size, nesting and alias expansion.

PyYAML composes an alias as a second reference to the same node, so a "billion laughs" document
(9 levels of 9 aliases) composes in microseconds and only explodes when something walks it as a
tree. The expanded size is computed here on the node graph, once per distinct node, before any
walk, so such a file is refused in bounded time and memory.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

MAX_BYTES = 1 << 20  # 1 MiB: a recipe or model config is a few kB
MAX_VALUES = 100_000  # scalars + collections after alias expansion
MAX_DEPTH = 64


class YAMLLimitError(ValueError):
    """The document is over a bound; the message says which."""


def read_text(path: Path) -> str:
    """The file as UTF-8 text: a regular file of at most :data:`MAX_BYTES` (counted as read)."""
    from cosycompile.core.bounded_read import BoundError, read_text

    try:
        return read_text(path, MAX_BYTES, "a YAML file")
    except BoundError as exc:
        raise YAMLLimitError(str(exc)) from None


def compose(loader: yaml.SafeLoader) -> yaml.Node | None:
    """Compose the loader's single document and check its bounds (nesting, expanded size)."""
    limit = sys.getrecursionlimit()
    try:
        # The composer recurses once per nesting level: a deep document must fail as a bound, not
        # as a RecursionError somewhere else.
        sys.setrecursionlimit(max(limit, 4 * MAX_DEPTH + 200))
        node = loader.get_single_node()
    except RecursionError:
        raise YAMLLimitError(f"nested more than {MAX_DEPTH} levels deep") from None
    finally:
        sys.setrecursionlimit(limit)
    if node is not None:
        check_node(node)
    return node


def check_node(root: yaml.Node) -> None:
    """Raise :class:`YAMLLimitError` if ``root`` nests deeper than :data:`MAX_DEPTH` or expands
    (aliases followed) to more than :data:`MAX_VALUES` values."""
    sizes: dict[int, int] = {}
    # Iterative post-order walk over distinct nodes: (node, depth, children visited?).
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    on_path: set[int] = set()
    while stack:
        node, depth, done = stack.pop()
        if depth > MAX_DEPTH:
            raise YAMLLimitError(f"nested more than {MAX_DEPTH} levels deep (line {node.start_mark.line + 1})")
        kids = _children(node)
        if done:
            on_path.discard(id(node))
            total = 1 + sum(sizes[id(k)] for k in kids)
            if total > MAX_VALUES:
                raise YAMLLimitError(f"expands to more than {MAX_VALUES:,} values (line {node.start_mark.line + 1}; "
                                     "YAML aliases repeated inside aliases?)")
            sizes[id(node)] = total
            continue
        if id(node) in sizes:
            continue
        if id(node) in on_path:
            raise YAMLLimitError(f"refers to itself (line {node.start_mark.line + 1})")
        on_path.add(id(node))
        stack.append((node, depth, True))
        stack.extend((k, depth + 1, False) for k in kids if id(k) not in sizes)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []
