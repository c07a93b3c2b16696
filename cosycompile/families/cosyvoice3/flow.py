"""CosyVoice3's flow: speech tokens -> 80-bin mel at twice the token rate, inference only.

Upstream's ``CausalMaskedDiffWithDiT`` has no encoder: tokens are embedded straight to 80 channels,
pass a causal pair of convolutions that peeks ``pre_lookahead_len`` tokens ahead
(``PreLookaheadLayer``), and are repeated ``token_mel_ratio`` times to the mel rate; a conditional
flow-matching solver then integrates the DiT's velocity over 10 Euler steps with classifier-free
guidance. Keys as upstream's ``flow.pt``: ``input_embedding``, ``spk_embed_affine_layer``,
``pre_lookahead_layer.conv{1,2}``, ``decoder.estimator.*``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cosycompile.families.flow_head import FlowHead

from .config import FlowConfig
from .dit import DiT


class PreLookaheadLayer(nn.Module):
    """Residual look-ahead: conv1 reads tokens t..t+L (right-padded), conv2 reads t-2..t (left-padded).

    ``context`` is the next L tokens when the chunk is not the last one (streaming); without it the
    look-ahead reads zeros, as at the end of an utterance.
    """

    def __init__(self, in_channels: int, channels: int, pre_lookahead_len: int = 1) -> None:
        super().__init__()
        self.pre_lookahead_len = pre_lookahead_len
        self.conv1 = nn.Conv1d(in_channels, channels, kernel_size=pre_lookahead_len + 1, stride=1, padding=0)
        self.conv2 = nn.Conv1d(channels, in_channels, kernel_size=3, stride=1, padding=0)

    def forward(self, inputs: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """inputs [B, N, C] (and context [B, L, C]) -> [B, N, C]."""
        h = inputs.transpose(1, 2)
        if context is None or context.shape[1] == 0:
            h = F.pad(h, (0, self.pre_lookahead_len))
        else:
            if context.shape[1] != self.pre_lookahead_len:
                raise ValueError(f"context must hold {self.pre_lookahead_len} tokens, got {context.shape[1]}")
            h = torch.cat([h, context.transpose(1, 2)], dim=2)
        h = F.leaky_relu(self.conv1(h))
        h = self.conv2(F.pad(h, (self.conv2.kernel_size[0] - 1, 0)))
        return h.transpose(1, 2) + inputs


class CausalConditionalCFM(nn.Module):
    """Euler solver on a cosine time schedule from fixed noise, with classifier-free guidance.

    Holds no weights besides the estimator. The noise is upstream's: ``randn(1, 80, 15000)`` drawn
    right after seeding 0, never saved, so every call starts from the same noise prefix.
    """

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.inference_cfg_rate = cfg.inference_cfg_rate
        self.t_scheduler = cfg.t_scheduler
        self.estimator = DiT(cfg.estimator)
        self._noise: torch.Tensor | None = None

    @property
    def rand_noise(self) -> torch.Tensor:
        """The fixed noise [1, 80, noise_frames] (drawn on first use: a meta-device model allocates none)."""
        if self._noise is None:
            gen = torch.Generator().manual_seed(self.cfg.noise_seed)
            self._noise = torch.randn(1, self.cfg.output_size, self.cfg.noise_frames, generator=gen)
        return self._noise

    def t_span(self, n_timesteps: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The n + 1 times of the solver: 0..1, warped by 1 - cos(pi t / 2) when the schedule is cosine."""
        t = torch.linspace(0, 1, n_timesteps + 1, device=device, dtype=dtype)
        return 1 - torch.cos(t * 0.5 * torch.pi) if self.t_scheduler == "cosine" else t

    def solve_euler(self, x: torch.Tensor, t_span: torch.Tensor, mu: torch.Tensor, mask: torch.Tensor,
                    spks: torch.Tensor, cond: torch.Tensor, streaming: bool = False) -> torch.Tensor:
        """Integrate from noise x [1, 80, T]; each step runs the estimator on [conditioned; unconditioned]."""
        t, dt = t_span[0].unsqueeze(0), t_span[1] - t_span[0]
        n_mel = x.shape[1]
        zeros = torch.zeros_like
        # The unconditioned half sees the same x, mask and t with mu, spks and cond zeroed.
        mask_in = torch.cat([mask, mask]).to(spks.dtype)
        mu_in = torch.cat([mu, zeros(mu)]).to(spks.dtype)
        spks_in = torch.cat([spks, zeros(spks)])
        cond_in = torch.cat([cond, zeros(cond)]).to(spks.dtype)
        for step in range(1, len(t_span)):
            x_in = torch.cat([x, x]).to(spks.dtype)
            t_in = t.expand(2).to(spks.dtype)
            v = self.estimator(x_in, mask_in, mu_in, t_in, spks_in, cond_in, streaming=streaming)
            v_cond, v_uncond = v[:1], v[1:]
            x = x + dt * ((1.0 + self.inference_cfg_rate) * v_cond - self.inference_cfg_rate * v_uncond)
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        assert x.shape[1] == n_mel
        return x.float()

    @torch.inference_mode()
    def forward(self, mu: torch.Tensor, mask: torch.Tensor, n_timesteps: int, temperature: float = 1.0,
                spks: torch.Tensor | None = None, cond: torch.Tensor | None = None,
                streaming: bool = False) -> torch.Tensor:
        """Mel [1, 80, T] from token features ``mu`` [1, 80, T], mask [1, 1, T], speaker [1, 80], prompt mel."""
        z = self.rand_noise[:, :, :mu.shape[2]].to(mu.device).to(mu.dtype) * temperature
        return self.solve_euler(z, self.t_span(n_timesteps, mu.device, mu.dtype), mu, mask, spks, cond, streaming)


class CausalMaskedDiffWithDiT(FlowHead):
    """The flow network of CosyVoice3 (only what inference runs)."""

    cfg: FlowConfig

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__(cfg)
        self.output_size = cfg.output_size
        self.token_mel_ratio = cfg.token_mel_ratio
        self.pre_lookahead_len = cfg.pre_lookahead_len
        self.pre_lookahead_layer = PreLookaheadLayer(cfg.input_size, cfg.pre_lookahead_channels, cfg.pre_lookahead_len)
        self.decoder = CausalConditionalCFM(cfg)

    def encode(self, token: torch.Tensor, finalize: bool = True) -> torch.Tensor:
        """Token features at mel rate [1, N' * ratio, 80] from all tokens [1, N] (prompt first).

        Unless ``finalize``, the last ``pre_lookahead_len`` tokens are only look-ahead context
        (N' = N - L); they make frames in a later call.
        """
        h = self.embed(token)
        if finalize:
            h = self.pre_lookahead_layer(h)
        else:
            L = self.pre_lookahead_len
            h = self.pre_lookahead_layer(h[:, :-L], context=h[:, -L:])
        return h.repeat_interleave(self.token_mel_ratio, dim=1)

    @torch.inference_mode()
    def inference(self, token: torch.Tensor, prompt_token: torch.Tensor, prompt_feat: torch.Tensor,
                  embedding: torch.Tensor, streaming: bool = False, finalize: bool = True,
                  n_timesteps: int | None = None) -> torch.Tensor:
        """Mel [1, 80, T_new] of the new tokens, as upstream's ``flow.inference`` computes it.

        ``prompt_feat`` is the prompt mel [1, T_prompt, 80] (time-major, as upstream passes it);
        it conditions the first T_prompt frames and is cut from the output. ``embedding`` is the
        192-d speaker vector, L2-normalised here. Batch 1, all tokens valid (upstream's mask of
        ``token_len`` is then all ones).
        """
        if token.shape[0] != 1:
            raise ValueError("flow inference runs batch 1, as upstream's")
        spks = self.speaker(embedding)
        h = self.encode(torch.cat([prompt_token, token], dim=1), finalize=finalize)
        mel_len1 = prompt_feat.shape[1]
        mel_len2 = h.shape[1] - mel_len1
        conds = torch.zeros(1, mel_len1 + mel_len2, self.output_size, device=h.device, dtype=h.dtype)
        conds[:, :mel_len1] = prompt_feat
        mask = torch.ones(1, 1, mel_len1 + mel_len2, device=h.device, dtype=h.dtype)
        feat = self.decoder(mu=h.transpose(1, 2).contiguous(), mask=mask, spks=spks, cond=conds.transpose(1, 2),
                            n_timesteps=n_timesteps or self.cfg.n_timesteps, streaming=streaming)
        return feat[:, :, mel_len1:].float()



class FlowEncoderStep(nn.Module):
    """Graph wrapper of the token side, finalized: ``(token [1, N] int64, embedding [1, 192]) ->
    (mu [1, 80, ratio * N], spks [1, 80])``; the speaker vector is L2-normalised as in ``inference``."""

    def __init__(self, flow: CausalMaskedDiffWithDiT) -> None:
        super().__init__()
        self.flow = flow

    def forward(self, token: torch.Tensor, embedding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        spks = self.flow.speaker(embedding)
        return self.flow.encode(token).transpose(1, 2).contiguous(), spks
