"""The linear-classifier loss of SimpleShot (the torch half of
:mod:`fslab_plugins.methods.simpleshot`, imported only when the loss is built)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fslab.plugin import LossOutput


class LinearClassifierLoss(nn.Module):
    """Softmax cross-entropy of a linear layer ``out_dim -> num_classes``.

    fslab fills ``out_dim`` (the embedding size) and ``num_classes`` (training
    classes). The logits compare each embedding with learned class weights,
    never with another embedding, so the loss uses no embedding pairs: it
    reports 0 positives and 0 negatives.
    """

    def __init__(self, out_dim: int, num_classes: int, *, bias: bool = True):
        super().__init__()
        self.classifier = nn.Linear(out_dim, num_classes, bias=bias)

    def forward(self, z: torch.Tensor, labels: torch.Tensor, support=None) -> LossOutput:
        loss = F.cross_entropy(self.classifier(z), labels.to(z.device))
        none = torch.zeros((), dtype=torch.long, device=z.device)
        return LossOutput(loss, none, none, None)
