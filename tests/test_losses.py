"""NCA and ProtoNet losses against slow loop references, and the NCA paper's pair counts (Sec. 3.3, Table 1)."""

from __future__ import annotations

import math
from itertools import combinations

import pytest
import torch
from fslab_plugins.methods.nca import nca
from fslab_plugins.methods.protonet import protonet, resolve_episode_shape

from fslab.core.errors import UsageError

# -- slow references: one Python loop per row, straight from the equations ------


def nca_reference(z, labels, temperature=1.0):
    """NCA paper Eq. 3, averaged over the rows that have a positive."""
    labels = labels.tolist()
    terms = []
    for i in range(len(labels)):
        numerator = denominator = 0.0
        has_positive = False
        for k in range(len(labels)):
            if k == i:
                continue
            similarity = torch.exp(-((z[i] - z[k]) ** 2).sum() / temperature)
            denominator = denominator + similarity
            if labels[k] == labels[i]:
                numerator = numerator + similarity
                has_positive = True
        if has_positive:
            terms.append(-torch.log(numerator / denominator))
    return sum(terms) / len(terms)


def protonet_reference(z, labels, support, distance="euclidean"):
    """Snell Eq. 2: prototypes are support means; mean NLL over queries."""
    labels, support = labels.tolist(), support.tolist()
    classes = sorted({y for y, s in zip(labels, support) if s})
    prototypes = {}
    for c in classes:
        members = [z[i] for i in range(len(labels)) if support[i] and labels[i] == c]
        prototypes[c] = sum(members) / len(members)
    terms = []
    for i in range(len(labels)):
        if support[i]:
            continue
        if distance == "euclidean":
            scores = {c: -((z[i] - p) ** 2).sum() for c, p in prototypes.items()}
        else:
            scores = {c: (z[i] @ p) / (z[i].norm() * p.norm()) for c, p in prototypes.items()}
        log_normaliser = torch.logsumexp(torch.stack([scores[c] for c in classes]), 0)
        terms.append(log_normaliser - scores[labels[i]])
    return sum(terms) / len(terms)


def no_prototype_reference(z, labels, support):
    """NCA paper Eq. 4 (ProtoNet without prototypes): each query against every
    support point. Normalised by the number of queries, like Eq. 2, so that
    the two can be compared (Eq. 4 as printed divides by |Q| + |S|)."""
    labels, support = labels.tolist(), support.tolist()
    terms = []
    for i in range(len(labels)):
        if support[i]:
            continue
        numerator = denominator = 0.0
        for j in range(len(labels)):
            if not support[j]:
                continue
            similarity = torch.exp(-((z[i] - z[j]) ** 2).sum())
            denominator = denominator + similarity
            if labels[j] == labels[i]:
                numerator = numerator + similarity
        terms.append(-torch.log(numerator / denominator))
    return sum(terms) / len(terms)


def nca_pair_reference(labels):
    """Unordered pairs that reach an NCA loss term, by enumeration."""
    labels = labels.tolist()
    has_positive = [labels.count(y) > 1 for y in labels]
    positives = negatives = 0
    for i, k in combinations(range(len(labels)), 2):
        if labels[i] == labels[k]:
            positives += 1
        elif has_positive[i] or has_positive[k]:
            negatives += 1
    return positives, negatives


# -- NCA -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "classes, per_class, dim, temperature",
    [(3, 4, 8, 1.0), (5, 2, 16, 0.5), (10, 3, 4, 2.0), (2, 7, 32, 0.1)],
)
def test_nca_matches_loop_reference(make_class_batch, classes, per_class, dim, temperature):
    z, labels = make_class_batch(classes, per_class, dim)
    z = (z * 0.4).detach().requires_grad_()  # keep exp() away from underflow in the reference
    out = nca(z, labels, temperature=temperature)
    assert torch.allclose(out.loss, nca_reference(z, labels, temperature), rtol=1e-9, atol=1e-12)
    assert int(out.extra["rows_without_positive"]) == 0


def test_nca_ignores_lone_rows_but_counts_them(torch_seed):
    labels = torch.tensor([0, 0, 1, 2, 3, 3, 3, 9])
    z = (torch.randn(8, 5, dtype=torch.float64) * 0.5).requires_grad_()
    out = nca(z, labels)
    assert int(out.extra["rows_without_positive"]) == 3
    assert torch.allclose(out.loss, nca_reference(z, labels))
    assert (int(out.positives), int(out.negatives)) == nca_pair_reference(labels) == (4, 21)
    out.loss.backward()
    assert torch.isfinite(z.grad).all()


def test_nca_batch_without_any_positive_gives_zero_loss_and_finite_gradients():
    z = torch.randn(4, 3, requires_grad=True)
    out = nca(z, torch.arange(4))
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0 and torch.isfinite(z.grad).all()
    assert (int(out.positives), int(out.negatives), int(out.extra["rows_without_positive"])) == (0, 0, 4)


def test_nca_is_stable_for_far_apart_embeddings():
    # Distances of ~1e4: exp() underflows to 0 without log-sum-exp.
    labels = torch.tensor([0, 0, 1, 1])
    z = (torch.tensor([[0.0], [100.0], [1.0], [-100.0]])).requires_grad_()
    out = nca(z, labels)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(z.grad).all()


@pytest.mark.parametrize(
    "ways, per_class, positives, negatives",
    [
        (3, 4, 18, 48),  # Fig. 1: w=3, n=3, m=1
        (32, 8, 896, 31_744),  # Sec. 4.3: b=256, w=32, n=5, m=3
        (64, 8, 1_792, 129_024),  # Table 7: iid batch of 512, 64 classes × 8
    ],
)
def test_nca_pair_counts_reproduce_spec_table(make_class_batch, ways, per_class, positives, negatives):
    z, labels = make_class_batch(ways, per_class, dim=4)
    out = nca(z, labels)
    assert (int(out.positives), int(out.negatives)) == (positives, negatives)
    # the NCA paper's formula (Sec. 3.3): C(m+n, 2)·w and C(w, 2)·(m+n)².
    assert positives == math.comb(per_class, 2) * ways
    assert negatives == math.comb(ways, 2) * per_class**2
    assert isinstance(out.positives, torch.Tensor) and out.positives.dim() == 0


def test_nca_gradient_reaches_every_row(make_class_batch):
    z, labels = make_class_batch(6, 3)
    nca(z, labels).loss.backward()
    assert torch.isfinite(z.grad).all()
    assert (z.grad.abs().sum(dim=1) > 0).all()


def test_nca_rejects_non_positive_temperature(make_class_batch):
    z, labels = make_class_batch(2, 2)
    with pytest.raises(UsageError, match="temperature"):
        nca(z, labels, temperature=0.0)


# -- ProtoNet --------------------------------------------------------------------


@pytest.mark.parametrize("ways, shots, queries", [(3, 3, 1), (5, 1, 4), (4, 5, 2), (2, 2, 6)])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_protonet_matches_loop_reference(make_episode, ways, shots, queries, distance):
    z, labels, support = make_episode(ways, shots, queries, label_offset=100)
    order = torch.randperm(len(labels))  # rows need not come class by class
    z_, labels_, support_ = z[order], labels[order], support[order]
    out = protonet(z_, labels_, support_, distance=distance)
    expected = protonet_reference(z_, labels_, support_, distance)
    assert torch.allclose(out.loss, expected, rtol=1e-9, atol=1e-12)


def test_protonet_accepts_a_list_mask_like_a_sampler_batch(make_episode):
    z, labels, support = make_episode(3, 2, 2)
    from_list = protonet(z, labels, support.tolist()).loss
    assert torch.allclose(from_list, protonet(z, labels, support).loss)


@pytest.mark.parametrize("ways, queries", [(3, 1), (5, 4), (8, 2)])
def test_one_shot_protonet_equals_no_prototype_loss_of_eq4(make_episode, ways, queries):
    z, labels, support = make_episode(ways, 1, queries)
    out = protonet(z, labels, support)
    assert torch.allclose(out.loss, no_prototype_reference(z, labels, support), rtol=1e-9)


@pytest.mark.parametrize(
    "ways, shots, queries, positives, negatives",
    [(3, 3, 1, 9, 18), (32, 5, 3, 480, 14_880)],
)
def test_protonet_pair_counts_for_named_episodes(make_episode, ways, shots, queries, positives, negatives):
    z, labels, support = make_episode(ways, shots, queries, dim=4)
    out = protonet(z, labels, support)
    assert (int(out.positives), int(out.negatives)) == (positives, negatives)
    assert positives == ways * queries * shots and negatives == ways * (ways - 1) * queries * shots


@pytest.mark.parametrize(
    "shots, per_class, positives, negatives",
    [(5, 16, 1_760, 54_560), (5, 8, 960, 60_480), (5, 32, 2_160, 32_400), (1, 8, 448, 28_224)],
)
def test_protonet_pair_counts_for_batch_512_episodes(make_episode, shots, per_class, positives, negatives):
    ways, shots, queries = resolve_episode_shape(512, 0, shots, 0, per_class)
    z, labels, support = make_episode(ways, shots, queries, dim=4)
    out = protonet(z, labels, support)
    assert (int(out.positives), int(out.negatives)) == (positives, negatives)


def test_protonet_gradient_reaches_every_row(make_episode):
    z, labels, support = make_episode(4, 3, 2)
    protonet(z, labels, support).loss.backward()
    assert torch.isfinite(z.grad).all()
    assert (z.grad.abs().sum(dim=1) > 0).all()


def test_protonet_needs_a_support_mask(make_episode):
    z, labels, _ = make_episode(3, 1, 1)
    with pytest.raises(UsageError, match="episodic sampler"):
        protonet(z, labels, None)


@pytest.mark.parametrize("name", ["protonet", "protonet-noproto", "protonet-nosq", "matchingnet", "sen", "ring",
                                  "lpn"])
def test_each_episodic_loss_called_without_a_support_mask_names_itself_in_one_line(registry, make_episode, name):
    """``loss(z, labels)`` as the Python API calls it: some losses raised Python's TypeError for the missing
    argument, and ring and lpn named protonet, which the user never asked for."""
    z, labels, _ = make_episode(3, 1, 1)
    loss = registry.create("loss", name)
    with pytest.raises(UsageError) as error:
        loss(z, labels)
    assert str(error.value) == f"{name} needs an episodic sampler (one that marks support and query rows), " \
                               f"e.g. sampler 'episodic'"


def test_protonet_rejects_unknown_distance_and_lists_allowed(make_episode):
    z, labels, support = make_episode(3, 1, 1)
    with pytest.raises(UsageError, match="euclidean, cosine"):
        protonet(z, labels, support, distance="manhattan")


def test_protonet_rejects_query_class_without_support(make_episode):
    z, labels, support = make_episode(3, 2, 1)
    labels = labels.clone()
    labels[-1] = 999  # a query whose class has no support row
    with pytest.raises(UsageError, match="no support"):
        protonet(z, labels, support)


def test_losses_are_built_through_the_registry(registry, make_episode):
    z, labels, support = make_episode(3, 2, 2)
    loss = registry.create("loss", "nca", temperature=0.5)
    assert torch.allclose(loss(z, labels, support).loss, nca(z, labels, temperature=0.5).loss)
    assert registry.get("loss", "protonet").info["episodic"] is True
    assert registry.get("loss", "nca").params == {"temperature": 1.0, "pair_fraction": 1.0}


# -- the NCA paper's pair counts (Sec. 3.3, Table 1) for the paper plugins' losses ---------------------------

SPEC_EPISODES = [  # (w, n, m) -> ProtoNet-family positives, negatives
    ((3, 3, 1), 9, 18), ((32, 5, 3), 480, 14_880), ((32, 5, 11), 1_760, 54_560),
    ((64, 5, 3), 960, 60_480), ((16, 5, 27), 2_160, 32_400), ((64, 1, 7), 448, 28_224),
]
SPEC_BATCHES = [((3, 4), 18, 48), ((32, 8), 896, 31_744), ((64, 8), 1_792, 129_024)]  # (classes, per class)


@pytest.mark.parametrize("name", ["protonet-noproto", "matchingnet", "sen", "ring"])
@pytest.mark.parametrize("shape, positives, negatives", SPEC_EPISODES)
def test_protonet_family_pair_counts_match_spec(registry, make_episode, name, shape, positives, negatives):
    z, labels, support = make_episode(*shape, dim=3)
    loss = registry.create("loss", name)
    if isinstance(loss, torch.nn.Module):
        loss = loss.double()
    out = loss(z, labels, support)
    assert (int(out.positives), int(out.negatives)) == (positives, negatives)


@pytest.mark.parametrize("name", ["supcon", "map-ssvm", "map-dlm", "nca"])
@pytest.mark.parametrize("shape, positives, negatives", SPEC_BATCHES)
def test_all_pairs_family_pair_counts_match_spec(registry, make_class_batch, name, shape, positives, negatives):
    z, labels = make_class_batch(*shape, dim=3)
    out = registry.create("loss", name)(z, labels, None)
    assert (int(out.positives), int(out.negatives)) == (positives, negatives)
