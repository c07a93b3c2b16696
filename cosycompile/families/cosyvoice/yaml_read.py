"""Read and write upstream's ``cosyvoice.yaml`` (CosyVoice-300M) without constructing anything it names.

:func:`read_model_config` maps the inert data :mod:`cosycompile.families.hyperyaml` reads onto
:class:`~cosycompile.families.cosyvoice.config.CosyVoiceConfig`: a class of another generation, a
missing entry, a value of the wrong type or a switch this implementation does not have (a convolution
module, macaron layers, absolute positions) is a one-line :class:`ModelError` naming the file and the
key. :func:`yaml_text` writes a config in upstream's style for the built-in models, so that they go
through this same reader. This module never imports torch.
"""

from __future__ import annotations

from pathlib import Path

from cosycompile.errors import ModelError
from cosycompile.families.hyperyaml import (Section, cfm_head_yaml, cfm_sections, hift_fields, hift_yaml,
                                            read_cosyvoice_yaml, sampling_fields)

from . import CONFIG_FILE
from .config import CosyVoiceConfig, EncoderConfig, EstimatorConfig, FlowConfig, HiFTConfig, LMConfig

FAMILY = "CosyVoice-300M"


def _encoder(sec: Section, input_layer: str, activation: str | None = None) -> EncoderConfig:
    """An encoder section; the switches this implementation fixes must have upstream's 300M values."""
    sec.require("input_layer", input_layer)
    sec.require("pos_enc_layer_type", "rel_pos_espnet")
    sec.require("selfattention_layer_type", "rel_selfattn")
    sec.require("normalize_before", True)
    sec.require("use_cnn_module", False)
    sec.require("macaron_style", False)
    sec.require("use_dynamic_chunk", False)
    sec.require("key_bias", True)
    if activation is not None:
        sec.require("activation_type", activation)
    return EncoderConfig(input_size=sec.get("input_size", int), output_size=sec.get("output_size", int),
                         attention_heads=sec.get("attention_heads", int), linear_units=sec.get("linear_units", int),
                         num_blocks=sec.get("num_blocks", int), static_chunk_size=sec.get("static_chunk_size", int, 0)
                         if "static_chunk_size" in sec.data else 0)


def _lm(llm: Section) -> LMConfig:
    text = _encoder(llm.sub("text_encoder", "ConformerEncoder"), "linear", "swish")
    decoder = _encoder(llm.sub("llm", "TransformerEncoder"), "linear_legacy", "relu")
    if text.input_size != llm.get("text_encoder_input_size", int):
        llm.fail("text_encoder.input_size must equal text_encoder_input_size")
    if decoder.input_size != llm.get("llm_input_size", int) or decoder.output_size != llm.get("llm_output_size", int):
        llm.fail("llm.input_size / output_size must equal llm_input_size / llm_output_size")
    if decoder.input_size != decoder.output_size:
        llm.fail("the LM's input and output sizes must be equal (its speech embedding feeds it)")
    if decoder.output_size % decoder.attention_heads:
        llm.fail("llm.output_size must be a multiple of llm.attention_heads")
    sampling = sampling_fields(llm) or {}
    return LMConfig(text_token_size=llm.get("text_token_size", int), speech_token_size=llm.get("speech_token_size", int),
                    spk_embed_dim=llm.get("spk_embed_dim", int, 192), text_encoder=text, decoder=decoder,
                    **{k: sampling[k] for k in ("top_p", "top_k") if k in sampling})


def _flow(flow: Section) -> FlowConfig:
    encoder = _encoder(flow.sub("encoder", "ConformerEncoder"), "linear", "swish")
    if encoder.static_chunk_size:
        flow.fail("encoder.static_chunk_size must be 0 (the 300M flow encoder attends to every token)")
    if encoder.input_size != flow.get("input_size", int):
        flow.fail("encoder.input_size must equal flow.input_size")
    reg = flow.sub("length_regulator", "InterpolateRegulator")
    if reg.get("channels", int) != flow.get("output_size", int):
        reg.fail("channels must equal flow.output_size")
    cfm, params = cfm_sections(flow, "ConditionalCFM")
    est = cfm.sub("estimator", "ConditionalDecoder")
    est.require("act_fn", "gelu")
    out = flow.get("output_size", int)
    estimator = EstimatorConfig(in_channels=est.get("in_channels", int), out_channels=est.get("out_channels", int),
                                channels=est.ints("channels"), attention_head_dim=est.get("attention_head_dim", int),
                                n_blocks=est.get("n_blocks", int), num_mid_blocks=est.get("num_mid_blocks", int),
                                num_heads=est.get("num_heads", int))
    if estimator.out_channels != out or estimator.in_channels != 4 * out:
        est.fail(f"in_channels / out_channels must be 4 x / 1 x flow.output_size ({4 * out} / {out})")
    return FlowConfig(input_size=flow.get("input_size", int), output_size=out,
                      spk_embed_dim=flow.get("spk_embed_dim", int), vocab_size=flow.get("vocab_size", int),
                      input_frame_rate=flow.get("input_frame_rate", int, 50), encoder=encoder,
                      regulator_sampling_ratios=reg.ints("sampling_ratios"),
                      inference_cfg_rate=params.get("inference_cfg_rate", float, 0.7) if params else 0.7,
                      estimator=estimator)


def read_model_config(model_dir: Path) -> CosyVoiceConfig:
    """CosyVoiceConfig from ``cosyvoice.yaml``; nothing is constructed.

    Raises :class:`ModelError` naming the file (and the yaml key) for a missing model dir, a missing or
    unreadable file, a missing entry, a value of the wrong type, or an architecture that is not the
    first generation's (e.g. CosyVoice2's Qwen2 LM).
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelError(f"{model_dir}: model dir not found")
    path = model_dir / CONFIG_FILE
    top = Section(path, "", read_cosyvoice_yaml(path), family=FAMILY)
    lm = _lm(top.sub("llm", "TransformerLM"))
    flow_sec = top.sub("flow", "MaskedDiffWithXvec")
    flow = _flow(flow_sec)
    if flow.vocab_size != lm.speech_token_size:
        flow_sec.fail(f"'vocab_size' ({flow.vocab_size}) must equal llm.speech_token_size ({lm.speech_token_size})")
    hift_sec = top.sub("hift", "HiFTGenerator")
    fields, _ = hift_fields(hift_sec, "ConvRNNF0Predictor")
    hift = HiFTConfig(**fields)
    sample_rate = top.get("sample_rate", int, 22050)
    if hift.sampling_rate != sample_rate:
        hift_sec.fail(f"'sampling_rate' ({hift.sampling_rate}) must equal sample_rate ({sample_rate})")
    return CosyVoiceConfig(sample_rate=sample_rate, lm=lm, flow=flow, hift=hift)


def _encoder_yaml(cls: str, e: EncoderConfig, input_layer: str, indent: str) -> str:
    lines = [f"!new:cosyvoice.transformer.encoder.{cls}", f"input_size: {e.input_size}", f"output_size: {e.output_size}",
             f"attention_heads: {e.attention_heads}", f"linear_units: {e.linear_units}", f"num_blocks: {e.num_blocks}",
             "dropout_rate: 0.1", "positional_dropout_rate: 0.1", "attention_dropout_rate: 0.0",
             "normalize_before: True", f"input_layer: '{input_layer}'", "pos_enc_layer_type: 'rel_pos_espnet'",
             "selfattention_layer_type: 'rel_selfattn'"]
    if cls == "ConformerEncoder":
        lines += ["use_cnn_module: False", "macaron_style: False"]
    if e.static_chunk_size:
        lines.append(f"static_chunk_size: {e.static_chunk_size}")
    return lines[0] + "".join(f"\n{indent}{line}" for line in lines[1:]) + "\n"


def yaml_text(cfg: CosyVoiceConfig) -> str:
    """cosyvoice.yaml in upstream's hyperpyyaml style (tags included, never executed by us)."""
    lm, f, e = cfg.lm, cfg.flow, cfg.flow.estimator
    return f"""# CosyVoice-300M model config written by cosycompile (hyperpyyaml style, as upstream).
sample_rate: {cfg.sample_rate}
text_encoder_input_size: {lm.text_encoder_input_size}
llm_input_size: {lm.llm_input_size}
llm_output_size: {lm.decoder.output_size}
spk_embed_dim: {lm.spk_embed_dim}

llm: !new:cosyvoice.llm.llm.TransformerLM
    text_encoder_input_size: !ref <text_encoder_input_size>
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    text_token_size: {lm.text_token_size}
    speech_token_size: {lm.speech_token_size}
    length_normalized_loss: True
    lsm_weight: 0
    spk_embed_dim: !ref <spk_embed_dim>
    text_encoder: {_encoder_yaml("ConformerEncoder", lm.text_encoder, "linear", " " * 8)}\
    llm: {_encoder_yaml("TransformerEncoder", lm.decoder, "linear_legacy", " " * 8)}\
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: {lm.top_p}
        top_k: {lm.top_k}
        win_size: 10
        tau_r: 0.1

flow: !new:cosyvoice.flow.flow.MaskedDiffWithXvec
    input_size: {f.input_size}
    output_size: {f.output_size}
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {f.vocab_size}
    input_frame_rate: {f.input_frame_rate}
    only_mask_loss: True
    encoder: {_encoder_yaml("ConformerEncoder", f.encoder, "linear", " " * 8)}\
    length_regulator: !new:cosyvoice.flow.length_regulator.InterpolateRegulator
        channels: {f.output_size}
        sampling_ratios: {list(f.regulator_sampling_ratios)}
{cfm_head_yaml(f.output_size, f.inference_cfg_rate, "ConditionalCFM")}\
        estimator: !new:cosyvoice.flow.decoder.ConditionalDecoder
            in_channels: {e.in_channels}
            out_channels: {e.out_channels}
            channels: {list(e.channels)}
            dropout: 0.0
            attention_head_dim: {e.attention_head_dim}
            n_blocks: {e.n_blocks}
            num_mid_blocks: {e.num_mid_blocks}
            num_heads: {e.num_heads}
            act_fn: 'gelu'

""" + hift_yaml(cfg.hift, "HiFTGenerator", "ConvRNNF0Predictor") + """
get_tokenizer: !name:whisper.tokenizer.get_tokenizer
    multilingual: True
    num_languages: 100
    language: 'en'
    task: 'transcribe'
allowed_special: 'all'
"""
