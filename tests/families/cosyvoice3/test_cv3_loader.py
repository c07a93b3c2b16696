"""A model dir in upstream CosyVoice3's layout loads strictly: a missing, extra or mis-shaped key is a
one-line error naming the file and the key (from the loader, the pre-flight check and the CLI), the
built-ins go through the same loader, and a dir holding cosyvoice3.yaml is the cosyvoice3 family."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from cosycompile.errors import ModelError
from cosycompile.families.cosyvoice3.loader import PRESETS, _yaml_text, check_checkpoint, init_model, load_models

DATA = Path(__file__).resolve().parents[2] / "data" / "cv3_upstream"
STAGES = ("llm", "flow", "hift")


@pytest.fixture(scope="module")
def cv3_tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """builtin:cv3-tiny written in upstream's layout (read-only: copy before editing)."""
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return init_model("builtin:cv3-tiny", tmp_path_factory.mktemp("cv3") / "tiny", seed=0)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_an_unreadable_checkpoint_names_the_file(cv3_tiny_dir: Path, tmp_path: Path) -> None:
    d = _copy(cv3_tiny_dir, tmp_path / "model")
    (d / "hift.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ModelError, match=r"hift\.pt: not a readable PyTorch checkpoint"):
        load_models(d, ("hift",))
    (d / "flow.pt").unlink()
    with pytest.raises(ModelError, match=r"flow\.pt: checkpoint is missing"):
        check_checkpoint(d, "flow")


def test_hift_keys_with_upstreams_generator_prefix_load(cv3_tiny_dir: Path, tmp_path: Path) -> None:
    """Upstream strips ``generator.`` from hift.pt's keys (a checkpoint saved from its GAN wrapper)."""
    d = _copy(cv3_tiny_dir, tmp_path / "model")
    sd = torch.load(d / "hift.pt", weights_only=True)
    torch.save({f"generator.{k}": v for k, v in sd.items()}, d / "hift.pt")
    hift = load_models(d, ("hift",)).hift
    assert all(torch.equal(hift.state_dict()[k], v) for k, v in sd.items())


def _meta_checkpoint(shapes: dict[str, list[int]], path: Path) -> None:
    """A state dict with upstream's keys and shapes and no data (meta tensors): enough for key checks."""
    torch.save({k: torch.empty(*v, device="meta") for k, v in shapes.items()}, path)


def test_upstream_0_5b_layout_passes_the_strict_check(tmp_path: Path) -> None:
    """Upstream's own cosyvoice3.yaml plus state dicts with the keys and shapes upstream's classes have at
    the 0.5B config (shapes_0_5b.json, written by running upstream's code) pass the strict check of every
    stage; one shape off fails it naming the key."""
    shapes = json.loads((DATA / "shapes_0_5b.json").read_text())
    d = tmp_path / "Fun-CosyVoice3-0.5B"
    d.mkdir()
    shutil.copy(DATA / "cosyvoice3.yaml", d / "cosyvoice3.yaml")
    (d / "CosyVoice-BlankEN").mkdir()
    shutil.copy(DATA / "qwen2_0_5b_config.json", d / "CosyVoice-BlankEN" / "config.json")
    upstream = {"llm": shapes["lm"], "flow": shapes["flow"], "hift": shapes["hift"]}
    for stage in STAGES:
        _meta_checkpoint(upstream[stage], d / f"{stage}.pt")
        check_checkpoint(d, stage)
    key = "decoder.estimator.transformer_blocks.21.attn.to_q.weight"
    _meta_checkpoint({**upstream["flow"], key: [1024, 1023]}, d / "flow.pt")
    with pytest.raises(ModelError, match=rf"flow\.pt: shape mismatch for 1 tensors, e.g. {key}"):
        check_checkpoint(d, "flow")


def test_the_0_5b_builtins_yaml_reads_as_the_0_5b_config(tmp_path: Path) -> None:
    """builtin:cv3-random-0.5b's cosyvoice3.yaml (written without its 3 GB of weights) is upstream's config."""
    from cosycompile.families.cosyvoice3.lm import qwen2_config
    from cosycompile.families.cosyvoice3.yaml_read import read_model_config

    cfg = PRESETS["cv3-random-0.5b"]
    (tmp_path / "cosyvoice3.yaml").write_text(_yaml_text(cfg))
    (tmp_path / "CosyVoice-BlankEN").mkdir()
    (tmp_path / "CosyVoice-BlankEN" / "config.json").write_text(json.dumps(qwen2_config(cfg.lm).to_dict(), default=str))
    assert read_model_config(tmp_path) == cfg


def test_the_tiny_builtin_loads_through_the_loader(cv3_tiny_dir: Path) -> None:
    from cosycompile.families import detect_family, load_models as registry_load, resolve_family

    assert detect_family(cv3_tiny_dir).name == "cosyvoice3"
    assert resolve_family("builtin:cv3-tiny").name == resolve_family("builtin:cv3-random-0.5b").name == "cosyvoice3"
    models = registry_load("builtin:cv3-tiny", STAGES)
    assert models.family == "cosyvoice3" and models.model_dir is None
    assert models.config.lm.speech_token_size == PRESETS["cv3-tiny"].lm.speech_token_size
    # The same seed writes the same weights; another seed other weights.
    again = load_models(cv3_tiny_dir, ("flow",)).flow.state_dict()
    assert all(torch.equal(again[k], v) for k, v in models.flow.state_dict().items())
    other = init_model("builtin:cv3-tiny", cv3_tiny_dir.parent / "seed1", seed=1)
    w = "decoder.estimator.proj_out.weight"
    assert not torch.equal(load_models(other, ("flow",)).flow.state_dict()[w], again[w])


def test_an_unknown_builtin_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"unknown built-in model 'builtin:cv3-huge' \(known: builtin:cv3-tiny, "):
        init_model("builtin:cv3-huge", tmp_path / "m")


def test_a_dir_with_both_configs_asks_for_the_family(cv3_tiny_dir: Path, tmp_path: Path) -> None:
    from cosycompile.families import detect_family

    d = _copy(cv3_tiny_dir, tmp_path / "model")
    (d / "cosyvoice2.yaml").write_text("x: 1\n")
    with pytest.raises(ModelError, match=r"configs of several families \(cosyvoice2\.yaml, cosyvoice3\.yaml\)"):
        detect_family(d)


def test_layout_check_names_the_cv3_files(cv3_tiny_dir: Path, tmp_path: Path) -> None:
    from cosycompile.families.cosyvoice3.layout import check_frontend_models, check_model_dir

    d = _copy(cv3_tiny_dir, tmp_path / "model")
    check_model_dir(d, STAGES)
    check_frontend_models(d)
    (d / "speech_tokenizer_v3.onnx").write_bytes(b"garbage")
    with pytest.raises(ModelError, match=r"speech_tokenizer_v3\.onnx: not a valid ONNX model"):
        check_frontend_models(d)
    (d / "speech_tokenizer_v3.onnx").unlink()
    with pytest.raises(ModelError, match=r"speech_tokenizer_v3\.onnx: missing \(speech tokenizer of the front end\)"):
        check_model_dir(d, STAGES)
    (d / "cosyvoice3.yaml").unlink()
    with pytest.raises(ModelError, match=r"cosyvoice3\.yaml: missing .*not a CosyVoice3 model dir"):
        check_model_dir(d, STAGES)
