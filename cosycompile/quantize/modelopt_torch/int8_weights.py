"""INT8 weights stored as INT8 in the exported ONNX, not as FP32 behind a QuantizeLinear.

ModelOpt exports a calibrated INT8 linear as ``W(fp32) -> QuantizeLinear -> DequantizeLinear``: the
graph carries every weight at four bytes, and the TorchScript exporter holds the FP32 weights, the
traced fake-quantized copies and the serialized FP32 model at once (the largest allocation of a 0.5B
INT8 build). ONNX Runtime folds the QuantizeLinear away when it builds the engine, so an INT8
initializer behind the same DequantizeLinear (same scale, same zero point, same axis) is the graph the
engine ends up with. This module swaps each such linear for one that holds its weight already
quantized, with the rounding of ONNX's QuantizeLinear, before the export.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import torch
from torch import nn

_QMAX = 127  # signed 8-bit, not narrow range: QuantizeLinear saturates to [-128, 127]


class _Dequantize(torch.autograd.Function):
    """``w * scale`` per output channel, exported as one DequantizeLinear on axis 0."""

    @staticmethod
    def forward(ctx: Any, w: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
        return w.to(scale.dtype) * scale[:, None]

    @staticmethod
    def symbolic(g: Any, w: Any, scale: Any, zero_point: Any) -> Any:
        return g.op("DequantizeLinear", w, scale, zero_point, axis_i=0)


class Int8Linear(nn.Module):
    """A calibrated ModelOpt linear with its weight held in INT8: the same input and output quantizers
    (SmoothQuant's pre-quant scale lives in the input quantizer), the weight dequantized in the graph."""

    def __init__(self, src: nn.Module) -> None:
        super().__init__()
        self.input_quantizer = src.input_quantizer
        self.output_quantizer = src.output_quantizer
        weight = src.weight.detach()
        # ModelOpt's own export: scale = amax / 127 in the weight's dtype, a zero amax scaled by 1.
        scale = src.weight_quantizer.amax.detach().reshape(-1).to(weight.dtype) / _QMAX
        scale = scale.masked_fill(scale == 0, 1.0)
        # torch.round is round-half-to-even and the division is IEEE, as in QuantizeLinear.
        q = torch.clamp(torch.round(weight / scale[:, None]), -_QMAX - 1, _QMAX).to(torch.int8)
        self.register_buffer("weight_int8", q)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("weight_zero_point", torch.zeros_like(q[:, 0]))
        self.bias = src.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = _Dequantize.apply(self.weight_int8, self.weight_scale, self.weight_zero_point)
        return self.output_quantizer(nn.functional.linear(self.input_quantizer(x), w, self.bias))


def _plain_int8(module: nn.Module) -> bool:
    """Whether ``module`` is a linear whose weight quantizer is static signed 8-bit per output channel
    and nothing else (no blocks, no pre-scale, no rotation, no custom backend)."""
    if not isinstance(module, nn.Linear) or not hasattr(module, "weight_quantizer"):
        return False
    wq = module.weight_quantizer
    amax = getattr(wq, "amax", None)
    return (wq.is_enabled and getattr(wq, "_if_quant", True) and wq.fake_quant and wq.num_bits == 8
            and not wq.unsigned and not wq.narrow_range and wq.block_sizes is None and wq.pre_quant_scale is None
            and not getattr(wq, "rotate_is_enabled", False) and getattr(wq, "backend", None) is None
            and amax is not None and amax.numel() == module.out_features)


def store_int8_weights(root: nn.Module, weights_read: tuple[str, ...] = ()) -> int:
    """Replace, in place, every plain INT8 linear under ``root`` by an :class:`Int8Linear`; returns how
    many. The FP32 weights are released as their modules leave the tree. Modules matching
    ``weights_read`` (fnmatch patterns over module names) stay: other code reads their FP32 weight."""
    swaps = [(name, m) for name, m in root.named_modules()
             if _plain_int8(m) and not any(fnmatch.fnmatch(name, pat) for pat in weights_read)]
    for name, m in swaps:
        parent_name, _, child = name.rpartition(".")
        parent = root.get_submodule(parent_name) if parent_name else root
        setattr(parent, child, Int8Linear(m))
    return len(swaps)
