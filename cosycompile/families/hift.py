"""Upstream's HiFT vocoder, ``cosyvoice/hifigan/generator.py::HiFTGenerator`` (neural source filter +
iSTFTNet): CosyVoice2's (24 kHz, 480 samples per mel frame), and the class the first generation uses
too, so it sits beside the families rather than in one of them.

Keys follow upstream, with weight norm as parametrizations (``*.parametrizations.weight.original0``
is the gain g, ``original1`` the direction v); the loader also accepts old-style ``weight_g``/``weight_v``.
The source's random initial phases and noise can be passed in, which makes the network
deterministic for comparisons and exportable with the randomness as graph inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from cosycompile.families.hift_config import HiFTConfig


def _padding(kernel: int, dilation: int = 1) -> int:
    return (kernel * dilation - dilation) // 2


class Snake(nn.Module):
    """x + sin^2(alpha x) / alpha, with a learned alpha per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.alpha[None, :, None]
        return x + (1.0 / (a + 1e-9)) * torch.sin(x * a).pow(2)


class ResBlock(nn.Module):
    """HiFi-GAN residual block with Snake activations: three dilated conv pairs."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(weight_norm(nn.Conv1d(channels, channels, kernel, 1, dilation=d,
                                                          padding=_padding(kernel, d))) for d in dilations)
        self.convs2 = nn.ModuleList(weight_norm(nn.Conv1d(channels, channels, kernel, 1, dilation=1,
                                                          padding=_padding(kernel))) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = x + c2(a2(c1(a1(x))))
        return x


class ConvRNNF0Predictor(nn.Module):
    """F0 in Hz per mel frame: five weight-normed convs with ELU, a linear head, abs."""

    def __init__(self, num_class: int = 1, in_channels: int = 80, cond_channels: int = 512) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(5):
            layers += [weight_norm(nn.Conv1d(in_channels if i == 0 else cond_channels, cond_channels, 3, padding=1)),
                       nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, num_class)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return torch.abs(self.classifier(self.condnet(mel).transpose(1, 2)).squeeze(-1))


def _frac(x: torch.Tensor) -> torch.Tensor:
    """x mod 1 (as upstream's ``% 1``), written with floor so it exports as plain ONNX ops."""
    return x - torch.floor(x)


class SineSource(nn.Module):
    """What upstream's sine generators share: F0 in Hz at the sample rate, ``harmonic_num`` overtones
    above the fundamental, and the mix of sines and noise by voicing (:meth:`excite`); each subclass
    integrates the phase its own way (``sample_phase``)."""

    def __init__(self, samp_rate: int, upsample_scale: int, harmonic_num: int, sine_amp: float, noise_std: float,
                 voiced_threshold: float) -> None:
        super().__init__()
        self.sampling_rate, self.upsample_scale = samp_rate, upsample_scale
        self.harmonics = harmonic_num + 1
        self.sine_amp, self.noise_std, self.voiced_threshold = sine_amp, noise_std, voiced_threshold
        self.register_buffer("harmonic_index", torch.arange(1, self.harmonics + 1, dtype=torch.float32),
                             persistent=False)
        first_off = torch.ones(self.harmonics)
        first_off[0] = 0.0  # the fundamental has no random initial phase
        self.register_buffer("first_off", first_off, persistent=False)

    def excite(self, sines: torch.Tensor, f0: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """Voiced samples: the sines plus noise of ``noise_std``; unvoiced ones: noise of a third of the
        sine amplitude. ``noise`` [B, L, H] is the standard normal draw (None: drawn here)."""
        uv = (f0 > self.voiced_threshold).float()
        if noise is None:
            noise = torch.randn_like(sines)
        noise = (uv * self.noise_std + (1 - uv) * self.sine_amp / 3) * noise
        return sines * uv + noise


class SineGen2(SineSource):
    """Harmonic sine source from F0 (phase integrated at frame rate, then upsampled).

    Same arithmetic as upstream's SineGen2 for 24 kHz, reorganised for float32: upstream integrates
    the phase as ``U * cumsum(rad) * 2 pi`` and interpolates that, a number that reaches 1e5..1e6
    radians after a few seconds, where one float32 ulp is 0.01..0.1 rad; tiny differences in how a
    runtime sums or interpolates then become audible sine errors (9% torch vs ONNX Runtime at 10 s).
    Here the phase is kept in cycles and wrapped to [0, 1) before it can grow: per-frame increments
    are wrapped, summed in blocks, and the linear interpolation inside a frame is added afterwards.
    Equal in exact arithmetic; torch and ONNX Runtime then agree to ~3e-4 even for a minute of audio.
    """

    # Frames per partial sum: short float32 sums, and few of them, whatever the utterance length.
    BLOCK = 64
    # The HiFT graph's dims whose guards torch.export proves only from 2 with this source (its blocks).
    export_from_two = ("frames",)

    def __init__(self, samp_rate: int, upsample_scale: int, harmonic_num: int, sine_amp: float, noise_std: float,
                 voiced_threshold: float) -> None:
        super().__init__(samp_rate, upsample_scale, harmonic_num, sine_amp, noise_std, voiced_threshold)
        # Linear upsampling (align_corners=False) puts sample n of frame segment m at weight
        # (j + offset) / U past frame m, j = 0..U-1, with segments starting at sample U*m + first.
        self.first = math.ceil(upsample_scale / 2 - 0.5)
        offset = self.first + 0.5 - upsample_scale / 2
        self.register_buffer("sample_offsets", torch.arange(upsample_scale, dtype=torch.float32) + offset,
                             persistent=False)

    def frame_phase(self, rad: torch.Tensor) -> torch.Tensor:
        """Phase in cycles, wrapped to [0, 1), at each frame: U * cumsum(rad) mod 1. [B, T, H]."""
        B, T, H = rad.shape
        k = self.BLOCK
        inc = F.pad(_frac(rad * self.upsample_scale), (0, 0, 0, (-T) % k)).reshape(B, -1, k, H)
        inner = torch.cumsum(inc, dim=2)
        totals = _frac(inner[:, :, -1])
        before = _frac(torch.cumsum(totals, dim=1) - totals)
        return _frac(before[:, :, None] + inner).reshape(B, -1, H)[:, :T]

    def sample_phase(self, rad: torch.Tensor) -> torch.Tensor:
        """Upstream's linear x U interpolation of the frame phase, in wrapped cycles. [B, T*U, H]."""
        B, T, H = rad.shape
        U = self.upsample_scale
        base = self.frame_phase(rad)
        zero = torch.zeros_like(rad[:, :1])
        # Segment m in -1..T-1 runs from frame m to m+1; before frame 0 and after frame T-1 the
        # interpolation is clamped to the edge frame, i.e. a zero slope.
        seg_base = torch.cat([base[:, :1], base], dim=1)
        seg_slope = torch.cat([zero, rad[:, 1:], zero], dim=1)
        phase = _frac(seg_base[:, :, None] + self.sample_offsets[None, None, :, None] * seg_slope[:, :, None])
        start = U - self.first
        return phase.reshape(B, -1, H)[:, start: start + T * U]

    def forward(self, f0: torch.Tensor, rand_ini: torch.Tensor | None = None,
                noise: torch.Tensor | None = None) -> torch.Tensor:
        """f0 [B, L, 1] at sample rate -> source [B, L, harmonics].

        ``rand_ini`` [B, H] is upstream's random initial phase, added to sample 0 before the
        frame-rate downsampling; at 480x that interpolation never reads sample 0, so (as upstream)
        it has no effect on the output. ``noise`` [B, L, H] is the standard normal draw.
        """
        rad = _frac(f0 * self.harmonic_index / self.sampling_rate)
        if rand_ini is None:
            rand_ini = torch.rand(f0.shape[0], self.harmonics, device=f0.device)
        rad = torch.cat([rad[:, :1] + (rand_ini * self.first_off)[:, None], rad[:, 1:]], dim=1)
        rad = F.interpolate(rad.transpose(1, 2), scale_factor=1.0 / self.upsample_scale, mode="linear")
        sines = torch.sin(2 * math.pi * self.sample_phase(rad.transpose(1, 2))) * self.sine_amp
        return self.excite(sines, f0, noise)


class SourceModuleHnNSF(nn.Module):
    """Harmonic-plus-noise source: sine harmonics merged into one excitation by a linear + tanh.

    ``sine_gen`` is the class of its sine generator, for a family whose source differs only there.
    """

    sine_gen: type[nn.Module] = SineGen2

    def __init__(self, cfg: HiFTConfig, upsample_scale: int) -> None:
        super().__init__()
        self.l_sin_gen = self.sine_gen(cfg.sampling_rate, upsample_scale, cfg.nb_harmonics, cfg.nsf_alpha,
                                       cfg.nsf_sigma, cfg.nsf_voiced_threshold)
        self.l_linear = nn.Linear(cfg.nb_harmonics + 1, 1)
        self.l_tanh = nn.Tanh()

    def forward(self, f0: torch.Tensor, rand_ini: torch.Tensor | None = None,
                noise: torch.Tensor | None = None) -> torch.Tensor:
        return self.l_tanh(self.l_linear(self.l_sin_gen(f0, rand_ini, noise)))


def add_source(gen: nn.Module, cfg: HiFTConfig, source: type[SourceModuleHnNSF] = SourceModuleHnNSF) -> None:
    """Give ``gen`` the sizes its layers are made from (``n_fft``, ``hop``, ``upsample_scale``: waveform
    samples per mel frame, ``num_kernels``, ``num_upsamples``) and its neural source: ``m_source`` (a
    ``source``) and ``f0_upsamp``, which brings F0 from the frame rate to the sample rate."""
    gen.n_fft, gen.hop = cfg.istft_n_fft, cfg.istft_hop_len
    gen.upsample_scale = int(np.prod(cfg.upsample_rates)) * gen.hop
    gen.num_kernels = len(cfg.resblock_kernel_sizes)
    gen.num_upsamples = len(cfg.upsample_rates)
    gen.m_source = source(cfg, gen.upsample_scale)
    gen.f0_upsamp = nn.Upsample(scale_factor=gen.upsample_scale)


@dataclass(frozen=True)
class DecoderConvs:
    """How a generation builds its decoder's convolutions (plain here, causal in CosyVoice3); the
    layers they make keep upstream's names, so checkpoints load into either."""

    conv_pre: Callable[[int, int], nn.Module]  # (in, out)
    up: Callable[[int, int, int, int], nn.Module]  # (in, out, kernel, rate)
    source_down: Callable[[int, int, int], nn.Module]  # (in, out, rate)
    resblock: Callable[[int, int, tuple[int, ...]], nn.Module]  # (channels, kernel, dilations)
    conv_post: Callable[[int, int], nn.Module]  # (in, out)


def add_decoder_layers(gen: nn.Module, cfg: HiFTConfig, convs: DecoderConvs) -> None:
    """Give ``gen`` the iSTFTNet decoder's layers (read by :func:`upsample_with_source`): the input
    conv, the upsampling convs, the source's downsampling convs and resblocks, the resblocks and the
    output conv. ``gen`` must already hold ``n_fft`` and ``num_upsamples`` (:func:`add_source`)."""
    base = cfg.base_channels
    gen.conv_pre = weight_norm(convs.conv_pre(cfg.in_channels, base))
    gen.ups = nn.ModuleList(
        weight_norm(convs.up(base // 2**i, base // 2 ** (i + 1), k, u))
        for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes)))
    down_rates = [1] + list(cfg.upsample_rates[::-1][:-1])
    cum = np.cumprod(down_rates)[::-1]
    gen.source_downs = nn.ModuleList()
    gen.source_resblocks = nn.ModuleList()
    for i, (u, k, d) in enumerate(zip(cum, cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes)):
        ch = base // 2 ** (i + 1)
        gen.source_downs.append(convs.source_down(gen.n_fft + 2, ch, int(u)))
        gen.source_resblocks.append(convs.resblock(ch, k, tuple(d)))
    gen.resblocks = nn.ModuleList(
        convs.resblock(base // 2 ** (i + 1), k, tuple(d)) for i in range(gen.num_upsamples)
        for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes))
    gen.conv_post = weight_norm(convs.conv_post(base // 2**gen.num_upsamples, gen.n_fft + 2))
    gen.reflection_pad = nn.ReflectionPad1d((1, 0))


def add_stft_basis(gen: nn.Module, window: torch.Tensor) -> None:
    """Register ``window`` and the Hann-windowed real DFT as conv weights (``stft_basis``): torch.stft's
    complex output does not export to ONNX, a strided conv with the same numbers does."""
    gen.register_buffer("stft_window", window, persistent=False)
    n = torch.arange(gen.n_fft, dtype=torch.float64)[None, :]
    k = torch.arange(gen.n_fft // 2 + 1, dtype=torch.float64)[:, None]
    ang = 2 * math.pi * k * n / gen.n_fft
    basis = torch.cat([torch.cos(ang), -torch.sin(ang)], dim=0) * window.double()
    gen.register_buffer("stft_basis", basis.float()[:, None, :], persistent=False)


def upsample_with_source(gen: nn.Module, x: torch.Tensor, s_stft: torch.Tensor, slope: float) -> torch.Tensor:
    """The body both generations' generators share: each upsampling layer adds the NSF source's STFT,
    brought down to its rate, then averages its multi-receptive-field resblocks; ``gen`` holds the
    layers under upstream's names. Returns ``conv_post``'s output (log-magnitude and phase channels)."""
    for i in range(gen.num_upsamples):
        x = gen.ups[i](F.leaky_relu(x, slope))
        if i == gen.num_upsamples - 1:
            x = gen.reflection_pad(x)
        x = x + gen.source_resblocks[i](gen.source_downs[i](s_stft))
        xs = gen.resblocks[i * gen.num_kernels](x)
        for j in range(1, gen.num_kernels):
            xs = xs + gen.resblocks[i * gen.num_kernels + j](x)
        x = xs / gen.num_kernels
    return gen.conv_post(F.leaky_relu(x))


class HiFTGenerator(nn.Module):
    """HiFT vocoder: mel -> F0 -> NSF source -> iSTFTNet decoder -> 24 kHz waveform."""

    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        add_source(self, cfg)
        add_decoder_layers(self, cfg, DecoderConvs(
            conv_pre=lambda cin, cout: nn.Conv1d(cin, cout, 7, 1, padding=3),
            up=lambda cin, cout, k, u: nn.ConvTranspose1d(cin, cout, k, u, padding=(k - u) // 2),
            source_down=lambda cin, cout, u: (nn.Conv1d(cin, cout, 1, 1) if u == 1
                                              else nn.Conv1d(cin, cout, u * 2, u, padding=u // 2)),
            resblock=ResBlock,
            conv_post=lambda cin, cout: nn.Conv1d(cin, cout, 7, 1, padding=3)))
        self.f0_predictor = ConvRNNF0Predictor(1, cfg.in_channels, cfg.f0_cond_channels)
        add_stft_basis(self, torch.hann_window(self.n_fft, periodic=True))

    def stft(self, x: torch.Tensor) -> torch.Tensor:
        """[B, L] -> [B, n_fft+2, L/hop+1] (real rows, then imaginary), = torch.stft(center=True)."""
        x = F.pad(x[:, None], (self.n_fft // 2, self.n_fft // 2), mode="reflect")
        return F.conv1d(x, self.stft_basis, stride=self.hop)

    def source(self, mel: torch.Tensor, rand_ini: torch.Tensor | None = None,
               noise: torch.Tensor | None = None) -> torch.Tensor:
        """The NSF excitation [B, 1, T*480] from the mel's predicted F0."""
        f0 = self.f0_predictor(mel)
        s = self.f0_upsamp(f0[:, None]).transpose(1, 2)
        return self.m_source(s, rand_ini, noise).transpose(1, 2)

    def spectrum(self, mel: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(magnitude, phase) [B, n_fft/2+1, frames] that the iSTFT turns into audio."""
        x = upsample_with_source(self, self.conv_pre(mel), self.stft(s[:, 0]), self.cfg.lrelu_slope)
        half = self.n_fft // 2 + 1
        magnitude = torch.clamp(torch.exp(x[:, :half]), max=1e2)
        return magnitude, torch.sin(x[:, half:])

    def istft(self, magnitude: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        return torch.istft(spec, self.n_fft, self.hop, self.n_fft, window=self.stft_window)

    @torch.inference_mode()
    def inference(self, mel: torch.Tensor, rand_ini: torch.Tensor | None = None,
                  noise: torch.Tensor | None = None) -> torch.Tensor:
        """mel [B, 80, T] -> wav [B, T*480] in [-audio_limit, audio_limit]."""
        mag, phase = self.spectrum(mel, self.source(mel, rand_ini, noise))
        return torch.clamp(self.istft(mag, phase), -self.cfg.audio_limit, self.cfg.audio_limit)

    def forward(self, mel: torch.Tensor, rand_ini: torch.Tensor | None = None,
                noise: torch.Tensor | None = None) -> torch.Tensor:
        """Same as :meth:`inference` (mel [B, 80, T] -> wav [B, T*480])."""
        return self.inference(mel, rand_ini, noise)


class HiFTNetStep(nn.Module):
    """Export wrapper: ``(mel [1,80,T], rand_ini [1,H], noise [1,T*480,H]) -> (magnitude, phase)``."""

    def __init__(self, hift: HiFTGenerator) -> None:
        super().__init__()
        self.hift = hift

    @property
    def export_from_two(self) -> tuple[str, ...]:
        """The graph dims whose guards torch.export proves only from 2 (stages.common.export_program):
        the sine source's (CosyVoice2's block-summed phase has some, CosyVoice-300M's has none)."""
        return tuple(getattr(self.hift.m_source.l_sin_gen, "export_from_two", ()))

    def forward(self, mel: torch.Tensor, rand_ini: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.hift.spectrum(mel, self.hift.source(mel, rand_ini, noise))


def vocoder_info(models: Any) -> dict[str, Any]:
    """The iSTFT's and the source's constants a HiFT stage's runtime reads (graphs' info), from the
    loaded vocoder (``upsample_scale``: wav samples per mel frame) and its config."""
    c = models.config.hift
    return {"samples_per_frame": int(models.hift.upsample_scale), "nb_harmonics": c.nb_harmonics,
            "harmonics": c.nb_harmonics + 1, "istft_n_fft": c.istft_n_fft, "n_freq": c.istft_n_fft // 2 + 1,
            "istft_hop": c.istft_hop_len, "audio_limit": c.audio_limit, "sample_rate": c.sampling_rate,
            "mel_bins": c.in_channels}


def hift_parts(models: Any) -> tuple[dict[str, nn.Module], dict[str, Any], dict[str, Any]]:
    """``FamilyInfo.parts["hift"]`` of a family whose vocoder is this module's generator (CosyVoice-300M,
    CosyVoice2): the vocoder up to the iSTFT, no assets, :func:`vocoder_info`."""
    return {"hift": HiFTNetStep(models.hift).eval()}, {}, vocoder_info(models)
