"""The shapes of the run store's files, one schema per file, and the readers'
one way of holding what they read to them.

A run folder may be written by another fslab version, half-edited by hand,
damaged, or valid JSON of the wrong shape (``[1, 2]`` in results.json, a
string where a time belongs). Readers keep what matches the shape the writers
produce and drop the rest, so every consumer can trust the types it gets and
no listing, comparison or dashboard ever stops on one bad file. The schemas
say, per key, which JSON types a value may have; nested records (an
evaluation's per-episode scores, the test results by shots) say so too.
"""

from __future__ import annotations

from typing import Any

# JSON value kinds. bool is not a number here, although Python says it is an int, and a
# number is finite (Python's reader takes NaN, Infinity and 1e400, which no fslab writes).
# A fraction is a number from 0 to 1: an accuracy, or its 95% half-width.
NUMBER, FRACTION, WHOLE, TEXT, FLAG, TABLE, ARRAY, NULL = (
    "number", "fraction", "whole", "text", "flag", "table", "array", "null")
_INF = float("inf")


def is_kind(value: Any, kind: str) -> bool:
    if kind == NUMBER:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and -_INF < value < _INF
    if kind == FRACTION:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1
    if kind == WHOLE:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == TEXT:
        return isinstance(value, str)
    if kind == FLAG:
        return isinstance(value, bool)
    if kind == TABLE:
        return isinstance(value, dict)
    if kind == ARRAY:
        return isinstance(value, list)
    return value is None  # NULL


# status.json: written by the launcher, the worker, the scheduler and the executors.
STATUS = {
    "state": (TEXT,), "pid": (WHOLE, NULL), "host": (TEXT, NULL), "processes": (WHOLE, NULL),
    "created": (NUMBER,), "started": (NUMBER, NULL), "resumed": (NUMBER, NULL), "ended": (NUMBER, NULL),
    "heartbeat": (NUMBER, NULL), "exit_code": (WHOLE, NULL), "error": (TEXT, NULL), "sweep": (TEXT, NULL),
    "slot": (TEXT, NULL), "gpus": (TEXT, NULL), "executor": (TEXT, NULL), "slurm_job_id": (TEXT, NULL),
    "slurm_cluster": (TEXT, NULL), "slurm_user": (TEXT, NULL), "slurm_submitted": (NUMBER, NULL),
    "attempts": (WHOLE, NULL), "requeues": (WHOLE, NULL),
    "requeued": (NUMBER, NULL), "usage": (TABLE, NULL),
}
# status.json's "usage", sampled by the worker at each heartbeat (fslab.execution.usage);
# every key optional: a CPU run has no gpu_* keys, a status from before fslab 0.3 no usage at all.
USAGE = {"time": (NUMBER,), "cpu_percent": (NUMBER,), "rss_bytes": (WHOLE,), "gpu_allocated_bytes": (WHOLE,),
         "gpu_reserved_bytes": (WHOLE,), "gpu_utilization_percent": (NUMBER,)}
# One score of results.json's "test" (by shots) and of the summaries.
SCORE = {"accuracy": (FRACTION,), "ci95": (FRACTION,)}
# results.json: written once by the training at its end.
RESULTS = {
    "run": (TEXT,), "method": (TEXT,), "dataset": (TEXT,), "backbone": (TEXT,), "ways": (WHOLE,),
    "queries": (WHOLE,), "episodes": (WHOLE,), "test": (TABLE,), "best_val_accuracy": (FRACTION, NULL),
    "epochs": (WHOLE,), "steps": (WHOLE,),
}
# evaluations/*.json: one evaluation's per-episode scores. Every key is needed
# to pair it with another run's (evaluator and stream default for old files).
EVALUATION = {
    "split": (TEXT,), "ways": (WHOLE,), "shots": (WHOLE,), "queries": (WHOLE,), "episodes": (WHOLE,),
    "seed": (WHOLE,), "epoch": (WHOLE,), "evaluator": (TEXT,), "stream": (WHOLE,), "accuracies": (ARRAY,),
}
EVALUATION_DEFAULTS = {"evaluator": "centroid", "stream": 1}  # saved before these were recorded
# metrics.jsonl: the fields each event must have (others may be there too).
EVENTS = {
    "train": {"step": (WHOLE,), "epoch": (WHOLE,), "loss": (NUMBER,)},
    "eval": {"split": (TEXT,), "ways": (WHOLE,), "shots": (WHOLE,), "queries": (WHOLE,), "episodes": (WHOLE,),
             "accuracy": (FRACTION,), "ci95": (FRACTION,)},
    "start": {"epochs": (WHOLE,)},
    "checkpoint": {"epoch": (WHOLE,)},
    "end": {"results": (TABLE,)},  # the test scores by shots, each a SCORE (checked in event())
}
# Fields an event may leave out, but if it has them, of these kinds.
EVENT_OPTIONS = {
    "train": {"positives": (WHOLE, NULL), "negatives": (WHOLE, NULL)},
    "eval": {"metric": (TEXT,)},  # "accuracy", or "map" for a retrieval evaluation
}
# runs/<id>/sink_failures.json: {sink name: this}, each sink of the run that failed while it trained (fslab.core.sinks).
# What it was doing ("on a train event", "to start", "to close"), its error in one line, when; the step and epoch
# of the last event it was given, where it was given one with them.
SINK_FAILURE = {"failed": (TEXT,), "error": (TEXT,), "time": (NUMBER,)}
SINK_FAILURE_OPTIONS = {"step": (WHOLE,), "epoch": (WHOLE,)}
# runs/sweeps/<id>.json
SWEEP = {"id": (TEXT,), "method": (TEXT,), "runs": (ARRAY,), "fail_fast": (FLAG,), "created": (NUMBER,)}


def matches(value: Any, kinds: tuple[str, ...]) -> bool:
    # loops, not any() over a generator: a run of 200,000 steps checks a million values (fslab show)
    for kind in kinds:
        if is_kind(value, kind):
            return True
    return False


def conform(record: Any, schema: dict) -> dict:
    """The keys of ``record`` whose values have a kind their schema allows
    (keys the schema does not name are kept: a newer writer may add some);
    ``{}`` for anything that is not a JSON object."""
    if not isinstance(record, dict):
        return {}
    return {key: value for key, value in record.items() if key not in schema or matches(value, schema[key])}


def complete(record: Any, schema: dict) -> dict | None:
    """``record`` if it has every key of ``schema`` with an allowed kind, else None."""
    if not isinstance(record, dict):
        return None
    for key, kinds in schema.items():
        if key not in record or not matches(record[key], kinds):
            return None
    return record


def usage(record: Any) -> dict:
    """A status's ``usage`` block: the keys of USAGE whose values have their kinds."""
    return {key: value for key, value in conform(record, USAGE).items() if key in USAGE}


def status(record: Any) -> dict:
    """status.json held to its shape, its ``usage`` block too."""
    record = conform(record, STATUS)
    if isinstance(record.get("usage"), dict):
        record["usage"] = usage(record["usage"])
    return record


def results(record: Any) -> dict | None:
    """results.json held to its shape: None unless its ``test`` scores are numbers."""
    record = conform(record, RESULTS)
    test = record.get("test")
    if not isinstance(test, dict) or not test:
        return None
    scores = {shots: score for shots, score in test.items() if complete(score, SCORE)}
    return {**record, "test": scores} if scores else None


def evaluation(record: Any) -> dict | None:
    """One saved evaluation, or None if it cannot be used for a comparison
    (a missing key, a wrong type, no episodes, per-episode scores that are not
    fractions or not as many as its episodes). Its ``data``, the fingerprint of the
    split it was scored on, is optional (older fslab saved none)."""
    if not isinstance(record, dict):
        return None
    record = complete({**EVALUATION_DEFAULTS, **record}, EVALUATION)
    if record is None:
        return None
    scores = record["accuracies"]
    if not scores or len(scores) != record["episodes"] or not all(is_kind(a, FRACTION) for a in scores):
        return None
    if "data" in record and not isinstance(record["data"], str):  # the data's fingerprint, unreadable: as if unsaved
        record = {k: v for k, v in record.items() if k != "data"}
    return record


def event(record: Any) -> dict | None:
    """A metrics event with the fields its kind needs (events of other kinds
    pass as they are), or None."""
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        return None
    needed = EVENTS.get(record["event"])
    if needed is not None and not complete(record, needed):
        return None
    for key, kinds in EVENT_OPTIONS.get(record["event"], {}).items():
        if key in record and not matches(record[key], kinds):
            return None
    if record["event"] == "end" and not all(complete(score, SCORE) for score in record["results"].values()):
        return None
    return record


def sink_failures(record: Any) -> dict[str, dict]:
    """sink_failures.json held to its shape: the sinks whose record has the keys of SINK_FAILURE,
    each with those and the keys of SINK_FAILURE_OPTIONS that have their kinds."""
    if not isinstance(record, dict):
        return {}
    options = SINK_FAILURE_OPTIONS
    return {name: {key: value for key, value in failure.items()
                   if key in SINK_FAILURE or (key in options and matches(value, options[key]))}
            for name, failure in record.items() if complete(failure, SINK_FAILURE)}
