"""A run handed back to the store's local scheduler is always started: the scheduler's last look at the queue
and its exit happen under the lock that fslab resume takes to see it running and hand it the run."""

import json
import os
import subprocess
import sys
import threading
import zipfile

from fslab.core.runstore import Run, create_run
from fslab.core.sweeps import save_sweep

from .runs_helpers import TINY, fslab, fslab_here, wait_for
from .test_tui_helpers import complete_config

SWEEP = "sweep-20261203-120000-abcd"


def scheduler_held_after_its_last_look(monkeypatch, runs):
    """A scheduler of ``runs`` in a thread of this process (``scheduler.main``), whose workers are stand-ins
    that record what they were started for, and that is held after the first look at the queue that finds no
    run waiting, until ``go`` is set: where the scheduler exits after that look, a run handed to it meanwhile
    waits for good. Returns the thread, not started, the events ``looked`` and ``go``, and the starts."""
    from fslab.execution import scheduler

    looked, go, starts = threading.Event(), threading.Event(), []
    real_look = scheduler.waiting_runs

    def look(runs_dir, **kwargs):
        found = real_look(runs_dir, **kwargs)
        if not found and not looked.is_set():
            looked.set()
            assert go.wait(60), "the test never let the scheduler go on"
        return found

    def stand_in_worker(run, *, resume, env, pass_fds):
        starts.append((run.id, resume, env["FSLAB_SLOT"]))
        return subprocess.Popen([sys.executable, "-c", ""])

    monkeypatch.setattr(scheduler, "waiting_runs", look)
    monkeypatch.setattr(scheduler, "start_worker", stand_in_worker)
    thread = threading.Thread(target=scheduler.main, args=([str(runs)],), daemon=True)
    return thread, looked, go, starts


def sweep_run(runs, **status) -> Run:
    """The one run of a recorded sweep, its status updated with ``status``."""
    run = create_run(runs, "nca", complete_config(), sweep=SWEEP)
    run.write_status(**status)
    save_sweep(runs, SWEEP, runs=[run.id], method="nca")
    return run


def fake_checkpoint(run: Run) -> None:
    """A whole archive where the run's checkpoint goes (what fslab resume reads; no worker loads it here)."""
    run.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(run.checkpoint_path, "w") as archive:
        archive.writestr("last/data.pkl", b"not loaded")


def test_a_killed_run_handed_back_as_the_scheduler_exits_is_still_started(project, monkeypatch):
    """fslab resume of a sweep's killed run saw the scheduler alive and queued the run again for it, but that
    scheduler had made its last look and exited: the run waited with no scheduler, though the line said the
    scheduler running resumes it. The scheduler's last look now comes after the hand-back, and starts it."""
    (project / "fslab.toml").write_text("[scheduler]\ngpus = []\ncpu_slots = 1\n")
    runs = project / "runs"
    run = sweep_run(runs, state="killed", pid=None, ended=1.0)
    fake_checkpoint(run)
    thread, looked, go, starts = scheduler_held_after_its_last_look(monkeypatch, runs)
    thread.start()
    try:
        assert looked.wait(60)  # it found nothing waiting: it is about to exit, its presence still held
        back = fslab_here("resume", run.id, "--detach", cwd=project)
    finally:
        go.set()
        thread.join(60)
    assert (back.returncode, back.stdout) == (0, (
        f"run {run.id} is queued again in {SWEEP}: the scheduler running resumes it from its last checkpoint "
        f"when a slot frees, in queue order, never beside the slots ([scheduler] in fslab.toml); follow it with: "
        f"fslab queue\n")), back.stderr
    assert not thread.is_alive() and starts == [(run.id, True, "cpu-0")]  # started once, from its checkpoint


def test_a_queued_run_left_to_the_scheduler_as_it_exits_is_still_started(project, monkeypatch):
    """fslab resume of a sweep's queued run takes it, sees the scheduler alive and lets it go, saying the
    scheduler starts it; a scheduler that looked while it was taken, and exited as it was let go, left it
    waiting with no scheduler. It is let go under the lock the scheduler's last look takes, and started."""
    (project / "fslab.toml").write_text("[scheduler]\ngpus = []\ncpu_slots = 1\n")
    runs = project / "runs"
    run = sweep_run(runs, state="queued", pid=None)
    thread, looked, go, starts = scheduler_held_after_its_last_look(monkeypatch, runs)
    real_claim = Run.claim

    def claim(self, **kwargs):  # fslab resume's claim: the scheduler looks while it holds the run
        taken = real_claim(self, **kwargs)
        if threading.current_thread() is threading.main_thread() and not thread.is_alive():
            thread.start()
            assert looked.wait(60)
        return taken

    monkeypatch.setattr(Run, "claim", claim)
    try:
        left = fslab_here("resume", run.id, "--detach", cwd=project)
    finally:
        go.set()
        if thread.is_alive():
            thread.join(60)
    assert (left.returncode, left.stderr) == (2, (
        f"error: run {run.id} is queued in {SWEEP} and waits for a slot: the scheduler running starts it when one "
        f"frees, in queue order, and resume starts no queued run beside it, outside the slots ([scheduler] in "
        f"fslab.toml); follow it with: fslab queue\n"))
    assert not thread.is_alive() and starts == [(run.id, False, "cpu-0")]


def test_resume_with_every_slot_busy_and_no_scheduler_starts_one_for_the_run(project, monkeypatch):
    """fslab resume of a sweep's queued run, every slot busy and no scheduler running (killed), refused and named
    fslab sweep resume SWEEP, which queues again all the sweep's failed runs too. It leaves the run queued and
    starts a scheduler, which starts it when the slot frees."""
    from fslab.execution import executor
    from fslab.execution.scheduler import scheduler_running
    from fslab.execution.slots import Slot, lock_slot

    (project / "fslab.toml").write_text("[scheduler]\ngpus = []\ncpu_slots = 1\n")
    monkeypatch.setattr(executor, "start_scheduler", lambda runs_dir: None)  # queued; no scheduler (killed)
    queued = fslab_here("sweep", "nca", "--seeds", "1", *TINY, "--epochs", "1", cwd=project)
    assert queued.returncode == 0, queued.stderr
    sweep_id = queued.stdout.split(":")[0]
    runs = project / "runs"
    run = Run(runs / json.loads((runs / "sweeps" / f"{sweep_id}.json").read_text())["runs"][0])
    held = lock_slot(runs / ".slots", Slot("cpu-0"))  # as another run's worker holds it
    try:
        busy = fslab("resume", run.id, cwd=project)
        assert (busy.returncode, busy.stdout) == (0, (
            f"run {run.id} is queued in {sweep_id} and waits for a slot: every slot is busy and no scheduler was "
            f"running, so one was started, which starts it when a slot frees, in queue order, never beside the "
            f"slots ([scheduler] in fslab.toml); follow it with: fslab queue\n")), busy.stderr
        assert run.state() == "queued" and not run.status().get("pid")
        wait_for(lambda: scheduler_running(runs), 60, "the scheduler started for it")
    finally:
        os.close(held)
    wait_for(lambda: run.state() == "completed", 240, "the scheduler to start the run in the freed slot")
    assert run.status()["slot"] == "cpu-0"


def test_resume_waits_for_a_leaving_scheduler_to_be_gone_and_starts_the_run_itself(project, monkeypatch, registry):
    """The other order: the scheduler has taken its last look, under the hand-back lock, and is letting go of its
    presence as fslab resume looks for it. Resume waits for that lock, so it never hands the run to a scheduler on
    its way out: it finds none running, and starts the run in the slot that is free."""
    from fslab.core.flocks import is_held
    from fslab.core.settings import load_settings
    from fslab.execution import executor, scheduler

    (project / "fslab.toml").write_text("[scheduler]\ngpus = []\ncpu_slots = 1\n")
    runs = project / "runs"
    run = sweep_run(runs, state="killed", pid=None, ended=1.0)
    fake_checkpoint(run)
    entering, resumed, starts = threading.Event(), [], []
    real_look, real_handing_back = scheduler.waiting_runs, getattr(executor, "handing_back", None)

    def handing_back(runs_dir, *told):  # resume is about to take the hand-back lock
        entering.set()
        return real_handing_back(runs_dir, *told)

    resumer = threading.Thread(target=lambda: resumed.append(
        executor.resume(run, settings=load_settings(), registry=registry)), daemon=True)

    def look(runs_dir, **kwargs):
        found = real_look(runs_dir, **kwargs)
        if not found and is_held(runs_dir / ".slots" / "handback.lock") and resumer.ident is None:
            resumer.start()  # its last look, under the hand-back lock: resume goes on as the scheduler leaves
            assert entering.wait(60), "resume never took the hand-back lock"
        return found

    monkeypatch.setattr(scheduler, "waiting_runs", look)
    monkeypatch.setattr(executor, "handing_back", handing_back, raising=False)
    monkeypatch.setattr(executor, "_start", lambda run, **kw: starts.append(
        (run.id, kw["resume"], [slot.name for slot, _ in kw["slots"]])) or executor.Started(run))
    scheduler.main([str(runs)])
    assert resumer.ident is not None, "the scheduler left with no last look under the hand-back lock"
    resumer.join(60)
    assert [started.queued for started in resumed] == [None]  # not handed to the scheduler that left
    assert starts == [(run.id, True, ["cpu-0"])]


def test_sweep_resume_waits_for_a_leaving_scheduler_and_starts_one_for_the_waiting_runs(project, monkeypatch,
                                                                                       registry):
    """fslab sweep resume of a sweep whose runs only wait leaves them to a scheduler it sees running. One that made
    its last look while a run was held (its taker, killed just after, had not let it go) and was on its way out
    left that run waiting with no scheduler. Sweep resume waits for the hand-back lock a leaving scheduler holds,
    finds it gone, and starts a scheduler for the run."""
    from fslab.core.flocks import is_held
    from fslab.core.settings import load_settings
    from fslab.core.states import HOST
    from fslab.execution import executor, scheduler

    (project / "fslab.toml").write_text("[scheduler]\ngpus = []\ncpu_slots = 1\n")
    runs = project / "runs"
    run = sweep_run(runs, state="queued", pid=None)
    taker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    (run.path / ".claimed").write_text(f"{taker.pid} 0 {HOST} -\n")  # held: no scheduler takes it while it lives
    entering, resumed, schedulers = threading.Event(), [], []
    real_look, real_handing_back = scheduler.waiting_runs, getattr(executor, "handing_back", None)

    def handing_back(runs_dir, *told):  # sweep resume is about to take the hand-back lock
        entering.set()
        return real_handing_back(runs_dir, *told)

    resumer = threading.Thread(target=lambda: resumed.append(
        executor.resume_sweep(SWEEP, settings=load_settings(), registry=registry)), daemon=True)

    def look(runs_dir, **kwargs):
        found = real_look(runs_dir, **kwargs)
        if not found and is_held(runs_dir / ".slots" / "handback.lock") and resumer.ident is None:
            taker.kill()  # its last look, under the hand-back lock, saw the run held: now nobody holds it
            taker.wait()
            resumer.start()
            assert entering.wait(60), "sweep resume never took the hand-back lock"
        return found

    monkeypatch.setattr(scheduler, "waiting_runs", look)
    monkeypatch.setattr(executor, "handing_back", handing_back, raising=False)
    monkeypatch.setattr(executor, "start_scheduler", schedulers.append)
    try:
        scheduler.main([str(runs)])
    finally:
        taker.kill()
        taker.wait()
    assert resumer.ident is not None, "the scheduler left with no last look under the hand-back lock"
    resumer.join(60)
    (_, again, _, waiting, started), = resumed
    assert (again, [r.id for r in waiting], started) == ([], [run.id], True)
    assert [folder.resolve() for folder in schedulers] == [runs.resolve()]  # one started, for the run


def test_resume_waits_for_a_scheduler_whose_last_look_outlasts_ten_seconds(project, monkeypatch, registry, capsys):
    """The hand-back lock was given up after 10 s: a scheduler whose last look outlasted that (a store of many runs
    on a slow file server) was still seen running by fslab resume, which queued the run again for it as it
    exited, and the run waited with no scheduler. Resume now waits as long as the lock is held, saying once on
    stderr for whom, and then finds no scheduler and starts the run itself. A clock that leaps 6 s at each of the
    resumer's readings stands for the time the look takes."""
    import time as real_time
    from types import SimpleNamespace

    from fslab.core import flocks
    from fslab.core.flocks import is_held
    from fslab.core.settings import load_settings
    from fslab.core.states import HOST
    from fslab.execution import executor, scheduler

    (project / "fslab.toml").write_text("[scheduler]\ngpus = []\ncpu_slots = 1\n")
    runs = project / "runs"
    run = sweep_run(runs, state="killed", pid=None, ended=1.0)
    fake_checkpoint(run)
    settled, resumed, starts, leaps = threading.Event(), [], [], []
    real_look, real_wait = scheduler.waiting_runs, flocks._wait_for

    def resuming():
        try:
            resumed.append(executor.resume(run, settings=load_settings(), registry=registry))
        finally:
            settled.set()

    resumer = threading.Thread(target=resuming, daemon=True)

    def monotonic():
        if threading.current_thread() is resumer:
            leaps.append(6.0)
        return real_time.monotonic() + sum(leaps)

    def waiting(*args):
        if threading.current_thread() is resumer:
            settled.set()  # it waits for the lock: the scheduler's look ends now
        return real_wait(*args)

    def look(runs_dir, **kwargs):
        found = real_look(runs_dir, **kwargs)
        if not found and is_held(runs_dir / ".slots" / "handback.lock") and resumer.ident is None:
            resumer.start()  # its last look, under the hand-back lock, outlasts the resumer's patience
            assert settled.wait(60), "resume neither waited for the hand-back lock nor ended"
        return found

    monkeypatch.setattr(flocks, "time", SimpleNamespace(monotonic=monotonic, sleep=real_time.sleep))
    monkeypatch.setattr(flocks, "_wait_for", waiting)
    monkeypatch.setattr(scheduler, "waiting_runs", look)
    monkeypatch.setattr(executor, "_start", lambda run, **kw: starts.append(
        (run.id, kw["resume"], [slot.name for slot, _ in kw["slots"]])) or executor.Started(run))
    scheduler.main([str(runs)])
    resumer.join(60)
    assert [started.queued for started in resumed] == [None]  # not handed to the scheduler that left
    assert starts == [(run.id, True, ["cpu-0"])]
    said = [line for line in capsys.readouterr().err.splitlines() if "waiting" in line]
    assert said == [f"{run.id}: waiting for the hand-back lock {runs / '.slots' / 'handback.lock'} (pid {os.getpid()} "
                    f"on host {HOST}), held by the scheduler taking its last look at the queue, to tell whether a "
                    f"scheduler will start the run"]


def test_a_ctrl_c_stops_resume_waiting_for_the_hand_back_lock_and_leaves_the_run_as_it_was(project):
    """fslab resume of a sweep's killed run waits for the hand-back lock as long as its holder lives (here this
    test), saying so once; a Ctrl-C there ends it as a Ctrl-C ends fslab resume before its worker starts (exit
    code 130, nothing more said, no traceback), the run still killed and free."""
    import select
    import signal

    from fslab.core import flocks

    (project / "fslab.toml").write_text("[scheduler]\ngpus = []\ncpu_slots = 1\n")
    runs = project / "runs"
    run = sweep_run(runs, state="killed", pid=None, ended=1.0)
    fake_checkpoint(run)
    (runs / ".slots").mkdir()
    held = flocks.take_lock(runs / ".slots" / "handback.lock", holder=flocks.holder_line())
    try:
        resume = subprocess.Popen([sys.executable, "-m", "fslab", "resume", run.id, "--detach"], cwd=project,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert select.select([resume.stderr], [], [], 60)[0], "fslab resume said nothing in 60 s"
        said = resume.stderr.readline()  # its waiting line: it waits in the kernel for the lock
        assert said.startswith(f"{run.id}: waiting for the hand-back lock "), said + resume.stderr.read()
        resume.send_signal(signal.SIGINT)
        out, err = resume.communicate(timeout=60)
    finally:
        os.close(held)
    assert (resume.returncode, out, err) == (130, "", "")
    assert (run.state(), run.claimed()) == ("killed", False)


def test_a_scheduler_waits_for_a_hand_back_that_outlasts_ten_seconds_and_starts_the_run(project, monkeypatch):
    """The scheduler's side: fslab resume saw it running and holds the hand-back lock as it queues the run again
    for it. A scheduler that gave the lock up after 10 s took its last look before the run was queued, and exited:
    the run waited with no scheduler. It now waits as long as the lock is held, saying so in its log, then looks,
    and starts the run. A clock that leaps 6 s at each of the scheduler's readings stands for the hand-back's time."""
    import time as real_time
    from types import SimpleNamespace

    from fslab.core import flocks
    from fslab.core.states import HOST
    from fslab.execution import executor, scheduler

    (project / "fslab.toml").write_text("[scheduler]\ngpus = []\ncpu_slots = 1\n")
    runs = project / "runs"
    run = sweep_run(runs, state="killed", pid=None, ended=1.0)
    fake_checkpoint(run)
    _, looked, go, starts = scheduler_held_after_its_last_look(monkeypatch, runs)
    settled, leaps = threading.Event(), []
    real_wait, real_queue_again = flocks._wait_for, executor.queue_again

    def scheduling():
        try:
            scheduler.main([str(runs)])
        finally:
            settled.set()

    thread = threading.Thread(target=scheduling, daemon=True)

    def monotonic():  # until it waits (or ends): its worker's start then waits on the clock it reads
        if threading.current_thread() is thread and not settled.is_set():
            leaps.append(6.0)
        return real_time.monotonic() + sum(leaps)

    def waiting(*args):
        if threading.current_thread() is thread:
            settled.set()  # the scheduler waits for the hand-back lock: the hand-back goes on now
        return real_wait(*args)

    def queue_again(*args, **kwargs):  # under the hand-back lock, the scheduler seen running
        go.set()  # its last look comes now, as the hand-back outlasts its patience
        assert settled.wait(60), "the scheduler neither waited for the hand-back lock nor ended"
        return real_queue_again(*args, **kwargs)

    monkeypatch.setattr(flocks, "time", SimpleNamespace(monotonic=monotonic, sleep=real_time.sleep))
    monkeypatch.setattr(flocks, "_wait_for", waiting)
    monkeypatch.setattr(executor, "queue_again", queue_again)
    thread.start()
    try:
        assert looked.wait(60)  # it found nothing waiting, its presence held: fslab resume hands the run to it
        back = fslab_here("resume", run.id, "--detach", cwd=project)
    finally:
        go.set()
        thread.join(60)
    assert (back.returncode, back.stdout.splitlines()[-1]) == (0, (  # after the scheduler's log (this process's)
        f"run {run.id} is queued again in {SWEEP}: the scheduler running resumes it from its last checkpoint "
        f"when a slot frees, in queue order, never beside the slots ([scheduler] in fslab.toml); follow it with: "
        f"fslab queue")), back.stderr
    assert not thread.is_alive() and starts == [(run.id, True, "cpu-0")]  # started, by the scheduler that waited
    (said,) = back.stderr.splitlines()  # in the scheduler's log, which is its stderr
    assert f"scheduler {os.getpid()}: waiting for the hand-back lock {runs / '.slots' / 'handback.lock'} (pid " \
           f"{os.getpid()} on host {HOST}), held by " in said  # by what it does: here one process is both
    assert said.endswith("; its last look at the queue comes once it is let go")
