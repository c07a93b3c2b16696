"""Fuse exported scaled-dot-product attention into ONNX Runtime's ``MultiHeadAttention`` kernel.

torch's exporter writes ``F.scaled_dot_product_attention`` as Reshape/Transpose per operand, a
(scaled) MatMul, an Add of the bias, Softmax, a second MatMul and a Transpose/Reshape back. ONNX
Runtime's offline optimizer leaves that chain as separate kernels, so every [B, heads, T, T] score
tensor goes through memory three times (scores, biased scores, probabilities). On the flow
estimator at 632 frames that chain is more than half of a call on a 2-vCPU CPU. The contrib
``MultiHeadAttention`` kernel does the same arithmetic (bias included, so a chunk-causal streaming
mask stays exact) one head at a time, so a head's [T, T] scores can stay in cache.

The matcher is strict on purpose: it rewrites only the exact chain, with every intermediate used
once, and leaves anything else (the flow encoder's relative-position attention, the LLM's cached
decode step, Q/DQ-wrapped products) as it was.
"""

from __future__ import annotations

from typing import Any

from cosycompile.backends.onnxruntime.graph_index import GraphIndex, attr, splice

_BSNH_TO_BNSH = [0, 2, 1, 3]
_BSNH_TO_BNHS = [0, 2, 3, 1]


def _split_heads(g: GraphIndex, name: str, perm: list[int]) -> tuple[str, int, int, list[Any]] | None:
    """(the [B, S, N*H] tensor, N, H, nodes) where ``name`` is Transpose(perm) of Reshape to [B, S, N, H]."""
    tr = g.from_op(name, "Transpose")
    if tr is None or list(attr(tr, "perm", [])) != perm:
        return None
    rs = g.from_op(tr.input[0], "Reshape")
    shape = g.const(rs.input[1]) if rs is not None else None
    if shape is None or len(shape) != 4 or shape[2] <= 0 or shape[3] <= 0:
        return None
    return rs.input[0], shape[2], shape[3], [rs, tr]


def _scores(g: GraphIndex, name: str) -> tuple[Any, float] | None:
    """(the Q.K^T node, its scale) when ``name`` is a plain or scale-fused MatMul with no transposes."""
    mm = g.from_op(name, "MatMul", "FusedMatMul")
    if mm is None:
        return None
    if mm.op_type == "MatMul":
        return mm, 1.0
    if any(attr(mm, a, 0) for a in ("transA", "transB", "transBatchA", "transBatchB")):
        return None
    return mm, float(attr(mm, "alpha", 1.0))


def _bias_is_4d(g: GraphIndex, name: str) -> bool:
    """Whether the bias is an Unsqueeze on axis 1 (the [B, 1, S, T] the kernel broadcasts over heads)."""
    node = g.producer.get(name)
    if node is None or node.op_type != "Unsqueeze":
        return False
    return g.axes(node) == [1]


def _match(g: GraphIndex, softmax: Any) -> tuple[list[Any], Any] | None:
    """(the nodes to remove, the MultiHeadAttention node replacing them) for one Softmax, or None."""
    from onnx import helper

    if attr(softmax, "axis", -1) not in (-1, 3):
        return None
    bias = ""
    pre = g.from_op(softmax.input[0], "Add")
    chain: list[Any] = [softmax]
    if pre is not None:
        for a, b in (pre.input, reversed(pre.input)):
            found = _scores(g, a)
            if found is not None and _bias_is_4d(g, b):
                scores, bias = found, b
                break
        else:
            return None
        chain.append(pre)
    else:
        scores = _scores(g, softmax.input[0])
        if scores is None:
            return None
    mm1, scale = scores
    q = _split_heads(g, mm1.input[0], _BSNH_TO_BNSH)
    k = _split_heads(g, mm1.input[1], _BSNH_TO_BNHS)
    mm2 = g.only_consumer(softmax.output[0])
    if q is None or k is None or mm2 is None or mm2.op_type != "MatMul" or mm2.input[0] != softmax.output[0]:
        return None
    v = _split_heads(g, mm2.input[1], _BSNH_TO_BNSH)
    back = g.only_consumer(mm2.output[0])
    if v is None or back is None or back.op_type != "Transpose" or list(attr(back, "perm", [])) != _BSNH_TO_BNSH:
        return None
    merge = g.only_consumer(back.output[0])
    out_shape = g.const(merge.input[1]) if merge is not None and merge.op_type == "Reshape" else None
    heads, size = q[1], q[2]
    if (k[1], k[2]) != (heads, size) or (v[1], v[2]) != (heads, size):
        return None
    if out_shape is None or len(out_shape) != 3 or out_shape[2] != heads * size:
        return None
    inputs = [q[0], k[0], v[0]] + (["", "", bias] if bias else [])
    fused = helper.make_node("MultiHeadAttention", inputs, [merge.output[0]], name=f"{softmax.name}/fused_mha",
                             domain="com.microsoft", num_heads=heads, scale=scale)
    return q[3] + k[3] + v[3] + [mm1] + chain + [mm2, back, merge], fused


def fuse_attention(model: Any) -> int:
    """Rewrite every matching attention chain of ``model`` (an onnx ModelProto) in place; returns how many.

    Initializers only the removed nodes used (the Reshape shapes) are dropped with them.
    """
    from onnx import helper

    g = GraphIndex(model.graph)
    removed: set[int] = set()
    replacement: dict[int, Any] = {}
    for node in list(model.graph.node):
        if node.op_type != "Softmax":
            continue
        found = _match(g, node)
        if found is None or any(id(n) in removed for n in found[0]):
            continue
        nodes, fused = found
        removed.update(id(n) for n in nodes)
        # The fused node takes the place of the chain's last node: every input it reads is
        # produced before that point in the (topologically sorted) node list.
        replacement[id(nodes[-1])] = fused
    if not replacement:
        return 0
    taken = splice(model, removed - set(replacement), {k: [v] for k, v in replacement.items()})
    kept = list(model.graph.node)
    used = {i for n in kept for i in n.input}
    orphaned = {i for n in taken for i in n.input} - used
    dead = [i for i in model.graph.initializer if i.name in orphaned]
    for i in dead:
        model.graph.initializer.remove(i)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return len(replacement)
