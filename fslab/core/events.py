"""The events in ``metrics.jsonl``: readable one-line forms, and the label an
evaluation is saved and compared under."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Sequence

from fslab.core.errors import UsageError
from fslab.core.text import count, loss_text, percent

# The digits a per-episode score keeps in ``evaluations/`` (Run.save_accuracies): every
# mean ± CI of an evaluation, the one its run logs and those compare pools, is of these.
SCORE_DIGITS = 6


def kept_scores(values: Iterable[float]) -> list[float]:
    """Per-episode scores as ``evaluations/`` keeps them (:data:`SCORE_DIGITS`)."""
    return [round(float(value), SCORE_DIGITS) for value in values]


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and 95% half-width ``1.96 * std / sqrt(N)`` of N per-episode scores (or paired
    differences), ``std`` their population standard deviation (ddof=0, as the SimpleShot and
    NCA evaluation code has it). The one place a score's mean and interval are computed: a run's
    logged test score, ``fslab eval``'s, and every pooled or paired one of compare, plot and
    study report, so each shows the same digits for the same episodes. Exact sums
    (:func:`statistics.fmean`, :func:`statistics.pstdev`): the order of the episodes changes nothing."""
    if not values:
        raise UsageError("no episode scores to summarise")
    if not all(math.isfinite(value) for value in values):  # statistics' exact sums take no nan nor inf
        return math.nan, math.nan
    return statistics.fmean(values), 1.96 * statistics.pstdev(values) / math.sqrt(len(values))


def metric_label(event: dict) -> str:
    """``""`` for an accuracy, ``"mAP "`` for a retrieval evaluation: one whose
    ``metric`` is not accuracy keeps its score under ``accuracy`` too."""
    metric = event.get("metric", "accuracy")
    return "" if metric == "accuracy" or not isinstance(metric, str) else f"{metric.replace('map', 'mAP')} "


def score_cell(event: dict) -> str:
    """An evaluation's score ± CI in percent as tables show it (``54.22±0.44``),
    labelled with its metric when that is not accuracy (``mAP 46.11±1.79``)."""
    return f"{metric_label(event)}{percent(event['accuracy'])}±{percent(event['ci95'])}"


def table_score(value: dict | None) -> str:
    """A score cell of the runs tables (``fslab runs``, the dashboard):
    :func:`score_cell`, with its query count where that is not the run's
    (``61.02±0.40 (5q)``), or ``-`` where there is no score."""
    if not value:
        return "-"
    return score_cell(value) + (f" ({value['queries']}q)" if "queries" in value else "")


def accuracy_text(event: dict) -> str:
    """Mean ± CI in percent, labelled with its metric when that is not accuracy."""
    return f"{metric_label(event)}{percent(event['accuracy'])} ± {percent(event['ci95'])}%"


def is_validation(event: dict) -> bool:
    """Whether an ``eval`` event is one of training's validations (placed by
    its epoch), not the final network's evaluation on the validation classes
    (``eval.final_val``) or one ``fslab eval`` made (it names its ``source``)."""
    return event.get("split") == "val" and "epoch" in event and "source" not in event


def eval_line(event: dict) -> str:
    where = f" after epoch {event['epoch']}" if "epoch" in event else ""
    return (f"{event['split']} {event['ways']}-way {event['shots']}-shot, {event['episodes']} episodes"
            f"{where}{precision_note(event)}: {accuracy_text(event)}")


def speed_text(event: dict) -> str:
    """A ``train`` event's images/s, ``- img/s`` where it has none (an interval of only the step
    that compiled the training forward, whose time is left out of images/s)."""
    rate = event.get("images_per_s")
    return "- img/s" if rate is None else f"{rate:.0f} img/s"


def numerics_text(start: dict) -> str | None:
    """How a run's steps computed, as its ``start`` event records them once resolved for its device
    (``train.precision=auto`` is bf16 on a CUDA GPU, fp32 on the CPU): ``on cuda:0 in bf16,
    channels-last, TF32, compiled (default)``; None for a start event written before they were recorded."""
    if "precision" not in start:
        return None
    precision = start["precision"]
    if start.get("eval_precision", precision) != precision:
        precision += f" (features in {start['eval_precision']})"
    parts = [f"on {start.get('device', '?')} in {precision}"]
    parts += [name for key, name in (("channels_last", "channels-last"), ("tf32", "TF32")) if start.get(key)]
    if start.get("compile", "off") != "off":
        parts.append(f"compiled ({start['compile']})")
    if start.get("deterministic"):
        parts.append("deterministic")
    return ", ".join(parts)


MOVED_ROOT = "data_root"  # the event fslab resume --data-root appends: the run's data root moved, and from where


def describe_event(event: dict) -> str:
    """One readable line for a metrics event (what the worker prints to stdout)."""
    kind = event.get("event")
    if kind == "train":
        return (f"epoch {event['epoch']} step {event['step']}: loss {loss_text(event['loss'])}, "
                f"pairs +{event['positives']}/-{event['negatives']}, lr {event['lr']:.4g}, "
                f"{speed_text(event)}")
    if kind == "eval":
        return eval_line(event)
    if kind == "start":
        note = f"\n{event['note']}" if isinstance(event.get("note"), str) else ""  # a resume on changed data
        return (f"training on {event['device']}: {count(event['epochs'], 'epoch')} of "
                f"{count(event['steps_per_epoch'], 'step')}, {count(event['train_images'], 'training image')}{note}")
    if kind == "checkpoint":
        return f"checkpoint after epoch {event['epoch']}: {event['path']}"
    if kind == "compile":
        return (f"step {event['step']} compiled the training forward (train.compile={event['mode']}): "
                f"{event['seconds']:.1f} s, left out of img/s")
    if kind == "resume":
        return f"resumed from the checkpoint of epoch {event['epoch']} (step {event['step']})"
    if kind == MOVED_ROOT:
        return f"data root moved to {event.get('root')} from {event.get('was')} (fslab resume --data-root)"
    if kind == "end":
        return "done: " + ", ".join(f"test {shots} {accuracy_text(v)}" for shots, v in event["results"].items())
    return str(event)


def evaluator_label(section: dict) -> str:
    """The name an evaluator's results are read and compared under: its name,
    plus the parameters set to other values than its defaults (``knn[k=3]``),
    so evaluations by different evaluators or settings are never pooled or
    paired, and one evaluator has one label however it was spelt (``knn``,
    ``knn[k=0]`` and ``knn[k=0,ties=nearest]`` are all ``knn``)."""
    return canonical_evaluator(recorded_evaluator(section))


def recorded_evaluator(section: dict) -> str:
    """The label an evaluation is written under (its events, its file in
    ``evaluations/``): every parameter the section gives spelt out
    (``knn[k=0,ties=nearest]``), so the record says what scored it even if a
    later version of the plugin changes a default; readers take it in its one
    spelling through :func:`canonical_evaluator`."""
    params = {k: v for k, v in section.items() if k != "name"}
    return _spelt(section["name"], [(k, str(params[k])) for k in params])


def _spelt(name: str, params: list[tuple[str, str]]) -> str:
    return name + ("[" + ",".join(f"{k}={v}" for k, v in sorted(params)) + "]" if params else "")


def canonical_evaluator(label: str) -> str:
    """``label`` in the one spelling :func:`evaluator_label` gives: the
    parameters equal to the evaluator's registered defaults left out, the
    others sorted, and a number given to a parameter whose default is a float
    spelt as the float its run records (``soft[temperature=2]`` is
    ``soft[temperature=2.0]``: ``--set evaluator.temperature=2`` trains and
    records 2.0). A label of an evaluator no loaded plugin registers (or
    that does not parse) is kept as it is, only sorted when it parses."""
    params = label_params(label)
    if not params:  # no brackets (its one spelling already), or brackets that do not parse
        return label
    name = label.partition("[")[0]
    defaults = _evaluator_defaults(name)
    return _spelt(name, [(k, _as_recorded(v, defaults.get(k))) for k, v in params
                         if k not in defaults or not _same_value(v, defaults[k])])


def label_params(label: str) -> list[tuple[str, str]] | None:
    """The parameters a label spells out, as text (``knn[k=3]`` -> ``[("k", "3")]``; none for
    ``knn``), or None where its brackets do not parse."""
    name, bracket, rest = label.partition("[")
    if not bracket:
        return []
    return _split_params(rest[:-1]) if rest.endswith("]") else None


def _split_params(text: str) -> list[tuple[str, str]] | None:
    """``"k=3,ties=nearest"`` -> ``[("k", "3"), ("ties", "nearest")]``; a comma
    inside a value (a list) stays in it: a new parameter starts only at ``,NAME=``."""
    params: list[tuple[str, str]] = []
    for piece in text.split(","):
        key, equals, value = piece.partition("=")
        if equals and key.isidentifier():
            params.append((key, value))
        elif params:
            params[-1] = (params[-1][0], params[-1][1] + "," + piece)
        else:
            return None
    return params


def _as_recorded(text: str, default) -> str:
    """A parameter's value in a label as a run records it: where the default is a float, a finite number
    as that float (a configuration holds a whole number given for a float as the float,
    :func:`fslab.core.values.check_value`), so ``2``, ``2.00`` and ``2e0`` are ``2.0``; else ``text``."""
    if not isinstance(default, float):
        return text
    try:
        number = float(text)
    except ValueError:
        return text
    return str(number) if math.isfinite(number) else text


def _same_value(text: str, default) -> bool:
    if text == str(default):
        return True
    if isinstance(default, bool) or not isinstance(default, (int, float)):
        return False
    try:
        return float(text) == float(default)
    except ValueError:
        return False


def _evaluator_defaults(name: str) -> dict:
    """The defaults of the evaluator ``name`` as registered by the plugins of
    this project (``{}`` when none registers it). The registry is loaded the
    first time a label with parameters is read (about 0.1 s, without torch),
    and ``fslab.toml`` read again only when it changed (a summary reads a
    label for every evaluation it folds)."""
    from fslab.core.settings import settings_path

    path = settings_path().resolve()
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        stamp = None
    return _registered_defaults(_plugin_dirs(str(path), stamp)).get(name, {})


@functools.cache
def _plugin_dirs(settings_file: str, stamp: int | None) -> tuple[str, ...]:
    """The plugin folders ``settings_file`` names, as of its modification time ``stamp``."""
    from pathlib import Path

    from fslab.core.settings import load_settings

    try:
        return tuple(str(d) for d in load_settings(Path(settings_file)).plugin_dirs)
    except Exception:  # a broken fslab.toml is reported by the command that reads it
        return ()


@functools.cache
def _registered_defaults(plugin_dirs: tuple[str, ...]) -> dict[str, dict]:
    from fslab.core.registry import load_registry

    registry = load_registry(plugin_dirs)
    return {name: dict(registry.get("evaluator", name).params) for name in registry.names("evaluator")}


def logged_evaluator(event: dict) -> str:
    """The evaluator label of a logged evaluation or saved result, in its one
    spelling (``centroid`` for events logged before evaluators were recorded,
    as in fslab 0.1)."""
    return canonical_evaluator(str(event.get("evaluator", "centroid")))


def other_precision(record: dict) -> bool:
    """Whether an ``eval`` event or a saved evaluation holds the scores of a network run in a precision
    other than the run's own (``fslab eval --precision``, which names the run's own in ``run_precision``):
    the one rule by which ``fslab runs``, ``compare``, ``plot``, ``study report`` and the sinks leave
    such scores out, and ``fslab show`` names their precision."""
    own = record.get("run_precision")
    return own is not None and own != record.get("precision")


def precision_note(record: dict) -> str:
    """``, network in fp32`` where ``record`` holds scores of another precision than the run's
    (:func:`other_precision`), as tables and lines name them beside the evaluator; else ``''``."""
    return f", network in {record.get('precision')}" if other_precision(record) else ""


def own_evaluator(config: dict) -> str:
    """The label of the evaluator a run's configuration names, the one its
    training tested with (``centroid`` where none is named, as in fslab 0.1)."""
    section = config.get("evaluator")
    if isinstance(section, dict) and isinstance(section.get("name"), str):
        return evaluator_label(section)
    return "centroid"
