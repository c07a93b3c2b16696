"""The CFM estimator: CosyVoice2's causal 1-D UNet (``CausalConditionalDecoder``).

Keys follow upstream (Matcha-TTS blocks, :mod:`cosycompile.families.matcha_blocks`): ``time_mlp.linear_1``,
``down_blocks.0.1.3.attn1.to_q.weight``, ``mid_blocks.11.0.block1.block.0.weight``, ...
Convolutions are causal (left padding); LayerNorm runs over channels via transposes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cosycompile.families.matcha_blocks import BasicTransformerBlock, SinusoidalPosEmb, TimestepEmbedding


class CausalConv1d(nn.Conv1d):
    """Conv1d that only looks back: left zero padding of kernel_size - 1."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size)
        self.causal_padding = kernel_size - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.causal_padding, 0)))


class Transpose(nn.Module):
    """Swaps two dims inside an ``nn.Sequential`` (keeps upstream's Sequential indices)."""

    def __init__(self, dim0: int, dim1: int) -> None:
        super().__init__()
        self.dim0, self.dim1 = dim0, dim1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(self.dim0, self.dim1)


class CausalBlock1D(nn.Module):
    """Causal conv -> LayerNorm over channels -> Mish, masked before and after."""

    def __init__(self, dim: int, dim_out: int) -> None:
        super().__init__()
        self.block = nn.Sequential(CausalConv1d(dim, dim_out, 3), Transpose(1, 2), nn.LayerNorm(dim_out),
                                   Transpose(1, 2), nn.Mish())

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.block(x * mask) * mask


class CausalResnetBlock1D(nn.Module):
    """Two causal blocks plus the time embedding, with a 1x1 residual conv."""

    def __init__(self, dim: int, dim_out: int, time_emb_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_emb_dim, dim_out))
        self.block1 = CausalBlock1D(dim, dim_out)
        self.block2 = CausalBlock1D(dim_out, dim_out)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.block1(x, mask) + self.mlp(t)[:, :, None]
        h = self.block2(h, mask)
        return h + self.res_conv(x * mask)


def attention_bias(mask: torch.Tensor, chunk: int = 0) -> torch.Tensor:
    """[B,1,T] frame mask -> [B,T,T] additive bias (-1e10 where masked), optionally chunk-causal."""
    T = mask.shape[-1]
    allowed = mask.bool().expand(-1, T, -1)
    if chunk > 0:
        idx = torch.arange(T, device=mask.device)
        limit = (idx // chunk + 1) * chunk
        allowed = allowed & (idx[None, :] < limit[:, None])[None]
    return (1.0 - allowed.float()) * -1.0e10


class CausalConditionalDecoder(nn.Module):
    """estimator(x, mask, mu, t, spks, cond) -> velocity [B, 80, T]."""

    def __init__(self, in_channels: int = 320, out_channels: int = 80, channels: tuple[int, ...] = (256,),
                 attention_head_dim: int = 64, n_blocks: int = 4, num_mid_blocks: int = 12, num_heads: int = 8,
                 static_chunk_size: int = 50) -> None:
        super().__init__()
        self.static_chunk_size = static_chunk_size
        self.time_embeddings = SinusoidalPosEmb(in_channels)
        temb = channels[0] * 4
        self.time_mlp = TimestepEmbedding(in_channels, temb)

        def transformers(dim: int) -> nn.ModuleList:
            return nn.ModuleList(BasicTransformerBlock(dim, num_heads, attention_head_dim) for _ in range(n_blocks))

        self.down_blocks = nn.ModuleList()
        out_ch = in_channels
        for i, ch in enumerate(channels):
            in_ch, out_ch = out_ch, ch
            if i != len(channels) - 1:
                raise NotImplementedError("CosyVoice2's estimator has one channel level (no downsampling)")
            self.down_blocks.append(nn.ModuleList([CausalResnetBlock1D(in_ch, out_ch, temb), transformers(out_ch),
                                                   CausalConv1d(out_ch, out_ch, 3)]))
        self.mid_blocks = nn.ModuleList(
            nn.ModuleList([CausalResnetBlock1D(channels[-1], channels[-1], temb), transformers(channels[-1])])
            for _ in range(num_mid_blocks))
        up_channels = tuple(channels[::-1]) + (channels[0],)
        self.up_blocks = nn.ModuleList()
        for i in range(len(up_channels) - 1):
            in_ch, out_ch = up_channels[i] * 2, up_channels[i + 1]
            self.up_blocks.append(nn.ModuleList([CausalResnetBlock1D(in_ch, out_ch, temb), transformers(out_ch),
                                                 CausalConv1d(out_ch, out_ch, 3)]))
        self.final_block = CausalBlock1D(up_channels[-1], up_channels[-1])
        self.final_proj = nn.Conv1d(up_channels[-1], out_channels, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, spks: torch.Tensor,
                cond: torch.Tensor, streaming: bool = False) -> torch.Tensor:
        t = self.time_mlp(self.time_embeddings(t))
        x = torch.cat([x, mu, spks[:, :, None].expand(-1, -1, x.shape[-1]), cond], dim=1)
        bias = attention_bias(mask, self.static_chunk_size if streaming else 0)
        skips = []
        for resnet, blocks, down in self.down_blocks:
            x = resnet(x, mask, t).transpose(1, 2)
            for blk in blocks:
                x = blk(x, bias)
            x = x.transpose(1, 2)
            skips.append(x)
            x = down(x * mask)
        for resnet, blocks in self.mid_blocks:
            x = resnet(x, mask, t).transpose(1, 2)
            for blk in blocks:
                x = blk(x, bias)
            x = x.transpose(1, 2)
        for resnet, blocks, up in self.up_blocks:
            skip = skips.pop()
            x = torch.cat([x[:, :, : skip.shape[-1]], skip], dim=1)
            x = resnet(x, mask, t).transpose(1, 2)
            for blk in blocks:
                x = blk(x, bias)
            x = up(x.transpose(1, 2) * mask)
        x = self.final_block(x, mask)
        return self.final_proj(x * mask) * mask
