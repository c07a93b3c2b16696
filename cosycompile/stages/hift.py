"""HiFT stage: the vocoder network up to the iSTFT (F0 predictor, NSF source, decoder).

The source's random phases and noise are graph inputs, so the reference and an engine can be
fed the same draws and compared sample by sample. The iSTFT runs in numpy (dsp.istft).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext
from cosycompile.stages.common import engine_runtime, eval_items, export_stage, model_dir, speed_vs_fp32, write_check


def graph_modules(models: Any) -> dict[str, Any]:
    from cosycompile.models.hift import HiFTNetStep

    return {"hift": HiFTNetStep(models.hift).eval()}


def assets(models: Any) -> dict[str, np.ndarray]:
    return {}


def info(models: Any) -> dict[str, Any]:
    c = models.config.hift
    spf = int(np.prod(c.upsample_rates)) * c.istft_hop_len
    return {"samples_per_frame": spf, "nb_harmonics": c.nb_harmonics, "istft_n_fft": c.istft_n_fft,
            "istft_hop": c.istft_hop_len, "audio_limit": c.audio_limit, "sample_rate": c.sampling_rate}


def export(ctx: StepContext) -> dict[str, Any]:
    import torch

    from cosycompile.models.loader import load_models

    models = load_models(model_dir(ctx), ("hift",))
    inf = info(models)
    T, h = 20, inf["nb_harmonics"] + 1
    args = (torch.randn(1, 80, T), torch.rand(1, h), torch.randn(1, T * inf["samples_per_frame"], h))
    axes = {"hift": {"mel": {2: "frames"}, "noise": {1: "samples"}, "magnitude": {2: "stft_frames"},
                     "phase": {2: "stft_frames"}}}
    return export_stage(ctx, "hift", graph_modules(models), {"hift": args}, axes, assets(models), inf)


def check(ctx: StepContext) -> dict[str, Any]:
    """Waveform SNR, engine vs PyTorch, on mels of the eval prompts' real speech with the same noise."""
    from cosycompile.runtime.dataset import read_wav
    from cosycompile.runtime.dsp import mel_spectrogram, resample
    from cosycompile.reference.runners import load_reference, reference_runtime
    from cosycompile.validate.metrics import log_mel_l1, waveform_snr_db

    p, c = ctx.params, ctx.params["check"]
    ref = reference_runtime("hift", load_reference(model_dir(ctx), ("hift",), p["threads"]))
    eng = engine_runtime(ctx, "hift")
    snrs, l1s, mels = [], [], []
    for n, item in enumerate(ctx.progress(eval_items(ctx), desc="eval prompts")):
        if item.prompt_wav is None:
            continue
        wav, sr = read_wav(item.prompt_wav)
        mel = mel_spectrogram(resample(wav, sr, 24000), 24000).astype(np.float32)
        a, b = ref.wav(mel, seed=n), eng.wav(mel, seed=n)
        snrs.append(waveform_snr_db(a, b))
        l1s.append(log_mel_l1(a, b))
        mels.append(mel)
    if not snrs:  # an eval set without prompt audio: fall back to a smooth synthetic mel
        mel = np.log(np.abs(np.random.default_rng(0).standard_normal((80, 100))) + 1e-2).astype(np.float32)
        a, b = ref.wav(mel), eng.wav(mel)
        snrs.append(waveform_snr_db(a, b))
        l1s.append(log_mel_l1(a, b))
        mels.append(mel)
    speed = speed_vs_fp32(ctx, "hift", eng, lambda rt: rt.wav(mels[0]))
    metrics = {**speed, "waveform_snr_db_min": float(min(snrs)), "waveform_snr_db_mean": float(np.mean(snrs)),
               "log_mel_l1_mean": float(np.mean(l1s))}
    failures = [] if min(snrs) >= c["min_snr_db"] else [f"waveform SNR {min(snrs):.1f} dB < {c['min_snr_db']} dB"]
    if c["max_log_mel_l1"] is not None and metrics["log_mel_l1_mean"] > c["max_log_mel_l1"]:
        failures.append(f"log-mel L1 {metrics['log_mel_l1_mean']:.3f} > {c['max_log_mel_l1']}")
    return write_check(ctx, metrics, failures)
