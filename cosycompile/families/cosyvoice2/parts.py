"""What each stage exports of CosyVoice2's networks: graph modules, numpy assets, runtime constants.

One function per stage (``FamilyInfo.parts``), called on the models this family's loader loaded; the
stage's export, the reference and the checkpoint exports read the networks only through these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

Parts = tuple[Mapping[str, Any], dict[str, np.ndarray], dict[str, Any]]


def llm_parts(models: Any) -> Parts:
    """The decode steps, the text, speech and sos/task_id embedding tables, the LM's shape."""
    from cosycompile.families.qwen2_steps import decode_step_modules

    lm = models.llm
    c = models.config.llm
    assets = {
        "text_embedding": lm.llm.model.model.embed_tokens.weight.detach().float().numpy(),
        "speech_embedding": lm.speech_embedding.weight.detach().float().numpy(),
        "llm_embedding": lm.llm_embedding.weight.detach().float().numpy(),
    }
    info = {"num_layers": c.num_layers, "kv_heads": c.num_kv_heads, "head_dim": c.hidden_size // c.num_heads,
            "hidden_size": c.hidden_size, "speech_token_size": models.config.speech_token_size,
            "vocab_size": models.config.speech_token_size + 3}
    return decode_step_modules(lm), assets, info


def flow_parts(models: Any) -> Parts:
    """The token encoder step and the UNet CFM estimator, the solver's fixed noise and constants."""
    from .flow import FlowEncoderStep

    c = models.config.flow
    modules = {"flow_encoder": FlowEncoderStep(models.flow).eval(), "flow_estimator": models.flow.decoder.estimator.eval()}
    assets = {"rand_noise": models.flow.decoder.rand_noise.detach().float().numpy()}
    info = {"n_timesteps": c.n_timesteps, "cfg_rate": c.inference_cfg_rate, "mel_bins": c.output_size,
            "spk_embed_dim": c.spk_embed_dim, "flow_vocab_size": c.vocab_size, "token_mel_ratio": models.config.token_mel_ratio}
    return modules, assets, info


def hift_parts(models: Any) -> Parts:
    """The vocoder up to the iSTFT, and the iSTFT's and source's constants."""
    from .hift import HiFTNetStep

    c = models.config.hift
    spf = int(np.prod(c.upsample_rates)) * c.istft_hop_len
    info = {"samples_per_frame": spf, "nb_harmonics": c.nb_harmonics, "harmonics": c.nb_harmonics + 1,
            "istft_n_fft": c.istft_n_fft, "n_freq": c.istft_n_fft // 2 + 1, "istft_hop": c.istft_hop_len,
            "audio_limit": c.audio_limit, "sample_rate": c.sampling_rate, "mel_bins": c.in_channels}
    return {"hift": HiFTNetStep(models.hift).eval()}, {}, info
