"""Which features evaluation embeds: the backbone's output, or the pooled
outputs of its last k stages concatenated (``eval.feature_stages``; the NCA
paper's multi-layer features, App. A.1).

:func:`feature_network` gives the module to hand to
:func:`fslab.training.evaluation.extract_features`; the training-feature mean used for
centring is computed through the same module, so it always matches.
"""

from __future__ import annotations

import torch
from torch import nn

from fslab.core.errors import ConfigError


class StageFeatures(nn.Module):
    """``backbone.features(x, stages)`` as a module, so code that calls
    ``module(x)`` (and switches train/eval mode) works unchanged."""

    def __init__(self, backbone: nn.Module, stages: int):
        super().__init__()
        self.backbone = backbone
        self.stages = stages

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone.features(x, self.stages)


def feature_network(backbone: nn.Module, stages: int = 1) -> nn.Module:
    """The backbone itself for ``stages == 1``; otherwise a :class:`StageFeatures`
    wrapper, after checking that the backbone has that many stages."""
    if stages == 1:
        return backbone
    dims = getattr(backbone, "stage_dims", None)
    if not callable(getattr(backbone, "features", None)) or not dims:
        raise ConfigError(
            f"eval.feature_stages={stages} needs a backbone with multi-stage features "
            f"(a features(x, stages) method and stage_dims); {type(backbone).__name__} has none. "
            "Use eval.feature_stages=1."
        )
    if not 1 <= stages <= len(dims):
        raise ConfigError(
            f"eval.feature_stages must be between 1 and {len(dims)} for {type(backbone).__name__} "
            f"(stage widths {list(dims)}), got {stages}"
        )
    return StageFeatures(backbone, stages)


def training_mean(images: torch.Tensor, embed, count: int, seed: int) -> torch.Tensor:
    """The mean feature of ``count`` training ``images`` (all of them when
    ``count`` is 0 or more than there are), drawn with the evaluation ``seed``;
    ``embed`` turns uint8 images into float32 features. Training computes it for
    each validated network and keeps it in the checkpoint; ``fslab eval``
    computes it the same way for a checkpoint that holds none."""
    size = len(images)
    pick = torch.randperm(size, generator=torch.Generator().manual_seed(seed))[:center_count(count, size)]
    return embed(images[pick.to(images.device)]).mean(0)


def center_count(asked: int, size: int) -> int:
    """How many of ``size`` training images the training mean embeds for ``eval.center_images = asked``."""
    return size if asked <= 0 else min(asked, size)
