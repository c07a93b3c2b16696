"""Read a CosyVoice ``cosyvoice2.yaml`` without constructing anything it names.

The file is hyperpyyaml: ``!new:module.Class`` / ``!name:`` / ``!apply:`` tags would import and call
arbitrary code under hyperpyyaml. Here every tag becomes inert data (:class:`Tagged`), and only
``!ref <key>`` references (with simple arithmetic such as ``<a> * <b>``) are resolved.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import ModelError


@dataclass
class Tagged:
    """An inert ``!kind:target`` node and its arguments."""

    kind: str
    target: str
    value: Any = field(default=None)


@dataclass
class Ref:
    expr: str


class _InertLoader(yaml.SafeLoader):
    pass


def _multi(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    kind, _, target = suffix.partition(":")
    if isinstance(node, yaml.MappingNode):
        value: Any = loader.construct_mapping(node, deep=True)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_scalar(node)
    if kind == "ref":
        return Ref(str(value))
    return Tagged(kind, target, value)


_InertLoader.add_multi_constructor("!", _multi)

_REF = re.compile(r"<([^<>]+)>")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.USub: operator.neg}


def _arith(expr: str) -> Any:
    """Evaluate numbers with + - * / only (never eval)."""

    def ev(n: ast.AST) -> Any:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)):
            return n.value
        if isinstance(n, ast.BinOp) and type(n.op) in _OPS:
            return _OPS[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and type(n.op) in _OPS:
            return _OPS[type(n.op)](ev(n.operand))
        raise ValueError(expr)

    return ev(ast.parse(expr, mode="eval"))


def _lookup(root: dict[str, Any], dotted: str) -> Any:
    node: Any = root
    for part in dotted.split("."):
        node = node.value if isinstance(node, Tagged) else node
        node = node[part]
    return node


def _resolve(node: Any, root: dict[str, Any], depth: int = 0) -> Any:
    if depth > 20:
        raise ValueError("reference chain too deep")
    if isinstance(node, Ref):
        names = _REF.findall(node.expr)
        if len(names) == 1 and node.expr.strip() == f"<{names[0]}>":
            return _resolve(_lookup(root, names[0]), root, depth + 1)
        text = _REF.sub(lambda m: repr(_resolve(_lookup(root, m.group(1)), root, depth + 1)), node.expr)
        try:
            return _arith(text)
        except (ValueError, SyntaxError):
            return text
    if isinstance(node, Tagged):
        return Tagged(node.kind, node.target, _resolve(node.value, root, depth))
    if isinstance(node, dict):
        return {k: _resolve(v, root, depth) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, root, depth) for v in node]
    return node


def read_cosyvoice_yaml(path: Path) -> dict[str, Any]:
    """The yaml as plain data with :class:`Tagged` nodes; refs resolved where they point to plain values."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelError(f"{path}: model config not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: cannot read model config ({exc})") from None
    try:
        data = yaml.load(text, Loader=_InertLoader)  # noqa: S506 - the loader is SafeLoader-derived and inert
    except yaml.YAMLError as exc:
        raise ModelError(f"{path}: malformed YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path}: expected a mapping at the top level")
    try:
        return _resolve(data, data)
    except (KeyError, ValueError, TypeError) as exc:
        raise ModelError(f"{path}: unresolvable !ref ({exc})") from None


def args(node: Any) -> dict[str, Any]:
    """Constructor arguments of a ``!new:`` node (or the mapping itself)."""
    if isinstance(node, Tagged):
        return node.value if isinstance(node.value, dict) else {}
    return node if isinstance(node, dict) else {}
