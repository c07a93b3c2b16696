"""Read a CosyVoice ``cosyvoice2.yaml`` without constructing anything it names.

The file is hyperpyyaml, whose tags import modules and call code while the file loads; it is read
by :mod:`cosycompile.families.hyperyaml`, which turns every tag into inert data and resolves only
``!ref`` references. Nothing is imported and nothing is called.

:func:`read_model_config` maps that data plus ``CosyVoice-BlankEN/config.json`` onto
:class:`~cosycompile.families.cosyvoice2.config.ModelConfig`. This module never imports torch.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cosycompile.errors import ModelError
from cosycompile.families.hyperyaml import (Section, Tagged, args, cfm_sections, check_llm_sizes, hift_fields, load_inert_yaml,
                                            qwen2_fields, read_cosyvoice_yaml, sampling_fields)
from cosycompile.families.qwen2_config import SamplingConfig
from cosycompile.families.qwen2_layout import QWEN_DIR

from . import CONFIG_FILE
from .config import FlowConfig, HiFTConfig, LLMConfig, ModelConfig

# The generic reader's names, as this module has always offered them.
__all__ = ["Tagged", "args", "load_inert_yaml", "read_cosyvoice_yaml", "read_model_config"]


def _flow_config(flow: Section) -> FlowConfig:
    enc = flow.sub("encoder", "UpsampleConformerEncoder")
    for key, allowed in (("input_layer", "linear"), ("pos_enc_layer_type", "rel_pos_espnet"),
                         ("selfattention_layer_type", "rel_selfattn"), ("use_cnn_module", False),
                         ("macaron_style", False), ("normalize_before", True)):
        enc.require(key, allowed)
    cfm, params = cfm_sections(flow, "CausalConditionalCFM")
    est = cfm.sub("estimator", "CausalConditionalDecoder")
    est.require("act_fn", "gelu")
    out_size = flow.get("output_size", int)
    if est.get("out_channels", int) != out_size:
        est.fail(f"out_channels must equal flow.output_size ({out_size})")
    return FlowConfig(
        input_size=flow.get("input_size", int), output_size=out_size,
        spk_embed_dim=flow.get("spk_embed_dim", int), vocab_size=flow.get("vocab_size", int),
        pre_lookahead_len=flow.get("pre_lookahead_len", int, 3),
        encoder_size=enc.get("output_size", int), attention_heads=enc.get("attention_heads", int),
        linear_units=enc.get("linear_units", int), num_blocks=enc.get("num_blocks", int),
        num_up_blocks=enc.get("num_up_blocks", int, 4),
        encoder_chunk_size=enc.get("static_chunk_size", int, 25),
        inference_cfg_rate=params.get("inference_cfg_rate", float, 0.7) if params else 0.7,
        estimator_in_channels=est.get("in_channels", int), channels=est.ints("channels"),
        attention_head_dim=est.get("attention_head_dim", int), n_blocks=est.get("n_blocks", int),
        num_mid_blocks=est.get("num_mid_blocks", int), num_heads=est.get("num_heads", int),
        static_chunk_size=est.get("static_chunk_size", int, 50),
    )


def _hift_config(hift: Section) -> HiFTConfig:
    return HiFTConfig(**hift_fields(hift, "ConvRNNF0Predictor")[0])


def _llm_config(path: Path) -> LLMConfig:
    return LLMConfig(**qwen2_fields(path))


def read_model_config(model_dir: Path) -> ModelConfig:
    """ModelConfig from ``cosyvoice2.yaml`` and ``CosyVoice-BlankEN/config.json``; nothing is constructed.

    Raises :class:`ModelError` naming the file (and the yaml key) for a missing model dir, a
    missing or unreadable file, a missing entry, a value of the wrong type, or an architecture
    that is not CosyVoice2's (e.g. CosyVoice3's DiT flow).
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelError(f"{model_dir}: model dir not found")
    path = model_dir / CONFIG_FILE
    top = Section(path, "", read_cosyvoice_yaml(path))
    llm = top.sub("llm", "Qwen2LM")
    flow = top.sub("flow", "CausalMaskedDiffWithXvec")
    hift = top.sub("hift", "HiFTGenerator")
    llm_cfg = _llm_config(model_dir / QWEN_DIR / "config.json")
    sampling = sampling_fields(llm)
    if sampling is not None:
        llm_cfg = replace(llm_cfg, sampling=SamplingConfig(**sampling))
    check_llm_sizes(llm, llm_cfg.hidden_size)
    return ModelConfig(
        llm=llm_cfg, flow=_flow_config(flow), hift=_hift_config(hift),
        sample_rate=top.get("sample_rate", int, 24000), token_frame_rate=top.get("token_frame_rate", int, 25),
        token_mel_ratio=top.get("token_mel_ratio", int, 2), speech_token_size=llm.get("speech_token_size", int),
        chunk_size=top.get("chunk_size", int, 25),
    )
