"""Triplet and L-PN losses (the torch half of :mod:`fslab_plugins.methods.large_margin`).

Wang et al., "Large Margin Meta-Learning for Few-Shot Classification", 2018,
arXiv:1807.02872, Eq. 1-2 and App. A.3.2. The paper, the defaults and the
recipes are described in :mod:`fslab_plugins.methods.large_margin`, which registers
these classes lazily by name so that listing plugins does not import torch.

Both losses are ``nn.Module``s without parameters: the margin measured on the
first batch is a buffer, so it is saved with the run's checkpoint and a
resumed run keeps it instead of measuring the trained network.
"""

from __future__ import annotations

import torch
from fslab_plugins.methods.large_margin import check_triplet
from torch import nn

from fslab.plugin import LossOutput, UsageError


def sample_triplets(labels, positives: int, negatives: int):
    """Triplets for every row as anchor, drawn from torch's global generator
    on ``labels``' device: up to ``positives`` distinct same-class rows per
    anchor, and for each of them up to ``negatives`` distinct rows of other
    classes (App. A.3.2). Fewer are taken when the batch has fewer.

    Returns ``positive [B, P]``, ``negative [B, P, N]`` (row indices) and
    ``valid [B, P, N]`` (bool; padding slots are False). Fixed shapes keep the
    loss free of host synchronisation.
    """
    rows = labels.shape[0]
    device = labels.device
    eye = torch.eye(rows, dtype=torch.bool, device=device)
    same = (labels[:, None] == labels[None, :]) & ~eye
    other = labels[:, None] != labels[None, :]
    take_pos = max(1, min(positives, rows - 1))
    keys = torch.rand(rows, rows, device=device).masked_fill(~same, float("inf"))
    pos_keys, positive = keys.topk(take_pos, dim=1, largest=False)  # a random subset, without repeats
    pos_valid = torch.isfinite(pos_keys)
    take_neg = max(1, min(negatives, rows - 1))
    keys = torch.rand(rows, take_pos, rows, device=device).masked_fill(~other[:, None, :], float("inf"))
    neg_keys, negative = keys.topk(take_neg, dim=2, largest=False)
    valid = pos_valid[:, :, None] & torch.isfinite(neg_keys)
    return positive, negative, valid


def _margin_loaded(module, incompatible_keys):
    """A margin loaded from a checkpoint was measured on the initial network: keep it."""
    module.margin_measured = True


class TripletLoss(nn.Module):
    """The large-margin triplet term (Eq. 2) on its own.

    ``margin``: the margin m; left unset, it is measured on the first batch the
    loss sees — half the mean L2 norm of its embeddings, which during training
    is the randomly initialised network's (Sec. 3) — and then kept fixed for
    the life of this object (it is not saved in checkpoints: a resumed run
    measures it again on the trained network). ``positives`` and
    ``negatives``: triplets per anchor (App. A.3.2). ``support`` is ignored.

    The loss is the mean hinge over the sampled triplets. Pair counts are the
    distinct unordered pairs that appear in a triplet: (anchor, positive)
    pairs as positives, (anchor, negative) pairs as negatives.
    ``extra`` reports the margin, the triplets and the active (non-zero) ones.
    """

    def __init__(self, *, margin: float | None = None, positives: int = 10, negatives: int = 10):
        check_triplet({"margin": margin, "positives": positives, "negatives": negatives})
        super().__init__()
        self.register_buffer("margin", torch.tensor(float(margin) if margin is not None else 0.0))
        self.margin_measured = margin is not None
        self.positives, self.negatives = positives, negatives
        self.register_load_state_dict_post_hook(_margin_loaded)

    def margin_for(self, z):
        """The fixed margin, measuring it on ``z`` the first time."""
        if not self.margin_measured:
            with torch.no_grad():
                self.margin.copy_(0.5 * z.detach().norm(dim=1).mean())
            self.margin_measured = True
        return self.margin

    def terms(self, z, labels):
        """(loss, pairs used as a symmetric bool [B, B] matrix, extra)."""
        from fslab_plugins.methods.nca import squared_distances

        labels = labels.to(z.device)
        margin = self.margin_for(z)
        positive, negative, valid = sample_triplets(labels, self.positives, self.negatives)
        distances = squared_distances(z, z)
        to_positive = distances.gather(1, positive)  # [B, P]
        to_negative = distances.gather(1, negative.flatten(1)).view_as(negative)  # [B, P, N]
        hinge = (to_positive[:, :, None] - to_negative + margin).clamp(min=0) * valid
        triplets = valid.sum()
        loss = hinge.sum() / triplets.clamp(min=1)

        rows = z.shape[0]
        used = torch.zeros(rows, rows, dtype=torch.long, device=z.device)
        used = used.scatter_add(1, positive, valid.any(dim=2).long())
        used = used.scatter_add(1, negative.flatten(1), valid.flatten(1).long())
        used = (used + used.T) > 0
        extra = {"margin": margin.detach().clone(), "triplets": triplets, "active_triplets": (hinge > 0).sum()}
        return loss, used, extra

    def forward(self, z, labels, support=None) -> LossOutput:
        loss, used, extra = self.terms(z, labels)
        same = labels.to(z.device)[:, None] == labels.to(z.device)[None, :]
        return LossOutput(loss, (used & same).sum() // 2, (used & ~same).sum() // 2, extra)


class LargeMarginProtoNet(nn.Module):
    """L-PN: the prototypical loss plus ``triplet_weight`` (λ, Eq. 1) times the
    triplet term over all rows of the episode, support and query alike
    (App. A.3.2). ``distance`` is ProtoNet's (Euclidean or cosine; the
    triplet term is always squared Euclidean, as in Eq. 2).

    Pair counts are the union of the pairs each term uses: ProtoNet's
    query–support pairs (through the prototypes) and the triplets' pairs.
    """

    def __init__(
        self,
        *,
        triplet_weight: float = 1.0,
        margin: float | None = None,
        positives: int = 10,
        negatives: int = 10,
        distance: str = "euclidean",
    ):
        super().__init__()
        if not triplet_weight >= 0:
            raise UsageError(f"lpn: triplet_weight must be >= 0 (loss.triplet_weight), got {triplet_weight}")
        self.triplet = TripletLoss(margin=margin, positives=positives, negatives=negatives)
        self.triplet_weight = triplet_weight
        self.distance = distance

    def forward(self, z, labels, support=None) -> LossOutput:
        from fslab_plugins.methods.protonet import prototypical as prototypical_loss

        prototypical = prototypical_loss(z, labels, support, self.distance, "lpn")
        support = torch.as_tensor(support, dtype=torch.bool, device=z.device)
        triplet_loss, used, extra = self.triplet.terms(z, labels)
        query_support = (~support)[:, None] & support[None, :]
        used = used | query_support | query_support.T
        labels = labels.to(z.device)
        same = labels[:, None] == labels[None, :]
        loss = prototypical.loss + self.triplet_weight * triplet_loss
        extra = {**extra, "triplet_loss": triplet_loss.detach()}
        return LossOutput(loss, (used & same).sum() // 2, (used & ~same).sum() // 2, extra)
