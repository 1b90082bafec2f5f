"""The ``wandb`` sink: one Weights & Biases run per fslab run, offline by default.

The W&B run takes the fslab run's id as its id and name, the resolved
configuration as its config, the method as its job type, the sweep as its
group and method, loss, backbone, dataset and seed as tags. Training numbers
(``train/loss``, ...) and each evaluation (``val/5way_5shot/accuracy``, ...)
are logged on the training step (a later ``fslab eval``'s ``eval/...`` charted
against ``checkpoint_step``, the step of the checkpoint it scored); the summary holds the final test scores, named
as their scalars (``test/5way_1shot/accuracy``, ``.../map``).

``mode = "offline"`` (the default) writes the run under ``runs/<id>/wandb/``
and sends nothing; ``wandb sync runs/<id>/wandb/offline-run-*`` uploads it
later. ``mode = "online"`` sends it as it goes (to the account of ``wandb
login``). ``fslab export`` sets the offline records an earlier export or the live
run left for the run aside, and removes them once its own is written whole
(an export that fails or is cut short removes its own and puts them back, and W&B's links in
``wandb/``, ``latest-run`` and ``debug.log``, at them again); a resumed run's
offline record replaces its earlier start's, holding the whole run (online, W&B
ignores the steps it logs again after its checkpoint). Needs ``pip install 'fslab[wandb]'``.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from pathlib import Path

from fslab_plugins.sinks.common import (
    StepAxis,
    eval_prefix,
    eval_values,
    installed,
    logged_before,
    need,
    project_path,
    result_key,
    result_metric,
    train_values,
)

from fslab.plugin import hookimpl, one_of

EXIT_CODE = {"completed": 0, "killed": 130}
# The step axis of fslab eval's scores (eval/...): the step of the checkpoint they scored, which W&B
# refuses as the step of a log once a later one is logged (a run killed after its checkpoint).
EVAL_STEP = "checkpoint_step"
# The links W&B makes in its folder to the record it writes (``wandb.init``'s ``_safe_symlink``): an
# export cut short puts back the ones it found, since the record they then point at is removed.
LINKS = ("latest-run", "debug.log", "debug-internal.log")


def offline_records(folder: Path, run_id: str, *, aside: bool = False) -> list[Path]:
    """The offline records W&B wrote in ``folder`` for the run ``run_id``: ``offline-run-STAMP-ID``, and
    ``offline-run-STAMP-ID-N``, W&B's name for one made in the same second as another; with ``aside``, those
    an export set aside under a hidden name (``.NAME.old``) instead. The one finder of a run's records."""
    pattern = (r"\." if aside else "") + rf"offline-run-[^/]+-{re.escape(run_id)}(-\d+)?" + (r"\.old" if aside else "")
    return sorted(path for path in folder.glob(".offline-run-*" if aside else "offline-run-*")
                  if re.fullmatch(pattern, path.name))


def links_to(path: Path) -> str | None:
    """Where the link ``path`` points (as written in it), or None where there is no link."""
    return os.readlink(path) if path.is_symlink() else None


def link_again(path: Path, target: str | None) -> None:
    """The link ``path`` made to point at ``target`` again, as W&B makes it (a new link renamed over the
    old one); removed where ``target`` is None (there was none)."""
    if target is None:
        if path.is_symlink():
            path.unlink()
        return
    if links_to(path) != target:
        new = path.with_name(f".{path.name}.{os.getpid()}")
        new.unlink(missing_ok=True)
        os.symlink(target, new)
        os.replace(new, path)


def quiet_logging_errors() -> None:
    """W&B logs to ``debug.log`` in the run's W&B folder through Python's logging,
    which prints a traceback for each line it cannot write: a full disk turned
    the sink's one line into hundreds on stderr (or in the run's ``stderr.log``).
    The sink's failure is said once, from the error W&B itself then raises."""
    logging.raiseExceptions = False


class WandbSink:
    """One fslab run as one W&B run (see the module)."""

    def __init__(self, run, *, project: str = "fslab", mode: str = "offline", dir: str = "") -> None:
        wandb = need("wandb", "wandb", "wandb")
        quiet_logging_errors()
        self.run = run
        folder = project_path(dir, run) if dir else Path(run.path)
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK):  # W&B would write to a temporary folder instead, and say it had exported
            if os.statvfs(folder).f_flag & os.ST_RDONLY:  # so for every run of the store: fslab export stops at once
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(folder))
            raise PermissionError(errno.EACCES, "this user cannot write there (a read-only store?); give the sink "
                                  "a dir= this user can write", str(folder))
        self.records, self.failed, self.mode = folder / "wandb", False, mode
        self.earlier = self._set_aside() if run.replay else []
        self.links = {name: links_to(self.records / name) for name in LINKS}
        tags = run.tags()
        try:
            self.wandb_run = wandb.init(
                project=project, id=run.id, name=run.id, dir=str(folder), mode=mode, config=run.config,
                job_type=tags["method"], group=tags.get("sweep"), resume="allow",
                tags=list(dict.fromkeys(  # once each: the method nca's loss is nca too
                    [tags[k] for k in ("method", "loss", "backbone", "dataset") if tags.get(k)]
                    + [f"seed={tags['seed']}"])),
                settings=wandb.Settings(silent=True, console="off"),
            )
        except BaseException:
            self.failed = True
            self._settle()
            raise
        self.wandb_run.define_metric("eval/*", step_metric=EVAL_STEP)
        self.steps = StepAxis()
        self.metric = "accuracy"  # of the test scores the end event repeats (map for retrieval)

    def _set_aside(self) -> list[tuple[Path, Path]]:
        """The offline records an earlier export or the live run left, renamed to hidden names (which
        neither ``wandb sync`` nor this export's record takes) until this export's record is whole."""
        moved = []
        for path in offline_records(self.records, self.run.id):
            aside = path.with_name(f".{path.name}.old")
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(path, aside)
            moved.append((path, aside))
        return moved

    def _settle(self) -> None:
        """An export's record in place of the earlier ones, once written whole; one that failed midway
        (a full disk) is removed instead, and the earlier ones are put back as they were."""
        if not self.run.replay:
            return
        if not (self.failed or self.run.cut_short):  # cut short: a write that failed, or a Ctrl-C between two
            for aside in offline_records(self.records, self.run.id, aside=True):  # an export killed midway's too
                shutil.rmtree(aside, ignore_errors=True)
            return
        for path in offline_records(self.records, self.run.id):
            shutil.rmtree(path, ignore_errors=True)
        for path, aside in self.earlier:
            os.replace(aside, path)
        for name, target in self.links.items():
            link_again(self.records / name, target)

    def write(self, event: dict) -> None:
        kind = event.get("event")
        step = self.steps.place(event)
        if kind == "resume" and self.mode == "offline" and not self.run.replay:  # online: W&B keeps what it had
            self._one_record()
        elif kind == "train":
            self.wandb_run.log({f"train/{k}": v for k, v in train_values(event).items()}, step=step)
        elif kind == "eval":
            prefix = eval_prefix(event, self.run.config)
            values = {f"{prefix}/{k}": v for k, v in eval_values(event).items()}
            if event.get("source"):  # logged where the log stands, charted at its checkpoint's step
                values[EVAL_STEP] = step
            self.wandb_run.log(values, step=self.steps.step)
            self.metric = result_metric(event, self.run.config) or self.metric
        elif kind == "end":
            for shots, result in event["results"].items():
                key = result_key(self.run.config, shots, self.metric)
                self.wandb_run.summary[key] = result["accuracy"]
                self.wandb_run.summary[f"{key}_ci95"] = result["ci95"]

    def _one_record(self) -> None:
        """A live resume, offline: the earlier starts' records go, and this one holds the whole run, what
        it logged up to its checkpoint replayed from ``metrics.jsonl`` (which the worker cut back to it).
        ``wandb sync`` of a record per start sent the steps after the checkpoint twice, and W&B, which
        ignores a step below one it has logged, kept the first values (a test cut short's among them)."""
        mine = Path(self.wandb_run.dir).parent
        for path in offline_records(self.records, self.run.id):
            if path.resolve() != mine.resolve():
                shutil.rmtree(path, ignore_errors=True)
        self.steps = StepAxis()
        for event in logged_before(self.run.path, "resume"):
            if event.get("event") != "end":
                self.write(event)

    def close(self) -> None:
        try:
            self.wandb_run.finish(exit_code=EXIT_CODE.get(self.run.state, 1))
        except BaseException:
            self.failed = True
            raise
        finally:
            self._settle()


@hookimpl
def register_sinks(register):
    register(WandbSink, name="wandb",
             description="One W&B run per fslab run (config, metrics on the step axis, summary), offline under "
                         "runs/<id>/wandb/ unless mode='online'.",
             paper="Weights & Biases (pip install 'fslab[wandb]')", allowed={"mode": one_of("offline", "online")},
             check=installed("wandb", "wandb", "wandb"))
