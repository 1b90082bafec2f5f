"""Few-shot evaluation: features once per split, many episodes, mean ± 95% CI.

The protocol is the NCA paper's (Sec. 3.4 and 4.1): w-way n-shot
episodes with q queries per class drawn from held-out classes, features centred
by the training mean and L2-normalised, one score per episode (its accuracy,
or for a retrieval evaluator its mAP), reported as mean ± 1.96·std/√N.

Two things make this fast and comparable. With batch norm in eval mode and a
non-transductive classifier, an image's features do not depend on the episode,
so a split's features are extracted once and episodes only gather rows. And
episodes are drawn in bulk from a seeded ``torch.Generator``, so a fixed
evaluation seed gives the same episodes in every run: two methods are compared
on identical episodes.

The evaluator interface. An evaluator is a callable from the registry:

- by default ``evaluator(support [e, w, n, d], query [e, w*q, d]) -> long [e, w*q]``,
  each query's predicted way on already centred and normalised features (queries
  come way by way, so the truth is ``[0]*q + [1]*q + ...``); the score of an
  episode is its accuracy; predictions (and scores) may be on any device, moved
  to the features' (:func:`readable`);
- ``metric = "map"`` (any name but ``"accuracy"``): it returns each episode's
  score directly, ``float [e]`` in [0, 1] (retrieval mAP);
- ``episode_shape = (shots, queries)``: the episode shape it needs, replacing
  the shots and queries asked for (retrieval: 10 images per class as 1 + 9);
- ``needs_model = True``: it adapts the network, so it sees images, not
  features. It is called once per episode as ``evaluator(model, support_images
  [w, n, C, H, W], query_images [w*q, C, H, W], *, to_input, device, center,
  normalize) -> long [w*q]`` with a working copy of the network whose weights
  the core restores after every episode (the caller's network is never
  touched); ``default_episodes`` says how many episodes to run when none are
  asked for, since such evaluators are slow.

Only the training worker and ``fslab eval`` import this module, so importing
torch here is fine.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F

from fslab.core.errors import FslabError, UsageError, exception_words
from fslab.core.events import kept_scores, mean_ci
from fslab.core.text import count, queries_text
from fslab.core.types import evaluator_traits

# Episodes are drawn in blocks of this many; it is a constant (not a parameter)
# because the random stream, and therefore the episodes, depend on it. Whole
# blocks are always drawn, so the first N episodes are the same whatever the
# number asked for.
EPISODE_BLOCK = 500
# The version of the episode stream a seed gives; saved with every evaluation
# so that evaluations drawn from different streams are never paired.
# Stream 1 (before): random keys per image and topk; stream 2: Floyd's algorithm.
EPISODE_STREAM = 2
# Episodes per chunk of the feature path: small enough that a chunk's gathered
# features (100 × 100 × 640 floats, 26 MB) stay in cache, large enough that
# Python overhead is negligible (benchmarks/bench_eval.py).
EPISODE_CHUNK = 100
def episode_shapes(evaluator, shots: Sequence[int], queries: int) -> list[tuple[int, int]]:
    """The (shots, queries) pairs to evaluate: one per number of shots asked
    for, or the evaluator's own fixed shape once."""
    fixed = evaluator_traits(evaluator).episode_shape
    if fixed is not None:
        return [fixed]
    return [(int(n), int(queries)) for n in dict.fromkeys(shots)]


def ci95(accuracies: Sequence[float] | torch.Tensor) -> tuple[float, float]:
    """Mean and 95% confidence half-width ``1.96 * std / sqrt(N)`` of the scores as
    ``evaluations/`` keeps them (:func:`fslab.core.events.kept_scores`), computed by
    :func:`fslab.core.events.mean_ci`, which compare pools with: a run's logged score and
    the one compare reads back from its saved episodes are the same number.

    ``std`` is the population standard deviation (ddof=0, numpy's default), as
    in the SimpleShot and NCA evaluation code; with thousands of episodes the
    difference from ddof=1 is far below the reported precision.
    """
    values = torch.as_tensor(accuracies, dtype=torch.float64).flatten()
    if values.numel() == 0:
        raise UsageError("ci95: no accuracies to summarise")
    return mean_ci(kept_scores(values.tolist()))


def floyd_subsets(sizes: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """``k`` distinct positions in ``range(sizes[r])`` for each row r, ``long [R, k]``,
    from ``k`` uniform numbers per row (``uniforms [R, k]`` in [0, 1); every
    ``sizes[r] >= k``).

    Robert Floyd's algorithm, vectorised over rows: for t = size-k .. size-1,
    draw j uniformly in [0, t] and take j, or t if j is already taken. The
    *set* is a uniform k-subset (the order is not uniform: use the set, or
    split it with a second subset). It needs k random numbers per row against
    one per image for random keys, and never retries.
    """
    rows, k = uniforms.shape
    sizes = sizes.to(torch.long)
    picked = torch.empty(rows, k, dtype=torch.long)
    for step in range(k):
        top = sizes - k + step  # draw from 0..top
        candidate = torch.minimum((uniforms[:, step] * (top + 1)).long(), top)
        taken = (picked[:, :step] == candidate[:, None]).any(dim=1)
        picked[:, step] = torch.where(taken, top, candidate)
    return picked


def check_classes(labels: Sequence[int] | torch.Tensor, ways: int, shots: int, queries: int) -> None:
    """A UsageError unless ``ways`` classes of ``labels`` have ``shots + queries`` images each
    (classes with fewer are never drawn), so a command can check every shape before it scores any."""
    counts = torch.unique(torch.as_tensor(labels, dtype=torch.long).flatten().cpu(), return_counts=True)[1]
    _check_counts(counts, ways, shots, queries)


def check_refused(evaluator: Callable, ways: int, shots: Sequence[int], queries: int) -> None:
    """The UsageError ``evaluator`` raises for episodes of one of its shapes
    (:func:`episode_shapes`; knn's ``k`` above a 1-shot episode's support points),
    found on one episode of blank features before any split is embedded, which
    can take minutes. A model-aware evaluator gets one blank episode of 1×1 images
    and a network without weights (``finetune`` refuses a 1-shot support set there,
    not after the 5-shot episodes of ``--shots 5,1`` were fine-tuned one by one).
    Whatever else a blank episode makes it raise is left to the real episodes,
    where it is named."""
    model_aware = evaluator_traits(evaluator).needs_model
    for n, q in episode_shapes(evaluator, shots, queries):
        try:
            if model_aware:  # no weights: whatever it would adapt fails at once, and that is left to the episodes
                evaluator(torch.nn.Flatten(), torch.zeros(ways, n, 1, 1, 1, dtype=torch.uint8),
                          torch.zeros(ways * q, 1, 1, 1, dtype=torch.uint8), to_input=lambda x: x.float(),
                          device="cpu", center=None, normalize=True)
            else:
                evaluator(torch.zeros(1, ways, n, 2), torch.zeros(1, ways * q, 2))
        except UsageError:
            raise
        except Exception:  # blank features are no real episode: the real ones say what fails
            continue


def _check_counts(counts: torch.Tensor, ways: int, shots: int, queries: int) -> None:
    """:func:`check_classes` on the images per class (``counts``) already counted. Any whole numbers:
    a class of more images than a 64-bit count holds there is none (torch's comparison with one raised
    OverflowError: ``fslab eval --shots 99999999999999999999999`` was a traceback)."""
    need = shots + queries
    enough = int((counts >= need).sum()) if need < 2**63 else 0
    if enough < ways:
        raise UsageError(
            f"{ways}-way episodes with {count(shots, 'shot')} and {queries_text(queries)} "
            f"need {ways} classes "
            f"with at least {shots + queries} images; this split has {enough} such "
            f"class{'es' * (enough != 1)} (of {counts.numel()}){_what_fits(counts, ways, enough)}"
        )


def _what_fits(counts: torch.Tensor, ways: int, enough: int) -> str:
    """What the split can give instead, for :func:`_check_counts`' line: the most images per class
    (shots + queries) at ``ways`` ways, and the most ways at the shots and queries asked (``enough``
    classes have that many images); empty where neither makes an episode (2 ways, 1 + 1 images)."""
    fits, sizes = [], counts.sort(descending=True).values
    largest = int(sizes[min(ways, counts.numel()) - 1])  # images of the smallest of the fullest classes
    if counts.numel() >= ways and largest >= 2:
        fits.append(f"at {ways} ways, shots + queries can be at most {largest}")
    elif enough < 2 and counts.numel() >= 2 and largest >= 2:  # more ways than the split has classes
        fits.append(f"at most {counts.numel()} ways, with shots + queries at most {largest}")
    if enough >= 2:
        fits.append(f"at these shots and queries, at most {enough} ways")
    return f": {'; '.join(fits)}" if fits else ""


def sample_episodes(
    labels: Sequence[int] | torch.Tensor,
    ways: int,
    shots: int,
    queries: int,
    episodes: int,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``episodes`` few-shot episodes as dataset indices.

    Returns ``support_idx [E, ways, shots]`` and ``query_idx [E, ways, queries]``.
    Each episode has ``ways`` distinct classes and ``shots + queries`` distinct
    images per class, split into support and queries uniformly at random;
    classes with fewer images than that are never drawn. The same arguments
    always give the same episodes, on every machine (the generator is a CPU
    one), and episode i does not depend on ``episodes``.
    """
    blocks = list(episode_blocks(labels, ways, shots, queries, episodes, seed))
    return torch.cat([b[0] for b in blocks]), torch.cat([b[1] for b in blocks])


def episode_blocks(
    labels: Sequence[int] | torch.Tensor,
    ways: int,
    shots: int,
    queries: int,
    episodes: int,
    seed: int,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`sample_episodes`' episodes block by block (``EPISODE_BLOCK`` episodes each, the
    last one cut at ``episodes``), so that scoring many wide episodes holds one block's draws
    in memory at a time, not all of them (a million 40-way episodes: tens of GB)."""
    labels = torch.as_tensor(labels, dtype=torch.long).flatten().cpu()
    per_class = shots + queries
    if ways < 2 or shots < 1 or queries < 1 or episodes < 1:
        raise UsageError(
            f"episodes need ways >= 2, shots >= 1, queries >= 1 and at least one episode; "
            f"got ways={ways}, shots={shots}, queries={queries}, episodes={episodes}"
        )
    classes, counts = torch.unique(labels, return_counts=True)
    _check_counts(counts, ways, shots, queries)
    eligible = classes[counts >= per_class]
    # Each eligible class's dataset indices are a run of `order`, from `starts`.
    order = torch.argsort(labels, stable=True)
    class_counts = counts[counts >= per_class]
    starts = torch.searchsorted(labels[order], eligible)

    # The random numbers are drawn block by block (so episode i does not depend
    # on how many are asked for); the arithmetic runs on a block's rows at once.
    generator = torch.Generator().manual_seed(int(seed))
    for first in range(0, episodes, EPISODE_BLOCK):
        # The `ways` smallest of one random key per class: distinct random classes.
        keys = torch.rand(EPISODE_BLOCK, eligible.numel(), generator=generator)
        chosen = keys.topk(ways, dim=1, largest=False).indices
        image_uniforms = torch.rand(EPISODE_BLOCK * ways, per_class, generator=generator, dtype=torch.float64)
        split_uniforms = torch.rand(EPISODE_BLOCK * ways, shots, generator=generator, dtype=torch.float64)
        count = min(EPISODE_BLOCK, episodes - first)
        chosen = chosen[:count].flatten()  # [e * ways]
        rows = chosen.numel()
        images = floyd_subsets(class_counts[chosen], image_uniforms[:rows])  # [e * ways, per_class]
        in_support = torch.zeros(rows, per_class, dtype=torch.bool)
        in_support.scatter_(1, floyd_subsets(torch.full((rows,), per_class), split_uniforms[:rows]), True)
        indices = order[starts[chosen][:, None] + images]
        yield indices[in_support].view(count, ways, shots), indices[~in_support].view(count, ways, queries)


def prepare_features(features: torch.Tensor, center: torch.Tensor | None, normalize: bool) -> torch.Tensor:
    """Centre by the training mean (if given), then L2-normalise (if asked):
    SimpleShot's normalisation, applied once per split."""
    features = features.float()
    if center is not None:
        features = features - center.to(features)
    if normalize:
        features = F.normalize(features, dim=1)
    return features


class EvaluatorError(Exception):
    """An evaluator raised, or returned predictions or scores of the wrong shape. ``did`` says what
    it did ("failed: ...", "returned shape ..."); :meth:`naming` puts the evaluator's name before
    it, where the caller knows the name."""

    def __init__(self, did: str) -> None:
        super().__init__(f"evaluator {did}")
        self.did = did

    def naming(self, name: str) -> str:
        return f"evaluator '{name}' {self.did}"

    def blaming(self, named: str) -> str:
        """The line with the evaluator as :attr:`fslab.core.registry.Component.named` names it, its plugin too."""
        return f"{named} {self.did}"


class EvaluatorOutputError(EvaluatorError, ValueError):
    """An evaluator returned predictions or scores of the wrong shape."""


def tensor_out(out):
    """``out`` if the evaluator returned a tensor, else an :class:`EvaluatorOutputError` saying what
    it returned (a list or an array has no ``shape`` to check, or not the one a tensor has)."""
    if not isinstance(out, torch.Tensor):
        raise EvaluatorOutputError(f"returned a {type(out).__name__}, not a tensor")
    return out


def call_evaluator(evaluator: Callable, *args, **kwargs):
    """``evaluator(*args, **kwargs)``; an exception of its own (a plugin's bug) as an
    :class:`EvaluatorError`, so that a command says which evaluator failed in one line. An
    :class:`FslabError` (a value the evaluator refuses) goes on as it is."""
    try:
        return evaluator(*args, **kwargs)
    except FslabError:
        raise
    except Exception as exc:
        raise EvaluatorError(f"failed: {exception_words(exc)}") from exc


def episode_scores(
    features: torch.Tensor,
    labels: Sequence[int] | torch.Tensor,
    evaluator: Callable,
    ways: int,
    shots: int,
    queries: int,
    episodes: int,
    seed: int,
    *,
    center: torch.Tensor | None = None,
    normalize: bool = True,
    chunk: int = EPISODE_CHUNK,
) -> torch.Tensor:
    """The score of ``evaluator`` on each of ``episodes`` episodes, ``float [E]``.

    ``features [N, d]`` are one split's features, extracted once. ``center``
    (the mean training feature) is subtracted and rows are L2-normalised before
    any episode is drawn. The score is the episode's accuracy for an evaluator
    that predicts ways, or whatever a scoring evaluator returns (module docstring).
    """
    info = evaluator_traits(evaluator)
    if info.needs_model:
        raise UsageError("this evaluator adapts the network: evaluate it with model_episode_scores")
    chunk = max(1, chunk)
    features = prepare_features(features, center, normalize)
    device = features.device
    truth = torch.arange(ways, device=device).repeat_interleave(queries)
    scores, outside = [], []
    # a block's indices go to the device at once: one copy (and wait) per block, not per chunk
    blocks = ((s.to(device), q.to(device)) for s, q in episode_blocks(labels, ways, shots, queries, episodes, seed))
    for rows_s, rows_q in _chunks(blocks, chunk):
        # index_select on flat indices is the fastest gather; chunks stay in cache
        support = features.index_select(0, rows_s.flatten()).view(*rows_s.shape, -1)  # [e, w, n, d]
        query = features.index_select(0, rows_q.flatten()).view(rows_q.shape[0], -1, features.shape[1])  # [e, w*q, d]
        out = tensor_out(call_evaluator(evaluator, support, query))
        if info.metric == "accuracy":
            if out.shape != query.shape[:2]:
                raise EvaluatorOutputError(f"returned shape {tuple(out.shape)}, "
                                           f"expected predictions {tuple(query.shape[:2])}")
            out = readable(checked_predictions(out, ways), device, "predictions")
            scores.append((out == truth).sum(dim=1))  # counts: divided on the CPU
            outside.append(past_ways(out, ways))  # read once, below: no wait per chunk
        else:
            if out.shape != (query.shape[0],):
                raise EvaluatorOutputError(f"returned shape {tuple(out.shape)}, "
                                           f"expected one score per episode ({query.shape[0]},)")
            scores.append(readable(out, device, "scores").float())
    scores = torch.cat(scores).cpu()
    if info.metric != "accuracy":
        return checked_scores(scores, info.metric)
    if bool(torch.stack(outside).any()):
        raise outside_ways(ways)
    # CUDA divides by a scalar through its reciprocal: dividing on the CPU
    # gives the same accuracies, to the last bit, whatever the device.
    return scores.float() / truth.numel()


def checked_predictions(out: torch.Tensor, ways: int) -> torch.Tensor:
    """``out`` if its dtype is that of predicted ways (whole numbers), else an :class:`EvaluatorOutputError`:
    float predictions (2.5) were compared with the ways as they were, and counted wrong in silence."""
    if out.is_floating_point() or out.is_complex() or out.dtype == torch.bool:
        raise EvaluatorOutputError(f"returned predictions of dtype {out.dtype}; it predicts each query's way, "
                                   f"a whole number 0..{ways - 1} (argmax or argmin gives int64), or declares "
                                   f"the trait metric for a score per episode")
    return out


def readable(out: torch.Tensor, device: torch.device | str, what: str) -> torch.Tensor:
    """An evaluator's ``out`` (its ``what``, predictions or scores) on ``device``, where fslab reads them,
    wherever the evaluator left them (a CPU library's predictions for CUDA features failed the comparison
    with the truth in PyTorch's words, naming no evaluator); an :class:`EvaluatorOutputError` where they
    cannot be copied there (a tensor on the meta device holds no values)."""
    if out.device == torch.device(device):
        return out
    try:
        return out.to(device)
    except (RuntimeError, NotImplementedError) as error:
        raise EvaluatorOutputError(f"returned {what} on the device {out.device}, which fslab cannot read on "
                                   f"{device} ({error}); return a tensor that holds its values, on any device "
                                   f"(fslab moves it)") from None


def past_ways(predictions: torch.Tensor, ways: int) -> torch.Tensor:
    """Whether any of ``predictions`` is no way of a ``ways``-way episode (a 0-d bool tensor, left on
    the predictions' device: its reader decides when to wait)."""
    return ((predictions < 0) | (predictions >= ways)).any()


def outside_ways(ways: int) -> EvaluatorOutputError:
    """Predictions past the episode's ways (a label of the split, not a way) were counted wrong in silence."""
    return EvaluatorOutputError(f"returned a predicted way outside 0..{ways - 1} for a {ways}-way episode; it "
                                f"predicts each query's way, numbered as the support's")


def checked_scores(scores: torch.Tensor, metric: str) -> torch.Tensor:
    """An evaluator's scores (trait ``metric``), one per episode, if each is a finite number in [0, 1];
    else an :class:`EvaluatorOutputError`: NaN or 3.0 was saved as the run's result."""
    broken = ~torch.isfinite(scores) | (scores < 0) | (scores > 1)
    if bool(broken.any()):
        raise EvaluatorOutputError(f"returned the {metric} {scores[broken][0].item()!r} for an episode; a score "
                                   f"per episode is a finite number in [0, 1]")
    return scores


def _chunks(blocks: Iterator[tuple[torch.Tensor, torch.Tensor]], chunk: int
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The episodes of ``blocks`` in runs of ``chunk`` (the last one shorter), across the blocks' bounds."""
    carry = None
    for support, query in blocks:
        if carry is not None:
            support, query = torch.cat([carry[0], support]), torch.cat([carry[1], query])
        whole = len(support) - len(support) % chunk
        for first in range(0, whole, chunk):
            yield support[first : first + chunk], query[first : first + chunk]
        carry = (support[whole:], query[whole:]) if whole < len(support) else None
    if carry is not None:
        yield carry


def model_episode_scores(
    model: torch.nn.Module,
    images: torch.Tensor,
    labels: Sequence[int] | torch.Tensor,
    evaluator: Callable,
    ways: int,
    shots: int,
    queries: int,
    episodes: int,
    seed: int,
    *,
    to_input: Callable[[torch.Tensor], torch.Tensor],
    device: torch.device | str,
    center: torch.Tensor | None = None,
    normalize: bool = True,
) -> torch.Tensor:
    """Accuracy of a model-aware evaluator (``needs_model``) on each episode.

    ``images`` are the split's uint8 images ``[N, C, H, W]``. The episodes are
    the first ``episodes`` of the same seeded stream as :func:`episode_scores`.
    The evaluator works on a copy of ``model``, reset to the original weights
    (and buffers) before every episode; ``model`` itself is left unchanged.
    """
    support_idx, query_idx = sample_episodes(labels, ways, shots, queries, episodes, seed)
    original = getattr(model, "module", model)  # a DDP-wrapped network: its module
    working = copy.deepcopy(original).to(device)
    weights = {k: v.detach().clone() for k, v in working.state_dict().items()}
    truth = torch.arange(ways).repeat_interleave(queries)
    scores = []
    try:
        for e in range(episodes):
            support_images = images[support_idx[e].flatten()].view(ways, shots, *images.shape[1:])
            query_images = images[query_idx[e].flatten()]
            predictions = tensor_out(call_evaluator(evaluator, working, support_images, query_images,
                                                    to_input=to_input, device=device, center=center,
                                                    normalize=normalize))
            if predictions.shape != truth.shape:
                raise EvaluatorOutputError(f"returned shape {tuple(predictions.shape)}, "
                                           f"expected ({truth.numel()},)")
            predictions = readable(checked_predictions(predictions, ways), "cpu", "predictions")
            if bool(past_ways(predictions, ways)):
                raise outside_ways(ways)
            scores.append((predictions == truth).sum().float() / truth.numel())
            working.load_state_dict(weights)
    finally:
        del working
    return torch.stack(scores)


def run_episodes(
    evaluator: Callable,
    labels: Sequence[int] | torch.Tensor,
    ways: int,
    shots: int,
    queries: int,
    episodes: int,
    seed: int,
    *,
    features: Callable[[], torch.Tensor] | torch.Tensor | None = None,
    model: torch.nn.Module | None = None,
    images: torch.Tensor | None = None,
    to_input: Callable | None = None,
    device: torch.device | str = "cpu",
    center: torch.Tensor | None = None,
    normalize: bool = True,
) -> torch.Tensor:
    """Per-episode scores of any evaluator: through the cached ``features``
    (a tensor, or a function that returns them), or through ``model`` and
    ``images`` for a model-aware one."""
    if evaluator_traits(evaluator).needs_model:
        if model is None or images is None or to_input is None:
            raise ValueError("a model-aware evaluator needs the model, the split's images and the input transform")
        return model_episode_scores(model, images, labels, evaluator, ways, shots, queries, episodes, seed,
                                    to_input=to_input, device=device, center=center, normalize=normalize)
    if callable(features):
        features = features()
    # The episodes run where the run trains: on a GPU, 10,000 episodes take a fraction of a second.
    return episode_scores(features.to(device), labels, evaluator, ways, shots, queries, episodes, seed,
                          center=center, normalize=normalize)


def extract_features(
    model: torch.nn.Module,
    images_uint8: torch.Tensor,
    batch_size: int,
    device: torch.device | str,
    normalize_fn: Callable[[torch.Tensor], torch.Tensor],
    autocast: Callable[[], AbstractContextManager] = nullcontext,
) -> torch.Tensor:
    """Embed every image once: ``uint8 [N, C, H, W]`` -> ``float32 [N, d]`` on the CPU.

    Runs in eval mode (batch norm uses its running statistics, so features do
    not depend on what else is in the batch) and restores the model's mode
    afterwards. ``normalize_fn`` turns a uint8 batch already on ``device`` into
    the network's float input; the network runs under ``autocast()`` (the
    run's ``eval.precision``) and its output is float32 before anything else
    sees it (fslab.training.numerics).
    """
    was_training = model.training
    model.eval()
    outputs = []
    try:
        with torch.no_grad():
            for first in range(0, images_uint8.shape[0], batch_size):
                batch = images_uint8[first : first + batch_size].to(device, non_blocking=True)
                with autocast():
                    embedded = model(normalize_fn(batch))
                outputs.append(embedded.float())  # kept on the device: no wait for each batch
    finally:
        model.train(was_training)
    if not outputs:
        raise UsageError("extract_features: no images to embed")
    features = torch.cat(outputs).cpu()
    broken = ~torch.isfinite(features).all(dim=1)
    if broken.any():  # a diverged network would score chance on every episode, 20.00 ± 0.00% at 5 ways, silently
        kind = "nan" if torch.isnan(features).any() else "inf"
        raise FslabError(f"the network's features of {int(broken.sum())} of {len(features)} images hold {kind}: "
                         f"its weights or batch-norm statistics are not finite (a run that diverged), "
                         f"or its features overflow eval.precision")
    return features
