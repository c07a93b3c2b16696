"""CosyVoice3's vocoder: CausalHiFTGenerator (neural source filter + iSTFTNet, causal), 24 kHz.

Everything that was centred in CosyVoice2's HiFT is causal here: convolutions pad on the left, the
up-samplers are nearest-neighbour repeats followed by a left-padded convolution, the source's
down-samplers pad on the left; ``conv_pre`` and the F0 predictor's first convolution look
``conv_pre_look_right`` (4) and 3 mel frames *ahead* (right padding, or the next frames when
streaming). The causal source adds no fresh randomness at inference: its initial phases and noise
are fixed tensors drawn once (upstream draws them at construction from the global RNG).

Keys follow upstream's ``hift.pt`` with weight norm as parametrizations
(``*.parametrizations.weight.original0`` is the gain g, ``original1`` the direction v).
Snake keeps upstream's arithmetic ``x + 1 / (alpha + 1e-9) * sin(alpha x)^2`` in the module's dtype:
the released checkpoint has alphas below 1.6e-5 whose reciprocal overflows FP16, so a half-precision
build must keep this op in FP32 (the guard belongs to the build, not here).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.nn.utils.parametrizations import weight_norm

from cosycompile.families.hift import DecoderConvs, add_decoder_layers, add_source, add_stft_basis, upsample_with_source
from cosycompile.families.hift import SourceModuleHnNSF as SharedSourceModuleHnNSF

from .config import HiFTConfig


class Snake(nn.Module):
    """x + sin^2(alpha x) / alpha with a learned alpha per channel (linear scale, as upstream's)."""

    # Upstream's ``no_div_by_zero``: added to alpha before the reciprocal, never clamped.
    EPS = 1e-9

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.unsqueeze(0).unsqueeze(-1)
        return x + (1.0 / (alpha + self.EPS)) * torch.pow(torch.sin(x * alpha), 2)


class CausalConv1d(nn.Conv1d):
    """Stride-1 convolution padded with zeros on one side only, so the output keeps the input length.

    ``left`` pads the past (a causal filter); ``right`` pads the future, where streaming passes the
    next frames as ``context`` instead of zeros.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1,
                 causal_type: str = "left") -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=dilation)
        if causal_type not in ("left", "right"):
            raise ValueError(f"causal_type must be 'left' or 'right', not {causal_type!r}")
        # Upstream's formula: (k - 1) * d for odd kernels, one more than that rounded down for even ones.
        self.causal_padding = int((kernel_size * dilation - dilation) / 2) * 2 + (kernel_size + 1) % 2
        self.causal_type = causal_type

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        if context is None or context.shape[2] == 0:
            context = x.new_zeros(x.shape[0], x.shape[1], self.causal_padding)
        elif context.shape[2] != self.causal_padding:
            raise ValueError(f"context must hold {self.causal_padding} frames, got {context.shape[2]}")
        x = torch.cat([context, x] if self.causal_type == "left" else [x, context], dim=2)
        return super().forward(x)


class CausalConv1dDownSample(nn.Conv1d):
    """Strided convolution (kernel 2u, stride u) with u - 1 zeros of left padding."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding=0)
        self.causal_padding = stride - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.causal_padding, 0)))


class CausalConv1dUpsample(nn.Conv1d):
    """Nearest-neighbour x``stride`` repeat, then a stride-1 convolution with k - 1 zeros on the left."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size, 1, padding=0)
        self.causal_padding = kernel_size - 1
        self.upsample = nn.Upsample(scale_factor=stride, mode="nearest")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(self.upsample(x), (self.causal_padding, 0)))


class ResBlock(nn.Module):
    """Causal HiFi-GAN residual block: per dilation, Snake -> dilated conv -> Snake -> conv, added back."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(weight_norm(CausalConv1d(channels, channels, kernel_size, dilation=d))
                                    for d in dilations)
        self.convs2 = nn.ModuleList(weight_norm(CausalConv1d(channels, channels, kernel_size, dilation=1))
                                    for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = c2(a2(c1(a1(x)))) + x
        return x


class CausalConvRNNF0Predictor(nn.Module):
    """F0 in Hz per mel frame: five weight-normed causal convs with ELU (the first looks 3 frames
    ahead), a linear head, abs."""

    def __init__(self, num_class: int = 1, in_channels: int = 80, cond_channels: int = 512) -> None:
        super().__init__()
        layers: list[nn.Module] = [weight_norm(CausalConv1d(in_channels, cond_channels, 4, causal_type="right")),
                                   nn.ELU()]
        for _ in range(4):
            layers += [weight_norm(CausalConv1d(cond_channels, cond_channels, 3, causal_type="left")), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, num_class)

    @property
    def look_ahead(self) -> int:
        """Mel frames the first convolution reads past the current one."""
        return self.condnet[0].causal_padding

    def forward(self, mel: torch.Tensor, finalize: bool = True) -> torch.Tensor:
        """mel [B, 80, T] -> F0 [B, T] (finalized), or [B, T - 3] with the last 3 frames as look-ahead."""
        if finalize:
            x = self.condnet[0](mel)
        else:
            k = self.look_ahead
            x = self.condnet[0](mel[:, :, :-k], mel[:, :, -k:])
        for layer in self.condnet[1:]:
            x = layer(x)
        return torch.abs(self.classifier(x.transpose(1, 2)).squeeze(-1))


class SineGen2(nn.Module):
    """Harmonic sines from F0 at sample rate: phase integrated at frame rate, then repeated (causal).

    Upstream's arithmetic kept as is (F0/sr mod 1, linear down-sampling by the hop, cumulative sum,
    nearest up-sampling), so that the checkpoint's outputs match; with ``fixed noise`` (upstream's
    eval-mode causal path) the random initial phases and the additive noise are the tensors set by
    :meth:`set_noise`, read from their start.
    """

    def __init__(self, samp_rate: int, upsample_scale: int, harmonic_num: int, sine_amp: float, noise_std: float,
                 voiced_threshold: float) -> None:
        super().__init__()
        self.sampling_rate, self.upsample_scale = samp_rate, upsample_scale
        self.harmonic_num = harmonic_num
        self.sine_amp, self.noise_std, self.voiced_threshold = sine_amp, noise_std, voiced_threshold
        self.rand_ini: torch.Tensor | None = None  # [1, H]; column 0 (the fundamental) is 0
        self.sine_waves: torch.Tensor | None = None  # [1, L_max, H], uniform [0, 1) as upstream draws it

    def forward(self, f0: torch.Tensor, rand_ini: torch.Tensor | None = None,
                sine_waves: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """f0 [B, L, 1] at sample rate -> (sines + noise [B, L, H], voiced flag [B, L, 1]).

        ``rand_ini`` / ``sine_waves`` replace the fixed tensors for this call (graph inputs of an export).
        """
        rand_ini = self.rand_ini if rand_ini is None else rand_ini
        sine_waves = self.sine_waves if sine_waves is None else sine_waves
        assert rand_ini is not None and sine_waves is not None, "call set_noise first"
        harmonics = torch.arange(1, self.harmonic_num + 2, dtype=torch.float32, device=f0.device)
        rad = (f0 * harmonics[None, None, :] / self.sampling_rate) % 1
        # The initial phase offsets are added at sample 0 only (upstream's rad_values[:, 0, :]).
        rad = torch.cat([rad[:, :1] + rand_ini.to(rad.device), rad[:, 1:]], dim=1)
        rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / self.upsample_scale, mode="linear").transpose(1, 2)
        phase = torch.cumsum(rad, dim=1) * 2 * np.pi
        phase = F.interpolate(phase.transpose(1, 2) * self.upsample_scale, scale_factor=self.upsample_scale,
                              mode="nearest").transpose(1, 2)
        sines = torch.sin(phase) * self.sine_amp
        uv = (f0 > self.voiced_threshold).type(torch.float32)
        noise_amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3
        noise = noise_amp * sine_waves[:, :sines.shape[1]].to(sines.device)
        return sines * uv + noise, uv


class SourceModuleHnNSF(SharedSourceModuleHnNSF):
    """The shared harmonic-plus-noise source over this module's causal :class:`SineGen2`, whose noise
    is fixed rather than drawn per call.

    (Upstream also returns a noise branch, drawn from a fixed ``uv`` tensor; the generator never reads it.)
    """

    sine_gen = SineGen2

    def forward(self, f0: torch.Tensor, rand_ini: torch.Tensor | None = None,
                sine_waves: torch.Tensor | None = None) -> torch.Tensor:
        with torch.no_grad():
            sines, _ = self.l_sin_gen(f0, rand_ini, sine_waves)
        return self.l_tanh(self.l_linear(sines))


class CausalHiFTGenerator(nn.Module):
    """Mel [B, 80, T] -> F0 -> NSF source -> causal iSTFTNet decoder -> waveform [B, 480 T] at 24 kHz."""

    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        add_source(self, cfg, SourceModuleHnNSF)
        self.upsample_rates = tuple(cfg.upsample_rates)
        self.lrelu_slope, self.audio_limit = cfg.lrelu_slope, cfg.audio_limit
        self.conv_pre_look_right = cfg.conv_pre_look_right
        add_decoder_layers(self, cfg, DecoderConvs(
            conv_pre=lambda cin, cout: CausalConv1d(cin, cout, cfg.conv_pre_look_right + 1, causal_type="right"),
            up=CausalConv1dUpsample,
            source_down=lambda cin, cout, u: (CausalConv1d(cin, cout, 1) if u == 1
                                              else CausalConv1dDownSample(cin, cout, u * 2, u)),
            resblock=ResBlock,
            conv_post=lambda cin, cout: CausalConv1d(cin, cout, 7)))
        # Periodic Hann (scipy's get_window("hann", n, fftbins=True)), computed in float64 then rounded.
        add_stft_basis(self, torch.hann_window(self.n_fft, periodic=True, dtype=torch.float64).float())
        self.f0_predictor = CausalConvRNNF0Predictor(cfg.f0_num_class, cfg.in_channels, cfg.f0_cond_channels)

    # -- the source's fixed randomness -------------------------------------------------------------
    def set_noise(self, rand_ini: torch.Tensor, sine_waves: torch.Tensor) -> None:
        """Use these initial phases [1, H] (column 0 forced to 0) and noise [1, L_max, H] from now on."""
        rand_ini = rand_ini.clone()
        rand_ini[:, 0] = 0
        self.m_source.l_sin_gen.rand_ini = rand_ini
        self.m_source.l_sin_gen.sine_waves = sine_waves

    def ensure_noise(self) -> None:
        """Draw the fixed source randomness from ``cfg.noise_seed`` unless :meth:`set_noise` gave it.

        Same distributions and shapes as upstream (uniform [0, 1), ``noise_seconds`` of samples); the
        values differ from any upstream process, whose draw depends on everything seeded before it.
        """
        gen = self.m_source.l_sin_gen
        if gen.rand_ini is not None and gen.sine_waves is not None:
            return
        g = torch.Generator().manual_seed(self.cfg.noise_seed)
        h = self.cfg.nb_harmonics + 1
        rand_ini = torch.rand(1, h, generator=g)
        sine_waves = torch.rand(1, self.cfg.noise_seconds * self.cfg.sampling_rate, h, generator=g)
        self.set_noise(rand_ini, sine_waves)

    # -- network --------------------------------------------------------------------------------
    def _stft(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, L] -> (real, imag) [B, n_fft/2 + 1, L/hop + 1], as torch.stft(center=True, reflect padding)."""
        x = F.pad(x[:, None], (self.n_fft // 2, self.n_fft // 2), mode="reflect")
        spec = F.conv1d(x, self.stft_basis, stride=self.hop)
        half = self.n_fft // 2 + 1
        return spec[:, :half], spec[:, half:]

    def _istft(self, magnitude: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        magnitude = torch.clip(magnitude, max=1e2)
        real, imag = magnitude * torch.cos(phase), magnitude * torch.sin(phase)
        return torch.istft(torch.complex(real, imag), self.n_fft, self.hop, self.n_fft,
                           window=self.stft_window.to(magnitude.device))

    def source(self, f0: torch.Tensor, rand_ini: torch.Tensor | None = None,
               sine_waves: torch.Tensor | None = None) -> torch.Tensor:
        """F0 per mel frame [B, T] -> excitation [B, 1, 480 T] (from the fixed noise, or the tensors given:
        ``rand_ini`` [1, H] with column 0 at 0, ``sine_waves`` [1, >= 480 T, H])."""
        if rand_ini is None or sine_waves is None:
            self.ensure_noise()
        s = self.f0_upsamp(f0[:, None]).transpose(1, 2)
        return self.m_source(s, rand_ini, sine_waves).transpose(1, 2)

    def decode(self, x: torch.Tensor, s: torch.Tensor, finalize: bool = True) -> torch.Tensor:
        """Mel [B, 80, T] and excitation [B, 1, L] -> waveform. Unless ``finalize``, the last
        ``conv_pre_look_right`` frames are look-ahead only and the output stops before them."""
        wav = self._istft(*self.spectrum(x, s, finalize))
        if not finalize:
            wav = wav[:, :-self.upsample_scale]
        return torch.clamp(wav, -self.audio_limit, self.audio_limit)

    def spectrum(self, x: torch.Tensor, s: torch.Tensor, finalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(magnitude, phase) [B, n_fft/2 + 1, frames] that the iSTFT turns into the waveform (see :meth:`decode`)."""
        s_real, s_imag = self._stft(s.squeeze(1))
        if finalize:
            x = self.conv_pre(x)
        else:
            k = self.conv_pre_look_right
            x = self.conv_pre(x[:, :, :-k], x[:, :, -k:])
            cut = int(np.prod(self.upsample_rates) * k)
            s_real, s_imag = s_real[:, :, :-cut], s_imag[:, :, :-cut]
        x = upsample_with_source(self, x, torch.cat([s_real, s_imag], dim=1), self.lrelu_slope)
        half = self.n_fft // 2 + 1
        # sin() of the phase channels is upstream's (redundant under cos/sin, kept for equal numbers).
        return torch.exp(x[:, :half, :]), torch.sin(x[:, half:, :])

    def predict_f0(self, mel: torch.Tensor, finalize: bool = True) -> torch.Tensor:
        """F0 [B, T'] in Hz, computed in float64 when ``cfg.f0_float64``, as upstream does.

        Upstream converts its predictor to float64 in place on the first call; here float64 copies of
        the weights are passed for the call only (same numbers), so the module and its state dict stay
        float32 for later exports.
        """
        fp = self.f0_predictor
        if not self.cfg.f0_float64:
            return fp(mel, finalize=finalize)
        weights = {k: v.to(torch.float64) for k, v in [*fp.named_parameters(), *fp.named_buffers()]}
        return functional_call(fp, weights, (mel.to(torch.float64),), {"finalize": finalize}).to(mel.dtype)

    @torch.inference_mode()
    def inference(self, speech_feat: torch.Tensor, finalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(waveform [B, L], excitation [B, 1, L']) from mel [B, 80, T], as upstream's ``inference``.

        Streaming (``finalize=False``): the last 3 frames feed only the F0 predictor's look-ahead and
        the 4 before them only ``conv_pre``'s; the waveform stops before the frames still waiting.
        """
        f0 = self.predict_f0(speech_feat, finalize)
        s = self.source(f0)
        x = speech_feat if finalize else speech_feat[:, :, :-self.f0_predictor.look_ahead]
        return self.decode(x, s, finalize=finalize), s


class HiFTNetStep(nn.Module):
    """Graph wrapper of the offline (finalized) vocoder up to the iSTFT:
    ``(mel [1, 80, T], rand_ini [1, H], noise [1, 480 T, H]) -> (magnitude, phase)``.

    ``magnitude`` is clipped at 1e2 as the iSTFT clips it, so the runtime's numpy iSTFT takes it as is.
    The F0 predictor runs in float32 here, where upstream (and :meth:`CausalHiFTGenerator.predict_f0`)
    runs it in float64: ONNX Runtime's CPU kernels have no float64 convolution, and the graph is what
    the reference and every engine run. tests/families/cosyvoice3 measures the waveform this costs.
    """

    # The graph dims whose guards torch.export proves only from 2 (stages.common.export_program).
    export_from_two = ("frames",)

    def __init__(self, hift: CausalHiFTGenerator) -> None:
        super().__init__()
        self.hift = hift

    def forward(self, mel: torch.Tensor, rand_ini: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rand_ini = torch.cat([torch.zeros_like(rand_ini[:, :1]), rand_ini[:, 1:]], dim=1)
        s = self.hift.source(self.hift.f0_predictor(mel), rand_ini, noise)
        magnitude, phase = self.hift.spectrum(mel, s)
        return torch.clip(magnitude, max=1e2), phase
