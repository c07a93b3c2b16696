"""INT8 attention products for CPU programs: ``scaled_dot_product_attention`` with Q.K and P.V in INT8
and the softmax between them in FP32.

Q is quantized per row (one scale per token and head), K per head, V per column (one scale per
channel and head), all symmetric over [-127, 127]; one scale per head for K leaves a single factor per
score row. The softmax runs on the dequantized scores in FP32, in base 2; the exponential is a
polynomial with the float exponent bits (:func:`exp2_nonpositive`), since the probabilities keep 8
bits and ATen's full-precision ``exp`` would buy nothing. The probabilities are quantized against
their row's maximum, which is exp(0) = 1 before normalising, onto 254 steps, and the normalising sum
folds into the output scale.

:func:`rewrite_attention` puts one call of the project's ``cosycompile::int8_attention`` operator
(``runtime/torch_ops/int8_attention.cpp``) in place of each qualifying attention node: it quantizes,
multiplies and normalises a block of query rows while their scores sit in cache. :func:`int8_attention`
is the same arithmetic in ATen ops, two ``torch._int_mm`` per head; the operator is tested against it.
Attention with dropout, a causal flag or grouped query heads, and any not on 4-D q, k, v, stays as it
was. CPU only: CUDA's INT8 GEMM wants more than 16 rows and inner sizes that are multiples of 8, which
a frame count is not.
"""

from __future__ import annotations

from typing import Any

import torch

_LEVELS = 127  # symmetric INT8
_P_STEPS = 254  # softmax probabilities in [0, 1] onto 254 steps
_LOG2E = 1.4426950408889634
# 2^f on [0, 1] as 1 + f (c1 + f (c2 + f c3)): a fit in relative error (1.03e-4 at most, 0.026 of a
# probability step) with p(0) = 1 and p(1) = 2 exactly, so a row's maximum maps to exactly 1 and
# nothing exceeds it. A fourth degree bought accuracy the 8-bit probabilities cannot hold.
_EXP2_POLY = (0.6954244246846342, 0.22630764466457975, 0.07826793065078608)
# Below 2^-30 a probability is 0 on 254 steps: the cut-off, well above where the exponent bits leave
# their range (2^-126).
_EXP2_FLOOR = -30.0


def exp2_nonpositive(y: torch.Tensor) -> torch.Tensor:
    """2^y for y <= 0 to a relative 1.03e-4, 0 below 2^-30 (and for -inf or NaN), in float32 ops
    Inductor vectorizes: a polynomial for the fraction, the integer part put into the exponent bits."""
    n = torch.floor(y)
    f = y - n
    c1, c2, c3 = _EXP2_POLY
    frac = 1.0 + f * (c1 + f * (c2 + f * c3))
    # A select rather than a clamp of y: Inductor's clamp carries NaN checks, and the select also
    # drops whatever the exponent bits of a far-below or non-finite y came to.
    return torch.where(y >= _EXP2_FLOOR, frac * ((n.to(torch.int32) + 127) << 23).view(torch.float32), 0.0)


def int8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                   scale: float) -> torch.Tensor:
    """``scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)`` with INT8 products, in ATen
    ops: what ``cosycompile::int8_attention`` computes. The probabilities go to ``_int_mm`` as signed
    bytes ``round(254 e) - 127``, whose offset comes back exactly as 127 times V's column sums.

    q, k, v [B, H, T, D] (the loop over B and H is unrolled when traced); mask additive (float) or
    boolean (True = attend), broadcastable to [B, H, T, S].
    """
    B, H = q.shape[0], q.shape[1]
    # Scales multiply (no division): Inductor inlines them into the kernels that quantize.
    q_s = q.abs().amax(-1, keepdim=True).clamp(min=1e-8) * (1 / _LEVELS)
    k_s = k.abs().amax((-2, -1), keepdim=True).clamp(min=1e-8) * (1 / _LEVELS)
    # One factor per query row, scores in base 2: max|q| times K's scale, taken as a reduction of its own
    # so that the softmax kernel reads it rather than rebuilding it per vector. An all-zero row gets 0.
    qk_s = (q.abs() * (k_s * (scale * _LOG2E / _LEVELS))).amax(-1, keepdim=True)
    v_s = v.abs().amax(-2, keepdim=True).clamp(min=1e-8) * (1 / _LEVELS)
    # Times the scales' reciprocals rather than divided by the scales, as the operator does: it quantizes
    # K, V and every query row on each call, and a division costs it several multiplications.
    q_q = torch.round(q * q_s.reciprocal()).to(torch.int8)
    k_q = torch.round(k * k_s.reciprocal()).to(torch.int8)
    v_q = torch.round(v * v_s.reciprocal()).to(torch.int8)
    # What the -127 offset of the probabilities takes from P.V, per output channel.
    v_offset = v_q.sum(-2, keepdim=True, dtype=torch.int32) * (_P_STEPS // 2)
    if mask is not None:
        mask = mask.expand(B, H, q.shape[2], k.shape[2])  # a view: any broadcastable mask, indexed per head
    outs = []
    for b in range(B):
        for h in range(H):
            scores = torch._int_mm(q_q[b, h], k_q[b, h].t()).float() * qk_s[b, h]
            if mask is not None:
                m = mask[b, h]
                scores = scores + m * _LOG2E if m.is_floating_point() else scores.masked_fill(~m, float("-inf"))
            e = exp2_nonpositive(scores - scores.amax(-1, keepdim=True))
            p_q = (torch.round(e * _P_STEPS) - _P_STEPS // 2).to(torch.int8)
            acc = torch._int_mm(p_q, v_q[b, h]) + v_offset[b, h]
            total = e.sum(-1, keepdim=True)  # 0 for a row that attends to no key: its output is 0, as SDPA's
            outs.append(torch.where(total > 0, acc.float() * (v_s[b, h] * (_P_STEPS * total).reciprocal()), 0.0))
    return torch.stack(outs).unflatten(0, (B, H))


def rewrite_attention(gm: torch.fx.GraphModule) -> dict[str, Any]:
    """Replace, in place, every ``aten.scaled_dot_product_attention`` of ``gm`` that qualifies with one
    call of ``cosycompile::int8_attention`` (whose library must be loaded). Returns how many were
    replaced and why the others were kept."""
    graph = gm.graph
    done, kept = 0, {}
    rebuilt: dict[Any, Any] = {}  # a node of a mask's chain -> its form before the expand (shared by blocks)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.scaled_dot_product_attention.default:
            continue
        why = _why_not(node)
        if why:
            kept[node.name] = why
            continue
        q, k, v = node.args[:3]
        mask = node_arg(node, 3, "attn_mask", None)
        scale = node_arg(node, 6, "scale", None)
        if scale is None:
            scale = q.meta["val"].shape[-1] ** -0.5
        with graph.inserting_before(node):
            mask = _before_expand(graph, mask, rebuilt)
            new = graph.call_function(torch.ops.cosycompile.int8_attention.default, (q, k, v, mask, float(scale)))
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        done += 1
    graph.eliminate_dead_code()
    gm.recompile()
    return {"int8_attention": done, "kept_fp32": kept}


# Ops that map each element on its own (the other arguments are scalars or dtypes) or only insert a
# dimension: an expand before a chain of them can move after it.
_ELEMENTWISE = {torch.ops.aten.to.dtype, torch.ops.aten._to_copy.default, torch.ops.aten.rsub.Scalar,
                torch.ops.aten.mul.Tensor, torch.ops.aten.mul.Scalar, torch.ops.aten.add.Tensor,
                torch.ops.aten.add.Scalar, torch.ops.aten.sub.Tensor, torch.ops.aten.sub.Scalar,
                torch.ops.aten.div.Tensor, torch.ops.aten.div.Scalar, torch.ops.aten.neg.default,
                torch.ops.aten.logical_not.default, torch.ops.aten.bitwise_not.default,
                torch.ops.aten.unsqueeze.default}


def _before_expand(graph: torch.fx.Graph, mask: Any, rebuilt: dict[Any, Any]) -> Any:
    """The mask computed on the tensor an ``expand`` broadcast, where the mask is that expand followed
    by elementwise ops: e.g. a padding mask [B, 1, S] repeated over the T query rows, then made
    additive. The operator broadcasts a mask itself (reading one row of S for every query row), so
    the program no longer writes T copies of it, nor the operator reads them. Else ``mask`` itself.
    ``rebuilt`` maps the chain's nodes already moved (for other attentions) to their new form."""
    chain = []
    node = mask
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _ELEMENTWISE:
        inputs = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, torch.fx.Node)]
        if len(inputs) != 1 or inputs[0] is not node.args[0]:
            return mask
        chain.append(node)
        node = node.args[0]
    if not (chain and isinstance(node, torch.fx.Node) and node.op == "call_function"
            and node.target is torch.ops.aten.expand.default):
        return mask
    source = node.args[0]
    if "val" not in source.meta or "val" not in node.meta or source.meta["val"].dim() != node.meta["val"].dim():
        return mask  # an expand that adds leading dimensions changes what the chain's dims index
    value = source
    for op in reversed(chain):
        if op not in rebuilt:
            rebuilt[op] = graph.call_function(op.target, (value, *op.args[1:]), dict(op.kwargs))
        value = rebuilt[op]
    return value


def node_arg(node: torch.fx.Node, index: int, name: str, default: Any) -> Any:
    """Argument ``name`` of an FX call node, given by position ``index`` or by keyword."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _why_not(node: torch.fx.Node) -> str:
    """Why this attention node keeps its FP32 kernel ('' when it can be rewritten)."""
    if node_arg(node, 4, "dropout_p", 0.0) or node_arg(node, 5, "is_causal", False) or node_arg(node, 7, "enable_gqa", False):
        return "dropout, is_causal or enable_gqa set"
    shapes = [a.meta["val"].shape for a in node.args[:3] if isinstance(a, torch.fx.Node) and "val" in a.meta]
    if len(shapes) != 3 or any(len(s) != 4 for s in shapes):
        return "q, k, v are not all 4-D"
    return ""
