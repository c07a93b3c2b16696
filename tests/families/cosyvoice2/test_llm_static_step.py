"""The static-cache decode step (``LLMStaticStep``) and the decoder that owns its cache, on the CPU:
the same logits as the growing-cache step, slots past the position ignored, a cache that grows in
blocks without a capture, a full cache refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from cosycompile.backends.torch.static_decode import (GROWTH_BLOCK, SLOT_BLOCK, DecoderPerThread, StaticCacheDecoder,
                                                      slots_for)
from cosycompile.families.qwen2_steps import LLMDecodeStep, LLMStaticStep


def _prefill(lm: Any, batch: int, length: int, gen: torch.Generator, device: str = "cpu",
             ) -> tuple[torch.Tensor, torch.Tensor]:
    c = lm.cfg
    embeds = torch.randn(batch, length, c.hidden_size, generator=gen).to(device)
    empty = torch.zeros(c.num_layers, 2, batch, c.num_kv_heads, 0, c.head_dim, device=device)
    with torch.inference_mode():
        return LLMDecodeStep(lm).eval()(embeds, empty)


@pytest.mark.parametrize("batch", [1, 2])
def test_decoder_follows_the_growing_cache_step(tiny_models: Any, batch: int) -> None:
    lm = tiny_models.llm
    gen = torch.Generator().manual_seed(batch)
    _, past = _prefill(lm, batch, 7, gen)
    growing = LLMDecodeStep(lm).eval()
    decoder = StaticCacheDecoder(LLMStaticStep(lm).eval(), "cpu")
    assert not decoder.cuda_graph
    # Without a capture the cache starts one growth block large and grows past it.
    tokens = GROWTH_BLOCK + 5
    decoder.start(past, tokens)
    assert decoder.capacity == GROWTH_BLOCK
    worst = 0.0
    for _ in range(tokens):
        embeds = torch.randn(batch, 1, lm.cfg.hidden_size, generator=gen)
        with torch.inference_mode():
            want, past = growing(embeds, past)
        got = decoder.step(embeds)
        assert got.shape == want.shape
        worst = max(worst, float((got - want).abs().max()))
    assert worst < 1e-5
    assert decoder.capacity == 2 * GROWTH_BLOCK
    # The decoder's cache holds what the growing step's present holds, slot for slot.
    assert torch.allclose(decoder.key_values[..., :past.shape[4], :], past, atol=1e-5)


def test_slots_past_the_position_are_ignored(tiny_models: Any) -> None:
    lm = tiny_models.llm
    c = lm.cfg
    gen = torch.Generator().manual_seed(3)
    _, past = _prefill(lm, 1, 5, gen)
    step = LLMStaticStep(lm).eval()
    clean = torch.zeros(c.num_layers, 2, 1, c.num_kv_heads, 16, c.head_dim)
    clean[..., :5, :] = past
    dirty = clean.clone()
    dirty[..., 5:, :] = 1e3 * torch.randn(dirty[..., 5:, :].shape, generator=gen)
    embeds = torch.randn(1, 1, c.hidden_size, generator=gen)
    position = torch.tensor([5])
    with torch.inference_mode():
        a, new_a = step(embeds, clean, position)
        b, new_b = step(embeds, dirty, position)
        want, present = LLMDecodeStep(lm).eval()(embeds, past)
    assert torch.equal(a, b) and torch.equal(new_a, new_b)
    assert float((a - want).abs().max()) < 1e-5
    assert torch.allclose(new_a[..., 0, :], present[..., 5, :], atol=1e-6)


def test_numpy_in_numpy_out_and_a_full_cache_is_refused(tiny_models: Any) -> None:
    lm = tiny_models.llm
    gen = torch.Generator().manual_seed(4)
    _, past = _prefill(lm, 1, 3, gen)
    decoder = StaticCacheDecoder(LLMStaticStep(lm).eval(), "cpu", max_slots=300)
    assert decoder.fits(300) and not decoder.fits(301)
    with pytest.raises(ValueError, match="exceed the 300 slots"):
        decoder.start(past.numpy(), 298)
    decoder.start(past.numpy(), 4)
    out = decoder.step(np.zeros((1, 1, lm.cfg.hidden_size), np.float32))
    assert isinstance(out, np.ndarray) and out.shape == (1, 1, lm.speech_token_size + 3)
    # The cache grows block by block up to the program's 300 slots (not a whole block past them).
    for _ in range(300 - 4):
        decoder.step(np.zeros((1, 1, lm.cfg.hidden_size), np.float32))
    assert decoder.capacity == 300
    with pytest.raises(RuntimeError, match="cache is full"):
        decoder.step(np.zeros((1, 1, lm.cfg.hidden_size), np.float32))
    assert slots_for(1) == SLOT_BLOCK and slots_for(SLOT_BLOCK + 1) == 2 * SLOT_BLOCK
    assert slots_for(1000, max_slots=600) == 600


def test_cuda_graphs_need_a_cuda_device(tiny_models: Any) -> None:
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        StaticCacheDecoder(LLMStaticStep(tiny_models.llm).eval(), "cpu", cuda_graph=True)


@pytest.mark.gpu
def test_cuda_graph_replays_the_step(tiny_models: Any) -> None:
    """On a CUDA machine (``make test-gpu``): the captured step gives the logits of plain calls, over
    two utterances that share the capture."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import copy

    lm = copy.deepcopy(tiny_models.llm).cuda()
    step = LLMStaticStep(lm).eval()
    gen = torch.Generator().manual_seed(5)
    graph, plain = StaticCacheDecoder(step, "cuda"), StaticCacheDecoder(step, "cuda", cuda_graph=False)
    for length in (6, 9):
        _, past = _prefill(lm, 1, length, gen, "cuda")
        graph.start(past, 20)
        plain.start(past, 20)
        for _ in range(20):
            embeds = torch.randn(1, 1, lm.cfg.hidden_size, generator=gen).cuda()
            want = plain.step(embeds).clone()
            got = graph.step(embeds).clone()
            assert float((got - want).abs().max()) < 1e-4
    assert graph._graph is not None


class _StaticRunner:
    """What the torch backend's runner of ``llm_step_static`` offers the runtime, over the eager module."""

    def __init__(self, lm: Any, max_slots: int) -> None:
        self.step, self.max_slots, self.decoders = LLMStaticStep(lm).eval(), max_slots, 0
        self._per_thread = DecoderPerThread(self._make)

    def _make(self) -> StaticCacheDecoder:
        self.decoders += 1
        return StaticCacheDecoder(self.step, "cpu", max_slots=self.max_slots)

    def decoder(self) -> StaticCacheDecoder:
        return self._per_thread.get()


@pytest.mark.parametrize(("max_slots", "static_used"), [(4096, True), (16, False)])
def test_generate_uses_the_static_step_only_where_the_utterance_fits(tiny_models: Any, max_slots: int,
                                                                     static_used: bool) -> None:
    """The reference runtime keeps llm_step; given a static runner, generate() decodes through it when
    prefix + max_len fit its compiled slots, and falls back to the growing cache when they do not:
    the same greedy tokens either way."""
    from cosycompile.reference.runners import reference_runtime
    from cosycompile.runtime.pipeline import Prompt, Sampling

    rt = reference_runtime("llm", tiny_models)
    assert rt.kept is None  # the PyTorch reference runner has no decoder()
    text = np.arange(3, 11)
    greedy = Sampling(mode="greedy", seed=0, max_tokens=30)
    want = rt.generate(text, Prompt.empty(), greedy)
    want_again = rt.generate(np.arange(5, 12), Prompt.empty(), greedy)
    rt.kept = _StaticRunner(tiny_models.llm, max_slots)
    got = rt.generate(text, Prompt.empty(), greedy)
    again = rt.generate(np.arange(5, 12), Prompt.empty(), greedy)  # a second utterance on the kept decoder
    assert rt.kept.decoders == 1
    assert len(want) > 0 and np.array_equal(got, want) and np.array_equal(again, want_again)
    # The step decoding() hands out: the static decoder's where 10 + 30 positions fit, else llm_step's.
    c = tiny_models.llm.cfg
    next_logits = rt.decoding(np.zeros((c.num_layers, 2, 1, c.num_kv_heads, 10, c.head_dim), np.float32), 30)
    assert isinstance(getattr(next_logits, "__self__", None), StaticCacheDecoder) == static_used


def test_decoders_are_kept_per_thread(tiny_models: Any) -> None:
    """One decoder per thread, the same on every call: utterances on one thread replay one capture, and
    concurrent requests never share a cache."""
    import threading

    step = LLMStaticStep(tiny_models.llm).eval()
    made: list[StaticCacheDecoder] = []

    def make() -> StaticCacheDecoder:
        made.append(StaticCacheDecoder(step, "cpu"))
        return made[-1]

    per_thread = DecoderPerThread(make)
    first, second = per_thread.get(), per_thread.get()
    other: list[StaticCacheDecoder] = []
    worker = threading.Thread(target=lambda: other.append(per_thread.get()))
    worker.start()
    worker.join()
    assert first is second and other[0] is not first and made == [first, other[0]]


def test_steps_run_in_bf16_with_float32_angles(tiny_models: Any) -> None:
    """A step over an LM cast to BF16 stays BF16 (rotary tables and mask in the hidden state's dtype)
    and keeps its logits close to FP32; before, finfo(float32).min overflowed the BF16 mask."""
    import copy

    lm32 = tiny_models.llm
    lm16 = copy.deepcopy(lm32).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(3)
    _, past = _prefill(lm32, 1, 9, gen)
    embeds = 0.02 * torch.randn(1, 1, lm32.cfg.hidden_size, generator=gen)
    with torch.inference_mode():
        want, _ = LLMDecodeStep(lm32).eval()(embeds, past)
        got, present = LLMDecodeStep(lm16).eval()(embeds.bfloat16(), past.bfloat16())
        static = StaticCacheDecoder(LLMStaticStep(lm16).eval(), "cpu")
        static.start(past.bfloat16(), 4)
        got_static = static.step(embeds.bfloat16())
    assert got.dtype == present.dtype == got_static.dtype == torch.bfloat16
    cos = torch.nn.functional.cosine_similarity(want.flatten(), got.float().flatten(), dim=0)
    assert float(cos) > 0.99
    assert float((got_static.float() - got.float()).abs().max()) < 0.05 * float(got.float().abs().max())


def test_rotary_table_follows_the_lm_device(tiny_models: Any) -> None:
    """A step wrapped around an LM on another device builds its rotary table there (a CUDA LM's
    step once kept it on the CPU); the meta device stands in for a GPU here."""
    import copy

    lm = copy.deepcopy(tiny_models.llm).to("meta")
    assert LLMStaticStep(lm).inv_freq.device.type == "meta"
    assert LLMDecodeStep(lm).inv_freq.device.type == "meta"


def test_step_reads_merged_matrices_and_not_the_lm(tiny_models: Any) -> None:
    """Each layer's q/k/v and gate/up are one matrix each, holding the LM's weights in that order, and the
    step carries nothing else of the LM's layers: an export would otherwise hold the separate matrices too,
    unread (a program's state dict keeps every parameter of the module it traced)."""
    lm = tiny_models.llm
    step = LLMStaticStep(lm)
    names = [n for n, _ in step.named_parameters()]
    assert not [n for n in names if any(f".{p}_proj." in n for p in ("q", "k", "v", "gate", "up"))]
    body = lm.qwen.model
    want = sum(p.numel() for m in (body.layers, body.norm, lm.llm_decoder) for p in m.parameters())
    assert sum(p.numel() for p in step.parameters()) == want
    for layer, merged in zip(body.layers, step.layers):
        a, m = layer.self_attn, layer.mlp
        assert torch.equal(merged.qkv_proj.weight, torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        assert torch.equal(merged.qkv_proj.bias, torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
        assert torch.equal(merged.gate_up_proj.weight, torch.cat([m.gate_proj.weight, m.up_proj.weight]))


def test_static_step_is_built_only_where_it_is_read(tiny_models: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its merged matrices are a copy of most of the LM, so the stage's modules make it on first lookup:
    the PyTorch reference (a CPU runtime) never builds it, an export of it does, once."""
    import cosycompile.families.qwen2_steps as qwen2_steps
    from cosycompile.reference.runners import reference_runtime
    from cosycompile.stages.llm.export import stage_parts

    made: list[object] = []

    class Counted(qwen2_steps.LLMStaticStep):
        def __init__(self, lm: Any) -> None:
            super().__init__(lm)
            made.append(self)

    monkeypatch.setattr(qwen2_steps, "LLMStaticStep", Counted)
    rt = reference_runtime("llm", tiny_models)
    assert made == [] and rt.kept is None
    modules, _, _ = stage_parts(tiny_models)
    assert "llm_step_static" in modules and set(modules) == {"llm_step", "llm_step_static"} and made == []
    assert modules["llm_step_static"] is modules["llm_step_static"] and len(made) == 1
