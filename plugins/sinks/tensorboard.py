"""The ``tensorboard`` sink: a run's scalars and configuration as TensorBoard
event files, in ``runs/<id>/tb/`` (or ``LOG_DIR/<id>/`` with ``log_dir``), so
``tensorboard --logdir runs`` shows every run.

Tags: ``train/loss``, ``train/positives``, ``train/negatives``, ``train/lr``,
``train/images_per_s`` (and any counter the loss adds), and per evaluation
``val/5way_1shot/accuracy`` and ``.../accuracy_ci95`` (``test/...`` for the
test, with the evaluator's label where it is not the run's own), all on the
training step (a later ``fslab eval``'s at the step of the checkpoint it
scored). The resolved configuration is the text ``config``, and at the end
the hyperparameters (HPARAMS tab) with the final test scores as their
metrics, named as their scalars (``.../map`` for a run tested in mAP). A
resumed run purges what it logged after its checkpoint, as TensorBoard's
``purge_step`` does (a test cut short after the last checkpoint, logged at the
checkpoint's own step, too), and a run queued again from step 0 its earlier
start's: each step's numbers, and the text, are there once; ``fslab
export`` writes the folder anew beside the earlier one, which it replaces once
written whole (an export that fails keeps it). ``fslab eval``'s scores are added to
a whole record (:meth:`TensorBoardSink.reopen`) as one more event file, written
beside the folder and moved into it once closed, holding those scalars alone.

Writing uses ``torch.utils.tensorboard``, which needs the ``tensorboard``
package (``pip install 'fslab[tensorboard]'``).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

from fslab_plugins.sinks.common import (
    StepAxis,
    axis_before,
    eval_prefix,
    eval_values,
    installed,
    logged_at,
    logged_before,
    need,
    project_path,
    result_key,
    result_metric,
    train_values,
)

from fslab.plugin import dotted, hookimpl


def quiet_writer_threads() -> None:
    """TensorBoard writes from a thread of its own, which keeps the error that
    stops it (a folder on a read-only store, a full disk) for the writer's next
    call to raise: the sink's failure, one line. Python also printed that
    thread's traceback on stderr; this hook leaves it out, for those threads only."""
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    previous = threading.excepthook
    if getattr(previous, "fslab_tensorboard", False):
        return

    def hook(args):
        if not isinstance(args.thread, _AsyncWriterThread):
            previous(args)

    hook.fslab_tensorboard = True
    threading.excepthook = hook


def record_folder(run, log_dir: str) -> Path:
    """The folder of the run's TensorBoard record: ``runs/<id>/tb/``, or ``LOG_DIR/<id>/``."""
    return project_path(log_dir, run) / run.id if log_dir else Path(run.path) / "tb"


def add_scalars(writer, event: dict, step: int, config: dict) -> str | None:
    """The scalars of a train or eval event at ``step``; the metric of the test scores the end event
    repeats where ``event`` is one of them (:func:`result_metric`)."""
    if event["event"] == "train":
        for key, value in train_values(event).items():
            writer.add_scalar(f"train/{key}", value, step)
        return None
    prefix = eval_prefix(event, config)
    for key, value in eval_values(event).items():
        writer.add_scalar(f"{prefix}/{key}", value, step)
    return result_metric(event, config)


class TensorBoardSink:
    """One run's TensorBoard log (see the module)."""

    @classmethod
    def reopen(cls, run, *, log_dir: str = ""):
        """The run's record, to add events to (:class:`TensorBoardAddition`); None where it has none."""
        folder = record_folder(run, log_dir)
        if not any(folder.glob("events.out.tfevents.*")):
            return None
        return TensorBoardAddition(run, folder)

    def __init__(self, run, *, log_dir: str = "") -> None:
        self.board = need("torch.utils.tensorboard", "tensorboard", "tensorboard")
        quiet_writer_threads()
        self.run = run
        self.folder = record_folder(run, log_dir)
        self.writing = self.folder  # an export writes beside the earlier record, which it replaces once whole
        if run.replay:
            self.writing = self.folder.with_name(f".{self.folder.name}.export")
            shutil.rmtree(self.writing, ignore_errors=True)  # what an export killed midway left
        self.failed = False
        self.earlier = not run.replay and any(self.writing.glob("events.out.tfevents.*"))  # an earlier start's
        # A new record opens with a session start of its own (purge_step=0, which hides nothing yet):
        # TensorBoard takes the first one it reads as the record's beginning, and purges only from the
        # next, so without it the first resume's purge hid nothing.
        self.writer = self.board.SummaryWriter(str(self.writing), purge_step=None if self.earlier else 0)
        self.texted = False  # the configuration's text written
        self.steps = StepAxis()
        self.metric = "accuracy"  # of the test scores the end event repeats (map for retrieval)

    def write(self, event: dict) -> None:
        kind = event.get("event")
        step = self.steps.place(event)
        if kind == "start":
            self._start()
        elif kind == "resume":
            self._resume(step)
        elif kind in ("train", "eval"):
            self._scalars(event, step)
        elif kind == "end":
            self._hparams(event["results"])
        if kind in ("checkpoint", "end"):
            self.writer.flush()

    def _scalars(self, event: dict, step: int) -> None:
        self.metric = add_scalars(self.writer, event, step, self.run.config) or self.metric

    def _start(self) -> None:
        """The configuration as text, once: a resumed run's start leaves the first start's text, and
        a run queued again from step 0 (its metrics.jsonl emptied) hides the earlier start's numbers,
        which it logs again: each start wrote the text anew (an export too, replaying a resumed run's
        starts), and the second kept the first's steps."""
        if self.texted:  # an export replays a resumed run's starts, each a start event
            return
        self.texted = True
        if self.earlier:
            if logged_before(self.run.path, "start"):
                return
            self.writer.close()
            self.writer = self.board.SummaryWriter(str(self.writing), purge_step=0)
        text = json.dumps(self.run.config, indent=2)
        self.writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)  # indented: shown as code

    def _resume(self, step: int) -> None:
        """Hide what was logged after the checkpoint, which the resumed run logs again. A test cut short
        after the last checkpoint logged its scores at the checkpoint's own step, which a purge from the
        next step kept beside the resumed test's (the 1-shot test twice): a live resume purges from the
        checkpoint's step and logs that step's numbers again from ``metrics.jsonl``, which the worker cut
        back to the checkpoint. An export replays the cut file, which holds no such scores."""
        self.writer.close()
        if self.run.replay:
            self.writer = self.board.SummaryWriter(str(self.writing), purge_step=step + 1)
            return
        self.writer = self.board.SummaryWriter(str(self.writing), purge_step=step)
        for event in logged_at(logged_before(self.run.path, "resume"), step):
            self._scalars(event, step)

    def _hparams(self, results: dict) -> None:
        """The configuration as hyperparameters, the test accuracies as their metrics, in this run's folder."""
        from torch.utils.tensorboard.summary import hparams

        values = {k: v if isinstance(v, (int, float, str, bool)) else json.dumps(v)
                  for k, v in dotted(self.run.config).items()}
        metrics = {result_key(self.run.config, shots, self.metric): float(r["accuracy"])
                   for shots, r in results.items()}
        for summary in hparams(values, metrics):
            self.writer.file_writer.add_summary(summary)

    def close(self) -> None:
        try:
            self.writer.close()
        except BaseException:
            self.failed = True
            raise
        finally:
            if self.writing != self.folder:
                self._replace()

    def _replace(self) -> None:
        """An export's record in place of the earlier one, once it is written whole; one that failed
        midway (a full disk) is removed instead, and the earlier record is kept as it was."""
        if self.failed or self.run.cut_short:  # cut short: a write that failed, or a Ctrl-C between two
            shutil.rmtree(self.writing, ignore_errors=True)
            return
        old = self.folder.with_name(f".{self.folder.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if self.folder.exists():
            os.replace(self.folder, old)
        os.replace(self.writing, self.folder)
        shutil.rmtree(old, ignore_errors=True)


class TensorBoardAddition:
    """New events of a finished run (``fslab eval``'s) added to its record in ``folder`` as one more
    event file: written in a hidden folder beside it, moved in once closed whole (one that fails, or is
    cut short, is removed: the record stays as it was). It holds their scalars alone, on the step an
    export of the whole run places them at, and no session start: TensorBoard purges nothing for it."""

    def __init__(self, run, folder: Path) -> None:
        self.board = need("torch.utils.tensorboard", "tensorboard", "tensorboard")
        quiet_writer_threads()
        self.run, self.folder = run, folder
        self.writing = folder.with_name(f".{folder.name}.append")
        shutil.rmtree(self.writing, ignore_errors=True)  # what an addition killed midway left
        self.writer = None  # opened with the first scalar: nothing to add, no file
        self.steps: StepAxis | None = None

    def write(self, event: dict) -> None:
        if self.steps is None:
            self.steps = axis_before(self.run.path, [event])
        step = self.steps.place(event)
        if event.get("event") in ("train", "eval"):
            if self.writer is None:
                self.writer = self.board.SummaryWriter(str(self.writing))
            add_scalars(self.writer, event, step, self.run.config)

    def close(self) -> None:
        if self.writer is None:
            return
        try:
            self.writer.close()
        except BaseException:
            shutil.rmtree(self.writing, ignore_errors=True)
            raise
        if self.run.cut_short:
            shutil.rmtree(self.writing, ignore_errors=True)
            return
        for path in sorted(self.writing.iterdir()):
            os.replace(path, self.folder / last_name(path.name, self.folder))
        shutil.rmtree(self.writing, ignore_errors=True)


def last_name(name: str, folder: Path) -> str:
    """The name an added event file ``name`` takes in ``folder``: TensorBoard reads a folder's files in the
    order of their names (``events.out.tfevents.SECONDS.HOST.PID.N``), and one read before the record's
    first file would be hidden by that file's session start. Where it would not come last (made in the
    same second as the last one, by a lower pid; a clock set back), its seconds are the last one's plus 1."""
    last = max((p.name for p in folder.glob("events.out.tfevents.*")), default="")
    parts, stamp = name.split(".", 4), last.split(".", 4)[3:4]
    if name > last or len(parts) < 5 or not stamp or not stamp[0].isdigit():
        return name
    return ".".join([*parts[:3], str(int(stamp[0]) + 1), parts[4]])


@hookimpl
def register_sinks(register):
    register(TensorBoardSink, name="tensorboard",
             description="TensorBoard event files in runs/<id>/tb/ (or log_dir/<id>/): training and evaluation "
                         "scalars on the step axis, the configuration as text and hyperparameters.",
             paper="TensorBoard (pip install 'fslab[tensorboard]')",
             check=installed("tensorboard", "tensorboard", "tensorboard"))
