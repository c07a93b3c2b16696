"""Speech-token sampling, the one implementation shared by the PyTorch reference and every build.

Mirrors CosyVoice2 upstream (``cosyvoice/utils/common.py`` ``ras_sampling`` / ``nucleus_sampling`` /
``random_sampling`` and ``Qwen2LM.sampling_ids``) in numpy, so the reference decoder and the engines
draw identical tokens from identical log-probs. Nothing here imports torch.

All draws go through :func:`_draw`, one ``rng.random()`` per draw: a draw is then cheap to count,
and the same seed gives the same tokens whichever runtime supplies the log-probs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SAMPLING_MODES = ("greedy", "ras")


@dataclass(frozen=True)
class Sampling:
    """How speech tokens are drawn; RAS = CosyVoice's repetition-aware nucleus sampling.

    ``greedy`` is not upstream: it is the deterministic mode used for validation, with the same
    end-token masking as RAS. ``max_tokens`` caps the decode length below upstream's 20x text length.
    """

    mode: str = "greedy"
    seed: int = 0
    max_tokens: int | None = None
    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1


def softmax(scores: np.ndarray) -> np.ndarray:
    """Probabilities (float64) of 1-D ``scores``; ``-inf`` entries get probability 0."""
    x = np.asarray(scores, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def _draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Index drawn with probability proportional to ``probs`` (torch's ``multinomial(1)``), one uniform."""
    cdf = np.cumsum(probs, dtype=np.float64)
    # side="right" so zero-probability entries (masked tokens) can never be hit.
    idx = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    # Rounding can put u*total at cdf[-1]; fall back to the last token that has mass.
    if idx >= len(probs):
        idx = int(np.flatnonzero(probs > 0)[-1])
    return idx


def nucleus_sampling(scores: np.ndarray, rng: np.random.Generator, top_p: float = 0.8, top_k: int = 25) -> int:
    """One token from the nucleus of ``softmax(scores)``, as upstream's ``nucleus_sampling``.

    Tokens are taken in descending probability (ties: lower id first) while the mass of the tokens
    already taken is below ``top_p`` and fewer than ``top_k`` are taken; the draw is proportional to
    the kept probabilities.
    """
    if not top_p > 0 or top_k < 1:
        raise ValueError(f"need top_p > 0 and top_k >= 1, got top_p={top_p}, top_k={top_k}")
    probs = softmax(scores)
    order = np.argsort(-probs, kind="stable")
    sorted_probs = probs[order]
    # Mass before each token, summed in the same order as upstream's running cum_prob.
    before = np.concatenate([[0.0], np.cumsum(sorted_probs)[:-1]])
    keep = min(int(np.count_nonzero(before < top_p)), top_k)
    return int(order[_draw(sorted_probs[:keep], rng)])


def random_sampling(scores: np.ndarray, rng: np.random.Generator) -> int:
    """One token from the full ``softmax(scores)`` (masked ``-inf`` entries never), as upstream's ``random_sampling``."""
    return _draw(softmax(scores), rng)


def ras_sampling(scores: np.ndarray, decoded: Sequence[int], rng: np.random.Generator, top_p: float = 0.8,
                 top_k: int = 25, win_size: int = 10, tau_r: float = 0.1) -> int:
    """Repetition-aware sampling (VALL-E 2), as upstream's ``ras_sampling``.

    A nucleus draw; if that token occurs at least ``win_size * tau_r`` times among the last
    ``win_size`` decoded tokens, it is masked out and a token is drawn from the full remaining
    distribution instead. ``scores`` is not modified.
    """
    token = nucleus_sampling(scores, rng, top_p, top_k)
    rep_num = sum(1 for t in decoded[-win_size:] if int(t) == token)
    if rep_num >= win_size * tau_r:
        # Masking the repeated token is what breaks loops; without it a p=0.99 token comes straight back.
        scores = np.array(scores, dtype=np.float64)
        scores[token] = -np.inf
        token = random_sampling(scores, rng)
    return token


def sampling_ids(logp: np.ndarray, decoded: Sequence[int], sampling: Sampling, rng: np.random.Generator,
                 eos_id: int, ignore_eos: bool) -> int:
    """The next speech token from log-probs ``logp`` [V], as upstream's ``Qwen2LM.sampling_ids``.

    With ``ignore_eos`` (before the minimum length) only the end token ``eos_id`` (= speech_token_size)
    is masked; the other stop tokens stay drawable, as upstream. Then a single draw, no retries:
    ``greedy`` takes the argmax, ``ras`` calls :func:`ras_sampling` with ``sampling``'s settings.
    ``logp`` is not modified.
    """
    if sampling.mode not in SAMPLING_MODES:
        raise ValueError(f"sampling mode must be one of {SAMPLING_MODES}, not {sampling.mode!r}")
    scores = np.array(logp, dtype=np.float64)  # a copy: the caller's log-probs stay intact
    if ignore_eos:
        scores[eos_id] = -np.inf
    if sampling.mode == "greedy":
        return int(np.argmax(scores))
    return ras_sampling(scores, decoded, rng, sampling.top_p, sampling.top_k, sampling.win_size, sampling.tau_r)
