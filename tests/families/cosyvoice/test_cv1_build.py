"""CosyVoice-300M end to end on a CPU: the shipped recipes/cv1-cpu-int8.yaml builds builtin:cv1-tiny and
passes its gate; its bundle, packed and unpacked elsewhere, synthesizes the build's audio (22,050 Hz)
with no model dir and no cache, also as each of the model's SFT speakers; the real tritonserver serves its
CPU repository and returns the same audio (tests/families/shipped_cpu_build.py holds what every family's
test does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import run_cli
from families.shipped_cpu_build import (build_shipped, check_gate_and_bundle, check_tritonserver_serves_the_same_audio,
                               check_unpacked_bundle_reproduces_the_build, synthesize_without_the_cache,
                               unpacked_elsewhere)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return build_shipped(tmp_path_factory, "cv1-cpu-int8")


def test_the_shipped_recipe_passes_its_gate_on_real_tokens(build: dict[str, Any]) -> None:
    check_gate_and_bundle(build, "cosyvoice", "builtin:cv1-tiny", {"llm": "int8_sq", "flow": "int8", "hift": "fp32"})


def test_the_int8_decode_step_keeps_the_input_layer_fp32(build: dict[str, Any]) -> None:
    """The family's quant target keeps the LM's input Linear out of INT8 (its rows' scales are far apart),
    with no exclusion in the recipe: in the built decode step that layer's product is a float MatMul,
    while the Transformer blocks' linears are integer products."""
    from cosycompile.onnx.tools import load_structure

    assert build["res"].returncode == 0, build["res"].stderr[-3000:]
    model = load_structure(build["bundle"] / "engines" / "llm" / "llm_step.onnx")
    integer = ("MatMulIntegerToFloat", "MatMulInteger", "QLinearMatMul", "DequantizeLinear")
    embed = [n.op_type for n in model.graph.node if n.name.startswith("/embed/")]
    blocks = {n.op_type for n in model.graph.node if n.name.startswith("/encoders.") and "/linear_q/" in n.name}
    assert "MatMul" in embed and not set(embed) & set(integer), embed
    assert blocks & set(integer), blocks


def test_unpacked_bundle_alone_reproduces_the_builds_audio(build: dict[str, Any], tmp_path: Path) -> None:
    check_unpacked_bundle_reproduces_the_build(build, tmp_path, 22050)


def test_an_sft_bundle_speaks_as_each_of_its_speakers_with_no_model_dir(build: dict[str, Any], tmp_path: Path) -> None:
    """The model's spk2info.pt (upstream's SFT speakers) became the bundle's speakers: unpacked elsewhere,
    with no cache or model dir within reach, the bundle synthesizes as each of them."""
    import soundfile as sf

    unpacked = unpacked_elsewhere(build, tmp_path)
    names = run_cli("speakers", "ls", str(unpacked)).stdout.split()
    assert names == ["中文女", "英文男"]
    wavs = {}
    for name in names:
        out = tmp_path / f"{name}.wav"
        res = synthesize_without_the_cache(build, unpacked, tmp_path, "--text", "Hello there, one two three.",
                                           "--speaker", name, "--out", str(out))
        assert res.returncode == 0, res.stderr[-2000:]
        wavs[name], sr = sf.read(str(out), dtype="float32")
        assert sr == 22050 and wavs[name].size > 0 and np.abs(wavs[name]).max() > 0
    a, b = wavs.values()
    assert a.shape != b.shape or np.abs(a - b).max() > 1e-3, "two speakers, the same voice"


def test_tritonserver_serves_the_cpu_repository_with_the_same_audio(build: dict[str, Any], tmp_path: Path) -> None:
    """Also as one of the model's SFT speakers, named in the request."""
    check_tritonserver_serves_the_same_audio(build, tmp_path, "cosyvoice",
                                             "Hello there, this is CosyVoice-300M served by Triton.", speaker="英文男")
