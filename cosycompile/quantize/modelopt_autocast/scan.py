"""Find the constants of an ONNX graph whose reciprocal overflows FP16, and clamp them.

HiFT's Snake is ``x + 1/(alpha + 1e-9) * sin(alpha x)^2`` with a learned ``alpha`` per channel. How it
reaches the graph depends on the exporter and the simplifier:

- folded (the TorchScript exporter's constant folding, what cosycompile exports): the reciprocal is an
  initializer ``R = 1/(alpha + 1e-9)`` multiplied into ``Pow(Sin(Mul(x, alpha)), 2)``; an alpha of
  exactly 1 is folded away entirely (onnxslim drops ``Mul(x, 1)``);
- live: ``Div(1, Add(Unsqueeze(alpha), eps))`` or ``Reciprocal(...)`` computed at run time, or
  ``Div(sin^2, alpha)``.

Both are found: Snakes by their ``Sin -> square -> Mul(R, .)`` shape, and every ``Div`` denominator or
``Reciprocal`` input that traces back through value-preserving ops (reshapes, casts, adding a tiny
epsilon) to a constant. Elements with ``|alpha| < alpha_min`` (``|R| > 1/alpha_min``) are hazards.
Other constants above 65504 are only listed: AutoCast keeps their consumers in FP32 (``init_max``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FP16_MAX = 65504.0
# Ops through which a constant's values reach a consumer unchanged (only their first input is data).
_PASS_THROUGH = {"Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Cast"}
# An Add of a constant this small in the chain is the ``+ eps`` that guards a division.
_EPS_MAX = 1e-6


@dataclass
class Hazard:
    """A constant whose reciprocal the graph uses, with the elements whose reciprocal overflows FP16."""

    kind: str  # "snake": a Snake's 1/alpha; "divisor": any other constant the graph divides by
    layer: str  # ONNX name scope of the consuming node, e.g. "/resblocks.1/activations1.0"
    module: str  # the PyTorch module path recovered from it, e.g. "resblocks.1.activations1.0"
    constant: str  # the initializer (or Constant node output) holding the values
    reciprocal: bool  # the constant holds 1/alpha (folded Snake) rather than alpha
    index: list[int]  # flat indices of the overflowing elements
    alphas: list[float]  # their alpha (divisor) values
    nodes: list[str]  # nodes that see the overflowing values: all kept FP32 means no overflow
    eps: float = 0.0  # the ``+ eps`` added to a live alpha before the division
    partners: list[tuple[str, str]] = field(default_factory=list)  # (constant, reading node): the Snake's
    # sin-side alpha, clamped with it

    def describe(self) -> dict[str, Any]:
        """JSON for graphs.json and the step's metadata."""
        return {"kind": self.kind, "layer": self.layer, "module": self.module, "constant": self.constant,
                "channels": self.index, "alphas": self.alphas, "nodes": self.nodes,
                "partners": [c for c, _ in self.partners]}


class _Graph:
    """Producers, consumers and constant values of an ONNX graph (top level; subgraphs are not scanned)."""

    def __init__(self, model: Any) -> None:
        from onnx import numpy_helper

        g = model.graph
        self.model = model
        self.inits = {i.name: i for i in g.initializer}
        self.const_nodes = {n.output[0]: n for n in g.node if n.op_type == "Constant" and n.output}
        self.producer = {o: n for n in g.node for o in n.output}
        self.consumers: dict[str, list[Any]] = {}
        for n in g.node:
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(n)
        self._np = numpy_helper

    def value(self, name: str) -> np.ndarray | None:
        """A constant's value (initializer or Constant node), or None for a computed tensor."""
        if name in self.inits:
            return self._np.to_array(self.inits[name])
        node = self.const_nodes.get(name)
        if node is not None:
            for a in node.attribute:
                if a.name == "value":
                    return self._np.to_array(a.t)
        return None

    def set_value(self, name: str, arr: np.ndarray) -> None:
        """Replace a constant's value in place (same name, dtype and shape)."""
        tensor = self._np.from_array(arr.astype(self.value(name).dtype), name)
        if name in self.inits:
            self.inits[name].CopyFrom(tensor)
            return
        for a in self.const_nodes[name].attribute:
            if a.name == "value":
                a.t.CopyFrom(tensor)

    def private_copy(self, name: str, consumer: Any) -> str:
        """``name`` if ``consumer`` is its only reader, else a new initializer only ``consumer`` reads
        (simplifiers share equal constants; clamping must not reach an unrelated node)."""
        if len(self.consumers.get(name, [])) <= 1:
            return name
        new = f"{name}__fp16_clamped"
        k = 1
        while new in self.inits or new in self.producer:
            k += 1
            new = f"{name}__fp16_clamped{k}"
        self.model.graph.initializer.append(self._np.from_array(self.value(name), new))
        self.inits = {i.name: i for i in self.model.graph.initializer}
        for j, i in enumerate(consumer.input):
            if i == name:
                consumer.input[j] = new
        self.consumers[name] = [n for n in self.consumers[name] if n is not consumer]
        self.consumers[new] = [consumer]
        return new

    def trace_constant(self, name: str) -> tuple[str, float] | None:
        """(constant, eps) whose values reach ``name`` through pass-through ops and ``+ eps``, or None."""
        eps = 0.0
        for _ in range(16):  # chains are a few ops long; bound the walk on odd graphs
            if self.value(name) is not None:
                return name, eps
            node = self.producer.get(name)
            if node is None:
                return None
            if node.op_type in _PASS_THROUGH:
                name = node.input[0]
            elif node.op_type == "Add" and len(node.input) == 2:
                consts = [self.value(i) for i in node.input]
                small = [i for i, v in enumerate(consts)
                         if v is not None and v.size == 1 and abs(float(v.ravel()[0])) <= _EPS_MAX]
                if not small:
                    return None
                eps += float(consts[small[0]].ravel()[0])
                name = node.input[1 - small[0]]
            else:
                return None
        return None


def scope(node_name: str) -> tuple[str, str]:
    """(ONNX name scope, PyTorch module path) of a node: ``/resblocks.1/activations1.0/Mul_2`` ->
    (``/resblocks.1/activations1.0``, ``resblocks.1.activations1.0``); names without scopes stay as they are."""
    if "/" not in node_name.strip("/"):
        return node_name, node_name
    layer = node_name.rsplit("/", 1)[0]
    return layer, ".".join(p for p in layer.split("/") if p)


def _module_of(constant: str, node_name: str) -> tuple[str, str]:
    layer, module = scope(node_name)
    # A live alpha keeps its parameter name (``hift.resblocks.1.activations1.0.alpha``): the better path.
    if constant.endswith(".alpha"):
        module = constant[: -len(".alpha")]
    return layer, module


def _square_of(g: _Graph, sin_out: str) -> list[str]:
    """Outputs that square ``sin_out``: ``Pow(s, 2)`` or ``Mul(s, s)``."""
    out = []
    for n in g.consumers.get(sin_out, []):
        if n.op_type == "Pow" and n.input[0] == sin_out:
            e = g.value(n.input[1])
            if e is not None and e.size == 1 and float(e.ravel()[0]) == 2.0:
                out.append(n.output[0])
        elif n.op_type == "Mul" and n.input[0] == n.input[1] == sin_out:
            out.append(n.output[0])
    return out


def _sin_alpha(g: _Graph, sin: Any) -> tuple[str, str] | None:
    """(constant alpha, the Mul reading it) of ``Sin(Mul(x, alpha))``, if the Sin's argument has one."""
    p = g.producer.get(sin.input[0])
    if p is None or p.op_type != "Mul":
        return None
    for i in p.input:
        if g.value(i) is not None:  # read directly: a private copy can be made for this Mul alone
            return i, p.name
    return None


def find_hazards(model: Any, alpha_min: float) -> tuple[list[Hazard], list[tuple[str, float]]]:
    """(hazards, other constants above 65504 as (name, max |value|)) of ``model``."""
    g = _Graph(model)
    hazards: list[Hazard] = []
    seen: set[tuple[str, str]] = set()

    def flag(kind: str, node: Any, constant: str, eps: float, reciprocal: bool, nodes: list[str],
             partners: list[tuple[str, str]]) -> None:
        if (constant, node.name) in seen:
            return
        seen.add((constant, node.name))
        v = g.value(constant).astype(np.float64).ravel()
        with np.errstate(divide="ignore"):
            alpha = 1.0 / v if reciprocal else v + eps
        bad = np.flatnonzero(~(np.abs(alpha) >= alpha_min))  # NaN counts as bad
        if bad.size:
            layer, module = _module_of(constant, node.name)
            hazards.append(Hazard(kind, layer, module, constant, reciprocal, bad.tolist(),
                                  [float(a) for a in alpha[bad]], nodes, eps, partners))

    snake_muls: set[str] = set()
    for sin in (n for n in model.graph.node if n.op_type == "Sin"):
        partner = _sin_alpha(g, sin)
        for sq in _square_of(g, sin.output[0]):
            for mul in g.consumers.get(sq, []):
                if mul.op_type == "Mul":
                    other = mul.input[1] if mul.input[0] == sq else mul.input[0]
                    t = g.trace_constant(other)
                    if t is not None:  # folded: R = 1/(alpha + eps) * sin^2
                        snake_muls.add(mul.name)
                        flag("snake", mul, t[0], 0.0, True, [mul.name], [partner] if partner else [])
                    else:  # live: 1/(alpha + eps) computed by a Div/Reciprocal below
                        p = g.producer.get(other)
                        if p is not None and p.op_type in ("Div", "Reciprocal"):
                            snake_muls.add(p.name)
                elif mul.op_type == "Div" and mul.input[0] == sq:  # sin^2 / alpha
                    snake_muls.add(mul.name)
    for node in model.graph.node:
        if node.op_type not in ("Div", "Reciprocal"):
            continue
        t = g.trace_constant(node.input[1] if node.op_type == "Div" else node.input[0])
        if t is None:
            continue
        kind = "snake" if node.name in snake_muls else "divisor"
        nodes = [node.name] + [c.name for c in g.consumers.get(node.output[0], [])]
        flag(kind, node, t[0], t[1], False, nodes, [])

    hazardous = {h.constant for h in hazards}
    large = []
    for name in [*g.inits, *g.const_nodes]:
        v = g.value(name)
        if v is not None and v.dtype.kind == "f" and v.size and name not in hazardous:
            m = float(np.max(np.abs(v.astype(np.float64))))
            if not m <= FP16_MAX:
                large.append((name, m))
    return hazards, large


def clamp(model: Any, hazards: list[Hazard], alpha_min: float) -> None:
    """Clamp every hazard in place: ``|alpha| -> alpha_min`` keeping the sign (``|1/alpha| -> 1/alpha_min``
    for folded reciprocals, and the Snake's sin-side alpha with it, so the Snake stays one function)."""
    g = _Graph(model)
    nodes = {n.name: n for n in model.graph.node}
    for h in hazards:
        name = h.constant
        if h.reciprocal and name in nodes[h.nodes[0]].input:  # folded Snake R read by its Mul: copy if shared
            name = g.private_copy(name, nodes[h.nodes[0]])
            h.constant = name
        v = g.value(name).copy()
        flat = v.reshape(-1)
        sign = np.where(flat[h.index] < 0, -1.0, 1.0)  # 0 and NaN become +
        # A hair beyond alpha_min so float32 storage (and a live ``+ eps``) cannot land back below it.
        target = alpha_min * (1 + 1e-6)
        flat[h.index] = sign / target if h.reciprocal else sign * target - h.eps
        g.set_value(name, v)
        for p, reader in h.partners:
            pv = g.value(p)
            if pv is None or pv.size != v.size:  # not a per-channel alpha like R: leave it
                continue
            p = g.private_copy(p, nodes[reader])
            pv = g.value(p).copy()
            pf = pv.reshape(-1)
            small = np.flatnonzero(~(np.abs(pf) >= alpha_min))
            pf[small] = np.where(pf[small] < 0, -1.0, 1.0) * alpha_min * (1 + 1e-6)
            g.set_value(p, pv)


def keep_fp32_covers(h: Hazard, patterns: list[str]) -> bool:
    """Whether the recipe's ``keep_fp32`` keeps every node that sees the overflowing values in FP32."""
    return bool(patterns) and all(any(re.search(p, n) for p in patterns) for n in h.nodes)
