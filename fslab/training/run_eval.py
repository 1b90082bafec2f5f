"""``fslab eval``: evaluate a run's checkpoint on many episodes, features cached.

The backbone embeds each image of a split once; the features are cached in
``runs/<id>/features/<split>-epoch<E>.pt`` (keyed by the checkpoint's epoch, so
a newer checkpoint is embedded again; ``-stages<k>`` is added for multi-stage
features, ``eval.feature_stages`` > 1, and ``-bf16`` or ``-fp16`` for features
embedded in that precision: the run's ``eval.precision``, or ``fslab eval --precision``'s,
so features of one precision are never read for another). The file holds digests of the split's
data and of the weights: other data, or another checkpoint of the same epoch
(copied in from another run), is embedded again. Episodes come from the fixed evaluation
seed of the run's configuration, so every run is scored on the same episodes
and two runs can be compared episode by episode. Each evaluation is appended to
``metrics.jsonl`` as an ``eval`` event, and its per-episode scores are kept
in ``runs/<id>/evaluations/`` for paired comparisons, under the evaluator's
label (its name, plus its parameters when any are set: ``knn[k=3]``).

A model-aware evaluator (``finetune``) adapts the network on every episode,
so it gets the checkpoint's network and the split's images instead of cached
features, and runs its own small default number of episodes.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from fslab.core.commands import like_command
from fslab.core.config import RunConfig, run_config
from fslab.core.errors import FslabError, UsageError, plugin_call
from fslab.core.eventlog import EventLog
from fslab.core.events import recorded_evaluator
from fslab.core.files import remove_orphaned_temporaries, written_whole
from fslab.core.flocks import one_at_a_time
from fslab.core.registry import Registry, load_registry
from fslab.core.rerun import check_evaluable
from fslab.core.runstore import Run
from fslab.core.settings import load_settings
from fslab.core.summary import recorded_precision
from fslab.core.types import evaluator_traits
from fslab.training.build import (
    build_backbone,
    build_dataset,
    build_evaluator,
    image_size_of,
    pick_device,
    plugin_kwargs,
)
from fslab.training.checkpoint import (
    finite_names,
    load_checkpoint,
    load_saved,
    mismatch_reason,
    nonfinite_entry,
    write_failure,
)
from fslab.training.distributed import torch_own_errors
from fslab.training.evaluation import check_refused
from fslab.training.features import feature_network, training_mean
from fslab.training.numerics import apply_backend_settings, embed, resolve_numerics
from fslab.training.record import (
    Episodes,
    EvaluationInputs,
    data_fingerprint,
    episode_count,
    evaluate_and_record,
    weights_fingerprint,
)


class Checkpoint:
    """The run's last checkpoint, and the network and split images built from
    it on demand (embedding a split needs both; a cached split needs neither)."""

    def __init__(self, run: Run, cfg: RunConfig, device: torch.device, registry: Registry) -> None:
        self.run, self.cfg, self.device, self.registry = run, cfg, device, registry
        self.state = load_checkpoint(run.checkpoint_path, "cpu")
        self.epoch = self.state["epoch"]
        self.stages = cfg.eval.feature_stages
        self.numerics = resolve_numerics(cfg, device)  # features in eval.precision and the run's memory format
        self.own_precision = self.numerics.eval_precision  # the run's, whatever embed_in() asks for since
        # ... and with its TF32 and deterministic algorithms, as training evaluated it (a CUDA GPU's
        # float32 matrix products differ with TF32; its convolutions are autotuned without determinism)
        apply_backend_settings(self.numerics)
        self._dataset = None

    def embed_in(self, precision: str) -> None:
        """Embed in ``precision`` rather than the run's own (``fslab eval --precision``), before anything is."""
        self.numerics = replace(self.numerics, eval_precision=precision)

    @property
    def other_precision(self) -> str | None:
        """The run's own precision where the features are embedded in another (:meth:`embed_in`), else None."""
        return self.own_precision if self.numerics.eval_precision != self.own_precision else None

    def dataset(self):
        if self._dataset is None:
            self._dataset = build_dataset(self.registry, self.cfg)
        return self._dataset

    def network(self) -> torch.nn.Module:
        """The evaluation network (the backbone, or its multi-stage features) on the device."""
        image_size = None
        if self.registry.accepts("backbone", self.cfg.backbone["name"], "image_size"):
            # every split of a dataset has one image size; the test split is the one evaluated most
            image_size = image_size_of(self.dataset().load("test"))
        model = build_backbone(self.registry, self.cfg, self.dataset().channels, self.device, image_size)
        finite = finite_names(model.state_dict())  # a buffer infinite by design (a mask of -inf) is left alone
        try:
            model.load_state_dict(self.state["model"])
        except RuntimeError as exc:  # weights of another network: torch lists every key
            raise FslabError(f"the checkpoint {self.run.checkpoint_path} does not fit the run's backbone "
                             f"'{self.cfg.backbone['name']}': {mismatch_reason(exc)}") from None
        broken = nonfinite_entry(model.state_dict(), finite)
        if broken is not None:  # its network would score chance on every episode (20.00 ± 0.00% at 5 ways)
            raise UsageError(f"the checkpoint {self.run.checkpoint_path} (epoch {self.epoch}) is not finite: its "
                             f"{broken}, as a run that diverged leaves it; train it again with a lower learning "
                             f"rate: {like_command(self.run.id)} --lr {self.cfg.train.lr / 10:g}")
        if self.numerics.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return feature_network(model, self.stages)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """float32 features of ``images``, embedded as training embedded them for evaluation; what the
        backbone raises, one line naming it and its plugin."""
        network, blamed = self.network(), self.registry.get("backbone", self.cfg.backbone["name"]).named
        return plugin_call(lambda: embed(network, images, self.cfg.eval.batch_size, self.numerics),
                           f"{blamed} failed", passes=torch_own_errors())


def load_features(run: Run, split: str, checkpoint: Checkpoint, warn: Callable[[str], None]) -> tuple:
    """The split's features and labels from the cache, or embedded now and cached (a cache the disk refuses:
    ``warn``'s line), whether they were cached, and the split's fingerprint. The cache holds the fingerprint of the
    split's images and labels and of the network's weights: data changed on disk since (a class
    added or removed, images replaced), or another checkpoint of the same epoch (copied in from
    another run), is embedded again, never scored with stale features."""
    stages, precision = checkpoint.stages, checkpoint.numerics.eval_precision  # each cached apart
    name = (f"{split}-epoch{checkpoint.epoch}" + (f"-stages{stages}" if stages > 1 else "")
            + (f"-{precision}" if precision != "fp32" else ""))
    cache = run.path / "features" / f"{name}.pt"
    data = checkpoint.dataset().load(split)  # from the dataset's own cache: far cheaper than embedding
    digest, weights = data_fingerprint(data.images, data.labels), weights_fingerprint(checkpoint.state["model"])
    saved = cached_features(cache, digest, weights)
    if saved is not None:
        return *saved, True, digest
    with embedding(cache, split):  # another fslab eval embedding it now: its features, once written, are these
        saved = cached_features(cache, digest, weights)
        if saved is not None:
            return *saved, True, digest
        features = checkpoint.embed(data.images)
        if _cache_features(cache, {"features": features, "labels": data.labels, "epoch": checkpoint.epoch,
                                   "data": digest, "weights": weights}, warn):
            _drop_older_epochs(cache.parent, split, checkpoint.epoch)
    return features, data.labels, False, digest


def _drop_older_epochs(folder: Path, split: str, epoch: int) -> None:
    """Remove the split's caches of earlier epochs: a run keeps only its last checkpoint, so no
    later fslab eval can read them (a run evaluated at each epoch as it trains kept one file each,
    tens of megabytes apiece at a paper's size). Other splits, and this epoch's other stages and
    precisions, stay."""
    pattern = re.compile(rf"{re.escape(split)}-epoch(\d+)(-stages\d+)?(-bf16|-fp16)?\.pt")
    for path in folder.glob(f"{split}-epoch*.pt"):
        found = pattern.fullmatch(path.name)
        if found and int(found.group(1)) < epoch:
            path.unlink(missing_ok=True)


def embedding(cache: Path, split: str):
    """Held while this process embeds a split into ``cache``: a second ``fslab eval`` of the run
    at the same time (another evaluator, more episodes) waits, saying so, and then reads the
    features from the cache rather than embed the split twice. The lock file beside the cache
    goes when it is let go; where no lock can be had (no ``flock``, a folder that cannot be
    written) the split is embedded without one, as before. ``features/`` is made once, here: a
    waiter that finds it gone (the run deleted under it) goes on without the lock and the eval
    then says the run is gone, rather than make the folder again in the middle of the delete."""
    path = cache.with_name(f".{cache.name}.lock")
    with contextlib.suppress(OSError):  # cannot be made: opening the lock fails too, and the split goes on without it
        path.parent.mkdir(exist_ok=True)
    return one_at_a_time(path, lambda pid: f"waiting for the fslab eval{pid} that is embedding the {split} split "
                                           f"of this checkpoint, to read its features")


def _cache_features(cache, saved: dict, warn: Callable[[str], None]) -> bool:
    """Write the feature cache whole or not at all; whether it was written. The scores need no cache: a
    write the system refuses (a full disk) is a warning line given to ``warn``, its temporary file removed,
    and the evaluation goes on."""
    try:  # Ctrl-C while writing: no half file left
        cache.parent.mkdir(exist_ok=True)
        # what an fslab eval killed outright (SIGKILL, the out-of-memory killer) as it wrote left: a run that
        # ended starts no worker again, whose start would remove it, so it stayed, a split's features each
        remove_orphaned_temporaries(cache.parent)
        with written_whole(cache) as tmp:
            torch.save(saved, tmp)
    except (OSError, RuntimeError) as exc:  # torch reports a failed write as a RuntimeError
        if not cache.parent.parent.is_dir():  # the run was deleted meanwhile: fslab eval says that, not this
            return False
        warn(f"warning: the features were not cached ({cache}: {write_failure(exc, cache)}); the next "
             f"fslab eval of this checkpoint embeds them again")
        return False
    return True


def cached_features(cache, data: str | None = None,
                    weights: str | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The features and labels a cache file holds, or None when there is none,
    it is not one fslab wrote whole (cut short, emptied, replaced) or, given the
    ``data`` or ``weights`` fingerprint, it was embedded from other data or by
    other weights, or it holds features that are not finite (cached before
    embedding refused them): the split is then embedded again and the file rewritten."""
    if not cache.is_file():
        return None
    try:
        saved = load_saved(cache, what="the feature cache")
    except FslabError:
        return None
    features, labels = (saved.get("features"), saved.get("labels")) if isinstance(saved, dict) else (None, None)
    if (not isinstance(features, torch.Tensor) or not isinstance(labels, torch.Tensor) or features.dim() < 2
            or labels.dim() != 1 or len(features) != len(labels) or labels.is_floating_point()
            or not torch.isfinite(features).all()):
        return None
    if (data is not None and saved.get("data") != data) or (weights is not None and saved.get("weights") != weights):
        return None
    return features, labels


def evaluation_inputs(run: Run, split: str, checkpoint: Checkpoint, evaluator,
                      warn: Callable[[str], None]) -> EvaluationInputs:
    """The split's cached (or now cached: :func:`load_features`, ``warn``) features, or for a model-aware
    evaluator the checkpoint's network and the split's images."""
    cfg = checkpoint.cfg
    center = None
    if cfg.eval.center:
        center = checkpoint.state["train_mean"]
        # none saved after an epoch that was not validated (eval.val_every), or one embedded in the run's own
        # precision where fslab eval --precision asks for another: embedded again in that one, as training would
        if center is None or checkpoint.other_precision is not None:
            center = training_mean(checkpoint.dataset().load("train").images, checkpoint.embed,
                                   cfg.eval.center_images, cfg.eval.seed)
    common = {"center": center, "normalize": cfg.eval.normalize, "device": checkpoint.device}
    if evaluator_traits(evaluator).needs_model:
        data = checkpoint.dataset().load(split)
        return EvaluationInputs(labels=data.labels, network=checkpoint.network(), images=data.images,
                                features_cached=False, data=data_fingerprint(data.images, data.labels), **common)
    features, labels, cached, digest = load_features(run, split, checkpoint, warn)
    return EvaluationInputs(labels=labels, features=features, features_cached=cached, data=digest, **common)


def evaluate_run(run: Run, *, split: str, ways: int, shots: list[int], queries: int, episodes: int | None = None,
                 evaluator: str | None = None, params: dict | None = None, device: str | None = None,
                 data_root: str | None = None, precision: str | None = None,
                 logged: list[dict] | None = None, recording: Callable[[], object] | None = None,
                 warn: Callable[[str], None] | None = None) -> list[dict]:
    """Evaluate the run's last checkpoint; returns one result per episode shape
    (per number of shots, or the evaluator's own fixed shape).

    ``evaluator`` defaults to the run's, with the run's parameters; ``params``
    override or add parameters. ``episodes`` defaults to 10,000, or to the
    evaluator's ``default_episodes`` for a slow model-aware one. ``data_root``: where
    the run's dataset lies now, if it moved since the run trained. ``precision``
    (fp32, bf16 or fp16; None or auto: the run's own) embeds the features in another
    precision than the run's: the same episodes, scored and saved beside its own. ``logged``: a list each
    event appended to the run's ``metrics.jsonl`` is added to, as written (what its sinks are sent);
    ``recording``: called once the episodes are scored, before the first event is appended. ``warn``: given
    each warning line (a feature cache the disk refused), else each is printed on stderr as it comes.
    """
    check_evaluable(run)
    config = run.config()
    if data_root is not None:
        config["dataset"] = {**config["dataset"], "root": data_root}
    recorded = recorded_precision(run)
    if recorded is not None:  # not auto resolved again for this device: a GPU's bf16 run scored on a laptop
        config["eval"] = {**config.get("eval", {}), "precision": recorded}
    cfg = run_config(config)
    registry = load_registry(load_settings().plugin_dirs)
    checkpoint = Checkpoint(run, cfg, pick_device(device or cfg.device), registry)
    name = evaluator or cfg.evaluator["name"]
    own_params = plugin_kwargs(cfg.evaluator) if name == cfg.evaluator["name"] else {}
    # every parameter written out in the record, the registered defaults included (recorded_evaluator)
    section = {"name": name, **registry.get("evaluator", name).params, **own_params, **(params or {})}
    classify = build_evaluator(registry, section, cfg.loss)
    chosen = Episodes(split=split, ways=ways, shots=shots, queries=queries, count=episode_count(classify, episodes),
                      seed=cfg.eval.seed, epoch=checkpoint.epoch)
    check_refused(classify, ways, shots, queries)  # before the split is embedded (minutes at a paper's size)
    needs_model = evaluator_traits(classify).needs_model
    if precision not in (None, "auto"):
        _check_precision(needs_model, name, precision)
        if not needs_model:
            checkpoint.embed_in(precision)
    warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
    inputs = replace(evaluation_inputs(run, split, checkpoint, classify, warn),
                     precision=checkpoint.numerics.eval_precision if not needs_model
                     else "fp32",  # finetune runs its copy of the network in float32 whatever eval.precision says
                     run_precision=None if needs_model else checkpoint.other_precision)
    note = other_data_note(run, split, checkpoint.epoch, inputs.data)
    if note is not None:
        warn(note)
    log = EventLog(run, echo=False, listeners=[logged.append] if logged is not None else ())
    return evaluate_and_record(log, classify, recorded_evaluator(section), inputs, chosen,
                               save=True, source="fslab eval", named=registry.get("evaluator", name).named,
                               recording=recording)


def other_data_note(run: Run, split: str, epoch: int, data: str | None) -> str | None:
    """The line saying that ``split``'s images (fingerprint ``data``) are none of those the run's saved scores of
    this checkpoint were drawn on (the data root's files added, removed or replaced since it trained, or
    ``--data-root`` naming other ones), else None: the episodes are drawn alike, from other images, and the
    scores were told with no word of it, as if they were the run's own."""
    earlier = {e["data"] for e in run.saved_accuracies()
               if e["split"] == split and e["epoch"] == epoch and isinstance(e.get("data"), str)}
    if data is None or not earlier or data in earlier:
        return None
    return (f"note: the {split} images of run {run.id} are not those its {split} scores were drawn on (files of its "
            f"data root added, removed or replaced since, --data-root naming other ones, or an fslab that decodes "
            f"them otherwise, as a photo's EXIF orientation): these scores, of the images as they are now, are kept "
            f"beside its own, which fslab runs still shows; fslab compare and plot pool runs only on the same images")


def _check_precision(needs_model: bool, name: str, precision: str) -> None:
    """A UsageError where ``fslab eval --precision`` cannot apply: a model-aware evaluator (finetune)
    adapts its copy of the network in float32, whatever precision the features would be embedded in."""
    if needs_model and precision != "fp32":
        raise UsageError(f"evaluator '{name}' fine-tunes the network on every episode in fp32, whatever "
                         f"--precision says: --precision {precision} would score it as fp32 does; leave "
                         f"--precision out, or give fp32")
