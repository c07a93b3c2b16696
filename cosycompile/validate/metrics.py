"""Audio and token metrics, each comparing a build's output with the FP32 reference's.

Conventions: SNRs are in dB, higher is better, and identical inputs give +inf; distances are 0
for identical inputs, lower is better. Heavy optional packages (pesq, pystoi, resemblyzer) are
imported on first use.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..dsp import mel_spectrogram, resample


def _snr(ref: np.ndarray, test: np.ndarray) -> float:
    ref = np.asarray(ref, np.float64)
    err = np.sum((ref - np.asarray(test, np.float64)) ** 2)
    sig = np.sum(ref**2)
    if err == 0:
        return float("inf")
    return float(10 * np.log10(max(sig, 1e-30) / err))


def _common(a: np.ndarray, b: np.ndarray, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    n = min(a.shape[axis], b.shape[axis])
    return np.take(a, np.arange(n), axis=axis), np.take(b, np.arange(n), axis=axis)


def waveform_snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    """Sample-wise SNR of ``test`` against ``ref`` (dB, higher is better; common length)."""
    return _snr(*_common(np.ravel(ref), np.ravel(test)))


def mel_snr_db(ref_mel: np.ndarray, test_mel: np.ndarray) -> float:
    """SNR of two (log-)mel spectrograms [80, T] (dB, higher is better; common length)."""
    return _snr(*_common(np.asarray(ref_mel), np.asarray(test_mel)))


def log_mel_l1(ref_wav: np.ndarray, test_wav: np.ndarray, sr: int = 24000) -> float:
    """Mean absolute difference of CosyVoice2 log-mels (natural log units, lower is better)."""
    a, b = _common(mel_spectrogram(ref_wav, sr), mel_spectrogram(test_wav, sr))
    return float(np.mean(np.abs(a - b))) if a.size else 0.0


def duration_ratio(ref: np.ndarray, test: np.ndarray) -> float:
    """len(test) / len(ref) (1 is perfect)."""
    return float(len(test) / max(len(ref), 1))


def _mcep(wav: np.ndarray, sr: int, order: int = 24) -> np.ndarray:
    """Mel-cepstra c1..c_order [T, order] from the log-mel via a DCT-II (c0, the energy, excluded)."""
    from scipy.fft import dct

    mel = mel_spectrogram(wav, sr).T  # [T, 80], natural log
    return dct(mel, type=2, norm="ortho", axis=1)[:, 1: order + 1]


def _dtw_path(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cost = np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1))
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0.0
    for i in range(1, n + 1):  # row-wise recursion; the inner min is vectorised except its chain
        row = acc[i - 1, :-1], acc[i - 1, 1:]
        best = np.minimum(row[0], row[1]) + cost[i - 1]
        for j in range(1, m + 1):
            best[j - 1] = min(best[j - 1], acc[i, j - 1] + cost[i - 1, j - 1])
            acc[i, j] = best[j - 1]
    i, j, pi, pj = n, m, [], []
    while i > 0 and j > 0:
        pi.append(i - 1)
        pj.append(j - 1)
        k = int(np.argmin([acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]]))
        i, j = (i - 1, j - 1) if k == 0 else (i - 1, j) if k == 1 else (i, j - 1)
    return np.array(pi[::-1]), np.array(pj[::-1])


def mel_cepstral_distortion(ref_wav: np.ndarray, test_wav: np.ndarray, sr: int = 24000, align: str = "dtw") -> float:
    """MCD in dB (lower is better): 10/ln10 * sqrt(2 * sum (c_ref - c_test)^2), mean over aligned frames."""
    a, b = _mcep(ref_wav, sr), _mcep(test_wav, sr)
    if align == "dtw":
        ia, ib = _dtw_path(a, b)
        a, b = a[ia], b[ib]
    else:
        n = max(len(a), len(b))
        a = np.pad(a, ((0, n - len(a)), (0, 0)))
        b = np.pad(b, ((0, n - len(b)), (0, 0)))
    if not len(a):
        return 0.0
    return float(np.mean(10.0 / np.log(10) * np.sqrt(2 * np.sum((a - b) ** 2, axis=1))))


def multi_resolution_stft_distance(ref: np.ndarray, test: np.ndarray,
                                   ffts: tuple[int, ...] = (512, 1024, 2048)) -> float:
    """Spectral convergence + log-magnitude L1, averaged over resolutions (lower is better)."""
    from scipy.signal import stft

    ref, test = _common(np.ravel(ref).astype(np.float64), np.ravel(test).astype(np.float64))
    total = 0.0
    for n in ffts:
        _, _, a = stft(ref, nperseg=n, noverlap=n - n // 4)
        _, _, b = stft(test, nperseg=n, noverlap=n - n // 4)
        ma, mb = np.abs(a), np.abs(b)
        sc = np.linalg.norm(ma - mb) / max(np.linalg.norm(ma), 1e-12)
        mag = np.mean(np.abs(np.log(ma + 1e-7) - np.log(mb + 1e-7)))
        total += sc + mag
    return float(total / len(ffts))


def pesq_wb(ref: np.ndarray, test: np.ndarray, sr: int) -> float:
    """Wideband PESQ (MOS-LQO, 1..4.64, higher is better) at 16 kHz on the common length.

    NaN when PESQ's voice activity detector finds no speech in the reference (e.g. the output of
    a randomly initialised model): PESQ is undefined there, and NaN keeps it out of averages.
    """
    from pesq import PesqError, pesq

    a, b = _common(resample(np.ravel(ref), sr, 16000), resample(np.ravel(test), sr, 16000))
    score = pesq(16000, a.astype(np.float64), b.astype(np.float64), "wb", on_error=PesqError.RETURN_VALUES)
    return float(score) if score >= 0 else float("nan")


def stoi(ref: np.ndarray, test: np.ndarray, sr: int, extended: bool = False) -> float:
    """STOI (0..1, higher is better) at 16 kHz on the common length."""
    from pystoi import stoi as _stoi

    a, b = _common(resample(np.ravel(ref), sr, 16000), resample(np.ravel(test), sr, 16000))
    return float(_stoi(a, b, 16000, extended=extended))


@lru_cache(maxsize=1)
def _voice_encoder():  # -> resemblyzer.VoiceEncoder
    import torch
    from resemblyzer import VoiceEncoder

    torch.set_num_threads(1)  # small VMs: one thread gives stable timings
    return VoiceEncoder("cpu", verbose=False)


def speaker_similarity(wav_a: np.ndarray, wav_b: np.ndarray, sr: int) -> float:
    """Cosine of resemblyzer's bundled GE2E speaker embeddings (-1..1, higher is better; no download)."""
    from resemblyzer import preprocess_wav

    enc = _voice_encoder()
    ea = enc.embed_utterance(preprocess_wav(resample(np.ravel(wav_a), sr, 16000), source_sr=16000))
    eb = enc.embed_utterance(preprocess_wav(resample(np.ravel(wav_b), sr, 16000), source_sr=16000))
    return float(np.dot(ea, eb) / max(np.linalg.norm(ea) * np.linalg.norm(eb), 1e-12))


# -- token metrics for the LLM -----------------------------------------------------------------

def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def top1_agreement(ref_logits: np.ndarray, test_logits: np.ndarray) -> float:
    """Fraction of positions whose argmax token agrees (0..1, higher is better)."""
    return float(np.mean(np.argmax(ref_logits, -1) == np.argmax(test_logits, -1)))


def kl_divergence(ref_logits: np.ndarray, test_logits: np.ndarray) -> float:
    """Mean KL(P_ref || P_test) over positions, in nats (lower is better)."""
    lp, lq = _log_softmax(ref_logits), _log_softmax(test_logits)
    return float(np.mean(np.sum(np.exp(lp) * (lp - lq), axis=-1)))


def logit_cosine(ref_logits: np.ndarray, test_logits: np.ndarray) -> float:
    """Mean cosine similarity of logit vectors per position (higher is better)."""
    a, b = np.asarray(ref_logits, np.float64), np.asarray(test_logits, np.float64)
    num = np.sum(a * b, axis=-1)
    den = np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-30)
    return float(np.mean(num / den))


def token_edit_distance(ref: list[int], test: list[int]) -> tuple[int, float]:
    """(Levenshtein distance, distance / len(ref)) of two token sequences (lower is better)."""
    prev = list(range(len(test) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(test)
        for j, t in enumerate(test, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != t))
        prev = cur
    d = prev[-1]
    return d, d / max(len(ref), 1)
