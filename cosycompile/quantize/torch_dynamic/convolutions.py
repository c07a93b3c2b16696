"""BF16 convolutions for the programs whose linears ``torch_dynamic`` quantizes.

A convolution with a constant weight keeps that weight (and its bias) in BF16; its input is cast to
BF16 on the way in and its output back to FP32, so everything around it (normalisations, the
activations, the residual sums) stays FP32, as the INT8 linears leave it. On a CPU with AVX512-BF16
or AMX, oneDNN runs these natively, faster than FP32
(docs/bench-log/2026-12-03-gemv-stream-and-bf16-convolutions-zen4.md); elsewhere PyTorch has no
native BF16 convolution and they are slower than FP32 (:func:`bf16_products_are_native`).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from cosycompile.quantize.torch_dynamic.attention import node_arg
from cosycompile.quantize.torch_dynamic.fx import drop_unread, get_attr
from cosycompile.runtime.host import cpu_flags

NO_NATIVE_BF16 = ("this CPU has neither AVX512-BF16 nor AMX, and PyTorch's BF16 convolutions have no native kernel "
                  "without them, so 'convolutions: bf16' makes the program slower than FP32 here; leave it out "
                  "(FP32) on this CPU")


def bf16_products_are_native(flags: set[str] | None = None) -> bool:
    """Whether this CPU computes BF16 products natively (``flags``: :func:`cpu_flags`)."""
    return bool({"avx512_bf16", "amx_bf16"} & (cpu_flags() if flags is None else flags))


def bf16_conv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: Any, padding: Any,
              dilation: Any, groups: int) -> torch.Tensor:
    """A 1-D or 2-D convolution (by ``w``'s rank) with ``w`` and ``bias`` already BF16: the input cast in,
    the output cast back to FP32."""
    conv = torch.nn.functional.conv1d if w.dim() == 3 else torch.nn.functional.conv2d
    return conv(x.to(torch.bfloat16), w, bias, stride, padding, dilation, groups).float()


_CONV_DIMS = {torch.ops.aten.conv1d.default: 1, torch.ops.aten.conv2d.default: 2}


def rewrite_convolutions(gm: torch.fx.GraphModule, keep_fp32: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Replace, in place, every ``aten.conv1d`` / ``aten.conv2d`` of ``gm`` whose weight is a constant,
    except those whose weight name matches a ``keep_fp32`` regex, with its BF16 form; the FP32 weights
    no node reads any more are dropped. Returns how many, and the weights kept FP32."""
    graph = gm.graph
    done: dict[str, tuple[str, str | None]] = {}  # 'weight|bias' (FP32 names) -> the BF16 buffers' names
    kept: set[str] = set()
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _CONV_DIMS:
            continue
        dims = _CONV_DIMS[node.target]
        w = node.args[1]
        bias = node_arg(node, 2, "bias", None)
        if not (isinstance(w, torch.fx.Node) and w.op == "get_attr"):
            continue
        if bias is not None and not (isinstance(bias, torch.fx.Node) and bias.op == "get_attr"):
            continue
        if any(re.search(p, w.target) for p in keep_fp32):
            kept.add(w.target)
            continue
        key = f"{w.target}|{bias.target if bias is not None else ''}"
        if key not in done:
            prefix = "bf16_" + re.sub(r"\W", "_", w.target)
            gm.register_buffer(f"{prefix}_w", get_attr(gm, w.target).detach().to(torch.bfloat16))
            if bias is not None:
                gm.register_buffer(f"{prefix}_b", get_attr(gm, bias.target).detach().to(torch.bfloat16))
            done[key] = (f"{prefix}_w", f"{prefix}_b" if bias is not None else None)
        w_name, b_name = done[key]
        args = (node_arg(node, 3, "stride", [1] * dims), node_arg(node, 4, "padding", [0] * dims),
                node_arg(node, 5, "dilation", [1] * dims), node_arg(node, 6, "groups", 1))
        with graph.inserting_before(node):
            new = graph.call_function(bf16_conv, (node.args[0], graph.get_attr(w_name),
                                           graph.get_attr(b_name) if b_name else None, *args))
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    fp32 = {name for key in done for name in key.split("|") if name}
    for node in list(graph.nodes):
        if node.op == "get_attr" and node.target in fp32 and not node.users:
            graph.erase_node(node)
    drop_unread(gm, fp32)
    gm.recompile()
    return {"bf16_convolutions": len(done), "convolutions_kept_fp32": sorted(kept)}
