"""The one way CosyVoice3 networks are built for a build: from a model dir in Fun-CosyVoice3-0.5B's layout.

``init_model`` writes the built-in models (``builtin:cv3-tiny``, ``builtin:cv3-random-0.5b``) in that
layout, so they go through exactly the same loading as a real checkpoint; ``load_models`` reads
``cosyvoice3.yaml`` safely and loads each ``.pt`` with ``weights_only=True`` and strict keys and shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from torch import nn

from cosycompile.families.checkpoints import (FamilyLoader, builtin_dir, builtin_name, prepare_builtin, write_builtin_marker,
                                              write_frontend_standins, write_qwen_config)
from cosycompile.families.qwen2_layout import QWEN_DIR

from . import CONFIG_FILE, SPEECH_TOKENIZER
from .config import CosyVoice3Config, cv3_0_5b, cv3_tiny
from .flow import CausalMaskedDiffWithDiT
from .hift import CausalHiFTGenerator
from .lm import CosyVoice3LM
from cosycompile.families.hyperyaml import cfm_head_yaml, flow_head_yaml, header_yaml, hift_yaml, llm_yaml
from .yaml_read import read_model_config

MODEL_FILES = (CONFIG_FILE, "llm.pt", "flow.pt", "hift.pt")
# This family's registry name is its folder's, so a renamed copy of the folder loads as that new family.
FAMILY = __name__.rsplit(".", 2)[-2]
PRESETS: dict[str, CosyVoice3Config] = {"cv3-tiny": cv3_tiny(), "cv3-random-0.5b": cv3_0_5b()}


# Networks are built from the config with random weights; checkpoints are loaded into them.
BUILDERS: dict[str, Callable[[CosyVoice3Config], nn.Module]] = {
    "llm": lambda cfg: CosyVoice3LM(cfg.lm),
    "flow": lambda cfg: CausalMaskedDiffWithDiT(cfg.flow),
    "hift": lambda cfg: CausalHiFTGenerator(cfg.hift),
}


# -- built-in models ---------------------------------------------------------------------------

def _yaml_text(cfg: CosyVoice3Config) -> str:
    """cosyvoice3.yaml in upstream's hyperpyyaml style (tags included, never executed by us)."""
    f, d, lm = cfg.flow, cfg.flow.estimator, cfg.lm
    ratio = f.token_mel_ratio
    # Upstream spells the DiT's chunk as chunk_size (tokens) * token_mel_ratio.
    chunk = d.static_chunk_size // ratio if d.static_chunk_size % ratio == 0 else None
    static_chunk = "!ref <chunk_size> * <token_mel_ratio>" if chunk is not None else str(d.static_chunk_size)
    s = lm.sampling
    return "\n".join([
        header_yaml("CosyVoice3", cfg.sample_rate, lm.hidden_size, f.spk_embed_dim, cfg.token_frame_rate, ratio,
                    chunk if chunk is not None else 25, d.num_decoding_left_chunks),
        llm_yaml("CosyVoice3LM", lm.speech_token_size, s.top_p, s.top_k, s.win_size, s.tau_r),
        flow_head_yaml("CausalMaskedDiffWithDiT", f.input_size, f.output_size, f.vocab_size, f.pre_lookahead_len)
        + f"""    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: {f.input_size}
        channels: {f.pre_lookahead_channels}
        pre_lookahead_len: {f.pre_lookahead_len}
""" + cfm_head_yaml(f.output_size, f.inference_cfg_rate) + f"""        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: {d.dim}
            depth: {d.depth}
            heads: {d.heads}
            dim_head: {d.dim_head}
            ff_mult: {d.ff_mult}
            mel_dim: {d.mel_dim}
            mu_dim: {d.mu_dim}
            spk_dim: {d.spk_dim}
            out_channels: {d.out_channels}
            static_chunk_size: {static_chunk}
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>
""",
        hift_yaml(cfg.hift, "CausalHiFTGenerator", "CausalConvRNNF0Predictor",
                  f"    conv_pre_look_right: {cfg.hift.conv_pre_look_right}\n"),
    ])


def _prepare(stage: str, net: nn.Module) -> None:
    """Random weights that keep every stage's output finite and non-degenerate."""
    prepare_builtin(stage, net)
    if stage == "llm":
        # 200 of the head's rows stop decoding (all of them past the speech tokens): random rows would
        # stop a random LM on its first token, and a check of zero tokens measures nothing. At logit 0
        # they lose to the best of the speech tokens' random logits, so the LM speaks to its length limit.
        import torch

        with torch.no_grad():
            net.llm_decoder.weight[net.speech_token_size:] = 0.0


def init_model(spec: str, out_dir: Path, seed: int = 0) -> Path:
    """Write ``builtin:<name>`` as a model dir in Fun-CosyVoice3-0.5B's layout (atomically)."""
    name = builtin_name(spec, PRESETS)
    cfg = PRESETS[name]
    with builtin_dir(out_dir, CONFIG_FILE, _yaml_text(cfg), lambda stage: BUILDERS[stage](cfg), seed, _prepare) as tmp:
        from .lm import qwen2_config

        write_qwen_config(tmp / QWEN_DIR, qwen2_config(cfg.lm).to_dict())
        write_frontend_standins(tmp, seed, SPEECH_TOKENIZER, speech_tokens=cfg.lm.speech_token_size)
        write_builtin_marker(tmp, name, seed)
    return Path(out_dir)


LOADER = FamilyLoader(FAMILY, read_model_config, BUILDERS, PRESETS.__getitem__, init_model)
load_models, check_checkpoint, meta_network = LOADER.load_models, LOADER.check_checkpoint, LOADER.meta_network

__all__ = ["BUILDERS", "MODEL_FILES", "PRESETS", "check_checkpoint", "init_model", "load_models",
           "meta_network", "read_model_config"]
