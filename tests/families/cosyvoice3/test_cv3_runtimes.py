"""CosyVoice3's torch-free stage runtimes, run over Runners of its PyTorch networks, reproduce the
networks' own inference (which test_networks.py proves equal to upstream's): the LM's prefix, stop ids
and greedy decode, the flow's 10-step CFG CFM mel at twice the token rate, the causal HiFT's waveform."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from cosycompile.families.cosyvoice3.hift import HiFTNetStep
from cosycompile.families.cosyvoice3.loader import init_model, load_models
from cosycompile.families.cosyvoice3.runtimes import FlowRuntime, HiFTRuntime, LLMRuntime
from cosycompile.reference.runners import TorchRunner
from cosycompile.runtime.pipeline import Prompt
from cosycompile.runtime.sampling import Sampling
from cosycompile.stages.flow import FLOW_ENCODER, FLOW_ESTIMATOR
from cosycompile.stages.hift import HIFT
from cosycompile.stages.llm import LLM_STEP
from helpers import cv3_network_greedy
from families.upstream_fixtures import rel_err


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Any:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return load_models(init_model("builtin:cv3-tiny", tmp_path_factory.mktemp("cv3") / "tiny", seed=0))


@pytest.fixture()
def prompt(models: Any) -> Prompt:
    rng = np.random.default_rng(1)
    n = 7
    S = models.config.lm.speech_token_size
    return Prompt(text_ids=rng.integers(0, 200, 5), speech_tokens=rng.integers(0, S, n),
                  mel=rng.standard_normal((80, 2 * n)).astype(np.float32) - 4.0,
                  embedding=rng.standard_normal(192).astype(np.float32))


class _LMStep:
    """An ``llm_step`` runner over the PyTorch LM: keeps the HF cache itself and hands the runtime a
    zero cache array of the right length (the runtime only passes it back)."""

    def __init__(self, lm: nn.Module) -> None:
        self.lm, self.cache = lm, None
        self.input_names, self.output_names = LLM_STEP.input_names, LLM_STEP.output_names

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        past = feeds[self.input_names[1]]
        if past.shape[4] == 0:
            self.cache = None
        with torch.inference_mode():
            logits, self.cache = self.lm.step(torch.from_numpy(feeds[self.input_names[0]]), self.cache)
        shape = list(past.shape)
        shape[4] += feeds[self.input_names[0]].shape[1]
        return {self.output_names[0]: logits.numpy(), self.output_names[1]: np.zeros(shape, np.float32)}


def _llm_runtime(lm: nn.Module) -> LLMRuntime:
    cfg = lm.cfg
    assets = {"text_embedding": lm.qwen.model.embed_tokens.weight.detach().numpy(),
              "speech_embedding": lm.speech_embedding.weight.detach().numpy()}
    info = {"num_layers": cfg.num_layers, "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
            "speech_token_size": cfg.speech_token_size}
    return LLMRuntime.from_runners({LLM_STEP.name: _LMStep(lm)}, assets, info)


def test_lm_prefix_and_stop_ids_are_cosyvoice3s(models: Any, prompt: Prompt) -> None:
    lm = models.llm
    rt = _llm_runtime(lm)
    text = np.array([3, 9, 27, 81], np.int64)
    want = lm.prompt_embeddings(torch.from_numpy(text)[None], torch.from_numpy(prompt.text_ids)[None],
                                torch.from_numpy(prompt.speech_tokens)[None]).detach().numpy()
    assert rel_err(rt.prefix(text, prompt), want) == 0.0
    assert rt.stop_ids == set(lm.stop_token_ids) and len(rt.stop_ids) == 200
    assert rt.ignore_eos_id == lm.ignore_eos_id == lm.sos


def _network_greedy(lm: nn.Module, text: np.ndarray, prompt: Prompt, max_tokens: int) -> list[int]:
    return cv3_network_greedy(lm, text, prompt.text_ids, prompt.speech_tokens, max_tokens)


def test_lm_greedy_decode_equals_the_networks(models: Any, prompt: Prompt) -> None:
    import copy

    text = np.array([3, 9, 27, 81], np.int64)
    lm = copy.deepcopy(models.llm)
    S = lm.speech_token_size
    with torch.no_grad():  # stop rows at logit 0, so random weights decode speech tokens for a while
        lm.llm_decoder.weight[S:] = 0.0
    got = _llm_runtime(lm).generate(text, prompt, Sampling(mode="greedy", max_tokens=12))
    assert got.tolist() == _network_greedy(lm, text, prompt, 12) and len(got) == 12
    # Any of the 200 ids after the speech tokens stops decoding, the last one too (CosyVoice2 stops on 3):
    # S + 199 made to outscore the token chosen at step 4 ends the decode by then.
    with torch.no_grad():
        lm.llm_decoder.weight[S + 199] = 2.0 * lm.llm_decoder.weight[int(got[3])]
    stopped = _network_greedy(lm, text, prompt, 12)
    assert len(stopped) <= 3
    assert _llm_runtime(lm).generate(text, prompt, Sampling(mode="greedy", max_tokens=12)).tolist() == stopped


class _Encoder(nn.Module):
    """flow_encoder: (token [1, N], embedding [1, 192]) -> (mu [1, 80, 2N], spks [1, 80]), finalized."""

    def __init__(self, flow: nn.Module) -> None:
        super().__init__()
        self.flow = flow

    def forward(self, token: torch.Tensor, embedding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        spks = self.flow.spk_embed_affine_layer(nn.functional.normalize(embedding, dim=1))
        return self.flow.encode(token).transpose(1, 2).contiguous(), spks


def _flow_runtime(flow: nn.Module, n_timesteps: int = 10) -> FlowRuntime:
    runners = {FLOW_ENCODER.name: TorchRunner(_Encoder(flow), FLOW_ENCODER),
               FLOW_ESTIMATOR.name: TorchRunner(flow.decoder.estimator, FLOW_ESTIMATOR)}
    info = {"n_timesteps": n_timesteps, "cfg_rate": flow.cfg.inference_cfg_rate, "token_mel_ratio": flow.token_mel_ratio}
    return FlowRuntime.from_runners(runners, {"rand_noise": flow.decoder.rand_noise.numpy()}, info)


def test_flow_mel_equals_the_networks_10_step_cfm(models: Any, prompt: Prompt) -> None:
    flow = models.flow
    rt = _flow_runtime(flow)
    tokens = np.random.default_rng(2).integers(0, flow.cfg.vocab_size, 30)
    got = rt.produce(tokens, np.zeros(0, np.int64), prompt, Sampling(), 0)
    want = flow.inference(torch.from_numpy(tokens)[None], torch.from_numpy(prompt.speech_tokens)[None],
                          torch.from_numpy(prompt.mel.T.copy())[None], torch.from_numpy(prompt.embedding)[None])
    assert got.shape == (80, 2 * len(tokens))
    assert rel_err(got, want[0].numpy()) <= 1e-5
    # Fewer steps give another mel: the runtime does run the solver it is told to.
    fewer = _flow_runtime(flow, n_timesteps=3).produce(tokens, np.zeros(0, np.int64), prompt, Sampling(), 0)
    assert rel_err(fewer, want[0].numpy()) > 1e-3


def test_flow_refuses_an_encoder_at_another_token_rate(models: Any, prompt: Prompt) -> None:
    rt = _flow_runtime(models.flow)
    rt.token_mel_ratio = 3
    with pytest.raises(ValueError, match="CosyVoice3 makes 3 per token"):
        rt.mel(np.arange(5), prompt)


def test_hift_wav_equals_the_networks_causal_inference(models: Any) -> None:
    hift = models.hift
    c = hift.cfg
    info = {"samples_per_frame": hift.upsample_scale, "nb_harmonics": c.nb_harmonics, "istft_n_fft": c.istft_n_fft,
            "istft_hop": c.istft_hop_len, "audio_limit": c.audio_limit, "sample_rate": c.sampling_rate}
    rt = HiFTRuntime.from_runners({HIFT.name: TorchRunner(HiFTNetStep(hift), HIFT)}, {}, info)
    mel = (np.random.default_rng(3).standard_normal((80, 40)) * 1.5 - 5.0).astype(np.float32)
    got = rt.wav(mel, seed=5)
    rand_ini, noise = rt.source_noise(mel.shape[1], 5)
    assert rand_ini[0, 0] == 0.0 and noise.min() >= 0.0 and noise.max() < 1.0  # uniform, as upstream's torch.rand
    # A longer draw of the same seed extends a shorter one, as reading upstream's fixed noise from its start does.
    assert np.array_equal(rt.source_noise(mel.shape[1] + 10, 5)[1][:, :noise.shape[1]], noise)
    import dataclasses

    hift.set_noise(torch.from_numpy(rand_ini), torch.from_numpy(noise))
    try:
        want, _ = hift.inference(torch.from_numpy(mel)[None])  # F0 in float64, as upstream
        hift.cfg = dataclasses.replace(c, f0_float64=False)
        want32, _ = hift.inference(torch.from_numpy(mel)[None])
    finally:
        hift.cfg = c
        hift.m_source.l_sin_gen.rand_ini = hift.m_source.l_sin_gen.sine_waves = None
    assert got.shape == (mel.shape[1] * hift.upsample_scale,) and np.abs(want.numpy()).max() > 1e-3
    # The graph computes F0 in float32 (ONNX Runtime has no float64 convolution): equal to the network
    # run so, and within what that costs of upstream's float64 F0.
    assert rel_err(got, want32[0].numpy()) <= 1e-5
    assert 0.0 < rel_err(got, want[0].numpy()) <= 1e-3
