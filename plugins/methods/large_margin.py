"""Large margin meta-learning: a triplet term added to Prototypical Networks.

Wang, Wu, Li, Gu, Xiang, Zhang & Li, "Large Margin Meta-Learning for Few-Shot
Classification", 2018, arXiv:1807.02872.

Few-shot episodes hold too few images for the class means to be good
estimates, so a metric learned from them separates the training classes
poorly. The paper adds a large-margin term to the classification loss,
``L = L_softmax + λ·L_large-margin`` (Eq. 1), and chooses the triplet loss
``mean [||a − p||² − ||a − n||² + m]_+`` over sampled triplets (Eq. 2): every
image of the episode is an anchor, pulled towards images of its class and
pushed at least a margin further from images of other classes. With
Prototypical Networks this is L-PN. Defaults follow Sec. 3 and App. A.3.2:
λ = 1; the margin is half the mean embedding norm of a batch of the randomly
initialised network; for each anchor 10 positives, and for each positive 10
negatives (100 triplets per anchor).

Registered: losses ``triplet`` (the term alone, usable with any sampler that
puts several images of a class in a batch) and ``lpn`` (ProtoNet +
λ·triplet, episodic), and a recipe for each. The losses live in
:mod:`fslab_plugins.methods.triplet_loss` (a torch module, registered lazily): they
are ``nn.Module``s so that the measured margin, a buffer, is checkpointed.
"""

from __future__ import annotations

from fslab_plugins.methods.nca import check_pairs
from fslab_plugins.methods.protonet import DISTANCES, check_distance

from fslab.plugin import UsageError, at_least, hookimpl, one_of, positive

PAPER = "Wang et al., Large Margin Meta-Learning for Few-Shot Classification, 2018 (arXiv:1807.02872)"


def _params():
    return {"margin": None, "positives": 10, "negatives": 10}


def check_triplet(params: dict, context=None, name: str = "triplet") -> None:
    """The triplet term's parameters (checked here: the loss module imports torch)."""
    margin, positives, negatives = params["margin"], params["positives"], params["negatives"]
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin > 0):
        raise UsageError(f"{name}: margin must be > 0 (or unset to measure it; loss.margin), got {margin!r}")
    if positives < 1 or negatives < 1:
        raise UsageError(f"{name}: positives and negatives must be >= 1 (loss.positives, loss.negatives), "
                         f"got {positives} and {negatives}")
    if name == "triplet":  # lpn's episodes hold shots + queries of a class: its sampler's checks say so
        check_pairs(name, context)


def check_lpn(params: dict, context=None) -> None:
    if not params["triplet_weight"] >= 0:
        raise UsageError(f"lpn: triplet_weight must be >= 0 (loss.triplet_weight), got {params['triplet_weight']}")
    check_triplet(params, context, "lpn")
    check_distance("lpn", params["distance"])


def _allowed() -> dict:
    # margin: a number > 0, or unset (None) to measure it at initialisation
    return {"margin": positive(), "positives": at_least(1), "negatives": at_least(1)}


@hookimpl
def register_losses(register):
    register("fslab_plugins.methods.triplet_loss:TripletLoss", name="triplet", paper=PAPER + ", Eq. 2", episodic=False,
             params=_params(), allowed=_allowed(), check=check_triplet,
             description="Triplet hinge over 10 positives × 10 negatives per anchor; "
                         "margin measured at initialisation.")
    register("fslab_plugins.methods.triplet_loss:LargeMarginProtoNet", name="lpn", paper=PAPER + ", Eq. 1",
             episodic=True,
             params={"triplet_weight": 1.0, **_params(), "distance": "euclidean"}, check=check_lpn,
             allowed={"triplet_weight": at_least(0), **_allowed(), "distance": one_of(*DISTANCES)},
             description="L-PN: prototypical loss + λ·triplet term (λ = 1).")


@hookimpl
def register_methods(register):
    # App. A.3.2: PN episodes of 20 classes × (5 support + 15 query) images.
    episodes = {"name": "episodic", "ways": 20, "shots": 5, "queries": 15}
    register(
        {"loss": {"name": "lpn"}, "sampler": dict(episodes), "evaluator": {"name": "centroid"}},
        name="lpn",
        description="L-PN: ProtoNet + triplet term on Snell's 5-shot episodes (20 ways, 5 shots, 15 queries).",
        paper=f"{PAPER}, Table 1 (L-PN)",
    )
    register(
        {"loss": {"name": "triplet"}, "sampler": {"name": "fixed", "ways": 20, "per_class": 20},
         "evaluator": {"name": "centroid"}},
        name="triplet",
        description="The large-margin triplet term alone, on batches of 20 classes × 20 images "
        "(the L-PN episode, without the prototypical loss).",
        paper=f"{PAPER}, Eq. 2 (a component of Table 1's L-PN; no table of its own)",
    )
