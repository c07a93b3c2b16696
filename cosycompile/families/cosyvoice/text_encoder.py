"""CosyVoice-300M's text path in numpy (float32): text ids to the rows of the LM's prefix.

The stage runtime runs without torch, and the text is encoded once per request, so this is plain
numpy rather than a graph: text embedding rows, the Conformer text encoder (input Linear and
LayerNorm, x sqrt(d), pre-norm layers of relative-position self-attention and a swish feed-forward,
``after_norm``), then ``text_encoder_affine_layer``. It is :mod:`.encoder`'s ``ConformerEncoder``
over a whole sequence, with the same relative-position table and the same mask (upstream runs the
text encoder with chunks of one position: each sees itself and the past). Weights are read by their
state-dict keys (:func:`.lm.text_encoder_weights`); nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

ENC = "text_encoder."


def _linear(x: np.ndarray, w: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    y = x @ w[name + ".weight"].T
    bias = w.get(name + ".bias")
    return y if bias is None else y + bias


def _layer_norm(x: np.ndarray, w: Mapping[str, np.ndarray], name: str, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = np.square(x - mean).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + np.float32(eps)) * w[name + ".weight"] + w[name + ".bias"]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def relative_positions(first: int, last: int, d_model: int) -> np.ndarray:
    """[first-last+1, d]: sinusoidal embeddings of offsets first, first-1, ..., last (sin and cos
    interleaved), as :class:`.encoder.RelPositionalEncoding` makes them."""
    div = np.exp(np.arange(0, d_model, 2, dtype=np.float32) * np.float32(-(math.log(10000.0) / d_model)))
    ang = np.arange(first, last - 1, -1).astype(np.float32)[:, None] * div[None, :]
    return np.stack([np.sin(ang), np.cos(ang)], axis=-1).reshape(-1, d_model).astype(np.float32)


def visible_keys(n: int, chunk: int) -> np.ndarray | None:
    """[n, n] bool: the keys each query may see (its chunk and earlier ones); None for full attention."""
    if chunk <= 0:
        return None
    q = np.arange(n)
    return np.arange(n)[None, :] < ((q // chunk + 1) * chunk)[:, None]


def _attention(x: np.ndarray, pos: np.ndarray, mask: np.ndarray | None, w: Mapping[str, np.ndarray],
               name: str, heads: int) -> np.ndarray:
    """Relative-position self-attention (learned biases u, v) of ``x`` [N, D] over itself."""
    n, d = x.shape
    dk = d // heads

    def split(t: np.ndarray) -> np.ndarray:  # [N, D] -> [heads, N, dk]
        return t.reshape(t.shape[0], heads, dk).transpose(1, 0, 2)

    q = _linear(x, w, name + ".linear_q").reshape(n, heads, dk)
    k, v = split(_linear(x, w, name + ".linear_k")), split(_linear(x, w, name + ".linear_v"))
    p = split(_linear(pos, w, name + ".linear_pos"))
    ac = (q + w[name + ".pos_bias_u"]).transpose(1, 0, 2) @ k.transpose(0, 2, 1)
    bd_all = (q + w[name + ".pos_bias_v"]).transpose(1, 0, 2) @ p.transpose(0, 2, 1)  # [heads, N, 2N-1]
    # Query i and key j are i-j apart: column N-1-i+j of ``pos`` (offsets N-1 down to -(N-1)).
    col = (n - 1 - np.arange(n))[:, None] + np.arange(n)[None, :]
    bd = np.take_along_axis(bd_all, np.broadcast_to(col, (heads, n, n)), axis=2)
    scores = (ac + bd) / np.float32(math.sqrt(dk))
    if mask is not None:
        scores = np.where(mask[None], scores, np.float32(-np.inf))
    attn = _softmax(scores)
    out = (attn @ v).transpose(1, 0, 2).reshape(n, d)
    return _linear(out, w, name + ".linear_out")


def text_features(text_ids: np.ndarray, weights: Mapping[str, np.ndarray], info: Mapping[str, int]) -> np.ndarray:
    """[N] int64 text ids -> [N, llm_input_size] float32: the rows the LM's prefix holds for the text.

    ``weights``: :func:`.lm.text_encoder_weights` (state-dict keys to float32 arrays); ``info``:
    :func:`.lm.text_encoder_info` (``text_encoder_heads``, ``text_encoder_blocks``, ``text_encoder_chunk``).
    Encode the prompt text and the text together, as upstream does: the encoder is causal, so a text's
    rows depend on the prompt before it.
    """
    w = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}
    ids = np.asarray(text_ids, dtype=np.int64).reshape(-1)
    heads, blocks = int(info["text_encoder_heads"]), int(info["text_encoder_blocks"])
    x = w["text_embedding.weight"][ids]
    x = _layer_norm(_linear(x, w, ENC + "embed.out.0"), w, ENC + "embed.out.1", 1e-5)
    d = x.shape[-1]
    x = x * np.float32(math.sqrt(d))
    n = ids.shape[0]
    if n > 0:
        pos = relative_positions(n - 1, 1 - n, d)
        mask = visible_keys(n, int(info["text_encoder_chunk"]))
        for i in range(blocks):
            name = f"{ENC}encoders.{i}"
            x = x + _attention(_layer_norm(x, w, name + ".norm_mha", 1e-12), pos, mask, w, name + ".self_attn", heads)
            h = _linear(_layer_norm(x, w, name + ".norm_ff", 1e-12), w, name + ".feed_forward.w_1")
            # swish, h * sigmoid(h), with the sigmoid through tanh: exp(-h) overflows for very negative h
            h = h * (np.float32(0.5) + np.float32(0.5) * np.tanh(np.float32(0.5) * h))
            x = x + _linear(h, w, name + ".feed_forward.w_2")
    x = _layer_norm(x, w, ENC + "after_norm", 1e-5)
    return _linear(x, w, "text_encoder_affine_layer").astype(np.float32)
