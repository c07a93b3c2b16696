"""CosyVoice-300M end to end on a CPU: the shipped recipes/cv1-cpu-int8.yaml builds builtin:cv1-tiny and
passes its gate; its bundle, packed and unpacked elsewhere, synthesizes the build's audio (22,050 Hz)
with no model dir and no cache; the real tritonserver serves its CPU repository and returns the same audio.

One build for the module: the shipped recipe's stages, quantizers and gate, on a smaller eval (two
items, one timed pair, fewer calibration items) to keep CI short.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import EVAL_SET, REPO, run_cli, tritonserver, write_recipe

pytestmark = pytest.mark.slow

RECIPE = REPO / "recipes" / "cv1-cpu-int8.yaml"


def _snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    ref64, test64 = ref.astype(np.float64), test.astype(np.float64)
    noise = float(np.sum((ref64 - test64) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(ref64 ** 2)) / noise)


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("cv1build")
    art = root / "art"
    recipe = write_recipe(root / "cv1-cpu-int8.yaml", {
        "extends": str(RECIPE), "name": "cv1-cpu-int8", "calibration": {"max_items": 4},
        "validation": {"max_items": 2, "speed": {"runs": 1, "throughput": []}}}, base=False)
    res = run_cli("build", str(recipe), "--artifacts", str(art), "-q", timeout=1500)
    (bundle,) = (art / "builds").glob("cv1-cpu-int8-*") if res.returncode == 0 else (None,)
    return {"root": root, "art": art, "res": res, "bundle": bundle}


def test_the_shipped_recipe_passes_its_gate_on_real_tokens(build: dict[str, Any]) -> None:
    res = build["res"]
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    assert "gate: PASS" in res.stdout, res.stdout[-2000:]
    manifest = json.loads((build["bundle"] / "manifest.json").read_text())
    assert manifest["family"] == "cosyvoice" and manifest["model"] == "builtin:cv1-tiny"
    assert {s: v["precision"] for s, v in manifest["stages"].items()} == {"llm": "int8_sq", "flow": "int8",
                                                                           "hift": "fp32"}
    report = json.loads((build["bundle"] / "report.json").read_text())
    text = json.dumps(report)
    # Every stage was checked against the FP32 reference, and the LM spoke: a check of zero tokens measures nothing.
    for metric in ("logit_cosine", "cfm_mel_snr_db_min", "waveform_snr_db_min", "tokens_identical_ratio"):
        assert f'"{metric}"' in text, metric
    pipeline = np.load(next(build["art"].glob("cache/objects/*/*/data/pipeline.npz")))
    assert all(pipeline[k].size > 0 for k in pipeline.files if k.startswith("tokens.")), "an eval item has no tokens"
    engines = build["bundle"] / "engines"
    for stage in ("llm", "flow", "hift"):
        assert json.loads((engines / stage / "graphs.json").read_text())["info"]["family"] == "cosyvoice", stage


def test_the_int8_decode_step_keeps_the_input_layer_fp32(build: dict[str, Any]) -> None:
    """The family's quant target keeps the LM's input Linear out of INT8 (its rows' scales are far apart),
    with no exclusion in the recipe: in the built decode step that layer's product is a float MatMul,
    while the Transformer blocks' linears are integer products."""
    import onnx

    assert build["res"].returncode == 0, build["res"].stderr[-3000:]
    model = onnx.load(str(build["bundle"] / "engines" / "llm" / "llm_step.onnx"), load_external_data=False)
    integer = ("MatMulIntegerToFloat", "MatMulInteger", "QLinearMatMul", "DequantizeLinear")
    embed = [n.op_type for n in model.graph.node if n.name.startswith("/embed/")]
    blocks = {n.op_type for n in model.graph.node if n.name.startswith("/encoders.") and "/linear_q/" in n.name}
    assert "MatMul" in embed and not set(embed) & set(integer), embed
    assert blocks & set(integer), blocks


def test_unpacked_bundle_alone_reproduces_the_builds_audio(build: dict[str, Any], tmp_path: Path) -> None:
    import soundfile as sf

    assert build["res"].returncode == 0, "the build failed (see the first test)"
    archive = tmp_path / "cv1.tar.gz"
    assert run_cli("pack", str(build["bundle"]), "-o", str(archive)).returncode == 0
    unpacked = tmp_path / "elsewhere" / "bundle"
    res = run_cli("unpack", str(archive), str(unpacked))
    assert res.returncode == 0, res.stderr
    item = json.loads((EVAL_SET / "manifest.jsonl").read_text(encoding="utf-8").splitlines()[0])
    out = tmp_path / "out.wav"
    hidden = build["art"].with_name("art.hidden")  # no cache or model dir within reach
    os.replace(build["art"], hidden)
    try:
        res = run_cli("synthesize", str(unpacked), "--text", item["text"], "--prompt-wav",
                      str(EVAL_SET / item["prompt_wav"]), "--prompt-text", item["prompt_text"], "--out", str(out),
                      cwd=tmp_path)
    finally:
        os.replace(hidden, build["art"])
    assert res.returncode == 0, res.stderr[-3000:]
    got, sr = sf.read(str(out), dtype="int16")
    ref, _ = sf.read(str(unpacked / "audio" / f"{item['id']}.built.wav"), dtype="int16")
    assert sr == 22050 and len(got) == len(ref) > 0
    assert _snr_db(ref, got) >= 60.0


def test_an_sft_bundle_speaks_as_each_of_its_speakers_with_no_model_dir(build: dict[str, Any], tmp_path: Path) -> None:
    """The model's spk2info.pt (upstream's SFT speakers) became the bundle's speakers: unpacked elsewhere,
    with no cache or model dir within reach, the bundle synthesizes as each of them."""
    import soundfile as sf

    assert build["res"].returncode == 0, "the build failed (see the first test)"
    names = run_cli("speakers", "ls", str(build["bundle"])).stdout.split()
    assert names == ["中文女", "英文男"]
    archive = tmp_path / "sft.tar.gz"
    assert run_cli("pack", str(build["bundle"]), "-o", str(archive)).returncode == 0
    unpacked = tmp_path / "fresh" / "bundle"
    assert run_cli("unpack", str(archive), str(unpacked)).returncode == 0
    hidden = build["art"].with_name("art.hidden")
    os.replace(build["art"], hidden)
    try:
        wavs = {}
        for name in names:
            out = tmp_path / f"{name}.wav"
            res = run_cli("synthesize", str(unpacked), "--text", "Hello there, one two three.", "--speaker", name,
                          "--out", str(out), cwd=tmp_path)
            assert res.returncode == 0, res.stderr[-2000:]
            wavs[name], sr = sf.read(str(out), dtype="float32")
            assert sr == 22050 and wavs[name].size > 0 and np.abs(wavs[name]).max() > 0
    finally:
        os.replace(hidden, build["art"])
    a, b = wavs.values()
    assert a.shape != b.shape or np.abs(a - b).max() > 1e-3, "two speakers, the same voice"


def test_tritonserver_serves_the_cpu_repository_with_the_same_audio(build: dict[str, Any], tmp_path: Path) -> None:
    import soundfile as sf
    import tritonclient.http as httpclient

    assert build["res"].returncode == 0, "the build failed (see the first test)"
    repo = tmp_path / "repo"
    res = run_cli("triton", str(build["bundle"]), "--out", str(repo))
    assert res.returncode == 0, res.stderr[-2000:]
    assert {p.name for p in repo.iterdir() if p.is_dir()} == {"cosyvoice", "cosyvoice_offline"}
    text = "Hello there, this is CosyVoice-300M served by Triton."
    synth = tmp_path / "synth.wav"
    res = run_cli("synthesize", str(build["bundle"]), "--text", text, "--out", str(synth))
    assert res.returncode == 0, res.stderr[-2000:]
    want, _ = sf.read(str(synth), dtype="float32")
    with tritonserver(repo, tmp_path / "server") as server:
        client = httpclient.InferenceServerClient(server["http"], connection_timeout=600, network_timeout=600)
        data = np.frombuffer(text.encode("utf-8"), np.uint8)[None]
        inp = httpclient.InferInput("target_text_utf8", list(data.shape), "UINT8")
        inp.set_data_from_numpy(data)
        got = client.infer("cosyvoice_offline", [inp]).as_numpy("waveform")[0]
        # An SFT speaker by name, as the bundle holds it.
        spk = np.frombuffer("英文男".encode("utf-8"), np.uint8)[None]
        spk_in = httpclient.InferInput("speaker_utf8", list(spk.shape), "UINT8")
        spk_in.set_data_from_numpy(spk)
        got_spk = client.infer("cosyvoice_offline", [inp, spk_in]).as_numpy("waveform")[0]
    # synthesize writes PCM16: the same samples agree to within its quantization step.
    assert got.shape == want.shape and want.size > 0
    assert np.abs(want - got).max() <= 1.01 / 32768
    res = run_cli("synthesize", str(build["bundle"]), "--text", text, "--speaker", "英文男", "--out", str(synth))
    assert res.returncode == 0, res.stderr[-2000:]
    want_spk, _ = sf.read(str(synth), dtype="float32")
    assert got_spk.shape == want_spk.shape and np.abs(want_spk - got_spk).max() <= 1.01 / 32768
