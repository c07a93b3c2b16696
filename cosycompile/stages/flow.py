"""Flow stage: the token encoder graph and the CFM estimator graph (batch 2 for CFG, dynamic T).

The Euler loop and CFG mixing stay in numpy (pipeline.FlowRuntime) so every backend runs the
exact same solver; only the estimator, called 10 times per utterance, and the encoder compile.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext
from cosycompile.stages.common import engine_runtime, eval_items, export_stage, model_dir, speed_vs_fp32, write_check


def graph_modules(models: Any) -> dict[str, Any]:
    from cosycompile.models.flow import FlowEncoderStep

    return {"flow_encoder": FlowEncoderStep(models.flow).eval(), "flow_estimator": models.flow.decoder.estimator.eval()}


def assets(models: Any) -> dict[str, np.ndarray]:
    return {"rand_noise": models.flow.decoder.rand_noise.detach().float().numpy()}


def info(models: Any) -> dict[str, Any]:
    c = models.config.flow
    return {"n_timesteps": 10, "cfg_rate": c.inference_cfg_rate, "mel_bins": c.output_size,
            "spk_embed_dim": c.spk_embed_dim, "token_mel_ratio": models.config.token_mel_ratio}


def export(ctx: StepContext) -> dict[str, Any]:
    import torch

    from cosycompile.models.loader import load_models

    models = load_models(model_dir(ctx), ("flow",))
    inf = info(models)
    T, mel = 64, inf["mel_bins"]
    token = torch.randint(0, 100, (1, 20), dtype=torch.long)
    emb = torch.randn(1, inf["spk_embed_dim"])
    est = (torch.randn(2, mel, T), torch.ones(2, 1, T), torch.randn(2, mel, T), torch.rand(2),
           torch.randn(2, mel), torch.randn(2, mel, T))
    axes = {
        "flow_encoder": {"token": {1: "tokens"}, "mu": {2: "frames"}},
        "flow_estimator": {n: {2: "frames"} for n in ("x", "mask", "mu", "cond", "estimator_out")},
    }
    return export_stage(ctx, "flow", graph_modules(models), {"flow_encoder": (token, emb), "flow_estimator": est},
                        axes, assets(models), inf)


def check(ctx: StepContext) -> dict[str, Any]:
    """Estimator agreement over lengths, then mel SNR after the full 10-step CFM with identical noise."""
    from cosycompile.runtime.frontend import Frontend
    from cosycompile.reference.runners import load_reference, reference_runtime
    from cosycompile.validate.metrics import mel_snr_db

    p, c = ctx.params, ctx.params["check"]
    mdir = model_dir(ctx)
    models = load_reference(mdir, ("flow",), p["threads"])
    ref = reference_runtime("flow", models)
    eng = engine_runtime(ctx, "flow")
    rng = np.random.default_rng(0)
    mel_bins = ref.rand_noise.shape[1]
    errors = {}
    for T in ctx.progress(c["lengths"], desc="estimator lengths"):
        x, mu, cond = (rng.standard_normal((2, mel_bins, T), dtype=np.float32) for _ in range(3))
        args = (x, np.ones((2, 1, T), np.float32), mu, rng.random(2, dtype=np.float32),
                rng.standard_normal((2, mel_bins), dtype=np.float32), cond)
        errors[str(T)] = float(np.abs(ref.estimator_call(*args) - eng.estimator_call(*args)).max())
    frontend = Frontend(mdir)
    snrs = []
    for item in ctx.progress(eval_items(ctx), desc="CFM on eval prompts"):
        _, prompt = frontend.item_inputs(item)
        tokens = rng.integers(0, models.config.speech_token_size, 50)
        snrs.append(mel_snr_db(ref.mel(tokens, prompt), eng.mel(tokens, prompt)))
    max_err = max(errors.values())
    T = max(c["lengths"])
    x, mu, cond = (rng.standard_normal((2, mel_bins, T), dtype=np.float32) for _ in range(3))
    args = (x, np.ones((2, 1, T), np.float32), mu, np.full(2, 0.5, np.float32),
            rng.standard_normal((2, mel_bins), dtype=np.float32), cond)
    speed = speed_vs_fp32(ctx, "flow", eng, lambda rt: rt.estimator_call(*args))
    metrics = {**speed, "speed_length": T, "estimator_max_abs_error": max_err, "estimator_error_by_length": errors,
               "cfm_mel_snr_db_min": float(min(snrs)), "cfm_mel_snr_db_mean": float(np.mean(snrs))}
    failures = []
    if c["max_abs_error"] is not None and max_err >= c["max_abs_error"]:
        failures.append(f"estimator max abs error {max_err:.2e} >= {c['max_abs_error']:.0e}")
    if min(snrs) < c["min_mel_snr_db"]:
        failures.append(f"CFM mel SNR {min(snrs):.1f} dB < {c['min_mel_snr_db']} dB")
    return write_check(ctx, metrics, failures)
