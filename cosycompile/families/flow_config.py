"""Settings of upstream's flow (``cosyvoice/flow/flow.py``) that every generation spells alike: the
token embedding and x-vector projection its three classes open with (``MaskedDiffWithXvec``,
``CausalMaskedDiffWithXvec``, ``CausalMaskedDiffWithDiT``) and the CFM's inference settings.
Defaults are upstream's constructor defaults; a family's ``FlowConfig`` extends the class and sets
what its yaml sets otherwise. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlowConfig:
    """The flow's token side and its conditional flow matching (CFM) at inference."""

    input_size: int = 512  # width of the token embedding
    output_size: int = 80  # mel bins
    spk_embed_dim: int = 192  # width of the x-vector (CAM++)
    vocab_size: int = 4096  # speech tokens
    inference_cfg_rate: float = 0.7  # yaml: cfm_params.inference_cfg_rate
    n_timesteps: int = 10  # Euler steps: flow.inference passes 10 upstream
    # The CFM starts from a fixed draw of [1, output_size, noise_frames] from noise_seed: upstream's
    # CausalConditionalCFM draws [1, 80, 50 * 300] right after seeding 0, once, at construction.
    noise_frames: int = 50 * 300
    noise_seed: int = 0


@dataclass(frozen=True)
class CausalFlowConfig(FlowConfig):
    """The causal flows (``CausalMaskedDiffWithXvec``, ``CausalMaskedDiffWithDiT``): each token also sees
    the ``pre_lookahead_len`` tokens after it (upstream's ``PreLookaheadLayer``)."""

    pre_lookahead_len: int = 3
