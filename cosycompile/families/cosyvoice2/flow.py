"""CosyVoice2's flow: tokens -> mel with an upsampling encoder and conditional flow matching.

``CausalMaskedDiffWithXvec`` keeps upstream's keys: ``input_embedding``, ``spk_embed_affine_layer``,
``encoder.*``, ``encoder_proj``, ``decoder.estimator.*``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cosycompile.families.flow_head import FlowHead

from .config import FlowConfig
from .flow_decoder import CausalConditionalDecoder
from .flow_encoder import UpsampleConformerEncoder


class CausalConditionalCFM(nn.Module):
    """Euler solver on a cosine schedule from fixed noise, with classifier-free guidance (batch 2)."""

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.inference_cfg_rate = cfg.inference_cfg_rate
        self.n_timesteps = cfg.n_timesteps
        self.estimator = CausalConditionalDecoder(cfg.estimator_in_channels, cfg.output_size, cfg.channels,
                                                  cfg.attention_head_dim, cfg.n_blocks, cfg.num_mid_blocks,
                                                  cfg.num_heads, cfg.static_chunk_size)
        # Upstream draws this once with seed 0 (noise_seed) and never saves it; every run starts from the
        # same noise.
        gen = torch.Generator().manual_seed(cfg.noise_seed)
        self.rand_noise = torch.randn(1, cfg.output_size, cfg.noise_frames, generator=gen)

    @torch.inference_mode()
    def forward(self, mu: torch.Tensor, mask: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor,
                streaming: bool = False) -> torch.Tensor:
        """Mel [1, 80, T] from the encoder output ``mu`` [1, 80, T], speaker ``spks`` [1, 80], prompt ``cond``."""
        T = mu.shape[2]
        x = self.rand_noise[:, :, :T].to(mu.dtype)
        t_span = 1 - torch.cos(torch.linspace(0, 1, self.n_timesteps + 1) * 0.5 * math.pi)
        t, dt = t_span[0], t_span[1] - t_span[0]
        zeros = torch.zeros_like
        for step in range(1, len(t_span)):
            v = self.estimator(torch.cat([x, x]), torch.cat([mask, mask]), torch.cat([mu, zeros(mu)]),
                               torch.stack([t, t]), torch.cat([spks, zeros(spks)]), torch.cat([cond, zeros(cond)]),
                               streaming=streaming)
            v = (1.0 + self.inference_cfg_rate) * v[:1] - self.inference_cfg_rate * v[1:]
            x = x + dt * v
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        return x


class CausalMaskedDiffWithXvec(FlowHead):
    """Upstream's ``CausalMaskedDiffWithXvec`` (the flow of CosyVoice2) at inference."""

    cfg: FlowConfig

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__(cfg)
        self.encoder = UpsampleConformerEncoder(cfg.input_size, cfg.encoder_size, cfg.attention_heads,
                                                cfg.linear_units, cfg.num_blocks, cfg.num_up_blocks,
                                                cfg.pre_lookahead_len, cfg.up_stride, cfg.encoder_chunk_size)
        self.encoder_proj = nn.Linear(cfg.encoder_size, cfg.output_size)
        self.decoder = CausalConditionalCFM(cfg)

    def encode(self, token: torch.Tensor, embedding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mu [1, 80, 2N], spks [1, 80]) for all tokens (prompt + new), finalized (no look-ahead context)."""
        spks = self.speaker(embedding)
        h = self.encoder(self.embed(token))
        return self.encoder_proj(h).transpose(1, 2), spks

    @torch.inference_mode()
    def inference(self, token: torch.Tensor, prompt_token: torch.Tensor, prompt_feat: torch.Tensor,
                  embedding: torch.Tensor, finalize: bool = True, streaming: bool = False) -> torch.Tensor:
        """Mel [1, 80, T_new] of the new tokens, as upstream's ``flow.inference``.

        ``prompt_feat`` is the prompt mel [1, T_prompt, 80] (time-major, as upstream passes it);
        it conditions the first T_prompt frames. Unless ``finalize``, the last
        ``pre_lookahead_len`` tokens only serve as look-ahead and produce no frames yet.
        """
        spks = self.speaker(embedding)
        x = self.embed(torch.cat([prompt_token, token], dim=1))
        if finalize:
            h = self.encoder(x, streaming=streaming)
        else:
            n = self.cfg.pre_lookahead_len
            h = self.encoder(x[:, :-n], context=x[:, -n:], streaming=streaming)
        mu = self.encoder_proj(h).transpose(1, 2)
        n_prompt = prompt_feat.shape[1]
        cond = torch.zeros_like(mu)
        cond[:, :, :n_prompt] = prompt_feat.transpose(1, 2)
        mask = torch.ones(1, 1, mu.shape[2], dtype=mu.dtype)
        return self.decoder(mu, mask, spks, cond, streaming=streaming)[:, :, n_prompt:]


class FlowEncoderStep(nn.Module):
    """Export wrapper: ``(token [1,N] int64, embedding [1,192]) -> (mu [1,80,2N], spks [1,80])``."""

    # The graph dims whose guards torch.export proves only from 2 (stages.common.export_program):
    # the encoder's ``(2n - 1) % n != 0`` on tokens.
    export_from_two = ("tokens",)

    def __init__(self, flow: CausalMaskedDiffWithXvec) -> None:
        super().__init__()
        self.flow = flow

    def forward(self, token: torch.Tensor, embedding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.flow.encode(token, embedding)
