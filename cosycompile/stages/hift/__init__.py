"""HiFT stage: the vocoder network up to the iSTFT (F0 predictor, NSF source, decoder).

The source's random phases and noise are graph inputs, so the reference and an engine can be
fed the same draws and compared sample by sample. The iSTFT runs in numpy (runtime.dsp.istft).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from cosycompile.runtime.graphspec import Dim, GraphSpec, Tensor
from cosycompile.stages import Metric, StageInfo

HIFT = GraphSpec(
    name="hift",
    inputs=(Tensor("mel", "float32", (1, "mel_bins", "frames")),
            Tensor("rand_ini", "float32", (1, "harmonics"), (0.0, 1.0)),
            Tensor("noise", "float32", (1, "frames*samples_per_frame", "harmonics"))),
    outputs=(Tensor("magnitude", "float32", (1, "n_freq", "stft_frames")),
             Tensor("phase", "float32", (1, "n_freq", "stft_frames"))),
    dims=(Dim("frames", 1, 500, 3000, 20), Dim("stft_frames", 1, 60001, 360001, 2401)),
    calib_crop_dim="frames",
    quantizable=True,
)


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
