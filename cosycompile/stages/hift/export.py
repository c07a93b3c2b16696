"""The HiFT stage's PyTorch side: the vocoder network up to the iSTFT, and its constants."""

from __future__ import annotations

from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext


def stage_parts(models: Any) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]]:
    """(graph modules, numpy assets, runtime constants) of the loaded vocoder."""
    from cosycompile.families.cosyvoice2.hift import HiFTNetStep

    c = models.config.hift
    spf = int(np.prod(c.upsample_rates)) * c.istft_hop_len
    info = {"samples_per_frame": spf, "nb_harmonics": c.nb_harmonics, "harmonics": c.nb_harmonics + 1,
            "istft_n_fft": c.istft_n_fft, "n_freq": c.istft_n_fft // 2 + 1, "istft_hop": c.istft_hop_len,
            "audio_limit": c.audio_limit, "sample_rate": c.sampling_rate, "mel_bins": c.in_channels}
    return {"hift": HiFTNetStep(models.hift).eval()}, {}, info


def export(ctx: StepContext) -> dict[str, Any]:
    """The ``hift.export`` step."""
    from cosycompile.stages.common import export_stage

    return export_stage(ctx, "hift")
