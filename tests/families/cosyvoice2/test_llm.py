"""The speech-token LM: the export-friendly decode step against transformers, ONNX Runtime, decoding."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

from cosycompile.families.qwen2_steps import LLMDecodeStep


def _empty_past(lm: Any, batch: int = 1) -> torch.Tensor:
    c = lm.cfg
    return torch.zeros(c.num_layers, 2, batch, c.num_kv_heads, 0, c.head_dim)


def _hf_logits(lm: Any, embeds: torch.Tensor) -> torch.Tensor:
    """What upstream computes: hidden_states[-1] of Qwen2ForCausalLM through the speech head."""
    out = lm.qwen(inputs_embeds=embeds, output_hidden_states=True)
    return lm.llm_decoder(out.hidden_states[-1])


def test_decode_step_matches_transformers(tiny_models: Any) -> None:
    lm = tiny_models.llm
    step = LLMDecodeStep(lm).eval()
    g = torch.Generator().manual_seed(0)
    seq = torch.randn(1, 9, lm.cfg.hidden_size, generator=g)
    with torch.inference_mode():
        logits, past = step(seq, _empty_past(lm))
        assert logits.shape == (1, 9, lm.speech_token_size + 3)
        assert past.shape == (lm.cfg.num_layers, 2, 1, lm.cfg.num_kv_heads, 9, lm.cfg.head_dim)
        assert float((logits - _hf_logits(lm, seq)).abs().max()) < 1e-5
        for n in (1, 1, 2, 1):  # one-token decode steps, and a two-token chunk
            new = torch.randn(1, n, lm.cfg.hidden_size, generator=g)
            logits, past = step(new, past)
            seq = torch.cat([seq, new], dim=1)
            assert past.shape[4] == seq.shape[1]
            assert float((logits - _hf_logits(lm, seq)[:, -n:]).abs().max()) < 1e-5


def test_decode_step_exports_and_matches_ort(tiny_models: Any, tmp_path: Path) -> None:
    lm = tiny_models.llm
    c = lm.cfg
    step = LLMDecodeStep(lm).eval()
    path = tmp_path / "llm_step.onnx"
    example = (torch.randn(1, 3, c.hidden_size), torch.randn(c.num_layers, 2, 1, c.num_kv_heads, 2, c.head_dim))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(step, example, str(path), input_names=["inputs_embeds", "past_key_values"],
                          output_names=["logits", "present_key_values"], opset_version=18, dynamo=False,
                          dynamic_axes={"inputs_embeds": {0: "batch", 1: "seq"},
                                        "past_key_values": {2: "batch", 4: "past"},
                                        "logits": {0: "batch", 1: "seq"},
                                        "present_key_values": {2: "batch", 4: "total"}})
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for B, S, P in ((1, 7, 0), (1, 1, 7), (1, 4, 12), (2, 3, 5)):
        x = torch.randn(B, S, c.hidden_size)
        past = torch.randn(c.num_layers, 2, B, c.num_kv_heads, P, c.head_dim)
        with torch.inference_mode():
            logits, present = step(x, past)
        o_logits, o_present = sess.run(None, {"inputs_embeds": x.numpy(), "past_key_values": past.numpy()})
        assert o_present.shape == (c.num_layers, 2, B, c.num_kv_heads, P + S, c.head_dim)
        assert np.abs(o_logits - logits.numpy()).max() < 1e-4
        assert np.abs(o_present - present.numpy()).max() < 1e-4


def test_inference_greedy_is_deterministic_and_bounded(tiny_models: Any) -> None:
    lm = tiny_models.llm
    text = torch.tensor([[5, 17, 33, 101, 250]])
    a = lm.inference(text, sampling="greedy", max_tokens=24)
    b = lm.inference(text, sampling="greedy", max_tokens=24)
    assert a == b
    assert 2 * 5 <= len(a) <= 24  # the end token is masked for the first 2 x 5 steps
    assert all(0 <= t < lm.speech_token_size for t in a)


def test_inference_matches_the_pipeline_runtime(tiny_models: Any) -> None:
    """Two references of the same decoding: upstream-style (HF cache) and the build's (decode step)."""
    from cosycompile.runtime.pipeline import Prompt, Sampling
    from cosycompile.reference.runners import reference_runtime

    lm = tiny_models.llm
    text = np.array([9, 8, 7, 6], np.int64)
    prompt_text = np.array([40, 41], np.int64)
    prompt_speech = np.array([3, 1000, 6000], np.int64)
    prompt = Prompt(prompt_text, prompt_speech, np.zeros((80, 6), np.float32), np.zeros(192, np.float32))
    runtime = reference_runtime("llm", tiny_models)
    ours = lm.inference(torch.from_numpy(text)[None], torch.from_numpy(prompt_text)[None],
                        torch.from_numpy(prompt_speech)[None], sampling="greedy", max_tokens=30)
    theirs = runtime.generate(text, prompt, Sampling(mode="greedy", max_tokens=30))
    assert ours == theirs.tolist()


def test_inference_ras_sampling_is_seeded(tiny_models: Any) -> None:
    lm = tiny_models.llm
    text = torch.tensor([[1, 2, 3]])
    a = lm.inference(text, sampling="ras", seed=7, max_tokens=16)
    assert a == lm.inference(text, sampling="ras", seed=7, max_tokens=16)
    assert a != lm.inference(text, sampling="ras", seed=8, max_tokens=16)
    assert 6 <= len(a) <= 16
    with pytest.raises(ValueError):
        lm.inference(text, sampling="beam")
