"""CosyVoice-300M's flow and HiFT vocoder equal upstream's own classes in FP32 and load their state dicts strictly.

The fixtures under tests/data/cv1_upstream/ (flow.pt, flow.npz, hift.pt, hift.npz, shapes_300m.json)
were written by make_upstream_fixtures_flow.py (beside this file) running upstream
FunAudioLLM/CosyVoice's ``MaskedDiffWithXvec`` and ``HiFTGenerator`` (with Matcha-TTS's blocks) at
the commits it names, with the tiny shapes of ``cv1_tiny()``; its docstring lists every array.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cosycompile.families.cosyvoice.config import CosyVoiceConfig, cv1_300m, cv1_tiny
from cosycompile.families.cosyvoice.flow import FlowEncoderStep, MaskedDiffWithXvec, regulator_weights
from cosycompile.families.cosyvoice.regulator import interpolate_linear, regulate, stretch
from cosycompile.families.cosyvoice.hift import HiFTGenerator, SineGen
from cosycompile.families.hift import HiFTNetStep, SineGen2
from cosycompile.families.hift_config import HiFTConfig as CV2HiFTConfig
from families.upstream_fixtures import read_npz, read_state, rel_err

DATA = Path(__file__).resolve().parents[2] / "data" / "cv1_upstream"
TOL = 1e-5
CASES = ["p", "n"]  # p: 4 prompt tokens + 45 new (regulator head/mid/tail); n: no prompt, 23 new
EST_ARGS = ("x", "mask", "mu", "t", "spks", "cond")


@pytest.fixture(scope="module")
def cfg() -> CosyVoiceConfig:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return cv1_tiny()


@pytest.fixture(scope="module")
def flow(cfg: CosyVoiceConfig) -> MaskedDiffWithXvec:
    net = MaskedDiffWithXvec(cfg.flow).eval()
    net.load_state_dict(read_state(DATA, "flow"), strict=True)
    return net


@pytest.fixture(scope="module")
def hift(cfg: CosyVoiceConfig) -> HiFTGenerator:
    net = HiFTGenerator(cfg.hift).eval()
    net.load_state_dict(read_state(DATA, "hift"), strict=True)
    return net


@pytest.fixture(scope="module")
def fd() -> dict[str, torch.Tensor]:
    return read_npz(DATA, "flow")


@pytest.fixture(scope="module")
def hd() -> dict[str, torch.Tensor]:
    return read_npz(DATA, "hift")


def case_inputs(fd: dict[str, torch.Tensor], c: str) -> tuple[torch.Tensor, ...]:
    """(token, prompt_token, prompt_feat, embedding, noise) of one fixture case."""
    return (fd[f"{c}_token"], fd[f"{c}_prompt_token"], fd[f"{c}_in_prompt_feat"], fd[f"{c}_in_embedding"],
            fd[f"{c}_in_noise"])


# -- flow numerics ----------------------------------------------------------------------------------
@pytest.mark.parametrize("c", CASES)
def test_encoder_h_equals_upstream(flow: MaskedDiffWithXvec, fd: dict[str, torch.Tensor], c: str) -> None:
    token, prompt_token, _, embedding, _ = case_inputs(fd, c)
    all_tokens = torch.cat([prompt_token, token], dim=1)
    with torch.inference_mode():
        h = flow.encode(all_tokens)
        step_h, spks = FlowEncoderStep(flow)(all_tokens, embedding)
    assert rel_err(h.transpose(1, 2), fd[f"{c}_h"]) <= TOL
    assert torch.equal(step_h, h)
    assert torch.equal(spks, flow.speaker(embedding))


def test_speaker_projection_equals_upstream(flow: MaskedDiffWithXvec, fd: dict[str, torch.Tensor]) -> None:
    """spks as the CFM reads it: the conditioned half of the estimator's batch, zeros in the other."""
    with torch.inference_mode():
        spks = flow.speaker(fd["n_in_embedding"])
    assert rel_err(spks, fd["n_est_in_spks"][:1]) <= TOL
    assert float(fd["n_est_in_spks"][1].abs().max()) == 0.0


@pytest.mark.parametrize("c", CASES)
def test_regulated_mu_equals_upstream(flow: MaskedDiffWithXvec, fd: dict[str, torch.Tensor], c: str,
                                      cfg: CosyVoiceConfig) -> None:
    """Both regulators, torch and numpy, from upstream's own token-rate h."""
    token, prompt_token, prompt_feat, _, _ = case_inputs(fd, c)
    h = fd[f"{c}_h"].transpose(1, 2)  # [1, 80, N]
    mel_len1, mel_len2 = flow.mel_lengths(token.shape[1], prompt_feat)
    with torch.inference_mode():
        mu_torch = flow.length_regulator.inference(h, prompt_token.shape[1], mel_len1, mel_len2)
    mu_np = regulate(h[0].numpy(), prompt_token.shape[1], mel_len1, mel_len2, regulator_weights(flow), cfg.flow)
    ref = fd[f"{c}_mu"]  # [1, T, 80]
    assert rel_err(mu_torch.transpose(1, 2), ref) <= TOL
    assert mu_np.dtype == np.float32
    assert rel_err(mu_np.T[None], ref) <= TOL


def test_regulator_split_matters(flow: MaskedDiffWithXvec, fd: dict[str, torch.Tensor], cfg: CosyVoiceConfig) -> None:
    """Past 40 new tokens the edges are stretched on their own: one interpolation of all new tokens
    would differ, so the case above does test the split (and its frame counts)."""
    token, prompt_token, prompt_feat, _, _ = case_inputs(fd, "p")
    assert token.shape[1] > 2 * cfg.flow.regulator_edge_tokens and prompt_token.shape[1] > 0
    h = fd["p_h"][0].T.numpy()
    n1 = prompt_token.shape[1]
    mel_len1, mel_len2 = flow.mel_lengths(token.shape[1], prompt_feat)
    split = stretch(h, n1, mel_len1, mel_len2, cfg.flow)
    whole = np.concatenate([interpolate_linear(h[:, :n1], mel_len1), interpolate_linear(h[:, n1:], mel_len2)], axis=1)
    assert split.shape == whole.shape == (80, mel_len1 + mel_len2)
    assert rel_err(split, whole) > 1e-2
    assert rel_err(split[:, :mel_len1], whole[:, :mel_len1]) == 0.0  # the prompt part is the same


def test_interpolation_follows_torch() -> None:
    """The numpy interpolation reproduces F.interpolate(linear) for stretching and shrinking, any sizes."""
    g = torch.Generator().manual_seed(0)
    for n, size in [(1, 1), (1, 5), (2, 3), (5, 9), (20, 34), (45, 77), (7, 3), (13, 13), (100, 173), (3, 100)]:
        x = torch.randn(1, 6, n, generator=g)
        ref = F.interpolate(x, size=size, mode="linear")[0]
        assert rel_err(interpolate_linear(x[0].numpy(), size), ref) <= 1e-6, (n, size)


def test_regulator_rejects_prompt_frames_without_prompt_tokens(flow: MaskedDiffWithXvec, cfg: CosyVoiceConfig) -> None:
    with pytest.raises(ValueError, match="no prompt tokens"):
        regulate(np.zeros((80, 10), np.float32), 0, 5, 17, regulator_weights(flow), cfg.flow)


def test_estimator_call_equals_upstream(flow: MaskedDiffWithXvec, fd: dict[str, torch.Tensor]) -> None:
    """One CFG call of the CFM (batch 2: conditioned, unconditioned) at an odd length, 39 frames."""
    args = [fd[f"n_est_in_{k}"] for k in EST_ARGS]
    assert args[0].shape == (2, 80, 39) and float(args[3][0]) > 0
    with torch.inference_mode():
        out = flow.decoder.estimator(*args)
    assert rel_err(out, fd["n_est_out"]) <= TOL


def test_estimator_with_padding_equals_upstream(flow: MaskedDiffWithXvec, fd: dict[str, torch.Tensor]) -> None:
    """Batch 2 at 15 frames, the second item masked after 11: the masks halve with the frames."""
    args = [fd[f"pad_{k}" if k == "mask" else f"pad_in_{k}"] for k in EST_ARGS]
    assert float(args[1][1].sum()) == 11
    with torch.inference_mode():
        out = flow.decoder.estimator(*args)
    assert rel_err(out, fd["pad_out"]) <= TOL
    assert float(out[1, :, 11:].abs().max()) == 0.0


@pytest.mark.parametrize("c", CASES)
def test_mel_equals_upstream(flow: MaskedDiffWithXvec, fd: dict[str, torch.Tensor], c: str, cfg: CosyVoiceConfig) -> None:
    token, prompt_token, prompt_feat, embedding, noise = case_inputs(fd, c)
    mel = flow.inference(token, prompt_token, prompt_feat, embedding, noise)
    assert mel.shape == (1, 80, cfg.flow.mel_frames(token.shape[1]))
    assert rel_err(mel, fd[f"{c}_mel"]) <= TOL


def test_mel_depends_on_the_noise(flow: MaskedDiffWithXvec, fd: dict[str, torch.Tensor]) -> None:
    token, prompt_token, prompt_feat, embedding, noise = case_inputs(fd, "n")
    other = flow.inference(token, prompt_token, prompt_feat, embedding, torch.roll(noise, 1, dims=2))
    assert rel_err(other, fd["n_mel"]) > 1e-3


# -- HiFT numerics ----------------------------------------------------------------------------------
def test_hift_uses_upstreams_sine_source_per_sample_rate() -> None:
    """Upstream picks the original SineGen at 22,050 Hz and SineGen2 otherwise (CosyVoice2's 24 kHz)."""
    with torch.device("meta"):
        cv1 = HiFTGenerator(cv1_300m().hift)
        cv2 = HiFTGenerator(CV2HiFTConfig())
    assert type(cv1.m_source.l_sin_gen) is SineGen and cv1.upsample_scale == 256
    assert type(cv2.m_source.l_sin_gen) is SineGen2 and cv2.upsample_scale == 480


def test_hift_fixture_has_voiced_and_unvoiced_frames(hd: dict[str, torch.Tensor], cfg: CosyVoiceConfig) -> None:
    voiced = hd["f0"] > cfg.hift.nsf_voiced_threshold
    assert voiced.any() and not voiced.all()


def test_hift_f0_equals_upstream(hift: HiFTGenerator, hd: dict[str, torch.Tensor]) -> None:
    with torch.inference_mode():
        f0 = hift.f0_predictor(hd["in_mel"])
    assert rel_err(f0, hd["f0"]) <= TOL


def test_hift_source_equals_upstream_to_its_phase_limit(hift: HiFTGenerator, hd: dict[str, torch.Tensor]) -> None:
    """The NSF excitation. Upstream sums the phase in float32 over the whole utterance; ours wraps it
    as it goes. Against upstream's code run in float64 (same F0): within TOL. Against its float32
    run: no farther than that run is from its own float64 one, plus TOL."""
    with torch.inference_mode():  # from upstream's F0 (the F0 predictor has its own test above)
        f0 = hift.f0_upsamp(hd["f0"][:, None]).transpose(1, 2)
        source = hift.m_source(f0, hd["in_rand_ini"], hd["in_noise"]).transpose(1, 2)
    upstream_limit = rel_err(hd["source"], hd["source_f64"])
    assert rel_err(source, hd["source_f64"]) <= TOL
    assert rel_err(source, hd["source"]) <= upstream_limit + TOL


def test_hift_random_phases_matter(hift: HiFTGenerator, hd: dict[str, torch.Tensor]) -> None:
    """Unlike SineGen2 at 24 kHz, SineGen adds its random initial phases to every sample: the source
    comparison above does check that the draws are read as upstream reads them."""
    with torch.inference_mode():
        a = hift.source(hd["in_mel"], hd["in_rand_ini"], hd["in_noise"])
        b = hift.source(hd["in_mel"], torch.flip(hd["in_rand_ini"], dims=[1]), hd["in_noise"])
    assert rel_err(b, a) > 1e-2


def test_hift_spectrum_and_waveform_equal_upstream(hift: HiFTGenerator, hd: dict[str, torch.Tensor]) -> None:
    """From upstream's own source: the magnitude and phase the iSTFT reads, then the waveform."""
    with torch.inference_mode():
        magnitude, phase = hift.spectrum(hd["in_mel"], hd["source"])
        wav = torch.clamp(hift.istft(magnitude, phase), -hift.cfg.audio_limit, hift.cfg.audio_limit)
    assert rel_err(magnitude, hd["magnitude"]) <= TOL
    assert rel_err(phase, hd["phase"]) <= TOL
    assert rel_err(wav, hd["wav"]) <= TOL


def test_hift_inference_equals_upstream(hift: HiFTGenerator, hd: dict[str, torch.Tensor]) -> None:
    """End to end, mel -> waveform with the saved draws, against both upstream runs. Looser than the
    parts: the source integrates the predicted F0 over the utterance, so the F0 predictor's float32
    rounding, which differs between CPUs' kernels (AVX2 against AVX-512) by a few 1e-7, grows to a few
    1e-5 of the waveform; each part above holds TOL from the same inputs."""
    wav = hift.inference(hd["in_mel"], hd["in_rand_ini"], hd["in_noise"])
    assert wav.shape == (1, hd["in_mel"].shape[2] * hift.upsample_scale)
    assert rel_err(wav, hd["wav"]) <= 10 * TOL
    assert rel_err(wav, hd["wav_f64"]) <= 10 * TOL


# -- keys -------------------------------------------------------------------------------------------
def test_300m_shapes_equal_upstream() -> None:
    """Our 300M flow and HiFT (built on the meta device) have exactly upstream's keys and shapes."""
    ref = json.loads((DATA / "shapes_300m.json").read_text())
    big = cv1_300m()
    with torch.device("meta"):
        nets = {"flow": MaskedDiffWithXvec(big.flow), "hift": HiFTGenerator(big.hift)}
    for name, net in nets.items():
        ours = {k: list(v.shape) for k, v in net.state_dict().items()}
        assert sorted(set(ours) ^ set(ref[name])) == [], name
        assert {k: s for k, s in ours.items() if s != ref[name][k]} == {}, name
    # Spot checks that the reference is the 300M one: two UNet levels of 256, 80-channel regulator, 8x8 HiFT.
    assert ref["flow"]["decoder.estimator.down_blocks.0.2.conv.weight"] == [256, 256, 3]
    assert ref["flow"]["decoder.estimator.up_blocks.0.2.conv.weight"] == [256, 256, 4]
    assert ref["flow"]["decoder.estimator.mid_blocks.11.1.3.attn1.to_q.weight"] == [512, 256]
    assert ref["flow"]["length_regulator.model.12.weight"] == [80, 80, 1]
    assert ref["flow"]["encoder.encoders.5.self_attn.pos_bias_u"] == [8, 64]
    assert ref["hift"]["ups.1.parametrizations.weight.original1"] == [256, 128, 16]
    assert ref["hift"]["source_downs.0.weight"] == [256, 18, 16]


# -- export -----------------------------------------------------------------------------------------
def test_estimator_exports_with_dynamic_frames(flow: MaskedDiffWithXvec, fd: dict[str, torch.Tensor]) -> None:
    """torch.export with T dynamic (the flow_estimator graph's range), traced at an even length, then
    run at upstream's odd-length calls (39 frames, and 15 with padding)."""
    est = flow.decoder.estimator
    g = torch.Generator().manual_seed(0)
    T = 64
    example = (torch.randn(2, 80, T, generator=g), torch.ones(2, 1, T), torch.randn(2, 80, T, generator=g),
               torch.rand(2, generator=g), torch.randn(2, 80, generator=g), torch.randn(2, 80, T, generator=g))
    frames = torch.export.Dim("frames", min=4, max=3000)
    shapes = ({2: frames}, {2: frames}, {2: frames}, None, None, {2: frames})
    with torch.no_grad():
        program = torch.export.export(est, example, dynamic_shapes=shapes, strict=False)
    module = program.module()
    with torch.inference_mode():
        out = module(*[fd[f"n_est_in_{k}"] for k in EST_ARGS])
        padded = module(*[fd[f"pad_{k}" if k == "mask" else f"pad_in_{k}"] for k in EST_ARGS])
        eager = est(*example)
    assert rel_err(out, fd["n_est_out"]) <= TOL
    assert rel_err(padded, fd["pad_out"]) <= TOL
    assert rel_err(module(*example), eager) <= TOL


def test_flow_encoder_step_exports_with_dynamic_tokens(flow: MaskedDiffWithXvec, fd: dict[str, torch.Tensor]) -> None:
    token, prompt_token, _, embedding, _ = case_inputs(fd, "p")
    tokens = torch.export.Dim("tokens", min=2, max=1500)
    g = torch.Generator().manual_seed(1)
    example = (torch.randint(0, flow.cfg.vocab_size, (1, 20), generator=g), torch.randn(1, 192, generator=g))
    with torch.no_grad():
        program = torch.export.export(FlowEncoderStep(flow).eval(), example, dynamic_shapes=({1: tokens}, None),
                                      strict=False)
    h, _ = program.module()(torch.cat([prompt_token, token], dim=1), embedding)
    assert rel_err(h.transpose(1, 2), fd["p_h"]) <= TOL


def test_hift_exports_with_dynamic_frames(hift: HiFTGenerator, hd: dict[str, torch.Tensor]) -> None:
    """The vocoder graph (up to the iSTFT) exports with the frames dynamic down to 1, the noise at
    frames * 256 samples, and runs the fixture's draws as eager does."""
    step = HiFTNetStep(hift).eval()
    frames = torch.export.Dim("frames", min=1, max=3000)
    g = torch.Generator().manual_seed(2)
    T, U = 40, hift.upsample_scale
    example = (torch.randn(1, 80, T, generator=g) * 2 - 4, torch.rand(1, 9, generator=g),
               torch.randn(1, T * U, 9, generator=g))
    with torch.no_grad():
        program = torch.export.export(step, example, dynamic_shapes=({2: frames}, None, {1: frames * U}), strict=False)
    module = program.module()
    for args in ((hd["in_mel"], hd["in_rand_ini"], hd["in_noise"]),
                 (hd["in_mel"][:, :, :1], hd["in_rand_ini"], hd["in_noise"][:, :U])):
        with torch.inference_mode():
            want = step(*args)
        got = module(*args)
        for a, b in zip(got, want):
            assert rel_err(a, b) <= TOL
