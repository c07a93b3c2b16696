"""YAML loading that remembers where every key came from (file and line).

Recipes are user input; an error has to point at the line to fix. PyYAML's composer gives
us node marks, so we build plain Python data and a side table ``path -> (file, line)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cosycompile.core import yaml_limits
from cosycompile.errors import RecipeError

KeyPath = tuple[str | int, ...]


@dataclass
class Located:
    """Plain YAML data plus the source location of every mapping key and sequence item."""

    data: Any
    lines: dict[KeyPath, tuple[str, int]] = field(default_factory=dict)

    def where(self, path: KeyPath) -> str:
        """Best location for ``path``: the deepest prefix that has one, as ``file:line``."""
        for n in range(len(path), -1, -1):
            hit = self.lines.get(tuple(path[:n]))
            if hit:
                return f"{hit[0]}:{hit[1]}"
        return "<recipe>"


class _StrictLoader(yaml.SafeLoader):
    """Safe loader that rejects duplicate keys (a silent override is a classic recipe bug)."""


# Plain YAML data only: any explicit tag (``!foo``, ``!!python/object/apply:...``) is refused, on
# collections as well as scalars, rather than silently read as the untagged value.
_PLAIN_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("map", "seq", "str", "int", "float", "bool", "null")}
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
# Numbers as a reader of the recipe would take them: YAML 1.1 also reads 010 as 8, 0x10 as 16 and
# 1:30 as 90, and .nan / .inf as floats that pass or switch off every comparison.
_DECIMAL_INT = re.compile(r"[-+]?(0|[1-9][0-9_]*)")
_DECIMAL_FLOAT = re.compile(r"[-+]?([0-9][0-9_]*)?\.[0-9_]*([eE][-+][0-9]+)?")


def _construct(node: yaml.Node, path: KeyPath, src: str, lines: dict[KeyPath, tuple[str, int]]) -> Any:
    lines.setdefault(path, (src, node.start_mark.line + 1))
    if node.tag not in _PLAIN_TAGS:
        raise RecipeError(f"{src}:{node.start_mark.line + 1}: {_dotted(path)}: YAML tag '{node.tag}' is not "
                          "allowed in recipes (plain mappings, lists, strings and numbers only)")
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise RecipeError(f"{src}:{key_node.start_mark.line + 1}: mapping keys must be plain strings")
            key = key_node.value
            if key in out:
                raise RecipeError(f"{src}:{key_node.start_mark.line + 1}: duplicate key '{_dotted(path + (key,))}'")
            lines[path + (key,)] = (src, key_node.start_mark.line + 1)
            out[key] = _construct(value_node, path + (key,), src, lines)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, path + (i,), src, lines) for i, item in enumerate(node.value)]
    text = str(node.value)
    if node.tag == _INT and not _DECIMAL_INT.fullmatch(text):
        raise RecipeError(f"{src}:{node.start_mark.line + 1}: {_dotted(path)}: '{text}' is a YAML 1.1 hex, octal, "
                          "binary or base-60 number; write it in decimal (or quote it as a string)")
    if node.tag == _FLOAT and not _DECIMAL_FLOAT.fullmatch(text):
        raise RecipeError(f"{src}:{node.start_mark.line + 1}: {_dotted(path)}: '{text}' is not a finite decimal number "
                          "(NaN, infinities and base-60 numbers are not recipe values)")
    return _StrictLoader("").construct_object(node, deep=True)


def _dotted(path: KeyPath) -> str:
    return ".".join(str(p) for p in path) if path else "<top level>"


def load_located(path: Path) -> Located:
    """Parse one YAML file into :class:`Located`; any syntax problem is a one-line RecipeError."""
    src = str(path)
    try:
        text = yaml_limits.read_text(path)
    except FileNotFoundError:
        raise RecipeError(f"{src}: recipe file not found") from None
    except yaml_limits.YAMLLimitError as exc:
        raise RecipeError(f"{src}: not a recipe: {exc}") from None
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{src}: not UTF-8 text (byte {exc.start}); a recipe is a UTF-8 YAML file") from None
    except OSError as exc:
        raise RecipeError(f"{src}: cannot read recipe ({exc.__class__.__name__}: {exc})") from None
    try:
        loader = _StrictLoader(text)  # its reader refuses control characters here, before composing
    except yaml.YAMLError as exc:
        raise RecipeError(f"{src}: malformed YAML: {str(exc).splitlines()[0]}") from None
    try:
        node = yaml_limits.compose(loader)
    except yaml_limits.YAMLLimitError as exc:
        raise RecipeError(f"{src}: not a recipe: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        raise RecipeError(f"{src}:{line}: malformed YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{src}: malformed YAML: {exc}") from None
    finally:
        loader.dispose()
    lines: dict[KeyPath, tuple[str, int]] = {}
    if node is None:
        return Located({}, {(): (src, 1)})
    data = _construct(node, (), src, lines)
    if not isinstance(data, dict):
        raise RecipeError(f"{src}:1: a recipe must be a mapping of keys, got {type(data).__name__}")
    return Located(data, lines)


def merge(base: Located, child: Located) -> Located:
    """Deep-merge ``child`` over ``base`` (mappings merge, everything else replaces)."""
    lines = dict(base.lines)

    def walk(b: Any, c: Any, path: KeyPath) -> Any:
        if isinstance(b, dict) and isinstance(c, dict):
            out = dict(b)
            for k, v in c.items():
                out[k] = walk(b[k], v, path + (k,)) if k in b else v
                if k not in b:
                    _copy_lines(child.lines, lines, path + (k,))
                elif not (isinstance(b[k], dict) and isinstance(v, dict)):
                    _drop_lines(lines, path + (k,))
                    _copy_lines(child.lines, lines, path + (k,))
                else:
                    lines[path + (k,)] = child.lines.get(path + (k,), lines.get(path + (k,), ("<recipe>", 0)))
            return out
        return c

    data = walk(base.data, child.data, ())
    return Located(data, lines)


def _copy_lines(src: dict[KeyPath, tuple[str, int]], dst: dict[KeyPath, tuple[str, int]], prefix: KeyPath) -> None:
    n = len(prefix)
    for k, v in src.items():
        if k[:n] == prefix:
            dst[k] = v


def _drop_lines(dst: dict[KeyPath, tuple[str, int]], prefix: KeyPath) -> None:
    n = len(prefix)
    for k in [k for k in dst if k[:n] == prefix]:
        del dst[k]
