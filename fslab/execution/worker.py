"""The training worker process: ``python -m fslab.execution.worker RUN_DIR [--resume]``.

It takes the run's worker lock (:mod:`fslab.execution.handover`: a run has
one worker at a time) and holds it until it exits, marks the run ``running``
before importing anything heavy, keeps a heartbeat in ``status.json`` (and
looks for a stop request at each beat), runs :func:`fslab.training.train.train`,
and always leaves an end state: ``completed``, ``failed`` (with a one-line
error summary; the traceback goes to stderr) or ``killed`` (SIGTERM/SIGINT or
a stop request; the last checkpoint is kept).

Under torchrun (``--gpus N``) one worker runs per rank. Rank 0 holds the
lock and keeps the status, recording torchrun's pid (``fslab stop`` signals
torchrun, and rank 0 does on a stop request; torchrun forwards SIGTERM to
every rank; a rank whose torchrun is gone, even by SIGKILL, stops itself);
the other ranks only train and print their errors to the shared stderr.log.
A rank that fails leaves its one-line error in ``.rank-failed`` before it
exits; torchrun then stops rank 0 (or rank 0's next collective fails), and
rank 0 records the run ``failed`` with that line rather than ``killed`` or a
lost connection. Every rank other than 0 leaves ``.rank-N-ended`` as it exits,
however it exits on its own; one that is gone without it (a SIGKILL, as the
out-of-memory killer sends, or a crash) fails the run too, named.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

from fslab.core.errors import FslabError
from fslab.core.files import remove_orphaned_temporaries
from fslab.core.runstore import Run
from fslab.core.states import pid_alive
from fslab.core.summary import read_summary
from fslab.core.worklock import clear_stop_request, stop_requested
from fslab.execution.handover import take_worker_lock
from fslab.execution.local import TORCHRUN_MODULE, child_pids
from fslab.execution.usage import UsageSampler

RANK_FAILED = ".rank-failed"
RANK_ENDED = ".rank-{}-ended"


class Stopped(BaseException):
    """Raised in the main thread when the worker is asked to stop. A
    BaseException, as KeyboardInterrupt is, so that no ``except Exception`` on
    its way (fslab's or a library's) takes a stop for an error to get over."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StatusKeeper:
    """Owns ``status.json`` while the worker lives: one lock for the main
    thread's state changes and the heartbeat thread's rewrites. The heartbeat
    thread also looks for a stop request (``fslab stop`` from a process that
    cannot signal this one) and turns it into the SIGTERM a stop would send."""

    def __init__(self, run: Run, interval: float) -> None:
        self.run = run
        self.interval = interval
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.stop_request: dict | None = None
        self.ended: str | None = None  # the end state finish() was given, whether or not status.json took it
        self.thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self.usage = UsageSampler()

    def update(self, **fields) -> None:
        with self.lock:
            self.run.write_status(**fields)

    def start(self, resume: bool) -> None:
        now = time.time()
        times = {"resumed": now} if resume else {"started": now}
        where = {"slot": os.environ.get("FSLAB_SLOT"), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}
        under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
        self.update(state="running", pid=os.getppid() if under_torchrun else os.getpid(),
                    processes=int(os.environ.get("WORLD_SIZE", 1)), host=socket.gethostname(), heartbeat=now,
                    ended=None, exit_code=None, error=None, **where, **times)
        self.thread.start()

    def finish(self, state: str, exit_code: int, error: str | None = None) -> None:
        """Record the end state; the run's summary is brought up to date with
        it, so listings of finished runs read nothing but summary.json. Where the
        status cannot be written (the folder made read-only as the run trained), the
        end is said on stderr (stderr.log) in one line instead."""
        self.done.set()
        self.ended = state
        try:
            self.update(state=state, exit_code=exit_code, ended=time.time(), heartbeat=time.time(), error=error)
        except OSError as exc:  # the folder made read-only meanwhile: the end in one line, not a second traceback
            said = f"{state} ({error})" if error else state
            with contextlib.suppress(OSError):  # stderr.log on the same full disk
                print(f"fslab: the run ended {said}, which status.json could not record ({_one_line(exc)}); "
                      f"fslab lists the run as lost", file=sys.stderr, flush=True)
            return
        clear_stop_request(self.run.path)  # answered, or moot now that the run ended
        read_summary(self.run.path)

    def sample_usage(self) -> dict | None:
        try:
            return self.usage.sample()
        except Exception:  # /proc or a driver misbehaving must not stop the heartbeat
            return None

    def _beat(self) -> None:
        while not self.done.wait(self.interval):
            usage = self.sample_usage()
            with self.lock:
                if self.done.is_set():  # finished meanwhile: no beat after the end (the worker's os._exit would cut
                    return  # it short, leaving a completed run its half-written .status.json.PID@HOST.tmp)
                try:
                    self.run.write_status(heartbeat=time.time(), usage=usage)
                except OSError:  # a full or vanished disk: beat again next time; the lock still says alive
                    pass
            if self.stop_request is None and (request := stop_requested(self.run.path)) is not None:
                self.stop_request = request
                # torchrun passes SIGTERM on to every rank, this one included
                under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
                os.kill(os.getppid() if under_torchrun else os.getpid(), signal.SIGTERM)


_held_back: list[int] | None = None  # while a list, stop signals are noted here instead of raised


def _raise_stopped(signum, frame):
    if _held_back is not None:
        _held_back.append(signum)
        return
    raise Stopped(signum)


def import_train():
    """:func:`fslab.training.train.train`, imported with stop signals held back
    until the import is over, then raised. Importing torch runs C code that
    imports numpy and discards any exception that import raises: a stop raised
    there was lost and left numpy half-imported, and the run failed seconds
    later with an unrelated error instead of ending ``killed``."""
    global _held_back
    _held_back = []
    try:
        from fslab.training.train import train
    finally:
        held, _held_back = _held_back, None
    if held:
        raise Stopped(held[0])
    # torch's modules hold hundreds of thousands of objects that live as long as the process: frozen out of
    # the garbage collector's sight, no full collection walks them again, the one Python makes as the process
    # exits included (about 0.35 s of CPU at the end of every worker on a 2-core machine)
    gc.freeze()
    return train


_torchrun: list[int] = []  # the pid of the torchrun this rank runs under, once watched
_torchrun_gone: list[int] = []  # torchrun's pid, once this rank saw it gone without passing a stop on


def watch_torchrun() -> None:
    """Under torchrun, stop this rank (SIGTERM to itself) once torchrun is
    gone: torchrun forwards SIGTERM to the ranks but cannot forward a SIGKILL.
    torchrun waits for its ranks when it stops them, so one gone first ended
    without a word (:func:`torchrun_gone`)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    parent = os.getppid()
    _torchrun.append(parent)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        _torchrun_gone.append(parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="torchrun-watch", daemon=True).start()


def _leave_process_group() -> None:
    """After a finished run only: a stopped or failed rank just exits (leaving
    the group could wait on ranks that are already gone)."""
    if "fslab.training.distributed" in sys.modules:  # only a torchrun rank imported it
        sys.modules["fslab.training.distributed"].stop()


def follow_rank(run: Run, resume: bool, rank: int) -> int:
    """A rank other than 0: train its share, write nothing to the run store
    but the mark that it ended on its own (:func:`silent_rank_end`)."""
    signal.signal(signal.SIGTERM, _raise_stopped)
    signal.signal(signal.SIGINT, _raise_stopped)
    watch_torchrun()
    try:
        train = import_train()
        train(run, resume=resume)
        _leave_process_group()
    except Stopped as stop:
        return 128 + stop.signum
    except BaseException as exc:
        print(f"fslab: rank {rank} failed:", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        if torchrun_gone():  # a collective broken by rank 0 stopping on torchrun's end: not this rank's story
            return 1
        (run.path / RANK_FAILED).write_text(f"rank {rank} failed: {_one_line(exc)}\n")
        return 1
    finally:
        try:
            (run.path / RANK_ENDED.format(rank)).touch()
        except OSError:
            pass
    return 0


def torchrun_gone() -> str | None:
    """The run's error when the SIGTERM that stopped this rank was its own, sent on seeing torchrun gone
    (SIGKILLed, as the out-of-memory killer ends a process, or crashed): no stop was asked for, so the run
    fails rather than end ``killed`` "by SIGTERM"; None for a stop torchrun passed on. Torchrun is
    also gone when this rank is parented elsewhere before its watch saw it (a collective another
    rank broke by stopping first ends the step at once)."""
    if not _torchrun_gone and not (_torchrun and os.getppid() != _torchrun[0]):
        return None
    return (f"torchrun (pid {_torchrun[0]}), which ran the run's {os.environ.get('WORLD_SIZE', '?')} "
            f"processes, ended without a word (killed by a signal, as the out-of-memory killer kills, or crashed), "
            f"and its ranks stopped with it")


def _one_line(exc: BaseException) -> str:
    """The error as one line: fslab's own errors say it all, others are named."""
    text = str(exc) if isinstance(exc, FslabError) else f"{type(exc).__name__}: {exc}"
    return (text.strip().splitlines() or [type(exc).__name__])[0][:500]


def other_rank_failure(run: Run, wait: float = 0.0) -> str | None:
    """The error line a failed rank left, if one did, or the line for a rank
    that ended without a word (:func:`silent_rank_end`), looked for up to
    ``wait`` seconds: a rank killed in a collective breaks it a moment before
    its process is gone."""
    deadline = time.monotonic() + (wait if "TORCHELASTIC_RUN_ID" in os.environ else 0.0)
    while True:
        try:
            failure = (run.path / RANK_FAILED).read_text().strip() or silent_rank_end(run)
        except OSError:
            failure = silent_rank_end(run)
        if failure or time.monotonic() >= deadline:
            return failure
        time.sleep(0.05)


def silent_rank_end(run: Run) -> str | None:
    """Under torchrun, on rank 0: the line for a rank of this torchrun that is
    gone without having marked its end (a SIGKILL, or a crash of the process),
    after which torchrun sends rank 0 a SIGTERM that must not read as a stop.
    None where every rank lives or marked its end, or where ``/proc`` cannot tell."""
    size, parent = int(os.environ.get("WORLD_SIZE", 1)), os.getppid()
    try:
        if size < 2 or TORCHRUN_MODULE.encode() not in Path(f"/proc/{parent}/cmdline").read_bytes():
            return None
    except OSError:
        return None
    alive = set()
    for pid in child_pids(parent):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except FileNotFoundError:  # gone meanwhile
            continue
        except OSError:
            return None
        if pid_alive(pid):
            alive.update(int(v[5:]) for v in environ if v.startswith(b"RANK=") and v[5:].isdigit())
    for rank in range(1, size):
        if rank not in alive and not (run.path / RANK_ENDED.format(rank)).exists():
            return (f"rank {rank} ended without a word (killed by a signal, as the out-of-memory killer kills, "
                    f"or crashed); torchrun's line on it is in stderr.log")
    return None


def stop_on_signals() -> None:
    """SIGTERM (``fslab stop``) and SIGINT raise :class:`Stopped` in training."""
    signal.signal(signal.SIGTERM, _raise_stopped)
    signal.signal(signal.SIGINT, _raise_stopped)


def ignore_stop_signals() -> None:
    """While the end state is written: under torchrun a failing rank is soon
    followed by torchrun's SIGTERM, which must not cut the writing short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def record_stop(keeper: StatusKeeper, stop: Stopped) -> int:
    """The run ends ``killed``; further signals are ignored while that is
    written. Returns the exit code, 128 + the signal's number."""
    ignore_stop_signals()
    request = keeper.stop_request
    why = f"stopped by a stop request from host {request.get('host', '?')}" if request is not None \
        else f"stopped by {stop}"
    print(f"fslab: {why}", file=sys.stderr, flush=True)
    keeper.finish("killed", 128 + stop.signum, why)
    return 128 + stop.signum


def record_failure(keeper: StatusKeeper, exc: BaseException) -> None:
    """The traceback to stderr.log, and the run ends ``failed`` with its one-line
    summary (recorded even when stderr.log cannot be written: a full disk)."""
    ignore_stop_signals()
    try:
        traceback.print_exc()
        sys.stderr.flush()
    except OSError:
        pass
    keeper.finish("failed", 1, _one_line(exc))


def utf8_logs() -> None:
    """The run's log files are UTF-8 whatever the machine's locale, as ``fslab logs``
    reads them: under an ASCII one (``PYTHONIOENCODING=ascii``) the first evaluation's
    line (``68.33 ± 5.07%``) failed the run with a UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(encoding="utf-8", errors="backslashreplace")


def main(argv: list[str]) -> int:
    utf8_logs()
    resume = "--resume" in argv
    paths = [a for a in argv if a != "--resume"]
    if len(paths) != 1:
        print("usage: python -m fslab.execution.worker RUN_DIR [--resume]", file=sys.stderr)
        return 2
    run = Run(Path(paths[0]))
    rank = int(os.environ.get("RANK", 0))
    if rank != 0:
        return follow_rank(run, resume, rank)
    if take_worker_lock(run) is None:  # held until this process exits, however it exits
        return 1
    remove_orphaned_temporaries(run.path)  # a killed worker's half writes: the folder as an uninterrupted run's
    interval = float(run.config()["train"]["heartbeat"])
    keeper = StatusKeeper(run, interval)
    stop_on_signals()
    for name in (RANK_FAILED, *(RANK_ENDED.format(r) for r in range(1, int(os.environ.get("WORLD_SIZE", 1))))):
        (run.path / name).unlink(missing_ok=True)  # before any rank can have trained
    keeper.start(resume)
    watch_torchrun()
    opened: list = []  # the run's sink feed, once _train has opened it
    try:
        return _train(run, resume, keeper, opened)
    finally:  # the run's state is final: each sink may now close (fslab.core.sinks), told the end the worker
        for sinks in opened:  # gave, which a status.json that refused it (a full disk) would say is 'running'
            sinks.close(keeper.ended or run.status().get("state", "failed"))


def open_sinks(run: Run):
    """The feed of the sinks the run's configuration names, or None without any
    (or when even the registry cannot be read: the run goes on without them)."""
    config = run.config()
    if not config.get("sinks"):
        return None
    from fslab.core.registry import load_registry
    from fslab.core.settings import load_settings
    from fslab.core.sinks import SinkFeed, record_failure
    from fslab.core.types import SinkRun

    try:
        settings = load_settings()
        return SinkFeed(load_registry(settings.plugin_dirs),
                        SinkRun(run.id, run.path, config, sweep=run.status().get("sweep")),
                        wait=settings.sinks.close_wait_s, record=True)
    except Exception as exc:
        print(f"fslab: the run's sinks could not be started: {_one_line(exc)}; the run goes on without them",
              file=sys.stderr, flush=True)
        for name in config["sinks"]:  # each kept as a sink that failed to start is, for fslab show to name
            record_failure(run.path, name, {"failed": "to start", "error": _one_line(exc), "time": time.time()})
        return None


def _train(run: Run, resume: bool, keeper: StatusKeeper, opened: list) -> int:
    try:
        train = import_train()
        # The sinks' threads start only now that torch is imported: a sink importing torch.utils.tensorboard
        # while this thread imported torch left torch half initialised for both, and failed the run.
        sinks = open_sinks(run)
        opened += [sinks] if sinks is not None else []
        train(run, resume=resume, listeners=opened)
        _leave_process_group()
        ignore_stop_signals()  # trained and tested: a stop arriving now must not cut the end short
    except Stopped as stop:
        ignore_stop_signals()
        if failure := torchrun_gone():  # not a stop: this rank's own SIGTERM, torchrun being gone
            print(f"fslab: {failure}", file=sys.stderr, flush=True)
            keeper.finish("failed", 1, failure)
            return 1
        if failure := other_rank_failure(run):  # torchrun stopped this rank because another one failed
            keeper.finish("failed", 1, failure)
            return 1
        return record_stop(keeper, stop)
    except BaseException as exc:  # the run must record why it ended, whatever it was
        ignore_stop_signals()
        # a collective broken by a rank that stopped on seeing torchrun gone, or by the failed rank's exit
        if failure := torchrun_gone() or other_rank_failure(run, wait=2.0):
            traceback.print_exc()
            keeper.finish("failed", 1, failure)
            return 1
        record_failure(keeper, exc)
        return 1
    keeper.finish("completed", 0)
    return 0


def exit_now(code: int) -> None:
    """End the worker with ``code`` once its end is recorded: the exit handlers run (a sink's,
    coverage's) and the output is flushed, then the process ends without tearing down every
    module it imported, which after torch's was 0.2-0.5 s at the end of every run on a 2-core CPU
    (benchmarks/bench_first_run.py). A thread that is not a daemon and still runs (a sink left
    writing) gets the interpreter's own exit, which waits for it, as every worker had."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a full disk, a closed stream: nothing more to say there
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
