"""Audio and token metrics comparing a build's output with the FP32 reference's.

Conventions, the same for every function here:

- The first argument is the reference, the second the output under test.
- SNRs are in dB, higher is better, and identical inputs give ``+inf`` (no cap: a finite cap
  would hide the difference between "bit-exact" and "very close").
- Distances are >= 0, lower is better, and identical inputs give exactly 0.
- Signals of different lengths are compared on their common (leading) length, except where a
  function says otherwise (MCD aligns; :func:`duration_ratio` measures the difference).
- The perceptual metrics (PESQ, STOI, speaker similarity) need optional packages (the ``eval``
  extra). They are imported on first use; when one is missing the function raises
  :class:`cosycompile.errors.BackendUnavailable` naming the package, so a caller can skip that
  metric on purpose rather than by accident.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from cosycompile.runtime.dsp import _frames, hann, mel_spectrogram, power_mel, resample
from cosycompile.errors import BackendUnavailable

COSYVOICE_SR = 24000
METRIC_SR = 16000  # PESQ-WB, STOI and resemblyzer all work at 16 kHz


def _missing(package: str, metric: str) -> BackendUnavailable:
    return BackendUnavailable(f"{metric} needs the '{package}' package, which is not installed "
                              f"(pip install 'cosycompile[eval]')")


def _common(a: np.ndarray, b: np.ndarray, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    n = min(a.shape[axis], b.shape[axis])
    sl = [slice(None)] * a.ndim
    sl[axis] = slice(0, n)
    return a[tuple(sl)], b[tuple(sl)]


def _mono(x: np.ndarray) -> np.ndarray:
    return np.ravel(np.asarray(x, dtype=np.float64))


def _to_rate(wav: np.ndarray, sr: int, target: int) -> np.ndarray:
    return resample(_mono(wav), sr, target).astype(np.float64)


# -- signal-level ------------------------------------------------------------------------------

def snr_db(reference: np.ndarray, estimate: np.ndarray) -> float:
    """Signal-to-noise ratio of ``estimate`` against ``reference``, same shapes (dB, higher is better).

    ``10 log10(sum(ref^2) / sum((ref - est)^2))``; ``+inf`` when they are identical. A silent
    reference gives a very negative number for any error (the signal power is floored at 1e-30).
    """
    ref = np.asarray(reference, dtype=np.float64)
    err = float(np.sum((ref - np.asarray(estimate, dtype=np.float64)) ** 2))
    if err == 0.0:
        return float("inf")
    return float(10.0 * np.log10(max(float(np.sum(ref**2)), 1e-30) / err))


def waveform_snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    """Sample-by-sample SNR of ``test`` against ``ref`` on their common length (dB, higher is better).

    Only meaningful when both come from the same random draws (HiFT's source noise): any delay or
    phase change counts as noise. ``+inf`` for identical signals.
    """
    return snr_db(*_common(_mono(ref), _mono(test)))


def mel_snr_db(ref_mel: np.ndarray, test_mel: np.ndarray) -> float:
    """SNR between two log-mel spectrograms [..., 80, T] on their common frames (dB, higher is better).

    Treats the log-mel values themselves as the signal (the flow stage's output), so it measures
    how closely the build reproduces the reference mel, not the audio's own SNR. ``+inf`` if equal.
    """
    a, b = _common(np.asarray(ref_mel, np.float64), np.asarray(test_mel, np.float64))
    return snr_db(a, b)


def log_mel_l1(ref_wav: np.ndarray, test_wav: np.ndarray, sr: int = COSYVOICE_SR) -> float:
    """Mean absolute difference of CosyVoice2 log-mels of two waveforms (natural-log units, lower is better).

    Audio at another rate is resampled to 24 kHz first, so the feature is always CosyVoice2's
    (80 bins to 8 kHz, 50 frames/s); frames are compared on the common length. 0 if identical;
    1.0 means the mel magnitudes differ by a factor e on average.
    """
    a = mel_spectrogram(_to_rate(ref_wav, sr, COSYVOICE_SR))
    b = mel_spectrogram(_to_rate(test_wav, sr, COSYVOICE_SR))
    a, b = _common(a, b)
    return float(np.mean(np.abs(a.astype(np.float64) - b))) if a.size else 0.0


def duration_ratio(ref: np.ndarray, test: np.ndarray) -> float:
    """``len(test) / len(ref)`` in samples (unitless; 1.0 is perfect, farther from 1 is worse).

    Both must be at the same sample rate. An empty reference counts as length 1.
    """
    return float(np.size(test) / max(np.size(ref), 1))


# -- mel-cepstral distortion -------------------------------------------------------------------

_MCD_K = 10.0 / np.log(10.0)


def _mel_cepstrum(wav: np.ndarray, sr: int, order: int) -> np.ndarray:
    """Mel-cepstra c1..c_order [T, order] of the CosyVoice2 log-mel (natural log of amplitude).

    A DCT-II over the mel bins, scaled so that ``log|X(w)| = c0 + sum_m c_m cos(m w)`` on the
    mel-warped axis (SPTK's one-sided convention: scipy's unnormalised DCT-II is 2*sum, so
    divide by the band count). With that scale the textbook constant 10/ln10 * sqrt(2 * sum)
    is the RMS log-spectral distance in dB of the cepstrally smoothed spectra; an orthonormal
    DCT would inflate MCD by sqrt(n_mels/2) (6.3x for 80 bands).
    """
    from scipy.fft import dct

    log_mel = mel_spectrogram(_to_rate(wav, sr, COSYVOICE_SR)).T.astype(np.float64)  # [T, 80]
    return dct(log_mel, type=2, axis=1)[:, 1: order + 1] / log_mel.shape[1]


def _pairwise_euclidean(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    sq = (a**2).sum(1)[:, None] + (b**2).sum(1)[None, :] - 2.0 * a @ b.T
    return np.sqrt(np.maximum(sq, 0.0))


def dtw_path(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Minimum-cost monotone alignment through a cost matrix [n, m] -> (rows, cols) index arrays.

    Symmetric steps (1,0), (0,1), (1,1) with unit weights, from (0, 0) to (n-1, m-1). The
    accumulation runs one anti-diagonal at a time (each depends only on the previous two), so
    it is n+m vectorised steps rather than n*m Python iterations. Memory is O(n*m).
    """
    n, m = cost.shape
    if n == 0 or m == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0.0
    for d in range(2, n + m + 1):  # d = i + j in 1-based acc coordinates
        i = np.arange(max(1, d - m), min(n, d - 1) + 1)
        j = d - i
        best = np.minimum(np.minimum(acc[i - 1, j - 1], acc[i - 1, j]), acc[i, j - 1])
        acc[i, j] = cost[i - 1, j - 1] + best
    rows, cols = [n - 1], [m - 1]
    i, j = n, m
    while (i, j) != (1, 1):
        # Ties prefer the diagonal: the straighter path when costs are flat (e.g. silence).
        steps = ((i - 1, j - 1), (i - 1, j), (i, j - 1))
        i, j = min(steps, key=lambda s: acc[s])
        rows.append(i - 1)
        cols.append(j - 1)
    return np.asarray(rows[::-1]), np.asarray(cols[::-1])


def mel_cepstral_distortion(ref_wav: np.ndarray, test_wav: np.ndarray, sr: int = COSYVOICE_SR,
                            align: str = "dtw", order: int = 24) -> float:
    """Mel-cepstral distortion in dB (lower is better; 0 for identical audio).

    Per frame ``10/ln10 * sqrt(2 * sum_{m=1..order} (c_m - c'_m)^2)``, averaged over the aligned
    frames, on mel-cepstra of the CosyVoice2 log-mel (c0, the level, excluded; see
    :func:`_mel_cepstrum` for the scale). Roughly: identical 0, a 20 dB-SNR white-noise copy a few
    dB, different speakers saying the same thing about 5-10 dB.

    ``align="dtw"``: frames matched by dynamic time warping on the cepstral distance and averaged
    over the warping path, so a delay or a tempo change costs little. ``align="pad"``: frame t
    against frame t, the shorter padded with zero cepstra (a flat spectrum, like silence), so
    timing differences count in full.
    """
    if align not in ("dtw", "pad"):
        raise ValueError(f"mel_cepstral_distortion: align must be 'dtw' or 'pad', not {align!r}")
    a, b = _mel_cepstrum(ref_wav, sr, order), _mel_cepstrum(test_wav, sr, order)
    if align == "dtw":
        if not len(a) or not len(b):
            return 0.0 if len(a) == len(b) else float("inf")
        dist = _pairwise_euclidean(a, b)
        rows, cols = dtw_path(dist)
        per_frame = np.sqrt(np.sum((a[rows] - b[cols]) ** 2, axis=1))
    else:
        n = max(len(a), len(b))
        if n == 0:
            return 0.0
        a = np.pad(a, ((0, n - len(a)), (0, 0)))
        b = np.pad(b, ((0, n - len(b)), (0, 0)))
        per_frame = np.sqrt(np.sum((a - b) ** 2, axis=1))
    return float(_MCD_K * np.sqrt(2.0) * np.mean(per_frame))


# -- multi-resolution STFT ---------------------------------------------------------------------

# (n_fft, hop, win) as in Parallel WaveGAN's multi-resolution STFT loss for 24 kHz audio.
MR_STFT_RESOLUTIONS: tuple[tuple[int, int, int], ...] = ((512, 50, 240), (1024, 120, 600), (2048, 240, 1200))


def _stft_magnitude(x: np.ndarray, n_fft: int, hop: int, win: int) -> np.ndarray:
    """|STFT| [frames, n_fft//2+1] as torch.stft(center=True, reflect), Hann of ``win`` centred in n_fft."""
    window = np.zeros(n_fft)
    left = (n_fft - win) // 2
    window[left: left + win] = hann(win)
    half = n_fft // 2
    x = np.pad(x, (half, half), mode="reflect" if len(x) > half else "constant")
    spec = np.fft.rfft(_frames(x, n_fft, hop) * window, axis=-1)
    # The power floor keeps log() finite in digital silence (as the loss in Parallel WaveGAN).
    return np.sqrt(np.maximum(spec.real**2 + spec.imag**2, 1e-7))


def multi_resolution_stft_distance(ref: np.ndarray, test: np.ndarray,
                                   resolutions: Sequence[tuple[int, int, int]] = MR_STFT_RESOLUTIONS) -> float:
    """Spectral convergence + mean |log-magnitude difference|, averaged over STFT resolutions (lower is better).

    Per resolution ``||S_ref - S_test||_F / ||S_ref||_F + mean|ln S_ref - ln S_test|`` with
    ``S = sqrt(max(|STFT|^2, 1e-7))`` (Parallel WaveGAN's MR-STFT loss, resolutions
    (n_fft, hop, win) = (512, 50, 240), (1024, 120, 600), (2048, 240, 1200)); unitless, 0 for
    identical signals, common length. Insensitive to phase within a frame, unlike waveform SNR.
    """
    a, b = _common(_mono(ref), _mono(test))
    if not len(a):
        return 0.0
    total = 0.0
    for n_fft, hop, win in resolutions:
        sa, sb = _stft_magnitude(a, n_fft, hop, win), _stft_magnitude(b, n_fft, hop, win)
        sc = np.linalg.norm(sa - sb) / max(float(np.linalg.norm(sa)), 1e-12)
        total += sc + float(np.mean(np.abs(np.log(sa) - np.log(sb))))
    return float(total / len(resolutions))


# -- perceptual (optional packages) -------------------------------------------------------------

def pesq_wb(ref: np.ndarray, test: np.ndarray, sr: int) -> float:
    """Wideband PESQ, ITU-T P.862.2 (MOS-LQO 1.04..4.64, higher is better), at 16 kHz, common length.

    Identical signals score 4.64. NaN when PESQ cannot score the pair (no utterance found by its
    level/VAD stage, e.g. silence or a randomly initialised model's output, or audio shorter
    than about 0.25 s): NaN keeps such items out of averages. Raises BackendUnavailable
    without the ``pesq`` package.
    """
    try:
        from pesq import PesqError, pesq
    except ImportError as exc:
        raise _missing("pesq", "pesq_wb") from exc
    a, b = _common(_to_rate(ref, sr, METRIC_SR), _to_rate(test, sr, METRIC_SR))
    if not np.any(a) or not np.any(b):
        return float("nan")  # pesq divides by the peak: all-zero input would reach the C code as NaN
    score = pesq(METRIC_SR, a, b, "wb", on_error=PesqError.RETURN_VALUES)
    return float(score) if score >= 0 else float("nan")


def stoi(ref: np.ndarray, test: np.ndarray, sr: int, extended: bool = False) -> float:
    """Short-time objective intelligibility (0..1, higher is better; ``extended`` for ESTOI) at 16 kHz.

    ``pystoi`` on the common length (it resamples to 10 kHz and drops silent frames itself).
    Identical signals give 1.0. pystoi returns 1e-5 with a warning for clips with fewer than 30
    speech frames (about 0.4 s). Raises BackendUnavailable without the ``pystoi`` package.
    """
    try:
        from pystoi import stoi as _stoi
    except ImportError as exc:
        raise _missing("pystoi", "stoi") from exc
    a, b = _common(_to_rate(ref, sr, METRIC_SR), _to_rate(test, sr, METRIC_SR))
    return float(_stoi(a, b, METRIC_SR, extended=extended))


@lru_cache(maxsize=1)
def _voice_encoder() -> Any:
    try:
        from resemblyzer import VoiceEncoder
    except ImportError as exc:
        raise _missing("resemblyzer", "speaker_similarity") from exc
    # Weights ship inside the wheel (pretrained.pt): nothing is downloaded.
    return VoiceEncoder("cpu", verbose=False)


def _speaker_embedding(wav16k: np.ndarray) -> np.ndarray:
    from resemblyzer.audio import normalize_volume, trim_long_silences
    from resemblyzer.hparams import audio_norm_target_dBFS

    wav = normalize_volume(wav16k.astype(np.float32), audio_norm_target_dBFS, increase_only=True)
    trimmed = trim_long_silences(wav)
    # webrtcvad can reject non-speech (noise from an untrained model, synthetic tones) entirely;
    # embedding the untrimmed audio then beats failing on an empty array.
    if len(trimmed) < METRIC_SR // 4:
        trimmed = wav
    return _embed_utterance(_voice_encoder(), trimmed)


def _embed_utterance(encoder: Any, wav: np.ndarray) -> np.ndarray:
    """resemblyzer's ``VoiceEncoder.embed_utterance`` at its defaults, with the mel of
    :func:`~cosycompile.runtime.dsp.power_mel` in place of librosa's (the same numbers to float32
    rounding), without importing librosa's feature module, a slow import for every process that scores."""
    import torch
    from resemblyzer import hparams

    wav_slices, mel_slices = encoder.compute_partial_slices(len(wav), rate=1.3, min_coverage=0.75)
    if wav_slices[-1].stop >= len(wav):
        wav = np.pad(wav, (0, wav_slices[-1].stop - len(wav)))
    sr = hparams.sampling_rate
    mel = power_mel(wav, sr, sr * hparams.mel_window_length // 1000, sr * hparams.mel_window_step // 1000,
                    hparams.mel_n_channels).T
    with torch.no_grad():
        partials = encoder(torch.from_numpy(np.stack([mel[s] for s in mel_slices]))).numpy()
    raw = partials.mean(axis=0)
    return raw / np.linalg.norm(raw, 2)


def speaker_similarity(wav_a: np.ndarray, wav_b: np.ndarray, sr: int) -> float:
    """Cosine similarity of resemblyzer (GE2E, 256-d) speaker embeddings (-1..1, higher is better).

    Both clips are resampled to 16 kHz, volume-normalised and stripped of long silences as
    ``resemblyzer.preprocess_wav`` does (untrimmed if the VAD keeps under 0.25 s). Identical
    clips give 1.0; resemblyzer's embeddings are non-negative, so in practice the range is about
    0.5 (different speakers) to 1. The encoder is loaded once per process and runs on one
    torch thread (stable timings, and it does not fight the engine under test for cores); the
    caller's thread count is restored afterwards. Raises BackendUnavailable without resemblyzer.
    """
    _voice_encoder()  # raise BackendUnavailable before touching torch
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ea = _speaker_embedding(_to_rate(wav_a, sr, METRIC_SR))
        eb = _speaker_embedding(_to_rate(wav_b, sr, METRIC_SR))
    finally:
        torch.set_num_threads(threads)
    return float(np.dot(ea, eb) / max(float(np.linalg.norm(ea) * np.linalg.norm(eb)), 1e-12))


# -- token metrics for the LLM -----------------------------------------------------------------

def _logit_pair(ref_logits: np.ndarray, test_logits: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(ref_logits, np.float64), np.asarray(test_logits, np.float64)
    if a.shape != b.shape or a.ndim == 0:
        raise ValueError(f"{name}: logits must have the same shape [..., vocab], got {a.shape} and {b.shape}")
    return a, b


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    shifted = x - m
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def top1_agreement(ref_logits: np.ndarray, test_logits: np.ndarray) -> float:
    """Fraction of positions [..., vocab] whose argmax token is the same (0..1, higher is better)."""
    a, b = _logit_pair(ref_logits, test_logits, "top1_agreement")
    return float(np.mean(np.argmax(a, -1) == np.argmax(b, -1)))


def kl_divergence(ref_logits: np.ndarray, test_logits: np.ndarray) -> float:
    """Mean over positions of KL(P_ref || P_test) in nats, P = softmax(logits) (>= 0, lower is better).

    Computed from log-softmax (max-shifted), so huge logits do not overflow. Tokens the reference
    gives zero probability (logit -inf) contribute 0; a token the reference can emit but the
    test has at -inf makes the KL +inf, as it should.
    """
    a, b = _logit_pair(ref_logits, test_logits, "kl_divergence")
    lp, lq = _log_softmax(a), _log_softmax(b)
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (lp - lq), 0.0)
    return float(max(np.mean(np.sum(terms, axis=-1)), 0.0))


def logit_cosine(ref_logits: np.ndarray, test_logits: np.ndarray) -> float:
    """Mean over positions of the cosine between logit vectors (-1..1, higher is better; 1 if identical).

    Note that logits are shift-invariant under softmax and cosine is not: use it to spot a
    broken engine, and :func:`kl_divergence` for what sampling actually sees.
    """
    a, b = _logit_pair(ref_logits, test_logits, "logit_cosine")
    num = np.sum(a * b, axis=-1)
    den = np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-30)
    return float(np.mean(num / den))


def token_edit_distance(ref_tokens: Sequence[int] | np.ndarray,
                        test_tokens: Sequence[int] | np.ndarray) -> tuple[int, float]:
    """(Levenshtein distance, distance / len(ref)) between token sequences (lower is better, 0 if equal).

    Unit-cost insertions, deletions and substitutions. The normalised value is a token error
    rate (it can exceed 1 when the test is much longer); an empty reference divides by 1.
    Each row of the DP table is one numpy pass: the in-row insertion chain is a running
    minimum of ``row[k] - k``.
    """
    ref = np.asarray(ref_tokens).ravel()
    test = np.asarray(test_tokens).ravel()
    m = len(test)
    offsets = np.arange(m + 1)
    prev = offsets.astype(np.int64)
    for i, token in enumerate(ref, 1):
        best = np.empty(m + 1, np.int64)
        best[0] = i
        best[1:] = np.minimum(prev[1:] + 1, prev[:-1] + (test != token))
        prev = np.minimum.accumulate(best - offsets) + offsets
    distance = int(prev[-1])
    return distance, distance / max(len(ref), 1)
