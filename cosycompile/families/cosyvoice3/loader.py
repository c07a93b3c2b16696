"""The one way CosyVoice3 networks are built for a build: from a model dir in Fun-CosyVoice3-0.5B's layout.

``init_model`` writes the built-in models (``builtin:cv3-tiny``, ``builtin:cv3-random-0.5b``) in that
layout, so they go through exactly the same loading as a real checkpoint; ``load_models`` reads
``cosyvoice3.yaml`` safely and loads each ``.pt`` with ``weights_only=True`` and strict keys and shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from torch import nn

from cosycompile.errors import ModelError
from cosycompile.families.checkpoints import (check_strict, init_weights, load_builtin, load_strict, normalize_hift_keys,
                                              staged_dir, voice_f0_predictor, write_builtin_marker,
                                              write_frontend_standins, write_qwen_config, write_seeded_checkpoints)
from . import CONFIG_FILE, QWEN_DIR, SPEECH_TOKENIZER
from .config import CosyVoice3Config, cv3_0_5b, cv3_tiny
from .yaml_read import read_model_config

MODEL_FILES = (CONFIG_FILE, "llm.pt", "flow.pt", "hift.pt")
# This family's registry name is its folder's, so a renamed copy of the folder loads as that new family.
FAMILY = __name__.rsplit(".", 2)[-2]
PRESETS: dict[str, CosyVoice3Config] = {"cv3-tiny": cv3_tiny(), "cv3-random-0.5b": cv3_0_5b()}


@dataclass
class LoadedModels:
    """The networks of the requested stages (None for the others), eval mode, float32."""

    config: CosyVoice3Config
    llm: Any = None
    flow: Any = None
    hift: Any = None
    model_dir: Path | None = None
    family: str = FAMILY  # the registry name of the family that loaded them (its runtimes run them)


def build_llm(cfg: CosyVoice3Config) -> nn.Module:
    """CosyVoice3LM of ``cfg`` (random weights)."""
    from .lm import CosyVoice3LM

    return CosyVoice3LM(cfg.lm)


def build_flow(cfg: CosyVoice3Config) -> nn.Module:
    """CausalMaskedDiffWithDiT of ``cfg`` (random weights)."""
    from .flow import CausalMaskedDiffWithDiT

    return CausalMaskedDiffWithDiT(cfg.flow)


def build_hift(cfg: CosyVoice3Config) -> nn.Module:
    """CausalHiFTGenerator of ``cfg`` (random weights)."""
    from .hift import CausalHiFTGenerator

    return CausalHiFTGenerator(cfg.hift)


BUILDERS = {"llm": build_llm, "flow": build_flow, "hift": build_hift}
# Upstream strips ``generator.`` from hift.pt's keys before loading it (a GAN checkpoint's prefix).
NORMALIZE = {"hift": normalize_hift_keys}


def check_checkpoint(model_dir: Path, stage: str) -> None:
    """Cheap pre-flight check of one stage's checkpoint: readable, keys and shapes those of the network
    (built on the meta device, the file memory-mapped)."""
    model_dir = Path(model_dir)
    cfg = read_model_config(model_dir)
    check_strict(model_dir / f"{stage}.pt", stage, lambda: BUILDERS[stage](cfg), NORMALIZE.get(stage))


def load_models(model_dir: Path | str, stages: Iterable[str] = ("llm", "flow", "hift")) -> LoadedModels:
    """Networks of ``stages`` from a model dir, in eval mode, float32, strictly loaded.

    ``model_dir`` may also be a ``builtin:<name>`` spec: it is written to a temporary dir with
    :func:`init_model` first and loaded from there, exactly like a real checkpoint. A missing, extra
    or mis-shaped key is a one-line :class:`ModelError` naming the file and the key.
    """
    if isinstance(model_dir, str) and model_dir.startswith("builtin:"):
        return load_builtin(model_dir, init_model, load_models, tuple(stages))
    model_dir = Path(model_dir)
    stages = tuple(stages)
    unknown = [s for s in stages if s not in BUILDERS]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; expected some of {sorted(BUILDERS)}")
    cfg = read_model_config(model_dir)
    out = LoadedModels(cfg, model_dir=model_dir)
    for stage in stages:
        setattr(out, stage, load_strict(model_dir / f"{stage}.pt", stage, BUILDERS[stage](cfg), NORMALIZE.get(stage)))
    return out


# -- built-in models ---------------------------------------------------------------------------

def _yaml_text(cfg: CosyVoice3Config) -> str:
    """cosyvoice3.yaml in upstream's hyperpyyaml style (tags included, never executed by us)."""
    f, d, h, lm = cfg.flow, cfg.flow.estimator, cfg.hift, cfg.lm
    ratio = f.token_mel_ratio
    # Upstream spells the DiT's chunk as chunk_size (tokens) * token_mel_ratio.
    chunk = d.static_chunk_size // ratio if d.static_chunk_size % ratio == 0 else None
    static_chunk = "!ref <chunk_size> * <token_mel_ratio>" if chunk is not None else str(d.static_chunk_size)
    return f"""# CosyVoice3 model config written by cosycompile (hyperpyyaml style, as upstream's).
__set_seed1: !apply:random.seed [1986]
sample_rate: {cfg.sample_rate}
llm_input_size: {lm.hidden_size}
llm_output_size: {lm.hidden_size}
spk_embed_dim: {f.spk_embed_dim}
qwen_pretrain_path: ''
token_frame_rate: {cfg.token_frame_rate}
token_mel_ratio: {ratio}
chunk_size: {chunk if chunk is not None else 25}
num_decoding_left_chunks: {d.num_decoding_left_chunks}

llm: !new:cosyvoice.llm.llm.CosyVoice3LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: {lm.speech_token_size}
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: {lm.sampling.top_p}
        top_k: {lm.sampling.top_k}
        win_size: {lm.sampling.win_size}
        tau_r: {lm.sampling.tau_r}

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: {f.input_size}
    output_size: {f.output_size}
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {f.vocab_size}
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: {f.pre_lookahead_len}
    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: {f.input_size}
        channels: {f.pre_lookahead_channels}
        pre_lookahead_len: {f.pre_lookahead_len}
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: {f.output_size}
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: {f.sigma_min:g}
                solver: 'euler'
                t_scheduler: '{f.t_scheduler}'
                training_cfg_rate: 0.2
                inference_cfg_rate: {f.inference_cfg_rate}
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.DiT.dit.DiT
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

hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator
    in_channels: {h.in_channels}
    base_channels: {h.base_channels}
    nb_harmonics: {h.nb_harmonics}
    sampling_rate: !ref <sample_rate>
    nsf_alpha: {h.nsf_alpha}
    nsf_sigma: {h.nsf_sigma}
    nsf_voiced_threshold: {h.nsf_voiced_threshold:g}
    upsample_rates: {list(h.upsample_rates)}
    upsample_kernel_sizes: {list(h.upsample_kernel_sizes)}
    istft_params:
        n_fft: {h.istft_n_fft}
        hop_len: {h.istft_hop_len}
    resblock_kernel_sizes: {list(h.resblock_kernel_sizes)}
    resblock_dilation_sizes: {[list(x) for x in h.resblock_dilation_sizes]}
    source_resblock_kernel_sizes: {list(h.source_resblock_kernel_sizes)}
    source_resblock_dilation_sizes: {[list(x) for x in h.source_resblock_dilation_sizes]}
    lrelu_slope: {h.lrelu_slope}
    audio_limit: {h.audio_limit}
    conv_pre_look_right: {h.conv_pre_look_right}
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor
        num_class: {h.f0_num_class}
        in_channels: {h.in_channels}
        cond_channels: {h.f0_cond_channels}
"""


def _prepare(stage: str, net: nn.Module) -> None:
    """Random weights that keep every stage's output finite and non-degenerate."""
    if stage == "flow":
        init_weights(net)
    if stage == "hift":
        # PyTorch's default init, as a fresh upstream HiFT has; the F0 predictor is centred on a speaking
        # pitch so that the NSF source is not silent.
        voice_f0_predictor(net)


def init_model(spec: str, out_dir: Path, seed: int = 0) -> Path:
    """Write ``builtin:<name>`` as a model dir in Fun-CosyVoice3-0.5B's layout (atomically)."""
    name = spec.split(":", 1)[1] if spec.startswith("builtin:") else spec
    if name not in PRESETS:
        raise ModelError(f"unknown built-in model '{spec}' (known: {', '.join('builtin:' + p for p in PRESETS)})")
    cfg = PRESETS[name]
    with staged_dir(Path(out_dir)) as tmp:
        (tmp / CONFIG_FILE).write_text(_yaml_text(cfg))
        from .lm import qwen2_config

        write_qwen_config(tmp / QWEN_DIR, qwen2_config(cfg.lm).to_dict())
        write_seeded_checkpoints(tmp, lambda stage: BUILDERS[stage](cfg), seed, _prepare)
        write_frontend_standins(tmp, seed, SPEECH_TOKENIZER, speech_tokens=cfg.lm.speech_token_size)
        write_builtin_marker(tmp, name, seed)
    return Path(out_dir)


__all__ = ["BUILDERS", "LoadedModels", "MODEL_FILES", "PRESETS", "check_checkpoint", "init_model", "load_models",
           "read_model_config"]
