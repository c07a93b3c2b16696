"""The flow stage's graphs (see the package docstring)."""

from __future__ import annotations

from cosycompile.runtime.graphspec import Dim, GraphSpec, Tensor

FLOW_ENCODER = GraphSpec(
    name="flow_encoder",
    inputs=(Tensor("token", "int64", (1, "tokens"), (0, "flow_vocab_size")),
            Tensor("embedding", "float32", (1, "spk_embed_dim"))),
    outputs=(Tensor("mu", "float32", (1, "mel_bins", "frames")), Tensor("spks", "float32", (1, "mel_bins"))),
    dims=(Dim("tokens", 1, 250, 1500, 20), Dim("frames", 2, 500, 3000, 40)),
)
# CosyVoice's own TensorRT profile for the estimator: T 4 / 500 / 3000 at batch 2.
FLOW_ESTIMATOR = GraphSpec(
    name="flow_estimator",
    inputs=(Tensor("x", "float32", (2, "mel_bins", "frames")),
            Tensor("mask", "float32", (2, 1, "frames"), (1.0, 1.0)),
            Tensor("mu", "float32", (2, "mel_bins", "frames")),
            Tensor("t", "float32", (2,), (0.0, 1.0)),
            Tensor("spks", "float32", (2, "mel_bins")),
            Tensor("cond", "float32", (2, "mel_bins", "frames"))),
    outputs=(Tensor("estimator_out", "float32", (2, "mel_bins", "frames")),),
    dims=(Dim("frames", 4, 500, 3000, 64),),
    calib_crop_dim="frames",
    quantizable=True,
)
