"""Signal processing used at run time, in numpy (scipy only for resampling).

A built pipeline must run where torch and librosa are not installed, so nothing here imports
them; the tests check every function against torch / librosa / torchaudio-style references.

- :func:`mel_spectrogram`: CosyVoice2's 80-bin log-mel at 24 kHz (Matcha-TTS ``mel_spectrogram``).
- :func:`istft`: the inverse STFT HiFT applies after its network (n_fft 16, hop 4), as ``torch.istft``.
- :func:`whisper_log_mel`: the speech tokenizer's input (Whisper's ``log_mel_spectrogram``).
- :func:`kaldi_fbank`: CAM++'s input (``torchaudio.compliance.kaldi.fbank`` defaults, dither 0).
- :func:`resample`: polyphase resampling between the 16 kHz front end and 24 kHz audio.
"""

from __future__ import annotations

from functools import lru_cache
from math import gcd

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = [
    "hann",
    "mel_filterbank",
    "mel_spectrogram",
    "istft",
    "stft",
    "whisper_log_mel",
    "kaldi_fbank",
    "resample",
]


def hann(n: int, periodic: bool = True) -> np.ndarray:
    """Hann window of length ``n`` in float64.

    ``periodic=True`` is ``torch.hann_window(n)`` (the STFT convention: denominator ``n``);
    ``periodic=False`` is the symmetric window (denominator ``n - 1``) that Kaldi's Povey window uses.
    """
    if n <= 1:
        return np.ones(max(n, 0))
    denom = n if periodic else n - 1
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / denom)


# -- Slaney mel scale (librosa's default, htk=False) -------------------------------------------

_F_SP = 200.0 / 3          # Hz per mel below the break
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = np.log(6.4) / 27.0


def _hz_to_mel_slaney(f: np.ndarray | float) -> np.ndarray:
    f = np.asarray(f, dtype=np.float64)
    # The floor only silences log(0) in the branch np.where discards.
    log_part = _MIN_LOG_MEL + np.log(np.maximum(f, 1e-10) / _MIN_LOG_HZ) / _LOGSTEP
    return np.where(f >= _MIN_LOG_HZ, log_part, f / _F_SP)


def _mel_to_hz_slaney(m: np.ndarray | float) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    log_part = _MIN_LOG_HZ * np.exp(_LOGSTEP * (m - _MIN_LOG_MEL))
    return np.where(m >= _MIN_LOG_MEL, log_part, m * _F_SP)


@lru_cache(maxsize=16)
def mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None) -> np.ndarray:
    """Triangular mel filters [n_mels, n_fft//2 + 1], float32, equal to ``librosa.filters.mel`` defaults.

    Slaney mel scale (``htk=False``) and Slaney area normalisation (``norm='slaney'``), so each
    filter integrates to roughly the same energy. ``fmax=None`` means ``sr / 2``. The returned
    array is cached and read-only.
    """
    fmax = sr / 2.0 if fmax is None else float(fmax)
    fft_freqs = np.fft.rfftfreq(n_fft, d=1.0 / sr)
    edges = _mel_to_hz_slaney(np.linspace(_hz_to_mel_slaney(fmin), _hz_to_mel_slaney(fmax), n_mels + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - fft_freqs[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    out = weights.astype(np.float32)
    out.setflags(write=False)
    return out


def _frames(x: np.ndarray, size: int, hop: int) -> np.ndarray:
    """Strided view [..., n_frames, size] of the last axis (no copy); zero frames if too short."""
    if x.shape[-1] < size:
        return np.zeros(x.shape[:-1] + (0, size), x.dtype)
    return sliding_window_view(x, size, axis=-1)[..., ::hop, :]


def mel_spectrogram(wav: np.ndarray, sr: int = 24000, n_fft: int = 1920, hop: int = 480, n_mels: int = 80,
                    fmin: float = 0.0, fmax: float = 8000.0) -> np.ndarray:
    """CosyVoice2's log-mel feature [..., n_mels, T] (natural log of mel-weighted magnitude).

    Matcha-TTS ``mel_spectrogram`` as CosyVoice2's yaml configures it: reflect-pad ``(n_fft - hop)//2``
    on both sides, frames of ``n_fft`` with a periodic Hann window and no centring, magnitude
    ``sqrt(|X|^2 + 1e-9)``, librosa's Slaney filter bank (fmin 0, fmax 8 kHz), ``log(max(x, 1e-5))``.
    T = (len + 2*pad - n_fft) // hop + 1, i.e. len // 480 frames at the defaults. Leading axes of
    ``wav`` are kept as batch axes. Computed in float64, returned as float32.
    """
    x = np.asarray(wav, dtype=np.float64)
    pad = (n_fft - hop) // 2
    widths = [(0, 0)] * (x.ndim - 1) + [(pad, pad)]
    # torch's reflect pad needs pad < length; very short clips get zeros instead of an error.
    x = np.pad(x, widths, mode="reflect" if x.shape[-1] > pad else "constant")
    spec = np.fft.rfft(_frames(x, n_fft, hop) * hann(n_fft), axis=-1)
    mag = np.sqrt(spec.real**2 + spec.imag**2 + 1e-9)
    mel = mel_filterbank(sr, n_fft, n_mels, fmin, fmax).astype(np.float64) @ np.swapaxes(mag, -1, -2)
    return np.log(np.maximum(mel, 1e-5)).astype(np.float32)


def power_mel(wav: np.ndarray, sr: int, n_fft: int, hop: int, n_mels: int) -> np.ndarray:
    """``librosa.feature.melspectrogram`` at its defaults [n_mels, T], float32: centred frames (zero
    padding of ``n_fft // 2`` on both sides, T = 1 + len // hop), a periodic Hann window, the power
    spectrum and librosa's Slaney filter bank (fmin 0, fmax sr/2). Computed in float64."""
    x = np.pad(np.asarray(wav, dtype=np.float64), (n_fft // 2, n_fft // 2))
    spec = np.fft.rfft(_frames(x, n_fft, hop) * hann(n_fft), axis=-1)
    power = spec.real**2 + spec.imag**2
    return (mel_filterbank(sr, n_fft, n_mels).astype(np.float64) @ power.T).astype(np.float32)


def stft(wav: np.ndarray, n_fft: int = 16, hop: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """(magnitude, phase) [..., n_fft//2 + 1, N] of ``torch.stft(center=True, pad_mode='reflect')``.

    Periodic Hann window of length ``n_fft``; the inverse of :func:`istft`. The source branch of
    HiFT runs this on its excitation, so it is here for completeness and for round-trip tests.
    """
    x = np.asarray(wav, dtype=np.float64)
    half = n_fft // 2
    x = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(half, half)], mode="reflect")
    spec = np.fft.rfft(_frames(x, n_fft, hop) * hann(n_fft), axis=-1)
    spec = np.swapaxes(spec, -1, -2)
    return np.abs(spec), np.angle(spec)


def _overlap_add(frames: np.ndarray, hop: int) -> np.ndarray:
    """Sum frames [..., N, n_fft] placed ``hop`` apart -> [..., n_fft + hop*(N-1)].

    Each frame is cut into ceil(n_fft/hop) hop-long blocks; block k of frame t lands on output
    block t+k, so the sum is ceil(n_fft/hop) shifted vectorised adds instead of N scalar loops.
    """
    *lead, N, n_fft = frames.shape
    r = -(-n_fft // hop)
    if r * hop != n_fft:
        frames = np.concatenate([frames, np.zeros((*lead, N, r * hop - n_fft), frames.dtype)], axis=-1)
    blocks = frames.reshape(*lead, N, r, hop)
    out = np.zeros((*lead, N + r - 1, hop), frames.dtype)
    for k in range(r):
        out[..., k: k + N, :] += blocks[..., k, :]
    return out.reshape(*lead, (N + r - 1) * hop)[..., : n_fft + hop * (N - 1)]


def _window_envelope(window: np.ndarray, hop: int, N: int) -> np.ndarray:
    """Overlap-added squared window for N frames, via prefix sums over the window's hop blocks."""
    n_fft = len(window)
    r = -(-n_fft // hop)
    w2 = np.zeros(r * hop)
    w2[:n_fft] = window**2
    prefix = np.concatenate([np.zeros((1, hop)), np.cumsum(w2.reshape(r, hop), axis=0)])
    # Output block j collects window block k from frame j - k, for every k with 0 <= j - k < N.
    j = np.arange(N + r - 1)
    env = prefix[np.minimum(j, r - 1) + 1] - prefix[np.maximum(j - N + 1, 0)]
    return env.reshape(-1)[: n_fft + hop * (N - 1)]


def istft(magnitude: np.ndarray, phase: np.ndarray, n_fft: int = 16, hop: int = 4) -> np.ndarray:
    """Inverse STFT of ``magnitude * exp(1j * phase)`` [..., F, N] -> [..., hop * (N - 1)] samples.

    Equal to ``torch.istft(torch.complex(mag*cos(phase), mag*sin(phase)), n_fft, hop, n_fft,
    window=torch.hann_window(n_fft), center=True)``: irfft of each frame (imaginary parts of the
    DC and Nyquist bins ignored), periodic Hann synthesis window, overlap-add, division by the
    overlap-added squared window, and ``n_fft // 2`` samples trimmed at each end. Where that
    window sum vanishes (torch raises there) samples are left undivided.

    Runs in the inputs' precision: float32 in, float32 arithmetic (as torch does, and about 10x
    faster for the trigonometry); float64 in, float64 throughout. Returns float32 either way.
    HiFT calls it with ``magnitude = min(exp(x), 100)`` and ``phase = sin(y)``.
    """
    mag, ph = np.asarray(magnitude), np.asarray(phase)
    if mag.shape != ph.shape:
        raise ValueError(f"istft: magnitude {mag.shape} and phase {ph.shape} differ")
    bins = n_fft // 2 + 1
    if mag.ndim < 2 or mag.shape[-2] != bins:
        raise ValueError(f"istft: expected [..., {bins}, frames] for n_fft={n_fft}, got {mag.shape}")
    real = np.result_type(mag.dtype, ph.dtype, np.float32)
    if real not in (np.float32, np.float64):
        real = np.dtype(np.float64)
    N = mag.shape[-1]
    if N == 0:
        return np.zeros(mag.shape[:-2] + (0,), np.float32)
    # Frames along the last (contiguous) axis: pocketfft is far faster on many short rows than
    # on a strided middle axis, and writing into this buffer does the transpose for free.
    m = np.swapaxes(mag, -1, -2).astype(real, copy=False)
    p = np.swapaxes(ph, -1, -2).astype(real, copy=False)
    spec = np.empty(m.shape, np.complex64 if real == np.float32 else np.complex128)
    spec.real = m * np.cos(p)
    spec.imag = m * np.sin(p)
    window = hann(n_fft)
    frames = np.fft.irfft(spec, n=n_fft, axis=-1) * window.astype(real)
    signal = _overlap_add(frames, hop)
    envelope = _window_envelope(window, hop, N)
    half = n_fft // 2
    end = signal.shape[-1] - half
    signal, envelope = signal[..., half:end], envelope[half:end]
    return (signal / np.where(envelope > 1e-11, envelope, 1.0).astype(real)).astype(np.float32, copy=False)


def resample(wav: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Resample the last axis from ``sr_in`` to ``sr_out`` Hz (float32).

    ``scipy.signal.resample_poly`` with the ratio reduced by the gcd (24 kHz -> 16 kHz is 2/3),
    i.e. a Kaiser-windowed FIR low-pass; output length ceil(len * sr_out / sr_in).
    """
    if sr_in <= 0 or sr_out <= 0:
        raise ValueError(f"resample: sample rates must be positive, got {sr_in} -> {sr_out}")
    x = np.asarray(wav)
    if sr_in == sr_out:
        return x.astype(np.float32, copy=False)
    from scipy.signal import resample_poly  # scipy's import is slow; only pay it when resampling

    g = gcd(int(sr_in), int(sr_out))
    return resample_poly(x.astype(np.float64), sr_out // g, sr_in // g, axis=-1).astype(np.float32)


def whisper_log_mel(wav16k: np.ndarray, n_mels: int = 128) -> np.ndarray:
    """Whisper's normalised log-mel [n_mels, T] of 16 kHz audio, as CosyVoice2's speech tokenizer takes.

    n_fft 400, hop 160, periodic Hann, centred frames with reflect padding, last frame dropped
    (T = len // 160), power spectrum, librosa Slaney mel bank (``librosa.filters.mel(sr=16000,
    n_fft=400, n_mels)``), ``log10(max(x, 1e-10))``, dynamic range clipped to 8 (i.e. 80 dB) below
    the maximum, then ``(x + 4) / 4``. No 30 s padding (CosyVoice passes ``padding=0``).
    """
    n_fft, hop = 400, 160
    x = np.asarray(wav16k, dtype=np.float64).reshape(-1)
    half = n_fft // 2
    x = np.pad(x, (half, half), mode="reflect" if len(x) > half else "constant")
    spec = np.fft.rfft(_frames(x, n_fft, hop) * hann(n_fft), axis=-1)[:-1]
    power = spec.real**2 + spec.imag**2
    mel = mel_filterbank(16000, n_fft, n_mels).astype(np.float64) @ power.T
    log = np.log10(np.maximum(mel, 1e-10))
    if log.size:
        log = np.maximum(log, log.max() - 8.0)
    return ((log + 4.0) / 4.0).astype(np.float32)


@lru_cache(maxsize=4)
def _kaldi_mel_banks(num_bins: int, n_fft: int, sr: float, low: float, high: float) -> np.ndarray:
    """Kaldi's HTK-mel triangles [num_bins, n_fft//2] on the FFT bin frequencies (no Nyquist bin)."""
    def mel(f: np.ndarray | float) -> np.ndarray:
        return 1127.0 * np.log1p(np.asarray(f, dtype=np.float64) / 700.0)

    # Edges are equally spaced in mel; each triangle spans two steps, peaking at 1 (no area norm).
    edges = np.linspace(mel(low), mel(high), num_bins + 2)
    bin_mel = mel(np.arange(n_fft // 2) * sr / n_fft)[None, :]
    left, center, right = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    out = np.maximum(0.0, np.minimum((bin_mel - left) / (center - left), (right - bin_mel) / (right - center)))
    out.setflags(write=False)
    return out


def kaldi_fbank(wav16k: np.ndarray, num_mel_bins: int = 80) -> np.ndarray:
    """Kaldi log-mel filterbank [T, num_mel_bins] of 16 kHz audio, as CAM++ takes it.

    Equal to ``torchaudio.compliance.kaldi.fbank(wav[None], num_mel_bins=..., dither=0.0,
    sample_frequency=16000)``: 25 ms frames every 10 ms with ``snip_edges`` (T = 1 + (len - 400)
    // 160, none if shorter than 400 samples), per-frame DC removal, pre-emphasis 0.97 (first
    sample against itself), Povey window (symmetric Hann ** 0.85), zero-padded 512-point FFT,
    power spectrum, HTK-mel triangles from 20 Hz to 8 kHz, ``log(max(x, float32 eps))``.

    Scale: the input is used as given. CosyVoice passes float audio in [-1, 1] straight from
    ``torchaudio.load`` and so does this function; it does NOT multiply by 32768 as Kaldi's
    command-line tools effectively do for 16-bit files. The difference is a constant
    ``log(32768**2) = 20.79`` per bin (except where the eps floor binds), which the caller's
    mean subtraction over time removes anyway.
    """
    sr, win, hop, n_fft = 16000, 400, 160, 512
    x = np.asarray(wav16k, dtype=np.float64).reshape(-1)
    frames = _frames(x, win, hop)
    if frames.shape[0] == 0:
        return np.zeros((0, num_mel_bins), np.float32)
    frames = frames - frames.mean(axis=1, keepdims=True)
    # Pre-emphasis with Kaldi's edge rule: sample 0 is treated as its own predecessor.
    previous = np.concatenate([frames[:, :1], frames[:, :-1]], axis=1)
    frames = (frames - 0.97 * previous) * hann(win, periodic=False) ** 0.85
    spec = np.fft.rfft(frames, n=n_fft, axis=1)
    power = spec.real**2 + spec.imag**2
    energies = power[:, : n_fft // 2] @ _kaldi_mel_banks(num_mel_bins, n_fft, sr, 20.0, sr / 2).T
    return np.log(np.maximum(energies, np.finfo(np.float32).eps)).astype(np.float32)
