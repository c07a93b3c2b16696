"""Settings of upstream's HiFT vocoder (``cosyvoice/hifigan/generator.py``), shared by the families that
use it: the fields every generation's yaml sets, at CosyVoice2's values. A family whose HiFT adds
settings (CosyVoice3's causal one) extends the class. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HiFTConfig:
    """HiFTGenerator (NSF source + iSTFTNet) and its ConvRNN F0 predictor."""

    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10.0
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    istft_n_fft: int = 16  # yaml: istft_params.n_fft
    istft_hop_len: int = 4  # yaml: istft_params.hop_len
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    f0_cond_channels: int = 512  # yaml: f0_predictor.cond_channels
