"""One worker per run: the worker lock, lost runs decided by it, stops that
signal only the run's own worker, and workers that die before their first
status write. The end-to-end tests drive real worker processes."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from fslab.core.files import atomic_write_json
from fslab.core.runstore import Run, create_run
from fslab.core.states import LOST_AFTER_S, heartbeat_stale, pid_alive, run_state
from fslab.core.summary import list_summaries
from fslab.core.worklock import STOP_REQUEST, is_held, name_holder, take

from .runs_helpers import LONG, TINY, events, fslab, fslab_here, wait_for
from .test_resume import ARGS as SLOW_ARGS
from .test_resume import trajectory

HOST = socket.gethostname()


def status(run_dir):
    return json.loads((run_dir / "status.json").read_text())


def sleeper(*argv):
    """A live process of this host that is not a worker (unless argv says it runs one)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *argv])


def finish(process):
    if process.poll() is None:
        process.kill()
    process.wait()


# -- the lock and the state --------------------------------------------------------------


def test_a_held_lock_keeps_a_run_running_and_a_free_one_makes_it_lost_at_once(tmp_path):
    run = create_run(tmp_path, "nca", {})
    now = time.time()
    run.write_status(state="running", pid=os.getpid(), host=HOST, heartbeat=now)
    assert is_held(run.path) is None and run.state() == "running"  # no lock file: pid and heartbeat decide
    fd = take(run.path)
    try:
        assert is_held(run.path) is True
        assert run.state(now=now + 10 * LOST_AFTER_S) == "running"  # paused: no heartbeat, but alive
    finally:
        os.close(fd)
    # the lock is free on this host while the status says running: the worker is gone, whatever its pid
    assert is_held(run.path) is False and run.state() == "lost"
    run.write_status(host="another-host")  # another host's lock may be invisible here: the heartbeat decides
    assert run.state(now=now + 1) == "running" and run.state(now=now + LOST_AFTER_S + 1) == "lost"


def test_run_state_is_a_function_of_what_the_caller_read():
    now = time.time()
    running = {"state": "running", "pid": 2**22 + 7, "host": "elsewhere", "heartbeat": now - 10 * LOST_AFTER_S}
    assert run_state(running, now, locked=True) == "running"
    assert run_state(running, now, locked=None) == "lost"
    assert run_state({"state": "queued"}, now + 10**6, locked=False) == "queued"  # waits for a slot
    assert run_state({**running, "state": "completed"}, now, locked=True) == "completed"
    assert heartbeat_stale(running, 0.2, now) and not heartbeat_stale({**running, "heartbeat": now}, 0.2, now)


def test_a_listing_probes_the_lock_of_live_runs_only(tmp_path, monkeypatch):
    import fslab.core.worklock as worklock

    for _ in range(40):
        create_run(tmp_path, "nca", {"method": "nca"}).write_status(state="completed", ended=time.time())
    live = create_run(tmp_path, "nca", {"method": "nca"})
    live.write_status(state="running", pid=os.getpid(), host=HOST, heartbeat=time.time())
    probed = []
    real = worklock.is_held
    monkeypatch.setattr(worklock, "is_held", lambda run_dir: probed.append(os.path.basename(run_dir)) or real(run_dir))
    summaries = list_summaries(tmp_path, limit=None)
    assert len(summaries) == 41 and probed == [live.id]


def nca_config(registry) -> dict:
    from fslab.core.config import resolve
    from fslab.core.settings import Settings

    return resolve("nca", registry=registry, settings=Settings())


def test_the_scheduler_does_not_start_a_run_whose_lock_is_held(tmp_path, capsys, registry):
    from fslab.execution.scheduler import schedule
    from fslab.execution.slots import Slot

    run = create_run(tmp_path, "nca", nca_config(registry))
    fd = take(run.path)  # a live worker of this run, as far as anyone can tell
    name_holder(fd)  # its own line, as a worker writes it (one naming another process is no holder's)
    try:
        assert schedule(tmp_path, [Slot("cpu-0")], poll=0.01) == 0
    finally:
        os.close(fd)
    line = capsys.readouterr().out.strip()
    assert line.endswith(f": not started: run {run.id} still has a live worker (pid {os.getpid()} on host {HOST} "
                         f"holds its lock); stop it with: fslab stop {run.id}"), line
    assert run.status()["state"] == "queued" and not run.status().get("pid")


def test_a_queued_run_the_scheduler_cannot_read_fails_and_never_holds_up_the_queue(tmp_path, capsys, registry):
    """Damaged queued runs ahead in the queue are failed with why (a traceback
    before, and a scheduler polling for ever on train.processes = 0); a run of
    a newer fslab stays queued for it; the run behind them is reached."""
    from fslab.core.config import CONFIG_VERSION
    from fslab.execution.scheduler import schedule
    from fslab.execution.slots import Slot

    config = nca_config(registry)
    not_an_object = create_run(tmp_path, "nca", config)
    atomic_write_json(not_an_object.path / "config.json", [])
    no_train = create_run(tmp_path, "nca", {k: v for k, v in config.items() if k != "train"})
    no_processes = create_run(tmp_path, "nca", {**config, "train": {**config["train"], "processes": 0}})
    newer = create_run(tmp_path, "nca", {**config, "config_version": CONFIG_VERSION + 1})
    behind = create_run(tmp_path, "nca", config)
    fd = take(behind.path)  # held: the scheduler reaches it and says so, without starting a worker
    name_holder(fd, 4242)
    try:
        assert schedule(tmp_path, [Slot("cpu-0")], poll=0.01) == 0
    finally:
        os.close(fd)
    log = capsys.readouterr().out
    for run, why in [(not_an_object, "config.json is missing or not a JSON object"),
                     (no_train, "the configuration has no 'train'"),
                     (no_processes, "train.processes must be at least 1, got 0")]:
        state = run.status()
        assert state["state"] == "failed" and state["error"].startswith(f"not started: run {run.id}: "), state
        assert why in state["error"] and state["error"] in log, (why, state["error"])
    assert newer.status()["state"] == "queued" and "was written by a newer fslab" in log
    assert f"run {behind.id} still has a live worker" in log


def test_the_scheduler_passes_over_a_slot_it_cannot_open_and_ends_when_none_is_left(tmp_path, capsys, registry):
    """A slot's lock file replaced by a folder crashed the background scheduler; now the other slots go
    on, and a scheduler with no usable slot ends instead of polling for ever."""
    from fslab.execution.scheduler import schedule
    from fslab.execution.slots import Slot

    (tmp_path / ".slots" / "cpu-0.lock").mkdir(parents=True)
    run = create_run(tmp_path, "nca", nca_config(registry))
    fd = take(run.path)  # held: the scheduler reaches it through cpu-1 and says so, without starting a worker
    name_holder(fd, 4242)
    try:
        assert schedule(tmp_path, [Slot("cpu-0"), Slot("cpu-1")], poll=0.01) == 0
    finally:
        os.close(fd)
    log = capsys.readouterr().out
    assert log.count("slot cpu-0 not used: ") == 1 and "cpu-0.lock cannot be opened" in log
    assert f"run {run.id} still has a live worker" in log
    assert schedule(tmp_path, [Slot("cpu-0")], poll=0.01) == 0
    assert "no slot can be used" in capsys.readouterr().out
    assert run.status()["state"] == "queued"


def test_a_stop_signals_only_this_runs_worker(tmp_path):
    from fslab.execution.local import is_worker_of

    run = create_run(tmp_path, "nca", {})
    other = create_run(tmp_path, "nca", {})
    plain, stand_in = sleeper(), sleeper("-m", "fslab.execution.worker", str(run.path))
    try:
        wait_for(lambda: os.path.exists(f"/proc/{stand_in.pid}/cmdline")
                 and b"fslab.execution.worker" in open(f"/proc/{stand_in.pid}/cmdline", "rb").read(),
                 what="the stand-in to start")
        assert is_worker_of(stand_in.pid, run) and not is_worker_of(stand_in.pid, other)
        assert not is_worker_of(plain.pid, run)
    finally:
        finish(plain)
        finish(stand_in)


# -- real workers --------------------------------------------------------------------------


def start_detached(project, *args):
    result = fslab("run", "nca", *TINY, *args, "--detach", cwd=project)
    assert result.returncode == 0, result.stderr
    return project / "runs" / result.stdout.strip()


@pytest.mark.slow
def test_two_simultaneous_resumes_start_exactly_one_worker(slow_project):
    reference = start_detached(slow_project, *SLOW_ARGS[len(TINY):])
    run_dir = start_detached(slow_project, *SLOW_ARGS[len(TINY):])
    wait_for(lambda: [e for e in events(run_dir, "train") if e["epoch"] == 2], what="epoch 2 to start")
    assert fslab_here("stop", run_dir.name, cwd=slow_project).returncode == 0
    resumes = [subprocess.Popen([sys.executable, "-m", "fslab", "resume", run_dir.name, "--detach"], cwd=slow_project,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outcomes = sorted((p.wait(60), *p.communicate()) for p in resumes)
    (ok, out, _), (refused, _, err) = outcomes
    assert ok == 0 and out.strip() == run_dir.name
    assert refused == 2 and err.count("\n") == 1, err  # one line, no traceback
    assert err.startswith(f"error: run {run_dir.name} still has a live worker (pid "), err
    assert err.rstrip().endswith(f"; stop it with: fslab stop {run_dir.name}"), err

    for folder in (run_dir, reference):
        wait_for(lambda folder=folder: status(folder)["state"] == "completed", what="both runs to complete")
    assert len(events(run_dir, "resume")) == 1  # one worker resumed the run
    train, evals = trajectory(run_dir)
    assert [t[0] for t in train] == list(range(1, len(train) + 1))
    assert (train, evals) == trajectory(reference)
    assert not (run_dir / STOP_REQUEST).exists()


@pytest.mark.slow
def test_a_paused_worker_is_running_cannot_be_resumed_and_stops(project):
    run_dir = start_detached(project, "--epochs", LONG)
    wait_for(lambda: events(run_dir, "checkpoint"), what="the first checkpoint")
    pid = status(run_dir)["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        refused = fslab_here("resume", run_dir.name, cwd=project)
        assert refused.returncode == 2
        assert refused.stderr == (f"error: run {run_dir.name} still has a live worker (pid {pid} on host {HOST} "
                                  f"holds its lock); stop it with: fslab stop {run_dir.name}\n")
        # paused for ever, as far as the heartbeat goes: still running, since it holds its lock
        assert Run(run_dir).state(now=time.time() + 10 * LOST_AFTER_S) == "running"
        shown = wait_for(lambda: (out := fslab_here("show", run_dir.name, cwd=project).stdout)
                         and "heartbeat stale" in out and out, what="a stale heartbeat")
        assert f"{run_dir.name}  running" in shown and "still holds the run's lock" in shown

        # continued by the stop, it ends by its SIGTERM (below), not by the SIGKILL after the 30 s grace
        stopped = fslab_here("stop", run_dir.name, cwd=project)
        assert stopped.returncode == 0 and stopped.stdout.strip() == f"{run_dir.name}: killed", stopped.stderr
        assert "did not stop within the grace period" not in stopped.stderr
    finally:
        os.kill(pid, signal.SIGCONT)
    final = status(run_dir)
    assert final["state"] == "killed" and final["exit_code"] == 128 + signal.SIGTERM
    assert final["error"] == "stopped by SIGTERM" and (run_dir / "checkpoints" / "last.pt").exists()


def _pretend_another_host(run_dir, pid):
    """Rewrite the status as if the run were another host's, with ``pid``. The edit is a
    status write of the run store's, under the lock each of the worker's heartbeat rewrites
    takes for its read and merge, so no heartbeat that read the file before the edit can
    write it back over it: it stays from its write on. (A plain rewrite did, and a check
    half a second later that no heartbeat had undone it could be passed on a loaded machine
    whose worker had not beaten yet, and then be undone.)"""
    Run(run_dir).write_status(host="another-host", pid=pid)
    current = status(run_dir)
    assert (current["host"], current["pid"], current["state"]) == ("another-host", pid, "running")


@pytest.mark.slow
def test_a_run_of_another_host_is_stopped_by_request_never_by_signal(project):
    run_dir = start_detached(project, "--epochs", LONG)
    wait_for(lambda: events(run_dir, "checkpoint"), what="the first checkpoint")
    worker_pid = status(run_dir)["pid"]
    bystander = subprocess.Popen(["sleep", "120"])  # an unrelated local process with the status's pid
    try:
        _pretend_another_host(run_dir, bystander.pid)
        rows = [json.loads(line) for line in fslab_here("runs", "--json", cwd=project).stdout.splitlines()]
        assert [r["state"] for r in rows] == ["running"]  # its worker holds the lock
        stopped = fslab_here("stop", run_dir.name, cwd=project)
        assert stopped.returncode == 0 and stopped.stdout.strip() == f"{run_dir.name}: killed", stopped.stderr
        assert bystander.poll() is None  # not signalled
        wait_for(lambda: not pid_alive(worker_pid), what="the worker to exit")
    finally:
        finish(bystander)
    final = status(run_dir)
    assert final["state"] == "killed" and final["exit_code"] == 128 + signal.SIGTERM
    assert final["error"] == f"stopped by a stop request from host {HOST}"
    assert (run_dir / "checkpoints" / "last.pt").exists() and not (run_dir / STOP_REQUEST).exists()


def _copied_from_another_host(project, beat_age: float, beat_every: float = 5.0):
    """A run copied (rsync -a, times kept) from host gpu-node-7 while it trained: running there, its last
    heartbeat ``beat_age`` seconds before now; no worker of it writes into this folder."""
    run = create_run(project / "runs", "nca", {"method": "nca", "train": {"processes": 1, "heartbeat": beat_every}})
    beat = time.time() - beat_age
    run.write_status(state="running", pid=4242, host="gpu-node-7", heartbeat=beat, started=beat - 60)
    os.utime(run.path / "status.json", (beat, beat))
    return run


def test_a_run_copied_from_another_host_while_it_trained_is_not_stoppable_here_said_at_once(project):
    """fslab stop of it left a stop request no worker would read, waited its 30 s grace, then said (exit code
    1) that the worker had not stopped. Its heartbeat, older than three beats, says so at once: one line
    naming the host to stop it on, exit code 2, nothing left in the folder."""
    run = _copied_from_another_host(project, beat_age=60)
    before = (run.path / "status.json").read_bytes()
    started = time.monotonic()
    done = fslab_here("stop", run.id, cwd=project)
    assert time.monotonic() - started < 10, "it waited"
    assert (done.returncode, done.stdout) == (2, "") and done.stderr == (
        f"error: run {run.id} cannot be stopped from here: its worker (pid 4242 on host gpu-node-7) runs on another "
        f"host and has written no heartbeat into this folder for {done.stderr.split(' for ')[1][:2]} s (a copy of "
        f"the run's folder made while it trained, or a worker paused there), so it would never read a stop "
        f"request; stop it on host gpu-node-7: fslab stop {run.id}\n"), done.stderr
    assert done.stderr.split(" for ")[1][:5] in ("60 s ", "61 s ", "62 s ")  # its heartbeat's age
    assert not (run.path / STOP_REQUEST).exists() and (run.path / "status.json").read_bytes() == before
    (project / "runs" / "sweeps").mkdir()  # stopped by its sweep: the same line, where it said nothing to stop
    (project / "runs" / "sweeps" / "sweep-20200101-000000.json").write_text(
        json.dumps({"id": "sweep-20200101-000000", "runs": [run.id]}))
    swept = fslab_here("stop", "sweep-20200101-000000", cwd=project)
    assert (swept.returncode, swept.stdout) == (2, "") and swept.stderr.startswith(
        f"error: run {run.id} cannot be stopped from here: ") and len(swept.stderr.splitlines()) == 1, swept.stderr


def test_a_run_copied_just_after_a_heartbeat_is_said_not_stoppable_once_three_beats_pass(project):
    """Copied a second after its last heartbeat: a worker sharing the folder would beat again within three
    beats (here 0.2 s each: 1 s at least) and read the stop request; none did, so the stop says so then, and
    takes its request back, rather than wait its whole grace. A worker of another host on a shared store (its
    lock not visible here) that beats into the folder is still stopped by the request, as before."""
    import threading

    from fslab.core.errors import UsageError
    from fslab.core.worklock import stop_requested
    from fslab.execution.executor import stop as stop_run

    run = _copied_from_another_host(project, beat_age=0.0, beat_every=0.2)
    beat = run.status()["heartbeat"]
    with pytest.raises(UsageError, match=f"^run {run.id} cannot be stopped from here: its worker .* stop it on "
                                         f"host gpu-node-7: fslab stop {run.id}$"):
        stop_run(run, grace=20)
    assert 0.95 < time.time() - beat < 10 and not (run.path / STOP_REQUEST).exists()  # three beats, not the grace

    run = _copied_from_another_host(project, beat_age=0.0, beat_every=0.2)
    done = threading.Event()

    def worker():  # another host's worker, as the folder sees it: its heartbeat, then its stop
        while not done.is_set():
            time.sleep(0.2)
            if stop_requested(run.path) is not None:
                run.write_status(state="killed", ended=time.time(), error="stopped by a stop request")
                return
            run.write_status(heartbeat=time.time())

    beating = threading.Thread(target=worker)
    beating.start()
    try:
        assert stop_run(run, grace=20) == "killed"
    finally:
        done.set()
        beating.join()


@pytest.mark.slow
def test_a_worker_that_dies_before_its_first_status_write_is_lost(project, monkeypatch):
    from fslab.execution import local
    from fslab.execution.handover import launch_lock

    run = create_run(project / "runs", "nca", {"method": "nca", "train": {"processes": 1}})
    run.claim()
    monkeypatch.setattr(local, "worker_command", lambda run, resume=False: [sys.executable, "-c", "exit(3)"])
    with launch_lock(run):
        process = local.start_worker(run)
    assert process.wait(60) == 3 and run.status()["pid"] == process.pid
    wait_for(lambda: run.state() == "lost", what="the run to be lost")

    refused = fslab_here("resume", run.id, cwd=project)
    assert refused.returncode == 2 and refused.stderr == (
        f"error: run {run.id} has no checkpoint (it stopped before it started); "  # its worker died at once
        f"start it again with the same settings: fslab run --like {run.id}\n")
    stop = fslab_here("stop", run.id, cwd=project)
    assert stop.returncode == 2 and stop.stderr == f"error: run {run.id} is lost, not running; nothing to stop\n"

    def no_waiting(seconds):  # the stop of a lost run says so at once: it waits for no worker, lock or grace
        raise AssertionError(f"fslab stop of a lost run waited ({seconds} s)")

    from fslab.core.errors import UsageError
    from fslab.execution.executor import stop as stop_run

    monkeypatch.setattr(time, "sleep", no_waiting)
    with pytest.raises(UsageError, match=f"^run {run.id} is lost, not running; nothing to stop$"):
        stop_run(run)


@pytest.fixture
def slow_project(project):
    import textwrap

    from .test_resume import SLOW_NCA

    (project / "mine").mkdir()
    (project / "mine" / "slow.py").write_text(textwrap.dedent(SLOW_NCA))
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    return project


def test_a_stop_while_a_resume_starts_the_worker_stops_the_resumed_run(tmp_path):
    """A launcher holds the worker lock from its check of the run's state to its record of the worker
    it started (seconds, for a SLURM submission); a stop in between read the state of before, said
    'run ... is killed, not running; nothing to stop', and the resumed run trained on."""
    import threading

    from fslab.execution import executor
    from fslab.execution.local import WORKER_MODULE

    run = create_run(tmp_path / "runs", "nca", {"method": "nca", "train": {"processes": 1}})
    run.write_status(state="killed", ended=time.time(), error="stopped by SIGTERM")
    launcher = take(run.path)  # fslab resume, about to record the worker it started
    worker = sleeper("-m", WORKER_MODULE, str(run.path))  # its command line: this run's worker

    def record():
        time.sleep(0.5)
        run.write_status(state="queued", pid=worker.pid, host=HOST, heartbeat=time.time(), ended=None, error=None)
        os.close(launcher)

    recorder = threading.Thread(target=record)
    recorder.start()
    try:
        assert executor.stop(run, grace=10) == "killed"
    finally:
        recorder.join()
        finish(worker)
    assert worker.returncode == -signal.SIGTERM  # the started worker was signalled, not left to train
    assert status(run.path)["state"] == "killed"


@pytest.mark.parametrize(("visible", "gpus"), [("0,2", [0, 2]), (" 1 , 3", [1, 3]), ("", []), ("0,2,x,3", [0, 2]),
                                                ("²", []), ("1,²", [1]), ("GPU-5d3e", []), ("٣", [])])
def test_the_gpus_cuda_visible_devices_lists_are_read_up_to_its_first_entry_that_is_no_index(monkeypatch, visible,
                                                                                              gpus):
    """CUDA takes CUDA_VISIBLE_DEVICES up to its first entry that is not an index; '²', which str.isdigit() takes
    and int() refuses, raised ValueError out of every sweep's scheduler, and '0,2,x,3' read as four GPUs."""
    from fslab.execution.slots import visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert visible_gpus() == gpus
