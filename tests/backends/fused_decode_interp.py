"""Run by tests/backends/test_fused_decode.py in a subprocess with ``TRITON_INTERPRET=1`` (Triton's
CPU interpreter) and the interpreter's Triton on the path: the fused decode kernels against
``LLMStaticStep`` on the tiny LM. Prints one JSON object of measured errors; the test judges them."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from cosycompile.backends.torch.fused_decode import FusedDecodeStep, Tiling
from cosycompile.backends.torch.static_decode import StaticCacheDecoder
from cosycompile.families.cosyvoice2.config import PRESETS
from cosycompile.families.cosyvoice2.qwen2lm import Qwen2LM
from cosycompile.families.qwen2_steps import LLMDecodeStep, LLMStaticStep


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def _cosine(got: torch.Tensor, want: torch.Tensor) -> float:
    a, b = got.double().flatten(), want.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def run(weights: str, batch: int, past: int, steps: int, tiling: Tiling, device: str = "cpu") -> dict[str, Any]:
    """Teacher-forced decode of ``steps`` tokens after a random prefill of ``past`` positions: the
    fused step (weights in ``weights``) against the FP32 static step, both through the decoder (on
    CUDA the fused one as a captured CUDA graph)."""
    torch.manual_seed(0)
    # A small speech vocabulary: the interpreter runs the head's programs one by one.
    lm = Qwen2LM(PRESETS["tiny"].llm, speech_token_size=125).eval()
    # Random init leaves the norms at 1 and the biases at 0; give them values so a kernel that drops one shows.
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("norm.weight") else 0.0))
    lm = lm.to(device)
    c = lm.cfg
    gen = torch.Generator().manual_seed(1)
    prefix = torch.randn(batch, past, c.hidden_size, generator=gen).to(device)
    empty = torch.zeros(c.num_layers, 2, batch, c.num_kv_heads, 0, c.head_dim, device=device)
    with torch.inference_mode():
        _, present = LLMDecodeStep(lm).eval()(prefix, empty)
        static = LLMStaticStep(lm).eval()
        want_dec = StaticCacheDecoder(static, device, cuda_graph=False)
        got_dec = StaticCacheDecoder(FusedDecodeStep(static, weights, tiling), device)
        want_dec.start(present, steps)
        got_dec.start(present, steps)
        rel, cos = [], []
        for _ in range(steps):
            e = torch.randn(batch, 1, c.hidden_size, generator=gen).to(device)
            want, got = want_dec.step(e).clone(), got_dec.step(e).clone()
            assert got.shape == want.shape, (got.shape, want.shape)
            rel.append(_relative(got, want))
            cos.append(_cosine(got, want))
        n = past + steps
        cache = _relative(got_dec.key_values[..., :n, :], want_dec.key_values[..., :n, :])
    return {"weights": weights, "batch": batch, "past": past, "max_relative": max(rel), "min_cosine": min(cos),
            "cache_relative": cache, "finite": bool(np.isfinite(rel).all())}


def main() -> int:
    # Small attention blocks and reduction slices: the loops take several turns and end on a partial
    # one. Few programs a launch: the interpreter runs them one after the other.
    small = Tiling(qkv_pairs=8, qkv_k=32, o_rows=32, o_k=32, gate_up_rows=64, gate_up_k=64, down_rows=32,
                   down_k=64, head_rows=64, head_k=32, attn_positions=4, num_warps=1, num_stages=1)
    # o_proj and down_proj cut into reduction slices added atomically; down's last slice is partial.
    split = replace(small, o_split=2, down_split=3, down_k=32, o_rows=64, down_rows=64)
    # Attention with o_proj, and gate/up with down_proj, as one kernel each (3 launches a layer): o's
    # 128 rows in 4 blocks, the MLP's 256 intermediate rows 48 a program (the last program's partly
    # past the end), 16 at a time.
    fused = replace(small, fuse_o=True, fuse_o_rows=32, fuse_mlp=True, mlp_rows=48, mlp_sub=16)
    results = [run("fp32", 1, 7, 3, small), run("fp32", 2, 9, 2, small), run("fp32", 1, 3, 1, Tiling()),
               {**run("fp32", 2, 5, 2, split), "split": True},
               *({**run("fp32", b, past, 2, fused), "fused": True} for b, past in ((1, 7), (2, 5))),
               *(run(w, 1, 7, 2, small) for w in ("bf16", "int8", "fp8")),
               *({**run(w, 1, 7, 2, fused), "fused": True} for w in ("bf16", "int8", "fp8"))]
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
