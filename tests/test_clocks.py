"""Clocks at the edges of the run store (fslab.core.clocks): hosts that share a runs folder with
clocks minutes apart, and clocks that jump. Times are faked by writing files with chosen
modification times and by moving this process's time of day; nothing sleeps."""

import json
import os
import time

import pytest

from fslab.core import files
from fslab.core.runstore import create_run
from fslab.core.summary import RunSummary, add_event, eta
from tests.runs_helpers import fslab_here


def _another_hosts_run(project, beat: float, written: float):
    """A run running on node-b, whose last heartbeat reads ``beat`` on node-b's clock and whose
    status.json the filesystem stamped ``written``."""
    run = create_run(project / "runs", "nca", {"method": "nca", "train": {"heartbeat": 5.0}})
    run.write_status(state="running", host="node-b", pid=4242, started=beat - 60, heartbeat=beat)
    os.utime(run.path / "status.json", (written, written))
    return run


def _states(project) -> dict:
    listed = fslab_here("runs", "--json", cwd=project)
    assert listed.returncode == 0, listed.stderr
    return {row["id"]: row["state"] for row in map(json.loads, listed.stdout.splitlines())}


@pytest.mark.parametrize("store_ahead", [0.0, 600.0])
def test_another_hosts_run_is_live_while_the_store_sees_its_status_written(project, monkeypatch, store_ahead):
    """Its heartbeat, written on its host's clock, was compared with this host's: a run on a host whose
    clock is 10 minutes behind was lost while it trained (fslab resume would train it twice), and a
    run whose host is 10 minutes ahead stayed running 5 minutes after its worker died. The
    filesystem's own clock decides (an NFS server's, here 10 minutes ahead of both where
    ``store_ahead``): how long it has kept the status unwritten."""
    if store_ahead:
        real = files._stamp_of_new_file
        monkeypatch.setattr(files, "_stamp_of_new_file", lambda folder: real(folder) + store_ahead)
    now = time.time()
    behind = _another_hosts_run(project, beat=now - 600, written=now + store_ahead)  # beating now
    ahead = _another_hosts_run(project, beat=now + 600, written=now - 300 + store_ahead)  # silent 5 minutes
    assert _states(project) == {behind.id: "running", ahead.id: "lost"}
    shown = json.loads(fslab_here("show", behind.id, "--json", cwd=project).stdout)
    assert shown["state"] == "running" and shown["heartbeat_stale"] is False  # not 600 s stale either
    assert not [p for p in (project / "runs").iterdir() if p.name.startswith(".")]  # the clock's probe is gone


def test_another_hosts_run_stays_live_when_this_hosts_clock_jumps_ahead(project, monkeypatch):
    """This host's clock stepped an hour ahead (NTP, a VM restored): another host's run that beats
    still was lost at once."""
    now = time.time()
    run = _another_hosts_run(project, beat=now, written=now)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    assert _states(project) == {run.id: "running"}


def test_another_hosts_run_with_a_stale_heartbeat_says_its_age_on_the_store_clock(project):
    """fslab show's stale heartbeat of a run whose host is 10 minutes behind said 630 s, not 30."""
    now = time.time()
    run = _another_hosts_run(project, beat=now - 630, written=now - 30)
    shown = fslab_here("show", run.id, cwd=project)
    assert shown.returncode == 0, shown.stderr
    assert "heartbeat stale: the last one was 30 s ago (the run is lost after 120 s without one)" in shown.stdout


def test_another_hosts_temporary_file_is_not_taken_for_a_day_old_when_this_clock_is_a_day_ahead(tmp_path,
                                                                                             monkeypatch):
    """A node's half-written checkpoint in a shared store was removed as untouched for 24 hours when this
    host's clock ran a day ahead: the file's age is told on the filesystem's clock, which stamped it."""
    being_written = tmp_path / ".last.pt.4242@node-b.tmp"
    being_written.write_bytes(b"half")
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 2 * 24 * 3600)
    files.remove_orphaned_temporaries(tmp_path)
    assert being_written.exists()
    day_old = real() - 25 * 3600
    os.utime(being_written, (day_old, day_old))
    files.remove_orphaned_temporaries(tmp_path)
    assert not being_written.exists()  # untouched for a day on the filesystem's clock: its node is gone


def test_the_eta_starts_again_after_the_clock_is_set_back():
    """A clock set back an hour as a run trained left it without an ETA until the clock had caught up
    again (an hour): the rate is measured again from the first step logged after the jump."""
    summary = RunSummary(id="r", state="running")
    add_event(summary, {"event": "start", "epochs": 1, "total_steps": 100, "time": 1000.0})
    for step, at in ((10, 1000.0), (20, 1010.0), (30, 1020.0 - 3600), (40, 1030.0 - 3600)):
        add_event(summary, {"event": "train", "step": step, "epoch": 1, "loss": 1.0, "time": at})
    assert eta(summary, 1030.0 - 3600) == pytest.approx(60.0)  # 60 steps left at 1 step a second
    assert eta(summary, 1040.0 - 3600) == pytest.approx(50.0)


def test_a_run_that_ended_before_it_started_by_its_clock_is_no_measure_of_gpu_hours(registry, tmp_path):
    """A GPU run whose host's clock was set back an hour as it trained measured minus 30 minutes an
    epoch, and a study's GPU-hours came out negative."""
    from fslab.core.studies import parse_study
    from fslab.core.study_plan import resolve_study
    from fslab.execution.studies import gpu_hours, queue_study
    from tests.test_studies import finish, runs_of, store, tiny

    study = parse_study(tiny(), "tiny.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    run = runs_of(outcome, config.runs_dir, "nca")[0]
    finish(run, {1: [0.5], 5: [0.5]})
    run.write_status(started=10_000.0, ended=10_000.0 + 1800.0 - 3600.0)  # its 30 minutes, less the hour set back
    with open(run.metrics_path, "a") as log:
        log.write(json.dumps({"event": "start", "device": "cuda:0", "epochs": 1}) + "\n")
    estimate = gpu_hours(resolve_study(study, "paper", settings=config, registry=registry), config.runs_dir)
    assert estimate["hours"] is None and estimate["measured_runs"] == []


def test_a_stop_waits_out_its_grace_on_the_monotonic_clock_whatever_the_time_of_day_does(project, monkeypatch):
    """fslab stop gave a worker that ignores SIGTERM its grace by the time of day: a clock set back as it
    waited (here one second back at every look) kept it waiting as long as the clock had gone back, the
    SIGKILL never sent."""
    import itertools
    import subprocess
    import sys
    import threading

    from fslab.core.states import HOST
    from fslab.execution.local import signal_worker

    deaf = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN); print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        deaf.stdout.readline()  # SIGTERM is ignored from here on
        run = create_run(project / "runs", "nca", {"method": "nca"})
        run.write_status(state="running", host=HOST, pid=deaf.pid, heartbeat=time.time())
        going_back = itertools.count(time.time(), -1.0)
        monkeypatch.setattr(time, "time", lambda: next(going_back))
        stopped = []
        stopping = threading.Thread(target=lambda: stopped.append(signal_worker(run, deaf.pid, grace=0.2)),
                                    daemon=True)
        stopping.start()
        stopping.join(10)
        monkeypatch.undo()
        assert stopped == ["killed"] and deaf.wait(5) == -9
        assert run.status()["error"] == "did not stop within the grace period; killed"
    finally:
        deaf.kill()
        deaf.wait()
