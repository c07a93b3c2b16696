"""The one way CosyVoice-300M networks are built for a build: from a model dir in upstream's 300M layout.

``init_model`` writes the built-in models (``builtin:cv1-tiny``, ``builtin:cv1-random-300m``) in that
layout, so they go through exactly the same loading as a real checkpoint; ``load_models`` reads
``cosyvoice.yaml`` safely and loads each ``.pt`` with ``weights_only=True`` and strict keys and shapes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from cosycompile.families.checkpoints import (FamilyLoader, builtin_dir, builtin_name, init_weights, prepare_builtin,
                                              write_frontend_standins)
from .hift import HiFTGenerator
from cosycompile.families.model_dir import BUILTIN_MARKER

from . import CONFIG_FILE, SPEECH_TOKENIZER
from .config import CosyVoiceConfig, cv1_300m, cv1_tiny
from .speakers import write_builtin_speakers
from .flow import MaskedDiffWithXvec
from .lm import TransformerLM
from .yaml_read import read_model_config, yaml_text

MODEL_FILES = (CONFIG_FILE, "llm.pt", "flow.pt", "hift.pt")
# This family's registry name is its folder's, so a renamed copy of the folder loads as that new family.
FAMILY = __name__.rsplit(".", 2)[-2]
PRESETS: dict[str, CosyVoiceConfig] = {"cv1-tiny": cv1_tiny(), "cv1-random-300m": cv1_300m()}
# The built-ins ship speakers as the SFT model does (spk2info.pt), named as two of its seven.
BUILTIN_SPEAKERS = ("中文女", "英文男")

# Networks are built from the config with random weights; checkpoints are loaded into them.
BUILDERS: dict[str, Callable[[CosyVoiceConfig], nn.Module]] = {
    "llm": lambda cfg: TransformerLM(cfg.lm),
    "flow": lambda cfg: MaskedDiffWithXvec(cfg.flow),
    "hift": lambda cfg: HiFTGenerator(cfg.hift),
}


def _prepare(stage: str, net: nn.Module) -> None:
    """Random weights that keep every stage's output finite and non-degenerate."""
    prepare_builtin(stage, net)
    if stage == "llm":
        init_weights(net)
        # The head's last row is eos: a random one would stop a random LM on its first token, and a
        # check of zero tokens measures nothing. At logit 0 it loses to the best speech token's logit,
        # so the LM speaks to its length limit.
        with torch.no_grad():
            net.llm_decoder.weight[-1] = 0.0
            net.llm_decoder.bias[-1] = 0.0
    if stage == "flow":
        # The UNet's blocks and the length regulator normalize with GroupNorm, which the shared init
        # leaves at zero scale (it knows LayerNorm): zero would silence every block, the estimator's
        # velocity would be 0 and a check would compare noise with noise.
        with torch.no_grad():
            for m in net.modules():
                if isinstance(m, nn.GroupNorm):
                    m.weight.fill_(1.0)


def init_model(spec: str, out_dir: Path, seed: int = 0) -> Path:
    """Write ``builtin:<name>`` as a model dir in CosyVoice-300M's layout (atomically)."""
    name = builtin_name(spec, PRESETS)
    cfg = PRESETS[name]
    with builtin_dir(out_dir, CONFIG_FILE, yaml_text(cfg), lambda stage: BUILDERS[stage](cfg), seed, _prepare) as tmp:
        write_frontend_standins(tmp, seed, SPEECH_TOKENIZER, speech_tokens=cfg.lm.speech_token_size)
        write_builtin_speakers(tmp, BUILTIN_SPEAKERS, seed, cfg.lm.spk_embed_dim)
        # No Qwen2 config holds this family's text vocabulary: the front end's stand-in tokenizer reads it here.
        (tmp / BUILTIN_MARKER).write_text(json.dumps({"builtin": name, "seed": seed,
                                                      "text_vocab_size": cfg.lm.text_token_size}, indent=2))
    return Path(out_dir)


LOADER = FamilyLoader(FAMILY, read_model_config, BUILDERS, PRESETS.__getitem__, init_model)
load_models, check_checkpoint, meta_network = LOADER.load_models, LOADER.check_checkpoint, LOADER.meta_network

__all__ = ["BUILDERS", "MODEL_FILES", "PRESETS", "check_checkpoint", "init_model", "load_models",
           "meta_network", "read_model_config"]
