"""Signal processing used at run time, in numpy only (a built pipeline runs without torch).

- :func:`mel_spectrogram`: CosyVoice2's 80-bin log-mel at 24 kHz (n_fft 1920, hop 480, no centring).
- :func:`istft`: the inverse STFT HiFT needs after its network (n_fft 16, hop 4), equal to torch.istft.
- :func:`whisper_log_mel` and :func:`kaldi_fbank`: the features of the speech tokenizer and CAM++.
"""

from __future__ import annotations

from functools import lru_cache
from math import gcd

import numpy as np


def hann(n: int) -> np.ndarray:
    """Periodic Hann window (as torch.hann_window / scipy 'hann' with fftbins=True)."""
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)).astype(np.float64)


def _hz_to_mel_slaney(f: np.ndarray) -> np.ndarray:
    f = np.asarray(f, dtype=np.float64)
    lin = f / (200.0 / 3)
    log_part = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(f >= 1000.0, log_part, lin)


def _mel_to_hz_slaney(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    lin = m * (200.0 / 3)
    log_part = 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0))
    return np.where(m >= 15.0, log_part, lin)


@lru_cache(maxsize=8)
def mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    """Slaney-scale, Slaney-normalised triangular filters [n_mels, n_fft//2+1] (librosa's defaults)."""
    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    mels = _mel_to_hz_slaney(np.linspace(_hz_to_mel_slaney(fmin), _hz_to_mel_slaney(fmax), n_mels + 2))
    fdiff = np.diff(mels)
    ramps = mels[:, None] - freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mels[2: n_mels + 2] - mels[:n_mels]))[:, None]
    return weights.astype(np.float32)


def _frames(x: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    n = 1 + (len(x) - n_fft) // hop
    if n <= 0:
        return np.zeros((0, n_fft), x.dtype)
    idx = np.arange(n_fft)[None, :] + hop * np.arange(n)[:, None]
    return x[idx]


def mel_spectrogram(wav: np.ndarray, sr: int = 24000, n_fft: int = 1920, hop: int = 480, n_mels: int = 80,
                    fmin: float = 0.0, fmax: float = 8000.0) -> np.ndarray:
    """CosyVoice2's log-mel [n_mels, T]: reflect pad (n_fft-hop)/2, |STFT| with 1e-9, log(max(x, 1e-5))."""
    x = np.asarray(wav, dtype=np.float64).reshape(-1)
    pad = (n_fft - hop) // 2
    x = np.pad(x, (pad, pad), mode="reflect") if len(x) > pad else np.pad(x, (pad, pad))
    spec = np.fft.rfft(_frames(x, n_fft, hop) * hann(n_fft), axis=1)
    mag = np.sqrt(spec.real**2 + spec.imag**2 + 1e-9)
    mel = mel_filterbank(sr, n_fft, n_mels, fmin, fmax) @ mag.T
    return np.log(np.maximum(mel, 1e-5)).astype(np.float32)


def istft(magnitude: np.ndarray, phase: np.ndarray, n_fft: int = 16, hop: int = 4) -> np.ndarray:
    """Inverse STFT of ``magnitude * exp(i * phase)`` [B, F, N] -> [B, (N-1)*hop], as torch.istft(center=True).

    Frames ``k, k+r, k+2r, ...`` (r = n_fft/hop) do not overlap each other, so overlap-add is r
    vectorised passes instead of a loop over every frame.
    """
    assert n_fft % hop == 0, "n_fft must be a multiple of hop"
    spec = magnitude.astype(np.float64) * np.exp(1j * phase.astype(np.float64))
    window = hann(n_fft)
    frames = np.fft.irfft(spec, n=n_fft, axis=1) * window[None, :, None]  # [B, n_fft, N]
    B, _, N = frames.shape
    length = n_fft + hop * (N - 1)
    out = np.zeros((B, length))
    wsum = np.zeros(length)
    r = n_fft // hop
    for k in range(min(r, N)):
        sel = np.arange(k, N, r)
        start = k * hop
        stop = start + len(sel) * n_fft
        out[:, start:stop] += frames[:, :, sel].transpose(0, 2, 1).reshape(B, -1)
        wsum[start:stop] += np.tile(window**2, len(sel))
    half = n_fft // 2
    out, wsum = out[:, half: length - half], wsum[half: length - half]
    return (out / np.where(wsum > 1e-11, wsum, 1.0)).astype(np.float32)


def resample(wav: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Polyphase resampling by the reduced ratio sr_out/sr_in."""
    if sr_in == sr_out:
        return np.asarray(wav, dtype=np.float32)
    from scipy.signal import resample_poly

    g = gcd(sr_in, sr_out)
    return resample_poly(np.asarray(wav, dtype=np.float64), sr_out // g, sr_in // g).astype(np.float32)


def whisper_log_mel(wav16k: np.ndarray, n_mels: int = 128) -> np.ndarray:
    """Whisper's log-mel [n_mels, T] at 16 kHz (n_fft 400, hop 160, centred, last frame dropped)."""
    x = np.asarray(wav16k, dtype=np.float64).reshape(-1)
    n_fft, hop = 400, 160
    x = np.pad(x, (n_fft // 2, n_fft // 2), mode="reflect" if len(x) > n_fft // 2 else "constant")
    spec = np.fft.rfft(_frames(x, n_fft, hop) * hann(n_fft), axis=1)[:-1]
    power = (np.abs(spec) ** 2).T
    mel = mel_filterbank(16000, n_fft, n_mels, 0.0, 8000.0) @ power
    log = np.log10(np.maximum(mel, 1e-10))
    log = np.maximum(log, log.max() - 8.0) if log.size else log
    return ((log + 4.0) / 4.0).astype(np.float32)


def kaldi_fbank(wav16k: np.ndarray, num_mel_bins: int = 80) -> np.ndarray:
    """Kaldi-style log fbank [T, num_mel_bins] (25 ms/10 ms, DC removal, pre-emphasis 0.97, Povey window).

    Input is float audio in [-1, 1] as CosyVoice passes it (no 16-bit rescaling); dither is 0.
    """
    sr, win, hop, n_fft = 16000, 400, 160, 512
    x = np.asarray(wav16k, dtype=np.float64).reshape(-1)
    frames = _frames(x, win, hop)
    if len(frames) == 0:
        return np.zeros((0, num_mel_bins), np.float32)
    frames = frames - frames.mean(axis=1, keepdims=True)
    frames = np.concatenate([frames[:, :1] * (1 - 0.97), frames[:, 1:] - 0.97 * frames[:, :-1]], axis=1)
    povey = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(win) / (win - 1))) ** 0.85
    spec = np.abs(np.fft.rfft(frames * povey, n=n_fft, axis=1)) ** 2
    # HTK mel banks from 20 Hz to Nyquist, on the FFT bin centres (Kaldi's construction).
    def mel(f: np.ndarray) -> np.ndarray:
        return 1127.0 * np.log(1.0 + np.asarray(f) / 700.0)

    lo, hi = mel(20.0), mel(sr / 2)
    centers = np.linspace(lo, hi, num_mel_bins + 2)
    bins = mel(np.arange(n_fft // 2) * sr / n_fft)
    left, center, right = centers[:-2, None], centers[1:-1, None], centers[2:, None]
    banks = np.maximum(0.0, np.minimum((bins - left) / (center - left), (right - bins) / (right - center)))
    energies = spec[:, : n_fft // 2] @ banks.T
    return np.log(np.maximum(energies, np.finfo(np.float32).eps)).astype(np.float32)
