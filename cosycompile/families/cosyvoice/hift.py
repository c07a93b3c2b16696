"""CosyVoice-300M's HiFT vocoder: upstream's ``HiFTGenerator`` (the shared class, ``families/hift.py``)
with the sine source upstream picks at 22,050 Hz.

Upstream's generator chooses its source by sampling rate (``sinegen_type``): the original per-sample
``SineGen`` at 22,050 Hz, ``SineGen2`` (CosyVoice2's, in the shared module) otherwise. The original
one lives here, in the only family that runs it, so the shared module and every other family's
keys stay as they are. State-dict keys are the shared class's (the source's only weights are its
``l_linear``).
"""

from __future__ import annotations

import math

import torch

from cosycompile.families.hift import HiFTGenerator as SharedHiFTGenerator
from cosycompile.families.hift import SineSource, SourceModuleHnNSF, _frac
from cosycompile.families.hift_config import HiFTConfig


def _wrapped_cumsum(inc: torch.Tensor) -> torch.Tensor:
    """Inclusive prefix sum over dim 1 of ``inc`` [B, T, H] (values in [0, 1)), mod 1.

    Each value is split into its multiple of 2^-12 and the rest: while T < 4096 the first parts sum
    exactly in float32 in any order (every partial sum is a multiple of 2^-12 below 4096), and the
    rests sum to less than 1, where an ulp is 6e-8 at most. So the sum is nearly exact, and runtimes
    that add in another order (ONNX Runtime, TensorRT) agree with it; and there is no reshape into
    blocks, which ``torch.export`` could not keep dynamic.
    """
    hi = torch.floor(inc * 4096.0) * (1.0 / 4096.0)
    return _frac(_frac(torch.cumsum(hi, dim=1)) + torch.cumsum(inc - hi, dim=1))


def _frac_of_multiple(n: torch.Tensor | float, x: torch.Tensor) -> torch.Tensor:
    """(n * x) mod 1 for whole numbers n (as floats) and x >= 0 with n * x < 4096, to ~1e-7: x's
    multiple of 2^-12 times n is exact in float32, and only the small rest is rounded."""
    hi = torch.floor(x * 4096.0) * (1.0 / 4096.0)
    return _frac(_frac(n * hi) + n * (x - hi))


class SineGen(SineSource):
    """Upstream's original sine generator (``SineGen``, HiFTGenerator's source at 22,050 Hz): the
    phase is integrated sample by sample, and every harmonic but the fundamental starts at a random
    phase in [-pi, pi).

    Upstream takes ``cumsum`` of the per-sample increments over the whole utterance in float32, then
    ``% 1``: the sum reaches 1e4 cycles after a few seconds, where one float32 ulp is 1e-3 cycles,
    and runtimes that sum in another order drift apart. The input is the frame F0 repeated
    ``upsample_scale`` times (HiFTGenerator's nearest upsampling), so the phase at sample i of frame m
    is the cycles of the whole frames before it (wrapped, summed by :func:`_wrapped_cumsum`) plus
    (i + 1) increments of frame m (:func:`_frac_of_multiple`): the same number in exact arithmetic,
    with no float32 rounding of a quantity above a few units.
    """

    def __init__(self, samp_rate: int, upsample_scale: int, harmonic_num: int, sine_amp: float, noise_std: float,
                 voiced_threshold: float) -> None:
        super().__init__(samp_rate, upsample_scale, harmonic_num, sine_amp, noise_std, voiced_threshold)
        self.register_buffer("steps", torch.arange(1, upsample_scale + 1, dtype=torch.float32), persistent=False)

    def sample_phase(self, f0_frames: torch.Tensor) -> torch.Tensor:
        """Upstream's ``cumsum(f0 * k / sr) % 1`` at every sample, from F0 per frame [B, T, 1]. [B, T*U, H]."""
        B, T, _ = f0_frames.shape
        rad = f0_frames * self.harmonic_index / self.sampling_rate  # per-sample increment, as upstream's F_mat
        # Cycles completed before each frame: the exclusive prefix of U increments per frame.
        whole = _frac_of_multiple(float(self.upsample_scale), rad)
        before = _frac(_wrapped_cumsum(whole) - whole)
        within = _frac_of_multiple(self.steps[None, None, :, None], rad[:, :, None, :])
        return _frac(before[:, :, None] + within).reshape(B, T * self.upsample_scale, self.harmonics)

    def forward(self, f0: torch.Tensor, rand_ini: torch.Tensor | None = None,
                noise: torch.Tensor | None = None) -> torch.Tensor:
        """f0 [B, L, 1] at sample rate (each frame's value repeated ``upsample_scale`` times) ->
        source [B, L, harmonics].

        ``rand_ini`` [B, H] is upstream's uniform draw behind the initial phases (``Uniform(-pi, pi)``
        samples ``-pi + 2 pi rand``; column 0 is ignored); ``noise`` [B, L, H] the standard normal draw
        (upstream draws it as [B, H, L]: pass that transposed).
        """
        if rand_ini is None:
            rand_ini = torch.rand(f0.shape[0], self.harmonics, device=f0.device)
        start = (-math.pi + rand_ini * (2 * math.pi)) * self.first_off
        phase = self.sample_phase(f0[:, :: self.upsample_scale])
        sines = torch.sin(2 * math.pi * phase + start[:, None, :]) * self.sine_amp
        return self.excite(sines, f0, noise)


class SampleSourceModuleHnNSF(SourceModuleHnNSF):
    """The source over upstream's original :class:`SineGen` (HiFTGenerator at 22,050 Hz)."""

    sine_gen = SineGen



class HiFTGenerator(SharedHiFTGenerator):
    """The shared HiFT generator with the 22,050 Hz source (upstream's rule: ``SineGen`` at that rate)."""

    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__(cfg)
        if cfg.sampling_rate == 22050:
            self.m_source = SampleSourceModuleHnNSF(cfg, self.upsample_scale)
