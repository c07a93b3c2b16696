"""The hyperpyyaml reader never executes anything, resolves !ref, and maps onto ModelConfig."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cosycompile.errors import ModelError
from cosycompile.families.cosyvoice2.config import PRESETS
from cosycompile.families.cosyvoice2.yaml_safe import Tagged, read_cosyvoice_yaml, read_model_config

# The layout of CosyVoice2-0.5B's cosyvoice2.yaml (model sections, plus the kind of training
# entries whose tags would import and call code under hyperpyyaml).
REAL_STYLE_YAML = """\
__set_seed1: !apply:random.seed [1986]
__set_seed3: !apply:torch.manual_seed [1986]
sample_rate: 24000
llm_input_size: 896
llm_output_size: 896
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2
chunk_size: 25
num_decoding_left_chunks: -1

llm: !new:cosyvoice.llm.llm.Qwen2LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: 6561
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    input_size: 512
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: 6561
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
        output_size: 512
        attention_heads: 8
        linear_units: 2048
        num_blocks: 6
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: 'linear'
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        input_size: 512
        use_cnn_module: False
        macaron_style: False
        static_chunk_size: !ref <chunk_size>
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            in_channels: 320
            out_channels: 80
            channels: [256]
            dropout: 0.0
            attention_head_dim: 64
            n_blocks: 4
            num_mid_blocks: 12
            num_heads: 8
            act_fn: 'gelu'
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
    in_channels: 80
    base_channels: 512
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: 512

hifigan: !new:cosyvoice.hifigan.hifigan.HiFiGan
    generator: !ref <hift>
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    sampling_rate: !ref <sample_rate>
tokenize: !name:cosyvoice.dataset.processor.tokenize
    get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
        token_path: !ref <qwen_pretrain_path>
data_pipeline: [!ref <tokenize>, !ref <feat_extractor>]
train_conf:
    optim: adam
    optim_conf:
        lr: 1e-5
"""

# Qwen2-0.5B's config.json (the body of CosyVoice-BlankEN).
QWEN2_05B_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}


def _model_dir(root: Path, yaml_text: str = REAL_STYLE_YAML, qwen: dict | None = QWEN2_05B_CONFIG) -> Path:
    d = root / "model"
    d.mkdir()
    (d / "cosyvoice2.yaml").write_text(yaml_text)
    if qwen is not None:
        (d / "CosyVoice-BlankEN").mkdir()
        (d / "CosyVoice-BlankEN" / "config.json").write_text(json.dumps(qwen))
    return d


def test_hostile_tags_are_data_never_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.yaml"
    evil.write_text(
        f'a: !apply:os.system ["touch {marker}"]\n'
        f'b: !new:subprocess.Popen {{args: ["touch", "{marker}"]}}\n'
        f'c: !name:builtins.exec ["open(\'{marker}\', \'w\')"]\n'
        f'd: !module:os\n'
        f'e: !include:/etc/passwd\n'
        f'f: !apply:os.system\n  - touch {marker}\n'
        f'g: !ref __import__("os").system("touch {marker}")\n'
    )
    data = read_cosyvoice_yaml(evil)
    assert not marker.exists()
    assert data["a"] == Tagged("apply", "os.system", [f"touch {marker}"])
    assert data["b"].kind == "new" and data["b"].target == "subprocess.Popen"
    assert data["d"] == Tagged("module", "os", "")
    assert data["e"].kind == "include" and data["e"].target == "/etc/passwd"
    # A !ref without <key> is not arithmetic, so it stays an inert string.
    assert isinstance(data["g"], str) and "system" in data["g"]


def test_pyyaml_python_tags_are_rejected(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "cosyvoice2.yaml"
    evil.write_text(f'x: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(ModelError, match="cosyvoice2.yaml"):
        read_cosyvoice_yaml(evil)
    assert not marker.exists()


def test_reading_the_model_yaml_imports_no_torch() -> None:
    code = ("import sys; import cosycompile.families.cosyvoice2.yaml_safe, cosycompile.families.cosyvoice2.config; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_refs_are_resolved(tmp_path: Path) -> None:
    p = tmp_path / "refs.yaml"
    p.write_text(
        "a: 25\nb: 2\nout: exp\n"
        "c: !ref <a> * <b>\n"
        "d: !ref <out>/save\n"
        "e: !new:pkg.Cls {x: 5, y: [1, 2]}\n"
        "f: !ref <e.x>\n"
        "g: !ref <e[y][1]>\n"
        "h: !ref <c>\n"
        "i: !ref (<a> - 1) // <b>\n"
    )
    data = read_cosyvoice_yaml(p)
    assert data["c"] == 50 and data["d"] == "exp/save" and data["f"] == 5 and data["g"] == 2
    assert data["h"] == 50 and data["i"] == 12


@pytest.mark.parametrize("body,match", [
    ("a: !ref <missing>\n", "missing"),
    ("a: !ref <b>\nb: !ref <a>\n", "cycle"),
    ("a: [unclosed\n", "not valid YAML"),
    ("- just\n- a list\n", "mapping"),
])
def test_bad_yaml_names_the_file(tmp_path: Path, body: str, match: str) -> None:
    p = tmp_path / "cosyvoice2.yaml"
    p.write_text(body)
    with pytest.raises(ModelError, match=match) as err:
        read_cosyvoice_yaml(p)
    assert str(p) in str(err.value)


def test_real_layout_maps_to_the_real_architecture(tmp_path: Path) -> None:
    assert read_model_config(_model_dir(tmp_path)) == PRESETS["random-0.5b"]


@pytest.mark.parametrize("preset", ["tiny", "random-0.5b"])
def test_builtin_yaml_round_trips(tmp_path: Path, preset: str) -> None:
    from cosycompile.families.cosyvoice2.loader import _yaml_text
    from cosycompile.families.cosyvoice2.qwen2lm import qwen2_config

    cfg = PRESETS[preset]
    qwen = qwen2_config(cfg.llm).to_dict()
    assert read_model_config(_model_dir(tmp_path, _yaml_text(cfg), qwen)) == cfg


def test_sampling_settings_are_read(tmp_path: Path) -> None:
    text = REAL_STYLE_YAML.replace("top_k: 25", "top_k: 50").replace("tau_r: 0.1", "tau_r: 0.2")
    cfg = read_model_config(_model_dir(tmp_path, text))
    assert (cfg.llm.sampling.top_k, cfg.llm.sampling.tau_r, cfg.llm.sampling.top_p) == (50, 0.2, 0.8)


def test_builtin_model_dir_config(tiny_model_dir: Path) -> None:
    assert read_model_config(tiny_model_dir) == PRESETS["tiny"]


@pytest.mark.parametrize("edit,match", [
    (("        num_blocks: 6\n", ""), r"flow\.encoder: missing key 'num_blocks'"),
    (("attention_heads: 8", "attention_heads: eight"), r"flow\.encoder: 'attention_heads' must be int"),
    (("flow.flow.CausalMaskedDiffWithXvec", "flow.flow.CausalMaskedDiffWithDiT"), "CausalMaskedDiffWithXvec"),
    (("use_cnn_module: False", "use_cnn_module: True"), "not supported"),
    (("llm_input_size: 896\n", "llm_input_size: 1024\n"), "hidden_size"),
])
def test_bad_entries_name_file_and_key(tmp_path: Path, edit: tuple[str, str], match: str) -> None:
    assert edit[0] in REAL_STYLE_YAML
    d = _model_dir(tmp_path, REAL_STYLE_YAML.replace(*edit, 1))
    with pytest.raises(ModelError, match=match) as err:
        read_model_config(d)
    assert "cosyvoice2.yaml" in str(err.value)


def test_missing_files_are_model_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="model dir not found"):
        read_model_config(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="cosyvoice2.yaml"):
        read_model_config(tmp_path / "empty")
    d = _model_dir(tmp_path, qwen=None)
    with pytest.raises(ModelError, match="CosyVoice-BlankEN/config.json"):
        read_model_config(d)
    (d / "CosyVoice-BlankEN").mkdir()
    (d / "CosyVoice-BlankEN" / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="config.json"):
        read_model_config(d)
