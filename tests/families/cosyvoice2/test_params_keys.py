"""Exact parameter counts and state-dict key names of the real CosyVoice2-0.5B architecture.

The networks are built on the meta device: shapes and names without allocating 2.5 GB.
Expected key names are derived from upstream's module attribute names (llm.py, flow.py,
upsample_encoder.py, decoder.py + Matcha-TTS blocks, generator.py, f0_predictor.py).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cosycompile.families.cosyvoice2.config import PRESETS
from cosycompile.families.cosyvoice2.loader import BUILDERS


def _meta(stage: str, preset: str = "random-0.5b") -> nn.Module:
    with torch.device("meta"):
        return BUILDERS[stage](PRESETS[preset])


def _count(net: nn.Module, prefix: str = "") -> int:
    return sum(p.numel() for n, p in net.named_parameters() if n.startswith(prefix))


@pytest.fixture(scope="module")
def real_nets() -> dict[str, nn.Module]:
    return {s: _meta(s) for s in ("llm", "flow", "hift")}


def test_llm_parameter_count(real_nets: dict[str, nn.Module]) -> None:
    llm = real_nets["llm"]
    assert _count(llm) == 505_803_812
    # The Qwen2 body alone (tied lm_head counted once) is Qwen2-0.5B's size.
    assert _count(llm, "llm.") == 494_032_768
    assert llm.llm.model.lm_head.weight is llm.llm.model.model.embed_tokens.weight


def test_flow_parameter_counts(real_nets: dict[str, nn.Module]) -> None:
    flow = real_nets["flow"]
    assert _count(flow) == 112_549_360
    assert _count(flow, "encoder.") == 37_831_168
    assert _count(flow, "decoder.estimator.") == 71_302_480
    assert _count(flow.encoder.encoders[0]) == 3_415_552
    assert _count(flow.decoder.estimator.mid_blocks[0][1][0]) == 1_051_136


def test_hift_parameter_count_excluding_weight_norm_gains(real_nets: dict[str, nn.Module]) -> None:
    hift = real_nets["hift"]
    gains = sum(p.numel() for n, p in hift.named_parameters() if n.endswith("parametrizations.weight.original0"))
    assert gains == 14_738
    assert _count(hift) - gains == 20_806_557
    assert len(hift.state_dict()) == 328


LLM_KEYS = {
    "llm.model.model.embed_tokens.weight": (151936, 896),
    "llm.model.model.layers.0.self_attn.q_proj.weight": (896, 896),
    "llm.model.model.layers.0.self_attn.q_proj.bias": (896,),
    "llm.model.model.layers.0.self_attn.k_proj.weight": (128, 896),
    "llm.model.model.layers.0.self_attn.k_proj.bias": (128,),
    "llm.model.model.layers.0.self_attn.v_proj.bias": (128,),
    "llm.model.model.layers.0.self_attn.o_proj.weight": (896, 896),
    "llm.model.model.layers.23.mlp.gate_proj.weight": (4864, 896),
    "llm.model.model.layers.23.mlp.up_proj.weight": (4864, 896),
    "llm.model.model.layers.23.mlp.down_proj.weight": (896, 4864),
    "llm.model.model.layers.11.input_layernorm.weight": (896,),
    "llm.model.model.layers.11.post_attention_layernorm.weight": (896,),
    "llm.model.model.norm.weight": (896,),
    "llm.model.lm_head.weight": (151936, 896),
    "llm_embedding.weight": (2, 896),
    "speech_embedding.weight": (6564, 896),
    "llm_decoder.weight": (6564, 896),
    "llm_decoder.bias": (6564,),
}

FLOW_KEYS = {
    "input_embedding.weight": (6561, 512),
    "spk_embed_affine_layer.weight": (80, 192),
    "spk_embed_affine_layer.bias": (80,),
    "encoder.embed.out.0.weight": (512, 512),
    "encoder.embed.out.1.weight": (512,),
    "encoder.pre_lookahead_layer.conv1.weight": (512, 512, 4),
    "encoder.pre_lookahead_layer.conv2.weight": (512, 512, 3),
    "encoder.encoders.0.self_attn.pos_bias_u": (8, 64),
    "encoder.encoders.0.self_attn.pos_bias_v": (8, 64),
    "encoder.encoders.0.self_attn.linear_pos.weight": (512, 512),
    "encoder.encoders.0.self_attn.linear_q.bias": (512,),
    "encoder.encoders.5.self_attn.linear_out.weight": (512, 512),
    "encoder.encoders.5.feed_forward.w_1.weight": (2048, 512),
    "encoder.encoders.5.feed_forward.w_2.bias": (512,),
    "encoder.encoders.2.norm_mha.weight": (512,),
    "encoder.encoders.2.norm_ff.bias": (512,),
    "encoder.up_layer.conv.weight": (512, 512, 5),
    "encoder.up_embed.out.0.weight": (512, 512),
    "encoder.up_encoders.3.self_attn.pos_bias_v": (8, 64),
    "encoder.up_encoders.3.feed_forward.w_1.bias": (2048,),
    "encoder.after_norm.weight": (512,),
    "encoder_proj.weight": (80, 512),
    "decoder.estimator.time_mlp.linear_1.weight": (1024, 320),
    "decoder.estimator.time_mlp.linear_2.weight": (1024, 1024),
    "decoder.estimator.down_blocks.0.0.mlp.1.weight": (256, 1024),
    "decoder.estimator.down_blocks.0.0.block1.block.0.weight": (256, 320, 3),
    "decoder.estimator.down_blocks.0.0.block1.block.2.weight": (256,),
    "decoder.estimator.down_blocks.0.0.block2.block.0.bias": (256,),
    "decoder.estimator.down_blocks.0.0.res_conv.weight": (256, 320, 1),
    "decoder.estimator.down_blocks.0.1.3.attn1.to_q.weight": (512, 256),
    "decoder.estimator.down_blocks.0.1.0.attn1.to_out.0.weight": (256, 512),
    "decoder.estimator.down_blocks.0.1.0.attn1.to_out.0.bias": (256,),
    "decoder.estimator.down_blocks.0.1.0.norm1.weight": (256,),
    "decoder.estimator.down_blocks.0.1.0.norm3.bias": (256,),
    "decoder.estimator.down_blocks.0.1.0.ff.net.0.proj.weight": (1024, 256),
    "decoder.estimator.down_blocks.0.1.0.ff.net.2.weight": (256, 1024),
    "decoder.estimator.down_blocks.0.2.weight": (256, 256, 3),
    "decoder.estimator.mid_blocks.11.0.block2.block.0.weight": (256, 256, 3),
    "decoder.estimator.mid_blocks.11.1.0.attn1.to_q.weight": (512, 256),
    "decoder.estimator.mid_blocks.11.1.3.attn1.to_v.weight": (512, 256),
    "decoder.estimator.up_blocks.0.0.block1.block.0.weight": (256, 512, 3),
    "decoder.estimator.up_blocks.0.0.res_conv.weight": (256, 512, 1),
    "decoder.estimator.up_blocks.0.1.3.ff.net.2.bias": (256,),
    "decoder.estimator.up_blocks.0.2.weight": (256, 256, 3),
    "decoder.estimator.final_block.block.0.weight": (256, 256, 3),
    "decoder.estimator.final_block.block.2.weight": (256,),
    "decoder.estimator.final_proj.weight": (80, 256, 1),
}

HIFT_KEYS = {
    "f0_predictor.condnet.0.parametrizations.weight.original0": (512, 1, 1),
    "f0_predictor.condnet.0.parametrizations.weight.original1": (512, 80, 3),
    "f0_predictor.condnet.0.bias": (512,),
    "f0_predictor.condnet.8.parametrizations.weight.original1": (512, 512, 3),
    "f0_predictor.classifier.weight": (1, 512),
    "f0_predictor.classifier.bias": (1,),
    "m_source.l_linear.weight": (1, 9),
    "m_source.l_linear.bias": (1,),
    "conv_pre.parametrizations.weight.original0": (512, 1, 1),
    "conv_pre.parametrizations.weight.original1": (512, 80, 7),
    # ConvTranspose1d weights are [in, out, k]; weight norm's default dim 0 puts g on the input side.
    "ups.0.parametrizations.weight.original0": (512, 1, 1),
    "ups.0.parametrizations.weight.original1": (512, 256, 16),
    "ups.1.parametrizations.weight.original1": (256, 128, 11),
    "ups.2.parametrizations.weight.original1": (128, 64, 7),
    "ups.2.bias": (64,),
    "source_downs.0.weight": (256, 18, 30),
    "source_downs.1.weight": (128, 18, 6),
    "source_downs.2.weight": (64, 18, 1),
    "source_resblocks.0.convs1.0.parametrizations.weight.original1": (256, 256, 7),
    "source_resblocks.2.convs2.2.parametrizations.weight.original1": (64, 64, 11),
    "source_resblocks.0.activations1.0.alpha": (256,),
    "resblocks.0.convs1.0.parametrizations.weight.original1": (256, 256, 3),
    "resblocks.8.convs1.2.parametrizations.weight.original1": (64, 64, 11),
    "resblocks.4.activations2.2.alpha": (128,),
    "conv_post.parametrizations.weight.original1": (18, 64, 7),
    "conv_post.bias": (18,),
}


@pytest.mark.parametrize("stage,expected", [("llm", LLM_KEYS), ("flow", FLOW_KEYS), ("hift", HIFT_KEYS)])
def test_real_key_names_and_shapes(real_nets: dict[str, nn.Module], stage: str, expected: dict) -> None:
    sd = real_nets[stage].state_dict()
    wrong = {k: (tuple(sd[k].shape) if k in sd else None) for k, shape in expected.items()
             if k not in sd or tuple(sd[k].shape) != shape}
    assert not wrong, wrong


def test_no_extra_state_in_checkpoints(real_nets: dict[str, nn.Module]) -> None:
    """Fixed tensors (CFM noise, positional tables, RoPE, STFT basis) are not checkpoint entries upstream."""
    keys = {s: set(net.state_dict()) for s, net in real_nets.items()}
    assert len(keys["llm"]) == 24 * 12 + 3 + 4
    assert not any("rotary_emb" in k or "o_proj.bias" in k for k in keys["llm"])
    assert not any(k.endswith(("rand_noise", ".pe")) for k in keys["flow"])
    assert not any("stft" in k or "window" in k for k in keys["hift"])


def test_tiny_preset_uses_the_same_key_layout() -> None:
    """tiny differs only in widths and depths: every tiny key exists in the real network."""
    for stage in ("llm", "flow", "hift"):
        real = set(_meta(stage).state_dict())
        tiny = set(_meta(stage, "tiny").state_dict())
        assert tiny <= real, sorted(tiny - real)[:5]
