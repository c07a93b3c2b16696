"""The GPU layout of Triton repositories (exporters/triton/gpu.py, serve_gpu.py), per model family.

Nothing here runs a GPU engine: the bundle is made from the real manifest, passport and graph-spec
schema with placeholder engines, and the LM's token map is the one the family's HF rewrite writes
for its built-in tiny model. The configs must parse with Triton's proto and match the bundle; the
LM requests the front model sends (prompt ids, stop ids, the tensorrt_llm inputs) must be those of
the HF rewrite and of the config it is sent to, and its prompt text that of the bundle's CPU runtime.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import config_tensors, instance_kind, one_line_error, parse_model_config, run_cli

# Flow/HiFT runtime constants the graph specs' dims read (CosyVoice3's flow encoder also its token range).
GPU_INFO = {"mel_bins": 80, "spk_embed_dim": 192, "harmonics": 9, "samples_per_frame": 480, "n_freq": 9,
            "flow_vocab_size": 6561, "sample_rate": 24000}
SPEECH_TOKENIZER = {"cosyvoice2": "speech_tokenizer_v2.onnx", "cosyvoice3": "speech_tokenizer_v3.onnx"}


@pytest.fixture(scope="module")
def tiny_models(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """family -> (built-in tiny model dir, its LLM loaded) for both Qwen2-based families."""
    from cosycompile.families import builtin_family, load_models

    cv3 = tmp_path_factory.mktemp("cv3") / "tiny"
    builtin_family("builtin:cv3-tiny").hook("init_model")("builtin:cv3-tiny", cv3, seed=0)
    return {family: (d, load_models(d, ("llm",))) for family, d in (("cosyvoice2", tiny_model_dir), ("cosyvoice3", cv3))}


def _token_map(models: Any) -> Any:
    from cosycompile.stages.llm.hf_rewrite import token_map

    return token_map(models.config, None, models.family)


def _gpu_bundle(root: Path, models: Any, trtllm_version: str = "1.2.0", token_map: bool = True) -> Path:
    from cosycompile.stages.flow import FLOW_ENCODER, FLOW_ESTIMATOR
    from cosycompile.stages.hift import HIFT

    family = models.family
    bundle = root / "builds" / "l20-int8-0123456789ab"
    graphs = {"flow": (FLOW_ENCODER, FLOW_ESTIMATOR), "hift": (HIFT,)}
    for stage, specs in graphs.items():
        d = bundle / "engines" / stage
        d.mkdir(parents=True)
        info = dict(GPU_INFO, family=family)
        described = {g.name: g.describe(info) for g in specs}
        for g in specs:
            (d / f"{g.name}.plan").write_bytes(b"not a real plan " + g.name.encode())
        (d / "graphs.json").write_text(json.dumps({"stage": stage, "graphs": {
            n: {"file": f"{n}.plan", "inputs": [t["name"] for t in s["inputs"]],
                "outputs": [t["name"] for t in s["outputs"]], "spec": s} for n, s in described.items()},
            "assets": {"rand_noise": "rand_noise.npy"} if stage == "flow" else {}, "info": info}))
        if stage == "flow":
            np.save(d / "rand_noise.npy", np.zeros((1, 80, 100), np.float32))
        (d / "engine.json").write_text(json.dumps({"backend": "tensorrt", "target": "l20", "compute_capability": "sm89",
                                                   "precision": "int8", "options": {}, "graphs": described}))
    llm = bundle / "engines" / "llm"
    llm.mkdir(parents=True)
    # The layout backends/trtllm writes for TensorRT-LLM <= 1.2: trtllm-build's output under engine_dir,
    # the rewrite's token map beside it.
    (llm / "engine").mkdir()
    (llm / "engine" / "rank0.engine").write_bytes(b"not a real engine")
    (llm / "engine" / "config.json").write_text("{}")
    if token_map:
        (llm / "cosycompile_llm.json").write_text(json.dumps({"token_map": _token_map(models).as_json()}))
    (llm / "engine.json").write_text(json.dumps({"backend": "trtllm", "target": "l20", "compute_capability": "sm89",
                                                 "precision": "int8_sq", "tensorrt_llm": trtllm_version,
                                                 "engine_dir": "engine", "options": {"max_batch_size": 16},
                                                 "graphs": {}}))
    (bundle / "frontend").mkdir(parents=True)
    for rel in (f"frontend/{SPEECH_TOKENIZER[family]}", "frontend/campplus.onnx", "frontend/builtin.json"):
        (bundle / rel).write_text("{}")
    (bundle / "recipe.json").write_text(json.dumps({"name": "l20-int8", "validation": {
        "sampling": {"mode": "ras", "seed": 0, "top_p": 0.8, "top_k": 25}, "speed": {"threads": 2}}}))
    files = {str(p.relative_to(bundle)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in bundle.rglob("*") if p.is_file()}
    (bundle / "manifest.json").write_text(json.dumps({
        "schema": 2, "recipe": "l20-int8", "key": "0123456789ab" + "0" * 52, "frontend": "frontend", "family": family,
        "stages": {"llm": {"backend": "trtllm", "precision": "int8_sq"},
                   "flow": {"backend": "tensorrt", "precision": "int8"},
                   "hift": {"backend": "tensorrt", "precision": "fp16"}},
        "files": files}))
    return bundle


@pytest.mark.parametrize("family", ["cosyvoice2", "cosyvoice3"])
@pytest.mark.parametrize("llm_url", [None, "http://127.0.0.1:8100"])
def test_gpu_configs_parse_and_match_the_passports(tiny_models: dict, tmp_path: Path, family: str,
                                                   llm_url: str | None) -> None:
    bundle = _gpu_bundle(tmp_path, tiny_models[family][1])
    out = tmp_path / "repo"
    res = run_cli("triton", str(bundle), "--out", str(out), *(["--llm-url", llm_url] if llm_url else []))
    assert res.returncode == 0, res.stderr
    info = json.loads((out / "repository.json").read_text())
    assert info["layout"] == "gpu"
    front = (family, f"{family}_offline")
    expected = {*front, "audio_tokenizer", "speaker_embedding", "token2wav",
                "flow_encoder", "flow_estimator", "vocoder"} | (set() if llm_url else {"tensorrt_llm"})
    assert set(info["models"]) == expected == {p.parent.name for p in out.glob("*/config.pbtxt")}
    parsed = {m: parse_model_config(out / m / "config.pbtxt") for m in expected}
    assert all(parsed[m].name == m for m in expected)
    passports = {s: json.loads((bundle / "engines" / s / "engine.json").read_text()) for s in ("flow", "hift")}
    for model, (stage, graph) in {"flow_encoder": ("flow", "flow_encoder"), "flow_estimator": ("flow", "flow_estimator"),
                                  "vocoder": ("hift", "hift")}.items():
        cfg, spec = parsed[model], passports[stage]["graphs"][graph]
        assert cfg.platform == "tensorrt_plan" and instance_kind(cfg.instance_group[0]) == "KIND_GPU"
        assert (out / model / "1" / cfg.default_model_filename).read_bytes() == \
            (bundle / "engines" / stage / f"{graph}.plan").read_bytes()
        want = {t["name"]: (f"TYPE_{ {'float32': 'FP32', 'int64': 'INT64'}[t['dtype']]}",
                            [d if isinstance(d, int) else -1 for d in t["shape"]], False)
                for t in [*spec["inputs"], *spec["outputs"]]}
        assert config_tensors(cfg) == want
    assert parsed[front[0]].model_transaction_policy.decoupled
    assert not parsed[front[1]].model_transaction_policy.decoupled
    for name in front:
        params = parsed[name].parameters
        assert params["llm"].string_value == ("trtllm-serve" if llm_url else "tensorrt_llm")
        assert params["llm_url"].string_value == (llm_url or "")
        assert params["sample_rate"].string_value == "24000"
        # The front models read the LM's ids from the bundle's own token map, linked beside them.
        linked = out / name / "1" / params["token_map"].string_value
        assert linked.read_bytes() == (bundle / "engines" / "llm" / "cosycompile_llm.json").read_bytes()
        assert (out / name / "1" / "frontend" / SPEECH_TOKENIZER[family]).is_file()
        assert "class TextToWave" not in (out / name / "1" / "model.py").read_text()  # a shim, not a copy
        assert "TextToWave" in (out / name / "1" / "model.py").read_text()
    assert config_tensors(parsed["speaker_embedding"])["prompt_spk_embedding"] == ("TYPE_FP32", [192], False)
    assert config_tensors(parsed["token2wav"])["prompt_speech_feat"] == ("TYPE_FP32", [80, -1], True)
    for name in ("token2wav", front[0]):  # the streaming front model cuts chunks with the same runtimes
        assert (out / name / "1" / "flow" / "rand_noise.npy").is_file() and not list((out / name).rglob("*.plan"))
    for name in front:  # cached speakers are checked against the bundle's manifest, linked beside them
        assert (out / name / "1" / "manifest.json").read_bytes() == (bundle / "manifest.json").read_bytes()
    if not llm_url:
        trt = parsed["tensorrt_llm"]
        assert trt.backend == "tensorrtllm" and trt.max_batch_size == 16 and trt.model_transaction_policy.decoupled
        engine = Path(trt.parameters["gpt_model_path"].string_value)
        assert engine == out.resolve() / "tensorrt_llm" / "1" / "engine" / "engine" and (engine / "rank0.engine").is_file()
    for model in (front[0], "audio_tokenizer", "speaker_embedding", "token2wav"):
        compile((out / model / "1" / "model.py").read_text(), model, "exec")


def test_gpu_bundle_with_newer_trtllm_needs_a_url(tiny_models: dict, tmp_path: Path) -> None:
    bundle = _gpu_bundle(tmp_path, tiny_models["cosyvoice3"][1], trtllm_version="1.3.0")
    line = one_line_error(run_cli("triton", str(bundle), "--out", str(tmp_path / "repo")))
    assert "--llm-url" in line and "1.3" in line
    assert not (tmp_path / "repo").exists()


def test_gpu_bundle_without_a_token_map_is_refused(tiny_models: dict, tmp_path: Path) -> None:
    bundle = _gpu_bundle(tmp_path, tiny_models["cosyvoice3"][1], token_map=False)
    line = one_line_error(run_cli("triton", str(bundle), "--out", str(tmp_path / "repo"), "--llm-url", "http://x:1"))
    assert "cosycompile_llm.json: missing" in line and "token map" in line
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("family", ["cosyvoice2", "cosyvoice3"])
def test_front_model_sends_the_rewrites_ids_to_the_configs_inputs(tiny_models: dict, tmp_path: Path,
                                                                  family: str) -> None:
    """What TextToWave sends the LM: the HF rewrite's prompt layout and every stop id of the family
    (CosyVoice2: 3, CosyVoice3: 200, more than end_id carries), as inputs the tensorrt_llm config declares."""
    from cosycompile.exporters.triton.config import TRITON_DTYPES
    from cosycompile.exporters.triton.serve_gpu import ServedVocab, completion_body, trtllm_feeds

    models = tiny_models[family][1]
    tmap = _token_map(models)
    bundle = _gpu_bundle(tmp_path, models)
    out = tmp_path / "repo"
    assert run_cli("triton", str(bundle), "--out", str(out)).returncode == 0
    vocab = ServedVocab.read(out / family / "1" / "cosycompile_llm.json")
    text, speech = [11, 12, 13], [0, 5, tmap.speech_token_size - 1]
    assert vocab.prompt_ids(text, speech) == tmap.prompt_ids(text, speech)
    assert len(vocab.stop_ids) == {"cosyvoice2": 3, "cosyvoice3": 200}[family] == len(tmap.stop_ids)
    feeds = trtllm_feeds(vocab, tmap.prompt_ids(text, speech), 50, 25, 0.8, 7)
    words = feeds["stop_words_list"]
    assert words.shape == (1, 2, len(tmap.stop_ids)) and words[0, 0].tolist() == tmap.stop_ids
    assert words[0, 1].tolist() == list(range(1, len(tmap.stop_ids) + 1))  # one id per stop word
    assert int(feeds["end_id"].reshape(-1)[0]) == tmap.eos_id
    declared = config_tensors(parse_model_config(out / "tensorrt_llm" / "config.pbtxt"))
    for name, value in feeds.items():
        dtype, dims, _ = declared[name]
        assert dtype == TRITON_DTYPES[value.dtype.name], name
        assert len(dims) == value.ndim - 1 and all(d in (-1, n) for d, n in zip(dims, value.shape[1:])), (name, dims)
    assert set(declared) >= {"input_ids", "input_lengths", "request_output_len"} and set(feeds) <= set(declared)
    assert completion_body(vocab, [1], 5, 25, 0.8, 7)["stop_token_ids"] == tmap.stop_ids
    # Generated ids back to speech tokens: up to the first stop id, whichever of the family's it is.
    s = tmap.speech_id
    generated = np.array([s(4), s(9), tmap.stop_ids[-1], s(3)])
    assert vocab.speech_tokens(generated).tolist() == [4, 9]
    assert vocab.speech_tokens(np.array([s(1), s(2)])).tolist() == [1, 2]


@pytest.mark.parametrize("family", ["cosyvoice2", "cosyvoice3"])
def test_front_model_prompt_text_is_the_cpu_runtimes(tiny_models: dict, family: str) -> None:
    """The prompt text ids TextToWave puts before the text: the family's instruction where the CPU
    runtime's front end adds one (CosyVoice3 without ``<|endofprompt|>``), none for CosyVoice2."""
    from cosycompile.exporters.triton.serve_gpu import TextToWave
    from cosycompile.runtime.frontend import Frontend

    model_dir = tiny_models[family][0]
    bls = TextToWave()
    bls.frontend = frontend = Frontend(model_dir)
    no_prompt = frontend.no_prompt("Hello there.").text_ids.tolist()
    assert bls.prompt_text_ids("", "Hello there.") == no_prompt
    assert bool(no_prompt) == (family == "cosyvoice3")
    wav = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1
    with_prompt = frontend.prompt(wav, 16000, "A prompt.", "Hello there.").text_ids.tolist()
    assert bls.prompt_text_ids("A prompt.", "Hello there.") == with_prompt
    marked = "Speak slowly.<|endofprompt|>"
    assert bls.prompt_text_ids("", marked) == []  # the text carries its own instruction


@pytest.mark.parametrize("how", ["fifo", "outside"])
def test_a_bundle_listing_a_fifo_or_a_path_outside_is_refused(tiny_models: dict, tmp_path: Path, how: str) -> None:
    """A listed file that is a FIFO (reading it would block forever) or a listed path that climbs out of
    the bundle: refused in one line before anything is written or read outside."""
    import os

    bundle = _gpu_bundle(tmp_path, tiny_models["cosyvoice2"][1])
    manifest = json.loads((bundle / "manifest.json").read_text())
    if how == "fifo":
        target = bundle / "frontend" / "campplus.onnx"
        target.unlink()
        os.mkfifo(target)
    else:
        manifest["files"]["../../outside.txt"] = "0" * 64
        manifest["sizes"] = {k: 0 for k in manifest["files"]}
        (bundle / "manifest.json").write_text(json.dumps(manifest))
    line = one_line_error(run_cli("triton", str(bundle), "--out", str(tmp_path / "repo"), "--llm-url", "http://x:1"))
    if how == "fifo":
        assert "campplus.onnx" in line and "not a regular file" in line, line
    else:
        assert "'../../outside.txt', not a plain relative path inside the bundle" in line, line
    assert not (tmp_path / "repo").exists()
