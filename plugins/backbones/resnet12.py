"""ResNet-12 backbones: Lee et al.'s, and the variant the NCA paper's code trains.

Lee, Maji, Ravichandran & Soatto, "Meta-Learning with Differentiable Convex
Optimization" (MetaOptNet), CVPR 2019, arXiv:1904.03758; used with widths
[64, 160, 320, 640] and without DropBlock by the NCA paper (Laenen &
Bertinetto, NeurIPS 2021, App. A.4).

Four residual stages, each three 3×3 convolutions with batch norm and leaky
ReLU (slope 0.1) plus a 1×1 convolution shortcut, then 2×2 max-pooling; the
final feature map is averaged over space into a ``widths[-1]`` vector. It has
become the common embedding network of few-shot papers, which makes their
numbers comparable.

``resnet12-nca`` is what the NCA paper's released code (fiveai/on-episodes-fsl)
calls ResNet-12 and trains for its tables: a torchvision-style BasicBlock ResNet
(two 3×3 convolutions per block, ReLU, strided 1×1 downsample shortcut) with
[1, 1, 2, 1] blocks per stage and the same widths, a 3×3 stem and no max-pool.
Use it to match the paper's published numbers; use ``resnet12`` to compare with
the many papers built on Lee et al.'s network.

The networks themselves live in :mod:`fslab_plugins.backbones.networks` and are
registered lazily by name, so listing plugins does not import torch.
"""

from __future__ import annotations

from fslab_plugins.backbones.shapes import check_resnet12, check_resnet12_nca

from fslab.plugin import at_least, between, hookimpl, listing

PAPER = "Lee et al., Meta-Learning with Differentiable Convex Optimization, CVPR 2019 (arXiv:1904.03758)"
NCA_CODE = ("Laenen & Bertinetto, On Episodes, Prototypical Networks, and Few-Shot Learning, NeurIPS 2021 "
            "(arXiv:2012.09831), released code github.com/fiveai/on-episodes-fsl")


@hookimpl
def register_backbones(register):
    register(
        "fslab_plugins.backbones.networks:ResNet12",
        name="resnet12",
        description="ResNet-12, widths 64-160-320-640, leaky ReLU, global average pool; DropBlock off by default.",
        paper=PAPER,
        params={"widths": [64, 160, 320, 640], "drop_rate": 0.0, "dropblock_size": 5},
        allowed={"widths": listing(at_least(1), nonempty=True), "drop_rate": between(0, 1),
                 "dropblock_size": at_least(1)},
        check=check_resnet12,
    )
    register(
        "fslab_plugins.backbones.networks:ResNet12NCA",
        name="resnet12-nca",
        description="The NCA paper code's ResNet-12: BasicBlock ResNet, blocks [1, 1, 2, 1], widths 64-160-320-640.",
        paper=NCA_CODE,
        params={"widths": [64, 160, 320, 640], "layers": [1, 1, 2, 1]},
        allowed={"widths": listing(at_least(1), nonempty=True), "layers": listing(at_least(1), nonempty=True)},
        check=check_resnet12_nca,
    )
