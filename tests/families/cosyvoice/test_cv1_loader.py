"""A model dir in upstream CosyVoice-300M's layout loads strictly: a missing, extra or mis-shaped key is
a one-line error naming the file and the key (from the loader, the pre-flight check and the CLI);
``cosyvoice.yaml`` is read without running it (upstream's own example config reads as the 300M
shapes); the built-ins go through the same loader; a dir holding cosyvoice.yaml is this family's."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from cosycompile.errors import ModelError
from cosycompile.families.cosyvoice.config import cv1_300m, cv1_tiny
from cosycompile.families.cosyvoice.loader import init_model, load_models
from cosycompile.families.cosyvoice.yaml_read import read_model_config, yaml_text

STAGES = ("llm", "flow", "hift")
UPSTREAM = Path("/work/.mirror/FunAudioLLM+CosyVoice/repo")
COMMIT = "ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40"


@pytest.fixture(scope="module")
def cv1_tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """builtin:cv1-tiny written in upstream's layout (read-only: copy before editing)."""
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return init_model("builtin:cv1-tiny", tmp_path_factory.mktemp("cv1") / "tiny", seed=0)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_upstreams_example_config_reads_as_the_300m_shapes(tmp_path: Path) -> None:
    try:
        text = subprocess.run(["git", f"--git-dir={UPSTREAM}", "show",
                               f"{COMMIT}:examples/libritts/cosyvoice/conf/cosyvoice.yaml"],
                              capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip(f"upstream's source is not at {UPSTREAM}")
    (tmp_path / "cosyvoice.yaml").write_bytes(text)
    assert read_model_config(tmp_path) == cv1_300m()


@pytest.mark.parametrize("cfg", [cv1_tiny(), cv1_300m()], ids=["tiny", "300m"])
def test_the_builtins_yaml_reads_back_as_its_config(cfg: object, tmp_path: Path) -> None:
    (tmp_path / "cosyvoice.yaml").write_text(yaml_text(cfg))  # type: ignore[arg-type]
    assert read_model_config(tmp_path) == cfg


@pytest.mark.parametrize("edit,want", [
    (("!new:cosyvoice.llm.llm.TransformerLM", "!new:cosyvoice.llm.llm.Qwen2LM"),
     r"llm: expected !new:\.\.\.TransformerLM \(CosyVoice-300M\), got !new:cosyvoice\.llm\.llm\.Qwen2LM"),
    (("macaron_style: False", "macaron_style: True"), r"macaron_style: True' is not supported"),
    (("input_frame_rate: 50", "input_frame_rate: 'fifty'"), r"flow: 'input_frame_rate' must be int"),
    (("num_blocks: 2", "num_blocks: 0"), r"'num_blocks: 0' is outside 1\.\."),
])
def test_a_config_this_implementation_cannot_build_is_one_line(tmp_path: Path, edit: tuple[str, str], want: str) -> None:
    (tmp_path / "cosyvoice.yaml").write_text(yaml_text(cv1_tiny()).replace(*edit, 1))
    with pytest.raises(ModelError, match=want) as err:
        read_model_config(tmp_path)
    assert "\n" not in str(err.value) and str(tmp_path / "cosyvoice.yaml") in str(err.value)


def test_the_tiny_builtin_loads_through_the_loader(cv1_tiny_dir: Path) -> None:
    from cosycompile.families import detect_family

    assert detect_family(cv1_tiny_dir).name == "cosyvoice"
    a, b = load_models(cv1_tiny_dir), load_models("builtin:cv1-tiny")
    for stage in STAGES:
        sa, sb = getattr(a, stage).state_dict(), getattr(b, stage).state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa), stage


def test_layout_check_names_the_cv1_files(cv1_tiny_dir: Path, tmp_path: Path) -> None:
    from cosycompile.families.cosyvoice.layout import check_frontend_models, check_model_dir

    d = _copy(cv1_tiny_dir, tmp_path / "model")
    check_model_dir(d, STAGES)
    check_frontend_models(d)
    (d / "speech_tokenizer_v1.onnx").unlink()
    with pytest.raises(ModelError, match=r"speech_tokenizer_v1\.onnx: missing \(speech tokenizer of the front end\)"):
        check_model_dir(d, STAGES)
    # A real model dir (no built-in marker) needs the text tokenizer's vocabulary its yaml names.
    (d / "builtin.json").unlink()
    with pytest.raises(ModelError, match=r"multilingual\.tiktoken: missing \(text tokenizer of the front end"):
        check_model_dir(d, STAGES)
    (d / "cosyvoice.yaml").unlink()
    with pytest.raises(ModelError, match=r"cosyvoice\.yaml: missing .*not a CosyVoice-300M model dir"):
        check_model_dir(d, STAGES)
