"""The HiFT check: waveform SNR, engine vs PyTorch FP32, on mels of the eval prompts' real speech
with the same source noise."""

from __future__ import annotations

from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext


def _mels(items: list[tuple[np.ndarray, Any]]) -> list[np.ndarray]:
    mels = [prompt.mel for _, prompt in items if prompt.mel.shape[1]]
    if not mels:  # an eval set without prompt audio: a smooth synthetic mel
        mels = [np.log(np.abs(np.random.default_rng(0).standard_normal((80, 100))) + 1e-2).astype(np.float32)]
    return mels


def reference(runtime: Any, items: list[tuple[np.ndarray, Any]], spec: dict[str, Any],
              params: dict[str, Any]) -> dict[str, np.ndarray]:
    """Reference waveforms of each prompt mel (seed n for the n-th)."""
    out: dict[str, np.ndarray] = {}
    for n, mel in enumerate(_mels(items)):
        out[f"mel.{n}"] = mel
        out[f"wav.{n}"] = runtime.wav(mel, seed=n)
    return out


def check(ctx: StepContext) -> dict[str, Any]:
    """The ``hift.check`` step."""
    from cosycompile.stages.check_tools import engine_runtime, reference_arrays, speed_vs_fp32, write_check
    from cosycompile.validate.metrics import log_mel_l1, waveform_snr_db

    eng = engine_runtime(ctx, "hift")
    ref = reference_arrays(ctx, "hift")
    n_items = len([k for k in ref if k.startswith("wav.")])
    snrs, l1s = [], []
    for n in ctx.progress(range(n_items), desc="eval prompts"):
        b = eng.wav(ref[f"mel.{n}"], seed=n)
        snrs.append(waveform_snr_db(ref[f"wav.{n}"], b))
        l1s.append(log_mel_l1(ref[f"wav.{n}"], b))
    speed = speed_vs_fp32(ctx, "hift", eng, lambda rt: rt.wav(ref["mel.0"]))
    metrics = {**speed, "waveform_snr_db_min": float(min(snrs)), "waveform_snr_db_mean": float(np.mean(snrs)),
               "log_mel_l1_mean": float(np.mean(l1s))}
    return write_check(ctx, metrics)
