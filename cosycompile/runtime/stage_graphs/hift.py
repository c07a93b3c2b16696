"""The hift stage's graphs (see the package docstring)."""

from __future__ import annotations

from cosycompile.runtime.graphspec import Dim, GraphSpec, Tensor

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
