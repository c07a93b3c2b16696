"""The Qwen2 decode steps every Qwen2-based family exports: the same submodules as its LM, as graphs.

CosyVoice2's ``Qwen2LM`` and CosyVoice3's ``CosyVoice3LM`` differ only outside the Qwen2 body (their
speech embeddings and prefixes), so one pair of steps serves both. A step reads three things of the
LM it wraps: ``cfg`` (``num_heads``, ``num_kv_heads``, ``head_dim``, ``rope_theta``), ``qwen`` (the
transformers ``Qwen2ForCausalLM``) and ``llm_decoder`` (the speech-token head).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn


class BuiltOnFirstUse(Mapping[str, Any]):
    """Graph modules made when first looked up. The static step copies each layer's q/k/v and gate/up
    into merged matrices (memory and seconds worth sparing for the 0.5B LM: docs/bench-log/2026-11-27-h100-fp8.md),
    and only a torch program export reads it (a GPU target's, or a CPU target's with ``static_cache``):
    ONNX exports and the PyTorch reference never do."""

    def __init__(self, makers: dict[str, Callable[[], Any]]) -> None:
        self._makers = makers
        self._made: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._made:
            self._made[name] = self._makers[name]()
        return self._made[name]

    def __contains__(self, name: object) -> bool:  # Mapping's default would build the module
        return name in self._makers

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


def decode_step_modules(lm: nn.Module) -> Mapping[str, Any]:
    """The LLM stage's graph modules of a Qwen2-based LM, each built on first use."""
    return BuiltOnFirstUse({"llm_step": lambda: LLMDecodeStep(lm).eval(),
                            "llm_step_static": lambda: LLMStaticStep(lm).eval()})


def quant_target(lm: nn.Module) -> Any:
    """What the LLM quantizer quantizes of a Qwen2-based LM (``FamilyInfo.llm_quant_target``): the
    transformers body, calibrated on the records' embeddings, exported as :class:`LLMDecodeStep`."""
    from cosycompile.families import LMQuantTarget

    c = lm.cfg
    return LMQuantTarget(module=lm.qwen, calibrate=lambda x: lm.qwen.model(inputs_embeds=x),
                         decode_step=lambda: LLMDecodeStep(lm), widths=(c.hidden_size, c.intermediate_size),
                         checkpoints=True)


def _rotate_half(x: torch.Tensor, half: int) -> torch.Tensor:
    # ``half`` is a Python int (head_dim // 2), not ``x.shape[-1] // 2``: a traced shape becomes
    # Shape/Gather/Div/Unsqueeze nodes feeding the slices, for q and for k in every layer.
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class _StepLayers(nn.Module):
    """What both decode-step forms share: the LM they read, rotary angles, a layer's
    projections split into heads, and the rest of a layer after attention."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm
        c = lm.cfg
        self.num_heads, self.kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        # On the LM's device: a step wrapped around an LM already on a GPU must not leave this on the CPU.
        device = next(lm.parameters()).device
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32, device=device)
                                           / c.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _rotary(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [1, 1, S, D] at absolute positions ``pos`` [S] (float), in ``dtype``: the angles
        stay float32 (a BF16 position times a frequency is off by a radian past a few hundred), the
        tables take the hidden state's dtype so that a BF16 step stays BF16 (a no-op in float32)."""
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos()[None, None].to(dtype), emb.sin()[None, None].to(dtype)

    # B and S are passed in, read once from the step's input: reading them from each layer's
    # hidden state traces a Shape/Gather/Unsqueeze/Concat chain per reshape in every layer (with the
    # rotary split, a fifth of the exported step's nodes: 2,111 -> 1,688 on the 0.5B INT8 engine).
    def _project(self, layer: nn.Module, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, B: Any, S: Any,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, heads, S, D] and k, v [B, kv_heads, S, D] of the new positions, rotated."""
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = self._split_heads(attn.q_proj(x), self.num_heads, B, S)
        k = self._split_heads(attn.k_proj(x), self.kv_heads, B, S)
        v = self._split_heads(attn.v_proj(x), self.kv_heads, B, S)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin), v

    def _split_heads(self, t: torch.Tensor, heads: int, B: Any, S: Any) -> torch.Tensor:
        """[B, S, heads * D] -> [B, heads, S, D]."""
        return t.view(B, S, heads, self.head_dim).transpose(1, 2)

    def _rotate(self, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return t * cos + _rotate_half(t, self.head_dim // 2) * sin

    def _finish(self, layer: nn.Module, h: torch.Tensor, ctx: torch.Tensor, B: Any, S: Any) -> torch.Tensor:
        """The layer's output from its input ``h`` [B, S, H] and attention context [B, heads, S, D]."""
        h = h + layer.self_attn.o_proj(ctx.transpose(1, 2).reshape(B, S, self.num_heads * self.head_dim))
        return h + layer.mlp(layer.post_attention_layernorm(h))


class LLMDecodeStep(_StepLayers):
    """Export-friendly decode step over the SAME submodules as the LM it wraps.

    ``forward(inputs_embeds [B,S,H], past_key_values [L,2,B,KVH,P,D])`` returns speech-token logits
    ``[B,S,V]`` and ``present_key_values [L,2,B,KVH,P+S,D]``. Positions run P..P+S-1; new tokens
    attend causally to each other and fully to the past. There is no transformers Cache object,
    so the graph traces into plain ONNX ops and one graph serves prefill and decode.
    """

    # The graph dims whose guards torch.export proves only from 2 (stages.common.export_program).
    export_from_two = ("seq",)

    def forward(self, inputs_embeds: torch.Tensor, past_key_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        body = self.lm.qwen.model
        B, S, _ = inputs_embeds.shape
        P = past_key_values.shape[4]
        cos, sin = self._rotary(torch.arange(S, dtype=torch.float32, device=inputs_embeds.device) + P,
                                inputs_embeds.dtype)
        # Query i (absolute P+i) may see keys 0..P+i.
        key_pos = torch.arange(S + P, device=inputs_embeds.device)[None, :]
        allowed = key_pos <= (torch.arange(S, device=inputs_embeds.device)[:, None] + P)
        bias = torch.zeros(allowed.shape, dtype=inputs_embeds.dtype, device=inputs_embeds.device).masked_fill(
            ~allowed, torch.finfo(inputs_embeds.dtype).min)
        groups = self.num_heads // self.kv_heads
        h = inputs_embeds
        # One flat stack at the end: nested stacks ([k, v] per layer, then the layers) exported as two
        # Concats, i.e. two copies of the whole cache per step.
        presents: list[torch.Tensor] = []
        for i, layer in enumerate(body.layers):
            q, k, v = self._project(layer, h, cos, sin, B, S)
            k = torch.cat([past_key_values[i, 0], k], dim=2)
            v = torch.cat([past_key_values[i, 1], v], dim=2)
            presents += [k, v]
            # Grouped-query attention without repeating K/V per query head: the G query heads that
            # share a KV head become G*S rows of one product. Repeating K/V (HF's repeat_kv) wrote
            # the cache once per query head each step, a visible share of ONNX Runtime's profile
            # (docs/bench-log/2026-11-24-llm-step-without-repeat-kv.md).
            qg = q.reshape(B, self.kv_heads, groups * S, self.head_dim)
            scores = torch.matmul(qg, k.transpose(2, 3)) / math.sqrt(self.head_dim)
            scores = scores.view(B, self.kv_heads, groups, S, -1) + bias
            probs = torch.softmax(scores, dim=-1).view(B, self.kv_heads, groups * S, -1)
            ctx = torch.matmul(probs, v).view(B, self.num_heads, S, self.head_dim)
            h = self._finish(layer, h, ctx, B, S)
        logits = self.lm.llm_decoder(body.norm(h))
        return logits, torch.stack(presents).unflatten(0, (len(body.layers), 2))


def _merged_linear(*parts: nn.Linear) -> nn.Linear:
    """One ``nn.Linear`` whose output is the outputs of ``parts`` side by side (a copy of their weights)."""
    first = parts[0]
    out = nn.Linear(first.in_features, sum(p.out_features for p in parts), bias=first.bias is not None,
                    device=first.weight.device, dtype=first.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(torch.cat([p.weight for p in parts]))
        if out.bias is not None:
            out.bias.copy_(torch.cat([p.bias for p in parts]))
    return out.requires_grad_(False)


class _MergedLayer(nn.Module):
    """A Qwen2 decoder layer as the static step reads it: q/k/v one matrix, gate/up another (copies),
    the norms, o_proj and down_proj the layer's own modules."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.input_layernorm, self.post_attention_layernorm = layer.input_layernorm, layer.post_attention_layernorm
        self.qkv_proj = _merged_linear(attn.q_proj, attn.k_proj, attn.v_proj)
        self.qkv_sizes = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
        self.o_proj = attn.o_proj
        self.gate_up_proj = _merged_linear(mlp.gate_proj, mlp.up_proj)
        self.down_proj, self.act_fn = mlp.down_proj, mlp.act_fn


class LLMStaticStep(_StepLayers):
    """One-token decode step over a KV cache of fixed size, the form a CUDA graph can replay.

    ``forward(inputs_embeds [B,1,H], key_values [L,2,B,KVH,M,D], position [1] int64)`` returns
    the logits ``[B,1,V]`` of the token at ``position`` and its keys and values
    ``new_key_values [L,2,B,KVH,1,D]``. Slots ``0..position-1`` of ``key_values`` hold the past;
    later slots are ignored. The caller writes ``new_key_values`` into slot ``position``: the
    program never copies the cache, so every step has the same shapes and the same buffers.

    Each layer reads q/k/v as one matrix and gate/up as another (:class:`_MergedLayer`, copies made
    at construction: later changes to the LM's weights do not reach the step). At batch 1 a
    matrix-vector product costs a kernel's latency more than its bytes, so on an H100 the compiled
    BF16 step ran faster merged than apart, at the same logits
    (docs/bench-log/2026-11-27-h100-fp8.md). The step does not hold the LM itself, whose separate
    matrices an export would otherwise carry unread.
    """

    def __init__(self, lm: nn.Module) -> None:
        super().__init__(lm)
        body = lm.qwen.model
        self.layers = nn.ModuleList(_MergedLayer(layer) for layer in body.layers)
        self.norm, self.head = body.norm, lm.llm_decoder
        del self.lm

    def _project(self, layer: nn.Module, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, B: Any, S: Any,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = layer.qkv_proj(layer.input_layernorm(h)).split(layer.qkv_sizes, dim=-1)
        q = self._split_heads(q, self.num_heads, B, S)
        k = self._split_heads(k, self.kv_heads, B, S)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin), self._split_heads(v, self.kv_heads, B, S)

    def _finish(self, layer: nn.Module, h: torch.Tensor, ctx: torch.Tensor, B: Any, S: Any) -> torch.Tensor:
        h = h + layer.o_proj(ctx.transpose(1, 2).reshape(B, S, self.num_heads * self.head_dim))
        gate, up = layer.gate_up_proj(layer.post_attention_layernorm(h)).chunk(2, dim=-1)
        return h + layer.down_proj(layer.act_fn(gate) * up)

    def forward(self, inputs_embeds: torch.Tensor, key_values: torch.Tensor,
                position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B = inputs_embeds.shape[0]
        M = key_values.shape[4]
        cos, sin = self._rotary(position.to(torch.float32), inputs_embeds.dtype)
        slots = torch.arange(M, device=inputs_embeds.device)
        bias = torch.zeros(M, dtype=inputs_embeds.dtype, device=inputs_embeds.device).masked_fill(
            slots >= position, torch.finfo(inputs_embeds.dtype).min)
        groups = self.num_heads // self.kv_heads
        scale = 1.0 / math.sqrt(self.head_dim)
        h = inputs_embeds
        news: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            q, k, v = self._project(layer, h, cos, sin, B, 1)
            news += [k, v]
            qg = q.reshape(B, self.kv_heads, groups, self.head_dim)
            # The new token's own score is computed apart from the cache's, so the cache is only read.
            past = torch.matmul(qg, key_values[i, 0].transpose(2, 3)) * scale + bias
            own = (qg * k).sum(dim=-1, keepdim=True) * scale
            probs = torch.softmax(torch.cat([past, own], dim=-1), dim=-1)
            ctx = torch.matmul(probs[..., :M], key_values[i, 1]) + probs[..., M:] * v
            h = self._finish(layer, h, ctx.view(B, self.num_heads, 1, self.head_dim), B, 1)
        logits = self.head(self.norm(h))
        return logits, torch.stack(news).unflatten(0, (len(self.layers), 2))
