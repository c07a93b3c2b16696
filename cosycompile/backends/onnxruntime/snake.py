"""Rewrite HiFT's Snake activations into the project's ``cosycompile.Snake`` operator.

Snake is ``x + 1 / (alpha + 1e-9) * sin(alpha x)^2`` per channel. Exported and optimized it is
``[Mul(x, alpha)] -> Sin -> Pow(., 2) -> [Mul(., scale)] -> Add(x, .)``, the Muls gone where the
optimizer folded an alpha of 1. ONNX Runtime's CPU ``Sin`` is a scalar loop, so each chain costs
three passes over the activation and a slow sine; the operator (``runtime/ort_ops/snake.cpp``) is one
vectorized pass computing the same expression with the graph's own constants. A chain matches only
when both constants are one value, or one per channel of an ``[..., C, T]`` activation (shape
``[1, C, 1]`` or ``[C, 1]``), in a float32 graph; anything else stays as it was.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cosycompile.backends.onnxruntime.graph_index import GraphIndex, splice
from cosycompile.runtime.ort_ops import DOMAIN


def _channel_vector(g: GraphIndex, name: str) -> np.ndarray | None:
    """A float initializer as a 1-D per-channel (or one-value) vector, else None."""
    from onnx import numpy_helper

    t = g.initializer(name)
    if t is None:
        return None
    a = numpy_helper.to_array(t)
    if a.dtype != np.float32 or a.ndim > 3:
        return None
    if a.size == 1:
        return a.reshape(1)
    # One axis of length C, and it is the channel axis: the second to last of the activation.
    if a.ndim < 2 or a.shape[-1] != 1 or sum(d != 1 for d in a.shape) != 1:
        return None
    return a.reshape(-1)


def _constant_factor(g: GraphIndex, mul: Any, other: str | None = None) -> tuple[str, np.ndarray] | None:
    """(the non-constant input, the constant as a vector) of a two-input Mul with one channel constant;
    with ``other`` given, the non-constant input must be it."""
    if mul is None or mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or len(mul.input) != 2:
        return None
    for k in (0, 1):
        vec = _channel_vector(g, mul.input[k])
        x = mul.input[1 - k]
        if vec is not None and g.initializer(x) is None and (other is None or x == other):
            return x, vec
    return None


def rewrite_snake(model: Any) -> int:
    """Replace every Snake chain of ``model`` with one ``cosycompile.Snake`` node; returns how many."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    # The operator is float32. A chain whose alpha was folded pins no type (Sin, Pow and Add take any
    # float), so a graph holding half-precision weights keeps all its chains.
    if any(t.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16) for t in graph.initializer):
        return 0
    g = GraphIndex(graph)
    replaced: dict[int, list[Any]] = {}
    removed: set[int] = set()
    new_inits: list[Any] = []
    for sin in graph.node:
        if sin.op_type != "Sin" or sin.domain not in ("", "ai.onnx"):
            continue
        pw = g.only_consumer(sin.output[0])
        if pw is None or pw.op_type != "Pow" or pw.input[0] != sin.output[0]:
            continue
        exponent = _channel_vector(g, pw.input[1])
        if exponent is None or exponent.tolist() != [2.0]:
            continue
        nxt = g.only_consumer(pw.output[0])
        post = _constant_factor(g, nxt, pw.output[0])
        add = g.only_consumer(nxt.output[0]) if post is not None else nxt
        if add is None or add.op_type != "Add" or len(add.input) != 2:
            continue
        last = (nxt if post is not None else pw).output[0]
        x = add.input[0] if add.input[1] == last else add.input[1] if add.input[0] == last else None
        if x is None:
            continue
        # alpha is a Mul in front of the Sin that reads this same x, or 1 where the optimizer folded it.
        pre_node = g.producer.get(sin.input[0])
        reader = g.only_consumer(sin.input[0])
        pre = _constant_factor(g, pre_node, x) if reader is not None and reader.output[0] == sin.output[0] else None
        if pre is None and sin.input[0] != x:
            continue
        alpha = pre[1] if pre is not None else np.ones(1, np.float32)
        scale = post[1] if post is not None else np.ones(1, np.float32)
        if alpha.size != 1 and scale.size != 1 and alpha.size != scale.size:
            continue
        p = f"{sin.name or sin.output[0]}/snake"
        new_inits += [numpy_helper.from_array(alpha, f"{p}/alpha"), numpy_helper.from_array(scale, f"{p}/scale")]
        replaced[id(add)] = [helper.make_node("Snake", [x, f"{p}/alpha", f"{p}/scale"], [add.output[0]],
                                             name=f"{p}/Snake", domain=DOMAIN)]
        removed.update({id(sin), id(pw)} | ({id(nxt)} if post is not None else set())
                       | ({id(pre_node)} if pre is not None else set()))
    if not replaced:
        return 0
    splice(model, removed, replaced)
    graph.initializer.extend(new_inits)
    read = {i for n in graph.node for i in n.input}
    unused = [t for t in graph.initializer if t.name not in read]
    for t in unused:
        graph.initializer.remove(t)
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return len(replaced)
