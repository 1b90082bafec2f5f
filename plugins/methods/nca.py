"""Neighbourhood Component Analysis for few-shot learning: the NCA loss, the study's samplers and the ``nca`` recipe.

Laenen & Bertinetto, "On Episodes, Prototypical Networks, and Few-Shot
Learning", NeurIPS 2021, arXiv:2012.09831.

The paper asks what episodes buy Prototypical Networks and finds: nothing that
a plain mini-batch does not give better. Splitting a batch into support and
query sets, and comparing queries only with class prototypes, throws away most
of the pairwise distances a batch offers (Sec. 3.3, Table 1). Replacing the
prototypical loss by the NCA loss (Goldberger et al., 2005) over *all* pairs of
an ordinary i.i.d. mini-batch (Eq. 3) — every embedding pulled towards the
others of its class, pushed from the rest, through one softmax over squared
Euclidean distances — removes the episode hyper-parameters (ways, shots,
queries) and improves accuracy. At test time the embedding is used as is:
features are centred and L2-normalised and each query takes the class of the
nearest support centroid (Sec. 3.4).

This module registers the NCA loss (with the pair sub-sampling of Fig. 3),
the NCA loss with a learned temperature
(:mod:`fslab_plugins.methods.nca_temperature`), the supervised contrastive
baseline (App. A.3), the samplers of the study
(i.i.d. with and without replacement, fixed batch composition), the
nearest-centroid evaluator and the ``nca`` recipe. The ProtoNet ablations of
App. A.2, Matching Networks (App. A.7) and the recipes of the paper's other
experiments are in :mod:`fslab_plugins.methods.nca_ablations`; the paper's other
test-time classifiers (k-NN, soft assignment, fine-tuning on the support set)
in :mod:`fslab_plugins.methods.nca_evaluators`.
torch is imported inside the functions that need it, so listing plugins
stays light.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from fslab.plugin import Batch, LossOutput, SplitSizes, UsageError, hookimpl

PAPER = (
    "Laenen & Bertinetto, On Episodes, Prototypical Networks, and Few-Shot Learning, NeurIPS 2021 "
    "(arXiv:2012.09831)"
)


def squared_distances(a, b):
    """All squared Euclidean distances ``[len(a), len(b)]`` via
    ``|a|² + |b|² - 2ab`` (one matrix product; the ``[b, b, d]`` difference
    tensor would not fit for a 512 × 640 batch), clamped at 0 against rounding."""
    sq_a = (a * a).sum(-1, keepdim=True)
    sq_b = (b * b).sum(-1, keepdim=True)
    return (sq_a + sq_b.transpose(-1, -2) - 2.0 * a @ b.transpose(-1, -2)).clamp(min=0.0)


def nca(z, labels, support=None, *, temperature: float = 1.0, pair_fraction: float = 1.0) -> LossOutput:
    """NCA loss of Eq. 3 over every pair in the batch (or a random fraction of them).

    For row i: ``-log( sum_{j != i, y_j = y_i} exp(-d_ij / T) / sum_{k != i} exp(-d_ik / T) )``
    with ``d`` the squared Euclidean distance and ``T`` the temperature. A row
    whose class appears only once has no positive and no defined loss: it is
    left out of the average and counted in ``extra["rows_without_positive"]``.

    ``pair_fraction`` < 1 is the pair sub-sampling of Fig. 3: each unordered
    pair is kept with that probability (a symmetric mask drawn from torch's
    global generator, on the embeddings' device), and a dropped pair leaves
    both the numerator and the denominator of both its rows. A row left with
    no positive is then treated like a lone row. At 1.0 no random number is
    drawn, so the default loss is deterministic.

    Pair counts are unordered pairs (NCA paper Sec. 3.3), of the pairs kept: positives are
    same-class pairs; negatives are different-class pairs with at least one end
    that has a positive (a pair of two rows without positive reaches no loss
    term). ``support`` is ignored: NCA treats every row alike.
    """
    import torch

    check_nca({"temperature": temperature, "pair_fraction": pair_fraction})
    rows = z.shape[0]
    labels = labels.to(z.device)
    eye = torch.eye(rows, dtype=torch.bool, device=z.device)
    kept = ~eye if pair_fraction >= 1.0 else pair_mask(rows, pair_fraction, z.device)
    same = (labels[:, None] == labels[None, :]) & kept
    has_positive = same.any(dim=1)
    lone_rows = rows - has_positive.sum()
    positives = same.sum() // 2
    reaching = has_positive[:, None] | has_positive[None, :]
    negatives = (kept & ~same & reaching).sum() // 2
    extra = {"rows_without_positive": lone_rows}
    if rows < 2:
        return LossOutput(z.sum() * 0.0, positives, negatives, extra)

    logits = -squared_distances(z, z) / temperature
    logits = logits.masked_fill(~kept, float("-inf"))
    # A row without positive has all -inf positive logits (and, after pair
    # dropping, possibly all -inf logits); logsumexp's gradient there is NaN
    # even when the row is later multiplied by 0: give it finite values.
    safe = has_positive[:, None]
    log_denominator = torch.logsumexp(torch.where(safe, logits, torch.zeros_like(logits)), dim=1)
    positive_logits = torch.where(safe, logits.masked_fill(~same, float("-inf")), torch.zeros_like(logits))
    log_numerator = torch.logsumexp(positive_logits, dim=1)
    per_row = (log_denominator - log_numerator) * has_positive
    loss = per_row.sum() / has_positive.sum().clamp(min=1)
    return LossOutput(loss, positives, negatives, extra)


def check_temperature(name: str, temperature: float, key: str = "loss.temperature") -> None:
    """A softmax temperature must be > 0 (``not >`` so that NaN is refused too)."""
    if not temperature > 0:
        raise UsageError(f"{name}: {key} must be > 0, got {temperature}")


def check_nca(params: dict, context=None) -> None:
    """The NCA loss's parameters: ``temperature`` > 0, ``pair_fraction`` in (0, 1]."""
    check_temperature("nca", params["temperature"])
    if not 0.0 < params["pair_fraction"] <= 1.0:
        raise UsageError(f"nca: loss.pair_fraction must be in (0, 1], got {params['pair_fraction']}")
    check_pairs("nca", context)


def check_pairs(loss: str, context=None) -> None:
    """A UsageError when no class of the training split has 2 images: a loss over the pairs of a batch
    then finds no positive in any batch, whatever the sampler, and is 0 with no gradient at every step
    (each row counted in ``rows_without_positive``), so the run would train nothing. A batch that holds
    no pair only now and then is no error: its rows are left out of the average and counted."""
    train = None if context is None else context.split("train")
    if train is None or train.classes_with(2) or not train.classes:
        return
    raise UsageError(f"{loss}: no class of the training split has 2 images (its {train.classes} classes hold "
                     f"1 image each at most), so no batch holds a positive pair and the loss would be 0 at "
                     f"every step; give training classes 2 images at least, "
                     f"or train a method that compares no pairs (simpleshot)")


SUPCON_FORMS = ("khosla", "nca-code")


def check_supcon(params: dict, context=None) -> None:
    check_temperature("supcon", params["temperature"])
    if params["form"] not in SUPCON_FORMS:
        raise UsageError(f"supcon: loss.form must be one of {', '.join(SUPCON_FORMS)}, got {params['form']!r}")
    check_pairs("supcon", context)


def pair_mask(rows: int, fraction: float, device=None):
    """A symmetric bool ``[rows, rows]`` mask keeping each unordered pair with
    probability ``fraction`` (never the diagonal), drawn from torch's global
    generator for ``device`` — so a seeded run drops the same pairs."""
    import torch

    upper = torch.rand(rows, rows, device=device) < fraction
    upper = upper.triu(1)
    return upper | upper.T


def supcon(z, labels, support=None, *, temperature: float = 0.1, form: str = "khosla") -> LossOutput:
    """Supervised contrastive loss, Khosla et al. 2020 (arXiv:2004.11362), the
    baseline of the NCA paper's App. A.3: ``form="khosla"`` is Khosla et
    al.'s "L_out" (below); ``form="nca-code"`` is the variant the NCA authors
    trained for their App. A.3 figures (:func:`supcon_nca_code`).

    Embeddings are L2-normalised and compared by dot product over
    ``temperature`` (Khosla et al. use 0.1). For an anchor i with positives
    P(i) (same class, not i) and A(i) = every row but i::

        L_i = -1/|P(i)| * sum_{p in P(i)} log( exp(s_ip / T) / sum_{a in A(i)} exp(s_ia / T) )

    That is, the average over positives sits *outside* the log (NCA sums
    them inside), and the denominator holds every other row, positives
    included, but not the anchor itself. The loss is the mean of L_i over the
    anchors that have a positive; the others are counted in
    ``extra["rows_without_positive"]``. Pair counts are those of :func:`nca`
    on the same batch (the same pairs reach the loss).
    """
    import torch
    import torch.nn.functional as F

    check_supcon({"temperature": temperature, "form": form})
    rows = z.shape[0]
    labels = labels.to(z.device)
    eye = torch.eye(rows, dtype=torch.bool, device=z.device)
    same = (labels[:, None] == labels[None, :]) & ~eye
    positive_count = same.sum(dim=1)
    has_positive = positive_count > 0
    lone_rows = rows - has_positive.sum()
    positives = same.sum() // 2
    reaching = has_positive[:, None] | has_positive[None, :]
    negatives = (~same & ~eye & reaching).sum() // 2
    extra = {"rows_without_positive": lone_rows}
    if rows < 2:
        return LossOutput(z.sum() * 0.0, positives, negatives, extra)

    if form == "nca-code":
        return LossOutput(supcon_nca_code(z, labels, temperature), positives, negatives, extra)
    unit = F.normalize(z, dim=1)
    logits = (unit @ unit.T / temperature).masked_fill(eye, float("-inf"))
    log_probability = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    log_probability = log_probability.masked_fill(~same, 0.0)  # also clears the -inf diagonal
    per_row = -log_probability.sum(dim=1) / positive_count.clamp(min=1)
    loss = (per_row * has_positive).sum() / has_positive.sum().clamp(min=1)
    return LossOutput(loss, positives, negatives, extra)


def supcon_nca_code(z, labels, temperature: float):
    """The supervised contrastive loss as the NCA authors' code computes it
    (``SupervisedContrastiveLoss`` of github.com/fiveai/on-episodes-fsl), which
    differs from Khosla et al.'s L_out in four ways:

    - cosine similarities below 1e-10 are raised to 1e-10 (so every negative
      cosine counts as 0, and its gradient is zero);
    - each ordered positive pair (i, j) is its own term, with only the
      *negatives* of j in the denominator:
      ``log( exp(c_ij/T) / sum_{k: y_k != y_j} exp(c_kj/T) )``;
    - the terms are summed, not averaged over each anchor's positives, and a
      term whose ratio is below 1e-10 is left out (as the code does);
    - the sum is divided by the number of rows (the code's batch size).

    A batch of one class has no negatives: the code then divides by 1e-10,
    which is kept here too.
    """
    import torch
    import torch.nn.functional as F

    rows = z.shape[0]
    unit = F.normalize(z, dim=1)
    cosines = (unit @ unit.T).clamp(min=1e-10)
    similar = torch.exp(cosines / temperature)
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(rows, dtype=torch.bool, device=z.device)
    denominators = (similar * ~same).sum(dim=0).clamp(min=1e-10)  # over the negatives k of each column j
    ratio = similar * (same & ~eye) / denominators[None, :]
    counted = ratio >= 1e-10  # the positive pairs, less those the code drops
    return -torch.log(torch.where(counted, ratio, torch.ones_like(ratio))).sum() / rows


class IIDSampler:
    """Ordinary mini-batches: each epoch is a fresh permutation of the dataset
    cut into batches, so every image is seen exactly once per epoch (sampling
    without replacement, as the NCA paper trains).

    The order depends only on ``(seed, epoch)``, so a resumed run sees the same
    batches. Only the dataset size is kept, so the sampler pickles cheaply into
    data-loader workers.
    """

    def __init__(self, labels: Sequence[int], batch_size: int, seed: int, *, drop_last: bool = True):
        self.size = len(labels)
        check_iid_batch(batch_size, self.size, drop_last)
        self.batch_size = batch_size
        self.seed = seed
        self.drop_last = drop_last

    def __len__(self) -> int:
        if self.drop_last:
            return self.size // self.batch_size
        return -(-self.size // self.batch_size)

    def batches(self, epoch: int) -> Iterator[Batch]:
        order = list(range(self.size))
        random.Random(f"fslab-iid:{self.seed}:{epoch}").shuffle(order)
        for number in range(len(self)):
            yield Batch(order[number * self.batch_size : (number + 1) * self.batch_size], None)


class IIDReplacementSampler:
    """i.i.d. mini-batches *with* replacement (NCA paper Fig. 4, row 2).

    Each batch is ``batch_size`` distinct images drawn uniformly from the
    whole dataset, independently of the other batches: across an epoch some
    images appear several times and some never, as with episodes (Sec. 3.3,
    point 3), while a batch never holds the same image twice (a duplicate
    would be a free positive pair at distance 0). An epoch has
    ``N // batch_size`` batches, as many as :class:`IIDSampler` with
    ``drop_last``. Batches depend only on ``(seed, epoch)``.
    """

    def __init__(self, labels: Sequence[int], batch_size: int, seed: int):
        self.size = len(labels)
        check_replacement_batch(batch_size, self.size)
        self.batch_size = batch_size
        self.seed = seed

    def __len__(self) -> int:
        return self.size // self.batch_size

    def batches(self, epoch: int) -> Iterator[Batch]:
        rng = random.Random(f"fslab-iid-replacement:{self.seed}:{epoch}")
        for _ in range(len(self)):
            yield Batch(rng.sample(range(self.size), self.batch_size), None)


class FixedCompositionSampler:
    """Batches of ``ways`` classes × ``per_class`` images: the NCA paper's
    "fixed batch composition" (Sec. 4.3 and App. A.7), an episode without the
    support/query split.

    Give ``ways`` and ``per_class`` (the framework's ``batch_size`` is then
    ignored), or only ``per_class`` and ``ways = batch_size / per_class``.
    Within a batch the classes are distinct and so are the images; batches
    are drawn independently (with replacement across the epoch, like
    episodes). Rows come class by class. An epoch has ``ceil(N / batch)``
    batches; they depend only on ``(seed, epoch)``.
    """

    def __init__(self, labels: Sequence[int], batch_size: int, seed: int, *, ways: int = 0, per_class: int = 8):
        ways, per_class = fixed_shape(batch_size, ways, per_class)
        self.ways, self.per_class, self.seed = ways, per_class, seed
        self.size = len(labels)
        by_class: dict[int, list[int]] = {}
        for index, label in enumerate(labels.tolist() if hasattr(labels, "tolist") else labels):
            by_class.setdefault(int(label), []).append(index)
        self.images_by_class = {c: rows for c, rows in sorted(by_class.items()) if len(rows) >= per_class}
        check_classes_for("fixed sampler", ways, per_class, len(self.images_by_class),
                          SplitSizes(tuple(len(rows) for rows in by_class.values())))
        self.batch_size = ways * per_class

    def __len__(self) -> int:
        return -(-self.size // self.batch_size)

    def batches(self, epoch: int) -> Iterator[Batch]:
        rng = random.Random(f"fslab-fixed:{self.seed}:{epoch}")
        classes = list(self.images_by_class)
        for _ in range(len(self)):
            indices: list[int] = []
            for label in rng.sample(classes, self.ways):
                indices += rng.sample(self.images_by_class[label], self.per_class)
            yield Batch(indices, None)


# -- the samplers' checks: run by their constructors, and by fslab before a run exists
# (register(check=...)), with the training split's sizes once the dataset has told them.


def check_iid_batch(batch_size: int, images: int, drop_last: bool) -> None:
    if batch_size < 1:
        raise UsageError(f"iid sampler: train.batch_size must be >= 1, got {batch_size}")
    if drop_last and images < batch_size:
        raise UsageError(
            f"iid sampler: train.batch_size {batch_size} is larger than the {images} training "
            f"images, so drop_last would leave no batch; lower train.batch_size or set sampler.drop_last=false"
        )


def check_replacement_batch(batch_size: int, images: int) -> None:
    if not 1 <= batch_size <= images:
        raise UsageError(f"iid-replacement sampler: train.batch_size must be between 1 and the {images} "
                         f"training images, got {batch_size}")


def fixed_shape(batch_size: int, ways: int, per_class: int) -> tuple[int, int]:
    """(ways, per_class) of a fixed-composition batch, or a UsageError naming the key at fault."""
    if per_class < 2:
        raise UsageError(f"fixed sampler: sampler.per_class must be >= 2 (a class needs a positive pair), "
                         f"got {per_class}")
    if not ways:
        if batch_size % per_class:
            raise UsageError(
                f"fixed sampler: train.batch_size {batch_size} is not divisible by sampler.per_class {per_class}; "
                f"change one, or set sampler.ways explicitly"
            )
        ways = batch_size // per_class
    if ways < 2:
        raise UsageError(f"fixed sampler: a batch needs at least 2 classes, got ways={ways} (sampler.ways, or "
                         f"train.batch_size / sampler.per_class)")
    return ways, per_class


def fixed_batch(params: dict, batch_size: int) -> int:
    """The rows of a fixed-composition batch: ways × per_class when ways is given."""
    return params["ways"] * params["per_class"] if params["ways"] else batch_size


def check_classes_for(sampler: str, ways: int, images: int, have: int, split=None) -> None:
    """``ways`` classes with ``images`` images each, of which the training split has ``have``
    (``split``: its sizes, where known, to say what would fit)."""
    if have < ways:
        raise UsageError(f"{sampler}: {ways} ways (sampler.ways, or train.batch_size / sampler.per_class) need "
                         f"{ways} classes with at least {images} images each; the training set has {have}, "
                         f"so " + fewer_rows_hint(ways, have, split, "sampler.per_class"))


def fewer_rows_hint(ways: int, have: int, split, images: str) -> str:
    """What would fit the training split: fewer ways (where 2 or more classes hold enough images), or
    fewer images per class (what ``ways`` of its classes all hold), or, where it has fewer classes
    than ``ways``, both (``split``: its sizes, None where unknown; ``images`` names the keys)."""
    ways_hint = "sampler.ways (or train.batch_size / sampler.per_class) must be at most"
    hints = [f"{ways_hint} {have}"] if have >= 2 else []
    most = split.images_in(ways) if split is not None else 0
    if most:
        hints.append(f"{images} must be at most {most} (what {ways} of its classes all hold)")
    elif not hints and split is not None and split.classes >= 2:
        hints.append(f"{ways_hint} {split.classes} (its classes) and {images} at most "
                     f"{split.images_in(split.classes)}")
    return ", or ".join(hints) or f"lower sampler.ways or {images}"


def batch_size_of(context) -> int:
    return context.config["train"]["batch_size"]


def check_iid(params: dict, context) -> None:
    train = None if context is None else context.split("train")  # None: fslab.create, its constructor checks
    if train is not None:
        check_iid_batch(batch_size_of(context), train.images, params["drop_last"])


def check_replacement(params: dict, context) -> None:
    train = None if context is None else context.split("train")
    if train is not None:
        check_replacement_batch(batch_size_of(context), train.images)


def check_fixed(params: dict, context) -> None:
    if context is None:  # fslab.create: the constructor checks the shape against the batch_size it is given
        return
    ways, per_class = fixed_shape(batch_size_of(context), params["ways"], params["per_class"])
    train = context.split("train")
    if train is not None:
        check_classes_for("fixed sampler", ways, per_class, train.classes_with(per_class), train)


def centroid(support, query):
    """Nearest class centroid (NCA paper Sec. 3.4, "1-NN with class centroids").

    ``support [E, w, n, d]`` and ``query [E, Q, d]``; returns ``long [E, Q]``,
    the way index of the centroid closest to each query in squared Euclidean
    distance. Centring and normalisation are done by the evaluation core.
    """
    import torch

    centroids = support.mean(dim=2)  # [E, w, d]
    # argmin |q - c|² = argmax (q·c - |c|²/2): |q|² is the same for every way,
    # so one batched product scores all queries without a distance matrix.
    half_norms = 0.5 * (centroids * centroids).sum(-1)
    return torch.baddbmm(half_norms[:, None, :], query, centroids.transpose(1, 2), beta=-1.0).argmax(dim=-1)


@hookimpl
def register_losses(register):
    register(
        nca,
        name="nca",
        description="NCA loss over all pairs of a batch (Eq. 3): softmax over negative squared distances.",
        paper=PAPER,
        episodic=False,
        check=check_nca,
    )
    register(
        "fslab_plugins.methods.nca_temperature:LearnedTemperatureNCA",
        name="nca-learned-temperature",
        description="NCA loss (Eq. 3) whose temperature is trained with the network (the authors' "
                    "--optimize-temperature), starting from temperature; logged per step.",
        paper=PAPER,
        params={"temperature": 1.0, "pair_fraction": 1.0},
        episodic=False,
        check=check_nca,
    )
    register(
        supcon,
        name="supcon",
        description="Supervised contrastive loss: Khosla et al.'s L_out (form=khosla) or the NCA authors' "
                    "variant behind their App. A.3 figures (form=nca-code); cosine / temperature.",
        paper="Khosla et al., Supervised Contrastive Learning, NeurIPS 2020 (arXiv:2004.11362); "
              + PAPER + ", App. A.3",
        episodic=False,
        check=check_supcon,
    )


@hookimpl
def register_samplers(register):
    register(
        IIDSampler,
        name="iid",
        description="Mini-batches without replacement: every image once per epoch.",
        paper=PAPER,
        episodic=False,
        check=check_iid,
    )
    register(
        IIDReplacementSampler,
        name="iid-replacement",
        description="Mini-batches of distinct images drawn independently (with replacement across the epoch).",
        paper=PAPER + ", Fig. 4 row 2",
        episodic=False,
        check=check_replacement,
    )
    register(
        FixedCompositionSampler,
        name="fixed",
        description="Fixed batch composition: ways classes × per_class images, no support/query split.",
        paper=PAPER + ", Sec. 4.3 and App. A.7",
        episodic=False,
        check=check_fixed,
        batch=fixed_batch,
    )


@hookimpl
def register_evaluators(register):
    register(
        centroid,
        name="centroid",
        description="1-NN to class centroids in squared Euclidean distance.",
        paper=PAPER,
    )


@hookimpl
def register_methods(register):
    register(
        {"loss": {"name": "nca"}, "sampler": {"name": "iid"}, "evaluator": {"name": "centroid"}},
        name="nca",
        description="NCA loss on i.i.d. mini-batches, nearest-centroid evaluation.",
        paper=f"{PAPER}, Table 3",
    )
