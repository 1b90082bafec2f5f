"""The NCA paper's ablations of Prototypical Networks, and Matching Networks.

Laenen & Bertinetto, "On Episodes, Prototypical Networks, and Few-Shot
Learning", NeurIPS 2021, arXiv:2012.09831, App. A.2 and A.7 (Sec. 4.3, Fig. 4
and Fig. 6); Vinyals et al., "Matching Networks for One Shot Learning",
NeurIPS 2016, arXiv:1606.04080.

The paper names three things that separate the prototypical loss from NCA:
(1) queries are compared with class prototypes instead of individual points,
(2) only query–support distances are used, never query–query or
support–support ones, and (3) episodes are sampled with replacement. Turning
off (1) gives Eq. 4 (each query against every support point), turning off (2)
gives Eq. 5 (NCA over the queries and the prototypes together), and turning
off both gives Eq. 6, which is exactly NCA on a batch with a fixed number of
classes and images per class. Matching Networks with a softmax attention over
negative squared Euclidean distances and no full-context embedding is, at
training time, the same loss as Eq. 4 (App. A.7); its "no S/Q" ablation is,
again, NCA on fixed-composition batches.

Registered here: losses ``protonet-noproto`` (Eq. 4), ``protonet-nosq``
(Eq. 5) and ``matchingnet`` (Eq. 4 with a choice of distance); a recipe for
each, plus ``protonet-noproto-nosq`` and ``matchingnet-nosq``, which use the
``nca`` loss with the ``fixed`` sampler (Eq. 6 is not a new loss, so it is
not registered as one); and the recipes of the paper's other experiments:
``nca-replacement`` (Fig. 4 row 2), ``nca-half-pairs`` (Fig. 3), ``supcon``
(App. A.3) and the episodic baselines ``protonet-snell``,
``protonet-snell-1shot`` and ``protonet-best`` (Table 3, Fig. 2). The
losses and samplers they use are in :mod:`fslab_plugins.methods.nca`.

Normalisation: Eq. 4–6 print a factor ``1/(|Q| + |S|)`` in front of sums that
run over the queries (Eq. 4) or over the queries and prototypes (Eq. 5). We
average over the terms of the sum instead (the queries for Eq. 4, as Eq. 2
does; the queries and prototypes for Eq. 5), so the losses are on the scale of
``protonet`` and ``nca``; this only rescales the learning rate.
"""

from __future__ import annotations

from fslab_plugins.methods.protonet import DISTANCES, check_distance

from fslab.plugin import LossOutput, UsageError, hookimpl, one_of

PAPER = (
    "Laenen & Bertinetto, On Episodes, Prototypical Networks, and Few-Shot Learning, NeurIPS 2021 "
    "(arXiv:2012.09831)"
)
VINYALS = "Vinyals et al., Matching Networks for One Shot Learning, NeurIPS 2016 (arXiv:1606.04080)"


def _support_mask(z, support, name: str):
    import torch

    if support is None:
        raise UsageError(
            f"{name} needs an episodic sampler (one that marks support and query rows), e.g. sampler 'episodic'"
        )
    support = torch.as_tensor(support, dtype=torch.bool, device=z.device)
    if bool(support.all()) or not bool(support.any()):
        raise UsageError(f"{name}: an episode needs both support and query rows")
    return support


def _query_support_loss(z, labels, support, distance: str, name: str) -> LossOutput:
    """Each query against every support point: ``-log sum_{s in S_y} p(s|q)``
    with ``p`` a softmax over the support points (Eq. 4; Matching Networks'
    attention kernel). Positives are (query, same-class support) pairs,
    negatives (query, other-class support) pairs."""
    import torch
    import torch.nn.functional as F
    from fslab_plugins.methods.nca import squared_distances

    check_distance(name, distance)
    support = _support_mask(z, support, name)
    labels = labels.to(z.device)
    queries, shots = z[~support], z[support]
    same = labels[~support][:, None] == labels[support][None, :]  # [Q, S]
    if not bool(same.any(dim=1).all()):
        raise UsageError(f"{name}: a query's class has no support image in the episode")
    if distance == "euclidean":
        logits = -squared_distances(queries, shots)
    else:
        logits = F.normalize(queries, dim=1) @ F.normalize(shots, dim=1).T
    log_numerator = torch.logsumexp(logits.masked_fill(~same, float("-inf")), dim=1)
    loss = (torch.logsumexp(logits, dim=1) - log_numerator).mean()
    positives = same.sum()
    return LossOutput(loss, positives, same.numel() - positives, None)


def check_matchingnet(params: dict, context=None) -> None:
    check_distance("matchingnet", params["distance"])


def protonet_noproto(z, labels, support=None) -> LossOutput:
    """ProtoNet without prototypes (NCA paper Eq. 4): each query is classified
    by a softmax over its squared distances to every support point, the
    probability of its class being the sum over that class's support points.
    Pair counts equal ProtoNet's (w·m·n positives, w(w−1)·m·n negatives)."""
    return _query_support_loss(z, labels, support, "euclidean", "protonet-noproto")


def matchingnet(z, labels, support=None, *, distance: str = "euclidean") -> LossOutput:
    """Matching Networks without full-context embedding, softmax attention
    (Vinyals et al. 2016, Sec. 2.1.1): ``p(y|q) = sum_{s: y_s = y} softmax_s(-d(q, s))``
    and the loss is the queries' mean ``-log p(y_q|q)``.

    With ``distance="euclidean"`` (negative squared Euclidean distance, as
    the NCA paper trains it in App. A.7) this is the same loss as Eq. 4,
    ``protonet-noproto``; ``"cosine"`` uses cosine similarity, as Vinyals et
    al. do (without their full-context embedding).
    """
    return _query_support_loss(z, labels, support, distance, "matchingnet")


def protonet_nosq(z, labels, support=None) -> LossOutput:
    """ProtoNet without the support/query separation (NCA paper Eq. 5): the
    support points of each class are replaced by their prototype, and the NCA
    loss (Eq. 3) is computed over the queries and prototypes together, every
    element against every other.

    A prototype whose class has no query has no positive: it is left out of
    the average (``extra["rows_without_positive"]``) but still serves as a
    negative for the others, like a lone row of NCA.

    Pair counts follow the NCA paper's Sec. 3.3 counts with each support point counted through its
    prototype (footnote 2): a query–prototype pair counts the class's n
    support points, a prototype–prototype pair n_a·n_b, a query–query pair 1.
    For w ways, n shots, m queries that gives ``w·(C(m, 2) + m·n)`` positives
    and ``C(w, 2)·(m + n)²`` negatives, the latter equal to NCA's on the same
    batch (see tests/test_nca_ablations.py for the paper's 20,170).
    """
    import torch
    from fslab_plugins.methods.nca import squared_distances

    support = _support_mask(z, support, "protonet-nosq")
    labels = labels.to(z.device)
    classes, support_class = torch.unique(labels[support], return_inverse=True)
    counts = torch.bincount(support_class, minlength=classes.numel())
    prototypes = torch.zeros(classes.numel(), z.shape[1], dtype=z.dtype, device=z.device)
    prototypes = prototypes.index_add(0, support_class, z[support]) / counts[:, None].to(z.dtype)

    elements = torch.cat([z[~support], prototypes])
    element_labels = torch.cat([labels[~support], classes])
    weights = torch.cat([torch.ones_like(labels[~support]), counts])  # support points behind each element
    rows = elements.shape[0]
    eye = torch.eye(rows, dtype=torch.bool, device=z.device)
    same = (element_labels[:, None] == element_labels[None, :]) & ~eye
    has_positive = same.any(dim=1)
    pair_weight = weights[:, None] * weights[None, :]
    reaching = has_positive[:, None] | has_positive[None, :]
    positives = (pair_weight * same).sum() // 2
    negatives = (pair_weight * (~same & ~eye & reaching)).sum() // 2
    extra = {"rows_without_positive": rows - has_positive.sum()}

    logits = (-squared_distances(elements, elements)).masked_fill(eye, float("-inf"))
    safe = has_positive[:, None]  # finite logsumexp gradients for rows without positive
    positive_logits = torch.where(safe, logits.masked_fill(~same, float("-inf")), torch.zeros_like(logits))
    per_row = (torch.logsumexp(logits, dim=1) - torch.logsumexp(positive_logits, dim=1)) * has_positive
    loss = per_row.sum() / has_positive.sum().clamp(min=1)
    return LossOutput(loss, positives, negatives, extra)


@hookimpl
def register_losses(register):
    register(
        protonet_noproto,
        name="protonet-noproto",
        description="ProtoNet ablation 'no prototypes' (Eq. 4): each query against every support point.",
        paper=PAPER + ", App. A.2",
        episodic=True,
    )
    register(
        protonet_nosq,
        name="protonet-nosq",
        description="ProtoNet ablation 'no S/Q' (Eq. 5): NCA over queries and prototypes together.",
        paper=PAPER + ", App. A.2",
        episodic=True,
    )
    register(
        matchingnet,
        name="matchingnet",
        description="Matching Networks, softmax attention, no full-context embedding (Euclidean or cosine).",
        paper=f"{VINYALS}; {PAPER}, App. A.7",
        episodic=True,
        allowed={"distance": one_of(*DISTANCES)},
        check=check_matchingnet,
    )


# The batch-256 ablations of Sec. 4.3: 5-shot episodes with a = 8 images per
# class (32 ways, 3 queries), and NCA on batches of 32 classes × 8 images.
ABLATION_EPISODES = {"name": "episodic", "shots": 5, "per_class": 8}
FIXED_BATCHES = {"name": "fixed", "per_class": 8}
BATCH_256 = {"batch_size": 256}


@hookimpl
def register_methods(register):
    def recipe(loss, sampler, name, description, paper):
        register({"loss": loss, "sampler": dict(sampler), "evaluator": {"name": "centroid"}, "train": dict(BATCH_256)},
                 name=name, description=description, paper=paper)

    recipe({"name": "protonet-noproto"}, ABLATION_EPISODES, "protonet-noproto",
           "ProtoNet without prototypes (Eq. 4) on 5-shot episodes of 256 (a=8).", f"{PAPER}, Fig. 4 row 6")
    recipe({"name": "protonet-nosq"}, ABLATION_EPISODES, "protonet-nosq",
           "ProtoNet without S/Q separation (Eq. 5) on 5-shot episodes of 256 (a=8).", f"{PAPER}, Fig. 4 row 7")
    recipe({"name": "nca"}, FIXED_BATCHES, "protonet-noproto-nosq",
           "Both ablations (Eq. 6) = NCA on fixed-composition batches of 32 classes × 8 images.",
           f"{PAPER}, Fig. 4 row 3 (Eq. 6)")
    recipe({"name": "matchingnet"}, ABLATION_EPISODES, "matchingnet",
           "Matching Networks (softmax attention, Euclidean, no FCE) on 5-shot episodes of 256 (a=8).",
           f"{PAPER}, App. A.7, Fig. 6; {VINYALS}")
    recipe({"name": "nca"}, FIXED_BATCHES, "matchingnet-nosq",
           "Matching Networks without S/Q separation = NCA on fixed-composition batches (32 × 8). "
           "The paper evaluates it by soft assignment; this recipe keeps the default centroid evaluator.",
           f"{PAPER}, App. A.7, Fig. 6")
    register(
        {"loss": {"name": "nca"}, "sampler": {"name": "iid-replacement"}, "evaluator": {"name": "centroid"},
         "train": {"batch_size": 256}},
        name="nca-replacement",
        description="NCA on i.i.d. batches of 256 drawn with replacement.",
        paper=f"{PAPER}, Fig. 4 row 2",
    )
    register(
        {"loss": {"name": "nca", "pair_fraction": 0.5}, "sampler": {"name": "iid"},
         "evaluator": {"name": "centroid"}, "train": {"batch_size": 256}},
        name="nca-half-pairs",
        description="NCA on batches of 256 keeping a random half of the pairs "
                    "(set loss.pair_fraction for other points).",
        paper=f"{PAPER}, Fig. 3",
    )
    register(
        {"loss": {"name": "supcon", "form": "nca-code"}, "sampler": {"name": "iid"},
         "evaluator": {"name": "centroid"}},
        name="supcon",
        description="The NCA authors' supervised contrastive loss (negatives-only denominator, their code's "
                    "form) on i.i.d. mini-batches; the paper gives no temperature, 0.1 is Khosla et al.'s.",
        paper=f"{PAPER}, App. A.3 (51.05 / 63.36 on miniImageNet)",
    )
    register(
        {"loss": {"name": "supcon", "form": "khosla"}, "sampler": {"name": "iid"},
         "evaluator": {"name": "centroid"}},
        name="supcon-khosla",
        description="Khosla et al.'s supervised contrastive loss L_out (temperature 0.1) on i.i.d. mini-batches.",
        paper="Khosla et al., Supervised Contrastive Learning, NeurIPS 2020 (arXiv:2004.11362), Eq. 2",
    )
    register(
        {"loss": {"name": "protonet"}, "sampler": {"name": "episodic", "ways": 20, "shots": 5, "queries": 15},
         "evaluator": {"name": "centroid"}},
        name="protonet-snell",
        description="ProtoNet with Snell et al.'s 5-shot training episodes: 20 ways, 5 shots, 15 queries "
        "(their 1-shot models train on 30 ways, 1 shot, 15 queries: protonet-snell-1shot).",
        paper=f"{PAPER}, Table 3, 'ProtoNet (Snell setup)'; Snell et al. 2017 (arXiv:1703.05175), Sec. 3.2",
    )
    register(
        {"loss": {"name": "protonet"}, "sampler": {"name": "episodic", "ways": 30, "shots": 1, "queries": 15},
         "evaluator": {"name": "centroid"}},
        name="protonet-snell-1shot",
        description="ProtoNet with Snell et al.'s 1-shot training episodes: 30 ways, 1 shot, 15 queries.",
        paper=f"{PAPER}, Sec. 4.2; Snell et al. 2017 (arXiv:1703.05175), Sec. 3.2",
    )
    register(
        {"loss": {"name": "protonet"}, "sampler": {"name": "episodic", "shots": 5, "per_class": 16},
         "evaluator": {"name": "centroid"}, "train": {"batch_size": 512}},
        name="protonet-best",
        description="ProtoNet with the NCA paper's best episodes: batch 512, 5 shots, 16 images per class "
        "(32 ways, 11 queries).",
        paper=f"{PAPER}, Table 3, 'ProtoNet (best episodes)'; Fig. 2",
    )
