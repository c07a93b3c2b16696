"""init_model writes the real layout; load_models loads it strictly; bad checkpoints are clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

from cosycompile.errors import ModelError
from cosycompile.families.cosyvoice2.loader import MODEL_FILES, check_checkpoint, init_model, load_models, model_files


@pytest.fixture()
def model_copy(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny model dir that a test may damage."""
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))


def test_builtin_dir_has_the_real_layout(tiny_model_dir: Path) -> None:
    for name in (*MODEL_FILES, "CosyVoice-BlankEN/config.json", "CosyVoice-BlankEN/generation_config.json",
                 "campplus.onnx", "speech_tokenizer_v2.onnx", "builtin.json"):
        assert (tiny_model_dir / name).is_file(), name
    marker = json.loads((tiny_model_dir / "builtin.json").read_text())
    assert marker["builtin"] == "tiny" and marker["seed"] == 0
    qwen = json.loads((tiny_model_dir / "CosyVoice-BlankEN" / "config.json").read_text())
    assert qwen["architectures"] == ["Qwen2ForCausalLM"] and qwen["hidden_size"] == 128
    assert "!new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec" in (tiny_model_dir / "cosyvoice2.yaml").read_text()
    # Written into a temp dir and renamed: nothing half-written is left beside it.
    assert [p.name for p in tiny_model_dir.parent.iterdir()] == [tiny_model_dir.name]


def test_checkpoints_are_plain_state_dicts(tiny_model_dir: Path) -> None:
    for stage in ("llm", "flow", "hift"):
        sd = torch.load(tiny_model_dir / f"{stage}.pt", weights_only=True)
        assert isinstance(sd, dict) and all(isinstance(v, torch.Tensor) for v in sd.values())
        assert all(v.dtype == torch.float32 for v in sd.values())


def test_strict_round_trip(tiny_model_dir: Path, tiny_models: Any) -> None:
    for stage in ("llm", "flow", "hift"):
        net = getattr(tiny_models, stage)
        assert not net.training
        saved = torch.load(tiny_model_dir / f"{stage}.pt", weights_only=True)
        loaded = net.state_dict()
        assert saved.keys() == loaded.keys()
        assert all(torch.equal(saved[k], loaded[k]) for k in saved)
        assert all(p.dtype == torch.float32 for p in net.parameters())


def test_init_is_seeded_and_leaves_the_global_rng_alone(tmp_path: Path) -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = init_model("builtin:tiny", tmp_path / "a", seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    b = init_model("builtin:tiny", tmp_path / "b", seed=1)
    c = init_model("builtin:tiny", tmp_path / "c", seed=2)
    for stage in ("flow", "hift"):
        sa, sb, sc = (torch.load(d / f"{stage}.pt", weights_only=True) for d in (a, b, c))
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
        assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_frontend_standins_have_the_real_signatures(tiny_model_dir: Path) -> None:
    camp = ort.InferenceSession(str(tiny_model_dir / "campplus.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in camp.get_inputs()] == ["input"]
    rng = np.random.default_rng(0)
    feats = [rng.standard_normal((1, n, 80)).astype(np.float32) * s for n, s in ((90, 1.0), (200, 3.0))]
    e1, e2 = (camp.run(None, {"input": f})[0] for f in feats)
    assert e1.shape == (1, 192) and not np.allclose(e1, e2)
    tok = ort.InferenceSession(str(tiny_model_dir / "speech_tokenizer_v2.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in tok.get_inputs()] == ["feats", "feats_length"]
    for T in (4, 101, 400):
        mel = rng.standard_normal((1, 128, T)).astype(np.float32)
        ids = tok.run(None, {"feats": mel, "feats_length": np.array([T], np.int32)})[0]
        assert ids.shape == (1, -(-T // 4)) and np.issubdtype(ids.dtype, np.integer)
        assert ids.min() >= 0 and ids.max() < 6561


def test_partial_load_and_model_files(tiny_model_dir: Path) -> None:
    m = load_models(tiny_model_dir, ("hift",))
    assert m.hift is not None and m.llm is None and m.flow is None
    assert m.model_dir == tiny_model_dir
    files = model_files(tiny_model_dir, ("llm", "hift"))
    assert {p.relative_to(tiny_model_dir).as_posix() for p in files} == {
        "cosyvoice2.yaml", "llm.pt", "hift.pt", "CosyVoice-BlankEN/config.json"}
    with pytest.raises(ValueError, match="unknown stage"):
        load_models(tiny_model_dir, ("vocoder",))


def test_builtin_spec_loads_through_the_same_path() -> None:
    m = load_models("builtin:tiny", ("flow",))
    assert m.flow is not None and m.config.flow.encoder_size == 64


def test_hift_generator_prefix_and_legacy_weight_norm_keys(model_copy: Path, tiny_models: Any) -> None:
    """hift.pt may carry a ``generator.`` prefix and pre-parametrization weight_g / weight_v names."""
    sd = torch.load(model_copy / "hift.pt", weights_only=True)
    legacy = {"generator." + k.replace("parametrizations.weight.original0", "weight_g")
              .replace("parametrizations.weight.original1", "weight_v"): v for k, v in sd.items()}
    assert any(k.endswith(".weight_g") for k in legacy)
    torch.save(legacy, model_copy / "hift.pt")
    hift = load_models(model_copy, ("hift",)).hift
    mel = torch.randn(1, 80, 12)
    ri, noise = torch.zeros(1, 9), torch.randn(1, 12 * 480, 9)
    torch.testing.assert_close(hift.inference(mel, ri, noise), tiny_models.hift.inference(mel, ri, noise))


def _expect_error(model_dir: Path, stage: str, *fragments: str) -> None:
    for check in (lambda: load_models(model_dir, (stage,)), lambda: check_checkpoint(model_dir, stage)):
        with pytest.raises(ModelError) as err:
            check()
        msg = str(err.value)
        assert str(model_dir / f"{stage}.pt") in msg
        for f in fragments:
            assert f in msg, msg


def test_missing_checkpoint(model_copy: Path) -> None:
    (model_copy / "flow.pt").unlink()
    _expect_error(model_copy, "flow", "missing")


def test_corrupt_checkpoint(model_copy: Path) -> None:
    data = (model_copy / "llm.pt").read_bytes()
    (model_copy / "llm.pt").write_bytes(data[: len(data) // 2])
    _expect_error(model_copy, "llm", "not a readable")
    (model_copy / "llm.pt").write_bytes(b"definitely not a checkpoint")
    _expect_error(model_copy, "llm", "not a readable")


def test_pickled_code_is_refused(model_copy: Path, tmp_path: Path) -> None:
    """weights_only=True: a checkpoint that would run code on load is rejected, not executed."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple:
            return (Path.touch, (marker,))

    torch.save({"x": Evil()}, model_copy / "hift.pt")
    _expect_error(model_copy, "hift")
    assert not marker.exists()


def test_key_and_shape_mismatches_name_the_keys(model_copy: Path) -> None:
    sd = torch.load(model_copy / "flow.pt", weights_only=True)
    del sd["encoder_proj.bias"]
    sd["encoder.extra.weight"] = torch.zeros(1)
    torch.save(sd, model_copy / "flow.pt")
    _expect_error(model_copy, "flow", "encoder_proj.bias", "encoder.extra.weight")
    sd = torch.load(model_copy / "llm.pt", weights_only=True)
    sd["llm_decoder.bias"] = torch.zeros(10)
    torch.save(sd, model_copy / "llm.pt")
    _expect_error(model_copy, "llm", "llm_decoder.bias", "(10,)")


def test_init_model_refuses_bad_targets(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="unknown built-in"):
        init_model("builtin:huge", tmp_path / "x")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    with pytest.raises(ModelError, match="not empty"):
        init_model("builtin:tiny", busy)
    assert (busy / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]


def test_the_plugin_lists_exactly_the_loaders_builtins() -> None:
    """``PLUGIN.builtins`` (read without torch, at plan time) names what ``init_model`` can write."""
    from cosycompile.families import get_family
    from cosycompile.families.cosyvoice2.config import PRESETS
    from cosycompile.families.cosyvoice2.loader import VARIANTS

    assert set(get_family("cosyvoice2").builtins) == {*PRESETS, *VARIANTS}
