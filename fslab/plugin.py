"""The plugin API: everything a plugin may use from fslab, in one module.

fslab's own plugins (``plugins/``) import from fslab only what is here, and a
contract checked in CI keeps it so; a third-party plugin that follows any
built-in plugin file therefore uses exactly what the built-ins use.
:data:`API_VERSION` is ``MAJOR.MINOR``: the minor number grows when something
is added here, the major one when something a plugin may rely on changes.

A plugin module implements one or more hooks, each receiving a ``register``
callback (:class:`Register`)::

    from fslab.plugin import LossOutput, hookimpl

    def margin_loss(z, labels, support=None, *, margin: float = 1.0) -> LossOutput: ...

    @hookimpl
    def register_losses(register):
        register(margin_loss, name="margin", description="...", paper="...")

The keyword-only parameters of a target (after ``*``) are the component's
parameters (``--set loss.margin=0.5``); fslab fills in those before ``*``.
What fslab calls, per kind, is written out by the protocols below; the
``info`` keywords ``register`` accepts are listed in :data:`INFO_KEYS`, and
evaluator traits in :class:`EvaluatorTraits`.

A package can also ship the study of its paper (``fslab study run NAME``): a
TOML file naming the paper, the sweeps and the published numbers, registered
by ``register_studies`` with :func:`register_study_files`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from fslab.core.errors import ConfigError, NotInstalled, UsageError
from fslab.core.events import canonical_evaluator, evaluator_label, own_evaluator
from fslab.core.files import temporary_path, writer_gone
from fslab.core.flocks import one_at_a_time
from fslab.core.global_batch import global_rows, rand_rows, sum_rows
from fslab.core.hookspecs import hookimpl
from fslab.core.keys import dotted
from fslab.core.limits import at_least, between, listing, matching, one_of, positive
from fslab.core.runstore import run_events
from fslab.core.text import count
from fslab.core.types import Batch, CheckContext, EvaluatorTraits, LossOutput, SinkRun, Split, SplitSizes

# 1.1: register(..., check=f) and CheckContext; Dataset.split_sizes() and SplitSizes.
# 1.2: register(..., allowed={param: rule}) with the rules at_least, positive, between, one_of,
#      matching, listing; a backbone whose __init__ names image_size is told the images' (height, width);
#      the register_studies hook (study TOML files) and register_study_files.
# 1.3: the register_sinks hook (Sink, SinkRun): trackers fed every event a run logs.
# 1.4: dotted(config): a configuration as dotted keys (train.lr), as trackers take parameters.
# 1.5: register(..., batch=f): a sampler whose own parameters fix the rows of a batch.
# 1.6: evaluator_label(section) and own_evaluator(config): the label an evaluation is saved under,
#      and that of the run's own evaluator, for a sink naming its evaluations.
# 1.7: canonical_evaluator(label): a label in its one spelling (parameters at their defaults left out,
#      the rest sorted), as evaluator_label now gives it; older runs' events may spell labels out.
# 1.8: fslab.create calls a component's check= too, with context None (no run to read).
# 1.9: a run's events and evaluations/ spell an evaluator's every parameter out (knn[k=0,ties=nearest]):
#      a sink naming evaluations reads their label through canonical_evaluator.
# 1.10: listing(rule, distinct=True): a list parameter that names each value once.
# 1.11: an evaluator whose signature names training_loss is given the run's loss section.
# 1.12: one_of(...) takes numbers as well as text (one_of(1, 5)).
# 1.13: count(n, noun): "1 image", "4 images", as fslab's own messages count things.
# 1.14: temporary_path(path) and writer_gone(path): a file written whole under a temporary name that
#       names its writer's pid and host, and whether that writer is gone, for a plugin that caches files
#       in a folder other nodes share.
# 1.15: NotInstalled, the UsageError a check= raises for a package missing here: a plugin's defaults
#       are checked as it loads (check= with context None), and a missing package is no fault of theirs.
# 1.16: run_events(run_path): a run's metrics.jsonl events as fslab reads them (whole lines only, each
#       with the fields of its kind), for a sink that replays what a run logged before a resume.
# 1.17: one_at_a_time(path, waiting): work one process does at a time (a decode into a shared cache),
#       its lock file naming the holder's pid and host, which a second process's waiting line names.
# 1.18: a sink class's optional reopen(run, **params): its record of a finished run reopened, to which
#       fslab eval adds its new events (the sink's write and close), or None (the whole run replayed then).
API_VERSION = "1.19"

__all__ = [
    "API_VERSION", "INFO_KEYS", "hookimpl", "Register",
    "LossOutput", "Batch", "Split", "EvaluatorTraits", "CheckContext", "SplitSizes",
    "Loss", "Backbone", "Sampler", "Classifier", "ModelEvaluator", "Dataset", "SizedDataset",
    "Sink", "SinkRun", "dotted", "evaluator_label", "own_evaluator", "canonical_evaluator",
    "UsageError", "ConfigError", "NotInstalled",
    "rand_rows", "global_rows", "sum_rows", "register_study_files",
    "at_least", "positive", "between", "one_of", "matching", "listing", "count",
    "temporary_path", "writer_gone", "run_events", "one_at_a_time",
]

# The extra keywords of register(), by the kinds that use them.
INFO_KEYS = {
    "episodic": "loss or sampler, bool: the loss needs support and query rows (Batch.support); "
                "a sampler that provides them says so too. A run pairing an episodic loss with a "
                "sampler that is not episodic is refused before it starts.",
    "defaults": "dataset, dict: configuration layered under the method recipe for runs on this "
                "dataset, e.g. {'train': {'epochs': 5}, 'eval': {'test_episodes': 2000}}.",
    "check_early": "dataset, bool: the constructor only checks its parameters and looks for its "
                   "files (no decoding), so fslab run, sweep and resume build it before creating a run "
                   "folder and a wrong root is one line at the prompt; its split_sizes() (SizedDataset), "
                   "if it has one, is then read there too.",
    "check": "any kind, a function check(params, context) -> None: raises UsageError (one line naming the "
             "key, e.g. 'loss.temperature must be > 0, got 0') for parameter values the component cannot "
             "use. params holds the section's parameters; context is a CheckContext (the whole "
             "configuration, and the split sizes once known). It runs when a configuration is resolved "
             "(sizes None) and again before a run is created or resumed, with the sizes the dataset "
             "tells; fslab.create runs it with context None (no run: check what the parameters alone "
             "decide; one that fails there with another exception than UsageError is left to the run). "
             "A package it needs that is missing here is NotInstalled (a UsageError): a run is refused with its "
             "line, while the plugin still loads (its defaults are checked then, and are not to blame). "
             "It must be cheap and import nothing heavy (no torch).",
    "batch": "sampler, a function batch(params, batch_size) -> int: the rows one batch holds, for a sampler "
             "whose own parameters can fix it (an episode's ways × (shots + queries)). fslab saves that "
             "number as train.batch_size, and refuses a train.batch_size set to another one.",
    "allowed": "any kind but method, a dict {parameter: rule}: the values each parameter allows, with the rules "
               "at_least(1), positive(), between(0, 1), one_of('euclidean', 'cosine'), matching(regex, text) and "
               "listing(rule) for a list. Checked when a configuration is resolved, before check=, as "
               "'config key 'evaluator.k' must be at least 1, got -3'; None (an unset optional parameter) passes. "
               "fslab plugins shows each rule next to its parameter.",
}


class Register(Protocol):
    """The callback each hook receives. ``target`` is a function or class, a
    lazy ``"module:attr"`` string imported only when the component is built
    (then ``params={name: default}`` must be given), or for a method recipe
    a dict (a partial configuration)."""

    def __call__(self, target: Any, *, name: str, description: str, paper: str = "",
                 params: dict | None = None, allowed: dict | None = None, **info: Any) -> None: ...


@runtime_checkable
class Loss(Protocol):
    """``register_losses``: embeddings ``z [B, d]``, ``labels [B]`` and, for an
    episodic loss, ``support [B]`` (True for support rows). A class loss may
    be an ``nn.Module`` with learnable parameters; if its ``__init__`` names
    ``out_dim`` or ``num_classes``, fslab passes the embedding size and the
    number of training classes."""

    def __call__(self, z: Any, labels: Any, support: Any = None) -> LossOutput: ...


@runtime_checkable
class Backbone(Protocol):
    """``register_backbones``: built as ``Backbone(in_channels, **params)``, an
    ``nn.Module`` mapping images ``[B, C, H, W]`` to features ``[B, out_dim]``.
    If its ``__init__`` names ``image_size`` (before or after ``*``), fslab also
    passes the images' ``(height, width)``; it is then not a parameter.
    For ``eval.feature_stages`` > 1 it also has ``stage_dims`` and
    ``features(x, stages)``. A layer that draws noise per row uses
    :func:`rand_rows` (and :func:`sum_rows`, :func:`global_rows` for sums over
    the batch), so ``--gpus N`` trains exactly as one process."""

    out_dim: int

    def __call__(self, x: Any) -> Any: ...


@runtime_checkable
class Sampler(Protocol):
    """``register_samplers``: built as ``Sampler(labels, batch_size, seed, **params)``;
    ``len()`` batches per epoch, each a :class:`Batch` of dataset indices."""

    def __len__(self) -> int: ...

    def batches(self, epoch: int) -> Iterator[Batch]: ...


@runtime_checkable
class Classifier(Protocol):
    """``register_evaluators``, the usual kind: ``support [E, ways, shots, d]``
    and ``query [E, ways*queries, d]`` features (centred and L2-normalised
    already) -> each query's predicted way ``[E, ways*queries]``; or, with the
    trait ``metric`` other than ``"accuracy"``, one score per episode ``[E]``."""

    def __call__(self, support: Any, query: Any) -> Any: ...


@runtime_checkable
class ModelEvaluator(Protocol):
    """``register_evaluators``, with the trait ``needs_model = True``: called
    once per episode with a working copy of the network (its weights restored
    after every episode), the episode's uint8 images and the input transform
    -> each query's predicted way ``[ways*queries]``."""

    def __call__(self, model: Any, support_images: Any, query_images: Any, *, to_input: Any, device: Any,
                 center: Any, normalize: bool) -> Any: ...


@runtime_checkable
class Dataset(Protocol):
    """``register_datasets``: built as ``Dataset(root, **params)``; ``channels``
    of its images, and ``load(split)`` for ``"train"``, ``"val"`` and ``"test"``.
    It may also have ``split_sizes()`` (:class:`SizedDataset`)."""

    channels: int

    def load(self, split: str) -> Split: ...


@runtime_checkable
class SizedDataset(Dataset, Protocol):
    """A :class:`Dataset` that can tell its splits' sizes without decoding an
    image (from its parameters, index files or a directory listing).
    ``split_sizes()`` maps each split it can tell (``"train"``, ``"val"``,
    ``"test"``) to the number of images of each of its classes, e.g.
    ``{"train": [600] * 64, ...}``; a split it cannot tell cheaply is left
    out. For a ``check_early`` dataset fslab calls it before a run exists and
    refuses episodes and batches the splits cannot give (``eval.ways`` more
    than a split's classes, ``eval.shots`` + ``eval.queries`` more than its
    classes hold), in one line. It may raise UsageError for a split it finds
    unusable (an empty class folder)."""

    def split_sizes(self) -> dict[str, list[int]]: ...


@runtime_checkable
class Sink(Protocol):
    """``register_sinks``: built as ``Sink(run, **params)`` with ``run`` a
    :class:`SinkRun`, on rank 0 only. ``write(event)`` gets each event of the
    run's ``metrics.jsonl`` (``start``, ``train``, ``eval``, ``checkpoint``,
    ``resume``, ``end``, ...), as written there and after it is written, in
    order; ``close()`` once at the end. A sink never holds the run up: fslab
    feeds it from a thread, drops events (with a warning) if it falls behind,
    and reports what it raises once to ``stderr.log``. ``fslab export`` feeds
    the same class a finished run's events with ``run.replay`` true; exporting
    a run again must replace what an earlier export wrote, not add to it.

    Optional (1.18): a class method ``reopen(run, **params)`` (the constructor's parameters), which
    ``fslab eval`` calls to send a finished run's new events alone (``run.replay`` true, ``run.state``
    its end state): it returns an object with ``write`` and ``close`` that adds them to the record the
    sink already holds of the run, on the steps an export of the whole run would place them at, so
    that the record then holds what such an export would; or None where it holds no record to add to
    (fslab then replays the whole run, as it does for a sink without ``reopen``, one whose record was
    recorded as lacking part of the run, or a lost run's). An addition cut short (``run.cut_short`` at
    ``close()``) leaves the record as it was."""

    def write(self, event: dict) -> None: ...

    def close(self) -> None: ...


def register_study_files(register: Register, folder: Any) -> None:
    """``register_studies``: register every ``*.toml`` study file in ``folder``
    (a :class:`pathlib.Path`) under the name the file gives. Each file is read
    and checked here, so a broken one fails its plugin's loading, naming the
    file and the key. The schema: README, "Reproducing the papers"::

        @hookimpl
        def register_studies(register):
            register_study_files(register, Path(__file__).parent)

    Ship the files as package data (``[tool.setuptools.package-data]``). A folder
    with no study file (the files left out of the installed package), and two
    files giving one name, fail the plugin's loading, naming the folder or files."""
    from pathlib import Path

    from fslab.core.studies import study_entry  # here: listing plugins need not load the study schema

    paths = sorted(Path(folder).glob("*.toml"))
    if not paths:
        where = "is not a folder" if not Path(folder).is_dir() else "holds no study file (*.toml)"
        raise ConfigError(f"register_study_files: {folder} {where}; ship the study files with the package as "
                          f"package data ([tool.setuptools.package-data] \"mypkg.studies\" = [\"*.toml\"])")
    seen: dict[str, Path] = {}
    for path in paths:
        entry = study_entry(path)
        if entry["name"] in seen:
            raise ConfigError(f"{path}: name: '{entry['name']}' is also the name {seen[entry['name']]} gives; "
                              f"each study file needs a name of its own")
        seen[entry["name"]] = path
        register(path, **entry)
