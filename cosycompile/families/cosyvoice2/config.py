"""Architecture settings of CosyVoice2's three networks, and the built-in presets.

Field names follow the keys of ``cosyvoice2.yaml`` and Qwen2's ``config.json`` where those exist;
values that upstream code hard-codes (four up-sampling conformer layers, the look-ahead length)
are fields too, defaulting to the real values, so the tiny preset can shrink them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cosycompile.families.flow_config import CausalFlowConfig
from cosycompile.families.hift_config import HiFTConfig
from cosycompile.families.qwen2_config import Qwen2LMConfig as LLMConfig


@dataclass(frozen=True)
class FlowConfig(CausalFlowConfig):
    """CausalMaskedDiffWithXvec: token embedding, upsampling conformer encoder, CFM with a 1-D UNet."""

    vocab_size: int = 6561
    # encoder
    encoder_size: int = 512  # yaml: encoder.output_size
    attention_heads: int = 8
    linear_units: int = 2048
    num_blocks: int = 6
    num_up_blocks: int = 4
    up_stride: int = 2
    encoder_chunk_size: int = 25  # streaming chunk, in tokens (the yaml's encoder.static_chunk_size)
    # estimator
    estimator_in_channels: int = 320  # yaml: decoder.estimator.in_channels
    channels: tuple[int, ...] = (256,)
    attention_head_dim: int = 64
    n_blocks: int = 4
    num_mid_blocks: int = 12
    num_heads: int = 8
    static_chunk_size: int = 50  # in mel frames: the yaml's chunk_size * token_mel_ratio


@dataclass(frozen=True)
class ModelConfig:
    llm: LLMConfig = field(default_factory=LLMConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    hift: HiFTConfig = field(default_factory=HiFTConfig)
    sample_rate: int = 24000
    token_frame_rate: int = 25
    token_mel_ratio: int = 2
    speech_token_size: int = 6561
    chunk_size: int = 25


PRESETS: dict[str, ModelConfig] = {
    "random-0.5b": ModelConfig(),
    "tiny": ModelConfig(
        llm=LLMConfig(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256,
                      vocab_size=512, max_position_embeddings=4096),
        flow=FlowConfig(input_size=64, encoder_size=64, attention_heads=2, linear_units=128, num_blocks=1,
                        num_up_blocks=1, channels=(64,), attention_head_dim=32, n_blocks=1, num_mid_blocks=1,
                        num_heads=2),
        hift=HiFTConfig(base_channels=32, f0_cond_channels=32),
    ),
}
