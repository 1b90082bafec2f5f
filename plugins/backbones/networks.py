"""Embedding networks (the torch half of the backbone plugins).

This module imports torch, so the plugin modules that register these classes
(:mod:`fslab_plugins.methods.protonet` for Conv4, :mod:`fslab_plugins.backbones.resnet12` for the
two ResNet-12s, :mod:`fslab_plugins.backbones.wrn` for WRN-28-10) name them lazily as
``"fslab_plugins.backbones.networks:Conv4"``; listing plugins therefore never imports
this file.

Every network is a :class:`StagedBackbone`: a stem, then a few stages, then
global average pooling, so it maps a batch of any image size to
``(batch, out_dim)`` features. ``features(x, k)`` instead concatenates the
pooled outputs of the last ``k`` stages (the NCA paper's multi-layer
evaluation features, App. A.1); ``stage_dims`` lists each stage's width.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from fslab_plugins.backbones.shapes import check_conv4, check_resnet12, check_resnet12_nca, check_wrn
from torch import nn

from fslab.plugin import UsageError, global_rows, rand_rows, sum_rows


class StagedBackbone(nn.Module):
    """A backbone whose feature maps pass through a sequence of stages.

    Subclasses set ``stage_dims`` (channels of each stage's output) and
    implement :meth:`stage_maps`; training uses ``forward`` (the pooled last
    stage, ``out_dim == stage_dims[-1]``), evaluation may use :meth:`features`.
    """

    stage_dims: list[int]

    def stage_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The output feature map of every stage, first to last."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage_maps(x)[-1].mean(dim=(2, 3))

    def features(self, x: torch.Tensor, stages: int = 1) -> torch.Tensor:
        """Global average pools of the last ``stages`` stage outputs,
        concatenated from the earliest to the last: ``(batch, sum(stage_dims[-stages:]))``.
        ``stages=1`` is ``forward``."""
        if not 1 <= stages <= len(self.stage_dims):
            raise UsageError(
                f"{type(self).__name__} has {len(self.stage_dims)} stages; feature stages must be "
                f"between 1 and {len(self.stage_dims)}, got {stages}"
            )
        maps = self.stage_maps(x)[-stages:]
        return torch.cat([m.mean(dim=(2, 3)) for m in maps], dim=1)


class Conv4(StagedBackbone):
    """Snell et al. (2017)'s four-block embedding: each block is a 3×3
    convolution, batch norm, ReLU and 2×2 max-pool.

    Two heads on the last feature map:

    - ``head="average"`` (fslab's default) averages it over space, so the
      feature size is ``hidden`` for any input size and a 16×16 glyph works as
      well as an 84×84 photo; max-pooling rounds up (``ceil_mode``) so images
      smaller than 16×16 do not shrink to nothing;
    - ``head="flatten"`` is the papers' Conv-4 (Snell et al.; the mAP, SEN and
      L-PN papers train it): pooling rounds down and the last map is
      flattened: 1,600 values on 84×84 images (a 5×5 map), 64 on 28×28 (the
      last pool keeps the top-left 2×2 of a 3×3 map). Its size depends on the
      images, which fslab tells the backbone (``image_size``, (height, width)).

    Each block is a stage; ``stage_dims`` is ``[hidden] * 4``, the last one
    the flattened size with ``head="flatten"`` (earlier stages are averaged).
    """

    def __init__(self, in_channels: int, *, hidden: int = 64, head: str = "average",
                 image_size: tuple[int, int] | None = None):
        super().__init__()
        check_conv4({"hidden": hidden, "head": head})
        self.flatten = head == "flatten"
        blocks = []
        channels = in_channels
        for _ in range(4):
            blocks += [
                nn.Conv2d(channels, hidden, kernel_size=3, padding=1, bias=False),
                nn.BatchNorm2d(hidden),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2, ceil_mode=not self.flatten),
            ]
            channels = hidden
        self.blocks = nn.Sequential(*blocks)  # flat, as checkpoints name it; a stage is 4 layers
        self.out_dim = hidden * flattened_cells(image_size) if self.flatten else hidden
        self.stage_dims = [hidden] * 3 + [self.out_dim]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = self.blocks(x)
        return last.flatten(1) if self.flatten else last.mean(dim=(2, 3))

    def features(self, x: torch.Tensor, stages: int = 1) -> torch.Tensor:
        if not self.flatten:
            return super().features(x, stages)
        if not 1 <= stages <= 4:
            raise UsageError(f"Conv4 has 4 stages; feature stages must be between 1 and 4, got {stages}")
        maps = self.stage_maps(x)[-stages:]
        return torch.cat([m.mean(dim=(2, 3)) for m in maps[:-1]] + [maps[-1].flatten(1)], dim=1)

    def stage_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        maps = []
        for first in range(0, len(self.blocks), 4):
            x = self.blocks[first : first + 4](x)
            maps.append(x)
        return maps


def flattened_cells(image_size: tuple[int, int] | None) -> int:
    """Cells of the last map after four 2×2 poolings that round down."""
    if image_size is None:
        raise UsageError("conv4: head=flatten needs the image size, which fslab gives when it builds the backbone "
                         "(pass image_size=(height, width) when building it yourself)")
    height, width = (int(side) // 16 for side in image_size)
    if height < 1 or width < 1:
        raise UsageError(f"conv4: head=flatten needs images of at least 16×16 (four 2×2 poolings), got "
                         f"{image_size[0]}×{image_size[1]}; use backbone.head=average")
    return height * width


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
        seeds = (rand_rows(x) < gamma).to(x.dtype)  # under --gpus N: as one process would draw them
        # Grow each seed into the block around it (blocks are clipped at the
        # border); an even block size yields one extra row and column, cut here.
        dropped = F.max_pool2d(seeds, kernel_size=block, stride=1, padding=block // 2)
        dropped = dropped[..., :height, :width]
        keep = 1.0 - dropped
        # the rescale counts over the whole batch (the global one under --gpus N)
        units = keep.numel() // keep.shape[0] * global_rows(keep.shape[0])
        return x * keep * (units / sum_rows(keep.sum()).clamp(min=1.0))


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


class ResNet12(StagedBackbone):
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
        check_resnet12({"widths": widths, "drop_rate": drop_rate, "dropblock_size": dropblock_size})
        stages = []
        channels = in_channels
        for index, width in enumerate(widths):
            drop = DropBlock(drop_rate, dropblock_size) if drop_rate > 0 and index >= 2 else None
            stages.append(ResidualStage(channels, width, drop))
            channels = width
        self.stages = nn.Sequential(*stages)
        self.out_dim = widths[-1]
        self.stage_dims = widths
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="leaky_relu", a=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(x).mean(dim=(2, 3))

    def stage_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        maps = []
        for stage in self.stages:
            x = stage(x)
            maps.append(x)
        return maps


def _kaiming_init(network: nn.Module) -> None:
    """He initialisation of every convolution (fan-out, ReLU gain); batch norm
    starts as the identity (weight 1, bias 0), torch's default."""
    for module in network.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")


class BasicBlock(nn.Module):
    """He et al. (2016)'s basic residual block, torchvision's layout: 3×3 conv
    (with the block's stride), BN, ReLU, 3×3 conv, BN, plus a shortcut, then
    ReLU. The shortcut is a strided 1×1 conv + BN when the block changes the
    resolution or the width, the identity otherwise."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(out + shortcut)


class ResNet12NCA(StagedBackbone):
    """The "ResNet-12" that the NCA paper's released code (fiveai/on-episodes-fsl,
    ``src/models/ResNet.py``) actually trains: a torchvision-style ResNet of
    :class:`BasicBlock` s with ``layers`` [1, 1, 2, 1] blocks per stage and
    widths [64, 160, 320, 640]: a stem convolution and ten block convolutions.

    Adapted to small images as in that code: the stem is one 3×3 convolution
    (stride 1) + BN + ReLU with no max-pool, the first stage keeps the
    resolution and each later stage halves it with a stride-2 first block;
    global average pooling at the end. The released code fixes the stem at 64
    channels; here it is ``widths[0]``, which is the same for the default
    widths. Convolutions get He (fan-out) initialisation, as in torchvision.

    Its multi-layer evaluation (App. A.1) concatenates the pooled outputs of
    the last three stages: ``features(x, 3)``, 1,120 values.
    """

    def __init__(
        self,
        in_channels: int,
        *,
        widths: Sequence[int] = [64, 160, 320, 640],  # a list, as configs spell it; never mutated
        layers: Sequence[int] = [1, 1, 2, 1],
    ):
        super().__init__()
        widths, layers = [int(w) for w in widths], [int(n) for n in layers]
        check_resnet12_nca({"widths": widths, "layers": layers})
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True),
        )
        stages, channels = [], widths[0]
        for index, (width, blocks) in enumerate(zip(widths, layers)):
            stride = 1 if index == 0 else 2
            stage = [BasicBlock(channels, width, stride)] + [BasicBlock(width, width) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*stage))
            channels = width
        self.stages = nn.Sequential(*stages)
        self.out_dim = widths[-1]
        self.stage_dims = widths
        _kaiming_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x)).mean(dim=(2, 3))

    def stage_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        maps, x = [], self.stem(x)
        for stage in self.stages:
            x = stage(x)
            maps.append(x)
        return maps


class RowDropout(nn.Module):
    """Dropout: in training, each unit is zeroed with probability ``p`` and the others scaled by
    1 / (1 - ``p``). Its noise comes from ``rand_rows``, so under ``--gpus N`` each process keeps its
    rows of the noise one process draws for the whole batch, and every process draws as much
    (``nn.Dropout`` drew each process's own rows from the same seed: the second half of a batch got
    the first half's units dropped, and a batch split unevenly left the ranks' generators apart)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p <= 0:
            return x
        keep = (rand_rows(x) >= self.p).to(x.dtype)
        return x * keep * (1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}"


class WideBlock(nn.Module):
    """Zagoruyko & Komodakis (2016)'s pre-activation wide block: BN, ReLU,
    3×3 conv (with the block's stride), BN, ReLU, dropout, 3×3 conv, plus the
    input. When the width or resolution changes, the shortcut is a strided 1×1
    conv applied to the activated input (BN + ReLU), as in the authors' code."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, dropout: float):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.relu = nn.ReLU(inplace=True)
        self.dropout = RowDropout(dropout) if dropout > 0 else nn.Identity()  # per row, as --gpus N needs
        self.shortcut = None
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        activated = self.relu(self.bn1(x))
        out = self.conv2(self.dropout(self.relu(self.bn2(self.conv1(activated)))))
        return out + (x if self.shortcut is None else self.shortcut(activated))


class WideResNet(StagedBackbone):
    """Wide Residual Network WRN-``depth``-``widen_factor`` (Zagoruyko &
    Komodakis, "Wide Residual Networks", BMVC 2016, arXiv:1605.07146), the
    embedding network of the SEN paper (Nguyen et al., 2020).

    A 3×3 stem convolution to 16 channels, then three groups ("stages") of
    ``(depth - 4) / 6`` pre-activation :class:`WideBlock` s of widths
    16k, 32k, 64k (160, 320, 640 for k = 10), strides 1, 2, 2, then BN, ReLU
    and global average pooling. WRN-28-10 has 4 blocks per group and, without
    the classifier of the original paper, 36.47M parameters (36.5M with its
    CIFAR-10 classifier). Dropout between the two convolutions of a block is
    off by default.

    For multi-layer features, the last stage's output includes the final BN
    and ReLU (it is what ``forward`` pools); the earlier stages' outputs are
    the raw residual sums, as each next block normalises them itself.
    """

    def __init__(self, in_channels: int, *, depth: int = 28, widen_factor: int = 10, dropout: float = 0.0):
        super().__init__()
        check_wrn({"depth": depth, "widen_factor": widen_factor, "dropout": dropout})
        blocks = (depth - 4) // 6
        widths = [16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        self.stem = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        groups, channels = [], 16
        for width, stride in zip(widths, (1, 2, 2)):
            group = [WideBlock(channels, width, stride, dropout)]
            group += [WideBlock(width, width, 1, dropout) for _ in range(blocks - 1)]
            groups.append(nn.Sequential(*group))
            channels = width
        self.groups = nn.Sequential(*groups)
        self.final = nn.Sequential(nn.BatchNorm2d(channels), nn.ReLU(inplace=True))
        self.out_dim = widths[-1]
        self.stage_dims = widths
        _kaiming_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.final(self.groups(self.stem(x))).mean(dim=(2, 3))

    def stage_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        maps, x = [], self.stem(x)
        for group in self.groups:
            x = group(x)
            maps.append(x)
        maps[-1] = self.final(maps[-1])
        return maps
