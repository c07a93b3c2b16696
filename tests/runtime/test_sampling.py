"""Speech-token sampling: the numpy RAS / greedy rules against upstream CosyVoice2, and both decoders on it.

Statistical checks use fixed seeds and enough draws that the bounds sit many standard deviations
from the expected rate, so they are deterministic in practice and still fail on the old behaviour.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cosycompile.families.cosyvoice2.runtimes import LLMRuntime
from cosycompile.runtime.pipeline import Prompt
from cosycompile.runtime.pipeline import Sampling as PipelineSampling
from cosycompile.runtime.sampling import (Sampling, nucleus_sampling, random_sampling, ras_sampling,
                                          sampling_ids)
from cosycompile.stages.llm import LLM_STEP

EOS = 6561  # speech_token_size of the real model; 6562 and 6563 are the other stop tokens
VOCAB = EOS + 3
RAS = Sampling(mode="ras")
GREEDY = Sampling(mode="greedy")


def _logp(probs: dict[int, float], vocab: int = VOCAB) -> np.ndarray:
    """Log-probs with the given masses and the rest spread evenly over the other tokens."""
    rest = 1.0 - sum(probs.values())
    p = np.full(vocab, rest / (vocab - len(probs)))
    for tok, mass in probs.items():
        p[tok] = mass
    return np.log(p)


class CountingRng:
    """Wraps a Generator and counts uniform draws (the sampler draws once per multinomial)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.draws = 0

    def random(self) -> float:
        self.draws += 1
        return float(self.rng.random())


def _upstream_nucleus(probs: list[float], top_p: float, top_k: int) -> set[int]:
    """The nucleus exactly as upstream builds it, with its python loop (reference for the checks)."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept: list[int] = []
    cum = 0.0
    for i in order:
        if cum < top_p and len(kept) < top_k:
            cum += probs[i]
            kept.append(i)
        else:
            break
    return set(kept)


# --- RAS: repetition ---------------------------------------------------------------------------


def test_repeated_dominant_token_is_masked_not_redrawn() -> None:
    logp = _logp({100: 0.99})
    decoded = [5, 6, 7, 100, 8]  # 100 is in the last 10
    rng = np.random.default_rng(0)
    n = 2000
    hits = sum(ras_sampling(logp, decoded, rng) == 100 for _ in range(n))
    # Upstream masks the repeated token before the redraw: 0 hits. The old redraw from the
    # unmasked distribution returned it ~99% of the time.
    assert hits < 0.02 * n


def test_repetition_window_is_the_last_win_size_tokens() -> None:
    logp = _logp({100: 0.99})
    decoded = [100] + list(range(10))  # 100 is 11th from the end: outside the window
    rng = np.random.default_rng(1)
    assert all(ras_sampling(logp, decoded, rng) == 100 for _ in range(200))


def test_dominant_token_not_in_window_is_returned() -> None:
    logp = _logp({100: 0.99})
    decoded = list(range(10))
    n = 2000
    rng = np.random.default_rng(2)
    # With top_p = 0.8 the nucleus is {100} alone.
    assert sum(ras_sampling(logp, decoded, rng) == 100 for _ in range(n)) == n
    # With the whole vocabulary in the nucleus, it comes back ~99% (mean 1980, sd ~4.5).
    hits = sum(ras_sampling(logp, decoded, rng, top_p=1.0, top_k=VOCAB) == 100 for _ in range(n))
    assert 0.975 * n <= hits < n


def test_ras_does_not_modify_scores() -> None:
    logp = _logp({100: 0.99})
    before = logp.copy()
    ras_sampling(logp, [100], np.random.default_rng(0))
    sampling_ids(logp, [100], RAS, np.random.default_rng(0), EOS, ignore_eos=True)
    sampling_ids(logp, [], GREEDY, np.random.default_rng(0), EOS, ignore_eos=True)
    np.testing.assert_array_equal(logp, before)


# --- nucleus ------------------------------------------------------------------------------------


def test_nucleus_stays_inside_top_p_and_top_k() -> None:
    gen = np.random.default_rng(3)
    for top_p, top_k in ((0.8, 25), (0.5, 25), (0.95, 10), (1.0, 3)):
        probs = gen.dirichlet(np.full(200, 0.3))
        allowed = _upstream_nucleus(probs.tolist(), top_p, top_k)
        assert len(allowed) <= top_k
        rng = np.random.default_rng(4)
        drawn = {nucleus_sampling(np.log(probs), rng, top_p, top_k) for _ in range(3000)}
        assert drawn <= allowed
        # Also through RAS with an empty history (the repetition branch cannot fire).
        assert {ras_sampling(np.log(probs), [], rng, top_p, top_k) for _ in range(1000)} <= allowed


def test_nucleus_boundary_counts_the_mass_before_a_token() -> None:
    logp = np.log(np.array([0.2, 0.5, 0.3]))  # sorted: 1 (0.5), 2 (0.3), 0 (0.2)
    rng = np.random.default_rng(5)

    def support(top_p: float, top_k: int = 25, n: int = 1000) -> set[int]:
        return {nucleus_sampling(logp, rng, top_p, top_k) for _ in range(n)}

    assert support(0.45) == {1}  # the first token always enters (mass before it is 0)
    assert support(0.6) == {1, 2}  # 2 enters: mass before it is 0.5 < 0.6, though 0.8 > 0.6
    assert support(0.79) == {1, 2}  # 0 stays out: mass before it is 0.8
    assert support(0.81) == {0, 1, 2}
    assert support(1.0, top_k=2) == {1, 2}
    # Draws are proportional to the kept probabilities: P(1 | {1, 2}) = 0.5 / 0.8 = 0.625.
    n = 4000
    ones = sum(nucleus_sampling(logp, rng, 0.6) == 1 for _ in range(n))
    assert abs(ones / n - 0.625) < 0.04  # sd ~0.008


def test_nucleus_ties_keep_the_lower_ids() -> None:
    # Upstream sorts stably: among tied tokens the lower ids enter a top_k-bounded nucleus.
    flat = np.log(np.full(50, 1 / 50))
    rng = np.random.default_rng(6)
    assert {nucleus_sampling(flat, rng, top_p=1.0, top_k=3) for _ in range(300)} == {0, 1, 2}
    # Ties scattered through a real-size vocabulary (an unstable sort reorders these).
    gen = np.random.default_rng(10)
    scores = gen.random(VOCAB) * 0.5
    tied = np.sort(gen.choice(VOCAB, 30, replace=False))
    scores[tied] = 1.0
    assert {nucleus_sampling(scores, rng, top_p=1.0, top_k=3) for _ in range(300)} == set(tied[:3].tolist())


def test_random_sampling_never_returns_masked_tokens() -> None:
    scores = np.log(np.array([0.1, 0.4, 0.2, 0.3]))
    scores[1] = -np.inf
    rng = np.random.default_rng(7)
    drawn = [random_sampling(scores, rng) for _ in range(3000)]
    assert 1 not in drawn
    assert set(drawn) == {0, 2, 3}


# --- end-token masking before min_len -----------------------------------------------------------


def test_greedy_masks_only_eos_before_min_len() -> None:
    rng = np.random.default_rng(0)
    at_eos = _logp({EOS: 0.6, 42: 0.3})
    assert sampling_ids(at_eos, [], GREEDY, rng, EOS, ignore_eos=True) == 42
    assert sampling_ids(at_eos, [], GREEDY, rng, EOS, ignore_eos=False) == EOS
    # The other stop tokens are not masked (upstream masks speech_token_size only).
    at_stop2 = _logp({EOS + 1: 0.6, 42: 0.3})
    assert sampling_ids(at_stop2, [], GREEDY, rng, EOS, ignore_eos=True) == EOS + 1


def test_ras_before_min_len_never_returns_eos_in_one_draw_path() -> None:
    logp = _logp({EOS: 0.9, 10: 0.06, 11: 0.03})
    rng = CountingRng(8)
    n = 2000
    drawn = []
    for _ in range(n):
        before = rng.draws
        drawn.append(sampling_ids(logp, [], RAS, rng, EOS, ignore_eos=True))  # type: ignore[arg-type]
        assert rng.draws - before == 1  # one nucleus draw, no reject-and-retry
    assert EOS not in drawn
    assert set(drawn) == {10, 11}  # the nucleus is built after the mask: {10, 11} covers > 0.8
    # With a repetition, exactly one more draw (the masked redraw), still never eos.
    one = _logp({EOS: 0.9, 10: 0.09})  # after the eos mask the nucleus is {10}
    for _ in range(500):
        before = rng.draws
        tok = sampling_ids(one, [10], RAS, rng, EOS, ignore_eos=True)  # type: ignore[arg-type]
        assert rng.draws - before == 2
        assert tok not in (EOS, 10)
    # After min_len eos comes out at its mass (alone in the nucleus here).
    assert all(sampling_ids(logp, [], RAS, rng, EOS, ignore_eos=False) == EOS for _ in range(100))  # type: ignore[arg-type]


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError):
        sampling_ids(_logp({}), [], Sampling(mode="beam"), np.random.default_rng(0), EOS, ignore_eos=False)


# --- LLMRuntime.generate over a fake runner -----------------------------------------------------


class FixedLogitsRunner:
    """A decode-step stand-in: the same last-position logits every step, a growing zero cache."""

    input_names = LLM_STEP.input_names
    output_names = LLM_STEP.output_names

    def __init__(self, logits: np.ndarray) -> None:
        self.logits = logits.astype(np.float32)
        self.calls = 0

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        embeds, cache = (feeds[name] for name in self.input_names)
        S = embeds.shape[1]
        logits = np.broadcast_to(self.logits, (1, S, self.logits.shape[0])).copy()
        new = np.zeros(cache.shape[:4] + (S,) + cache.shape[5:], np.float32)
        return dict(zip(self.output_names, (logits, np.concatenate([cache, new], axis=4))))


def _fake_runtime(logits: np.ndarray, speech_token_size: int = 8, hidden: int = 4) -> tuple[LLMRuntime, FixedLogitsRunner]:
    runner = FixedLogitsRunner(logits)
    assets = {"text_embedding": np.zeros((32, hidden), np.float32),
              "speech_embedding": np.zeros((speech_token_size + 3, hidden), np.float32),
              "llm_embedding": np.zeros((2, hidden), np.float32)}
    info = {"num_layers": 1, "kv_heads": 1, "head_dim": 2, "speech_token_size": speech_token_size}
    return LLMRuntime(runner, assets, info), runner


def test_generate_greedy_skips_eos_until_min_len_then_stops() -> None:
    logits = np.zeros(11)
    logits[8], logits[2] = 5.0, 3.0  # argmax at eos (speech_token_size = 8), next best 2
    rt, _ = _fake_runtime(logits)
    text = np.array([1, 2, 3], np.int64)  # min_len 6
    tokens = rt.generate(text, Prompt.empty(), PipelineSampling(mode="greedy"))
    assert tokens.tolist() == [2] * 6


def test_generate_greedy_stops_at_second_stop_token_before_min_len() -> None:
    logits = np.zeros(11)
    logits[9], logits[2] = 5.0, 3.0  # argmax at speech_token_size + 1: not masked, so it stops decoding
    rt, runner = _fake_runtime(logits)
    tokens = rt.generate(np.array([1, 2, 3], np.int64), Prompt.empty(), PipelineSampling(mode="greedy"))
    assert tokens.tolist() == []
    assert runner.calls == 1  # the prefill only


def test_generate_ras_never_stops_on_eos_before_min_len() -> None:
    logits = np.zeros(11)
    logits[8] = 6.0  # eos holds ~98% of the mass
    logits[9:] = -30.0  # keep the other stop tokens out, so only eos could end decoding
    rt, _ = _fake_runtime(logits)
    text = np.array([1, 2, 3, 4, 5], np.int64)  # min_len 10
    for seed in range(20):
        tokens = rt.generate(text, Prompt.empty(), PipelineSampling(mode="ras", seed=seed))
        # Eos is masked for 10 steps, then it is drawn at once (the nucleus is {eos}).
        assert len(tokens) == 10
        assert all(0 <= t < 8 for t in tokens.tolist())


def test_same_seed_same_tokens() -> None:
    gen = np.random.default_rng(9)
    steps = [gen.normal(0.0, 3.0, VOCAB) for _ in range(100)]

    def run(seed: int) -> list[int]:
        rng = np.random.default_rng(seed)
        out: list[int] = []
        for i, logp in enumerate(steps):
            out.append(sampling_ids(logp, out, RAS, rng, EOS, ignore_eos=i < 50))
        return out

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_pipeline_sampling_is_the_same_class() -> None:
    assert PipelineSampling is Sampling


# --- both decoders on the tiny model ------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llm(tiny_model_dir: Path) -> Any:
    import torch

    from cosycompile.families.cosyvoice2.loader import load_models

    torch.set_num_threads(2)
    return load_models(tiny_model_dir, ("llm",))


@pytest.mark.parametrize("mode", ["greedy", "ras"])
def test_torch_inference_and_pipeline_runtime_agree(tiny_llm: Any, mode: str) -> None:
    import torch

    from cosycompile.reference.runners import reference_runtime

    lm = tiny_llm.llm
    runtime = reference_runtime("llm", tiny_llm)
    text = np.array([9, 8, 7, 6], np.int64)
    prompt_text = np.array([40, 41], np.int64)
    prompt_speech = np.array([3, 1000, 6000], np.int64)
    prompt = Prompt(prompt_text, prompt_speech, np.zeros((80, 6), np.float32), np.zeros(192, np.float32))
    s = lm.cfg.sampling
    for seed in (0, 1):
        ours = lm.inference(torch.from_numpy(text)[None], torch.from_numpy(prompt_text)[None],
                            torch.from_numpy(prompt_speech)[None], sampling=mode, seed=seed, max_tokens=30)
        theirs = runtime.generate(text, prompt, Sampling(mode=mode, seed=seed, max_tokens=30, top_p=s.top_p,
                                                         top_k=s.top_k, win_size=s.win_size, tau_r=s.tau_r))
        assert len(ours) >= 2 * len(text)
        assert ours == theirs.tolist()
