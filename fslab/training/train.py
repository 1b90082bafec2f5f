"""The training loop: set up, train epoch by epoch, test, save the results.

:func:`train` reads top to bottom: :func:`setup` builds everything from the
configuration (or restores it from the last checkpoint); each epoch trains
(one logged event per interval) and ends with a validation evaluation and a
checkpoint; :meth:`Trainer.finish` runs the test evaluation and writes
``results.json``. Started by :mod:`fslab.execution.worker` inside a run folder.
"""

from __future__ import annotations

import functools
import math
import random
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from fslab.core.commands import like_command
from fslab.core.config import RunConfig, run_config, tested_ways
from fslab.core.errors import FslabError, plugin_call
from fslab.core.eventlog import EventLog, first_start_data, start_afresh, truncate_to_checkpoint
from fslab.core.events import recorded_evaluator
from fslab.core.files import atomic_write_json
from fslab.core.registry import load_registry
from fslab.core.runstore import Run
from fslab.core.settings import load_settings
from fslab.core.types import Split
from fslab.core.values import is_number
from fslab.training import distributed
from fslab.training.augment import augment
from fslab.training.build import TrainingParts, build_training, host_to_device, pick_device, to_input
from fslab.training.checkpoint import (
    CheckpointWriter,
    finite_names,
    load_checkpoint,
    mismatch_reason,
    nonfinite_entry,
    restore_training,
    training_checkpoint,
)
from fslab.training.features import feature_network, training_mean
from fslab.training.numerics import (
    Numerics,
    apply_backend_settings,
    compiled,
    embed,
    optimiser_step,
    resolve_numerics,
)
from fslab.training.outputs import checked_batch, checked_loss_output
from fslab.training.record import (
    Episodes,
    EvaluationInputs,
    data_change_note,
    data_fingerprint,
    episode_count,
    evaluate_and_record,
    split_outline,
)


def train(run: Run, resume: bool = False, listeners=()) -> dict:
    """Train the run's configuration; with ``resume``, continue from its last
    checkpoint: the metrics file is cut back to that checkpoint and every state
    (weights, optimiser, schedule, RNG streams) is restored, so the result is
    the one an uninterrupted run would have reached. Each of ``listeners`` gets
    every event the run logs (:class:`fslab.core.eventlog.EventLog`)."""
    trainer = setup(run, resume, listeners)
    # loss(head(model(x))) over the global batch; under DDP when there are several ranks. The backbone
    # runs in the run's precision (compiled if asked), the loss in float32 (fslab.training.numerics).
    parts, numerics = trainer.parts, trainer.numerics
    train_step = distributed.training_step(compiled(parts.model, numerics), parts.head, parts.loss_fn,
                                           trainer.world, trainer.device, numerics.autocast,
                                           parts.failed("loss"), parts.failed("backbone"))
    try:
        for epoch in range(trainer.first_epoch, trainer.cfg.train.epochs):
            trainer.train_epoch(epoch, train_step)
            trainer.end_epoch(epoch)
        return trainer.finish()
    finally:  # a run that stops or fails ends with its last checkpoint whole on disk
        trainer.checkpoints.close()


def setup(run: Run, resume: bool, listeners=()) -> Trainer:
    """Seed, build, and either restore the last checkpoint (``resume``) or
    evaluate the untrained network when ``eval.before_training`` asks."""
    cfg = run_config(run.config())
    registry = load_registry(load_settings().plugin_dirs)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    # Under torchrun (--gpus N) each rank trains on its slice of every batch;
    # rank 0 alone writes the run store and evaluates (fslab.training.distributed).
    world = distributed.World.from_env()
    if world.size != cfg.train.processes:
        raise RuntimeError(f"the run is configured for train.processes={cfg.train.processes} "
                           f"but runs in {world.size} processes; start it with fslab run/resume")
    device = pick_device(cfg.device) if world.size == 1 else distributed.start(cfg.device, world)[1]
    numerics = resolve_numerics(cfg, device)
    apply_backend_settings(numerics)  # before the first kernel
    checkpoint, started_on = None, {}
    if resume:
        checkpoint = load_checkpoint(run.checkpoint_path, device)
        if world.main:
            truncate_to_checkpoint(run, checkpoint["epoch"])
            started_on = first_start_data(run)
    elif world.main:
        start_afresh(run)  # queued again before its first checkpoint: that start's events are not this one's
    log = EventLog(run, enabled=world.main, listeners=listeners)
    parts = build_training(registry, cfg, world, device, channels_last=numerics.channels_last)
    feature_network(parts.model, cfg.eval.feature_stages)  # a backbone without those stages fails now, not later
    trainer = Trainer(run, cfg, world, device, log, parts, numerics,
                      augment_rng=torch.Generator().manual_seed(cfg.seed))
    trainer.log_start(started_on)
    if checkpoint is not None:
        trainer.restore(checkpoint)
    elif cfg.eval.before_training and world.main:  # the untrained network's accuracy, as epoch 0
        trainer.validate(epoch=0, center=trainer.training_mean())
    return trainer


def validates_after(epoch: int, epochs: int, every: int) -> bool:
    """Whether a run of ``epochs`` epochs validates after ``epoch`` (counted from 1):
    after every ``every``-th epoch (``eval.val_every``) and after the last."""
    return epoch % every == 0 or epoch == epochs


def scores_by_shots(outcomes: list[dict]) -> dict:
    """``results.json``'s form of an evaluation: ``{"5-shot": {"accuracy", "ci95"}}``, plus
    ``"metric"`` where the score is not an accuracy (``map``: retrieval-map's mean average
    precision), so that what prints it can say so."""
    return {f"{r['shots']}-shot": {"accuracy": r["accuracy"], "ci95": r["ci95"],
                                   **({"metric": r["metric"]} if r.get("metric", "accuracy") != "accuracy" else {})}
            for r in outcomes}


def labelled_state(modules: dict) -> dict:
    """The state (parameters and buffers) of ``modules`` (a label for each), named ``"model's blocks.1.weight"``."""
    return {f"{label}'s {name}": tensor for label, module in modules.items()
            if isinstance(module, torch.nn.Module) for name, tensor in module.state_dict().items()}


def nonfinite_tensor(modules: dict, among: set[str] | None = None) -> str | None:
    """The first parameter or buffer of ``modules`` (a label for each module; of those named in ``among``,
    where given) that holds a NaN or an infinity, as ``"model's blocks.5.running_var holds inf"``; None when
    every one is finite. One device sync: an update can break the network (a batch-norm variance that
    overflows) while the loss, computed in training mode from the batch's own statistics, stays finite,
    so only the state itself tells."""
    return nonfinite_entry(labelled_state(modules), among)


def lower_rate(run_id: str, lr: float) -> str:
    """How a run that diverged goes on: anew at a lower rate, a tenth of ``lr`` for a start (``fslab resume``
    keeps the rate, and would diverge again where it did)."""
    return f"start it again at a lower learning rate: {like_command(run_id)} --lr {lr / 10:g}"


def nonfinite_loss(value: float, step: int, epoch: int, loss: dict, again: str, named: str) -> str:
    """Why a run stops at a logged loss that is NaN or infinite. At the first step no update has been made
    yet, so the learning rate is not the cause: the loss is (``named``, its plugin too), as its parameters
    are (``loss.temperature=1e-38``)."""
    if step == 1:
        numbers = ", ".join(f"loss.{key}={number!r}" for key, number in loss.items()
                            if is_number(number))
        return (f"{named} was {value} at step 1, before any update, so not from the learning rate; "
                f"check the loss's parameters{f' ({numbers})' if numbers else ''}")
    return f"loss became {value} at step {step} (epoch {epoch + 1}); {again}"


def sampler_batches(sampler, epoch: int, failed: str) -> Iterator:
    """The sampler's batches of ``epoch``; what its code raises (starting the epoch or drawing a batch) fails
    the run in one line that names it and its plugin, ``failed`` (``sampler 'mine' from plugin 'mine'
    failed: ValueError: ...``), where it read only ``ValueError: ...``, whose code it was not said."""
    batches = plugin_call(lambda: iter(sampler.batches(epoch)), failed)
    while True:
        try:
            batch = plugin_call(lambda: next(batches), failed, passes=(StopIteration,))
        except StopIteration:
            return
        yield batch


@dataclass
class Trainer:
    """A run being trained: its components and the state that moves on with
    every step (the step count, the best validation score, the training mean)."""

    run: Run
    cfg: RunConfig
    world: distributed.World
    device: torch.device
    log: EventLog
    parts: TrainingParts
    numerics: Numerics
    augment_rng: torch.Generator
    first_epoch: int = 0
    step: int = 0
    best_val: float | None = None
    center: torch.Tensor | None = None  # the training mean of the last validated network
    images: torch.Tensor = field(init=False)  # the training split, on the device when it fits
    labels: torch.Tensor = field(init=False)
    steps_per_epoch: int = field(init=False)
    scaler: torch.amp.GradScaler | None = field(init=False)  # fp16's loss scaling
    compile_pending: bool = field(init=False)  # the next step compiles the training forward
    checkpoints: CheckpointWriter = field(init=False)  # writes each epoch's checkpoint while the next one trains
    watched: set[str] = field(init=False)  # the state entries finite when built: each must stay so (end_epoch)

    def __post_init__(self) -> None:
        self.checkpoints = CheckpointWriter(self.run.checkpoint_path)
        self.watched = finite_names(labelled_state(self.state_modules()))
        self.scaler = self.numerics.grad_scaler()
        if self.scaler is not None:  # fp16 skips a step whose gradients overflow (the first ones, often) and the
            # schedule counts it all the same, as it should (its milestones are fractions of all steps): PyTorch's
            # warning that the schedule stepped before the optimiser would be the only line of a sound run's stderr
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before",
                                    category=UserWarning)
        self.compile_pending = self.numerics.compile != "off"
        self.images, self.labels = self.parts.train_split.images, self.parts.train_split.labels
        if self.images.numel() < 2**31:  # small enough to keep the whole split on the device
            self.images, self.labels = self.images.to(self.device), self.labels.to(self.device)
        self.steps_per_epoch = len(self.parts.sampler)  # a whole number at least 1 (build_training checks it)

    def state_modules(self) -> dict:
        return {"model": self.parts.model, "head": self.parts.head, "loss": self.parts.loss_fn}

    def log_start(self, started_on: dict) -> None:
        """The start event, with the splits' outlines (:func:`split_outline`); a resumed run's, where they
        differ from those of its first start (``started_on``), with the ``note`` that says so."""
        model, epochs, parts = self.parts.model, self.cfg.train.epochs, self.parts
        splits = {"train": parts.train_split, "val": parts.val_split, "test": parts.test_split}
        data = {name: split_outline(split) for name, split in splits.items() if split is not None}
        note = data_change_note(self.run.id, started_on, data)
        self.log.write("start", device=str(self.device), epochs=epochs, steps_per_epoch=self.steps_per_epoch,
                       total_steps=epochs * self.steps_per_epoch, train_images=len(self.parts.train_split),
                       backbone_params=sum(p.numel() for p in model.parameters()),
                       out_dim=getattr(model, "out_dim", None), processes=self.world.size,
                       **self.numerics.describe(), data=data, **({"note": note} if note else {}))

    def restore(self, checkpoint: dict) -> None:
        """Every state of the checkpoint back; one that does not fit the network the run's configuration
        builds here (its config.json edited since, its backbone's plugin changed) is one line naming the
        first difference, not torch's error, whose first line names only the network."""
        parts = self.parts
        try:
            restore_training(checkpoint, model=parts.model, head=parts.head, loss_fn=parts.loss_fn,
                             optimizer=parts.optimizer, scheduler=parts.scheduler, augment_rng=self.augment_rng,
                             scaler=self.scaler)
        except (RuntimeError, ValueError, KeyError) as exc:
            raise FslabError(f"the checkpoint {self.run.checkpoint_path} does not fit the network the run's "
                             f"configuration builds here (its config.json edited, or its backbone's plugin "
                             f"changed, since it was written): {mismatch_reason(exc).rstrip('.')}; start the run "
                             f"again: {like_command(self.run.id)}") from None
        self.first_epoch, self.step, self.best_val = checkpoint["epoch"], checkpoint["step"], checkpoint["best_val"]
        self.center = checkpoint["train_mean"]
        self.log.write("resume", epoch=self.first_epoch, step=self.step)

    # -- training ----------------------------------------------------------

    def train_epoch(self, epoch: int, train_step: Callable) -> None:
        """One pass of the sampler's batches: augment this rank's rows, one
        optimiser and schedule step per batch, an event every ``log_every`` steps."""
        parts, tcfg = self.parts, self.cfg.train
        parts.model.train()
        window_start, window_images = time.perf_counter(), 0
        for batch in sampler_batches(parts.sampler, epoch, parts.failed("sampler")):
            batch = checked_batch(batch, parts.named["sampler"], tcfg.batch_size, len(self.labels))
            # checked_batch made the indices (and support marks) host tensors: moved, not converted again
            index = host_to_device(batch.indices, self.images.device)  # no wait for the GPU: its queue stays full
            own = self.world.rows(len(index))  # this rank's rows of the global batch (all of it with one process)
            x = to_input(self.images[index[own]].to(self.device, non_blocking=True))
            x = augment(x, tcfg.crop_padding, tcfg.flip, self.augment_rng, part=own, total=len(index))
            x = self.numerics.memory_format(x)
            y = self.labels[index].to(self.device, non_blocking=True)
            support = None if batch.support is None else host_to_device(batch.support, self.device)
            started = time.perf_counter()
            out = checked_loss_output(train_step(x, y, support), parts.named["loss"])
            self.step_lr = parts.optimizer.param_groups[0]["lr"]  # this step's rate: the schedule moves on below
            optimiser_step(out.loss, parts.optimizer, self.scaler)
            parts.scheduler.step()
            self.step += 1
            window_images += len(index)
            if self.compile_pending:  # compiling took this step's time: logged apart, not in images/s
                self.log_compiled(time.perf_counter() - started)
                window_start, window_images = time.perf_counter(), 0
            if self.step % tcfg.log_every == 0 or self.step % self.steps_per_epoch == 0:
                self.log_training(out, epoch, window_start, window_images)
                window_start, window_images = time.perf_counter(), 0
            elif self.step == 1 and not math.isfinite(first := out.loss.item()):  # unlogged, yet the loss's doing
                raise FloatingPointError(nonfinite_loss(first, 1, epoch, self.cfg.loss, "", parts.named["loss"]))

    def log_compiled(self, seconds: float) -> None:
        """The ``compile`` event: the first compiled step's wall time (compilation included)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.compile_pending = False
        self.log.write("compile", step=self.step, mode=self.numerics.compile, seconds=seconds)

    def log_training(self, out, epoch: int, window_start: float, window_images: int) -> None:
        """The ``train`` event of the interval that ends at this step; without ``images_per_s`` when
        the interval holds no step but the one that compiled (``train.log_every=1``), whose time is
        left out of images/s: a rate of 0 would be a measurement of nothing."""
        loss_value = out.loss.item() + 0.0  # the one device sync per interval; + 0.0 turns -0.0 (the loss
        # of a batch of no positive pair, a negated sum: supcon's nca-code form, mAP's) into 0.0, as it is shown
        if not math.isfinite(loss_value):
            raise FloatingPointError(nonfinite_loss(loss_value, self.step, epoch, self.cfg.loss,
                                                    lower_rate(self.run.id, self.cfg.train.lr),
                                                    self.parts.named["loss"]))
        elapsed = time.perf_counter() - window_start
        rate = {"images_per_s": window_images / max(elapsed, 1e-9)} if window_images else {}
        extra = {k: float(v) + 0.0 for k, v in (out.extra or {}).items()}
        self.log.write("train", step=self.step, epoch=epoch + 1, loss=loss_value, positives=int(out.positives),
                       negatives=int(out.negatives), lr=self.step_lr, **rate, **extra)

    def end_epoch(self, epoch: int) -> None:
        """Validation (after every ``eval.val_every``-th epoch and the last) and
        checkpoint, on rank 0; the other ranks wait. The checkpoint of an epoch
        not validated holds no training mean (``fslab eval`` computes it).
        Its ``checkpoint`` event is logged here, in step order, before the
        file is written while the next epoch trains: the file never holds an
        epoch whose event is missing, and a resume goes by the file's epoch,
        cutting the events back to that epoch's event. A network that is no longer finite fails
        the run here, on every rank, before it is scored or overwrites the last checkpoint."""
        broken = nonfinite_tensor(self.state_modules(), self.watched)
        if broken is not None:
            again = lower_rate(self.run.id, self.cfg.train.lr)
            raise FloatingPointError(f"the network is no longer finite after step {self.step} (epoch {epoch + 1}): "
                                     f"the {broken}, though the logged losses were finite; {again}")
        if not self.world.main:
            self.world.barrier()
            return
        done = epoch + 1
        if validates_after(done, self.cfg.train.epochs, self.cfg.eval.val_every):
            self.center = self.training_mean()
            for result in self.validate(epoch=done, center=self.center):
                self.best_val = result["accuracy"] if self.best_val is None else max(self.best_val,
                                                                                     result["accuracy"])
        else:
            self.center = None
        parts = self.parts
        checkpoint = training_checkpoint(
            model=parts.model, head=parts.head, loss_fn=parts.loss_fn, optimizer=parts.optimizer,
            scheduler=parts.scheduler, epoch=epoch + 1, step=self.step, config=self.cfg.as_dict(),
            best_val=self.best_val, train_mean=self.center, augment_rng=self.augment_rng, device=self.device,
            scaler=self.scaler)
        path = str(self.run.checkpoint_path.relative_to(self.run.path))
        self.checkpoints.submit(checkpoint, announce=lambda: self._announce_checkpoint(epoch + 1, path))
        self.world.barrier()

    def _announce_checkpoint(self, epoch: int, path: str) -> None:
        """The ``checkpoint`` event, on the disk itself before the checkpoint's file is written: the file,
        written durably, must not outlive its event when the machine goes down."""
        self.log.write("checkpoint", epoch=epoch, step=self.step, path=path)
        self.log.sync()

    # -- evaluation --------------------------------------------------------

    def features_of(self, images: torch.Tensor) -> torch.Tensor:
        """Evaluation features (``eval.feature_stages``); the training mean goes through here too."""
        network = feature_network(self.parts.model, self.cfg.eval.feature_stages)
        return plugin_call(lambda: embed(network, images, self.cfg.eval.batch_size, self.numerics),
                           self.parts.failed("backbone"), passes=distributed.torch_own_errors())

    def training_mean(self) -> torch.Tensor | None:
        """The mean feature of ``eval.center_images`` training images (drawn
        from the evaluation seed), subtracted before normalising; None when
        ``eval.center`` is off."""
        ecfg = self.cfg.eval
        if not ecfg.center:
            return None
        return training_mean(self.images, self.features_of, ecfg.center_images, ecfg.seed)

    def evaluate(self, split: Split, split_name: str, shots, asked_episodes: int, center: torch.Tensor | None, *,
                 epoch: int, at: dict, save: bool, ways: int | None = None,
                 features: Callable[[], torch.Tensor] | None = None, data: str | None = None) -> list[dict]:
        """Evaluate the current network on ``split`` with the run's evaluator
        (:func:`fslab.training.record.evaluate_and_record`), on episodes of
        ``ways`` classes (default ``eval.ways``); ``features`` gives the split's
        features when they are already embedded, ``data`` its fingerprint."""
        ecfg, evaluator = self.cfg.eval, self.parts.evaluator
        episodes = Episodes(split=split_name, ways=ways or ecfg.ways, shots=shots, queries=ecfg.queries,
                            count=episode_count(evaluator, asked_episodes, during_training=True), seed=ecfg.seed,
                            epoch=epoch)
        inputs = EvaluationInputs(labels=split.labels, features=features or (lambda: self.features_of(split.images)),
                                  network=feature_network(self.parts.model, ecfg.feature_stages), images=split.images,
                                  center=center, normalize=ecfg.normalize, device=self.device, data=data)
        return evaluate_and_record(self.log, evaluator, recorded_evaluator(self.cfg.evaluator), inputs, episodes,
                                   at=at, save=save, named=self.parts.named["evaluator"])

    def validate(self, *, epoch: int, center: torch.Tensor | None) -> list[dict]:
        """``eval.val_episodes`` validation episodes of ``eval.val_shots`` shots, logged as ``epoch``."""
        ecfg = self.cfg.eval
        return self.evaluate(self.parts.val_split, "val", [ecfg.val_shots], ecfg.val_episodes, center,
                             epoch=epoch, at={"epoch": epoch, "step": self.step}, save=False)

    def finish(self) -> dict:
        """The test evaluation of the final network (rank 0), at ``eval.ways`` and
        each of ``eval.extra_ways`` (``test_20way`` in ``results.json``), with
        ``eval.final_val`` the same on the validation split (``val``,
        ``val_20way``), ``results.json`` and the ``end`` event (``eval.ways``'s test)."""
        if not self.world.main:
            return {}
        cfg, ecfg = self.cfg, self.cfg.eval
        splits = {"test": self.parts.test_split}
        if ecfg.final_val:  # the validation classes scored as the test
            splits["val"] = self.parts.val_split
        # each split embedded once (when its evaluator first asks), however many numbers of classes it is tested at
        features = {name: functools.cache(lambda split=split: self.features_of(split.images))
                    for name, split in splits.items()}
        # saved with the scores: compare pairs runs only where they were scored on the same data
        data = {name: data_fingerprint(split.images, split.labels) for name, split in splits.items()}
        scores = {}
        for ways in tested_ways(ecfg.ways, ecfg.extra_ways):
            for name, split in splits.items():
                # `center` is still the final network's training mean
                outcomes = self.evaluate(split, name, ecfg.shots, ecfg.test_episodes, self.center, ways=ways,
                                         epoch=cfg.train.epochs, at={"step": self.step}, save=True,
                                         features=features[name], data=data[name])
                scores[name if ways == ecfg.ways else f"{name}_{ways}way"] = scores_by_shots(outcomes)
        self.checkpoints.wait()  # a completed run has its final checkpoint on disk
        # episodes: those the test drew, not eval.test_episodes (a model-aware evaluator, finetune, draws at most
        # its default_episodes in training: 100 where 10,000 were asked)
        drawn = episode_count(self.parts.evaluator, ecfg.test_episodes, during_training=True)
        results = {"run": self.run.id, "method": cfg.method, "dataset": cfg.dataset["name"],
                   "backbone": cfg.backbone["name"], "ways": ecfg.ways, "queries": ecfg.queries,
                   "episodes": drawn, **scores, "best_val_accuracy": self.best_val,
                   "epochs": cfg.train.epochs, "steps": self.step}
        atomic_write_json(self.run.path / "results.json", results)
        self.log.write("end", results=scores["test"])
        return results
