"""HiFT stage: the vocoder network up to the iSTFT (F0 predictor, NSF source, decoder).

The source's random phases and noise are graph inputs, so the reference and an engine can be
fed the same draws and compared sample by sample. The iSTFT runs in numpy (runtime.dsp.istft).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from cosycompile.runtime.stage_graphs.hift import HIFT
from cosycompile.stages import Metric, StageInfo


class HiFTCheck(BaseModel):
    """The HiFT check has no workload knobs: it vocodes the eval prompts' real speech."""

    model_config = ConfigDict(extra="forbid", frozen=True)


PLUGIN = StageInfo(
    order=2,
    summary="HiFT vocoder up to the iSTFT",
    graphs=(HIFT,),
    check_spec=HiFTCheck,
    metrics=(
        Metric("waveform_snr_db", "waveform_snr_db_min", True, "dB", description="min waveform SNR over prompts"),
        Metric("log_mel_l1", "log_mel_l1_mean", False, "", description="mean log-mel L1 distance"),
        Metric("speedup_vs_fp32", "speedup_vs_fp32", True, "x", "speed", "vocoder vs the FP32 engine"),
    ),
)
