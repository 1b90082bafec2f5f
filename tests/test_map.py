"""mAP-SSVM / mAP-DLM: the loss-augmented dynamic programme against brute force
over every interleaving, the losses against a slow per-query reference (value and
gradient), and pair counts."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from fslab_plugins.methods.map import loss_augmented_ranking, map_dlm, map_ssvm

from fslab.core.errors import UsageError

# -- brute force: rankings as sequences of ('p', k) / ('n', j) ------------------------


def objective(pos, neg, order, ap_weight):
    """F(y) + ap_weight · AP(y) for a full ranking, straight from the definitions."""
    P, N = len(pos), len(neg)
    rank = {item: r for r, item in enumerate(order)}
    score = sum((1 if rank[("p", k)] < rank[("n", j)] else -1) * (pos[k] - neg[j])
                for k in range(P) for j in range(N)) / (P * N)
    hits, ap = 0, 0.0
    for r, (kind, _) in enumerate(order):
        if kind == "p":
            hits += 1
            ap += hits / (r + 1)
    return score + ap_weight * ap / P


def interleavings(P, N):
    """Every merge of the sorted positives and sorted negatives."""
    for slots in itertools.combinations(range(P + N), P):
        k = j = 0
        order = []
        for r in range(P + N):
            if r in slots:
                order.append(("p", k))
                k += 1
            else:
                order.append(("n", j))
                j += 1
        yield order


def order_from_dp(negatives_above, P, N):
    order, placed = [], 0
    for k in range(P):
        order += [("n", j) for j in range(placed, negatives_above[k])] + [("p", k)]
        placed = negatives_above[k]
    return order + [("n", j) for j in range(placed, N)]


def random_case(rng, ties):
    P, N = rng.randint(1, 5), rng.randint(1, 5)
    draw = (lambda: rng.choice([-0.5, 0.0, 0.5])) if ties else (lambda: rng.uniform(-1, 1))
    return sorted((draw() for _ in range(P)), reverse=True), sorted((draw() for _ in range(N)), reverse=True)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("ap_weight", [-1.0, -10.0, 1.0, -0.05])  # SSVM, DLM ±eps, near-standard inference
def test_dynamic_programme_equals_brute_force_over_every_interleaving(ap_weight, ties):
    rng = random.Random(f"{ap_weight}-{ties}")
    cases = [random_case(rng, ties) for _ in range(300)]
    # all 300 cases in one call: queries of different sizes share one padded grid
    most_pos, most_neg = 5, 5
    pos = torch.full((len(cases), most_pos), 9.0, dtype=torch.float64)
    neg = torch.full((len(cases), most_neg), -9.0, dtype=torch.float64)
    for q, (p, n) in enumerate(cases):
        pos[q, : len(p)] = torch.tensor(p, dtype=torch.float64)
        neg[q, : len(n)] = torch.tensor(n, dtype=torch.float64)
    counts = [torch.tensor([len(p) for p, _ in cases]), torch.tensor([len(n) for _, n in cases])]
    above = loss_augmented_ranking(pos, counts[0], neg, counts[1], ap_weight).tolist()

    unique_checked = 0
    for q, (p, n) in enumerate(cases):
        values = sorted(((objective(p, n, order, ap_weight), order) for order in interleavings(len(p), len(n))),
                        key=lambda item: -item[0])
        ours = order_from_dp(above[q], len(p), len(n))
        assert objective(p, n, ours, ap_weight) == pytest.approx(values[0][0], abs=1e-12), (p, n)
        if len(values) == 1 or values[0][0] - values[1][0] > 1e-9:  # a unique optimum: same ranking
            assert ours == values[0][1], (p, n)
            unique_checked += 1
        assert above[q][len(p):] == [0] * (most_pos - len(p))
    assert unique_checked > (100 if ties else 250)


def test_optimum_over_all_permutations_is_an_interleaving_of_the_sorted_lists():
    """The premise of the programme: nothing beats the best sorted interleaving."""
    rng = random.Random(1)
    for _ in range(40):
        P, N = rng.randint(1, 3), rng.randint(1, 3)
        pos = sorted((rng.uniform(-1, 1) for _ in range(P)), reverse=True)
        neg = sorted((rng.uniform(-1, 1) for _ in range(N)), reverse=True)
        items = [("p", k) for k in range(P)] + [("n", j) for j in range(N)]
        best_any = max(objective(pos, neg, list(order), -1.0) for order in itertools.permutations(items))
        best_merge = max(objective(pos, neg, order, -1.0) for order in interleavings(P, N))
        assert best_any == pytest.approx(best_merge, abs=1e-12)


# -- the losses against a per-query reference --------------------------------------


def map_reference(z, labels, method, alpha=10.0, eps=1.0, update="positive"):
    """One query at a time: brute-force loss-augmented inference, then the
    surrogate whose gradient is alpha·∇F(y_direct) − ∇F(y_GT or y_w), averaged."""
    labels = labels.tolist()
    unit = [row / row.norm() for row in z]
    if method == "ssvm":
        ap_weight = -1.0
    else:
        ap_weight = -eps if update == "positive" else eps
    terms, aps = [], []
    for i in range(len(labels)):
        pos_rows = [k for k in range(len(labels)) if k != i and labels[k] == labels[i]]
        neg_rows = [j for j in range(len(labels)) if labels[j] != labels[i]]
        if not pos_rows or not neg_rows:
            continue
        phi_p = sorted(((unit[i] @ unit[k], k) for k in pos_rows), key=lambda t: -t[0].item())
        phi_n = sorted(((unit[i] @ unit[j], j) for j in neg_rows), key=lambda t: -t[0].item())
        p_vals, n_vals = [v.item() for v, _ in phi_p], [v.item() for v, _ in phi_n]
        best = max(interleavings(len(p_vals), len(n_vals)), key=lambda o: objective(p_vals, n_vals, o, ap_weight))
        rank = {item: r for r, item in enumerate(best)}
        P, N = len(p_vals), len(n_vals)

        def F(y):
            return sum(y(k, j) * (phi_p[k][0] - phi_n[j][0]) for k in range(P) for j in range(N)) / (P * N)

        direct = F(lambda k, j: 1 if rank[("p", k)] < rank[("n", j)] else -1)
        hits, ap_direct = 0, 0.0
        for r, (kind, _) in enumerate(best):
            if kind == "p":
                hits += 1
                ap_direct += hits / (r + 1) / P
        current = F(lambda k, j: 1 if p_vals[k] > n_vals[j] else -1)
        if method == "ssvm":
            terms.append(alpha * direct - F(lambda k, j: 1) + (1 - ap_direct))
        else:
            terms.append((alpha * direct - current) / eps * (1 if update == "positive" else -1))
        # AP of the ranking by score
        ranked = sorted([(v, 1) for v in p_vals] + [(v, 0) for v in n_vals], key=lambda t: (-t[0], t[1]))
        hits, ap = 0, 0.0
        for r, (_, relevant) in enumerate(ranked):
            if relevant:
                hits += 1
                ap += hits / (r + 1) / P
        aps.append(ap)
    return sum(terms) / len(terms), sum(aps) / len(aps)


def small_batch(seed, labels):
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(len(labels), 6, dtype=torch.float64, generator=generator).requires_grad_()
    return z, torch.tensor(labels)


BATCHES = [[0, 0, 0, 1, 1, 2], [0, 0, 1, 1, 2, 2], [3, 3, 3, 3, 5, 5, 5], [0, 1, 0, 1, 0, 1, 9]]


@pytest.mark.parametrize("labels", BATCHES)
@pytest.mark.parametrize("method, params", [
    ("ssvm", {}), ("ssvm", {"alpha": 1.0}),
    ("dlm", {}), ("dlm", {"update": "negative"}), ("dlm", {"eps": 0.1, "alpha": 1.0}),
])
def test_map_losses_match_the_reference_in_value_and_gradient(labels, method, params):
    for seed in range(4):
        z, y = small_batch(seed, labels)
        out = (map_ssvm if method == "ssvm" else map_dlm)(z, y, **params)
        (grad,) = torch.autograd.grad(out.loss, z)
        z_ref = z.detach().clone().requires_grad_()
        value, mean_ap = map_reference(z_ref, y, method, **params)
        (grad_ref,) = torch.autograd.grad(value, z_ref)
        assert torch.allclose(out.loss, value, rtol=1e-9, atol=1e-12)
        assert torch.allclose(grad, grad_ref, rtol=1e-7, atol=1e-10)
        assert float(out.extra["map"]) == pytest.approx(mean_ap, abs=1e-12)


def test_positive_and_negative_dlm_updates_differ():
    z, y = small_batch(0, BATCHES[0])
    assert not torch.allclose(map_dlm(z, y).loss, map_dlm(z, y, update="negative").loss)


def test_a_perfect_ranking_gives_ssvm_only_the_alpha_term():
    """When every query ranks its class first by a wide margin, y_direct = y_GT
    (the AP term cannot pay for a swap), so the gradient is (alpha − 1)·∇F(y_GT)."""
    labels = torch.tensor([0, 0, 0, 1, 1, 1])
    z = torch.tensor([[1.0, 0.0]] * 3 + [[0.0, 1.0]] * 3, dtype=torch.float64) + 0.01 * torch.arange(6.0)[:, None]
    z.requires_grad_()
    out = map_ssvm(z, labels, alpha=1.0)
    (grad,) = torch.autograd.grad(out.loss, z)
    assert out.loss.item() == pytest.approx(0.0, abs=1e-12) and float(out.extra["map"]) == 1.0
    assert torch.allclose(grad, torch.zeros_like(grad), atol=1e-12)


@pytest.mark.parametrize("ways, per_class, positives, negatives", [
    (16, 8, 448, 7_680),  # the mAP recipe's batch: C(8,2)·16 and C(16,2)·64
    (64, 8, 1_792, 129_024),  # NCA paper Sec. 3.3, Table 7 batch
    (3, 4, 18, 48),  # Fig. 1 batch seen non-episodically
])
def test_map_pair_counts_are_every_pair_that_enters_f(ways, per_class, positives, negatives):
    labels = torch.arange(ways).repeat_interleave(per_class)
    z = torch.randn(len(labels), 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = map_ssvm(z, labels)
    assert (int(out.positives), int(out.negatives)) == (positives, negatives)
    assert positives == math.comb(per_class, 2) * ways and negatives == math.comb(ways, 2) * per_class**2
    assert int(out.extra["comparisons"]) == ways * per_class * (per_class - 1) * (ways - 1) * per_class


def test_rows_without_positive_are_left_out_and_counted():
    z, y = small_batch(1, [0, 0, 1, 2, 3])
    out = map_ssvm(z, y)
    assert int(out.extra["rows_without_positive"]) == 3
    # only the two rows of class 0 are queries: their pair, and their 3 negatives each
    assert (int(out.positives), int(out.negatives)) == (1, 6)
    (grad,) = torch.autograd.grad(out.loss, z)
    assert torch.isfinite(grad).all()


def test_batch_without_queries_gives_zero_loss_with_a_graph():
    z, y = small_batch(2, [0, 1, 2])
    out = map_dlm(z, y)
    assert out.loss.item() == 0.0 and out.loss.requires_grad


@pytest.mark.parametrize("loss, name", [(map_dlm, "map-dlm"), (map_ssvm, "map-ssvm")])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_infinite_embeddings_are_refused_in_one_line(loss, name, value):
    """The loss was NaN (a run then blamed the learning rate at its next logged step), while the batch's
    logged mAP, from a ranking of NaN scores, read as a finite number."""
    z, y = small_batch(0, BATCHES[0])
    broken = z.detach().clone()
    broken[[0, 3]] = value
    with pytest.raises(UsageError, match=rf"^{name}: 2 of the batch's {len(z)} embeddings hold NaN or infinite "
                                         rf"values, which no ranking orders; the network gave them"):
        loss(broken.requires_grad_(), y)


@pytest.mark.parametrize("params, message", [({"eps": 0.0}, "eps"), ({"update": "sideways"}, "positive, negative")])
def test_bad_dlm_parameters_are_usage_errors(params, message):
    z, y = small_batch(0, BATCHES[0])
    with pytest.raises(UsageError, match=message):
        map_dlm(z, y, **params)


@pytest.mark.parametrize("name", ["map-ssvm", "map-dlm"])
def test_alpha_at_or_below_zero_is_refused(name, builtin_plugins):
    # loss.alpha=-1 or 0 was accepted and trained: the step then pushes the true ranking's score up without
    # bound (0) or the loss-augmented one the wrong way (< 0)
    import fslab
    from fslab.core.errors import ConfigError

    for alpha in (0.0, -1.0):
        with pytest.raises(ConfigError, match=rf"config key 'loss\.alpha' must be > 0, got {alpha}"):
            fslab.create("loss", name, alpha=alpha)
    assert fslab.create("loss", name, alpha=0.5) is not None
