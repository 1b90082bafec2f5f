"""Wide Residual Network backbone (WRN-28-10).

Zagoruyko & Komodakis, "Wide Residual Networks", BMVC 2016, arXiv:1605.07146;
the embedding network of the SEN paper's WRN results (Nguyen et al., "SEN: A
Novel Feature Normalization Dissimilarity Measure for Prototypical Few-Shot
Learning Networks", ECCV 2020, Table 1 "WRN PN" / "SEN WRN PN").

A wide ResNet trades depth for width: three groups of pre-activation residual
blocks (BN, ReLU, 3×3 conv, twice), each group k times wider than the original
ResNet's (160, 320, 640 channels for k = 10), so that a 28-layer network is as
accurate as a much deeper thin one and faster to train. Depth 28 means
(28 − 4) / 6 = 4 blocks per group. The features are the global average of the
last group's output after a final BN and ReLU (640 values).

The network lives in :mod:`fslab_plugins.backbones.networks` and is registered lazily by
name, so listing plugins does not import torch.
"""

from __future__ import annotations

from fslab_plugins.backbones.shapes import check_wrn

from fslab.plugin import at_least, between, hookimpl

PAPER = (
    "Zagoruyko & Komodakis, Wide Residual Networks, BMVC 2016 (arXiv:1605.07146); "
    "used by the SEN paper (Nguyen et al., ECCV 2020)"
)


@hookimpl
def register_backbones(register):
    register(
        "fslab_plugins.backbones.networks:WideResNet",
        name="wrn28-10",
        description="Wide ResNet 28-10: 3 groups of 4 pre-activation blocks, widths 160-320-640; "
                    "dropout off by default.",
        paper=PAPER,
        params={"depth": 28, "widen_factor": 10, "dropout": 0.0},
        allowed={"widen_factor": at_least(1), "dropout": between(0, 1)},
        check=check_wrn,
    )
