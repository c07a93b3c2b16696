"""A graph pass for CPU packages: every 1-D convolution rewritten as a 2-D one of height 1.

Inductor's freezing hands convolutions to oneDNN with their weights reordered once, at compile
time, into the blocked layout oneDNN computes in, but only 2-D and 3-D convolutions (4-D and 5-D
inputs); a 1-D convolution stays a plain ATen call that reorders its weights on every call. HiFT
and the flow are all 1-D convolutions. Written as unsqueeze, a height-1 2-D convolution and
squeeze, they get the prepacked path (and its fused activations) while computing the same sums.
Measurements: docs/bench-log/2026-12-05-torch-packages-unfrozen-hift-convolutions-xeon-m167.md.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

_ATEN = torch.ops.aten


def _fake(node: Any) -> Any:
    """What a graph argument is at trace time: a node's fake tensor, a constant as it is."""
    return node.meta["val"] if isinstance(node, torch.fx.Node) else node


class Conv1dAs2d(CustomGraphPass):
    """Inductor's ``joint_custom_pre_pass``: 1-D ``aten.convolution`` calls as 2-D ones of height 1.
    Transposed convolutions are left alone (oneDNN's packed path has no transposed 1-D form to gain)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target != _ATEN.convolution.default:
                continue
            x, w, bias, stride, padding, dilation, transposed, _, groups = node.args
            val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
            if transposed or val is None or val.dim() != 3:
                continue
            with graph.inserting_before(node):
                x2 = graph.call_function(_ATEN.unsqueeze.default, (x, 2))
                w2 = graph.call_function(_ATEN.unsqueeze.default, (w, 2))
                conv = graph.call_function(_ATEN.convolution.default, (
                    x2, w2, bias, [1, stride[0]], [0, padding[0]], [1, dilation[0]], False, [0, 0], groups))
                y = graph.call_function(_ATEN.squeeze.dim, (conv, 2))
            # Later passes (freezing's packing among them) read each node's fake value.
            with val.fake_mode:
                for new in (x2, w2, conv, y):
                    new.meta["val"] = new.target(*(_fake(a) for a in new.args))
            node.replace_all_uses_with(y)
            graph.erase_node(node)

    def uuid(self) -> str:
        """Key of this pass in Inductor's compile cache: change it whenever the rewrite changes."""
        return "cosycompile-conv1d-as-2d-1"
