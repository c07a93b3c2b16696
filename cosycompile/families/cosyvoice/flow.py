"""CosyVoice-300M's flow: speech tokens -> mel with a Conformer, an interpolating length regulator and CFM.

``MaskedDiffWithXvec`` keeps upstream's keys (``cosyvoice.flow.flow.MaskedDiffWithXvec``):
``input_embedding``, ``spk_embed_affine_layer``, ``encoder.*``, ``encoder_proj``,
``length_regulator.model.*``, ``decoder.estimator.*``. Its ``inference`` equals upstream's given the
same start noise, which upstream draws with ``randn_like`` on every call and this class takes as an
argument.

The exported graphs stop before the length regulator (``FlowEncoderStep``: token-rate h): the
regulator needs the prompt/new split and the mel lengths, which graph inputs cannot carry, and it
runs in numpy around the graphs (``regulator.py``, fed by :func:`regulator_weights`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cosycompile.families.flow_head import FlowHead

from .config import FlowConfig
from .encoder import ConformerEncoder
from .flow_decoder import ConditionalDecoder


class InterpolateRegulator(nn.Module):
    """Upstream's ``InterpolateRegulator``: linear interpolation to mel length, then a conv stack
    (Conv1d k3 + GroupNorm(1) + Mish per sampling ratio, then a 1x1 conv); key ``model.N``."""

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.cfg = cfg
        ch = cfg.output_size
        layers: list[nn.Module] = []
        for _ in cfg.regulator_sampling_ratios:
            layers += [nn.Conv1d(ch, ch, 3, 1, 1), nn.GroupNorm(1, ch), nn.Mish()]
        layers.append(nn.Conv1d(ch, ch, 1, 1))
        self.model = nn.Sequential(*layers)

    def interpolate(self, h: torch.Tensor, n_prompt_tokens: int, mel_len1: int, mel_len2: int) -> torch.Tensor:
        """h [1, 80, N] at token rate -> [1, 80, mel_len1 + mel_len2] before the conv stack.

        As upstream's ``inference``: the prompt's tokens stretch to ``mel_len1`` frames and the new
        ones to ``mel_len2`` on their own, so the mel has a clean cut between them; past
        ``2 * regulator_edge_tokens`` new tokens, the first and last edge tokens are stretched on their
        own too (to the frames that many tokens make), the tokens between fill the rest.
        """
        c = self.cfg
        x1, x2 = h[:, :, :n_prompt_tokens], h[:, :, n_prompt_tokens:]
        edge = c.regulator_edge_tokens
        if x2.shape[2] > 2 * edge:
            edge_frames = c.mel_frames(edge)
            x2 = torch.cat([F.interpolate(x2[:, :, :edge], size=edge_frames, mode="linear"),
                            F.interpolate(x2[:, :, edge:-edge], size=mel_len2 - 2 * edge_frames, mode="linear"),
                            F.interpolate(x2[:, :, -edge:], size=edge_frames, mode="linear")], dim=2)
        else:
            x2 = F.interpolate(x2, size=mel_len2, mode="linear")
        if n_prompt_tokens == 0:
            if mel_len1 != 0:
                raise ValueError(f"{mel_len1} prompt mel frames but no prompt tokens")
            return x2
        return torch.cat([F.interpolate(x1, size=mel_len1, mode="linear"), x2], dim=2)

    def inference(self, h: torch.Tensor, n_prompt_tokens: int, mel_len1: int, mel_len2: int) -> torch.Tensor:
        """h [1, 80, N] (prompt tokens first) -> mu [1, 80, mel_len1 + mel_len2]."""
        return self.model(self.interpolate(h, n_prompt_tokens, mel_len1, mel_len2))


class ConditionalCFM(nn.Module):
    """Upstream's ``ConditionalCFM`` at inference: Euler steps on a cosine schedule with classifier-free
    guidance (batch 2: conditioned, then with mu, spks and cond zeroed)."""

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.inference_cfg_rate = cfg.inference_cfg_rate
        self.n_timesteps = cfg.n_timesteps
        self.estimator = ConditionalDecoder(cfg.estimator)

    @torch.inference_mode()
    def forward(self, mu: torch.Tensor, mask: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor,
                noise: torch.Tensor) -> torch.Tensor:
        """Mel [1, 80, T] from ``mu`` [1, 80, T], ``mask`` [1, 1, T], speaker ``spks`` [1, 80], prompt
        ``cond`` [1, 80, T] and the start ``noise`` [1, 80, T] (upstream's ``randn_like(mu)``)."""
        t_span = torch.linspace(0, 1, self.n_timesteps + 1, dtype=mu.dtype)
        t_span = 1 - torch.cos(t_span * 0.5 * math.pi)
        x = noise.to(mu.dtype)
        # Upstream advances t by dt and takes the next dt from the schedule minus that running t;
        # kept so that the float32 times equal its own.
        t, dt = t_span[:1], t_span[1] - t_span[0]
        for step in range(1, len(t_span)):
            v = self.estimator(torch.cat([x, x]), torch.cat([mask, mask]), torch.cat([mu, torch.zeros_like(mu)]),
                               torch.cat([t, t]), torch.cat([spks, torch.zeros_like(spks)]),
                               torch.cat([cond, torch.zeros_like(cond)]))
            v = (1.0 + self.inference_cfg_rate) * v[:1] - self.inference_cfg_rate * v[1:]
            x = x + dt * v
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        return x.float()


class MaskedDiffWithXvec(FlowHead):
    """Upstream's ``MaskedDiffWithXvec`` (the flow of CosyVoice-300M) at inference."""

    cfg: FlowConfig

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__(cfg)
        self.encoder = ConformerEncoder(cfg.encoder)
        self.encoder_proj = nn.Linear(cfg.encoder.output_size, cfg.output_size)
        self.decoder = ConditionalCFM(cfg)
        self.length_regulator = InterpolateRegulator(cfg)

    def encode(self, token: torch.Tensor) -> torch.Tensor:
        """Speech tokens [1, N] -> h [1, 80, N] at token rate (negative ids read as 0, as upstream)."""
        h = self.encoder(self.embed(token))
        return self.encoder_proj(h).transpose(1, 2)

    def mel_lengths(self, n_new_tokens: int, prompt_feat: torch.Tensor) -> tuple[int, int]:
        """(prompt frames, new frames): the prompt mel's own length, and ``int(n / rate * 22050 / 256)``."""
        return int(prompt_feat.shape[1]), self.cfg.mel_frames(n_new_tokens)

    @torch.inference_mode()
    def inference(self, token: torch.Tensor, prompt_token: torch.Tensor, prompt_feat: torch.Tensor,
                  embedding: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Mel [1, 80, T_new] of the new tokens, as upstream's ``inference`` (without its cache).

        ``token`` [1, N] new speech tokens, ``prompt_token`` [1, P] (P may be 0), ``prompt_feat``
        [1, T_prompt, 80] the prompt mel (time-major, as upstream takes it; it conditions the first
        T_prompt frames), ``embedding`` [1, spk_embed_dim], ``noise`` [1, 80, >= T_prompt + T_new]:
        the CFM's start (upstream draws ``randn_like(mu)``; a longer draw is cut to length).
        """
        spks = self.speaker(embedding)
        h = self.encode(torch.cat([prompt_token, token], dim=1))
        mel_len1, mel_len2 = self.mel_lengths(token.shape[1], prompt_feat)
        mu = self.length_regulator.inference(h, prompt_token.shape[1], mel_len1, mel_len2)
        T = mel_len1 + mel_len2
        cond = torch.zeros(1, self.cfg.output_size, T, dtype=mu.dtype)
        cond[:, :, :mel_len1] = prompt_feat.transpose(1, 2)
        mask = torch.ones(1, 1, T, dtype=mu.dtype)
        return self.decoder(mu, mask, spks, cond, noise[:, :, :T])[:, :, mel_len1:]


class FlowEncoderStep(nn.Module):
    """Export wrapper: ``(token [1, N] int64, embedding [1, spk_embed_dim]) -> (h [1, 80, N], spks [1, 80])``,
    h at token rate (the length regulator runs outside the graph, see the module docstring)."""

    def __init__(self, flow: MaskedDiffWithXvec) -> None:
        super().__init__()
        self.flow = flow

    def forward(self, token: torch.Tensor, embedding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Token-rate encoder output and projected speaker embedding."""
        return self.flow.encode(token), self.flow.speaker(embedding)


def regulator_weights(flow: MaskedDiffWithXvec) -> dict[str, np.ndarray]:
    """The length regulator's conv stack as float32 numpy arrays, keyed as the state dict's
    ``length_regulator.model.*`` without that prefix (``0.weight``, ``1.bias``, ...): the input of
    :func:`cosycompile.families.cosyvoice.regulator.regulate`."""
    return {k: v.detach().cpu().float().numpy().copy() for k, v in flow.length_regulator.model.state_dict().items()}
