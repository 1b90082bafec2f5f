"""Few-shot learning by optimising mean Average Precision (mAP-SSVM, mAP-DLM).

Triantafillou, Zemel & Urtasun, "Few-Shot Learning Through an Information
Retrieval Lens", NeurIPS 2017, arXiv:1707.02610 (Sec. 4, App. B).

Every row of a batch acts as a query that ranks all the other rows by cosine
similarity; the rows of its class are relevant, the rest are not. Training
optimises the mean over queries of the ranking's Average Precision, which is
not differentiable, through structured prediction: with the score of a
ranking ``F^i(y) = 1/(|P||N|) sum_{k in P, j in N} y_kj (phi_ik - phi_ij)``
(y_kj = +1 when positive k is ranked above negative j), the gradient is the
difference of ``grad F`` at two rankings — the loss-augmented one, found by
dynamic programming, and the ground truth (structural SVM) or the current
prediction (direct loss minimisation, Song et al. 2016). α > 1 weights the
loss-augmented term (App. B). Queries decompose (App. A), so all queries of
a batch are solved at once.

Loss-augmented inference: ``argmax_y F^i(y) + c·AP(y)`` with c = −1 (SSVM,
maximising F + task loss 1 − AP), −ε (DLM positive update) or +ε (DLM
negative update). The optimum interleaves the positives and the negatives,
each sorted by score, so a dynamic programme over (i positives, j negatives
placed) finds it in O(|P||N|): see :func:`loss_augmented_ranking`. The ranking
is recovered by backtracking from the final cell, not read off the per-cell
decisions (which need not lie on the optimal path).
"""

from __future__ import annotations

import copy

from fslab_plugins.methods.nca import check_pairs

from fslab.plugin import LossOutput, UsageError, at_least, hookimpl, one_of, positive

PAPER = (
    "Triantafillou, Zemel & Urtasun, Few-Shot Learning Through an Information Retrieval Lens, NeurIPS 2017 "
    "(arXiv:1707.02610)"
)
UPDATES = ("positive", "negative")


def loss_augmented_ranking(pos, pos_count, neg, neg_count, ap_weight):
    """Optimal interleaving for ``max F(y) + ap_weight · AP(y)``, per query.

    ``pos [Q, Pm]`` and ``neg [Q, Nm]`` hold each query's positive and
    negative scores sorted in decreasing order, padded (with anything finite)
    beyond ``pos_count [Q]`` / ``neg_count [Q]`` (both ≥ 1). ``ap_weight`` is a
    number or a ``[Q]`` tensor. Returns ``long [Q, Pm]``: how many negatives
    are ranked above each positive (non-decreasing; 0 on padding).

    ``V[i, j]``, the best value with i positives and j negatives placed, obeys
    ``V[i, j] = max(V[i-1, j] + gain of positive i after j negatives,
    V[i, j-1] + gain of negative j after i positives)``. Placing negative j
    after i positives adds ``(sum_{k<=i}(p_k - n_j) - sum_{k>i}(p_k - n_j)) / (P N)``
    to F; placing positive i after j negatives adds ``i / (i + j) / P`` to AP.
    Along a row the recursion is a running maximum, so each row is one
    ``cummax`` over all queries at once; its indices are the backpointers.
    Everything that does not depend on the previous row is computed for all
    rows up front, so a row costs two operations forward and one back: on a
    GPU the programme is bound by how many kernels it launches, not by
    arithmetic.
    """
    import torch

    queries, most_pos = pos.shape
    most_neg = neg.shape[1]
    device, dtype = pos.device, pos.dtype
    P = pos_count.to(dtype)[:, None]
    N = neg_count.to(dtype)[:, None]
    ap_weight = torch.as_tensor(ap_weight, dtype=dtype, device=device).reshape(-1, 1)
    pos = torch.where(torch.arange(most_pos, device=device) < pos_count[:, None], pos, torch.zeros_like(pos))
    neg = torch.where(torch.arange(most_neg, device=device) < neg_count[:, None], neg, torch.zeros_like(neg))
    zero = torch.zeros(queries, 1, dtype=dtype, device=device)
    prefix_pos = torch.cat([zero, pos.cumsum(1)], dim=1)  # S_i, i = 0..Pm
    total_pos = prefix_pos.gather(1, pos_count[:, None])  # S_P
    prefix_neg = torch.cat([zero, neg.cumsum(1)], dim=1)  # sum of the first j negatives, j = 0..Nm
    i = torch.arange(most_pos + 1, device=device, dtype=dtype)[:, None, None]  # [Pm+1, 1, 1]
    j = torch.arange(most_neg + 1, device=device, dtype=dtype)[None, None, :]  # [1, 1, Nm+1]
    # runs[i, q, j] = C_i(j): what placing negatives 1..j after i positives adds to F
    runs = (j * (2 * prefix_pos.T[:, :, None] - total_pos[None]) - (2 * i - P[None]) * prefix_neg[None]) / (P * N)[None]
    # V[i] = C_i + cummax(V[i-1] + A_i - C_i), A_i(j) = what placing positive i after j negatives
    # adds; with best_i = cummax(...), best_i = cummax(best_{i-1} + C_{i-1} + A_i - C_i), best_0 = 0.
    # Only the argmaxes are needed.
    shifted = (ap_weight[None] * i[1:] / (i[1:] + j) / P[None]) + runs[:-1] - runs[1:]  # [Pm, Q, Nm+1]
    backpointers = torch.empty(most_pos, queries, most_neg + 1, dtype=torch.long, device=device)
    best = torch.zeros(queries, most_neg + 1, dtype=dtype, device=device)
    for row in range(most_pos):
        torch.cummax(best + shifted[row], dim=1, out=(best, backpointers[row]))

    # Rows past a query's last positive keep the column, so one gather per row walks every query back.
    columns = torch.arange(most_neg + 1, device=device)
    past_end = torch.arange(1, most_pos + 1, device=device)[:, None] > pos_count[None, :]  # [Pm, Q]
    backpointers = torch.where(past_end[:, :, None], columns, backpointers)
    column = neg_count[:, None].clone()
    negatives_above = torch.empty(most_pos, queries, 1, dtype=torch.long, device=device)
    for row in range(most_pos - 1, -1, -1):
        column = torch.gather(backpointers[row], 1, column, out=negatives_above[row])
    return negatives_above[:, :, 0].T.masked_fill(past_end.T, 0)


def ranking_coefficients(negatives_above, pos_count, neg_count, most_neg, dtype):
    """``F(y) = sum_k a_k p_k + sum_j b_j n_j`` for the ranking described by
    ``negatives_above``; returns ``(a [Q, Pm], b [Q, Nm], ap [Q])`` in
    ``dtype``, zero on padding."""
    import torch

    P = pos_count.to(dtype)[:, None]
    N = neg_count.to(dtype)[:, None]
    k = torch.arange(1, negatives_above.shape[1] + 1, device=negatives_above.device)
    pos_valid = k[None, :] <= pos_count[:, None]
    j = torch.arange(1, most_neg + 1, device=negatives_above.device)
    neg_valid = j[None, :] <= neg_count[:, None]
    # positive k is above negative j iff fewer than j negatives precede it
    above = (negatives_above[:, :, None] < j[None, None, :]) & pos_valid[:, :, None] & neg_valid[:, None, :]
    positives_above = above.sum(dim=1).to(dtype)  # [Q, Nm]
    a = (N - 2 * negatives_above.to(dtype)) / (P * N) * pos_valid
    b = -(2 * positives_above - P) / (P * N) * neg_valid
    ap = (k.to(dtype) / (k + negatives_above).to(dtype) * pos_valid).sum(dim=1) / P[:, 0]
    return a, b, ap


def map_loss(z, labels, *, method: str, alpha: float, eps: float, update: str) -> LossOutput:
    """The shared body of ``map-ssvm`` and ``map-dlm``.

    The returned loss is a surrogate: the rankings are fixed (no gradient flows
    through inference), and with the scores ``phi`` as the only variables its
    gradient is exactly, per query and averaged over the queries that have
    both a positive and a negative,

    - SSVM: ``alpha * grad F(y_direct) - grad F(y_GT)``, y_direct = argmax F + (1 − AP);
    - DLM:  ``±(1/eps) * (alpha * grad F(y_direct) - grad F(y_w))``,
      y_direct = argmax F ± eps (1 − AP), y_w = argmax F (Eq. 3 of the paper).

    The paper sums F over the queries (its Eq. 5); we average, which only
    rescales the step size. The value reported is ``alpha F(y_direct) − F(y_GT)
    + (1 − AP(y_direct))`` for SSVM (the structured hinge when alpha = 1) and
    ``±(alpha F(y_direct) − F(y_w)) / eps`` for DLM.
    """
    import torch
    import torch.nn.functional as F

    check_dlm_values(f"map-{method}", eps, update)
    check_finite(f"map-{method}", z)
    rows = z.shape[0]
    labels = labels.to(z.device)
    unit = F.normalize(z, dim=1)
    scores = unit @ unit.T  # phi(x_i, x_k): cosine similarity
    eye = torch.eye(rows, dtype=torch.bool, device=z.device)
    positive = (labels[:, None] == labels[None, :]) & ~eye
    negative = labels[:, None] != labels[None, :]
    pos_count, neg_count = positive.sum(1), negative.sum(1)
    valid = (pos_count > 0) & (neg_count > 0)
    reaching = valid[:, None] | valid[None, :]
    positives = (positive & reaching).sum() // 2
    negatives = (negative & reaching).sum() // 2
    extra = {"rows_without_positive": rows - valid.sum(), "comparisons": (pos_count * neg_count * valid).sum()}
    if rows < 2 or not bool(valid.any()):
        return LossOutput(z.sum() * 0.0, positives, negatives, {**extra, "map": torch.zeros((), device=z.device)})

    with torch.no_grad():
        detached = scores.detach()
        most_pos, most_neg = int(pos_count.max()), int(neg_count.max())
        pos, pos_index = detached.masked_fill(~positive, float("-inf")).sort(dim=1, descending=True)
        neg, neg_index = detached.masked_fill(~negative, float("-inf")).sort(dim=1, descending=True)
        pos, pos_index = pos[:, :most_pos], pos_index[:, :most_pos]
        neg, neg_index = neg[:, :most_neg], neg_index[:, :most_neg]
        pos_count_, neg_count_ = pos_count.clamp(min=1), neg_count.clamp(min=1)
        if method == "ssvm":
            ap_weight = -1.0
        else:
            ap_weight = -eps if update == "positive" else eps
        above = loss_augmented_ranking(pos, pos_count_, neg, neg_count_, ap_weight)
        a_direct, b_direct, ap_direct = ranking_coefficients(above, pos_count_, neg_count_, most_neg, detached.dtype)
        # the current ranking (y_w): each pair ordered by its scores, ties to the negative
        pos_valid = torch.arange(most_pos, device=z.device)[None, :] < pos_count_[:, None]
        neg_valid = torch.arange(most_neg, device=z.device)[None, :] < neg_count_[:, None]
        pair_valid = pos_valid[:, :, None] & neg_valid[:, None, :]
        order = ((pos[:, :, None] > neg[:, None, :]).to(detached.dtype) * 2 - 1) * pair_valid
        scale = 1.0 / (pos_count_ * neg_count_).to(order.dtype)[:, None]
        a_current = order.sum(2) * scale
        b_current = -order.sum(1) * scale
        current_above = ((order < 0) & pair_valid).sum(2)
        _, _, ap_current = ranking_coefficients(current_above, pos_count_, neg_count_, most_neg, detached.dtype)
        if method == "ssvm":
            a_base = pos_valid.to(detached.dtype) / pos_count_[:, None]
            b_base = -neg_valid.to(detached.dtype) / neg_count_[:, None]
        else:
            a_base, b_base = a_current, b_current
        weights = torch.zeros_like(detached)
        weights = weights.scatter_add(1, pos_index, (alpha * a_direct - a_base).to(weights.dtype))
        weights = weights.scatter_add(1, neg_index, (alpha * b_direct - b_base).to(weights.dtype))
        weights = weights * valid[:, None] / valid.sum()
        extra["map"] = (ap_current * valid).sum() / valid.sum()

    surrogate = (weights * scores).sum()
    if method == "ssvm":
        loss = surrogate + ((1.0 - ap_direct) * valid).sum() / valid.sum()
    else:
        loss = surrogate / eps if update == "positive" else -surrogate / eps
    return LossOutput(loss, positives, negatives, extra)


def check_finite(name: str, z) -> None:
    """NaN or infinite embeddings (a diverged network) refused in one line: their cosine scores rank
    nothing, and the loss was NaN while the logged mAP of the same batch read as a finite number.
    One device sync, as the ranking's sizes already take."""
    import torch

    broken = ~torch.isfinite(z).all(dim=1)
    if bool(broken.any()):
        raise UsageError(f"{name}: {int(broken.sum())} of the batch's {z.shape[0]} embeddings hold NaN or infinite "
                         f"values, which no ranking orders; the network gave them (diverged: try a lower "
                         f"learning rate, --lr), not the loss")


def check_dlm_values(name: str, eps: float, update: str) -> None:
    if not eps > 0:
        raise UsageError(f"{name}: eps must be > 0 (loss.eps), got {eps}")
    if update not in UPDATES:
        raise UsageError(f"{name}: unknown update '{update}' (loss.update). Allowed: {', '.join(UPDATES)}.")


def check_dlm(params: dict, context=None) -> None:
    check_dlm_values("map-dlm", params["eps"], params["update"])
    check_pairs("map-dlm", context)


def check_ssvm(params: dict, context=None) -> None:
    check_pairs("map-ssvm", context)


def map_ssvm(z, labels, support=None, *, alpha: float = 10.0) -> LossOutput:
    """mAP-SSVM: structural SVM on every query's ranking (Algorithm 1, App. B);
    ``support`` is ignored (every row is a query)."""
    return map_loss(z, labels, method="ssvm", alpha=alpha, eps=1.0, update="positive")


def map_dlm(z, labels, support=None, *, alpha: float = 10.0, eps: float = 1.0, update: str = "positive") -> LossOutput:
    """mAP-DLM: direct loss minimisation with the positive or negative update
    (Algorithm 1, App. B); ``support`` is ignored (every row is a query)."""
    return map_loss(z, labels, method="dlm", alpha=alpha, eps=eps, update=update)


def ap_classify(support, query):
    """AP-based classification (Sec. 5, "Our Algorithm for K-shot N-way
    classification"): a query ranks all ``w*n`` support points by cosine
    similarity; for each way i, ``AP^i`` is the average precision of that
    ranking when way i's n points are the relevant ones; the query takes the
    way with the largest AP. With one shot this is the most similar support
    point. Ties: equal similarities keep the support order (stable sort);
    equal APs go to the lower way index.
    """
    import torch
    import torch.nn.functional as F

    episodes, ways, shots, _ = support.shape
    points = F.normalize(support.flatten(1, 2), dim=-1)  # [E, w*n, d]
    similarity = F.normalize(query, dim=-1) @ points.transpose(1, 2)  # [E, Q, w*n]
    ranked_way = torch.div(similarity.argsort(dim=-1, descending=True, stable=True), shots, rounding_mode="floor")
    relevant = F.one_hot(ranked_way, ways).to(similarity.dtype)  # [E, Q, w*n, w]: position r holds way i
    position = torch.arange(1, ways * shots + 1, device=query.device, dtype=similarity.dtype)[:, None]
    precision = relevant.cumsum(dim=-2) / position  # precision at r for each way
    ap = (precision * relevant).sum(dim=-2) / shots  # [E, Q, w]
    return ap.argmax(dim=-1)


class RetrievalMAP:
    """N-way one-shot retrieval mAP (Sec. 5): an episode is N classes and
    ``images_per_class`` = 10 images each; every image is a query that ranks
    the other 10N - 1 by cosine similarity, its 9 classmates being relevant.
    The episode's score is the mean over its 10N queries of their average
    precision (Sec. 3.1); fslab reports the mean ± 95% CI over episodes.

    The core draws the 10 images of a class as 1 "shot" + 9 "queries" (the
    split is irrelevant here: all 10N images play both roles), whatever
    shots and queries were asked for. Equal similarities keep pool order.
    """

    metric = "map"

    def __init__(self, *, images_per_class: int = 10):
        check_retrieval({"images_per_class": images_per_class})
        self.images_per_class = images_per_class
        self.episode_shape = (1, images_per_class - 1)

    def __call__(self, support, query):
        import torch
        import torch.nn.functional as F

        episodes, ways, _, dim = support.shape
        pool = torch.cat([support, query.view(episodes, ways, -1, dim)], dim=2)  # [E, w, m, d]
        per_class = pool.shape[2]
        unit = F.normalize(pool.flatten(1, 2), dim=-1)  # [E, P, d], class by class
        similarity = unit @ unit.transpose(1, 2)
        similarity.diagonal(dim1=1, dim2=2).fill_(float("-inf"))  # a query does not retrieve itself
        order = similarity.argsort(dim=-1, descending=True, stable=True)[..., :-1]  # itself last, dropped
        label = torch.arange(ways * per_class, device=query.device) // per_class
        relevant = (label[order] == label[:, None]).to(similarity.dtype)  # [E, P, P-1]
        position = torch.arange(1, order.shape[-1] + 1, device=query.device, dtype=similarity.dtype)
        ap = (relevant.cumsum(dim=-1) / position * relevant).sum(dim=-1) / (per_class - 1)
        return ap.mean(dim=-1)


def check_retrieval(params: dict, context=None) -> None:
    if params["images_per_class"] < 2:
        raise UsageError(f"retrieval-map: images_per_class must be >= 2 (a query needs a relevant image; "
                         f"evaluator.images_per_class), got {params['images_per_class']}")


@hookimpl
def register_evaluators(register):
    register(ap_classify, name="ap", paper=f"{PAPER}, Sec. 5",
             description="AP-based classification: the way whose support points the query's cosine ranking "
             "retrieves with the highest average precision.")
    register(RetrievalMAP, name="retrieval-map", paper=f"{PAPER}, Sec. 5 (Tables 1, 2)", check=check_retrieval,
             allowed={"images_per_class": at_least(2)},
             description="N-way one-shot retrieval: mAP over 10 images per class, each ranking the rest "
             "(scores mAP, not accuracy; ignores --shots/--queries).")


@hookimpl
def register_losses(register):
    # alpha weighs the loss-augmented ranking against the true one: at 0 or below the step pushes the true
    # ranking's score up without bound, or the direct one's the wrong way
    register(map_ssvm, name="map-ssvm", paper=PAPER, episodic=False, allowed={"alpha": positive()}, check=check_ssvm,
             description="mAP-SSVM: every row ranks the batch by cosine similarity; loss-augmented DP inference.")
    register(map_dlm, name="map-dlm", paper=PAPER, episodic=False, check=check_dlm,
             allowed={"update": one_of(*UPDATES), "alpha": positive()},
             description="mAP-DLM: direct loss minimisation of mean AP, positive or negative update.")


@hookimpl
def register_methods(register):
    # Sec. 5: batches of |B| = 128 drawn from N classes: N = 8 on miniImageNet (16 images each), the
    # recipe's base; N = 16 on Omniglot (8 images each).
    batches = {"name": "fixed", "ways": 8, "per_class": 16}
    # Sec. 5 and the supplementary: Adam, lr 0.001; on miniImageNet multiplied by
    # 0.75 every 2K of 22K updates; on Omniglot no decay. Weight decay is not stated: fslab's default stays.
    train = {"batch_size": 128, "optimizer": "adam", "lr": 0.001,
             "milestones": [round(k / 11, 4) for k in range(1, 11)], "gamma": 0.75}
    omniglot = {"sampler": {"ways": 16, "per_class": 8}, "train": {"milestones": []}}
    for name, loss in (("map-ssvm", {"name": "map-ssvm"}), ("map-dlm", {"name": "map-dlm", "update": "positive"})):
        register(
            {"loss": loss, "sampler": dict(batches), "evaluator": {"name": "centroid"}, "train": dict(train),
             "per_dataset": {"omniglot": copy.deepcopy(omniglot)}},
            name=name,
            description=f"{name} (alpha 10), Adam at lr 0.001, batches of 128: 8 classes × 16 images and lr × 0.75 "
            "every 1/11 of training (miniImageNet, and any other dataset); on omniglot 16 classes × 8 images, "
            "no decay.",
            paper=f"{PAPER}, Table 2 (miniImageNet) and Table 1 (Omniglot)",
        )
