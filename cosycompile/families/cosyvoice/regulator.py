"""The flow's length regulator at inference, in numpy: token-rate h -> mu at mel rate.

Upstream's ``InterpolateRegulator.inference`` (``cosyvoice/flow/length_regulator.py``) stretches the
prompt's tokens and the new tokens to their mel lengths separately with
``F.interpolate(mode='linear', align_corners=False)`` (past 40 new tokens the first and last 20 on
their own too), then runs a small conv stack. It sits between the flow's two graphs because it
needs the prompt/new split and the mel lengths, which graph inputs cannot carry; the runtime that
runs it has no torch, so neither does this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def interpolate_linear(x: np.ndarray, size: int) -> np.ndarray:
    """torch's ``F.interpolate(x[None], size=size, mode='linear', align_corners=False)[0]`` for x [C, N].

    Float32 arithmetic in the order of torch's CPU kernel: ``scale = N / size``, source position
    ``scale * (i + 0.5) - 0.5`` clamped at 0, left index clamped at N - 1 and the right one at the
    last input, ``x0 * (1 - lambda) + x1 * lambda``. The kernel's multiply-adds are fused (one
    rounding), done here as float64 products of float32 values rounded once: bit-equal to torch's
    x86 build on every size tried; a different build may differ by an ulp.
    """
    n = x.shape[1]
    if size == n:
        return x.astype(np.float32, copy=True)
    if n == 0 or size <= 0:
        raise ValueError(f"cannot interpolate {n} positions to {size}")
    f32 = np.float32
    scale = f32(n) / f32(size)
    half_steps = np.arange(size, dtype=f32) + f32(0.5)
    src = np.maximum((np.float64(scale) * half_steps.astype(np.float64) - 0.5).astype(f32), f32(0.0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n - 1)
    lam = np.clip(src - i0.astype(f32), f32(0.0), f32(1.0))
    i1 = np.where(i0 < n - 1, i0 + 1, i0)
    x = x.astype(f32, copy=False)
    right = x[:, i1] * lam
    return (x[:, i0].astype(np.float64) * (f32(1.0) - lam) + right.astype(np.float64)).astype(f32)


def stretch(h: np.ndarray, n_prompt_tokens: int, mel_len1: int, mel_len2: int, cfg: Any) -> np.ndarray:
    """h [C, N] (prompt tokens first) -> [C, mel_len1 + mel_len2], each part interpolated as upstream splits it.

    ``cfg`` is the flow's settings (``FlowConfig``): ``regulator_edge_tokens`` and ``mel_frames``.
    """
    x1, x2 = h[:, :n_prompt_tokens], h[:, n_prompt_tokens:]
    edge = cfg.regulator_edge_tokens
    if x2.shape[1] > 2 * edge:
        edge_frames = cfg.mel_frames(edge)
        x2 = np.concatenate([interpolate_linear(x2[:, :edge], edge_frames),
                             interpolate_linear(x2[:, edge:-edge], mel_len2 - 2 * edge_frames),
                             interpolate_linear(x2[:, -edge:], edge_frames)], axis=1)
    else:
        x2 = interpolate_linear(x2, mel_len2)
    if n_prompt_tokens == 0:
        if mel_len1 != 0:
            raise ValueError(f"{mel_len1} prompt mel frames but no prompt tokens")
        return x2
    return np.concatenate([interpolate_linear(x1, mel_len1), x2], axis=1)


def _conv1d(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Conv1d, stride 1, 'same' zero padding (odd kernel): x [C_in, T], w [C_out, C_in, K] -> [C_out, T]."""
    k = w.shape[2]
    pad = k // 2
    T = x.shape[1]
    xp = np.pad(x, ((0, 0), (pad, pad)))
    out = np.zeros((w.shape[0], T), dtype=np.float64)
    for j in range(k):
        out += w[:, :, j].astype(np.float64) @ xp[:, j: j + T].astype(np.float64)
    return out + b.astype(np.float64)[:, None]


def _group_norm_1(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """GroupNorm with one group over [C, T]: statistics over all channels and frames, then per-channel affine."""
    mean = x.mean()
    var = np.mean((x - mean) ** 2)
    return (x - mean) / np.sqrt(var + eps) * w.astype(np.float64)[:, None] + b.astype(np.float64)[:, None]


def _mish(x: np.ndarray) -> np.ndarray:
    return x * np.tanh(np.logaddexp(0.0, x))


def conv_stack(x: np.ndarray, weights: Mapping[str, np.ndarray], n_blocks: int) -> np.ndarray:
    """The regulator's ``model``: ``n_blocks`` x (Conv1d k3 + GroupNorm(1, C) + Mish), then a 1x1 conv.

    Summed in float64 (the stack is small), returned as float32.
    """
    y = x.astype(np.float64)
    for i in range(n_blocks):
        y = _conv1d(y, weights[f"{3 * i}.weight"], weights[f"{3 * i}.bias"])
        y = _mish(_group_norm_1(y, weights[f"{3 * i + 1}.weight"], weights[f"{3 * i + 1}.bias"]))
    y = _conv1d(y, weights[f"{3 * n_blocks}.weight"], weights[f"{3 * n_blocks}.bias"])
    return y.astype(np.float32)


def regulate(h: np.ndarray, n_prompt_tokens: int, mel_len1: int, mel_len2: int, weights: Mapping[str, np.ndarray],
             cfg: Any) -> np.ndarray:
    """Upstream's ``InterpolateRegulator.inference`` on the token-rate encoder output.

    ``h`` [80, N]: ``FlowEncoderStep``'s h of the prompt tokens then the new ones; ``n_prompt_tokens``
    how many lead (0: no prompt, then ``mel_len1`` must be 0); ``mel_len1`` the prompt mel's frames
    and ``mel_len2`` the new frames (``cfg.mel_frames(N - n_prompt_tokens)``); ``weights`` the conv
    stack keyed as the state dict's ``length_regulator.model.*`` without that prefix
    (``flow.regulator_weights``); ``cfg`` the ``FlowConfig``. Returns mu [80, mel_len1 + mel_len2].
    """
    if h.ndim != 2:
        raise ValueError(f"h must be [channels, tokens], got shape {h.shape}")
    if not 0 <= n_prompt_tokens <= h.shape[1]:
        raise ValueError(f"{n_prompt_tokens} prompt tokens of {h.shape[1]}")
    x = stretch(h, n_prompt_tokens, mel_len1, mel_len2, cfg)
    return conv_stack(x, weights, len(cfg.regulator_sampling_ratios))
