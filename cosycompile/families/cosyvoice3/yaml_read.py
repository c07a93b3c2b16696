"""Read upstream's ``cosyvoice3.yaml`` without constructing anything it names.

The file is hyperpyyaml (``!new:cosyvoice.flow.DiT.dit.DiT``, ``!name:...ras_sampling``, even
``!apply:torch.manual_seed``); :mod:`cosycompile.families.hyperyaml` reads it as inert data and
resolves only ``!ref`` references, so nothing is imported and nothing is called.

:func:`read_model_config` maps that data plus ``CosyVoice-BlankEN/config.json`` onto
:class:`~cosycompile.families.cosyvoice3.config.CosyVoice3Config`. A class of another generation, a
missing entry, a value of the wrong type or a switch this implementation does not have is a
one-line :class:`ModelError` naming the file and the key. This module never imports torch.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cosycompile.errors import ModelError
from cosycompile.families.hyperyaml import (Section, cfm_sections, check_llm_sizes, hift_fields, qwen2_fields,
                                            read_cosyvoice_yaml, sampling_fields)
from cosycompile.families.qwen2_config import SamplingConfig
from cosycompile.families.qwen2_layout import QWEN_DIR

from . import CONFIG_FILE
from .config import CosyVoice3Config, DiTConfig, FlowConfig, HiFTConfig, LMConfig

FAMILY = "CosyVoice3"


def _dit_config(est: Section, flow: Section) -> DiTConfig:
    """The estimator's shapes; its mel, token-feature and speaker widths must be the flow's."""
    # The export-friendly chunk mask keeps every left chunk, which is what -1 means upstream.
    est.require("num_decoding_left_chunks", -1)
    cfg = DiTConfig(
        dim=est.get("dim", int), depth=est.get("depth", int), heads=est.get("heads", int),
        dim_head=est.get("dim_head", int), ff_mult=est.get("ff_mult", int, 4),
        mel_dim=est.get("mel_dim", int), mu_dim=est.get("mu_dim", int, est.get("mel_dim", int)),
        spk_dim=est.get("spk_dim", int),  # upstream: no speaker input without it
        out_channels=est.get("out_channels", int, est.get("mel_dim", int)),
        static_chunk_size=est.get("static_chunk_size", int, 50),
        num_decoding_left_chunks=est.get("num_decoding_left_chunks", int, -1),
        long_skip_connection=est.get("long_skip_connection", bool, False),
    )
    out_size, in_size = flow.get("output_size", int), flow.get("input_size", int)
    for key, value, want, what in (("mel_dim", cfg.mel_dim, out_size, "flow.output_size"),
                                   ("out_channels", cfg.out_channels, out_size, "flow.output_size"),
                                   ("mu_dim", cfg.mu_dim, in_size, "flow.input_size"),
                                   ("spk_dim", cfg.spk_dim, out_size, "flow.output_size")):
        if value != want:
            est.fail(f"'{key}' ({value}) must equal {what} ({want})")
    return cfg


def _flow_config(flow: Section, token_mel_ratio: int) -> FlowConfig:
    look = flow.sub("pre_lookahead_layer", "PreLookaheadLayer")
    lookahead = flow.get("pre_lookahead_len", int, 3)
    if look.get("in_channels", int) != flow.get("input_size", int):
        look.fail(f"'in_channels' ({look.data['in_channels']}) must equal flow.input_size")
    if look.get("pre_lookahead_len", int, lookahead) != lookahead:
        look.fail(f"'pre_lookahead_len' must equal flow.pre_lookahead_len ({lookahead})")
    cfm, params = cfm_sections(flow, "CausalConditionalCFM")
    if flow.get("token_mel_ratio", int, token_mel_ratio) != token_mel_ratio:
        flow.fail(f"'token_mel_ratio' must equal the top-level token_mel_ratio ({token_mel_ratio})")
    return FlowConfig(
        input_size=flow.get("input_size", int), output_size=flow.get("output_size", int),
        spk_embed_dim=flow.get("spk_embed_dim", int), vocab_size=flow.get("vocab_size", int),
        token_mel_ratio=token_mel_ratio, pre_lookahead_len=lookahead,
        pre_lookahead_channels=look.get("channels", int),
        sigma_min=params.get("sigma_min", float, 1e-6) if params else 1e-6,
        t_scheduler=params.get("t_scheduler", str, "cosine") if params else "cosine",
        inference_cfg_rate=params.get("inference_cfg_rate", float, 0.7) if params else 0.7,
        estimator=_dit_config(cfm.sub("estimator", "DiT"), flow),
    )


def _hift_config(hift: Section) -> HiFTConfig:
    fields, _ = hift_fields(hift, "CausalConvRNNF0Predictor")
    return HiFTConfig(**fields, conv_pre_look_right=hift.get("conv_pre_look_right", int, 4))


def read_model_config(model_dir: Path) -> CosyVoice3Config:
    """CosyVoice3Config from ``cosyvoice3.yaml`` and ``CosyVoice-BlankEN/config.json``; nothing is constructed.

    Raises :class:`ModelError` naming the file (and the yaml key) for a missing model dir, a
    missing or unreadable file, a missing entry, a value of the wrong type, or an architecture
    that is not CosyVoice3's (e.g. CosyVoice2's conformer + UNet flow).
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelError(f"{model_dir}: model dir not found")
    path = model_dir / CONFIG_FILE
    top = Section(path, "", read_cosyvoice_yaml(path), family=FAMILY)
    llm = top.sub("llm", "CosyVoice3LM")
    flow = top.sub("flow", "CausalMaskedDiffWithDiT")
    hift = top.sub("hift", "CausalHiFTGenerator")
    lm_cfg = LMConfig(**qwen2_fields(model_dir / QWEN_DIR / "config.json", FAMILY),
                      speech_token_size=llm.get("speech_token_size", int))
    sampling = sampling_fields(llm)
    if sampling is not None:
        lm_cfg = replace(lm_cfg, sampling=SamplingConfig(**sampling))
    check_llm_sizes(llm, lm_cfg.hidden_size)
    flow_cfg = _flow_config(flow, top.get("token_mel_ratio", int, 2))
    if flow_cfg.vocab_size != lm_cfg.speech_token_size:
        flow.fail(f"'vocab_size' ({flow_cfg.vocab_size}) must equal llm.speech_token_size ({lm_cfg.speech_token_size})")
    hift_cfg = _hift_config(hift)
    sample_rate = top.get("sample_rate", int, 24000)
    if hift_cfg.sampling_rate != sample_rate:
        hift.fail(f"'sampling_rate' ({hift_cfg.sampling_rate}) must equal sample_rate ({sample_rate})")
    return CosyVoice3Config(sample_rate=sample_rate, token_frame_rate=top.get("token_frame_rate", int, 25),
                            lm=lm_cfg, flow=flow_cfg, hift=hift_cfg)
