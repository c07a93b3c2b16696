"""The flow stage's PyTorch side: encoder step and CFM estimator modules, fixed noise, constants."""

from __future__ import annotations

from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext


def stage_parts(models: Any) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]]:
    """(graph modules, numpy assets, runtime constants) of the loaded flow network."""
    from cosycompile.families.cosyvoice2.flow import FlowEncoderStep

    c = models.config.flow
    modules = {"flow_encoder": FlowEncoderStep(models.flow).eval(), "flow_estimator": models.flow.decoder.estimator.eval()}
    assets = {"rand_noise": models.flow.decoder.rand_noise.detach().float().numpy()}
    info = {"n_timesteps": c.n_timesteps, "cfg_rate": c.inference_cfg_rate, "mel_bins": c.output_size,
            "spk_embed_dim": c.spk_embed_dim, "token_mel_ratio": models.config.token_mel_ratio}
    return modules, assets, info


def export(ctx: StepContext) -> dict[str, Any]:
    """The ``flow.export`` step."""
    from cosycompile.stages.common import export_stage

    return export_stage(ctx, "flow")
