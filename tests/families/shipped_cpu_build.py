"""What every family's end-to-end test on a CPU does with its shipped CPU recipe (tests/families/<family>/
test_*_build.py): build it once for the module, check the gate and the bundle, synthesize from the bundle
packed and unpacked elsewhere, and serve its CPU repository with the real tritonserver.

One build for a module: the shipped recipe's stages, quantizers and gate, on a smaller eval (two items,
one timed pair, fewer calibration items) to keep CI short.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cosycompile.validate.metrics import snr_db
from helpers import EVAL_SET, REPO, run_cli, triton_http, tritonserver, write_recipe


def build_shipped(tmp_path_factory: pytest.TempPathFactory, recipe: str) -> dict[str, Any]:
    """``recipes/<recipe>.yaml`` built into a fresh artifacts dir: {root, art, res, bundle (None if it failed)}."""
    root = tmp_path_factory.mktemp(recipe)
    art = root / "art"
    path = write_recipe(root / f"{recipe}.yaml", {
        "extends": str(REPO / "recipes" / f"{recipe}.yaml"), "name": recipe, "calibration": {"max_items": 4},
        "validation": {"max_items": 2, "speed": {"runs": 1, "throughput": []}}}, base=False)
    res = run_cli("build", str(path), "--artifacts", str(art), "-q", timeout=1500)
    (bundle,) = (art / "builds").glob(f"{recipe}-*") if res.returncode == 0 else (None,)
    return {"root": root, "art": art, "res": res, "bundle": bundle}


def check_gate_and_bundle(build: dict[str, Any], family: str, model: str, precisions: dict[str, str]) -> None:
    """The gate passed on real tokens, every stage was checked, and the bundle says which family it is."""
    res = build["res"]
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    assert "gate: PASS" in res.stdout, res.stdout[-2000:]
    manifest = json.loads((build["bundle"] / "manifest.json").read_text())
    assert manifest["family"] == family and manifest["model"] == model
    assert {s: v["precision"] for s, v in manifest["stages"].items()} == precisions
    text = json.dumps(json.loads((build["bundle"] / "report.json").read_text()))
    # Every stage was checked against the FP32 reference, and the LM spoke: a check of zero tokens measures nothing.
    for metric in ("logit_cosine", "cfm_mel_snr_db_min", "waveform_snr_db_min", "tokens_identical_ratio"):
        assert f'"{metric}"' in text, metric
    pipeline = np.load(next(build["art"].glob("cache/objects/*/*/data/pipeline.npz")))
    assert all(pipeline[k].size > 0 for k in pipeline.files if k.startswith("tokens.")), "an eval item has no tokens"
    for stage in ("llm", "flow", "hift"):
        info = json.loads((build["bundle"] / "engines" / stage / "graphs.json").read_text())["info"]
        assert info["family"] == family, stage


def unpacked_elsewhere(build: dict[str, Any], tmp_path: Path) -> Path:
    """The build's bundle packed and unpacked under ``tmp_path``."""
    assert build["res"].returncode == 0, "the build failed (see the first test)"
    archive = tmp_path / "bundle.tar.gz"
    assert run_cli("pack", str(build["bundle"]), "-o", str(archive)).returncode == 0
    unpacked = tmp_path / "elsewhere" / "bundle"
    res = run_cli("unpack", str(archive), str(unpacked))
    assert res.returncode == 0, res.stderr
    return unpacked


def synthesize_without_the_cache(build: dict[str, Any], bundle: Path, cwd: Path, *args: str) -> Any:
    """``cosycompile synthesize BUNDLE ARGS`` with the build's artifacts dir (cache, model dir) moved away."""
    hidden = build["art"].with_name("art.hidden")
    os.replace(build["art"], hidden)
    try:
        return run_cli("synthesize", str(bundle), *args, cwd=cwd)
    finally:
        os.replace(hidden, build["art"])


def check_unpacked_bundle_reproduces_the_build(build: dict[str, Any], tmp_path: Path, sample_rate: int) -> None:
    """The first eval item, synthesized from the unpacked bundle alone, is the audio the build wrote."""
    import soundfile as sf

    unpacked = unpacked_elsewhere(build, tmp_path)
    item = json.loads((EVAL_SET / "manifest.jsonl").read_text(encoding="utf-8").splitlines()[0])
    out = tmp_path / "out.wav"
    res = synthesize_without_the_cache(build, unpacked, tmp_path, "--text", item["text"], "--prompt-wav",
                                       str(EVAL_SET / item["prompt_wav"]), "--prompt-text", item["prompt_text"],
                                       "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    got, sr = sf.read(str(out), dtype="int16")
    ref, _ = sf.read(str(unpacked / "audio" / f"{item['id']}.built.wav"), dtype="int16")
    assert sr == sample_rate and len(got) == len(ref) > 0
    assert snr_db(ref, got) >= 60.0


def check_tritonserver_serves_the_same_audio(build: dict[str, Any], tmp_path: Path, model: str, text: str,
                                             speaker: str | None = None) -> None:
    """The bundle's CPU Triton repository (``<model>`` and ``<model>_offline``) under the real tritonserver
    answers ``text`` (and, with ``speaker``, the same text as that cached speaker) with the audio
    ``cosycompile synthesize`` writes."""
    import soundfile as sf
    import tritonclient.http as httpclient

    assert build["res"].returncode == 0, "the build failed (see the first test)"
    repo = tmp_path / "repo"
    res = run_cli("triton", str(build["bundle"]), "--out", str(repo))
    assert res.returncode == 0, res.stderr[-2000:]
    assert {p.name for p in repo.iterdir() if p.is_dir()} == {model, f"{model}_offline"}

    def synthesized(*args: str) -> np.ndarray:
        out = tmp_path / "synth.wav"
        res = run_cli("synthesize", str(build["bundle"]), "--text", text, *args, "--out", str(out))
        assert res.returncode == 0, res.stderr[-2000:]
        return sf.read(str(out), dtype="float32")[0]

    def utf8(name: str, value: str) -> Any:
        data = np.frombuffer(value.encode("utf-8"), np.uint8)[None]
        inp = httpclient.InferInput(name, list(data.shape), "UINT8")
        inp.set_data_from_numpy(data)
        return inp

    cases = [((), [])] + ([(("--speaker", speaker), [utf8("speaker_utf8", speaker)])] if speaker else [])
    with tritonserver(repo, tmp_path / "server") as server, triton_http(server["http"]) as client:
        served = [client.infer(f"{model}_offline", [utf8("target_text_utf8", text), *extra]).as_numpy("waveform")[0]
                  for _, extra in cases]
    for (args, _), got in zip(cases, served):
        want = synthesized(*args)
        # synthesize writes PCM16: the same samples agree to within its quantization step.
        assert got.shape == want.shape and want.size > 0, args
        assert np.abs(want - got).max() <= 1.01 / 32768, args
