"""Feeding a run's events to its sinks (TensorBoard, MLflow, W&B, a plugin's own).

A run's ``metrics.jsonl`` is its record; a sink is a copy kept somewhere else,
and it must never cost the record anything. So each sink of a live run gets a
thread of its own and a bounded queue: :class:`SinkFeed` hands it each event
after :class:`fslab.core.eventlog.EventLog` has written, flushed and
summarised it, and never waits. The thread builds the sink (a tracker's import
can take seconds, or fail), then writes the events in order. Whatever the sink
does wrong is said once on stderr (the worker's ``stderr.log``), in one line
naming it, and the run goes on without it; a sink that fails is also recorded in
the run's ``sink_failures.json`` (:func:`record_failure`), which ``fslab show``
reads, until ``fslab export`` (or ``fslab eval``) has sent it the whole run:

- it fails to import or to build, or ``write`` raises: it gets no more events;
- it falls behind by :data:`QUEUE_SIZE` events: later ones are dropped (and
  counted) until it catches up; recorded when the run ends, with the step of the
  first event it missed (``failed``: ``to keep up``);
- it has not finished within the wait the feed was given (a worker gives it
  ``[sinks] close_wait_s`` of fslab.toml; :data:`CLOSE_WAIT` by default) when
  the run ends: the run ends anyway, and its thread is left to the
  interpreter's exit (``failed``: ``to finish``, at the event it had taken last).

``fslab export`` replays a finished run through the same sinks without a
thread (:func:`replay`): there nothing is dropped, and an error is the
command's own. ``fslab eval`` adds its new events to a sink's record of the run
where the sink can reopen it (its class's ``reopen``) and it is whole (no
failure recorded for it): :func:`add`; else it replays the whole run too. A sink
that did not take them is recorded as failed then (:func:`record_missed`): it
lacks them, so the next ``fslab eval`` sends it the whole run.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from fslab.core.errors import FslabError, exception_line
from fslab.core.files import atomic_write_json, read_json
from fslab.core.schemas import sink_failures
from fslab.core.states import LIVE
from fslab.core.text import count
from fslab.core.types import SinkRun

QUEUE_SIZE = 10_000  # events a sink may fall behind before later ones are dropped
CLOSE_WAIT = 30.0  # seconds every sink of a run together gets to finish once the run has ended (by default)
_END = object()  # the queue's last item
SINK_FAILURES = "sink_failures.json"  # runs/<id>/: the run's sinks that failed as it trained (record_failure)
_RECORDING = threading.Lock()  # two sinks of a run that fail at once: each one's record kept


def build_sink(registry, name: str, run: SinkRun, params: dict):
    """The sink ``name`` for ``run``, built with ``params``."""
    return registry.create("sink", name, context={"run": run}, **params)


def sink_named(registry, name: str) -> str | None:
    """How a line blaming the sink ``name`` names it and its plugin (:attr:`Component.named`); None where
    no plugin registers it now (its failure to start then says why)."""
    try:
        return registry.get("sink", name).named
    except FslabError:
        return None


def failures(run_path: Path) -> dict[str, dict]:
    """The run's sinks that failed as it trained and were not sent the run since: {name: its record
    (:data:`fslab.core.schemas.SINK_FAILURE`)}, {} where none did."""
    return sink_failures(read_json(Path(run_path) / SINK_FAILURES))


def record_failure(run_path: Path, name: str, failure: dict) -> None:
    """Keep ``failure`` for the sink ``name`` in the run's :data:`SINK_FAILURES` (written whole, in place of
    an earlier life's record of that sink), so ``fslab show`` says what the tracker lacks: not only the
    worker's stderr.log does. A folder that cannot take it leaves the stderr line alone to say so."""
    with _RECORDING:
        try:
            atomic_write_json(Path(run_path) / SINK_FAILURES, {**failures(run_path), name: failure})
        except OSError:
            pass


MISSED = "to take fslab eval's scores"  # the failure of a sink that lacks what fslab eval added to the run


def record_missed(run_path: Path, name: str, error: str) -> None:
    """The sink ``name`` did not take the scores ``fslab eval`` added to the run (``error`` says why):
    kept as a failure, which ``fslab show`` names, and which has the next ``fslab eval`` send it the whole
    run rather than add to a record that lacks them."""
    record_failure(run_path, name, {"failed": MISSED, "error": error, "time": time.time()})


def caught_up(run_path: Path, name: str) -> None:
    """The sink ``name`` has been sent the whole run (``fslab export``): its failure record goes (the
    file with it, where it was the last). A folder that cannot be written (a read-only copy of a store)
    keeps it: the export itself went well."""
    with _RECORDING:
        left = failures(run_path)
        if left.pop(name, None) is None:
            return
        path = Path(run_path) / SINK_FAILURES
        try:
            if left:
                atomic_write_json(path, left)
            else:
                path.unlink(missing_ok=True)
        except OSError:
            pass


def failure_line(run_id: str, name: str, failure: dict, state: str, error_room: int | None = None) -> str:
    """``fslab show``'s line for a sink that failed as the run trained: what it was doing, at which epoch and
    step, its error, and the command that sends it the whole run (once the run has ended: fslab export
    takes no live run). ``error_room``: the most characters of the error it gives (the dashboard's, in the
    lines it spares), cut with an ellipsis; None: all of it."""
    at = ", ".join(f"{key} {failure[key]}" for key in ("epoch", "step") if key in failure)
    error = failure["error"]
    if error_room is not None and len(error) > error_room:
        error = error[:max(0, error_room - 1)] + "…"
    lacks = {"to start": "it has nothing of the run", "to keep up": "it has the run without those events",
             "to finish": "it lacks what it had not written by then", MISSED: "it lacks those scores"}.get(
        failure["failed"], "it has nothing of the run after that")
    then = "once the run has ended, " if state in LIVE else ""
    return (f"sink '{name}' failed {failure['failed']}{f' at {at}' if at else ''}: {error}; {lacks}: "
            f"{then}catch it up with: fslab export {run_id} --to {name}")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _position(event: dict) -> dict:
    """The step and epoch of ``event`` where it has them (whole numbers): where a sink's record places it."""
    return {key: event[key] for key in ("step", "epoch")
            if isinstance(event.get(key), int) and not isinstance(event[key], bool)}


class _Feeder:
    """One sink's thread and queue."""

    def __init__(self, name: str, build: Callable[[], object], say: Callable[[str], None],
                 named: str | None = None, record: Callable[[str, dict], None] | None = None) -> None:
        self.name, self.say, self.record = name, say, record
        self.at: dict = {}  # the step and epoch of the last event given to the sink (replaced whole, never changed)
        self.missed_at: dict = {}  # the step and epoch of the first event dropped for it
        self.named = named or f"sink '{name}'"  # what a line blaming it says: with its plugin where known
        self.events: queue.Queue = queue.Queue(QUEUE_SIZE)
        self.failed = False
        self.dropped = 0
        self.thread = threading.Thread(target=self._work, args=(build,), name=f"fslab-sink-{name}", daemon=True)
        self.thread.start()

    def put(self, event: dict) -> None:
        if self.failed:
            return
        try:
            self.events.put_nowait(event)
        except queue.Full:
            if not self.dropped:
                self.say(f"sink '{self.name}' is falling behind: events are dropped for it until it catches up "
                         f"(the run's own files are complete)")
                self.missed_at = _position(event)
            self.dropped += 1

    def _fail(self, doing: str, exc: BaseException) -> None:
        self.failed = True
        text = exception_line(exc)
        self.say(f"{self.named} failed {doing}: {text}; the run goes on without it")
        if self.record is not None:
            self.record(self.name, {"failed": doing, "error": text, "time": time.time(), **self.at})

    def _work(self, build: Callable[[], object]) -> None:
        try:
            sink = build()
        except BaseException as exc:  # an import that fails or exits, a bad parameter: the sink is out
            self._fail("to start", exc)
            return
        while True:
            event = self.events.get()
            if event is _END:
                break
            self.at = {**self.at, **_position(event)}  # a new dict: finish() may read it from the run's thread
            try:
                sink.write(event)
            except BaseException as exc:
                kind = str(event.get("event", "?"))
                self._fail(f"on {'an' if kind[:1] in 'aeiou' else 'a'} {kind} event", exc)
                return
        try:
            sink.close()
        except BaseException as exc:
            self._fail("to close", exc)

    def finish(self, deadline: float, wait: float) -> None:
        """Ask the sink to close, and wait for it until ``deadline`` (time.monotonic, ``wait`` s after the end)."""
        while not self.failed and self.thread.is_alive():
            try:
                self.events.put(_END, timeout=max(0.0, min(0.1, deadline - time.monotonic())))
                break
            except queue.Full:
                if time.monotonic() >= deadline:
                    break
        self.thread.join(max(0.0, deadline - time.monotonic()))
        if self.dropped:
            self.say(f"sink '{self.name}' missed {count(self.dropped, 'event')} it fell behind on")
        if self.thread.is_alive():
            self.say(f"sink '{self.name}' had not finished {wait:g} s after the run ended; "
                     f"what it had not written is missing there (fslab export replays the run)")
        self._keep_what_it_lacks(wait)

    def _keep_what_it_lacks(self, wait: float) -> None:
        """A sink that did not fail but lacks events, kept as a failed one is (fslab show names the export
        that catches it up): one still writing when the wait ran out, or one that fell behind and lost events."""
        if self.record is None or self.failed:  # a failure was kept as it came, and it lacks all after it
            return
        missed = f"missed {count(self.dropped, 'event')} it fell behind on" if self.dropped else ""
        if self.thread.is_alive():
            error = f"had not finished {wait:g} s after the run ended" + (f" and {missed}" if missed else "")
            self.record(self.name, {"failed": "to finish", "error": error, "time": time.time(), **self.at})
        elif missed:
            self.record(self.name, {"failed": "to keep up", "error": missed, "time": time.time(), **self.missed_at})


class SinkFeed:
    """The sinks a live run's configuration names (``sinks = {name: params}``),
    each fed from its own thread; call it with each event, :meth:`close` once.
    ``wait``: the seconds :meth:`close` gives them (None: :data:`CLOSE_WAIT`); ``record``: a sink that
    fails is also kept in the run's folder (:func:`record_failure`; a live run's worker asks it)."""

    def __init__(self, registry, run: SinkRun, say: Callable[[str], None] = _say,
                 wait: float | None = None, record: bool = False) -> None:
        self.run, self.wait = run, wait
        kept = (lambda name, failure: record_failure(run.path, name, failure)) if record else None
        self.feeders = [
            _Feeder(name, lambda name=name, params=params: build_sink(registry, name, run, params), say,
                    sink_named(registry, name), kept)
            for name, params in run.config.get("sinks", {}).items()
        ]

    def __call__(self, event: dict) -> None:
        for feeder in self.feeders:
            feeder.put(event)

    def close(self, state: str, wait: float | None = None) -> None:
        """The run ended in ``state``: each sink sees it in ``run.state`` and is
        closed; together they get ``wait`` seconds to finish (None: the feed's
        own wait, else :data:`CLOSE_WAIT`)."""
        self.run.state = state
        if wait is None:
            wait = CLOSE_WAIT if self.wait is None else self.wait
        deadline = time.monotonic() + wait
        for feeder in self.feeders:
            feeder.finish(deadline, wait)


def replay(registry, name: str, run: SinkRun, params: dict, events: Iterable[dict]) -> int:
    """Write ``events`` (a finished run's; ``run.state`` its final state) to a
    new sink ``name``, in order, and close it; returns how many were written.
    Errors are the caller's."""
    return _written(build_sink(registry, name, run, params), run, events)


def add(registry, name: str, run: SinkRun, params: dict, events: list[dict]) -> int | None:
    """Write ``events``, which the log of the finished ``run`` ends with (``fslab eval``'s), to the record
    the sink ``name`` holds of it, reopened by its class's ``reopen(run, **params)``, and close it; returns
    how many were written. None, with nothing written, where it cannot add to it: the sink has no
    ``reopen``, it finds no record to add to, or the record lacks part of the run (a failure is recorded
    for it: :func:`failures`); the caller then replays the whole run. Errors are the caller's."""
    if name in failures(run.path):
        return None
    reopen = getattr(registry.get("sink", name).resolve(), "reopen", None)
    sink = reopen(run, **params) if callable(reopen) else None
    return None if sink is None else _written(sink, run, events)


def _written(sink, run: SinkRun, events: Iterable[dict]) -> int:
    """``events`` written to ``sink`` in order, then closed; how many were written."""
    count = 0
    try:
        for event in events:
            sink.write(event)
            count += 1
    except BaseException:  # a Ctrl-C between two writes included: the sink keeps its earlier record
        run.cut_short = True
        raise
    finally:
        sink.close()
    return count
