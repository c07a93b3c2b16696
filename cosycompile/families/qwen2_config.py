"""Settings of the Qwen2 speech LM that CosyVoice2 and CosyVoice3 share: the Qwen2 body (upstream's
``CosyVoice-BlankEN/config.json``), the decoding ratios of ``Qwen2LM.inference`` and the yaml's
repetition-aware sampling. A family whose LM adds settings extends the class. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingConfig:
    """CosyVoice's repetition-aware sampling (``ras_sampling``) settings from the yaml."""

    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1


@dataclass(frozen=True)
class Qwen2LMConfig:
    """The Qwen2 body (CosyVoice-BlankEN/config.json) and the decoding settings CosyVoice adds."""

    hidden_size: int = 896
    num_layers: int = 24  # config.json: num_hidden_layers
    num_heads: int = 14  # config.json: num_attention_heads
    num_kv_heads: int = 2  # config.json: num_key_value_heads
    intermediate_size: int = 4864
    vocab_size: int = 151936
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = True
    # Decoding (Qwen2LM.inference defaults and the yaml's sampling entry).
    min_token_text_ratio: float = 2.0
    max_token_text_ratio: float = 20.0
    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    @property
    def head_dim(self) -> int:
        """Per-head width of the Qwen2 attention."""
        return self.hidden_size // self.num_heads
