"""Producer/consumer lookups and node splicing shared by the backend's graph rewrites."""

from __future__ import annotations

from typing import Any


def attr(node: Any, name: str, default: Any = None) -> Any:
    """The value of ``node``'s attribute ``name``, else ``default``."""
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


class GraphIndex:
    """Producer/consumer lookups over one GraphProto."""

    def __init__(self, graph: Any) -> None:
        from onnx import numpy_helper

        self.graph = graph
        self.producer = {o: n for n in graph.node for o in n.output}
        self.consumers: dict[str, list[Any]] = {}
        for n in graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.outputs = {o.name for o in graph.output}
        self._init = {i.name: i for i in graph.initializer}
        self._to_array = numpy_helper.to_array

    def const(self, name: str) -> list[int] | None:
        """An integer initializer (or Constant node output) as a list, else None."""
        if name in self._init:
            return [int(v) for v in self._to_array(self._init[name]).reshape(-1)]
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    return [int(v) for v in self._to_array(a.t).reshape(-1)]
        return None

    def initializer(self, name: str) -> Any | None:
        """The initializer called ``name`` (a TensorProto), else None."""
        return self._init.get(name)

    def axes(self, node: Any) -> list[int] | None:
        """The axes of a Squeeze/Unsqueeze: its attribute (opset < 13) or its constant second input."""
        axes = attr(node, "axes")
        if axes is None and len(node.input) > 1:
            axes = self.const(node.input[1])
        return None if axes is None else list(axes)

    def only_consumer(self, name: str) -> Any | None:
        """The single node reading ``name``, or None when it is read more than once or is a graph output."""
        users = self.consumers.get(name, [])
        return users[0] if len(users) == 1 and name not in self.outputs else None

    def from_op(self, name: str, *ops: str) -> Any | None:
        """The producer of ``name`` when it is one of ``ops`` and ``name`` feeds nothing else."""
        node = self.producer.get(name)
        if node is None or node.op_type not in ops or self.only_consumer(name) is None:
            return None
        return node


def splice(model: Any, removed: set[int], replacement: dict[int, list[Any]]) -> list[Any]:
    """Rebuild ``model``'s node list: nodes whose id is in ``replacement`` become those nodes, ids in
    ``removed`` go; returns the nodes taken out (replaced or removed). Replacements take the place of
    a chain's last node, where every input they read is already produced."""
    before = list(model.graph.node)
    kept: list[Any] = []
    for n in before:
        if id(n) in replacement:
            kept.extend(replacement[id(n)])
        elif id(n) not in removed:
            kept.append(n)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return [n for n in before if id(n) in removed or id(n) in replacement]


def _reads(node: Any) -> set[str]:
    """Names ``node`` reads, those its subgraphs (If/Loop bodies) read from the outer scope included."""
    names = {i for i in node.input if i}
    for a in node.attribute:
        for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for n in sub.node:
                names |= _reads(n)
    return names


def drop_unreachable(graph: Any) -> None:
    """Remove the nodes and initializers no graph output depends on."""
    needed = {o.name for o in graph.output}
    keep = []
    for n in reversed(list(graph.node)):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed |= _reads(n)
    del graph.node[:]
    graph.node.extend(reversed(keep))
    inits = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
