"""One worker per run: the worker lock, lost runs decided by it, and workers
that die before their first status write. The end-to-end tests drive real
worker processes."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from fslab.core.runstore import create_run
from fslab.core.states import LOST_AFTER_S, heartbeat_stale, run_state
from fslab.core.summary import list_summaries
from fslab.core.worklock import is_held, name_holder, take

from .runs_helpers import TINY, events, fslab, wait_for
from .test_resume import ARGS as SLOW_ARGS
from .test_resume import trajectory

HOST = socket.gethostname()


def status(run_dir):
    return json.loads((run_dir / "status.json").read_text())


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


def test_the_scheduler_does_not_start_a_run_whose_lock_is_held(tmp_path, capsys):
    from fslab.execution.scheduler import schedule
    from fslab.execution.slots import Slot

    run = create_run(tmp_path, "nca", {"method": "nca", "train": {"processes": 1}})
    fd = take(run.path)  # a live worker of this run, as far as anyone can tell
    name_holder(fd, 4242)
    try:
        assert schedule(tmp_path, [Slot("cpu-0")], poll=0.01) == 0
    finally:
        os.close(fd)
    line = capsys.readouterr().out.strip()
    assert line.endswith(f": not started: run {run.id} still has a live worker (pid 4242 on host {HOST} holds its "
                         f"lock); stop it with: fslab stop {run.id}"), line
    assert run.status()["state"] == "queued" and not run.status().get("pid")


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
    assert fslab("stop", run_dir.name, cwd=slow_project).returncode == 0
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


@pytest.mark.slow
def test_a_worker_that_dies_before_its_first_status_write_is_lost(project, monkeypatch):
    from fslab.execution import local
    from fslab.execution.handover import launch_lock

    run = create_run(project / "runs", "nca", {"method": "nca", "train": {"processes": 1}})
    run.claim()
    monkeypatch.setattr(local, "worker_command", lambda run, resume=False: [sys.executable, "-c", "exit(3)"])
    with launch_lock(run):
        process = local.start_worker(run)
    assert process.wait(10) == 3 and run.status()["pid"] == process.pid
    wait_for(lambda: run.state() == "lost", timeout=2, what="the run to be lost")

    refused = fslab("resume", run.id, cwd=project)
    assert refused.returncode == 2 and refused.stderr == (
        f"error: run {run.id} has no checkpoint (it stopped before its first epoch ended); "
        f"start it again with: fslab run nca\n")
    started = time.time()
    stop = fslab("stop", run.id, cwd=project)
    assert stop.returncode == 2 and stop.stderr == f"error: run {run.id} is lost, not running; nothing to stop\n"
    assert time.time() - started < 5


@pytest.fixture
def slow_project(project):
    import textwrap

    from .test_resume import SLOW_NCA

    (project / "mine").mkdir()
    (project / "mine" / "slow.py").write_text(textwrap.dedent(SLOW_NCA))
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    return project
