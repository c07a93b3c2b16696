"""CosyVoice3's DiT to FP16 is never plain FP16 where it overflows: a DiT whose feed-forward activations
pass FP16's range on the recorded calibration inputs is built mixed, the nodes that see those values
kept FP32 and named in the graphs' info, and the mixed graph runs finite and close to the FP32 one.

A plain FP16 TensorRT build of the real CosyVoice3 DiT gives NaN (its users' reports); here the
overflow is made on purpose in the tiny model's first feed-forward layer, so the test needs no 0.5B
checkpoint and fails if the overflow check stops reading the recorded activations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from helpers import REPO, run_cli, until_outputs, write_recipe

pytestmark = pytest.mark.slow

FF = "decoder.estimator.transformer_blocks.0.ff.ff.0.0"  # the first Linear of block 0's feed-forward


def _overflowing_model(root: Path) -> tuple[Path, float]:
    """builtin:cv3-tiny written as a model dir, its FF weights scaled so that the layer's outputs reach
    ~1e6 on a typical input; returns the dir and the scale."""
    from cosycompile.families.cosyvoice3.loader import init_model, load_models

    d = init_model("builtin:cv3-tiny", root / "model", seed=0)
    flow = load_models(d, ("flow",)).flow
    est = flow.decoder.estimator
    seen: list[float] = []
    layer = dict(flow.named_modules())[FF]
    handle = layer.register_forward_hook(lambda m, i, o: seen.append(float(o.abs().max())))
    g = torch.Generator().manual_seed(0)
    x, mu, cond = (torch.randn(2, 80, 64, generator=g) for _ in range(3))
    with torch.no_grad():
        est(x, torch.ones(2, 1, 64), mu, torch.rand(2, generator=g), torch.randn(2, 80, generator=g), cond)
    handle.remove()
    scale = 1e6 / seen[0]
    sd = torch.load(d / "flow.pt", weights_only=True)
    sd[f"{FF}.weight"] = sd[f"{FF}.weight"] * scale
    sd[f"{FF}.bias"] = sd[f"{FF}.bias"] * scale
    torch.save(sd, d / "flow.pt")
    return d, scale


@pytest.fixture(scope="module")
def fp16(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("cv3dit")
    model, scale = _overflowing_model(tmp)
    recipe = write_recipe(tmp / "dit-fp16.yaml", {
        "extends": str(REPO / "recipes" / "cv3-cpu-fp32.yaml"), "name": "cv3-dit-fp16", "model": str(model),
        "calibration": {"max_items": 2},
        "stages": {"llm": {"enabled": False}, "hift": {"enabled": False}, "flow": {"quantize": {"format": "fp16"}}},
    }, base=False)
    res = run_cli("build", str(recipe), "--artifacts", str(tmp / "art"), "--until", "quantize")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    fp32 = run_cli("build", str(recipe), "--artifacts", str(tmp / "art"), "--until", "simplify", "-q")  # cached
    assert fp32.returncode == 0, fp32.stderr[-2000:]
    return {"out": {**until_outputs(res.stdout), **until_outputs(fp32.stdout)}, "art": tmp / "art", "scale": scale}


def test_overflowing_feed_forward_is_kept_fp32_and_named(fp16: dict[str, Any]) -> None:
    info = json.loads((fp16["out"]["flow.quantize"] / "graphs.json").read_text())["info"]
    kept = info["fp16_kept_fp32"]["flow_estimator"]
    assert any(n.startswith("/transformer_blocks.0/ff/") for n in kept), kept
    assert info["precision"] == "fp16"


def test_mixed_graph_runs_finite_and_close_to_fp32(fp16: dict[str, Any]) -> None:
    import onnxruntime as ort

    from cosycompile.quantize.calibrate import load_records

    out = fp16["out"]
    calib = next(p.parent for p in fp16["art"].glob("cache/objects/*/*/data/index.json")
                 if "flow_estimator" in json.loads(p.read_text())["graphs"])
    records = load_records(calib, "flow_estimator")[:4]
    assert records
    so = ort.SessionOptions()
    so.log_severity_level = 3
    fp32 = ort.InferenceSession(str(out["flow.simplify"] / "flow_estimator.onnx"), so, providers=["CPUExecutionProvider"])
    mixed = ort.InferenceSession(str(out["flow.quantize"] / "flow_estimator.onnx"), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in fp32.get_inputs()]
    for r in records:
        feeds = {n: r[n] for n in names}
        ref, got = fp32.run(None, feeds)[0], mixed.run(None, feeds)[0]
        assert np.isfinite(got).all()
        snr = 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref.astype(np.float64) - got) ** 2))
        assert snr > 30.0, snr
