"""The events in ``metrics.jsonl``: readable one-line forms, and the label an
evaluation is saved and compared under."""

from __future__ import annotations

from fslab.core.text import count


def metric_label(event: dict) -> str:
    """``""`` for an accuracy, ``"mAP "`` for a retrieval evaluation: one whose
    ``metric`` is not accuracy keeps its score under ``accuracy`` too."""
    metric = event.get("metric", "accuracy")
    return "" if metric == "accuracy" or not isinstance(metric, str) else f"{metric.replace('map', 'mAP')} "


def score_cell(event: dict) -> str:
    """An evaluation's score ± CI in percent as tables show it (``54.22±0.44``),
    labelled with its metric when that is not accuracy (``mAP 46.11±1.79``)."""
    return f"{metric_label(event)}{100 * event['accuracy']:.2f}±{100 * event['ci95']:.2f}"


def accuracy_text(event: dict) -> str:
    """Mean ± CI in percent, labelled with its metric when that is not accuracy."""
    return f"{metric_label(event)}{100 * event['accuracy']:.2f} ± {100 * event['ci95']:.2f}%"


def is_validation(event: dict) -> bool:
    """Whether an ``eval`` event is one of training's validations (placed by
    its epoch), not the final network's evaluation on the validation classes
    (``eval.final_val``) or one ``fslab eval`` made (it names its ``source``)."""
    return event.get("split") == "val" and "epoch" in event and "source" not in event


def eval_line(event: dict) -> str:
    where = f" after epoch {event['epoch']}" if "epoch" in event else ""
    return (f"{event['split']} {event['ways']}-way {event['shots']}-shot, {event['episodes']} episodes"
            f"{where}: {accuracy_text(event)}")


def describe_event(event: dict) -> str:
    """One readable line for a metrics event (what the worker prints to stdout)."""
    kind = event.get("event")
    if kind == "train":
        return (f"epoch {event['epoch']} step {event['step']}: loss {event['loss']:.4f}, "
                f"pairs +{event['positives']}/-{event['negatives']}, lr {event['lr']:.4g}, "
                f"{event['images_per_s']:.0f} img/s")
    if kind == "eval":
        return eval_line(event)
    if kind == "start":
        return (f"training on {event['device']}: {count(event['epochs'], 'epoch')} of "
                f"{count(event['steps_per_epoch'], 'step')}, {count(event['train_images'], 'training image')}")
    if kind == "checkpoint":
        return f"checkpoint after epoch {event['epoch']}: {event['path']}"
    if kind == "resume":
        return f"resumed from the checkpoint of epoch {event['epoch']} (step {event['step']})"
    if kind == "end":
        return "done: " + ", ".join(f"test {shots} {accuracy_text(v)}" for shots, v in event["results"].items())
    return str(event)


def evaluator_label(section: dict) -> str:
    """The name an evaluator's results are saved and compared under: its name,
    plus its parameters when any are set (``knn[k=3]``), so evaluations by
    different evaluators or settings are never pooled or paired."""
    params = {k: v for k, v in section.items() if k != "name"}
    if not params:
        return section["name"]
    return section["name"] + "[" + ",".join(f"{k}={params[k]}" for k in sorted(params)) + "]"


def logged_evaluator(event: dict) -> str:
    """The evaluator label of a logged evaluation (``centroid`` for events
    logged before evaluators were recorded, as in fslab 0.1)."""
    return str(event.get("evaluator", "centroid"))


def own_evaluator(config: dict) -> str:
    """The label of the evaluator a run's configuration names, the one its
    training tested with (``centroid`` where none is named, as in fslab 0.1)."""
    section = config.get("evaluator")
    if isinstance(section, dict) and isinstance(section.get("name"), str):
        return evaluator_label(section)
    return "centroid"
