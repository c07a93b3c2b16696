"""The Snake-alpha guard on CosyVoice3's causal HiFT: Fun-CosyVoice3-0.5B's hift.pt has a few Snake
alphas whose reciprocal overflows FP16. Exported as the HiFT stage exports it, a CV3 vocoder with such
alphas shows exactly those channels to the FP16 quantizer's scan, which clamps them to a graph that
runs finite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cosycompile.families import stage_parts
from cosycompile.families.cosyvoice3.loader import init_model, load_models
from cosycompile.onnx.tools import export_onnx
from cosycompile.quantize.modelopt_autocast import SNAKE_ALPHA_MIN
from cosycompile.quantize.modelopt_autocast.scan import clamp, find_hazards
from cosycompile.stages.hift import HIFT

# (Snake module, channel) -> alpha; both signs, all below SNAKE_ALPHA_MIN.
TINY = {("resblocks.0.activations1.0", 3): 4e-6, ("resblocks.0.activations1.0", 7): -8e-6,
        ("source_resblocks.1.activations2.2", 0): 1.2e-5}


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import onnx
    import onnxslim

    tmp = tmp_path_factory.mktemp("cv3snake")
    models = load_models(init_model("builtin:cv3-tiny", tmp / "model", seed=0), ("hift",))
    modules = dict(models.hift.named_modules())
    with torch.no_grad():
        for (name, ch), alpha in TINY.items():
            modules[name].alpha[ch] = alpha
    parts, _, info = stage_parts(models, "hift")
    dummy = HIFT.dummy_inputs(info)
    path = tmp / "hift.onnx"
    export_onnx(parts["hift"], tuple(torch.from_numpy(dummy[n]) for n in HIFT.input_names), path,
                HIFT.input_names, HIFT.output_names, HIFT.dynamic_axes(), 18)
    # As the build runs it: simplified (onnxslim folds 1/(alpha + eps) into a constant) before any quantizer.
    return onnxslim.slim(onnx.load(str(path))), dummy


def test_scan_names_exactly_the_tiny_alphas(graph: Any) -> None:
    model, _ = graph
    hazards, _ = find_hazards(model, SNAKE_ALPHA_MIN)
    found = {(h.module, ch): a for h in hazards for ch, a in zip(h.index, h.alphas)}
    assert set(found) == set(TINY), found
    assert {h.kind for h in hazards} == {"snake"}
    for key, alpha in TINY.items():
        assert found[key] == pytest.approx(alpha, rel=1e-3)


def test_clamped_graph_has_no_hazard_and_runs_finite(graph: Any) -> None:
    import copy

    import onnxruntime as ort

    model, dummy = graph
    model = copy.deepcopy(model)
    hazards, _ = find_hazards(model, SNAKE_ALPHA_MIN)
    clamp(model, hazards, SNAKE_ALPHA_MIN)
    assert find_hazards(model, SNAKE_ALPHA_MIN)[0] == []
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    magnitude, phase = sess.run(None, {n: dummy[n] for n in HIFT.input_names})
    assert np.isfinite(magnitude).all() and np.isfinite(phase).all() and magnitude.max() > 0


def test_the_module_names_are_the_checkpoints(graph: Any, tmp_path: Path) -> None:
    """What the scan names is a key of hift.pt (module + ``.alpha``), so a user can find the channel."""
    model, _ = graph
    models = load_models(init_model("builtin:cv3-tiny", tmp_path / "model", seed=0), ("hift",))
    keys = set(models.hift.state_dict())
    for h in find_hazards(model, SNAKE_ALPHA_MIN)[0]:
        assert f"{h.module}.alpha" in keys, h.module
