"""The one way CosyVoice2 networks are built for a build: from a model dir in CosyVoice2-0.5B's layout.

``init_model`` writes the built-in models in that layout (so they go through exactly the same
loading as a real checkpoint); ``load_models`` reads the config safely and loads each ``.pt``
with ``weights_only=True`` and ``strict=True``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import nn

from cosycompile.families.checkpoints import (FamilyLoader, builtin_dir, builtin_name, prepare_builtin, write_builtin_marker,
                                              write_frontend_standins, write_qwen_config)
from cosycompile.families.hift import HiFTGenerator
from cosycompile.families.qwen2_layout import QWEN_DIR

from . import CONFIG_FILE, PLUGIN
from .config import PRESETS, ModelConfig
from .flow import CausalMaskedDiffWithXvec
from .qwen2lm import Qwen2LM
from cosycompile.families.hyperyaml import cfm_head_yaml, flow_head_yaml, header_yaml, hift_yaml, llm_yaml
from .yaml_safe import read_model_config

MODEL_FILES = (CONFIG_FILE, "llm.pt", "flow.pt", "hift.pt")
# This family's registry name is its folder's, so a renamed copy of the folder loads as that new family.
FAMILY = __name__.rsplit(".", 2)[-2]


def model_files(model_dir: Path, stages: Iterable[str]) -> list[Path]:
    """Files of the model dir that the given stages read (for content keys)."""
    return [model_dir / f for f in PLUGIN.model_files(stages)]


# Networks are built from the config with random weights; checkpoints are loaded into them.
BUILDERS: dict[str, Callable[[ModelConfig], nn.Module]] = {
    "llm": lambda cfg: Qwen2LM(cfg.llm, cfg.speech_token_size),
    "flow": lambda cfg: CausalMaskedDiffWithXvec(cfg.flow),
    "hift": lambda cfg: HiFTGenerator(cfg.hift),
}


# -- built-in models ---------------------------------------------------------------------------

def _yaml_text(cfg: ModelConfig) -> str:
    """cosyvoice2.yaml in upstream's hyperpyyaml style (tags included, never executed by us)."""
    f = cfg.flow
    encoder = f"""    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
        output_size: {f.encoder_size}
        attention_heads: {f.attention_heads}
        linear_units: {f.linear_units}
        num_blocks: {f.num_blocks}
        num_up_blocks: {f.num_up_blocks}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: 'linear'
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        input_size: {f.input_size}
        use_cnn_module: False
        macaron_style: False
        static_chunk_size: !ref <chunk_size>
"""
    estimator = f"""        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            in_channels: {f.estimator_in_channels}
            out_channels: {f.output_size}
            channels: {list(f.channels)}
            dropout: 0.0
            attention_head_dim: {f.attention_head_dim}
            n_blocks: {f.n_blocks}
            num_mid_blocks: {f.num_mid_blocks}
            num_heads: {f.num_heads}
            act_fn: 'gelu'
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>
"""
    flow = (flow_head_yaml("CausalMaskedDiffWithXvec", f.input_size, f.output_size, f.vocab_size, f.pre_lookahead_len)
            + encoder + cfm_head_yaml(f.output_size, f.inference_cfg_rate) + estimator)
    header = header_yaml("CosyVoice2", cfg.sample_rate, cfg.llm.hidden_size, f.spk_embed_dim, cfg.token_frame_rate,
                         cfg.token_mel_ratio, cfg.chunk_size)
    hift = hift_yaml(cfg.hift, "HiFTGenerator", "ConvRNNF0Predictor")
    return "\n".join([header, llm_yaml("Qwen2LM", cfg.speech_token_size), flow, hift])


# builtin:tiny-snake is builtin:tiny (same config, same seeded weights) with 4 Snake alphas of one HiFT
# resblock made tiny, as upstream CosyVoice3's HiFT has (4 of 10,752 alphas < 1.6e-5): their reciprocals
# 1/(alpha + 1e-9) are 6.7e4..2.5e5, beyond FP16's 65504, so an FP16 HiFT built naively clips the audio.
# One is negative, so that clamping is seen to keep the sign. Channel -> alpha, of the first Snake
# (``activations1.0``) of the k=7 resblock of the first upsampling stage (16 channels in builtin:tiny).
TINY_SNAKE_PARAM = "resblocks.1.activations1.0.alpha"
TINY_SNAKE_ALPHAS = {2: 1.2e-5, 5: -8.0e-6, 9: 4.0e-6, 13: 1.5e-5}


@torch.no_grad()
def _tiny_snake_alphas(hift: nn.Module) -> None:
    """Set the builtin:tiny-snake alphas (see TINY_SNAKE_ALPHAS)."""
    alpha = hift.get_parameter(TINY_SNAKE_PARAM)
    for channel, value in TINY_SNAKE_ALPHAS.items():
        alpha[channel] = value


# Built-in variants: name -> (preset whose config and seeded weights they start from, edit of the HiFT).
# A variant's cosyvoice2.yaml is its preset's, so it loads exactly like that preset's checkpoints.
VARIANTS: dict[str, tuple[str, Any]] = {"tiny-snake": ("tiny", _tiny_snake_alphas)}


def init_model(spec: str, out_dir: Path, seed: int = 0) -> Path:
    """Write ``builtin:<name>`` as a model dir in the real CosyVoice2-0.5B layout (atomically)."""
    name = builtin_name(spec, (*PRESETS, *VARIANTS))
    preset, hift_edit = VARIANTS.get(name, (name, None))
    cfg = PRESETS[preset]
    out_dir = Path(out_dir)

    def prepare(stage: str, net: nn.Module) -> None:
        prepare_builtin(stage, net)
        if stage == "hift" and hift_edit is not None:
            hift_edit(net)

    with builtin_dir(out_dir, CONFIG_FILE, _yaml_text(cfg), lambda stage: BUILDERS[stage](cfg), seed, prepare) as tmp:
        from .qwen2lm import qwen2_config

        write_qwen_config(tmp / QWEN_DIR, qwen2_config(cfg.llm).to_dict())
        write_frontend_standins(tmp, seed)
        write_builtin_marker(tmp, name, seed)
    return out_dir


def builtin_config(name: str) -> ModelConfig:
    """The config of a built-in name; variants share their preset's."""
    return PRESETS[VARIANTS.get(name, (name,))[0]]


LOADER = FamilyLoader(FAMILY, read_model_config, BUILDERS, builtin_config, init_model)
load_models, check_checkpoint, meta_network = LOADER.load_models, LOADER.check_checkpoint, LOADER.meta_network


def count_parameters(net: nn.Module, exclude_weight_norm_gain: bool = True) -> int:
    """Parameters of a network; weight-norm gains (g) are counted separately upstream."""
    return sum(p.numel() for n, p in net.named_parameters()
               if not (exclude_weight_norm_gain and n.endswith("original0")))


__all__ = ["BUILDERS", "MODEL_FILES", "check_checkpoint", "count_parameters", "init_model", "load_models",
           "meta_network", "model_files", "read_model_config"]
