"""SEN ProtoNet against a loop reference and the paper's gradient (Eq. 5-8), the
square-root guard, and the Ring-loss baseline."""

from __future__ import annotations

import pytest
import torch
from fslab_plugins.methods.protonet import protonet
from fslab_plugins.methods.ring_loss import RingProtoNet
from fslab_plugins.methods.sen import sen, sen_distances

from fslab.core.errors import UsageError


def prototypes_of(z, labels, support):
    classes = sorted({y for y, s in zip(labels, support) if s})
    out = {}
    for c in classes:
        members = [z[i] for i in range(len(labels)) if support[i] and labels[i] == c]
        out[c] = sum(members) / len(members)
    return out


def d_s(z, c, eps):
    """SEN Eq. 2."""
    return torch.sqrt(((z - c) ** 2).sum() + eps * (z.norm() - c.norm()) ** 2)


def sen_reference(z, labels, support, eps_pos, eps_neg):
    labels, support = labels.tolist(), support.tolist()
    prototypes = prototypes_of(z, labels, support)
    terms = []
    for i in range(len(labels)):
        if support[i]:
            continue
        logits = {c: -d_s(z[i], p, eps_pos if c == labels[i] else eps_neg) for c, p in prototypes.items()}
        terms.append(torch.logsumexp(torch.stack(list(logits.values())), 0) - logits[labels[i]])
    return sum(terms) / len(terms)


@pytest.mark.parametrize("eps_pos, eps_neg", [(1.0, -0.5), (0.5, -1.0), (2.0, 0.0)])
@pytest.mark.parametrize("ways, shots, queries", [(3, 3, 1), (5, 2, 3)])
def test_sen_matches_loop_reference(make_episode, ways, shots, queries, eps_pos, eps_neg):
    z, labels, support = make_episode(ways, shots, queries, label_offset=4)
    order = torch.randperm(len(labels))
    z, labels, support = z[order], labels[order], support[order]
    out = sen(z, labels, support, eps_pos=eps_pos, eps_neg=eps_neg)
    assert torch.allclose(out.loss, sen_reference(z, labels, support, eps_pos, eps_neg), rtol=1e-9)
    pn = protonet(z, labels, support)
    assert (int(out.positives), int(out.negatives)) == (int(pn.positives), int(pn.negatives))


def test_query_gradient_matches_the_papers_eq5_to_eq8(make_episode):
    """dJ/dz_i = −(1 − p*)/d* · v_p(z, c*) − sum_{k'} p_k'/d_k' · v_n(z, c_k') with
    v_p = (c − z) + ε(||c|| − ||z||) z/||z|| and v_n = (z − c) + ε(||z|| − ||c||) z/||z||.
    Prototypes do not depend on query rows, so a query row's gradient is this over |Q|."""
    eps_pos, eps_neg = 1.0, -0.5
    z, labels, support = make_episode(4, 3, 2)
    out = sen(z, labels, support, eps_pos=eps_pos, eps_neg=eps_neg)
    (grad,) = torch.autograd.grad(out.loss, z)
    labels_, support_ = labels.tolist(), support.tolist()
    prototypes = prototypes_of(z.detach(), labels_, support_)
    queries = [i for i, s in enumerate(support_) if not s]
    for i in queries:
        zi = z[i].detach()
        eps = {c: eps_pos if c == labels_[i] else eps_neg for c in prototypes}
        dist = {c: d_s(zi, p, eps[c]) for c, p in prototypes.items()}
        prob = torch.softmax(-torch.stack(list(dist.values())), 0)
        p = dict(zip(prototypes, prob))
        expected = torch.zeros_like(zi)
        for c, proto in prototypes.items():
            if c == labels_[i]:
                v_p = (proto - zi) + eps[c] * (proto.norm() - zi.norm()) * zi / zi.norm()
                expected -= (1 - p[c]) / dist[c] * v_p
            else:
                v_n = (zi - proto) + eps[c] * (zi.norm() - proto.norm()) * zi / zi.norm()
                expected -= p[c] / dist[c] * v_n
        assert torch.allclose(grad[i], expected / len(queries), rtol=1e-7, atol=1e-12)


def test_square_root_is_guarded_where_a_query_sits_on_its_prototype():
    """1-shot, the query equal to its support point: d_s = 0. Unguarded, sqrt's
    derivative at 0 makes the gradient NaN; the loss must stay finite."""
    labels = torch.tensor([0, 0, 1, 1])
    support = torch.tensor([True, False, True, False])
    base = torch.tensor([[1.0, 2.0], [1.0, 2.0], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    z = base.clone().requires_grad_()
    sen(z, labels, support).loss.backward()
    assert torch.isfinite(z.grad).all()

    unguarded = base.clone().requires_grad_()
    query, proto = unguarded[1:2], unguarded[0:1]
    radicand = ((query - proto) ** 2).sum(1) + (query.norm(dim=1) - proto.norm(dim=1)) ** 2
    torch.sqrt(radicand).sum().backward()
    assert not torch.isfinite(unguarded.grad).all()  # what the guard prevents


def test_test_time_distances_use_eps_pos_everywhere():
    query = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
    prototypes = torch.tensor([[0.0, 1.0], [6.0, 8.0]], dtype=torch.float64)
    d = sen_distances(query, prototypes, 1.0)
    assert torch.allclose(d, torch.tensor([[torch.sqrt(torch.tensor(18.0 + 16.0)), (25.0 + 25.0) ** 0.5]],
                                          dtype=torch.float64))


@pytest.mark.parametrize("params, message", [({"eps_pos": 0.0}, "eps_pos"), ({"eps_neg": -1.5}, "eps_neg"),
                                             ({"eps_neg": 0.5}, "eps_neg")])
def test_bad_epsilons_are_usage_errors(make_episode, params, message):
    z, labels, support = make_episode(3, 1, 1)
    with pytest.raises(UsageError, match=message):
        sen(z, labels, support, **params)


# -- Ring loss -----------------------------------------------------------------------


def test_ring_is_protonet_plus_weighted_norm_penalty_with_a_learned_radius(make_episode):
    z, labels, support = make_episode(4, 2, 3)
    ring = RingProtoNet(weight=0.3, radius=2.0).double()
    out = ring(z, labels, support)
    norms = z.norm(dim=1)
    expected = protonet(z, labels, support).loss + 0.3 * ((norms - 2.0) ** 2).mean() / 2
    assert torch.allclose(out.loss, expected, rtol=1e-12)
    out.loss.backward()
    assert ring.radius.grad is not None
    assert float(ring.radius.grad) == pytest.approx(-0.3 * (norms - 2.0).mean().item(), rel=1e-9)
    pn = protonet(z, labels, support)
    assert (int(out.positives), int(out.negatives)) == (int(pn.positives), int(pn.negatives))


def test_ring_radius_starts_at_the_first_batch_mean_norm_and_survives_a_checkpoint(make_episode):
    z, labels, support = make_episode(3, 2, 2)
    ring = RingProtoNet().double()
    ring(z, labels, support)
    assert ring.radius.item() == pytest.approx(z.norm(dim=1).mean().item())
    with torch.no_grad():
        ring.radius.add_(1.0)  # as if trained
    restored = RingProtoNet().double()
    restored.load_state_dict(ring.state_dict())
    restored(z * 5, labels, support)
    assert restored.radius.item() == ring.radius.item()


def test_ring_is_registered_lazily_as_a_module_with_parameters(registry):
    component = registry.get("loss", "ring")
    assert isinstance(component.target, str) and component.info["episodic"] is True
    loss = registry.create("loss", "ring", weight=0.1)
    assert isinstance(loss, torch.nn.Module) and [n for n, _ in loss.named_parameters()] == ["radius"]


def test_the_sen_evaluator_tests_with_the_eps_pos_the_run_trained_with(registry):
    """The sen evaluator's eps_pos was 1 whatever loss.eps_pos the run trained with, so a
    --grid loss.eps_pos=0.5,3 tested every run at 1; unset, it now takes the run's sen loss's."""
    import math

    from fslab_plugins.methods.sen import sen_nearest

    from fslab.training.build import build_evaluator

    # the query [1, 0] against the prototypes [2, 0] (distance² 1, norm gap² 1: 1 + eps) and
    # [-0.25, 0.968...] (norm 1: distance² 2.5, no gap): way 0 below eps 1.5, way 1 above
    support = torch.tensor([[[[2.0, 0.0]], [[-0.25, math.sqrt(1 - 0.25 ** 2)]]]], dtype=torch.float64)
    query = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64).squeeze(1)
    assert [sen_nearest(support, query, eps_pos=e).item() for e in (0.5, 1.0, 3.0)] == [0, 0, 1]

    def picked(section, loss):
        return build_evaluator(registry, section, loss)(support, query).item()

    sen_loss = {"name": "sen", "eps_neg": -0.5}
    assert picked({"name": "sen"}, {**sen_loss, "eps_pos": 3.0}) == 1
    assert picked({"name": "sen"}, {**sen_loss, "eps_pos": 0.5}) == 0
    assert picked({"name": "sen", "eps_pos": 0.5}, {**sen_loss, "eps_pos": 3.0}) == 0  # a number given wins
    assert picked({"name": "sen", "eps_pos": 3.0}, {"name": "protonet", "distance": "euclidean"}) == 1
    assert sen_nearest(support, query, training_loss={"name": "protonet"}).item() == 0  # another loss: 1
    assert registry.get("evaluator", "sen").params == {"eps_pos": None}  # training_loss is fslab's to fill in
