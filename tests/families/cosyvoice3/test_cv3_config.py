"""Upstream's cosyvoice3.yaml is read safely (tags are data, never code) into CosyVoice3Config, and a
class of another generation or a bad value is a one-line error naming the file and the key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cosycompile.errors import ModelError
from cosycompile.families.cosyvoice3.config import cv3_0_5b
from cosycompile.families.cosyvoice3.yaml_read import read_model_config

# examples/libritts/cosyvoice3/conf/cosyvoice3.yaml at FunAudioLLM/CosyVoice ace7c47 (see SOURCE.txt there).
UPSTREAM_YAML = Path(__file__).resolve().parents[2] / "data" / "cv3_upstream" / "cosyvoice3.yaml"

# Qwen2-0.5B's config.json, the body of Fun-CosyVoice3-0.5B's CosyVoice-BlankEN.
QWEN2_05B = json.loads((UPSTREAM_YAML.parent / "qwen2_0_5b_config.json").read_text())


def _model_dir(root: Path, yaml_text: str | None = None) -> Path:
    d = root / "model"
    d.mkdir()
    (d / "cosyvoice3.yaml").write_text(UPSTREAM_YAML.read_text() if yaml_text is None else yaml_text)
    (d / "CosyVoice-BlankEN").mkdir()
    (d / "CosyVoice-BlankEN" / "config.json").write_text(json.dumps(QWEN2_05B))
    return d


def test_upstream_yaml_reads_as_the_0_5b_config(tmp_path: Path) -> None:
    cfg = read_model_config(_model_dir(tmp_path))
    assert cfg == cv3_0_5b()
    # The shapes the issue names, read from the file rather than taken from defaults.
    d = cfg.flow.estimator
    assert (d.dim, d.depth, d.heads, d.dim_head, d.ff_mult, d.static_chunk_size) == (1024, 22, 16, 64, 2, 50)
    assert (cfg.flow.input_size, cfg.flow.pre_lookahead_channels, cfg.flow.pre_lookahead_len) == (80, 1024, 3)
    assert cfg.hift.upsample_rates == (8, 5, 3) and cfg.hift.upsample_kernel_sizes == (16, 11, 7)
    assert cfg.hift.conv_pre_look_right == 4 and cfg.sample_rate == 24000


def test_values_come_from_the_file(tmp_path: Path) -> None:
    text = UPSTREAM_YAML.read_text()
    text = text.replace("chunk_size: 25 #", "chunk_size: 10 #").replace("            depth: 22", "            depth: 3")
    text = text.replace("    conv_pre_look_right: 4", "    conv_pre_look_right: 2")
    cfg = read_model_config(_model_dir(tmp_path, text))
    assert cfg.flow.estimator.static_chunk_size == 20  # !ref <chunk_size> * <token_mel_ratio>
    assert cfg.flow.estimator.depth == 3 and cfg.hift.conv_pre_look_right == 2


def test_reading_runs_no_tag(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    text = UPSTREAM_YAML.read_text().replace("__set_seed1: !apply:random.seed [1986]",
                                             f'__set_seed1: !apply:os.system ["touch {marker}"]')
    assert "os.system" in text
    read_model_config(_model_dir(tmp_path, text))
    assert not marker.exists()


def test_reading_imports_no_torch() -> None:
    code = "import sys; import cosycompile.families.cosyvoice3.yaml_read; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("old, new, key", [
    # a CosyVoice2 flow in a cosyvoice3.yaml
    ("flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT", "flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec",
     "flow: expected !new:...CausalMaskedDiffWithDiT (CosyVoice3)"),
    ("estimator: !new:cosyvoice.flow.DiT.dit.DiT", "estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder",
     "flow.decoder.estimator: expected !new:...DiT"),
    ("hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator", "hift: !new:cosyvoice.hifigan.generator.HiFTGenerator",
     "hift: expected !new:...CausalHiFTGenerator"),
    ("            depth: 22", "            depth: 'deep'", "flow.decoder.estimator: 'depth' must be int"),
    ("            dim: 1024", "            dim: 1024.5", "flow.decoder.estimator: 'dim' must be int"),
    ("    conv_pre_look_right: 4", "    conv_pre_look_right: [4]", "hift: 'conv_pre_look_right' must be int"),
    ("            mu_dim: 80", "            mu_dim: 81", "flow.decoder.estimator: 'mu_dim' (81) must equal flow.input_size"),
    ("        channels: 1024\n", "", "flow.pre_lookahead_layer: missing key 'channels'"),
    ("num_decoding_left_chunks: -1 #", "num_decoding_left_chunks: 2 #",
     "flow.decoder.estimator: 'num_decoding_left_chunks: 2' is not supported (CosyVoice3 uses -1)"),
    ("                solver: 'euler'", "                solver: 'dopri5'", "solver: 'dopri5'' is not supported"),
    ("    vocab_size: 6561", "    vocab_size: 4096", "flow: 'vocab_size' (4096) must equal llm.speech_token_size"),
    ("    speech_token_size: 6561", "    speech_token_size: six", "llm: 'speech_token_size' must be int"),
    ("        cond_channels: 512", "        cond_channels: null", "hift.f0_predictor: 'cond_channels' must be int"),
])
def test_bad_value_is_one_line_naming_file_and_key(tmp_path: Path, old: str, new: str, key: str) -> None:
    text = UPSTREAM_YAML.read_text()
    assert old in text, old
    d = _model_dir(tmp_path, text.replace(old, new, 1))
    with pytest.raises(ModelError) as err:
        read_model_config(d)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"{d / 'cosyvoice3.yaml'}: "), msg
    assert key in msg, msg


def test_a_cosyvoice2_yaml_under_the_cv3_name_is_refused(tmp_path: Path) -> None:
    from cosycompile.families.cosyvoice2.loader import _yaml_text
    from cosycompile.families.cosyvoice2.config import PRESETS

    d = _model_dir(tmp_path, _yaml_text(PRESETS["tiny"]))
    with pytest.raises(ModelError, match=r"cosyvoice3\.yaml: llm: expected !new:\.\.\.CosyVoice3LM \(CosyVoice3\), "
                                         r"got !new:cosyvoice\.llm\.llm\.Qwen2LM"):
        read_model_config(d)


def test_missing_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="model dir not found"):
        read_model_config(tmp_path / "absent")
    d = _model_dir(tmp_path)
    (d / "cosyvoice3.yaml").unlink()
    with pytest.raises(ModelError, match=r"cosyvoice3\.yaml: model config not found"):
        read_model_config(d)
    (d / "cosyvoice3.yaml").write_text(UPSTREAM_YAML.read_text())
    (d / "CosyVoice-BlankEN" / "config.json").write_text(json.dumps({**QWEN2_05B, "hidden_size": "wide"}))
    with pytest.raises(ModelError, match=r"CosyVoice-BlankEN/config\.json: 'hidden_size' must be int"):
        read_model_config(d)
