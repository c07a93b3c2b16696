"""The one way CosyVoice2 networks are built for a build: from a model dir in CosyVoice2-0.5B's layout.

``init_model`` writes the built-in models in that layout (so they go through exactly the same
loading as a real checkpoint); ``load_models`` reads the config safely and loads each ``.pt``
with ``weights_only=True`` and ``strict=True``.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch
from torch import nn

from cosycompile.errors import ModelError
from . import CONFIG_FILE, PLUGIN, QWEN_DIR
from .config import PRESETS, ModelConfig
from .yaml_safe import read_model_config

MODEL_FILES = (CONFIG_FILE, "llm.pt", "flow.pt", "hift.pt")
# This family's registry name is its folder's, so a renamed copy of the folder loads as that new family.
FAMILY = __name__.rsplit(".", 2)[-2]


@dataclass
class LoadedModels:
    """The networks of the requested stages (None for the others), eval mode, float32."""

    config: ModelConfig
    llm: Any = None
    flow: Any = None
    hift: Any = None
    model_dir: Path | None = None
    family: str = FAMILY  # the registry name of the family that loaded them (its runtimes run them)


def model_files(model_dir: Path, stages: Iterable[str]) -> list[Path]:
    """Files of the model dir that the given stages read (for content keys)."""
    return [model_dir / f for f in PLUGIN.model_files(stages)]


# -- networks ---------------------------------------------------------------------------------

def build_llm(cfg: ModelConfig) -> nn.Module:
    from .qwen2lm import Qwen2LM

    return Qwen2LM(cfg.llm, cfg.speech_token_size)


def build_flow(cfg: ModelConfig) -> nn.Module:
    from .flow import CausalMaskedDiffWithXvec

    return CausalMaskedDiffWithXvec(cfg.flow)


def build_hift(cfg: ModelConfig) -> nn.Module:
    from .hift import HiFTGenerator

    return HiFTGenerator(cfg.hift)


BUILDERS = {"llm": build_llm, "flow": build_flow, "hift": build_hift}


def _normalize_hift_keys(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip a ``generator.`` prefix and map old-style weight_g/weight_v to parametrization names."""
    out = {}
    for k, v in sd.items():
        if k.startswith("generator."):
            k = k[len("generator."):]
        if k.endswith(".weight_g"):
            k = k[: -len(".weight_g")] + ".parametrizations.weight.original0"
        elif k.endswith(".weight_v"):
            k = k[: -len(".weight_v")] + ".parametrizations.weight.original1"
        out[k] = v
    return out


def _load_state(path: Path, mmap: bool = False) -> Any:
    """A checkpoint's state dict (memory-mapped for cheap checks); unreadable files are ModelErrors."""
    if not path.is_file():
        raise ModelError(f"{path}: checkpoint is missing")
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # pickle/zip errors come in many types
        raise ModelError(f"{path}: not a readable PyTorch checkpoint ({exc.__class__.__name__})") from None
    return sd


def check_checkpoint(model_dir: Path, stage: str) -> None:
    """Cheap pre-flight check of one stage's checkpoint: readable, and keys/shapes match the network.

    The network is built on the meta device and the checkpoint memory-mapped, so this costs
    seconds even for the 0.5B LLM; a bad file is reported before any build step runs.
    """
    model_dir = Path(model_dir)
    cfg = read_model_config(model_dir)
    with torch.device("meta"):
        net = BUILDERS[stage](cfg)
    path = model_dir / f"{stage}.pt"
    sd = _load_state(path, mmap=True)
    _match(path, stage, net.state_dict(), _normalize_hift_keys(sd) if stage == "hift" else sd)


def _match(path: Path, stage: str, own: dict[str, torch.Tensor], sd: Any) -> None:
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ModelError(f"{path}: expected a state dict of tensors")
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
        raise ModelError(f"{path}: keys do not match the {stage} network: {'; '.join(parts)}")
    bad = [k for k in own if own[k].shape != sd[k].shape]
    if bad:
        k = bad[0]
        raise ModelError(f"{path}: shape mismatch for {len(bad)} tensors, e.g. {k}: checkpoint "
                         f"{tuple(sd[k].shape)} vs network {tuple(own[k].shape)}")


def load_models(model_dir: Path | str, stages: Iterable[str] = ("llm", "flow", "hift")) -> LoadedModels:
    """Networks of ``stages`` from a model dir, in eval mode, float32, strictly loaded.

    ``model_dir`` may also be a ``builtin:<name>`` spec: it is written to a temporary dir with
    :func:`init_model` first and loaded from there, exactly like a real checkpoint.
    """
    if isinstance(model_dir, str) and model_dir.startswith("builtin:"):
        import tempfile

        with tempfile.TemporaryDirectory(prefix="cosycompile-builtin-") as tmp:
            loaded = load_models(init_model(model_dir, Path(tmp) / "model"), stages)
        loaded.model_dir = None
        return loaded
    model_dir = Path(model_dir)
    stages = tuple(stages)
    unknown = [s for s in stages if s not in BUILDERS]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; expected some of {sorted(BUILDERS)}")
    cfg = read_model_config(model_dir)
    out = LoadedModels(cfg, model_dir=model_dir)
    for stage in stages:
        net = BUILDERS[stage](cfg)
        path = model_dir / f"{stage}.pt"
        sd = _load_state(path)
        if stage == "hift":
            sd = _normalize_hift_keys(sd)
        _match(path, stage, net.state_dict(), sd)
        net.load_state_dict(sd, strict=True)
        setattr(out, stage, net.float().eval())
    return out


# -- built-in models ---------------------------------------------------------------------------

def _yaml_text(cfg: ModelConfig) -> str:
    """cosyvoice2.yaml in upstream's hyperpyyaml style (tags included, never executed by us)."""
    f, h = cfg.flow, cfg.hift
    return f"""# CosyVoice2 model config written by cosycompile (hyperpyyaml style, as upstream).
sample_rate: {cfg.sample_rate}
llm_input_size: {cfg.llm.hidden_size}
llm_output_size: {cfg.llm.hidden_size}
spk_embed_dim: {f.spk_embed_dim}
qwen_pretrain_path: ''
token_frame_rate: {cfg.token_frame_rate}
token_mel_ratio: {cfg.token_mel_ratio}
chunk_size: {cfg.chunk_size}
num_decoding_left_chunks: -1

llm: !new:cosyvoice.llm.llm.Qwen2LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: {cfg.speech_token_size}
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
    input_size: {f.input_size}
    output_size: {f.output_size}
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {f.vocab_size}
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: {f.pre_lookahead_len}
    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
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
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: {f.output_size}
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: {f.inference_cfg_rate}
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
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

hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
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
    resblock_dilation_sizes: {[list(d) for d in h.resblock_dilation_sizes]}
    source_resblock_kernel_sizes: {list(h.source_resblock_kernel_sizes)}
    source_resblock_dilation_sizes: {[list(d) for d in h.source_resblock_dilation_sizes]}
    lrelu_slope: {h.lrelu_slope}
    audio_limit: {h.audio_limit}
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor
        num_class: 1
        in_channels: {h.in_channels}
        cond_channels: {h.f0_cond_channels}
"""


def _init_weights(net: nn.Module, std: float = 0.02) -> None:
    """Small, well-scaled random weights: finite, non-degenerate outputs from every stage."""
    for name, p in net.named_parameters():
        if "original0" in name:  # weight-norm gains keep the norm of the layer's default init
            continue
        if name.endswith("alpha"):
            nn.init.ones_(p)
        elif p.ndim == 1:
            nn.init.zeros_(p)
        else:
            nn.init.normal_(p, 0.0, std)
    for m in net.modules():  # normalisation layers: identity scale, whatever their attribute name
        if isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


@torch.no_grad()
def _voice_f0_predictor(hift: nn.Module, mean_hz: float = 150.0, spread_hz: float = 25.0) -> None:
    """Centre the random F0 predictor on a speaking pitch.

    With small random weights it predicts ~0 Hz, below the 10 Hz voicing threshold, so the NSF
    sine source (the part of HiFT most sensitive to numerics) would be silent in every test.
    The classifier is rescaled on a probe mel so F0 ~ mean_hz +- spread_hz and follows the input.
    """
    probe = torch.randn(1, hift.cfg.in_channels, 200) * 1.5 - 5.0
    h = hift.f0_predictor.condnet(probe).transpose(1, 2)
    cls = hift.f0_predictor.classifier
    proj = h @ cls.weight[0]
    scale = spread_hz / max(float(proj.std()), 1e-6)
    cls.weight.mul_(scale)
    cls.bias.fill_(mean_hz - float(proj.mean()) * scale)


def _write_frontend_standins(out: Path, seed: int) -> None:
    """Tiny ONNX models with the real campplus / speech tokenizer I/O signatures."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    # campplus: input [1, T, 80] -> RMS over time -> affine to 192. (The front end subtracts the
    # time mean from the fbank first, so a mean pooling would give the same vector for everyone.)
    w = numpy_helper.from_array(rng.standard_normal((80, 192)).astype(np.float32) * 0.1, "w")
    b = numpy_helper.from_array(rng.standard_normal(192).astype(np.float32), "b")
    g = helper.make_graph(
        [helper.make_node("Mul", ["input", "input"], ["sq"]),
         helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[1], keepdims=0),
         helper.make_node("Sqrt", ["ms"], ["rms"]),
         helper.make_node("MatMul", ["rms", "w"], ["proj"]),
         helper.make_node("Add", ["proj", "b"], ["embedding"])],
        "campplus_standin",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "T", 80])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, 192])], [w, b])
    _save_standin(g, out / "campplus.onnx")
    # speech tokenizer: feats [1,128,T] -> 4-frame average pooling -> projection -> argmax ids (25 Hz).
    proj = numpy_helper.from_array(rng.standard_normal((128, 6561)).astype(np.float32), "proj")
    g = helper.make_graph(
        [helper.make_node("Unsqueeze", ["feats", "ax"], ["f4"]),
         helper.make_node("AveragePool", ["f4"], ["p4"], kernel_shape=[1, 4], strides=[1, 4], ceil_mode=1),
         helper.make_node("Squeeze", ["p4", "ax"], ["p"]),
         helper.make_node("Transpose", ["p"], ["pt"], perm=[0, 2, 1]),
         helper.make_node("MatMul", ["pt", "proj"], ["logits"]),
         helper.make_node("ArgMax", ["logits"], ["ids64"], axis=2, keepdims=0),
         helper.make_node("Cast", ["ids64"], ["tokens"], to=TensorProto.INT32),
         helper.make_node("Identity", ["feats_length"], ["unused_len"])],
        "speech_tokenizer_standin",
        [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "T"]),
         helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1])],
        [helper.make_tensor_value_info("tokens", TensorProto.INT32, [1, "N"]),
         helper.make_tensor_value_info("unused_len", TensorProto.INT32, [1])],
        [proj, numpy_helper.from_array(np.array([2], np.int64), "ax")])
    _save_standin(g, out / "speech_tokenizer_v2.onnx")


def _save_standin(graph: Any, path: Path) -> None:
    """Save a stand-in graph at opset 17 with the oldest IR version that holds it. ``make_model`` stamps
    the IR version of the onnx package that writes it, and a model dir written with a newer onnx than a
    server's ONNX Runtime then fails to load there (seen on a GPU image: IR 14 written, 13 readable)."""
    import onnx
    from onnx import helper

    opsets = [helper.make_opsetid("", 17)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))
    onnx.save(model, path)


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
    name = spec.split(":", 1)[1] if spec.startswith("builtin:") else spec
    if name not in PRESETS and name not in VARIANTS:
        known = ", ".join("builtin:" + p for p in (*PRESETS, *VARIANTS))
        raise ModelError(f"unknown built-in model '{spec}' (known: {known})")
    preset, hift_edit = VARIANTS.get(name, (name, None))
    cfg = PRESETS[preset]
    out_dir = Path(out_dir)
    tmp = out_dir.parent / f".{out_dir.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
    tmp.mkdir(parents=True)
    try:
        (tmp / CONFIG_FILE).write_text(_yaml_text(cfg))
        qdir = tmp / QWEN_DIR
        qdir.mkdir()
        from .qwen2lm import qwen2_config

        qcfg = qwen2_config(cfg.llm).to_dict()
        (qdir / "config.json").write_text(json.dumps(qcfg, indent=2, sort_keys=True, default=str))
        (qdir / "generation_config.json").write_text(json.dumps({"do_sample": False}, indent=2))
        for i, stage in enumerate(("llm", "flow", "hift")):
            with torch.random.fork_rng():  # seeded weights without touching the caller's RNG
                torch.manual_seed(seed * 1000 + i)
                net = BUILDERS[stage](cfg)
                if stage == "flow":
                    _init_weights(net)
                if stage == "hift":
                    # PyTorch's default init, as a fresh upstream HiFT has (its normal(0, 0.01) init never
                    # reaches the weight-normed convs): small weights would silence the source path.
                    _voice_f0_predictor(net)
                    if hift_edit is not None:
                        hift_edit(net)
            torch.save(net.state_dict(), tmp / f"{stage}.pt")
            del net
        _write_frontend_standins(tmp, seed)
        (tmp / "builtin.json").write_text(json.dumps({"builtin": name, "seed": seed}, indent=2))
        if out_dir.exists():
            if any(out_dir.iterdir()):
                raise ModelError(f"{out_dir}: exists and is not empty")
            out_dir.rmdir()
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def count_parameters(net: nn.Module, exclude_weight_norm_gain: bool = True) -> int:
    """Parameters of a network; weight-norm gains (g) are counted separately upstream."""
    return sum(p.numel() for n, p in net.named_parameters()
               if not (exclude_weight_norm_gain and n.endswith("original0")))


__all__ = ["LoadedModels", "MODEL_FILES", "count_parameters", "init_model", "load_models", "model_files",
           "read_model_config"]
