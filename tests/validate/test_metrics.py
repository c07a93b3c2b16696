"""Audio and token metrics on signals with known answers.

The audio is synthesised here (no espeak-ng, no downloads): a source-filter "voice" with glottal
pulses, five formants, aspiration, fricative bursts between syllables and a -65 dB noise floor,
so that log-spectral metrics see a speech-like spectrum rather than a bare tone. Two voices
differ in F0 (115 vs 210 Hz) and vocal-tract length (formants x1.18); two utterances of one
voice differ in vowel order, intonation and noise.
"""

from __future__ import annotations

import builtins
import math
from typing import Any

import numpy as np
import pytest
from scipy.signal import butter, lfilter

from cosycompile.runtime.dsp import mel_spectrogram
from cosycompile.errors import BackendUnavailable
from cosycompile.validate import metrics as M

SR = 24000
VOWELS = {  # F1..F3 in Hz of an adult male voice
    "a": (730, 1090, 2440), "i": (270, 2290, 3010), "u": (300, 870, 2240),
    "e": (530, 1840, 2480), "o": (570, 840, 2410),
}


def _resonator(x: np.ndarray, freq: float, bandwidth: float) -> np.ndarray:
    r = math.exp(-math.pi * bandwidth / SR)
    return lfilter([1 - r], [1, -2 * r * math.cos(2 * math.pi * freq / SR), r * r], x)


def synth_voice(f0: float, formant_scale: float, vowels: str, seed: int, syllable_s: float = 0.22) -> np.ndarray:
    """About len(vowels) * 0.22 + 0.2 s of 24 kHz float32 audio, peak 0.5."""
    rng = np.random.default_rng(seed)
    seg = int(syllable_s * SR)
    n = len(vowels) * seg
    t = np.arange(n) / SR
    f0_track = f0 * (1.1 - 0.2 * t / t[-1]) * (1 + 0.02 * np.sin(2 * np.pi * 5.0 * t))
    f0_track *= np.repeat(1 + 0.05 * rng.standard_normal(len(vowels)), seg)
    cycle = (np.cumsum(f0_track) / SR) % 1.0
    # Glottal flow: slow opening, abrupt closure; its derivative excites the tract with speech-like tilt.
    flow = np.where(cycle < 0.6, 0.5 - 0.5 * np.cos(np.pi * cycle / 0.6), np.maximum(0.0, 1 - (cycle - 0.6) / 0.05))
    flow = np.where(cycle < 0.65, flow, 0.0)
    source = np.diff(flow, prepend=0.0)
    source += 0.15 * np.abs(source).max() * rng.standard_normal(n) * flow
    out = np.zeros(n)
    high_pass = butter(4, 3000 * formant_scale / (SR / 2), "high")
    for k, vowel in enumerate(vowels):
        sl = slice(k * seg, (k + 1) * seg)
        formants = np.array([*VOWELS[vowel], 3500, 4500]) * formant_scale
        y = sum(gain * _resonator(source[sl], fr, bw)
                for fr, bw, gain in zip(formants, (70, 90, 120, 200, 250), (1.0, 0.6, 0.35, 0.2, 0.12)))
        out[sl] = y * np.sin(np.pi * np.linspace(0, 1, seg)) ** 0.6
        if k % 2:
            burst = lfilter(*high_pass, rng.standard_normal(seg // 4)) * np.hanning(seg // 4)
            out[k * seg: k * seg + seg // 4] += 0.1 * np.abs(y).max() * burst
    out = np.concatenate([np.zeros(SR // 10), out, np.zeros(SR // 10)])
    out = 0.5 * out / np.abs(out).max()
    out += 10 ** (-65 / 20) * rng.standard_normal(len(out))
    return out.astype(np.float32)


def add_noise(clean: np.ndarray, snr_db: float, seed: int = 0) -> np.ndarray:
    """``clean`` plus white noise scaled to exactly ``snr_db`` over the whole clip."""
    noise = np.random.default_rng(seed).standard_normal(len(clean))
    clean64 = clean.astype(np.float64)
    noise *= math.sqrt(np.sum(clean64**2) / np.sum(noise**2) / 10 ** (snr_db / 10))
    return clean64 + noise


@pytest.fixture(scope="module")
def voice() -> np.ndarray:
    return synth_voice(115, 1.0, "aiueoaeio", seed=1)


@pytest.fixture(scope="module")
def noisy(voice: np.ndarray) -> dict[int, np.ndarray]:
    return {snr: add_noise(voice, snr) for snr in (30, 20, 10)}


def _decreasing(values: list[float]) -> bool:
    return all(a > b for a, b in zip(values, values[1:]))


# -- identity ----------------------------------------------------------------------------------

def test_identical_audio_scores_perfectly(voice: np.ndarray) -> None:
    assert M.waveform_snr_db(voice, voice) == math.inf
    mel = mel_spectrogram(voice)
    assert M.mel_snr_db(mel, mel.copy()) == math.inf
    assert M.log_mel_l1(voice, voice, SR) == 0.0
    assert M.mel_cepstral_distortion(voice, voice, SR, align="dtw") == 0.0
    assert M.mel_cepstral_distortion(voice, voice, SR, align="pad") == 0.0
    assert M.multi_resolution_stft_distance(voice, voice) == 0.0
    assert M.duration_ratio(voice, voice) == 1.0
    assert M.pesq_wb(voice, voice, SR) == pytest.approx(4.64, abs=0.01)
    assert M.stoi(voice, voice, SR) == pytest.approx(1.0, abs=1e-6)
    assert M.speaker_similarity(voice, voice, SR) == pytest.approx(1.0, abs=1e-5)


# -- additive noise ----------------------------------------------------------------------------

def test_waveform_snr_reads_back_the_added_noise(voice: np.ndarray, noisy: dict[int, np.ndarray]) -> None:
    for snr, x in noisy.items():
        assert M.waveform_snr_db(voice, x) == pytest.approx(snr, abs=0.5)
    # a different noise draw at the same level reads the same
    assert M.waveform_snr_db(voice, add_noise(voice, 20, seed=7)) == pytest.approx(20, abs=0.5)
    # 2-D input and a longer test signal: compared on the common length
    assert M.waveform_snr_db(voice[None], np.concatenate([noisy[20], np.ones(100)])) == pytest.approx(20, abs=0.5)
    assert M.snr_db(np.ones(4), np.ones(4) * 1.1) == pytest.approx(20.0)


def test_spectral_metrics_get_worse_with_more_noise(voice: np.ndarray, noisy: dict[int, np.ndarray]) -> None:
    levels = [noisy[snr] for snr in (30, 20, 10)]
    ref_mel = mel_spectrogram(voice)
    mel_snr = [M.mel_snr_db(ref_mel, mel_spectrogram(x)) for x in levels]
    l1 = [M.log_mel_l1(voice, x, SR) for x in levels]
    mcd = [M.mel_cepstral_distortion(voice, x, SR) for x in levels]
    mr_stft = [M.multi_resolution_stft_distance(voice, x) for x in levels]
    assert _decreasing(mel_snr) and mel_snr[-1] > 0
    assert _decreasing([-v for v in l1]) and l1[0] > 0
    assert _decreasing([-v for v in mcd])
    assert _decreasing([-v for v in mr_stft]) and mr_stft[0] > 0
    # The mel-cepstrum's scale makes MCD a log-spectral distance in dB: a few dB at 20 dB SNR,
    # not tens (an orthonormal DCT would read about 6x higher).
    assert 2.0 < mcd[1] < 12.0


def test_perceptual_metrics_get_worse_with_more_noise(voice: np.ndarray, noisy: dict[int, np.ndarray]) -> None:
    levels = [noisy[snr] for snr in (30, 20, 10)]
    pesq = [M.pesq_wb(voice, x, SR) for x in levels]
    stoi = [M.stoi(voice, x, SR) for x in levels]
    assert _decreasing(pesq) and 1.0 <= pesq[-1] < pesq[0] < 4.64
    assert _decreasing(stoi) and 0.0 < stoi[-1] < stoi[0] < 1.0


def test_pesq_of_silence_is_nan_not_an_error() -> None:
    silence = np.zeros(SR)
    assert math.isnan(M.pesq_wb(silence, silence, SR))


def test_metrics_resample_other_rates(voice: np.ndarray, noisy: dict[int, np.ndarray]) -> None:
    from cosycompile.runtime.dsp import resample

    at16 = resample(voice, SR, 16000), resample(noisy[20], SR, 16000)
    assert M.pesq_wb(*at16, 16000) == pytest.approx(M.pesq_wb(voice, noisy[20], SR), abs=0.05)
    assert M.log_mel_l1(*at16, 16000) == pytest.approx(M.log_mel_l1(voice, noisy[20], SR), rel=0.1)


# -- alignment ---------------------------------------------------------------------------------

def test_mcd_dtw_forgives_a_time_shift_that_pad_does_not(voice: np.ndarray) -> None:
    shifted = np.concatenate([np.zeros(1000, np.float32), voice])  # 41.7 ms: not a whole mel frame
    dtw = M.mel_cepstral_distortion(voice, shifted, SR, align="dtw")
    pad = M.mel_cepstral_distortion(voice, shifted, SR, align="pad")
    assert dtw < 0.3 * pad
    assert pad > 3.0
    with pytest.raises(ValueError, match="align"):
        M.mel_cepstral_distortion(voice, shifted, SR, align="trim")


def test_dtw_path_on_a_known_matrix() -> None:
    # b repeats a's middle element: the best path pairs a[1] with both copies, at zero cost.
    a = np.array([[0.0], [1.0], [2.0]])
    b = np.array([[0.0], [1.0], [1.0], [2.0]])
    rows, cols = M.dtw_path(np.abs(a - b.T))
    assert rows.tolist() == [0, 1, 1, 2] and cols.tolist() == [0, 1, 2, 3]
    rows, cols = M.dtw_path(np.zeros((3, 3)))  # flat costs: the diagonal
    assert rows.tolist() == cols.tolist() == [0, 1, 2]


def test_duration_ratio() -> None:
    assert M.duration_ratio(np.zeros(24000), np.zeros(36000)) == 1.5
    assert M.duration_ratio(np.zeros(0), np.zeros(3)) == 3.0


# -- speaker -----------------------------------------------------------------------------------

def test_speaker_similarity_separates_voices(voice: np.ndarray) -> None:
    import torch

    same_voice_other_words = synth_voice(120, 1.0, "oueiaoiea", seed=2)
    other_voice_same_words = synth_voice(210, 1.18, "aiueoaeio", seed=3)
    threads = torch.get_num_threads()
    same = M.speaker_similarity(voice, same_voice_other_words, SR)
    other = M.speaker_similarity(voice, other_voice_same_words, SR)
    assert torch.get_num_threads() == threads  # the metric's one-thread setting does not leak
    assert same > 0.85
    assert other < same - 0.1
    # the same holds with the clips at 16 kHz
    from cosycompile.runtime.dsp import resample

    assert M.speaker_similarity(resample(voice, SR, 16000), resample(other_voice_same_words, SR, 16000),
                                16000) == pytest.approx(other, abs=0.02)


def test_speaker_embedding_is_resemblyzers(voice: np.ndarray) -> None:
    """The embedding equals resemblyzer's own ``embed_utterance`` (which computes its mel with librosa)."""
    from cosycompile.runtime.dsp import resample

    wav = resample(voice, SR, 16000)
    encoder = M._voice_encoder()
    for clip in (wav, wav[: 16000 // 2]):  # several partial windows, and one zero-padded window
        np.testing.assert_allclose(M._embed_utterance(encoder, clip), encoder.embed_utterance(clip), atol=2e-6)


def test_missing_optional_package_raises_backend_unavailable(monkeypatch: pytest.MonkeyPatch,
                                                             voice: np.ndarray) -> None:
    real_import = builtins.__import__

    def no_pesq(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pesq" or name.startswith("pesq."):
            raise ImportError("No module named 'pesq'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pesq)
    with pytest.raises(BackendUnavailable, match="'pesq' package"):
        M.pesq_wb(voice, voice, SR)


# -- token metrics -----------------------------------------------------------------------------

def test_token_metrics_on_identical_logits() -> None:
    logits = np.random.default_rng(0).standard_normal((7, 50)) * 5
    assert M.top1_agreement(logits, logits) == 1.0
    assert M.kl_divergence(logits, logits) == pytest.approx(0.0, abs=1e-12)
    assert M.logit_cosine(logits, logits) == pytest.approx(1.0, abs=1e-12)
    assert M.token_edit_distance([1, 2, 3], [1, 2, 3]) == (0, 0.0)


def test_top1_agreement_counts_positions() -> None:
    ref = np.eye(4)                        # argmax 0, 1, 2, 3
    test = np.eye(4)[[0, 1, 3, 2]]         # argmax 0, 1, 3, 2
    assert M.top1_agreement(ref, test) == 0.5
    assert M.top1_agreement(ref[None], test[None]) == 0.5  # [batch, T, vocab]


def test_kl_divergence_known_values() -> None:
    # P = (1/2, 1/2), Q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3)
    ref = np.log([[0.5, 0.5]])
    test = np.log([[0.25, 0.75]]) + 3.0   # a shift of the logits changes nothing
    assert M.kl_divergence(ref, test) == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), rel=1e-12)
    # mean over positions: the second position is identical
    both = M.kl_divergence(np.vstack([ref, ref]), np.vstack([test, ref]))
    assert both == pytest.approx(0.5 * (0.5 * math.log(2) + 0.5 * math.log(2 / 3)), rel=1e-12)
    # huge logits neither overflow nor lose the answer
    assert M.kl_divergence(ref + 1e4, test + 1e4) == pytest.approx(M.kl_divergence(ref, test), rel=1e-9)
    # a token the reference never emits contributes nothing; one the test rules out makes KL infinite
    assert M.kl_divergence(np.array([[0.0, -np.inf]]), np.array([[0.0, 5.0]])) == pytest.approx(
        math.log(1 + math.exp(5.0)), rel=1e-12)
    assert M.kl_divergence(np.array([[0.0, 0.0]]), np.array([[0.0, -np.inf]])) == math.inf


def test_logit_cosine_known_values() -> None:
    ref = np.array([[1.0, 0.0], [1.0, 1.0]])
    test = np.array([[0.0, 2.0], [2.0, 2.0]])   # orthogonal, then parallel
    assert M.logit_cosine(ref, test) == pytest.approx(0.5)
    assert M.logit_cosine(np.array([1.0, 2.0]), np.array([-1.0, -2.0])) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="same shape"):
        M.logit_cosine(np.zeros((2, 3)), np.zeros((3, 3)))


def test_token_edit_distance_known_values() -> None:
    # kitten -> sitting: 3 edits (two substitutions, one insertion)
    assert M.token_edit_distance(list(b"kitten"), list(b"sitting")) == (3, 0.5)
    assert M.token_edit_distance([1, 2, 3, 4], [1, 3, 4]) == (1, 0.25)      # one deletion
    assert M.token_edit_distance([], [5, 6]) == (2, 2.0)                     # empty reference divides by 1
    assert M.token_edit_distance(np.array([7, 8]), np.array([], np.int64)) == (2, 1.0)
    # cross-check the vectorised rows against the textbook recursion
    rng = np.random.default_rng(1)
    for _ in range(20):
        a, b = rng.integers(0, 4, rng.integers(0, 12)).tolist(), rng.integers(0, 4, rng.integers(0, 12)).tolist()
        table = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
        for i in range(1, len(a) + 1):
            for j in range(1, len(b) + 1):
                substitute = table[i - 1][j - 1] + (a[i - 1] != b[j - 1])
                table[i][j] = min(table[i - 1][j] + 1, table[i][j - 1] + 1, substitute)
        assert M.token_edit_distance(a, b)[0] == table[-1][-1]
