"""CosyVoice-300M's torch-free stage runtimes, over Runners of its PyTorch networks (the reference's
runtimes), reproduce the networks' own inference (which test_cv1_lm.py and test_cv1_flow.py prove equal
to upstream's): the LM's prefix through the numpy text encoder and its greedy decode, the flow's mel
through the numpy length regulator and the CFM, the HiFT's waveform from the seed's source draws."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from cosycompile.families.cosyvoice.loader import init_model, load_models
from cosycompile.reference.runners import reference_runtime
from cosycompile.runtime.pipeline import Prompt
from cosycompile.runtime.sampling import Sampling
from families.upstream_fixtures import rel_err


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Any:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return load_models(init_model("builtin:cv1-tiny", tmp_path_factory.mktemp("cv1") / "tiny", seed=0))


def _prompt(models: Any, tokens: int, frames: int) -> Prompt:
    rng = np.random.default_rng(1)
    S = models.config.lm.speech_token_size
    return Prompt(text_ids=rng.integers(0, 200, 5), speech_tokens=rng.integers(0, S, tokens),
                  mel=rng.standard_normal((80, frames)).astype(np.float32) - 4.0,
                  embedding=rng.standard_normal(192).astype(np.float32))


def test_lm_prefix_is_the_networks(models: Any) -> None:
    rt = reference_runtime("llm", models)
    prompt = _prompt(models, 7, 12)
    text = np.array([3, 9, 27, 81, 4, 4], np.int64)
    t = torch.from_numpy
    with torch.inference_mode():
        want = models.llm.prefix(t(text)[None], t(prompt.text_ids)[None], t(prompt.speech_tokens)[None],
                                 t(prompt.embedding)[None]).numpy()
    got = rt.prefix(text, prompt)
    # [sos, speaker, 5 + 6 text rows, task_id, 7 speech rows]; the text rows come from numpy.
    assert got.shape == (1, 1 + 1 + 11 + 1 + 7, models.config.lm.llm_input_size)
    assert rel_err(got, want) <= 1e-5
    assert rt.stop_ids == {models.config.lm.speech_token_size}


def _network_greedy(models: Any, text: np.ndarray, prompt: Prompt, max_tokens: int) -> list[int]:
    """Greedy decoding over the LM's own decode step with its cache, upstream's min / max lengths."""
    from cosycompile.families.cosyvoice.lm import DecodeStep

    lm, S = models.llm, models.config.lm.speech_token_size
    step = DecodeStep(lm).eval()
    t = torch.from_numpy
    with torch.inference_mode():
        x = lm.prefix(t(text)[None], t(prompt.text_ids)[None], t(prompt.speech_tokens)[None], t(prompt.embedding)[None])
        c = models.config.lm.decoder
        cache = torch.zeros(c.num_blocks, 2, 1, c.attention_heads, 0, models.config.lm.head_dim)
        out: list[int] = []
        for i in range(min(20 * len(text), max_tokens)):
            logits, cache = step(x, cache)
            logp = logits[0, -1].log_softmax(-1)
            if i < min(2 * len(text), max_tokens):
                logp[S] = -float("inf")
            tok = int(logp.argmax())
            if tok == S:
                break
            out.append(tok)
            x = lm.speech_embedding.weight[tok].reshape(1, 1, -1)
    return out


def test_lm_greedy_decode_equals_the_networks(models: Any) -> None:
    rt = reference_runtime("llm", models)
    prompt = _prompt(models, 7, 12)
    text = np.arange(10, 22, dtype=np.int64)
    got = rt.generate(text, prompt, Sampling(mode="greedy", seed=0, max_tokens=40)).tolist()
    assert len(got) == 40 and len(set(got)) > 1
    assert got == _network_greedy(models, text, prompt, 40)


@pytest.mark.parametrize("prompt_tokens,new_tokens", [(6, 45), (0, 23)])
def test_flow_mel_equals_the_networks_cfm(models: Any, prompt_tokens: int, new_tokens: int) -> None:
    rt = reference_runtime("flow", models)
    prompt = _prompt(models, prompt_tokens, 2 * prompt_tokens + 1) if prompt_tokens else Prompt.empty()
    S = models.config.flow.vocab_size
    tokens = np.random.default_rng(2).integers(0, S, new_tokens)
    got = rt.mel(tokens, prompt)
    # upstream's count of new frames: int(n / 50 * 22050 / 256)
    assert got.shape == (80, int(new_tokens / 50 * 22050 / 256))
    t = torch.from_numpy
    with torch.inference_mode():
        want = models.flow.inference(t(tokens)[None], t(prompt.speech_tokens)[None], t(prompt.mel.T)[None],
                                     t(prompt.embedding)[None], t(rt.rand_noise)).numpy()[0]
    assert rel_err(got, want) <= 1e-5
    assert float(np.abs(got).std()) > 0.1  # the estimator's velocity moved the noise: not a trivial pass


def test_hift_wav_equals_the_networks(models: Any) -> None:
    rt = reference_runtime("hift", models)
    mel = np.random.default_rng(3).standard_normal((80, 30)).astype(np.float32) - 5.0
    got = rt.wav(mel, seed=4)
    assert got.shape == (30 * 256,) and rt.sample_rate == 22050
    rand_ini, noise = rt.source_noise(30, 4)
    t = torch.from_numpy
    with torch.inference_mode():
        want = models.hift.inference(t(mel)[None], t(rand_ini), t(noise)).numpy().reshape(-1)
    assert rel_err(got, want) <= 1e-4


@pytest.mark.parametrize("rate", [50, 25])
def test_first_chunk_is_upstreams_streaming_schedule(models: Any, rate: int) -> None:
    """Upstream CosyVoiceModel (cli/model.py, ace7c47): the first chunk runs when hop + overlap tokens
    are in (token_min_hop_len = 2 * input_frame_rate, token_overlap_len = 20) and emits the flow's mel of
    them less mel_overlap_len = int(20 / rate * 22050 / 256) frames (kept for the next chunk's fade)."""
    import dataclasses

    rt = reference_runtime("flow", models)
    rt.reg_cfg = dataclasses.replace(rt.reg_cfg, input_frame_rate=rate)
    hop, overlap = 2 * rate, 20
    flow_frames = int((hop + overlap) / rate * 22050 / 256)
    assert rt.first_chunk == (hop + overlap, flow_frames - int(overlap / rate * 22050 / 256))
    # The check's workload emits what the flow made of those tokens, less the overlap: a real cut.
    prompt = _prompt(models, 4, 7)
    tokens = np.random.default_rng(5).integers(0, models.config.flow.vocab_size, hop + overlap)
    assert rt.mel(tokens, prompt).shape[1] == flow_frames > rt.first_chunk[1]
