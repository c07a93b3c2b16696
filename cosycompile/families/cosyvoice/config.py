"""Architecture settings of CosyVoice-300M's three networks, with the 300M defaults and a tiny preset.

Defaults are the values upstream's ``examples/libritts/cosyvoice/conf/cosyvoice.yaml`` sets (read at
FunAudioLLM/CosyVoice ace7c47); values upstream code fixes rather than the yaml (the mel hop of 256
samples in ``MaskedDiffWithXvec.inference``, the 20 head and tail tokens of the length regulator)
are fields too, at upstream's value, so that one place names every shape. The 25 Hz model is the
same networks with ``input_frame_rate: 25`` and a larger text vocabulary: a config, not a family.
Nothing here imports the rest of cosycompile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cosycompile.families.flow_config import FlowConfig as BaseFlowConfig
from cosycompile.families.hift_config import HiFTConfig as BaseHiFTConfig


@dataclass(frozen=True)
class EncoderConfig:
    """One of upstream's wenet-style encoders (``cosyvoice.transformer.encoder``) with espnet
    relative-position self-attention, pre-norm, no macaron and no convolution module."""

    input_size: int
    output_size: int
    attention_heads: int
    linear_units: int
    num_blocks: int
    # 1: each position sees itself and the past (the LM's text encoder runs with decoding_chunk_size=1);
    # 0: full attention (the flow's encoder).
    static_chunk_size: int = 0


@dataclass(frozen=True)
class LMConfig:
    """TransformerLM: a Conformer text encoder, then a Transformer decoder over
    [sos, speaker, text, task_id, speech tokens] (``llm.TransformerLM``)."""

    text_token_size: int = 51866
    speech_token_size: int = 4096
    spk_embed_dim: int = 192
    text_encoder: EncoderConfig = field(default_factory=lambda: EncoderConfig(
        input_size=512, output_size=1024, attention_heads=16, linear_units=4096, num_blocks=6, static_chunk_size=1))
    # ``llm``: a TransformerEncoder whose input layer is ``linear_legacy`` (Linear, LayerNorm, ReLU).
    decoder: EncoderConfig = field(default_factory=lambda: EncoderConfig(
        input_size=1024, output_size=1024, attention_heads=16, linear_units=4096, num_blocks=14, static_chunk_size=1))
    # ``inference``'s token-to-text length limits and the yaml's ras_sampling settings.
    min_token_text_ratio: float = 2.0
    max_token_text_ratio: float = 20.0
    top_p: float = 0.8
    top_k: int = 25

    @property
    def text_encoder_input_size(self) -> int:
        return self.text_encoder.input_size

    @property
    def llm_input_size(self) -> int:
        return self.decoder.input_size

    @property
    def head_dim(self) -> int:
        return self.decoder.output_size // self.decoder.attention_heads


@dataclass(frozen=True)
class EstimatorConfig:
    """The CFM's non-causal 1-D UNet, ``cosyvoice.flow.decoder.ConditionalDecoder`` (Matcha-TTS blocks)."""

    in_channels: int = 320
    out_channels: int = 80
    channels: tuple[int, ...] = (256, 256)
    attention_head_dim: int = 64
    n_blocks: int = 4
    num_mid_blocks: int = 12
    num_heads: int = 8


@dataclass(frozen=True)
class FlowConfig(BaseFlowConfig):
    """MaskedDiffWithXvec: token embedding, Conformer encoder, interpolating length regulator, CFM.

    Its CFM (upstream's ``ConditionalCFM``) draws the start noise with ``torch.randn_like`` on every call;
    the runtime reads the shared fixed draw instead (``noise_frames`` from ``noise_seed``), so that a
    reference and a build start alike."""

    input_frame_rate: int = 50
    encoder: EncoderConfig = field(default_factory=lambda: EncoderConfig(
        input_size=512, output_size=512, attention_heads=8, linear_units=2048, num_blocks=6))
    # InterpolateRegulator: one conv block per ratio (all 1: no upsampling by convolution).
    regulator_sampling_ratios: tuple[int, ...] = (1, 1, 1, 1)
    # ``MaskedDiffWithXvec.inference`` counts mel frames at 22,050 Hz and a hop of 256 samples; the
    # regulator interpolates the first and last ``regulator_edge_tokens`` tokens on their own.
    mel_sample_rate: int = 22050
    mel_hop: int = 256
    regulator_edge_tokens: int = 20
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)

    def mel_frames(self, tokens: int) -> int:
        """Mel frames upstream makes of ``tokens`` new speech tokens (``int(n / rate * 22050 / 256)``)."""
        return int(tokens / self.input_frame_rate * self.mel_sample_rate / self.mel_hop)


@dataclass(frozen=True)
class HiFTConfig(BaseHiFTConfig):
    """HiFTGenerator at 22,050 Hz: two x8 upsamplings (256 samples per mel frame with the iSTFT hop)."""

    sampling_rate: int = 22050
    upsample_rates: tuple[int, ...] = (8, 8)
    upsample_kernel_sizes: tuple[int, ...] = (16, 16)
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5))


@dataclass(frozen=True)
class CosyVoiceConfig:
    """The three networks of one CosyVoice-300M model."""

    sample_rate: int = 22050
    lm: LMConfig = field(default_factory=LMConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    hift: HiFTConfig = field(default_factory=HiFTConfig)


def cv1_300m() -> CosyVoiceConfig:
    """CosyVoice-300M's shapes (and -SFT's, -Instruct's), as upstream's cosyvoice.yaml builds them."""
    return CosyVoiceConfig()


def cv1_tiny() -> CosyVoiceConfig:
    """Shapes small enough for unit tests on two CPU cores; every rule (rates, causal text encoder,
    two UNet levels, 80 mels, 22,050 Hz) kept."""
    return CosyVoiceConfig(
        lm=LMConfig(text_token_size=256, speech_token_size=64,
                    text_encoder=EncoderConfig(input_size=32, output_size=64, attention_heads=4, linear_units=128,
                                               num_blocks=2, static_chunk_size=1),
                    decoder=EncoderConfig(input_size=64, output_size=64, attention_heads=4, linear_units=128,
                                          num_blocks=2, static_chunk_size=1)),
        flow=FlowConfig(input_size=32, vocab_size=64,
                        encoder=EncoderConfig(input_size=32, output_size=32, attention_heads=4, linear_units=64,
                                              num_blocks=2),
                        estimator=EstimatorConfig(channels=(32, 32), attention_head_dim=16, n_blocks=1,
                                                  num_mid_blocks=2, num_heads=2)),
        hift=HiFTConfig(base_channels=32, f0_cond_channels=32),
    )
