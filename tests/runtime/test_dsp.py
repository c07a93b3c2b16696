"""cosycompile.runtime.dsp against torch / librosa references written from the upstream definitions.

The runtime module is numpy-only; here torch and librosa stand in for Matcha-TTS's
``mel_spectrogram``, ``torch.istft`` as HiFT calls it, Whisper's ``log_mel_spectrogram`` and
``torchaudio.compliance.kaldi.fbank`` (torchaudio itself is not installed, so its fbank is
re-expressed step by step in torch below).
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from cosycompile.runtime import dsp

# An eval extra: a GPU machine's own Python (make test-gpu GPU_PY=...) may lack it, and must still
# collect this module to run the gpu-marked tests of the others.
librosa = pytest.importorskip("librosa")


def _speechlike(sr: int, seconds: float = 1.5, seed: int = 0) -> np.ndarray:
    """A gliding harmonic tone with a formant-ish envelope, a noise burst, and a quiet floor."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(sr * seconds)) / sr
    f0 = 110 + 40 * np.sin(2 * np.pi * 1.3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    x = sum(np.sin(h * phase) * np.exp(-((h * 140 - 700) / 900) ** 2) / h**0.5 for h in range(1, 40))
    x = x * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    burst = slice(len(t) // 2, len(t) // 2 + sr // 10)
    x[burst] += 0.3 * rng.standard_normal(sr // 10)
    x += 1e-3 * rng.standard_normal(len(t))
    return (0.4 * x / np.abs(x).max()).astype(np.float32)


# -- references --------------------------------------------------------------------------------

def _matcha_mel_torch(wav: np.ndarray) -> np.ndarray:
    n_fft, hop = 1920, 480
    y = torch.from_numpy(wav)[None]
    y = torch.nn.functional.pad(y[:, None], ((n_fft - hop) // 2, (n_fft - hop) // 2), mode="reflect")[:, 0]
    spec = torch.stft(y, n_fft, hop_length=hop, win_length=n_fft, window=torch.hann_window(n_fft), center=False,
                      pad_mode="reflect", normalized=False, onesided=True, return_complex=True)
    spec = torch.sqrt(spec.real**2 + spec.imag**2 + 1e-9)
    basis = torch.from_numpy(librosa.filters.mel(sr=24000, n_fft=n_fft, n_mels=80, fmin=0, fmax=8000))
    return torch.log(torch.clamp(basis @ spec, min=1e-5))[0].numpy()


def _whisper_torch(wav: np.ndarray, n_mels: int) -> np.ndarray:
    audio = torch.from_numpy(wav)
    stft = torch.stft(audio, 400, 160, window=torch.hann_window(400), return_complex=True)
    power = stft[..., :-1].abs() ** 2
    filters = torch.from_numpy(librosa.filters.mel(sr=16000, n_fft=400, n_mels=n_mels))
    log_spec = torch.clamp(filters @ power, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).numpy()


def _kaldi_fbank_torch(wav: np.ndarray, num_bins: int = 80) -> np.ndarray:
    """torchaudio.compliance.kaldi.fbank(dither=0) defaults, one step at a time in float32 torch."""
    x = torch.from_numpy(wav)
    size, shift, padded, sr = 400, 160, 512, 16000.0
    m = 1 + (len(x) - size) // shift
    frames = x.as_strided((m, size), (shift, 1))
    frames = frames - frames.mean(dim=1, keepdim=True)
    prev = torch.nn.functional.pad(frames[None], (1, 0), mode="replicate")[0, :, :-1]
    frames = frames - 0.97 * prev
    frames = frames * torch.hann_window(size, periodic=False).pow(0.85)
    frames = torch.nn.functional.pad(frames, (0, padded - size))
    power = torch.fft.rfft(frames).abs().pow(2)

    def mel(f: torch.Tensor | float) -> torch.Tensor:
        return 1127.0 * torch.log(1.0 + torch.as_tensor(f) / 700.0)

    lo, hi = float(mel(20.0)), float(mel(sr / 2))
    delta = (hi - lo) / (num_bins + 1)
    k = torch.arange(num_bins)[:, None]
    left, center, right = lo + k * delta, lo + (k + 1.0) * delta, lo + (k + 2.0) * delta
    bin_mel = mel(sr / padded * torch.arange(padded // 2))[None]
    banks = torch.clamp(torch.minimum((bin_mel - left) / (center - left), (right - bin_mel) / (right - center)), min=0)
    banks = torch.nn.functional.pad(banks, (0, 1))
    energies = power @ banks.T
    return torch.clamp(energies, min=torch.finfo(torch.float32).eps).log().numpy()


# -- tests ---------------------------------------------------------------------------------------

def test_module_imports_without_torch_or_librosa() -> None:
    code = ("import sys; import cosycompile.runtime.dsp as d; import numpy as np; "
            "d.mel_spectrogram(np.zeros(4800)); d.istft(np.ones((1, 9, 5)), np.zeros((1, 9, 5))); "
            "print(sorted(m for m in ('torch', 'librosa', 'torchaudio') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("sr,n_fft,n_mels,fmax", [(24000, 1920, 80, 8000.0), (16000, 400, 128, None),
                                                  (16000, 400, 80, None)])
def test_mel_filterbank_matches_librosa(sr: int, n_fft: int, n_mels: int, fmax: float | None) -> None:
    ours = dsp.mel_filterbank(sr, n_fft, n_mels, 0.0, fmax)
    ref = librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=0.0, fmax=fmax)
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-8)
    assert not ours.flags.writeable  # shared through the cache


@pytest.mark.parametrize("length", [16000 * 2 + 37, 399, 0])
def test_power_mel_matches_librosa_melspectrogram(length: int) -> None:
    wav = np.random.default_rng(length).standard_normal(length).astype(np.float32)
    ours = dsp.power_mel(wav, 16000, 400, 160, 40)
    ref = librosa.feature.melspectrogram(y=wav, sr=16000, n_fft=400, hop_length=160, n_mels=40)
    assert ours.shape == ref.shape and ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-6 * float(np.abs(ref).max(initial=1.0)))


def test_hann_matches_torch() -> None:
    np.testing.assert_allclose(dsp.hann(16), torch.hann_window(16, dtype=torch.float64).numpy(), atol=1e-15)
    np.testing.assert_allclose(dsp.hann(400, periodic=False),
                               torch.hann_window(400, periodic=False, dtype=torch.float64).numpy(), atol=1e-15)


def test_cosyvoice2_mel_matches_matcha_reference() -> None:
    wav = _speechlike(24000)
    ours, ref = dsp.mel_spectrogram(wav, 24000), _matcha_mel_torch(wav)
    assert ours.shape == ref.shape == (80, len(wav) // 480)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, atol=5e-4, rtol=0)
    # The log floor binds where the input is digital silence.
    assert dsp.mel_spectrogram(np.zeros(24000)).max() == pytest.approx(math.log(1e-5), abs=1e-6)


def test_mel_spectrogram_keeps_batch_axes() -> None:
    wav = np.stack([_speechlike(24000, 0.5, seed) for seed in range(3)])
    batch = dsp.mel_spectrogram(wav)
    assert batch.shape == (3, 80, wav.shape[1] // 480)
    np.testing.assert_array_equal(batch[1], dsp.mel_spectrogram(wav[1]))


def test_istft_matches_torch_istft() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 2, 9, 300)).astype(np.float32)
    mag = np.minimum(np.exp(x), 1e2)  # as HiFT: exp of the network output, clipped
    phase = np.sin(y)
    ref = torch.istft(torch.complex(torch.from_numpy(mag * np.cos(phase)), torch.from_numpy(mag * np.sin(phase))),
                      16, 4, 16, window=torch.hann_window(16), center=True).numpy()
    ours = dsp.istft(mag, phase)
    assert ours.shape == ref.shape == (2, 4 * 299) and ours.dtype == np.float32
    assert np.abs(ours - ref).max() < 1e-5


@pytest.mark.parametrize("n_fft,hop", [(16, 4), (20, 6), (15, 5), (1920, 480)])
def test_istft_general_sizes_match_torch_in_float64(n_fft: int, hop: int) -> None:
    rng = np.random.default_rng(n_fft)
    mag, phase = rng.random((2, n_fft // 2 + 1, 25)), rng.uniform(-np.pi, np.pi, (2, n_fft // 2 + 1, 25))
    spec = torch.complex(torch.from_numpy(mag * np.cos(phase)), torch.from_numpy(mag * np.sin(phase)))
    ref = torch.istft(spec, n_fft, hop, n_fft, window=torch.hann_window(n_fft, dtype=torch.float64),
                      center=True).numpy()
    ours = dsp.istft(mag, phase, n_fft, hop)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() < 1e-6


def test_stft_then_istft_reconstructs_the_signal() -> None:
    wav = _speechlike(24000, 0.5)
    mag, phase = dsp.stft(wav, 16, 4)
    assert mag.shape == (9, len(wav) // 4 + 1)
    back = dsp.istft(mag, phase, 16, 4)
    assert back.shape == (len(wav),)
    assert np.abs(back - wav).max() < 1e-6
    # and stft itself is torch.stft(center=True)
    ref = torch.stft(torch.from_numpy(wav).double(), 16, 4, window=torch.hann_window(16, dtype=torch.float64),
                     return_complex=True).abs().numpy()
    np.testing.assert_allclose(mag, ref, atol=1e-6)


def test_istft_rejects_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="differ"):
        dsp.istft(np.ones((1, 9, 4)), np.ones((1, 9, 5)))
    with pytest.raises(ValueError, match=r"\[\.\.\., 9, frames\]"):
        dsp.istft(np.ones((1, 8, 4)), np.ones((1, 8, 4)))
    assert dsp.istft(np.ones((1, 9, 0)), np.ones((1, 9, 0))).shape == (1, 0)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_whisper_log_mel_matches_whisper_reference(n_mels: int) -> None:
    wav = _speechlike(16000)
    ours, ref = dsp.whisper_log_mel(wav, n_mels), _whisper_torch(wav, n_mels)
    assert ours.shape == ref.shape == (n_mels, len(wav) // 160)
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
    # dynamic range is clipped to 80 dB below the peak: (x + 4) / 4 spans at most 2.0
    assert ours.max() - ours.min() <= 2.0 + 1e-6


def test_kaldi_fbank_matches_torchaudio_steps() -> None:
    wav = _speechlike(16000)
    ours, ref = dsp.kaldi_fbank(wav, 80), _kaldi_fbank_torch(wav, 80)
    assert ours.shape == ref.shape == (1 + (len(wav) - 400) // 160, 80)
    np.testing.assert_allclose(ours, ref, atol=5e-4, rtol=0)


def test_kaldi_fbank_scale_and_short_input() -> None:
    wav = _speechlike(16000, 0.5)
    # Unscaled input: a 16-bit rescale would only add log(32768^2) to every bin.
    np.testing.assert_allclose(dsp.kaldi_fbank(wav * 32768.0) - dsp.kaldi_fbank(wav), 2 * math.log(32768.0),
                               atol=1e-3)
    assert dsp.kaldi_fbank(np.zeros(399)).shape == (0, 80)
    assert dsp.kaldi_fbank(np.zeros(400)).shape == (1, 80)


def test_resample_rates_and_lengths() -> None:
    sr_in, sr_out = 24000, 16000
    t = np.arange(sr_in) / sr_in
    tone = np.sin(2 * np.pi * 440 * t)
    out = dsp.resample(tone, sr_in, sr_out)
    assert out.shape == (sr_out,) and out.dtype == np.float32
    expected = np.sin(2 * np.pi * 440 * np.arange(sr_out) / sr_out)
    assert np.abs(out[200:-200] - expected[200:-200]).max() < 1e-3  # edges see the filter's zero padding
    same = dsp.resample(tone, 16000, 16000)
    assert same.dtype == np.float32 and np.array_equal(same, tone.astype(np.float32))
    # a tone above the new Nyquist is filtered out, not aliased
    high = dsp.resample(np.sin(2 * np.pi * 10000 * t), sr_in, sr_out)
    assert np.sqrt(np.mean(high[200:-200] ** 2)) < 1e-2
    with pytest.raises(ValueError):
        dsp.resample(tone, 0, 16000)
