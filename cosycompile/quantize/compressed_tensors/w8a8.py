"""INT8 W8A8 with activations quantized per token at run time, in the form compressed-tensors
writes and vLLM runs (SGLang reads the same format; not run here).

Weights: symmetric INT8 per output channel (``weight`` int8 [out, in], ``weight_scale`` float32
[out, 1], scale = max |row| / 127). Activations: symmetric INT8 per token, scaled at run time
(max |token| / 127), so nothing is calibrated and nothing sits in front of a layer: a server needs
no smoothing vector, which is what keeps vLLM from loading ModelOpt's SmoothQuant export.

The same two functions quantize the checkpoint's weights and make the quantized reference
(:func:`quantize_reference`), so the reference computes exactly what the checkpoint says.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import torch
from torch import nn

QMAX = 127
# Weights in [-63, 63] (``reduce_range``): on x86 CPUs without VNNI (AVX2 only) oneDNN multiplies
# unsigned-shifted activations (0..255) by INT8 weights in pairs summed into int16, which saturates
# once a weight's magnitude passes 64 (2 x 255 x 65 > 32767); vLLM's CPU build runs its INT8 GEMMs through oneDNN. ONNX Runtime's
# ``reduce_range`` is the same remedy.
QMAX_REDUCED = 63
# vLLM's compressed-tensors config (compressed_tensors 0.17 QuantizationArgs field names); vLLM 0.32
# picks CompressedTensorsW8A8Int8 for it (``_is_dynamic_token_w8a8``: 8 bits, channel weights,
# dynamic token inputs, symmetric weights) and its CPU build runs it through oneDNN.
WEIGHTS = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
INPUTS = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}


def quantize_weight(w: torch.Tensor, qmax: int = QMAX) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [out, in] -> (int8 [out, in] within ±``qmax``, float32 scale [out, 1]); ``w ≈ q * scale``."""
    w = w.detach().float()
    scale = (w.abs().amax(dim=1, keepdim=True) / qmax).clamp(min=torch.finfo(torch.float32).tiny)
    return torch.round(w / scale).clamp(-qmax, qmax).to(torch.int8), scale


def fake_quant_tokens(x: torch.Tensor) -> torch.Tensor:
    """``x`` with each token (last dim) rounded to INT8 on its own scale, as the server's kernel does."""
    scale = (x.abs().amax(dim=-1, keepdim=True) / QMAX).clamp(min=torch.finfo(x.dtype).tiny)
    return torch.round(x / scale).clamp(-QMAX, QMAX) * scale


class W8A8Linear(nn.Module):
    """A Linear computing what the checkpoint's layer computes: INT8 weights, per-token INT8 inputs."""

    def __init__(self, linear: nn.Linear, qmax: int = QMAX) -> None:
        super().__init__()
        q, scale = quantize_weight(linear.weight, qmax)
        self.register_buffer("weight", (q.float() * scale).to(linear.weight.dtype))
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(fake_quant_tokens(x), self.weight, self.bias)


def quantized_names(module: nn.Module, exclude: tuple[str, ...]) -> list[str]:
    """The Linear layers of ``module`` (a Qwen2 body) that are quantized: every decoder-layer
    projection whose name no ``exclude`` wildcard matches; heads and embeddings never."""
    return [n for n, m in module.named_modules()
            if isinstance(m, nn.Linear) and ".layers." in f".{n}" and not any(fnmatch.fnmatch(n, p) for p in exclude)]


def quantize_reference(module: nn.Module, exclude: tuple[str, ...], qmax: int = QMAX) -> list[str]:
    """Replace the quantized Linears of ``module`` in place by :class:`W8A8Linear`; their names."""
    names = quantized_names(module, exclude)
    for name in names:
        parent, _, leaf = name.rpartition(".")
        owner = module.get_submodule(parent) if parent else module
        setattr(owner, leaf, W8A8Linear(getattr(owner, leaf), qmax))
    return names


def quantize_state(state: dict[str, torch.Tensor], names: list[str], qmax: int = QMAX) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors with each named layer's ``weight`` as INT8 plus its ``weight_scale``."""
    out = dict(state)
    for name in names:
        q, scale = quantize_weight(state[f"{name}.weight"], qmax)
        out[f"{name}.weight"] = q.contiguous()
        out[f"{name}.weight_scale"] = scale.contiguous()
    return out


def quantization_config(ignore: list[str]) -> dict[str, Any]:
    """``config.json``'s ``quantization_config`` for the layers quantized; ``ignore`` names the
    Linears kept in full precision (module names, ``lm_head`` among them)."""
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": dict(WEIGHTS),
                                          "input_activations": dict(INPUTS), "output_activations": None}},
            "ignore": sorted(ignore), "kv_cache_scheme": None}
