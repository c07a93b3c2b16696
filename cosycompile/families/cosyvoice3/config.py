"""Architecture settings of CosyVoice3's three networks, with the 0.5B defaults and a tiny preset.

Defaults are the values upstream's ``examples/libritts/cosyvoice3/conf/cosyvoice3.yaml`` sets (read at
FunAudioLLM/CosyVoice ace7c47), plus the Qwen2-0.5B body of ``CosyVoice-BlankEN/config.json``. Values
that upstream code fixes rather than the yaml (the 200 extra speech-token rows of the LM, the CFM's
15,000 noise frames, the DiT's time-embedding width) are fields too, at upstream's value, so that
one place names every shape. Nothing here imports the rest of cosycompile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cosycompile.families.flow_config import CausalFlowConfig
from cosycompile.families.hift_config import HiFTConfig as BaseHiFTConfig
from cosycompile.families.qwen2_config import Qwen2LMConfig


@dataclass(frozen=True)
class LMConfig(Qwen2LMConfig):
    """CosyVoice3LM: the shared Qwen2 LM settings plus a 6,561 + 200 row speech vocabulary (its head has
    no bias)."""

    # Speech side (yaml: speech_token_size; llm.py: the 200 extra rows for special tokens).
    speech_token_size: int = 6561
    extra_speech_rows: int = 200


@dataclass(frozen=True)
class DiTConfig:
    """The flow's estimator ``cosyvoice.flow.DiT.dit.DiT`` (yaml ``flow.decoder.estimator``)."""

    dim: int = 1024
    depth: int = 22
    heads: int = 16
    dim_head: int = 64
    ff_mult: int = 2
    mel_dim: int = 80
    mu_dim: int = 80
    spk_dim: int = 80
    out_channels: int = 80
    # yaml: chunk_size (25 tokens) * token_mel_ratio (2).
    static_chunk_size: int = 50
    num_decoding_left_chunks: int = -1
    long_skip_connection: bool = False
    # Fixed in upstream's TimestepEmbedding / CausalConvPositionEmbedding.
    freq_embed_dim: int = 256
    conv_pos_kernel: int = 31
    conv_pos_groups: int = 16


@dataclass(frozen=True)
class FlowConfig(CausalFlowConfig):
    """CausalMaskedDiffWithDiT: token embedding, pre-look-ahead convs, x2 repeat, CFM over a DiT."""

    input_size: int = 80
    vocab_size: int = 6561
    token_mel_ratio: int = 2
    pre_lookahead_channels: int = 1024
    # CausalConditionalCFM (cfm_params in the yaml).
    sigma_min: float = 1e-6
    t_scheduler: str = "cosine"
    estimator: DiTConfig = field(default_factory=DiTConfig)


@dataclass(frozen=True)
class HiFTConfig(BaseHiFTConfig):
    """CausalHiFTGenerator with its CausalConvRNNF0Predictor (yaml ``hift``): the shared settings plus
    the causal ones."""

    conv_pre_look_right: int = 4
    f0_num_class: int = 1  # yaml: f0_predictor.num_class
    # Upstream runs the F0 predictor in float64 ("precision is crucial for causal inference").
    f0_float64: bool = True
    # The causal source reads fixed noise drawn at construction (300 s at 24 kHz upstream); here it is
    # drawn lazily from this seed so a 0.5B model built on the meta device allocates none of it.
    noise_seconds: int = 300
    noise_seed: int = 0


@dataclass(frozen=True)
class CosyVoice3Config:
    """The three networks of one CosyVoice3 model."""

    sample_rate: int = 24000
    token_frame_rate: int = 25
    lm: LMConfig = field(default_factory=LMConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    hift: HiFTConfig = field(default_factory=HiFTConfig)


def cv3_0_5b() -> CosyVoice3Config:
    """Fun-CosyVoice3-0.5B's shapes, as upstream's cosyvoice3.yaml builds them."""
    return CosyVoice3Config()


def cv3_tiny() -> CosyVoice3Config:
    """Shapes small enough for unit tests on two CPU cores; every rule (ratios, chunk, 80 mels) kept."""
    return CosyVoice3Config(
        lm=LMConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=256,
                    max_position_embeddings=512, speech_token_size=64),
        flow=FlowConfig(vocab_size=64, pre_lookahead_channels=32,
                        estimator=DiTConfig(dim=64, depth=2, heads=4, dim_head=16, ff_mult=2)),
        hift=HiFTConfig(base_channels=32, f0_cond_channels=32, noise_seconds=2),
    )
