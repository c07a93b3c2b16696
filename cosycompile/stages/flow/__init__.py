"""Flow stage: the token encoder graph and the CFM estimator graph (batch 2 for CFG, dynamic T).

The Euler loop and CFG mixing stay in numpy (the model family's FlowRuntime) so every backend runs
the exact same solver; only the estimator, called once per CFM step (10 per utterance unless a recipe sets
``runtime.n_timesteps``), and the encoder compile.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from cosycompile.runtime.stage_graphs.flow import FLOW_ENCODER, FLOW_ESTIMATOR
from cosycompile.stages import Metric, StageInfo


class FlowCheck(BaseModel):
    """The flow check's workload: estimator lengths compared one call at a time, then the full CFM."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lengths: list[int] = Field(default_factory=lambda: [16, 64, 128, 256, 512], min_length=1,
                               description="mel lengths of the estimator calls compared and timed")
    cfm_tokens: int = Field(50, ge=1, description="speech tokens per eval prompt for the CFM comparison")


class FlowRuntimeSettings(BaseModel):
    """What a recipe may change in how the flow runs (``stages.flow.runtime``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_timesteps: int = Field(
        10, ge=1, le=50,
        description="Euler steps of the CFM solver (CosyVoice2 runs 10). Each step is one estimator call, so "
                    "fewer steps cut the flow's time in proportion; the check still compares with the "
                    "model's own 10-step FP32 mel, so the quality cost shows in flow.mel_snr_db.")


PLUGIN = StageInfo(
    order=1,
    summary="flow encoder + CFM estimator (the family's UNet or DiT, batch 2 for CFG)",
    graphs=(FLOW_ENCODER, FLOW_ESTIMATOR),
    check_spec=FlowCheck,
    metrics=(
        Metric("estimator_max_abs_error", "estimator_max_abs_error", False, "", description="one estimator call"),
        Metric("mel_snr_db", "cfm_mel_snr_db_min", True, "dB", description="min mel SNR after the CFM vs the model's FP32 mel"),
        Metric("speedup_vs_fp32", "speedup_vs_fp32", True, "x", "speed", "estimator vs the FP32 engine"),
    ),
    runtime_spec=FlowRuntimeSettings,
)
