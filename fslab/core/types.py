"""Small value types shared by the core and plugins (no torch import here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional, Sequence


class LossOutput(NamedTuple):
    """What every loss returns.

    ``positives`` / ``negatives`` count the embedding pairs whose distance reaches
    the loss (SPEC §2); ints or 0-d integer tensors (converted only when logged,
    so a GPU step does not wait for them). ``extra`` holds further counters, e.g.
    ``rows_without_positive``.
    """

    loss: Any
    positives: Any
    negatives: Any
    extra: Optional[dict] = None


class Batch(NamedTuple):
    """One training batch drawn by a sampler: dataset indices, and for episodic
    samplers which rows are support (True) and which are query (False)."""

    indices: Sequence[int]
    support: Optional[Sequence[bool]] = None


@dataclass
class Split:
    """One split of a dataset held in memory: uint8 images ``[N, C, H, W]``,
    int64 labels ``[N]`` numbered 0..len(classes)-1, and the class names."""

    images: Any
    labels: Any
    classes: list = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.labels.shape[0])
