"""Large margin (L-PN): triplet sampling as in App. A.3.2, the triplet loss and its
gradient against the paper's Eq. 2 and Eq. 4, the measured margin, and L-PN."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from fslab_plugins.methods.protonet import protonet
from fslab_plugins.methods.triplet_loss import LargeMarginProtoNet, TripletLoss, sample_triplets

from fslab.core.errors import UsageError


def draw(labels, positives=10, negatives=10, seed=0):
    torch.manual_seed(seed)
    positive, negative, valid = sample_triplets(labels, positives, negatives)
    triplets = []
    for a in range(len(labels)):
        for p_slot in range(positive.shape[1]):
            for n_slot in range(negative.shape[2]):
                if valid[a, p_slot, n_slot]:
                    triplets.append((a, int(positive[a, p_slot]), int(negative[a, p_slot, n_slot])))
    return triplets


def triplet_reference(z, triplets, margin):
    """Eq. 2: mean over triplets of [||a − p||² − ||a − n||² + m]_+."""
    terms = [torch.clamp(((z[a] - z[p]) ** 2).sum() - ((z[a] - z[n]) ** 2).sum() + margin, min=0)
             for a, p, n in triplets]
    return sum(terms) / len(terms)


def eq4_gradient(z, triplets, margin):
    """Eq. 4: dL/dz_i = −2|S_s|/N_t (c_s − z_i) − 2|S_d|/N_t (z_i − c_d), with S_s / S_d the
    multisets of points that share an active triplet with i on the 'same' / 'different' side."""
    z = z.detach()
    grad = torch.zeros_like(z)
    same, different = [[] for _ in z], [[] for _ in z]
    for a, p, n in triplets:
        if ((z[a] - z[p]) ** 2).sum() - ((z[a] - z[n]) ** 2).sum() + margin > 0:
            same[a].append(p)
            same[p].append(a)
            different[a].append(n)
            different[n].append(a)
    for i in range(len(z)):
        if same[i]:
            grad[i] -= 2 * len(same[i]) / len(triplets) * (z[same[i]].mean(0) - z[i])
        if different[i]:
            grad[i] -= 2 * len(different[i]) / len(triplets) * (z[i] - z[different[i]].mean(0))
    return grad


def test_triplets_per_anchor_follow_app_a32():
    """Each anchor: 10 distinct positives of its class; each positive: 10 distinct negatives."""
    labels = torch.arange(20).repeat_interleave(20)  # 20 classes × (5 support + 15 query)
    triplets = draw(labels)
    assert len(triplets) == 40_000  # "100 × 20 × 20"
    by_anchor = Counter(a for a, _, _ in triplets)
    assert set(by_anchor.values()) == {100}
    for a in (0, 137, 399):
        mine = [(p, n) for x, p, n in triplets if x == a]
        positives = {p for p, _ in mine}
        assert len(positives) == 10 and a not in positives and all(labels[p] == labels[a] for p in positives)
        for p in positives:
            negatives = [n for q, n in mine if q == p]
            assert len(set(negatives)) == 10 and all(labels[n] != labels[a] for n in negatives)


def test_small_classes_give_fewer_triplets_without_repeats():
    labels = torch.tensor([0, 0, 0, 1, 1, 2])
    triplets = draw(labels)
    assert len(triplets) == len(set(triplets))
    anchor0 = [t for t in triplets if t[0] == 0]
    assert len(anchor0) == 2 * 3  # 2 positives × 3 negatives
    assert not [t for t in triplets if t[0] == 5]  # a lone row anchors nothing


@pytest.mark.parametrize("classes, per_class", [(4, 5), (3, 12), (6, 2)])
def test_triplet_loss_and_gradient_match_eq2_and_eq4(classes, per_class):
    generator = torch.Generator().manual_seed(classes)
    labels = torch.arange(classes).repeat_interleave(per_class)
    z = torch.randn(len(labels), 5, dtype=torch.float64, generator=generator).requires_grad_()
    loss = TripletLoss(margin=1.5)
    torch.manual_seed(3)
    out = loss(z, labels)
    out.loss.backward()
    triplets = draw(labels, seed=3)
    assert torch.allclose(out.loss, triplet_reference(z, triplets, 1.5), rtol=1e-9)
    assert int(out.extra["triplets"]) == len(triplets)
    assert torch.allclose(z.grad, eq4_gradient(z, triplets, 1.5), rtol=1e-7, atol=1e-10)
    pairs = {frozenset((a, p)) for a, p, _ in triplets}, {frozenset((a, n)) for a, _, n in triplets}
    assert (int(out.positives), int(out.negatives)) == (len(pairs[0]), len(pairs[1]))


def test_margin_is_half_the_mean_norm_of_the_first_batch_then_fixed():
    labels = torch.arange(4).repeat_interleave(3)
    first = torch.randn(12, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    loss = TripletLoss()
    loss(first, labels)
    assert float(loss.margin) == pytest.approx(float(0.5 * first.norm(dim=1).mean()))
    loss(first * 10, labels)
    assert float(loss.margin) == pytest.approx(float(0.5 * first.norm(dim=1).mean()))
    restored = TripletLoss()
    restored.load_state_dict(loss.state_dict())  # a resumed run keeps the initial margin
    restored(first * 10, labels)
    assert float(restored.margin) == float(loss.margin)
    assert float(TripletLoss(margin=0.25).margin_for(first)) == 0.25


@pytest.mark.parametrize("params, message", [({"margin": 0.0}, "margin"), ({"positives": 0}, "positives")])
def test_bad_triplet_parameters_are_usage_errors(params, message):
    with pytest.raises(UsageError, match=message):
        TripletLoss(**params)


def test_lpn_is_protonet_plus_lambda_triplet(make_episode):
    z, labels, support = make_episode(5, 3, 4)
    lpn = LargeMarginProtoNet(triplet_weight=0.5, margin=2.0)
    torch.manual_seed(9)
    out = lpn(z, labels, support)
    triplets = draw(labels, seed=9)
    expected = protonet(z, labels, support).loss + 0.5 * triplet_reference(z, triplets, 2.0)
    assert torch.allclose(out.loss, expected, rtol=1e-9)
    # pairs: ProtoNet's query–support pairs united with the triplets' pairs
    labels_, support_ = labels.tolist(), support.tolist()
    used = {frozenset((q, s)) for q in range(len(labels_)) for s in range(len(labels_))
            if not support_[q] and support_[s]}
    used |= {frozenset((a, p)) for a, p, _ in triplets} | {frozenset((a, n)) for a, _, n in triplets}
    positives = sum(1 for pair in used if len({labels_[i] for i in pair}) == 1)
    assert (int(out.positives), int(out.negatives)) == (positives, len(used) - positives)
    assert int(out.positives) > int(protonet(z, labels, support).positives)


def test_lpn_with_zero_weight_is_protonet(make_episode):
    z, labels, support = make_episode(4, 2, 2)
    out = LargeMarginProtoNet(triplet_weight=0.0)(z, labels, support)
    assert torch.allclose(out.loss, protonet(z, labels, support).loss)


def test_lpn_registered_lazily_with_its_defaults(registry):
    component = registry.get("loss", "lpn")
    assert component.info["episodic"] is True and isinstance(component.target, str)
    assert component.params == {"triplet_weight": 1.0, "margin": None, "positives": 10, "negatives": 10,
                                "distance": "euclidean"}
    assert isinstance(registry.create("loss", "lpn"), torch.nn.Module)
    assert registry.get("loss", "triplet").info["episodic"] is False
