"""What the built-in sinks share: importing a tracker's package with one clear
line when it is missing (and a check, before a run starts, that it is installed),
and naming an evaluation, a train event's numbers and the run's final test scores
as the trackers show them."""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fslab.plugin import NotInstalled, canonical_evaluator, own_evaluator, run_events


def need(module: str, sink: str, extra: str) -> Any:
    """``import module``, or an ImportError saying which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"sink '{sink}' needs the {extra} package ({exc}): pip install 'fslab[{extra}]'") from None


def installed(package: str, sink: str, extra: str) -> Callable[[dict, Any], None]:
    """The sink's ``check=``: its tracker's package is installed here, found without importing it (a
    check runs as a run's configuration is resolved, before the run exists); else one line saying which
    extra installs it. A run given a sink it cannot write to was trained all the same, the sink's failure
    a line in stderr.log that no one reads until the tracker is found empty."""
    def check(params: dict, context: Any) -> None:
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):  # a parent package that is missing, or a module without a spec
            found = False
        if not found:
            raise NotInstalled(f"sink '{sink}' needs the {extra} package, which is not installed here: "
                             f"pip install 'fslab[{extra}]' (or leave the sink out)")
    return check


def project_path(path: str, run) -> Path:
    """A folder a sink was given (``log_dir``, ``dir``), ``~`` expanded; a
    relative one is taken from the folder that holds the runs folder (as the
    default ``mlruns/`` is), not from where the command ran: the live run, its
    resume, ``fslab export`` and ``fslab eval`` (from a subfolder, with
    ``FSLAB_CONFIG``) then all write, and replace, the same record. A runs
    folder that is a link (to a larger disk) is not followed: the folder is the
    link's, the project, where ``mlflow ui`` finds ``mlruns/``."""
    folder = Path(path).expanduser()
    return folder if folder.is_absolute() else Path(os.path.abspath(run.path)).parent.parent / folder


def eval_prefix(event: dict, config: dict) -> str:
    """``val/5way_1shot``: an evaluation's split and episode shape, and its
    evaluator's label when it is not the run's own (``test/5way_1shot/knn[k=3]``).
    The final network's scores on the validation classes (``eval.final_val``:
    a val evaluation placed by no epoch) are ``val_final/...``, apart from the
    epoch-by-epoch validation curve. An evaluation made after training (``fslab
    eval``, its event names its ``source``) is ``eval/...`` with its episodes and
    queries (``eval/test/5way_1shot/centroid/15q_10000ep``), so it never takes the
    place of the training's own test or validation numbers."""
    own = own_evaluator(config)
    label = _evaluator(event, own)
    shape = f"{event['ways']}way_{event['shots']}shot"
    if event.get("source"):
        return f"eval/{event['split']}/{shape}/{label}/{event['queries']}q_{event['episodes']}ep"
    split = "val_final" if event["split"] == "val" and "epoch" not in event else event["split"]
    return f"{split}/{shape}" if label == own else f"{split}/{shape}/{label}"


def result_metric(event: dict, config: dict) -> str | None:
    """The metric of an evaluation whose score the end event's ``results``
    repeat (the training's own test on ``eval.ways``: ``accuracy``, or ``map``
    for retrieval); None for any other event. The end event of a run made
    before results.json named a score's metric does not say it (a replayed
    old run), so a sink notes it here as the test evaluations pass."""
    if event.get("event") != "eval" or event.get("source") or event.get("split") != "test":
        return None
    own = own_evaluator(config)
    if _evaluator(event, own) != own or event.get("ways") != config.get("eval", {}).get("ways", 5):
        return None
    return str(event.get("metric", "accuracy"))


def _evaluator(event: dict, own: str) -> str:
    """The label of the evaluator that made ``event``, in its one spelling (a
    run's older events may spell it out: ``knn[k=0,ties=nearest]`` is ``knn``);
    an event logged before evaluators were named is the run's own."""
    return canonical_evaluator(str(event.get("evaluator", own)))


def result_key(config: dict, shots: str, metric: str) -> str:
    """A final test score's name (``1-shot`` of the end event's results):
    ``test/5way_1shot/accuracy``, the name of its evaluation's scalar."""
    ways = config.get("eval", {}).get("ways", 5)
    return f"test/{ways}way_{shots.removesuffix('-shot')}shot/{metric}"


def eval_values(event: dict) -> dict[str, float]:
    """An evaluation's numbers: its score under its metric's name, and the CI."""
    metric = str(event.get("metric", "accuracy"))
    return {metric: float(event["accuracy"]), f"{metric}_ci95": float(event["ci95"])}


class StepAxis:
    """The training step each event is placed at: its own ``step``, else the
    last one logged before it; but an evaluation ``fslab eval`` made afterwards
    (it names its ``source``) scored the checkpoint of its ``epoch``, and is
    placed at that checkpoint's step. It is appended to the log wherever the run
    stood: a run killed at step 25 with its checkpoint at step 21 placed the
    scores at 25, a resume then hid them in TensorBoard (purged from step 22 on),
    and an export after the resume moved them to 21."""

    def __init__(self) -> None:
        self.step = 0
        self.checkpoints: dict[int, int] = {}  # epoch -> the step of its checkpoint event

    def place(self, event: dict) -> int:
        """The step of ``event``, which the events come through in their order."""
        if event.get("source") and event.get("epoch") in self.checkpoints:
            return self.checkpoints[event["epoch"]]
        self.step = int(event.get("step", self.step))
        if event.get("event") == "checkpoint" and isinstance(event.get("epoch"), int):
            self.checkpoints[event["epoch"]] = self.step
        return self.step


def logged_before(run_path, kind: str) -> list[dict]:
    """The events of ``metrics.jsonl`` before its last event of ``kind``: before a ``resume``, those the
    resumed run goes on from (the worker cut the file back to the checkpoint before it logged it); before
    a ``start``, those of the run's earlier starts (none for a run started afresh: the file was emptied).
    Read as fslab reads them (``run_events``): a last line still being written, or a damaged one, is left out."""
    logged = run_events(run_path)
    last = max((i for i, e in enumerate(logged) if e.get("event") == kind), default=len(logged))
    return logged[:last]


def axis_before(run_path, added: list[dict]) -> StepAxis:
    """The step axis as it stands where ``added`` (events the run's log ends with: ``fslab eval``'s) were
    logged, for a sink that adds them to its record (a sink's ``reopen``): every event logged before the
    first of them placed on it, as an export of the whole run places them on its way there. Where the
    log does not hold them (changed meanwhile), every event it holds."""
    logged = run_events(run_path)
    first = next((i for i, e in enumerate(logged) if added and e == added[0]), len(logged))
    axis = StepAxis()
    for event in logged[:first]:
        axis.place(event)
    return axis


def logged_at(logged: list[dict], step: int) -> list[dict]:
    """The train and eval events of ``logged`` that :class:`StepAxis` places at ``step``."""
    axis = StepAxis()
    return [e for e in logged if axis.place(e) == step and e.get("event") in ("train", "eval")]


# The numbers of a train event that are not one of its counters' own fields.
TRAIN_SKIP = ("event", "time", "step", "epoch")


def train_values(event: dict) -> dict[str, float]:
    """A train event's numbers: loss, pair counts, learning rate, images/s and
    whatever counters the loss adds (``rows_without_positive``)."""
    return {k: float(v) for k, v in event.items()
            if k not in TRAIN_SKIP and isinstance(v, (int, float)) and not isinstance(v, bool)}


