"""The CFM estimator of CosyVoice-300M: upstream's non-causal 1-D UNet (``cosyvoice.flow.decoder.ConditionalDecoder``).

Built from Matcha-TTS's blocks (the shared :mod:`cosycompile.families.matcha_blocks` and the
GroupNorm ResNet blocks here), so the keys are upstream's: ``time_mlp.linear_1``,
``down_blocks.0.0.block1.block.1.weight`` (GroupNorm), ``down_blocks.0.1.0.attn1.to_q.weight``,
``down_blocks.0.2.conv.weight`` (the stride-2 downsampling), ``up_blocks.0.2.conv.weight`` (the
transposed-conv upsampling), ``final_block``, ``final_proj``.

Each channel level but the last halves the frames (a stride-2 conv) and its mask (every other
frame); the up path doubles them back and crops to the skip connection, so any T >= 1 works, odd
ones included, and the length is never branched on in Python (T stays dynamic under export).
"""

from __future__ import annotations

import torch
from torch import nn

from cosycompile.families.matcha_blocks import BasicTransformerBlock, SinusoidalPosEmb, TimestepEmbedding

from .config import EstimatorConfig


class Block1D(nn.Module):
    """Conv1d (k3, pad 1), GroupNorm, Mish; the input and output are masked."""

    def __init__(self, dim: int, dim_out: int, groups: int = 8) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Conv1d(dim, dim_out, 3, padding=1), nn.GroupNorm(groups, dim_out), nn.Mish())

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, dim, T], mask [B, 1, T] -> [B, dim_out, T]."""
        return self.block(x * mask) * mask


class ResnetBlock1D(nn.Module):
    """Two Block1Ds with the time embedding added between them, plus a 1x1 residual conv."""

    def __init__(self, dim: int, dim_out: int, time_emb_dim: int, groups: int = 8) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_emb_dim, dim_out))
        self.block1 = Block1D(dim, dim_out, groups)
        self.block2 = Block1D(dim_out, dim_out, groups)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """x [B, dim, T], mask [B, 1, T], t [B, time_emb_dim] -> [B, dim_out, T]."""
        h = self.block1(x, mask) + self.mlp(t)[:, :, None]
        return self.block2(h, mask) + self.res_conv(x * mask)


class Resample1D(nn.Module):
    """One convolution that changes the frame rate, under upstream's key ``conv``: Matcha-TTS's
    ``Downsample1D`` (a stride-2 conv, k3, pad 1: T -> ceil(T / 2)) and ``Upsample1D`` (a transposed
    conv, k4, stride 2, pad 1: T -> 2T)."""

    def __init__(self, conv: nn.Conv1d | nn.ConvTranspose1d) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, dim, T] -> [B, dim, T'] (T' as the conv makes it)."""
        return self.conv(x)


def attention_bias(mask: torch.Tensor) -> torch.Tensor:
    """[B, 1, T] frame mask -> [B, T, T] additive bias: 0 where the key is kept, -1e10 where masked.

    Upstream (``add_optional_chunk_mask`` without chunks, then ``mask_to_bias``) lets an utterance
    whose mask is all zero attend to every frame rather than to none; so does this. The bias is the
    same for every query, and spelled out per query as upstream's is: ONNX Runtime fuses the attention
    into its MultiHeadAttention kernel, which takes a bias of [B, 1, T, T] but not one of [B, 1, 1, T].
    """
    keep = mask > 0
    keep = keep | ~keep.any(dim=-1, keepdim=True)
    return ((1.0 - keep.to(mask.dtype)) * -1.0e10).expand(-1, mask.shape[-1], -1)


class ConditionalDecoder(nn.Module):
    """estimator(x, mask, mu, t, spks, cond) -> velocity [B, 80, T] (upstream's ``ConditionalDecoder``)."""

    def __init__(self, cfg: EstimatorConfig) -> None:
        super().__init__()
        channels = tuple(cfg.channels)
        self.time_embeddings = SinusoidalPosEmb(cfg.in_channels)
        temb = channels[0] * 4
        self.time_mlp = TimestepEmbedding(cfg.in_channels, temb)

        def transformers(dim: int) -> nn.ModuleList:
            return nn.ModuleList(BasicTransformerBlock(dim, cfg.num_heads, cfg.attention_head_dim)
                                 for _ in range(cfg.n_blocks))

        # Every level but the last ends in a stride-2 conv; the last keeps its length (a plain k3 conv).
        self.down_blocks = nn.ModuleList()
        out_ch = cfg.in_channels
        for i, ch in enumerate(channels):
            in_ch, out_ch = out_ch, ch
            last = i == len(channels) - 1
            self.down_blocks.append(nn.ModuleList([
                ResnetBlock1D(in_ch, out_ch, temb), transformers(out_ch),
                nn.Conv1d(out_ch, out_ch, 3, padding=1) if last else Resample1D(nn.Conv1d(out_ch, out_ch, 3, 2, 1))]))
        self.mid_blocks = nn.ModuleList(
            nn.ModuleList([ResnetBlock1D(channels[-1], channels[-1], temb), transformers(channels[-1])])
            for _ in range(cfg.num_mid_blocks))
        # Each up level takes the previous output and the skip (twice the channels); all but the
        # last end in a x2 transposed conv.
        up = channels[::-1] + (channels[0],)
        self.up_blocks = nn.ModuleList()
        for i in range(len(up) - 1):
            last, ch = i == len(up) - 2, up[i + 1]
            self.up_blocks.append(nn.ModuleList([
                ResnetBlock1D(up[i] * 2, ch, temb), transformers(ch),
                nn.Conv1d(ch, ch, 3, padding=1) if last else Resample1D(nn.ConvTranspose1d(ch, ch, 4, 2, 1))]))
        self.final_block = Block1D(up[-1], up[-1])
        self.final_proj = nn.Conv1d(up[-1], cfg.out_channels, 1)

    @staticmethod
    def _attend(blocks: nn.ModuleList, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)
        for blk in blocks:
            x = blk(x, bias)
        return x.transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, spks: torch.Tensor,
                cond: torch.Tensor, streaming: bool = False) -> torch.Tensor:
        """x, mu, cond [B, 80, T], mask [B, 1, T], t [B], spks [B, 80] -> [B, 80, T].

        ``streaming`` is accepted for the CFM's call signature only: this UNet has no chunked mode
        (upstream's ignores the flag too).
        """
        t = self.time_mlp(self.time_embeddings(t).to(t.dtype))
        x = torch.cat([x, mu, spks[:, :, None].expand(-1, -1, x.shape[-1]), cond], dim=1)
        skips: list[torch.Tensor] = []
        masks = [mask]
        for i, (resnet, blocks, down) in enumerate(self.down_blocks):
            m = masks[-1]
            x = self._attend(blocks, resnet(x, m, t), attention_bias(m))
            skips.append(x)
            x = down(x * m)
            # The last level keeps its length; upstream halves its mask too but never reads it (and
            # an unused halving would still make the exporter guard its length).
            if i < len(self.down_blocks) - 1:
                masks.append(m[:, :, ::2])
        m = masks[-1]
        bias = attention_bias(m)
        for resnet, blocks in self.mid_blocks:
            x = self._attend(blocks, resnet(x, m, t), bias)
        for resnet, blocks, upsample in self.up_blocks:
            m = masks.pop()
            skip = skips.pop()
            # The x2 upsampling of ceil(T / 2) frames gives T + 1 for odd T: crop to the skip. By
            # index, not a slice: a slice makes the exporter prove T <= 2 * ceil(T / 2), which it cannot.
            keep = torch.arange(skip.shape[-1], device=x.device)
            x = torch.cat([x.index_select(2, keep), skip], dim=1)
            x = self._attend(blocks, resnet(x, m, t), attention_bias(m))
            x = upsample(x * m)
        x = self.final_block(x, m)
        return self.final_proj(x * m) * mask
