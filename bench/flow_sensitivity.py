"""Benchmark: what bounds INT8 quality of the flow estimator, layer group by layer group.

Simulated INT8 (quantize-dequantize in PyTorch, FP32 arithmetic otherwise) on the estimator's
Linear and Conv1d layers, measured as the mel SNR after the full 10-step CFM against the unmodified
PyTorch FP32 flow with identical noise, tokens and speaker embedding: the same quality figure the
flow's gate and bench/quantized_speed.py use. Weights are always per output channel, symmetric.
Activation schemes:

- ``static``: one scale per tensor from the max |x| of a calibration CFM run on other tokens and
  another speaker (what ModelOpt's INT8 ``max`` calibration produces);
- ``static+sq``: the same after SmoothQuant migration (alpha 0.5) of each Linear's input channels
  into its weights, before the ranges are taken;
- ``dynamic``: one scale per tensor taken from each call's own input (ONNX Runtime's
  ``DynamicQuantizeLinear``);
- ``per-row``: one scale per row (per frame) from each call's own input;
- ``weights``: weights only, activations in FP32.

Rows: every scheme on every layer, then one group of layers at a time (by role and by depth) under
``static`` and ``dynamic``, which locates the loss. Attention's two batched matmuls stay FP32 here
(keeping them FP32 in the real INT8 engine did not move its SNR;
docs/bench-log/2026-11-22-quantized-vs-fp32-random-0.5b.md).

Usage: python bench/flow_sensitivity.py [--model builtin:random-0.5b] [--frames 500] [--threads 2]
Writes artifacts/bench/flow_sensitivity.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from builtin_models import machine

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SCHEMES = ("static", "static+sq", "dynamic", "per-row", "weights")
SQ_ALPHA = 0.5


def fake_int8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Symmetric INT8 quantize-dequantize with ``scale`` = max|x| / 127 (broadcast)."""
    s = scale.clamp_min(1e-12) / 127.0
    return torch.clamp(torch.round(x / s), -127, 127) * s


class QuantLayer(nn.Module):
    """Wraps a Linear or Conv1d: inputs and weights pass through simulated INT8 by ``scheme``.

    ``observe`` mode runs the layer in FP32 and records what the static schemes need: the input's
    max |x| overall and per input channel (the latter for SmoothQuant's migration scales)."""

    def __init__(self, layer: nn.Linear | nn.Conv1d) -> None:
        super().__init__()
        self.layer = layer
        self.scheme: str | None = None  # None: FP32, untouched
        self.observe = False
        self.amax = torch.zeros(())
        self.chan_amax = torch.zeros(layer.weight.shape[1])

    def _channels_last(self, x: torch.Tensor) -> torch.Tensor:
        # Linear inputs are [..., C]; Conv1d inputs are [B, C, T]. Rows are frames in both.
        return x if isinstance(self.layer, nn.Linear) else x.transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.observe:
            xc = self._channels_last(x).abs().reshape(-1, x.shape[-1] if isinstance(self.layer, nn.Linear) else x.shape[1])
            self.amax = torch.maximum(self.amax, xc.max())
            self.chan_amax = torch.maximum(self.chan_amax, xc.amax(dim=0))
            return self.layer(x)
        if self.scheme is None:
            return self.layer(x)
        w = self.layer.weight
        smooth = self.scheme == "static+sq" and isinstance(self.layer, nn.Linear)
        if smooth:
            # SmoothQuant: x / s and W * s leave x @ W^T unchanged and flatten x's outlier channels.
            s = (self.chan_amax.clamp_min(1e-5) ** SQ_ALPHA
                 / w.abs().amax(dim=0).clamp_min(1e-5) ** (1 - SQ_ALPHA))
            x, w = x / s, w * s
        wq = fake_int8(w, w.abs().reshape(w.shape[0], -1).amax(dim=1).reshape(-1, *[1] * (w.dim() - 1)))
        if self.scheme in ("static", "static+sq"):
            amax = (self.chan_amax / s).max() if smooth else self.amax
            x = fake_int8(x, amax)
        elif self.scheme == "dynamic":
            x = fake_int8(x, x.abs().max())
        elif self.scheme == "per-row":
            x = fake_int8(x, x.abs().amax(dim=-1 if isinstance(self.layer, nn.Linear) else 1, keepdim=True))
        if isinstance(self.layer, nn.Linear):
            return nn.functional.linear(x, wq, self.layer.bias)
        pad = getattr(self.layer, "causal_padding", 0)  # CausalConv1d pads on the left itself
        return self.layer._conv_forward(nn.functional.pad(x, (pad, 0)), wq, self.layer.bias)


def wrap_layers(estimator: nn.Module) -> dict[str, QuantLayer]:
    """Replace every Linear/Conv1d inside ``estimator`` by a QuantLayer; returns them by module path."""
    wrapped: dict[str, QuantLayer] = {}
    for name, module in list(estimator.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, (nn.Linear, nn.Conv1d)) and not isinstance(child, QuantLayer):
                q = QuantLayer(child)
                module.add_module(child_name, q)  # replaces the child in place
                wrapped[f"{name}.{child_name}".lstrip(".")] = q
    return wrapped


def role(path: str) -> str:
    """The layer's job in the estimator, for grouping (names follow families/cosyvoice2/flow_decoder.py)."""
    rules = (("attn1.to_q", "attention q/k/v"), ("attn1.to_k", "attention q/k/v"), ("attn1.to_v", "attention q/k/v"),
             ("attn1.to_out", "attention output"), ("ff.net.0", "feed-forward in (GELU)"),
             ("ff.net.2", "feed-forward out"), ("mlp", "resnet time MLP"), ("res_conv", "resnet 1x1 skip conv"),
             ("time_mlp", "time embedding MLP"), ("final_proj", "final 1x1 conv"),
             ("final_block", "final causal conv k=3"), (".block1.", "resnet causal conv k=3"),
             (".block2.", "resnet causal conv k=3"))
    for key, label in rules:
        if key in path:
            return label
    return "down/up causal conv k=3"


def depth(path: str) -> str:
    """Where the layer sits: down block, a third of the 12 mid blocks, up block, or the output."""
    if path.startswith("mid_blocks."):
        i = int(path.split(".")[1])
        return f"mid blocks {4 * (i // 4)}-{4 * (i // 4) + 3}"
    for prefix, label in (("down_blocks", "down block"), ("up_blocks", "up block"), ("final", "final block + proj"),
                          ("time_mlp", "time embedding MLP")):
        if path.startswith(prefix):
            return label
    return "other"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:random-0.5b")
    ap.add_argument("--frames", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    args = ap.parse_args()

    from builtin_models import load_builtin

    from cosycompile.reference.runners import reference_runtime
    from cosycompile.runtime.pipeline import Prompt
    from cosycompile.validate.metrics import mel_snr_db

    models = load_builtin(args.model, ("flow",), Path(args.artifacts), args.threads, "bench-sensitivity")
    flow = reference_runtime("flow", models)
    layers = wrap_layers(models.flow.decoder.estimator)

    rng = np.random.default_rng(0)
    T = args.frames

    def prompt_for(seed: int) -> Prompt:
        p = Prompt.empty()
        p.embedding = np.random.default_rng(seed).standard_normal(192).astype(np.float32)
        return p

    tokens, prompt = rng.integers(0, 6561, T // 2), prompt_for(1)
    calib_tokens, calib_prompt = rng.integers(0, 6561, T // 2), prompt_for(2)

    def set_scheme(scheme: str | None, keep: Callable[[str], bool] = lambda p: True) -> None:
        for p, q in layers.items():
            q.scheme = scheme if keep(p) else None

    set_scheme(None)
    t0 = time.perf_counter()
    ref_mel = flow.mel(tokens, prompt)
    cfm_s = time.perf_counter() - t0
    for q in layers.values():
        q.observe = True
    flow.mel(calib_tokens, calib_prompt)
    for q in layers.values():
        q.observe = False

    rows: list[dict] = []

    def measure(scheme: str, group: str, keep: Callable[[str], bool] = lambda p: True) -> None:
        set_scheme(scheme, keep)
        n = sum(keep(p) for p in layers)
        snr = mel_snr_db(ref_mel, flow.mel(tokens, prompt))
        rows.append({"scheme": scheme, "layers": group, "count": n, "mel_snr_db": snr})
        print(f"  {scheme:10s} {group:32s} {n:4d} layers  {snr:6.1f} dB", flush=True)

    for scheme in SCHEMES:
        measure(scheme, "all")
    for scheme in ("static", "dynamic"):
        for label in sorted({role(p) for p in layers}):
            measure(scheme, f"only {label}", lambda p, label=label: role(p) == label)
        for label in sorted({depth(p) for p in layers}):
            measure(scheme, f"only {label}", lambda p, label=label: depth(p) == label)
    set_scheme(None)

    out = {"model": args.model, "frames": T, "threads": args.threads, "layers": len(layers),
           "cfm_seconds_fp32_eager": cfm_s, "torch": torch.__version__,
           "machine": machine(), "rows": rows}
    dest = Path(args.artifacts) / "bench" / "flow_sensitivity.json"
    dest.write_text(json.dumps(out, indent=1))
    print("| activation scheme | layers quantized | count | mel SNR after 10-step CFM |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['scheme']} | {r['layers']} | {r['count']} | {r['mel_snr_db']:.1f} dB |")
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
