"""ResNet-12 backbone.

Lee, Maji, Ravichandran & Soatto, "Meta-Learning with Differentiable Convex
Optimization" (MetaOptNet), CVPR 2019, arXiv:1904.03758; used with widths
[64, 160, 320, 640] and without DropBlock by the NCA paper (Laenen &
Bertinetto, NeurIPS 2021, App. A.4).

Four residual stages, each three 3×3 convolutions with batch norm and leaky
ReLU (slope 0.1) plus a 1×1 convolution shortcut, then 2×2 max-pooling; the
final feature map is averaged over space into a ``widths[-1]`` vector. It has
become the common embedding network of few-shot papers, which makes their
numbers comparable.

The network itself lives in :mod:`fslab_plugins.networks` and is registered
lazily by name, so listing plugins does not import torch.
"""

from __future__ import annotations

from fslab.hookspecs import hookimpl

PAPER = "Lee et al., Meta-Learning with Differentiable Convex Optimization, CVPR 2019 (arXiv:1904.03758)"


@hookimpl
def register_backbones(register):
    register(
        "fslab_plugins.networks:ResNet12",
        name="resnet12",
        description="ResNet-12, widths 64-160-320-640, leaky ReLU, global average pool; DropBlock off by default.",
        paper=PAPER,
        params={"widths": [64, 160, 320, 640], "drop_rate": 0.0, "dropblock_size": 5},
    )
