"""Embedding networks (the torch half of the backbone plugins).

This module imports torch, so the plugin modules that register these classes
(:mod:`fslab_plugins.protonet` for Conv4, :mod:`fslab_plugins.resnet12` for
ResNet12) name them lazily as ``"fslab_plugins.networks:Conv4"``; listing
plugins therefore never imports this file.

Both networks end in global average pooling, so they map a batch of any image
size to ``(batch, out_dim)`` features.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fslab.errors import UsageError


class Conv4(nn.Module):
    """Snell et al. (2017)'s four-block embedding: each block is a 3×3
    convolution, batch norm, ReLU and 2×2 max-pool.

    Snell et al. flatten the last feature map (1,600 values on 84×84 images);
    we average it over space instead, so the feature size is ``hidden`` for any
    input size and a 16×16 glyph works as well as an 84×84 photo. Max-pooling
    rounds up (``ceil_mode``) so images smaller than 16×16 do not shrink to
    nothing.
    """

    def __init__(self, in_channels: int, *, hidden: int = 64):
        super().__init__()
        if hidden < 1:
            raise UsageError(f"conv4: hidden must be a positive number of filters, got {hidden}")
        blocks = []
        channels = in_channels
        for _ in range(4):
            blocks += [
                nn.Conv2d(channels, hidden, kernel_size=3, padding=1, bias=False),
                nn.BatchNorm2d(hidden),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2, ceil_mode=True),
            ]
            channels = hidden
        self.blocks = nn.Sequential(*blocks)
        self.out_dim = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x).mean(dim=(2, 3))


class DropBlock(nn.Module):
    """DropBlock (Ghiasi et al., 2018): in training, zero square
    ``block_size``×``block_size`` regions of a feature map instead of single
    units, then rescale so the expected activation is unchanged.

    The seed rate ``gamma`` is chosen so that about ``drop_rate`` of the
    activations end up dropped (Ghiasi et al., Eq. 1).
    """

    def __init__(self, drop_rate: float, block_size: int):
        super().__init__()
        self.drop_rate = drop_rate
        self.block_size = block_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.drop_rate <= 0:
            return x
        height, width = x.shape[-2:]
        block = min(self.block_size, height, width)
        valid = (height - block + 1) * (width - block + 1)
        gamma = self.drop_rate / block**2 * (height * width) / valid
        seeds = (torch.rand_like(x) < gamma).to(x.dtype)
        # Grow each seed into the block around it (blocks are clipped at the
        # border); an even block size yields one extra row and column, cut here.
        dropped = F.max_pool2d(seeds, kernel_size=block, stride=1, padding=block // 2)
        dropped = dropped[..., :height, :width]
        keep = 1.0 - dropped
        return x * keep * (keep.numel() / keep.sum().clamp(min=1.0))


class ResidualStage(nn.Module):
    """One ResNet-12 stage (Lee et al., 2019): three 3×3 conv + BN layers with
    leaky ReLU (slope 0.1), a 1×1 conv + BN shortcut, then 2×2 max-pool."""

    def __init__(self, in_channels: int, out_channels: int, drop: nn.Module | None = None):
        super().__init__()
        layers = []
        channels = in_channels
        for index in range(3):
            layers.append(nn.Conv2d(channels, out_channels, kernel_size=3, padding=1, bias=False))
            layers.append(nn.BatchNorm2d(out_channels))
            if index < 2:  # the third activation comes after the residual sum
                layers.append(nn.LeakyReLU(0.1, inplace=True))
            channels = out_channels
        self.body = nn.Sequential(*layers)
        self.shortcut = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, kernel_size=1, bias=False),
            nn.BatchNorm2d(out_channels),
        )
        self.activation = nn.LeakyReLU(0.1, inplace=True)
        self.pool = nn.MaxPool2d(2, ceil_mode=True)
        self.drop = drop if drop is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation(self.body(x) + self.shortcut(x))
        return self.drop(self.pool(out))


class ResNet12(nn.Module):
    """ResNet-12 as introduced by Lee et al. (2019, MetaOptNet) and used by the
    NCA paper (App. A.4): four residual stages of widths [64, 160, 320, 640],
    then global average pooling, so ``out_dim`` is the last width.

    DropBlock (``drop_rate`` > 0) is applied after the last two stages, as in
    Lee et al.; the NCA paper trains without it, hence the default 0. The rate
    is fixed rather than ramped up during training.
    """

    def __init__(
        self,
        in_channels: int,
        *,
        widths: Sequence[int] = [64, 160, 320, 640],  # a list, as configs spell it; never mutated
        drop_rate: float = 0.0,
        dropblock_size: int = 5,
    ):
        super().__init__()
        widths = [int(w) for w in widths]
        if len(widths) != 4 or min(widths) < 1:
            raise UsageError(f"resnet12: widths must be four positive channel counts, got {widths}")
        if not 0.0 <= drop_rate < 1.0:
            raise UsageError(f"resnet12: drop_rate must be in [0, 1), got {drop_rate}")
        if dropblock_size < 1:
            raise UsageError(f"resnet12: dropblock_size must be >= 1, got {dropblock_size}")
        stages = []
        channels = in_channels
        for index, width in enumerate(widths):
            drop = DropBlock(drop_rate, dropblock_size) if drop_rate > 0 and index >= 2 else None
            stages.append(ResidualStage(channels, width, drop))
            channels = width
        self.stages = nn.Sequential(*stages)
        self.out_dim = widths[-1]
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="leaky_relu", a=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(x).mean(dim=(2, 3))
