"""SEN: a dissimilarity for Prototypical Networks that equalises embedding norms.

Nguyen, Løkse, Wickstrøm, Kampffmeyer, Roverso & Jenssen, "SEN: A Novel
Feature Normalization Dissimilarity Measure for Prototypical Few-Shot
Learning Networks", ECCV 2020 (the text in ``papers/004_*.txt``, which gives
no arXiv identifier; we know of none).

Normalising embeddings onto a sphere helps when classes have few labels, but
hard L2 normalisation makes the loss non-convex, and the Ring loss (Zheng et
al. 2018), which softly pulls every norm towards a learned radius, adds a
parameter and a weight to tune. SEN instead changes ProtoNet's distance to
``d_s(z, c) = sqrt(||z − c||² + ε (||z|| − ||c||)²)`` (Eq. 2) with ε = ε_p > 0
between a query and its own prototype and ε = ε_n < 0 for the other
prototypes during training (Eq. 4). The gradient then both attracts a query
to its prototype and repels it from the others while pulling every norm
towards the same value (Eq. 5–8); at test time ε_p is used for all
prototypes.

Defaults: the paper does not state ε_p or ε_n. We use ε_p = 1 and
ε_n = −0.5; any ε_n in [−1, 0] keeps the radicand non-negative for every z
and c, since ||z − c|| ≥ | ||z|| − ||c|| |.

Registered: the ``sen`` loss, the ``ring`` loss (ProtoNet + Ring loss, the
paper's "Ring PN" baseline of Table 2; a torch module with the learnable
radius, in :mod:`fslab_plugins.methods.ring_loss`, registered lazily), and recipes.
The test-time rule (SEN with ε_p for every prototype) is the ``sen``
evaluator (:func:`sen_nearest`), which the ``sen`` recipe uses: it names
``training_loss`` in its signature, so fslab hands it the run's loss section
and it tests with the ε_p the run trained with (``--grid loss.eps_pos=...``
moves both); as for every
method, features are first centred and L2-normalised (NCA paper Sec. 3.4; after that
the query norms are 1 but the prototypes' are not, so the norm term still
counts).
"""

from __future__ import annotations

from fslab.plugin import LossOutput, UsageError, at_least, hookimpl, positive

PAPER = (
    "Nguyen, Løkse, Wickstrøm, Kampffmeyer, Roverso & Jenssen, SEN: A Novel Feature Normalization "
    "Dissimilarity Measure for Prototypical Few-Shot Learning Networks, ECCV 2020"
)
RING = (
    "Zheng, Pal & Savvides, Ring loss: Convex Feature Normalization for Face Recognition, CVPR 2018 "
    "(arXiv:1803.00130)"
)
# The radicand is clamped here before the square root: sqrt has an infinite
# derivative at 0, which would turn a query sitting on its prototype into NaNs.
SQRT_GUARD = 1e-12
EPS_POS = 1.0  # the loss's ε_p by default, and the test's where the run trained another loss


def sen_distances(query, prototypes, eps):
    """``d_s [..., Q, C]`` between queries ``[..., Q, d]`` and prototypes
    ``[..., C, d]`` (leading batch dimensions allowed); ``eps`` is a number
    or a tensor of ε_ik broadcastable to ``[..., Q, C]``."""
    import torch
    from fslab_plugins.methods.nca import squared_distances

    euclidean = squared_distances(query, prototypes)
    norm_gap = (query.norm(dim=-1)[..., :, None] - prototypes.norm(dim=-1)[..., None, :]) ** 2
    return torch.sqrt((euclidean + eps * norm_gap).clamp(min=SQRT_GUARD))


def check_sen(params: dict, context=None) -> None:
    if not params["eps_pos"] > 0:
        raise UsageError(f"sen: eps_pos must be > 0 (loss.eps_pos), got {params['eps_pos']}")
    if not -1.0 <= params["eps_neg"] <= 0.0:
        raise UsageError(f"sen: eps_neg must be in [-1, 0] (so the square root stays real; loss.eps_neg), "
                         f"got {params['eps_neg']}")


def unset_or_positive(value) -> bool:
    """An optional number parameter's rule: None (unset), or a number above 0."""
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0)


def check_sen_evaluator(params: dict, context=None) -> None:
    eps = params["eps_pos"]  # None: the run's sen loss's (sen_nearest)
    if not unset_or_positive(eps):
        raise UsageError(f"sen evaluator: eps_pos must be > 0, or unset for the sen loss's (evaluator.eps_pos), "
                         f"got {eps!r}")


def check_ring(params: dict, context=None) -> None:
    """The Ring loss's parameters (checked here: the loss module imports torch)."""
    if not params["weight"] >= 0:
        raise UsageError(f"ring: weight must be >= 0 (loss.weight), got {params['weight']}")
    radius = params["radius"]
    if not unset_or_positive(radius):
        raise UsageError(f"ring: radius must be > 0 (or unset to measure it; loss.radius), got {radius!r}")


def sen(z, labels, support=None, *, eps_pos: float = EPS_POS, eps_neg: float = -0.5) -> LossOutput:
    """SEN ProtoNet loss: Eq. 1 with ``d = d_s`` (Eq. 2), ε_ik from Eq. 4.

    The queries' mean negative log-likelihood of their class under a softmax
    over ``-d_s`` to every prototype of the episode. Pair counts are
    ProtoNet's (each support point counts through its prototype).
    """
    import torch
    import torch.nn.functional as F

    check_sen({"eps_pos": eps_pos, "eps_neg": eps_neg})
    if support is None:
        raise UsageError("sen needs an episodic sampler (one that marks support and query rows), "
                         "e.g. sampler 'episodic'")
    support = torch.as_tensor(support, dtype=torch.bool, device=z.device)
    labels = labels.to(z.device)
    classes, support_class = torch.unique(labels[support], return_inverse=True)
    query_labels = labels[~support]
    if query_labels.numel() == 0:
        raise UsageError("sen: the episode has no query rows")
    query_class = torch.searchsorted(classes, query_labels).clamp(max=classes.numel() - 1)
    if not bool((classes[query_class] == query_labels).all()):
        raise UsageError("sen: a query's class has no support image in the episode")
    counts = torch.bincount(support_class, minlength=classes.numel())
    prototypes = torch.zeros(classes.numel(), z.shape[1], dtype=z.dtype, device=z.device)
    prototypes = prototypes.index_add(0, support_class, z[support]) / counts[:, None].to(z.dtype)

    own = query_class[:, None] == torch.arange(classes.numel(), device=z.device)[None, :]
    eps = torch.where(own, eps_pos, eps_neg).to(z.dtype)
    loss = F.cross_entropy(-sen_distances(z[~support], prototypes, eps), query_class)
    positives = counts[query_class].sum()
    return LossOutput(loss, positives, query_class.numel() * counts.sum() - positives, None)


def sen_nearest(support, query, *, eps_pos: float | None = None, training_loss: dict | None = None):
    """The SEN paper's test-time rule: the nearest prototype (class mean of
    the support points) in the SEN dissimilarity with ε = ε_p for every
    prototype ("At test time, a positive epsilon is used for computing all
    dissimilarity measures", Sec. 3), the ε_p the network trained with:
    ``eps_pos`` unset (None) takes the run's loss's (fslab passes the run's loss
    section as ``training_loss``) where it trains with ``sen``, else 1, the
    loss's default; a number sets it. ``support [E, w, n, d]``, ``query [E, Q, d]``
    -> ``long [E, Q]``; ties go to the lower way index."""
    if eps_pos is None:
        trained = training_loss if training_loss and training_loss.get("name") == "sen" else {}
        eps_pos = trained.get("eps_pos", EPS_POS)
    check_sen_evaluator({"eps_pos": eps_pos})
    return sen_distances(query, support.mean(dim=2), eps_pos).argmin(dim=-1)


@hookimpl
def register_evaluators(register):
    register(sen_nearest, name="sen", paper=PAPER + ", Sec. 3 (test time)", check=check_sen_evaluator,
             allowed={"eps_pos": positive()},  # unset (None): the sen loss's eps_pos the run trained with
             description="Nearest prototype in the SEN dissimilarity with eps_pos for every prototype "
                         "(unset: the run's sen loss's eps_pos).")


@hookimpl
def register_losses(register):
    register(sen, name="sen", paper=PAPER + ", Eq. 2-4", episodic=True, check=check_sen,
             description="ProtoNet with the SEN dissimilarity (eps_pos > 0 own prototype, eps_neg < 0 others).")
    register(
        "fslab_plugins.methods.ring_loss:RingProtoNet",
        name="ring",
        paper=f"{RING}; {PAPER}, Table 2 (Ring PN)",
        episodic=True,
        params={"weight": 0.01, "radius": None},
        allowed={"weight": at_least(0), "radius": positive()},  # radius unset (None): measured at the start
        check=check_ring,
        description="ProtoNet + weight × Ring loss (mean (||z|| - R)²/2, R learned), the SEN paper's baseline.",
    )


@hookimpl
def register_methods(register):
    # The SEN paper trains as the original PN: Snell's 5-shot episodes.
    episodes = {"name": "episodic", "ways": 20, "shots": 5, "queries": 15}
    # SEN PN is tested with the SEN dissimilarity (ε_p for all prototypes);
    # Ring PN is a ProtoNet, tested with the Euclidean nearest prototype.
    for name, what, evaluator, test in (("sen", "SEN PN", "sen", "SEN nearest-prototype test (eps_pos)"),
                                        ("ring", "Ring PN", "centroid", "nearest-centroid test")):
        register(
            {"loss": {"name": name}, "sampler": dict(episodes), "evaluator": {"name": evaluator}},
            name=name,
            description=f"{what} on Snell's 5-shot episodes (20 ways, 5 shots, 15 queries); {test}.",
            paper=f"{PAPER}, Table 2 ({what})",
        )
