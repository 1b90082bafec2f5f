"""Small value types shared by the core and plugins (no torch import here)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class LossOutput(NamedTuple):
    """What every loss returns.

    ``positives`` / ``negatives`` count the embedding pairs whose distance reaches
    the loss (as the NCA paper counts them, Sec. 3.3 and Table 1); ints or 0-d
    integer tensors (converted only when logged, so a GPU step does not wait for
    them). ``extra`` holds further counters, e.g. ``rows_without_positive``.
    """

    loss: Any
    positives: Any
    negatives: Any
    extra: dict | None = None


class Batch(NamedTuple):
    """One training batch drawn by a sampler: dataset indices, and for episodic
    samplers which rows are support (True) and which are query (False)."""

    indices: Sequence[int]
    support: Sequence[bool] | None = None


@dataclass
class Split:
    """One split of a dataset held in memory: uint8 images ``[N, C, H, W]``,
    int64 labels ``[N]`` numbered 0..len(classes)-1, and the class names."""

    images: Any
    labels: Any
    classes: list = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.labels.shape[0])


# Episodes an evaluation runs when none are asked for.
DEFAULT_EPISODES = 10000


@dataclass(frozen=True)
class EvaluatorTraits:
    """What the evaluation core needs to know about an evaluator. An evaluator
    declares a trait as an attribute of the same name (a class attribute, or
    one set on the function); anything left out keeps the default below.

    - ``metric``: ``"accuracy"`` (the evaluator predicts each query's way), or
      another name (``"map"``) for an evaluator that returns one score per
      episode itself;
    - ``needs_model``: it adapts the network, so it is called once per episode
      with a copy of the network and the episode's images (see
      :mod:`fslab.training.evaluation`);
    - ``episode_shape``: ``(shots, queries)`` it always needs, whatever was asked;
    - ``default_episodes``: episodes to run when none are asked for (a slow
      model-aware evaluator runs fewer).
    """

    metric: str = "accuracy"
    needs_model: bool = False
    episode_shape: tuple[int, int] | None = None
    default_episodes: int = DEFAULT_EPISODES


def trait_problem(evaluator: Any) -> str | None:
    """What is wrong with a trait ``evaluator`` declares (:class:`EvaluatorTraits`), in words, or None:
    ``metric = 5`` made a run refuse the evaluator's predictions as scores of the wrong shape,
    ``needs_model = "no"`` called it as a model-aware one, and a negative ``default_episodes``
    scored no episode."""
    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    metric = getattr(evaluator, "metric", "accuracy")
    if not isinstance(metric, str) or not metric:
        return f"its trait metric must be a name, 'accuracy' or that of its score per episode ('map'), got {metric!r}"
    needs_model = getattr(evaluator, "needs_model", False)
    if not isinstance(needs_model, bool):
        return f"its trait needs_model must be True or False, got {needs_model!r}"
    shape = getattr(evaluator, "episode_shape", None)
    if shape is not None and not (isinstance(shape, (tuple, list)) and len(shape) == 2 and all(map(whole, shape))):
        return f"its trait episode_shape must be (shots, queries), two whole numbers at least 1, or None, got {shape!r}"
    episodes = getattr(evaluator, "default_episodes", DEFAULT_EPISODES)
    if not whole(episodes):
        return f"its trait default_episodes must be a whole number at least 1, got {episodes!r}"
    return None


def evaluator_traits(evaluator: Any) -> EvaluatorTraits:
    """The traits ``evaluator`` declares, as the core reads them."""
    shape = getattr(evaluator, "episode_shape", None)
    return EvaluatorTraits(
        metric=getattr(evaluator, "metric", "accuracy"),
        needs_model=bool(getattr(evaluator, "needs_model", False)),
        episode_shape=None if shape is None else (int(shape[0]), int(shape[1])),
        default_episodes=int(getattr(evaluator, "default_episodes", DEFAULT_EPISODES)),
    )


@dataclass(frozen=True)
class SplitSizes:
    """A split's size as a dataset tells it without decoding an image: the
    number of images of each class (in any order)."""

    images_per_class: tuple[int, ...]

    @property
    def classes(self) -> int:
        return len(self.images_per_class)

    @property
    def smallest(self) -> int:
        return min(self.images_per_class, default=0)

    @property
    def images(self) -> int:
        return sum(self.images_per_class)

    def classes_with(self, images: int) -> int:
        """How many classes have at least ``images`` images."""
        return sum(1 for n in self.images_per_class if n >= images)

    def images_in(self, ways: int) -> int:
        """The most images per class that ``ways`` classes all have (0 when
        the split has fewer classes): the largest episode ``ways`` wide."""
        ranked = sorted(self.images_per_class, reverse=True)
        return ranked[ways - 1] if 1 <= ways <= len(ranked) else 0


@dataclass(frozen=True)
class CheckContext:
    """What a plugin's ``check`` (``register(..., check=...)``) sees besides
    its own parameters: the whole resolved configuration (``config["train"]
    ["batch_size"]``, ``config["eval"]["ways"]``; read it, do not change it),
    and the sizes of the dataset's splits by name (``"train"``, ``"val"``,
    ``"test"``) once the dataset has told them; ``sizes`` is None before that
    (when the configuration is resolved) and holds only the splits the
    dataset could tell."""

    config: dict
    sizes: dict[str, SplitSizes] | None = None

    def split(self, name: str) -> SplitSizes | None:
        """The sizes of split ``name``, or None while they are not known."""
        return None if self.sizes is None else self.sizes.get(name)


@dataclass
class SinkRun:
    """The run a sink is fed: its id and folder, its resolved configuration
    (``config.json``), the sweep it belongs to, whether the events are a
    replay of a run already on disk (``fslab export``) rather than live, and
    its ``state``: ``running`` while it trains; by the time the sink's
    ``close()`` is called, the state it ended in (``completed``, ``failed``,
    ``killed``). ``cut_short``: a replay whose events stopped before their end (an
    error, or a Ctrl-C between two writes, which no ``write`` saw), set before
    ``close()``: the sink keeps the run's earlier record rather than this part."""

    id: str
    path: Any  # pathlib.Path of runs/<id>/
    config: dict
    sweep: str | None = None
    replay: bool = False
    state: str = "running"
    cut_short: bool = False

    def tags(self) -> dict[str, str]:
        """The names a tracker files the run under: method, loss, backbone,
        dataset, evaluator, seed, and sweep when it has one."""
        def name(section: str) -> str:
            value = self.config.get(section)
            return str(value.get("name", "")) if isinstance(value, dict) else str(value or "")
        tags = {"run_id": self.id, "method": str(self.config.get("method", "")),
                **{key: name(key) for key in ("loss", "backbone", "dataset", "evaluator")},
                "seed": str(self.config.get("seed", ""))}
        if self.sweep:
            tags["sweep"] = self.sweep
        return tags
