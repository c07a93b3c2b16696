"""Triton model repositories of CPU bundles: a real tritonserver serves one (GPU layout: test_triton_gpu.py).

One build of recipes/cpu-int8.yaml on builtin:tiny with ``exports: [bundle, triton]`` serves the
CPU tests; the server (tritonserver 2.51 from the nvidia-pytriton wheel, python backend, no GPU)
runs once per module on free loopback ports and is stopped by its fixture's finaliser.
"""

from __future__ import annotations

import hashlib
import json
import queue
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import (REPO, config_tensors, instance_kind, one_line_error, parse_model_config, run_cli,
                     triton_http, tritonserver, write_recipe)
from seed_store import SMALL_INT8, seeded

pytestmark = pytest.mark.slow

# Two text pieces (80 English-character equivalents each); the tiny model decodes each to the recipe's
# 150-token cap (6 s of audio), which streaming sends in 3 token chunks.
TEXT = ("Hello there, this is the first sentence of a small test for the Triton server. "
        "And here is a second sentence, which the server streams on its own.")


_ITEM = json.loads((REPO / "calib_data" / "eval" / "manifest.jsonl").read_text().splitlines()[0])
PROMPT_WAV = REPO / "calib_data" / "eval" / _ITEM["prompt_wav"]
PROMPT_TEXT = _ITEM["prompt_text"]


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory, seed: Path) -> dict[str, Path]:
    """The small cpu-int8 build (from the session's seed) with the triton exporter: its bundle and its
    repository."""
    root = tmp_path_factory.mktemp("triton")
    recipe = write_recipe(root / "cpu-int8-triton.yaml", {**SMALL_INT8, "exports": ["bundle", "triton"]}, base=False)
    art = seeded(seed, root / "art")
    res = run_cli("build", str(recipe), "--artifacts", str(art), "-q")
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    (bundle,) = (art / "builds").glob("cpu-int8-*")
    return {"root": root, "art": art, "recipe": recipe, "bundle": bundle, "repo": art / "triton" / bundle.name}


@pytest.fixture(scope="module")
def speaker_repo(build: dict[str, Path]) -> Path:
    """The bundle with speaker ``alice`` added (``cosycompile speakers add``), as a repository written by
    ``cosycompile triton``: the exporter's configs plus the speaker's file."""
    res = run_cli("speakers", "add", str(build["bundle"]), "--name", "alice", "--prompt-wav", str(PROMPT_WAV),
                  "--prompt-text", PROMPT_TEXT)
    assert res.returncode == 0, res.stderr[-2000:]
    out = build["root"] / "repo-speakers"
    res = run_cli("triton", str(build["bundle"]), "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def server(speaker_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """tritonserver on a CPU repository of the bundle (with a speaker), ready; stopped (killed if need be) at the end."""
    with tritonserver(speaker_repo, tmp_path_factory.mktemp("tritonserver")) as state:
        yield state


@pytest.fixture(scope="module")
def synthesized(build: dict[str, Path]) -> dict[str, np.ndarray]:
    """``cosycompile synthesize`` of TEXT on the same bundle, offline and ``--stream`` (PCM16 wavs, read
    back as float)."""
    import soundfile as sf

    wavs = {}
    for mode, extra in (("offline", ()), ("stream", ("--stream",))):
        out = build["root"] / f"synth-{mode}.wav"
        res = run_cli("synthesize", str(build["bundle"]), "--text", TEXT, "--out", str(out), *extra)
        assert res.returncode == 0, res.stderr[-2000:]
        wavs[mode], sr = sf.read(str(out), dtype="float32")
        assert sr == 24000
    return wavs


def _utf8(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), np.uint8)[None]


def test_exporter_writes_a_self_contained_repository(build: dict[str, Path]) -> None:
    repo = build["repo"]
    info = json.loads((repo / "repository.json").read_text())
    assert info["layout"] == "cpu" and set(info["models"]) == {"cosyvoice2", "cosyvoice2_offline"}
    on_disk = {str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file()} - {"repository.json"}
    assert on_disk == set(info["files"])
    for model in info["models"]:
        bundle = repo / model / "1" / "bundle"
        manifest = json.loads((bundle / "manifest.json").read_text())
        for rel, digest in manifest["files"].items():  # a full bundle in each version dir
            assert hashlib.sha256((bundle / rel).read_bytes()).hexdigest() == digest, rel
    assert "PYTHONPATH" in (repo / "README.md").read_text()
    assert not any(str(build["art"]) in (repo / m / "config.pbtxt").read_text() for m in info["models"])
    # A second build is a no-op for the repository, as for the bundle.
    mtime = (repo / "repository.json").stat().st_mtime_ns
    res = run_cli("build", str(build["recipe"]), "--artifacts", str(build["art"]), "-q")
    assert res.returncode == 0, res.stderr[-2000:]
    assert (repo / "repository.json").stat().st_mtime_ns == mtime


def test_cli_writes_the_same_configs_and_refuses_bad_input(build: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "repo"
    res = run_cli("triton", str(build["bundle"]), "--out", str(out))
    assert res.returncode == 0, res.stderr
    for model in ("cosyvoice2", "cosyvoice2_offline"):
        assert (out / model / "config.pbtxt").read_text() == (build["repo"] / model / "config.pbtxt").read_text()
    assert "non-empty" not in one_line_error(run_cli("triton", str(build["bundle"]), "--out", str(out)))
    assert "not a bundle folder" in one_line_error(run_cli("triton", str(tmp_path / "nope"), "--out", str(tmp_path / "r")))
    assert "--instances 0" in one_line_error(run_cli("triton", str(build["bundle"]), "--out", str(tmp_path / "r"),
                                                      "--instances", "0"))
    assert not (tmp_path / "r").exists()
    help_text = run_cli("triton", "--help").stdout
    assert "--out DIR" in help_text and "FAMILY_offline" in help_text and "cosyvoice3" in help_text


def test_a_damaged_bundle_makes_no_repository(build: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    bundle = shutil.copytree(build["bundle"], tmp_path / "bundle")
    engine = next((bundle / "engines" / "hift").glob("*.onnx"))
    data = bytearray(engine.read_bytes())
    data[-1] ^= 1
    engine.write_bytes(bytes(data))
    line = one_line_error(run_cli("triton", str(bundle), "--out", str(tmp_path / "repo")))
    assert engine.name in line and "digest mismatch" in line and "cosycompile build" in line
    assert not (tmp_path / "repo").exists()


def test_cpu_configs_parse_and_match_the_bundle(build: dict[str, Path]) -> None:
    recipe = json.loads((build["bundle"] / "recipe.json").read_text())
    for model, decoupled in (("cosyvoice2", True), ("cosyvoice2_offline", False)):
        cfg = parse_model_config(build["repo"] / model / "config.pbtxt")
        assert cfg.name == model and cfg.backend == "python" and cfg.max_batch_size == 1
        assert cfg.model_transaction_policy.decoupled is decoupled
        assert [(instance_kind(g), g.count) for g in cfg.instance_group] == [("KIND_CPU", 1)]
        assert cfg.parameters["threads"].string_value == str(recipe["validation"]["speed"]["threads"])
        assert cfg.parameters["bundle_key"].string_value == json.loads((build["bundle"] / "manifest.json").read_text())["key"]
        assert cfg.parameters["spin_wait"].string_value == "false"  # idle engine threads sleep unless asked
        tensors = config_tensors(cfg)
        assert tensors["target_text"] == ("TYPE_STRING", [1], True)
        assert tensors["target_text_utf8"] == ("TYPE_UINT8", [-1], True)
        assert tensors["reference_wav"] == ("TYPE_FP32", [-1], True)
        assert tensors["waveform"] == ("TYPE_FP32", [-1], False)


def test_spin_wait_is_the_repository_s_choice(build: dict[str, Path], tmp_path: Path) -> None:
    res = run_cli("triton", str(build["bundle"]), "--out", str(tmp_path / "repo"), "--spin-wait")
    assert res.returncode == 0, res.stderr
    for model in ("cosyvoice2", "cosyvoice2_offline"):
        assert parse_model_config(tmp_path / "repo" / model / "config.pbtxt").parameters["spin_wait"].string_value == "true"
    assert "`spin_wait`" in (tmp_path / "repo" / "README.md").read_text()


def test_http_and_grpc_streaming_match_synthesize(server: dict[str, Any], synthesized: dict[str, np.ndarray]) -> None:
    """HTTP gives ``synthesize``'s audio; the gRPC stream gives ``synthesize --stream``'s, in token chunks
    (3 per 6 s text piece), the first long before the offline request's answer."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    text = _utf8(TEXT)
    inp = httpclient.InferInput("target_text_utf8", list(text.shape), "UINT8")
    inp.set_data_from_numpy(text)
    with triton_http(server["http"]) as client:
        t0 = time.perf_counter()
        http_wav = client.infer("cosyvoice2_offline", [inp]).as_numpy("waveform")
        http_s = time.perf_counter() - t0
    assert http_wav.shape[0] == 1 and http_wav.dtype == np.float32
    http_wav = http_wav[0]

    results: queue.Queue = queue.Queue()
    g = grpcclient.InferenceServerClient(server["grpc"])
    g.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        gin = grpcclient.InferInput("target_text_utf8", list(text.shape), "UINT8")
        gin.set_data_from_numpy(text)
        t0 = time.perf_counter()
        g.async_stream_infer("cosyvoice2", [gin], enable_empty_final_response=True)
        chunks, first_s = [], None
        while True:
            result, error = results.get(timeout=600)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            first_s = first_s if first_s is not None else time.perf_counter() - t0
            chunks.append(result.as_numpy("waveform")[0])
    finally:
        g.stop_stream()
        g.close()
    assert len(chunks) == 6, [c.shape for c in chunks]  # 3 token chunks per text piece
    assert len(chunks[0]) < len(chunks[1]) < len(chunks[2])  # the hop grows
    grpc_wav = np.concatenate(chunks)
    print(f"\nHTTP (offline) {http_s:.2f} s; gRPC stream: first of {len(chunks)} chunks after {first_s:.2f} s "
          f"({len(chunks[0]) / 24000:.2f} s of audio)")
    assert first_s < http_s

    # synthesize writes PCM16: the same samples agree to within its quantization step.
    for mode, wav in (("offline", http_wav), ("stream", grpc_wav)):
        assert synthesized[mode].shape == wav.shape, mode
        assert np.abs(synthesized[mode] - wav).max() <= 1.01 / 32768, mode


def test_a_cached_speaker_matches_synthesize_with_it(server: dict[str, Any], build: dict[str, Path]) -> None:
    import soundfile as sf
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    out = build["root"] / "alice.wav"
    res = run_cli("synthesize", str(build["bundle"]), "--text", TEXT, "--speaker", "alice", "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    ref, _ = sf.read(str(out), dtype="float32")

    def infer(client: Any, name: str) -> np.ndarray:
        inputs = []
        for tensor, value in (("target_text_utf8", TEXT), ("speaker_utf8", name)):
            inp = httpclient.InferInput(tensor, [1, len(value.encode())], "UINT8")
            inp.set_data_from_numpy(_utf8(value))
            inputs.append(inp)
        return client.infer("cosyvoice2_offline", inputs).as_numpy("waveform")[0]

    with triton_http(server["http"]) as client:
        wav = infer(client, "alice")
        assert wav.shape == ref.shape and np.abs(ref - wav).max() <= 1.01 / 32768
        with pytest.raises(InferenceServerException, match="no speaker 'bob'"):
            infer(client, "bob")


def test_bytes_text_works_or_is_refused_with_the_utf8_hint(server: dict[str, Any]) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    inp = httpclient.InferInput("target_text", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([["Hi."]], dtype=object))
    with triton_http(server["http"]) as client:
        try:
            wav = client.infer("cosyvoice2_offline", [inp]).as_numpy("waveform")
            assert wav.size > 0  # a stub whose numpy bridge works reads BYTES
        except InferenceServerException as exc:
            assert "target_text_utf8" in str(exc), str(exc)
        assert client.is_model_ready("cosyvoice2_offline")  # the stub survived the request


def test_server_stops(server: dict[str, Any]) -> None:
    proc = server["proc"]
    proc.terminate()
    assert proc.wait(timeout=60) is not None
    assert proc.poll() is not None


# ---- GPU layout: a bundle with the real manifest / passport schema, TensorRT and TensorRT-LLM engines faked.
