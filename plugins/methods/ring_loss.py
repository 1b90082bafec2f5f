"""Ring loss on top of Prototypical Networks (the torch half of ``ring``).

Zheng, Pal & Savvides, "Ring loss: Convex Feature Normalization for Face
Recognition", CVPR 2018, arXiv:1803.00130; used as a baseline ("Ring PN",
Table 2) by the SEN paper (Nguyen et al., ECCV 2020).

Ring loss normalises features softly: it adds ``λ/(2m) · sum_i (||z_i|| − R)²``
over the m embeddings of a batch to the primary loss, with the radius R a
learned parameter, so every norm is pulled towards a common value while the
objective stays convex in the features. Ring PN uses the prototypical loss
as the primary loss; the Ring term covers every row of the episode, support
and query. The SEN paper does not state its weight; ours defaults to 0.01.

This module imports torch at the top, so :mod:`fslab_plugins.methods.sen` registers
the class lazily by name. fslab's trainer adds the parameters of a loss that
is an ``nn.Module`` (here R) to the optimiser.
"""

from __future__ import annotations

import torch
from fslab_plugins.methods.sen import check_ring
from torch import nn

from fslab.plugin import LossOutput


def _radius_loaded(module, incompatible_keys):
    """A radius loaded from a checkpoint has been learned: never re-measure it."""
    module.radius_measured = True


class RingProtoNet(nn.Module):
    """``protonet(z) + weight · mean_i (||z_i|| − R)² / 2`` with R learned.

    ``radius``: R's initial value; left unset, R starts at the mean embedding
    norm of the first batch (so the Ring term starts near 0 instead of
    yanking every norm towards an arbitrary value). Pair counts are
    ProtoNet's: the Ring term compares no pairs.
    """

    def __init__(self, *, weight: float = 0.01, radius: float | None = None):
        super().__init__()
        check_ring({"weight": weight, "radius": radius})
        self.weight = weight
        self.radius = nn.Parameter(torch.tensor(float(radius if radius is not None else 1.0)))
        self.radius_measured = radius is not None
        self.register_load_state_dict_post_hook(_radius_loaded)

    def forward(self, z, labels, support=None) -> LossOutput:
        from fslab_plugins.methods.protonet import prototypical as prototypical_loss

        prototypical = prototypical_loss(z, labels, support, name="ring")
        norms = z.norm(dim=1)
        if not self.radius_measured:
            with torch.no_grad():
                self.radius.copy_(norms.detach().mean().to(self.radius.dtype))
            self.radius_measured = True
        ring = (norms - self.radius.to(z.dtype)).pow(2).mean() / 2
        extra = {"radius": self.radius.detach(), "ring_loss": ring.detach()}
        return LossOutput(prototypical.loss + self.weight * ring, prototypical.positives, prototypical.negatives, extra)
