"""NCA paper extras: pair sub-sampling (Fig. 3), supervised contrastive (App. A.3),
the ProtoNet ablations of App. A.2 and Matching Networks (App. A.7), against
slow references with explicit loops, and their pair counts (NCA paper Sec. 3.3)."""

from __future__ import annotations

import math
from itertools import combinations

import pytest
import torch
from fslab_plugins.methods.nca import nca, pair_mask, supcon
from fslab_plugins.methods.nca_ablations import matchingnet, protonet_noproto, protonet_nosq
from fslab_plugins.methods.protonet import protonet, resolve_episode_shape

from fslab.core.errors import UsageError

from .test_losses import nca_reference, no_prototype_reference


def sq(a, b):
    return ((a - b) ** 2).sum()


def nca_on_elements(elements, labels):
    """Eq. 3 over a list of (embedding, label), averaged over the elements with a positive."""
    terms = []
    for i, (zi, yi) in enumerate(zip(elements, labels)):
        numerator = denominator = 0.0
        for k, (zk, yk) in enumerate(zip(elements, labels)):
            if k != i:
                denominator = denominator + torch.exp(-sq(zi, zk))
                if yk == yi:
                    numerator = numerator + torch.exp(-sq(zi, zk))
        if isinstance(numerator, torch.Tensor):
            terms.append(-torch.log(numerator / denominator))
    return sum(terms) / len(terms)


def nosq_reference(z, labels, support):
    """Eq. 5: NCA over the queries and the class prototypes (Sec. 4.3: "compute the
    NCA on the union of the support and query set, while still computing prototypes
    for the points that would belong to the support set")."""
    labels, support = labels.tolist(), support.tolist()
    classes = sorted({y for y, s in zip(labels, support) if s})
    elements, element_labels = [], []
    for i, y in enumerate(labels):
        if not support[i]:
            elements.append(z[i])
            element_labels.append(y)
    for c in classes:
        members = [z[i] for i in range(len(labels)) if support[i] and labels[i] == c]
        elements.append(sum(members) / len(members))
        element_labels.append(c)
    return nca_on_elements(elements, element_labels)


def matching_reference(z, labels, support, distance):
    """Vinyals et al.: attention a(q, s) = softmax_s(score(q, s)); p(y|q) = sum over class-y support."""
    labels, support = labels.tolist(), support.tolist()
    terms = []
    for i in range(len(labels)):
        if support[i]:
            continue
        scores = {}
        for j in range(len(labels)):
            if support[j]:
                if distance == "euclidean":
                    scores[j] = -sq(z[i], z[j])
                else:
                    scores[j] = (z[i] @ z[j]) / (z[i].norm() * z[j].norm())
        normaliser = sum(torch.exp(s) for s in scores.values())
        p = sum(torch.exp(s) for j, s in scores.items() if labels[j] == labels[i]) / normaliser
        terms.append(-torch.log(p))
    return sum(terms) / len(terms)


def supcon_reference(z, labels, temperature):
    """Khosla et al. 2020, Eq. 2 (L_out): per anchor, mean over positives of -log softmax."""
    unit = [row / row.norm() for row in z]
    labels = labels.tolist()
    anchors = []
    for i in range(len(labels)):
        denominator = sum(torch.exp(unit[i] @ unit[a] / temperature) for a in range(len(labels)) if a != i)
        positives = [p for p in range(len(labels)) if p != i and labels[p] == labels[i]]
        if positives:
            anchors.append(sum(-torch.log(torch.exp(unit[i] @ unit[p] / temperature) / denominator)
                               for p in positives) / len(positives))
    return sum(anchors) / len(anchors)


def shuffled(z, labels, support):
    order = torch.randperm(len(labels))
    return z[order], labels[order], support[order]


# -- Eq. 4 and Matching Networks ------------------------------------------------


@pytest.mark.parametrize("ways, shots, queries", [(3, 3, 1), (5, 2, 3), (4, 5, 2)])
def test_no_prototype_loss_matches_eq4_reference(make_episode, ways, shots, queries):
    z, labels, support = shuffled(*make_episode(ways, shots, queries, label_offset=3))
    out = protonet_noproto(z, labels, support)
    assert torch.allclose(out.loss, no_prototype_reference(z, labels, support), rtol=1e-9)
    # one support point per class: Eq. 4 is ProtoNet (prototype = the point)
    if shots == 1:
        assert torch.allclose(out.loss, protonet(z, labels, support).loss)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("ways, shots, queries", [(3, 3, 1), (5, 4, 2)])
def test_matchingnet_matches_vinyals_reference(make_episode, ways, shots, queries, distance):
    z, labels, support = shuffled(*make_episode(ways, shots, queries))
    out = matchingnet(z, labels, support, distance=distance)
    assert torch.allclose(out.loss, matching_reference(z, labels, support, distance), rtol=1e-9)


def test_euclidean_matchingnet_is_the_no_prototype_ablation(make_episode):
    """App. A.7: at training time Matching Networks is row 6 of Fig. 4."""
    z, labels, support = make_episode(5, 5, 3)
    assert torch.equal(matchingnet(z, labels, support).loss, protonet_noproto(z, labels, support).loss)
    assert not torch.allclose(matchingnet(z, labels, support, distance="cosine").loss,
                              protonet_noproto(z, labels, support).loss)


# -- Eq. 5 -------------------------------------------------------------------------


@pytest.mark.parametrize("ways, shots, queries", [(3, 3, 1), (5, 2, 3), (4, 5, 2), (3, 1, 1)])
def test_no_support_query_loss_matches_eq5_reference(make_episode, ways, shots, queries):
    z, labels, support = shuffled(*make_episode(ways, shots, queries, label_offset=11))
    z = (z * 0.5).detach().requires_grad_()
    out = protonet_nosq(z, labels, support)
    assert torch.allclose(out.loss, nosq_reference(z, labels, support), rtol=1e-9)
    assert int(out.extra["rows_without_positive"]) == 0
    out.loss.backward()
    assert torch.isfinite(z.grad).all() and (z.grad.abs().sum(1) > 0).all()


def test_no_sq_prototype_without_queries_is_a_negative_only(torch_seed):
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    support = torch.tensor([True, True, False, True, False, True, True])  # class 2: no query
    z = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    out = protonet_nosq(z, labels, support)
    assert int(out.extra["rows_without_positive"]) == 1
    assert torch.allclose(out.loss, nosq_reference(z, labels, support))
    out.loss.backward()
    assert torch.isfinite(z.grad).all() and (z.grad[5:].abs().sum() > 0)


def nosq_pairs(ways, shots, queries):
    """Pairs by enumeration: queries are single points, a prototype stands for its
    `shots` support points (footnote 2); a pair of elements counts the product."""
    elements = [(c, 1) for c in range(ways) for _ in range(queries)] + [(c, shots) for c in range(ways)]
    positives = negatives = 0
    for (ca, wa), (cb, wb) in combinations(elements, 2):
        if ca == cb:
            positives += wa * wb
        else:
            negatives += wa * wb
    return positives, negatives


@pytest.mark.parametrize("ways, shots, queries", [(3, 3, 1), (32, 5, 3), (5, 1, 4)])
def test_no_sq_pair_counts(make_episode, ways, shots, queries):
    z, labels, support = make_episode(ways, shots, queries, dim=3)
    out = protonet_nosq(z, labels, support)
    counts = (int(out.positives), int(out.negatives))
    assert counts == nosq_pairs(ways, shots, queries)
    assert counts == (ways * (math.comb(queries, 2) + queries * shots), math.comb(ways, 2) * (shots + queries) ** 2)


def test_ablation_pair_counts_against_the_papers_sec_4_3(make_episode):
    """b=256, w=32, n=5, m=3. Row 6 (no prototypes): the paper's 480 / 14,880.
    Row 7 (no S/Q): the paper gives 576 / 20,170. We get 576 positives but 31,744
    negatives. 20,170 cannot be an exact count: all 32 classes have the same
    composition, so every one of the C(32, 2) = 496 class pairs contributes the
    same number of negative pairs, and 20,170 is not a multiple of 496."""
    z, labels, support = make_episode(32, 5, 3, dim=3)
    row6 = protonet_noproto(z, labels, support)
    assert (int(row6.positives), int(row6.negatives)) == (480, 14_880)
    row7 = protonet_nosq(z, labels, support)
    assert int(row7.positives) == 576
    assert int(row7.negatives) == 31_744 and 31_744 % 496 == 0 and 20_170 % 496 != 0
    # Row 3 (both ablations, Eq. 6) is NCA on the same batch: 896 / 31,744.
    both = nca(z, labels)
    assert (int(both.positives), int(both.negatives)) == (896, 31_744)


@pytest.mark.parametrize(
    "shots, per_class, positives, negatives",
    [(5, 16, 1_760, 54_560), (5, 8, 960, 60_480), (5, 32, 2_160, 32_400), (1, 8, 448, 28_224)],
)
def test_no_prototype_and_matchingnet_counts_equal_protonets_at_batch_512(make_episode, shots, per_class,
                                                                          positives, negatives):
    ways, shots, queries = resolve_episode_shape(512, 0, shots, 0, per_class)
    z, labels, support = make_episode(ways, shots, queries, dim=2)
    for loss in (protonet_noproto, matchingnet):
        out = loss(z, labels, support)
        assert (int(out.positives), int(out.negatives)) == (positives, negatives)


def test_fig1_episode_counts(make_episode):
    """w=3, n=3, m=1: 9 / 18 for Eq. 4 (as ProtoNet)."""
    z, labels, support = make_episode(3, 3, 1)
    out = protonet_noproto(z, labels, support)
    assert (int(out.positives), int(out.negatives)) == (9, 18)


@pytest.mark.parametrize("loss", [protonet_noproto, protonet_nosq, matchingnet])
def test_ablations_need_support_rows(make_episode, loss):
    z, labels, _ = make_episode(3, 2, 2)
    with pytest.raises(UsageError, match="episodic sampler"):
        loss(z, labels, None)


def test_query_without_support_class_is_an_error(make_episode):
    z, labels, support = make_episode(3, 2, 1)
    labels = labels.clone()
    labels[-1] = 999
    with pytest.raises(UsageError, match="no support"):
        protonet_noproto(z, labels, support)


def test_eq6_is_nca_so_its_recipe_uses_nca_on_fixed_batches(registry):
    for name in ("protonet-noproto-nosq", "matchingnet-nosq"):
        recipe = registry.create("method", name)
        assert recipe["loss"]["name"] == "nca" and recipe["sampler"]["name"] == "fixed"
    assert "protonet-noproto-nosq" not in registry.names("loss")


# -- supervised contrastive ------------------------------------------------------


@pytest.mark.parametrize("classes, per_class, temperature", [(3, 4, 0.1), (5, 2, 0.5), (2, 6, 1.0)])
def test_supcon_matches_khosla_reference(make_class_batch, classes, per_class, temperature):
    z, labels = make_class_batch(classes, per_class)
    out = supcon(z, labels, temperature=temperature)
    assert torch.allclose(out.loss, supcon_reference(z, labels, temperature), rtol=1e-9)
    assert (int(out.positives), int(out.negatives)) == (int(nca(z, labels).positives), int(nca(z, labels).negatives))


def test_supcon_skips_rows_without_positive(torch_seed):
    labels = torch.tensor([0, 0, 1, 2, 2, 2, 7])
    z = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    out = supcon(z, labels)
    assert int(out.extra["rows_without_positive"]) == 2
    assert torch.allclose(out.loss, supcon_reference(z, labels, 0.1))
    out.loss.backward()
    assert torch.isfinite(z.grad).all()


def cosine(a, b) -> float:
    a, b = [float(x) for x in a], [float(x) for x in b]
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def supcon_nca_code_reference(z, labels, temperature):
    """The NCA authors' SupCon (App. A.3), term by term in plain floats: each ordered positive
    pair (i, j), max(cos, 1e-10) / T, only j's negatives in the denominator, the sum over rows."""
    rows, labels = len(labels), labels.tolist()
    cos = [[max(cosine(z[i], z[j]), 1e-10) for j in range(rows)] for i in range(rows)]
    total = 0.0
    for j in range(rows):
        denominator = max(sum(math.exp(cos[k][j] / temperature) for k in range(rows) if labels[k] != labels[j]),
                          1e-10)
        for i in range(rows):
            if i != j and labels[i] == labels[j]:
                ratio = math.exp(cos[i][j] / temperature) / denominator
                if ratio >= 1e-10:
                    total -= math.log(ratio)
    return total / rows


def test_supcon_nca_code_form_by_hand():
    # (1, 0) and (0, 1) of class 0, (1, 1) of class 1, T = 1: cos(0, 1) = 0 is raised to 1e-10 and each
    # negative cosine is 1/sqrt(2); each of the 2 ordered positive pairs gives
    # -log(e^1e-10 / e^(1/sqrt 2)) = 1/sqrt(2) - 1e-10, summed and divided by 3 rows.
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1])
    out = supcon(z, labels, temperature=1.0, form="nca-code")
    assert math.isclose(float(out.loss), 2 * (1 / math.sqrt(2) - 1e-10) / 3, rel_tol=1e-12)
    # Khosla's L_out on the same input: each anchor's one positive against both other rows.
    assert math.isclose(float(supcon(z, labels, temperature=1.0).loss), math.log(1 + math.exp(1 / math.sqrt(2))),
                        rel_tol=1e-12)


@pytest.mark.parametrize("classes, per_class, temperature", [(3, 4, 0.1), (5, 2, 0.5), (2, 6, 1.0)])
def test_supcon_nca_code_form_matches_the_reference(make_class_batch, classes, per_class, temperature):
    z, labels = make_class_batch(classes, per_class)
    z = z.detach().requires_grad_(True)
    out = supcon(z, labels, temperature=temperature, form="nca-code")
    assert math.isclose(out.loss.item(), supcon_nca_code_reference(z.detach(), labels, temperature), rel_tol=1e-9)
    assert (int(out.positives), int(out.negatives)) == (int(nca(z, labels).positives), int(nca(z, labels).negatives))
    out.loss.backward()
    assert torch.isfinite(z.grad).all()


def test_supcon_differs_from_nca_by_the_sum_outside_the_log(make_class_batch):
    z, labels = make_class_batch(3, 4)
    unit = torch.nn.functional.normalize(z, dim=1)
    # On unit vectors -||a-b||²/0.2 = cos/0.1 - 10: the same softmax as SupCon at 0.1. NCA takes
    # -log of the summed positive probabilities, SupCon the mean of -log: NCA < SupCon (Jensen).
    nca_loss, supcon_loss = nca(unit, labels, temperature=0.2).loss, supcon(z, labels, temperature=0.1).loss
    assert nca_loss < supcon_loss - 0.1


# -- NCA pair sub-sampling (Fig. 3) -------------------------------------------------


def nca_masked_reference(z, labels, kept, temperature=1.0):
    labels = labels.tolist()
    terms = []
    for i in range(len(labels)):
        numerator = denominator = 0.0
        for k in range(len(labels)):
            if k != i and kept[i, k]:
                similarity = torch.exp(-sq(z[i], z[k]) / temperature)
                denominator = denominator + similarity
                if labels[k] == labels[i]:
                    numerator = numerator + similarity
        if isinstance(numerator, torch.Tensor):
            terms.append(-torch.log(numerator / denominator))
    return sum(terms) / len(terms)


@pytest.mark.parametrize("fraction", [0.3, 0.7])
def test_pair_fraction_matches_reference_with_the_same_mask(make_class_batch, fraction):
    z, labels = make_class_batch(4, 5)
    z = (z * 0.4).detach().requires_grad_()
    torch.manual_seed(7)
    kept = pair_mask(len(labels), fraction)
    torch.manual_seed(7)
    out = nca(z, labels, pair_fraction=fraction)
    assert torch.equal(kept, kept.T) and not kept.diagonal().any()
    assert torch.allclose(out.loss, nca_masked_reference(z, labels, kept), rtol=1e-9)
    upper = kept.triu(1)
    same = labels[:, None] == labels[None, :]
    assert int(out.positives) == int((upper & same).sum())
    out.loss.backward()
    assert torch.isfinite(z.grad).all()


def test_pair_fraction_keeps_about_that_fraction_and_default_draws_nothing(make_class_batch):
    z, labels = make_class_batch(64, 8, dim=2)
    full = nca(z, labels)
    state = torch.get_rng_state()
    assert torch.equal(nca(z, labels).loss, full.loss)
    assert torch.equal(torch.get_rng_state(), state)  # pair_fraction=1 consumes no randomness
    half = nca(z, labels, pair_fraction=0.5)
    assert abs(int(half.positives) / int(full.positives) - 0.5) < 0.05
    assert abs(int(half.negatives) / int(full.negatives) - 0.5) < 0.02


def test_tiny_pair_fraction_leaves_rows_without_positive_but_stays_finite(make_class_batch):
    z, labels = make_class_batch(3, 3)
    torch.manual_seed(0)
    out = nca(z, labels, pair_fraction=0.05)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(z.grad).all()
    assert int(out.extra["rows_without_positive"]) > 0


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5])
def test_pair_fraction_outside_0_1_is_a_usage_error(make_class_batch, fraction):
    z, labels = make_class_batch(2, 2)
    with pytest.raises(UsageError, match="pair_fraction"):
        nca(z, labels, pair_fraction=fraction)


def test_nca_reference_still_holds_at_full_fraction(make_class_batch):
    z, labels = make_class_batch(3, 3)
    assert torch.allclose(nca(z, labels, pair_fraction=1.0).loss, nca_reference(z, labels))
