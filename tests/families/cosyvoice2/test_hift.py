"""HiFT vocoder: conv STFT, the NSF sine source against upstream's formula, ONNX export."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

from cosycompile.families.hift import HiFTNetStep, SineGen2


def _mel(T: int, seed: int = 0) -> torch.Tensor:
    """A smooth log-mel-like input (values around -5, slowly varying)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 80, T, generator=g)
    x = F.avg_pool1d(F.pad(x, (2, 2), mode="replicate"), 5, 1)
    return x * 1.5 - 5.0


def _source_draws(T: int, harmonics: int = 9, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rand_ini = torch.rand(1, harmonics, generator=g)
    rand_ini[:, 0] = 0
    return rand_ini, torch.randn(1, T * 480, harmonics, generator=g)


def test_conv_stft_equals_torch_stft(tiny_models: Any) -> None:
    hift = tiny_models.hift
    x = torch.randn(2, 480 * 7, generator=torch.Generator().manual_seed(1))
    spec = torch.stft(x, 16, 4, 16, window=torch.hann_window(16), center=True, pad_mode="reflect",
                      return_complex=True)
    ours = hift.stft(x)
    assert ours.shape == (2, 18, 480 * 7 // 4 + 1)
    torch.testing.assert_close(ours[:, :9], spec.real, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours[:, 9:], spec.imag, atol=1e-5, rtol=1e-5)


def _upstream_sines(f0_frames: torch.Tensor, U: int, sr: int, harmonics: int) -> torch.Tensor:
    """Upstream SineGen2's phase path, written out in float64: the reference for ours."""
    f0 = f0_frames.double()[:, :, None].repeat_interleave(U, dim=1)           # nearest upsampling
    rad = (f0 * torch.arange(1, harmonics + 1, dtype=torch.float64) / sr) % 1
    rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / U, mode="linear").transpose(1, 2)
    phase = torch.cumsum(rad, dim=1) * 2 * math.pi
    phase = F.interpolate(phase.transpose(1, 2) * U, scale_factor=U, mode="linear").transpose(1, 2)
    return torch.sin(phase)


@pytest.mark.parametrize("U,T", [(480, 400), (15, 60), (2, 40)])
def test_sine_source_matches_upstream_formula(U: int, T: int) -> None:
    sr = 24000 if U == 480 else 750
    gen = SineGen2(sr, U, 8, sine_amp=1.0, noise_std=0.0, voiced_threshold=0.0)
    f0 = (0.006 + 0.003 * torch.sin(torch.arange(T) / 9.0))[None] * sr      # 100..220 Hz at 24 kHz
    f0_up = f0[:, :, None].repeat_interleave(U, dim=1)
    zero_ini = torch.zeros(1, 9)
    ours = gen(f0_up, zero_ini, torch.zeros(1, T * U, 9))
    ref = _upstream_sines(f0, U, sr, 9)
    assert ours.shape == ref.shape
    assert float((ours.double() - ref).abs().max()) < 2e-3


def test_random_initial_phase_is_inert_at_480x() -> None:
    """Upstream adds rand_ini to sample 0, which the x480 linear downsampling never reads."""
    gen = SineGen2(24000, 480, 8, 0.1, 0.003, 10.0)
    f0 = torch.full((1, 480 * 10, 1), 180.0)
    noise = torch.zeros(1, 480 * 10, 9)
    a = gen(f0, torch.zeros(1, 9), noise)
    b = gen(f0, torch.rand(1, 9), noise)
    assert torch.equal(a, b)


def test_builtin_vocoder_is_voiced_and_audible(tiny_models: Any) -> None:
    hift = tiny_models.hift
    mel = _mel(50)
    with torch.inference_mode():
        f0 = hift.f0_predictor(mel)
        rand_ini, noise = _source_draws(50)
        wav = hift.inference(mel, rand_ini, noise)
        again = hift.inference(mel, rand_ini, noise)
    assert (f0 > 10).float().mean() > 0.9, "the built-in F0 predictor should give a voiced source"
    assert 50 < float(f0.mean()) < 400
    assert wav.shape == (1, 50 * 480)
    assert torch.isfinite(wav).all() and float(wav.abs().max()) <= 0.99
    assert 1e-3 < float(wav.std()) < 0.5
    assert torch.equal(wav, again)


def _snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    return 10 * math.log10(float(np.sum(ref.astype(np.float64) ** 2)) /
                           max(float(np.sum((ref.astype(np.float64) - test) ** 2)), 1e-30))


def test_hift_net_step_exports_and_matches_ort(tiny_models: Any, tmp_path: Path) -> None:
    hift = tiny_models.hift
    step = HiFTNetStep(hift).eval()
    path = tmp_path / "hift.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(step, (_mel(20), *_source_draws(20)), str(path), input_names=["mel", "rand_ini", "noise"],
                          output_names=["magnitude", "phase"], opset_version=18, dynamo=False,
                          dynamic_axes={"mel": {2: "frames"}, "noise": {1: "samples"},
                                        "magnitude": {2: "stft_frames"}, "phase": {2: "stft_frames"}})
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["mel", "rand_ini", "noise"]
    for T in (13, 64):
        mel = _mel(T, seed=T)
        rand_ini, noise = _source_draws(T, seed=T)
        with torch.inference_mode():
            mag, phase = step(mel, rand_ini, noise)
            wav = hift.inference(mel, rand_ini, noise)
        o_mag, o_phase = sess.run(None, {"mel": mel.numpy(), "rand_ini": rand_ini.numpy(), "noise": noise.numpy()})
        assert o_mag.shape == tuple(mag.shape) == (1, 9, T * 120 + 1)
        o_wav = hift.istft(torch.from_numpy(o_mag), torch.from_numpy(o_phase)).clamp(-0.99, 0.99)
        assert _snr_db(wav.numpy(), o_wav.numpy()) >= 40.0
        # The reference waveform is exactly the wrapper's output through the iSTFT.
        torch.testing.assert_close(wav, hift.istft(mag, phase).clamp(-0.99, 0.99))
