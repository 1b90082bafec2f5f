"""The NCA loss with a learned temperature (NCA paper, Eq. 3, with T trained).

The NCA authors' training script has an ``--optimize-temperature`` option; this
is that loss: the temperature is a parameter of the loss, trained with the
network by the same optimiser (and, like every weight, the same weight decay),
saved in the checkpoint and restored on resume. It is kept as ``log T``, so T
stays positive whatever step the optimiser takes. Each logged training step
records the current T under ``temperature``.

It is a module of its own because a learnable loss is an ``nn.Module``, which
needs torch at import; :mod:`fslab_plugins.methods.nca` registers it as a lazy
target, so listing plugins never imports this file.
"""

from __future__ import annotations

import math

import torch
from fslab_plugins.methods.nca import check_nca, nca
from torch import nn

from fslab.plugin import LossOutput


class LearnedTemperatureNCA(nn.Module):
    """``nca(z, labels, temperature=exp(log_temperature))`` with ``log_temperature``
    a trained parameter started at ``log(temperature)``."""

    def __init__(self, *, temperature: float = 1.0, pair_fraction: float = 1.0) -> None:
        super().__init__()
        check_nca({"temperature": temperature, "pair_fraction": pair_fraction})
        self.pair_fraction = pair_fraction
        self.log_temperature = nn.Parameter(torch.tensor(math.log(temperature)))

    def forward(self, z, labels, support=None) -> LossOutput:
        temperature = self.log_temperature.exp()
        out = nca(z, labels, temperature=temperature.to(z.dtype), pair_fraction=self.pair_fraction)
        return LossOutput(out.loss, out.positives, out.negatives,
                          {**(out.extra or {}), "temperature": temperature.detach()})
