"""The flow check: estimator agreement over lengths, then mel SNR after the full CFM with identical
noise, engine vs PyTorch FP32 (the model's own 10 steps, whatever ``runtime.n_timesteps`` the build runs)."""

from __future__ import annotations

from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext


def _estimator_args(rng: np.random.Generator, mel_bins: int, T: int, t: np.ndarray | None = None) -> tuple:
    x, mu, cond = (rng.standard_normal((2, mel_bins, T), dtype=np.float32) for _ in range(3))
    t = rng.random(2, dtype=np.float32) if t is None else t
    return x, np.ones((2, 1, T), np.float32), mu, t, rng.standard_normal((2, mel_bins), dtype=np.float32), cond


_ARG_NAMES = ("x", "mask", "mu", "t", "spks", "cond")


def reference(runtime: Any, items: list[tuple[np.ndarray, Any]], spec: dict[str, Any],
              params: dict[str, Any]) -> dict[str, np.ndarray]:
    """Estimator inputs/outputs per length and CFM mels for random tokens on each eval prompt."""
    rng = np.random.default_rng(0)
    mel_bins = runtime.rand_noise.shape[1]
    out: dict[str, np.ndarray] = {}
    for T in spec["lengths"]:
        args = _estimator_args(rng, mel_bins, T)
        out.update({f"est.{T}.{k}": v for k, v in zip(_ARG_NAMES, args)})
        out[f"est.{T}.out"] = runtime.estimator_call(*args)
    vocab = int(params["speech_token_size"])
    for n, (_, prompt) in enumerate(items):
        tokens = rng.integers(0, vocab, spec["cfm_tokens"])
        out[f"cfm.{n}.tokens"] = tokens
        out[f"cfm.{n}.mel"] = runtime.mel(tokens, prompt)
    return out


def check(ctx: StepContext) -> dict[str, Any]:
    """The ``flow.check`` step."""
    from cosycompile.stages.check_tools import engine_runtime, reference_arrays, speed_vs_fp32, write_check
    from cosycompile.stages.eval_set import eval_inputs
    from cosycompile.validate.metrics import mel_snr_db

    eng = engine_runtime(ctx, "flow")
    ref = reference_arrays(ctx, "flow")
    errors = {}
    for T in ctx.progress(ctx.spec.lengths, desc="estimator lengths"):
        args = [ref[f"est.{T}.{k}"] for k in _ARG_NAMES]
        errors[str(T)] = float(np.abs(ref[f"est.{T}.out"] - eng.estimator_call(*args)).max())
    snrs = []
    for n, (_, prompt) in enumerate(ctx.progress(eval_inputs(ctx), desc="CFM on eval prompts")):
        snrs.append(mel_snr_db(ref[f"cfm.{n}.mel"], eng.mel(ref[f"cfm.{n}.tokens"], prompt)))
    T = max(ctx.spec.lengths)
    args = [ref[f"est.{T}.{k}"] for k in _ARG_NAMES]
    speed = speed_vs_fp32(ctx, "flow", eng, lambda rt: rt.estimator_call(*args))
    metrics = {**speed, "speed_length": T, "estimator_max_abs_error": max(errors.values()),
               "estimator_error_by_length": errors, "cfm_mel_snr_db_min": float(min(snrs)),
               "cfm_mel_snr_db_mean": float(np.mean(snrs)), "cfm_steps": eng.n_timesteps}
    return write_check(ctx, metrics)
