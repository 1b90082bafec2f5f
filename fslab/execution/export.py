"""``fslab export``: a finished run's events replayed into a sink, so runs made
before a sink was chosen can join a tracker.

The sink is the class a live run would have fed (:mod:`fslab.core.sinks`), told
that this is a replay (``SinkRun.replay``) and how the run ended
(``SinkRun.state``); each sink makes an export replace what an earlier export
or the live run wrote for that run, so exporting twice never leaves two copies.
Its parameters are, lowest first: what the run's own configuration gave that
sink, the ``[run.sinks.NAME]`` table of ``fslab.toml``, and the command's
``--set KEY=VALUE``. ``fslab eval`` sends its new events alone to a sink that
can add them to its whole record of the run (:func:`fslab.core.sinks.add`), and
the whole run to any other; one that takes none is recorded as lacking them (:func:`missed`).
It holds the run's export lock of each of them from before it appends the events until it has sent
them (:func:`sending`), and an export reads the log under that lock: an export beside it leaves the
record as one whole export does, the events in it once, whichever goes first.
"""

from __future__ import annotations

import contextlib
import errno
import sys
import time
from collections.abc import Iterable

from fslab.core import worklock
from fslab.core.errors import ConfigError, FslabError, UsageError, exception_line
from fslab.core.events import other_precision
from fslab.core.files import NAME_MAX, fitting_name
from fslab.core.flocks import one_at_a_time
from fslab.core.keys import SINKS
from fslab.core.plugin_params import sink_params
from fslab.core.runstore import Run, safe_name
from fslab.core.sinks import add, caught_up, record_missed, replay
from fslab.core.states import ENDED, LIVE, UNREADABLE, unknown_state
from fslab.core.types import SinkRun


class SinkUnavailable(UsageError):
    """The sink cannot be built at all (its package is missing): no run can be exported."""


class SinkUnreachable(FslabError):
    """The sink's server does not answer: no other run would reach it either (exit code 1)."""


class SinkCannotWrite(FslabError):
    """The sink's folder is on a read-only file system: no other run would fare better (exit code 1)."""


class SinkFailed(UsageError):
    """The sink raised while it took one run's events (a server down, a value it refuses)."""


class SinkRefused(UsageError):
    """The sink refused what it was told to write into (its own UsageError: an MLflow store copied from
    another place, whose experiment keeps its artifacts there), before taking the run's events: the same
    for every run sent there with those parameters, so ``fslab export`` says it once, with how many runs."""


def merged(*layers: dict) -> dict:
    """The layers' keys, a later layer over an earlier one."""
    out: dict = {}
    for layer in layers:
        out.update(layer)
    return out


def project_layer(settings, sink: str) -> dict:
    """The parameters ``[run.sinks.SINK]`` of ``fslab.toml`` gives ``sink`` ({} where it gives none)."""
    tables = settings.run.get(SINKS, {})
    own = tables.get(sink) if isinstance(tables, dict) else None
    return own if isinstance(own, dict) else {}


def checked_layers(registry, settings, sink: str, command: dict, given_as: dict | None = None) -> list[dict]:
    """The layers over a run's own parameters for ``sink``: ``[run.sinks.SINK]``
    of ``fslab.toml``, then ``command`` (``--set``), checked together before any
    run is touched. A value of fslab.toml's that cannot be used is a ConfigError
    naming the file and its table, not the run's configuration; one of the command's
    names the option as given (``given_as``: each parameter's key as the command wrote it,
    ``--set bogus``, not ``sinks.tensorboard.bogus``)."""
    layers = [project_layer(settings, sink), command]
    try:
        sink_params(registry, sink, merged(*layers))
    except ConfigError as exc:
        try:
            sink_params(registry, sink, command)  # the command's own fault: its own line
        except ConfigError as own:
            said = str(own)
            for param, key in (given_as or {}).items():
                said = said.replace(f"config key '{SINKS}.{sink}.{param}'", f"--set {key}", 1)
                said = said.replace(f"'{SINKS}.{sink}.{param}'", f"--set {key}", 1)
            raise ConfigError(said) from None
        raise ConfigError(f"{settings.path or 'fslab.toml'}: [run.{SINKS}.{sink}]: {exc}") from None
    return layers


def export_run(registry, run: Run, sink: str, layers: list[dict], added: list[dict] | None = None, *,
               held: bool = False) -> dict:
    """Replay ``run`` into ``sink``; returns what was exported. ``added``: the new events ``fslab eval``
    logged, sent alone where the sink can add them to its whole record of the run (the whole run replayed
    where it cannot), and what was exported then says whether they were (``added``). The run's log is read
    holding the run's export lock for the sink (:func:`exporting`; ``held``: the caller holds it already,
    :func:`sending`), so a log read is never exported after newer events were added. A run still
    queued or running, one whose status or configuration cannot be read (an
    unreadable status cannot tell whether the run ended, nor how) and one that
    logged no event are a UsageError (one line), and the sink is not touched;
    so is an error of the sink's own. A sink whose package is missing is a
    :class:`SinkUnavailable`, which no other run would escape either; so is a
    server that does not answer, :class:`SinkUnreachable`."""
    if not run.path.is_dir():  # named by its sweep's record, deleted since: fslab show would find no run
        raise UsageError(f"{run.id}: its folder is gone from the store, though its sweep's record names it; "
                         f"nothing to export")
    status = run.status()
    state = run.state(status)
    if state not in LIVE and _wait_for_its_worker(run):  # its end recorded, its live sinks still closing
        status = run.status()
        state = run.state(status)
    if state in LIVE:
        raise UsageError(f"{run.id} is {state}: export it once it has ended")
    if state == UNREADABLE and (unknown := unknown_state(status)):  # a newer fslab's: its sinks may export it
        raise UsageError(f"{run.id}: its {unknown}; how it ended cannot be told, so nothing to export: put back a "
                         f"status.json this fslab writes, or export it with the fslab that wrote it")
    if state == UNREADABLE:  # it may still be running, and how it ended is the tracker's status: unknown
        raise UsageError(f"{run.id}: status.json is missing or unreadable, so whether and how it ended "
                         f"cannot be told; nothing to export (fslab show {run.id} says why)")
    try:
        config = run.config()  # migrated; {} when config.json is missing or not JSON
    except ConfigError as exc:
        raise UsageError(f"{run.id}: its configuration cannot be read ({exc})") from None
    if not config:
        raise UsageError(f"{run.id}: config.json is missing or unreadable; nothing to export")
    own = config.get(SINKS, {}).get(sink, {})
    try:  # fslab.toml's and the command's layers were checked before any run: what fails is the run's own
        params = sink_params(registry, sink, merged(own if isinstance(own, dict) else {}, *layers))
    except ConfigError as exc:
        raise UsageError(f"{run.id}: the parameters its configuration gives sink '{sink}' cannot be used "
                         f"({exc}); nothing to export (fslab export's --set KEY=VALUE gives a parameter over the "
                         f"run's)") from None
    target = SinkRun(run.id, run.path, config, sweep=status.get("sweep"), replay=True, state=state)
    with contextlib.nullcontext() if held else exporting(run, sink):
        events = run.events()  # read under the lock: fslab eval appends its scores holding it (sending)
        if not events:
            raise UsageError(f"{run.id} ({state}) logged no event; nothing to export")
        count, whole = _send(registry, run, sink, target, params, events, added)
    done = {"run": run.id, "sink": sink, "state": state, "events": count}  # fslab export --json's record
    return done if added is None else {**done, "added": not whole}


def _send(registry, run: Run, sink: str, target: SinkRun, params: dict, events: list[dict],
          added: list[dict] | None) -> tuple[int, bool]:
    """``added`` (None: none) added to the sink's record of the run where it can add them, else the whole
    run's ``events`` replayed into it; how many events it was sent, and whether they were the whole run.
    The sink's errors as :func:`export_run` says them. Called holding the run's export lock for the sink."""
    try:
        # a lost run's worker died with its sinks unclosed: their records may lack its last events
        count = None if added is None or target.state not in ENDED else add(
            registry, sink, target, params, sent(added))
        if count is not None:
            return count, False
        count = replay(registry, sink, target, params, sent(events))
        caught_up(run.path, sink)  # sent the whole run: what it missed as the run trained is there now
        return count, True
    except ImportError as exc:
        raise SinkUnavailable(" ".join(str(exc).split())) from None
    except UsageError as exc:  # the sink refuses its store or parameters, in its own words: what to change
        raise _because(SinkRefused(f"sink '{sink}' refused: {exc}"), str(exc)) from None
    except ConnectionError as exc:  # its server is down or unreachable: so for every run
        reason = " ".join(str(exc).split())[:300]
        raise _because(SinkUnreachable(f"sink '{sink}' failed: {reason}"), reason) from None
    except Exception as exc:  # the tracker's own error (a server down, a store it refuses): this run's line
        if isinstance(exc, OSError) and exc.errno == errno.EROFS:
            raise SinkCannotWrite(read_only(registry, sink, exc)) from None
        if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM):  # another user's store
            text = not_allowed(registry, sink, exc)
            raise _because(SinkFailed(f"{run.id}: {text}"), text) from None
        text = exception_line(exc)
        raise _because(SinkFailed(f"{run.id}: {registry.get('sink', sink).named} failed: {text}"), text) from None


def _because(error: FslabError, reason: str) -> FslabError:
    """``error``, which also keeps the sink's own error as its ``reason`` (the line names the run and
    the sink around it): what the run's sink_failures.json records of it (:func:`missed`)."""
    error.reason = reason
    return error


def sent(events: list[dict]) -> list[dict]:
    """The events a sink is sent: scores of the network run in another precision than the run's (fslab eval
    --precision) would replace its own under the same metric in the tracker, so they stay in the run's folder."""
    return [e for e in events if not other_precision(e)]


def missed(run: Run, sink: str, added: list[dict], error: Exception | str) -> None:
    """``sink`` did not take ``fslab eval``'s new events ``added`` (``error``: why; an exception raised
    by :func:`export_run` is recorded by the sink's own error, its ``reason``): recorded as lacking them
    (:func:`fslab.core.sinks.record_missed`) where any would have been sent, so that the next ``fslab eval``
    replays the whole run into it and ``fslab show`` names the export that catches it up."""
    if sent(added) and run.path.is_dir():
        record_missed(run.path, sink, error if isinstance(error, str) else getattr(error, "reason", str(error)))


def _wait_for_its_worker(run: Run, poll: float = 0.05) -> bool:
    """Wait while the worker of ``run``, whose end its status already records, still lives: it is
    closing the run's own sinks (up to ``[sinks] close_wait_s``), and an export replacing their record
    meanwhile would mix the two. Says so once on stderr; whether it waited. A run resumed meanwhile (its
    status live again) ends the wait: the caller finds it live."""
    said = False
    while worklock.is_held(run.path) is True and run.state() not in LIVE:
        if not said:
            print(f"{run.id}: waiting for its worker ({worklock.describe_holder(run.path)}) to finish closing "
                  f"its sinks before exporting it", file=sys.stderr, flush=True)
            said = True
        time.sleep(poll)
    return said


@contextlib.contextmanager
def exporting(run: Run, sink: str):
    """Held while ``run`` is replayed into ``sink``: a second export of the same run to the same
    sink at the same time (another ``fslab export``, or ``fslab eval`` sending new scores) waits,
    saying so, and then replaces the first one's record, rather than both clearing the sink's
    folder and writing into it at once (two copies, or one cut short). The lock file,
    ``runs/<id>/.export-SINK.lock``, goes when it is let go; where none can be had (a read-only
    copy of a store, no ``flock``) the run is exported without one, as before."""
    # a plugin's sink may be named team/board, or past a file name's 255 bytes
    path = run.path / f".export-{fitting_name(safe_name(sink), NAME_MAX - len('.export-.lock'))}.lock"
    with one_at_a_time(path, lambda pid: f"{run.id}: waiting for the export{pid} that is sending it to sink "
                                         f"'{sink}', so that its record there is replaced once, not mixed"):
        yield


@contextlib.contextmanager
def sending(run: Run, sinks: Iterable[str]):
    """Held by ``fslab eval`` from before it appends its new scores to ``run``'s ``metrics.jsonl`` until
    each of ``sinks`` was sent them (:func:`export_run` with ``held``): the run's export lock of each
    (:func:`exporting`), taken in the order of their names, as a second ``fslab eval`` of the run takes
    them. An export of the run to one of them meanwhile waits, saying so, and then reads the log with the
    scores and replaces the record with the whole run: never between the append and the addition, which
    sent the scores twice (exported whole, then added again)."""
    with contextlib.ExitStack() as held:
        for sink in sorted(set(sinks)):
            held.enter_context(exporting(run, sink))
        yield


def read_only(registry, sink: str, exc: OSError) -> str:
    """One line for a sink refused by a read-only file system, naming the
    parameters that choose where it writes."""
    return (f"sink '{sink}' cannot write{_where(exc)}: the file system is read-only, so no other run was tried; "
            f"point it at a folder this machine can write with --set KEY=VALUE (its parameters: "
            f"{_params(registry, sink)})")


def not_allowed(registry, sink: str, exc: OSError) -> str:
    """A run's line for a sink refused a file by its permissions (a store unpacked read-only, another user's
    run folders; others of the store may be this user's, so the export goes on), naming the parameters that
    choose where it writes, where the line said PermissionError: [Errno 13] Permission denied: '...'."""
    return (f"sink '{sink}' cannot write{_where(exc)}: this user may not write there; point it at a folder this "
            f"user can write with --set KEY=VALUE (its parameters: {_params(registry, sink)})")


def _where(exc: OSError) -> str:
    return f" {exc.filename}" if exc.filename else ""


def _params(registry, sink: str) -> str:
    return ", ".join(registry.get("sink", sink).params) or "none"
