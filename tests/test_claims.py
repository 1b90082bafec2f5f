"""Stale claims: a queued run whose claimer (fslab run, a scheduler, a sweep) was killed
outright before starting its worker is free again, with real processes killed (SIGKILL)
at that point; a claim of another host, of a SLURM submission or from an older fslab is not."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fslab.core.claims import CLAIM_FILE, holder_gone, holder_line, parse_holder, read_holder
from fslab.core.runstore import create_run
from fslab.core.states import HOST, process_start

from .runs_helpers import TINY, fslab, fslab_here, wait_for

# `fslab ARGS` as the real CLI runs it, killed (SIGKILL) once the sweep's record is written and
# before it lets its runs go: they stay claimed by a process that is gone.
KILLED_BEFORE_LET_GO = """
import os, signal, sys
import fslab.execution.sweep as sweep
sweep.let_go = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
sys.argv = ["fslab", *sys.argv[1:]]
from fslab.cli import main
main()
"""

# `fslab run ARGS`, killed between creating (and claiming) its run and starting the worker.
KILLED_BEFORE_START = """
import os, signal, sys
import fslab.execution.executor as executor
executor._start = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
sys.argv = ["fslab", *sys.argv[1:]]
from fslab.cli import main
main()
"""


def killed_run(project) -> None:
    """``fslab run nca`` (tiny, one epoch) in ``project``, killed between claiming its run and starting the worker."""
    killed = subprocess.run([sys.executable, "-c", KILLED_BEFORE_START, "run", "nca", *TINY, "--epochs", "1"],
                            cwd=project, text=True, capture_output=True, timeout=120)
    assert killed.returncode == -9


def killed_sweep(project) -> dict:
    """The record of a two-run sweep in ``project``, killed after writing it and before letting its runs go."""
    argv = ["sweep", "nca", "--grid", "lr=0.1,0.05", *TINY, "--epochs", "1"]
    killed = subprocess.run([sys.executable, "-c", KILLED_BEFORE_LET_GO, *argv], cwd=project, text=True,
                            capture_output=True, timeout=120)
    assert killed.returncode == -9
    return json.loads(next((project / "runs" / "sweeps").glob("sweep-*.json")).read_text())


def gone_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def queued(tmp_path, claim_line: str | None, **status):
    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    run.write_status(**status)
    if claim_line is not None:
        (run.path / CLAIM_FILE).write_text(claim_line)
    return run



def wait_to_complete(runs):
    """Wait for each run folder's status to say completed (the freed runs train to the end)."""
    for run in runs:
        wait_for(lambda run=run: json.loads((run / "status.json").read_text())["state"] == "completed", 180,
                 f"{run.name} to complete")


def in_creation_order(runs):
    """The run folders in the order they were made: two made in one second sort by their random ends."""
    return sorted(runs.glob("2*"), key=lambda path: json.loads((path / "status.json").read_text())["created"])


_WORDS = st.sampled_from(["²", "٣", "9" * 5000, "-5", "0", "123", HOST, "-", "slurm", "1.5", ""]) | st.text(max_size=6)


@settings(max_examples=200, deadline=None)
@example("² 1795457570.0 vm -")  # ValueError: str.isdigit() takes '²', int() does not
@example("9" * 5000)  # ValueError: int() reads 4,300 digits at most
@given(st.lists(_WORDS, max_size=6).map(" ".join) | st.text(max_size=40))
def test_any_claim_line_is_read_each_field_or_none_and_judged(line):
    holder = parse_holder(line)
    assert holder.pid is None or 0 <= holder.pid < 10**19
    assert isinstance(holder_gone(holder), bool)
    me = parse_holder(holder_line(slurm=True))
    assert (me.pid, me.host, me.start, me.slurm) == (os.getpid(), HOST, process_start(os.getpid()), True)


@settings(max_examples=100, deadline=None)
@example("² vm")  # ValueError: str.isdigit() takes '²', int() does not
@given(st.lists(_WORDS, max_size=4).map(" ".join) | st.text(max_size=40))
def test_any_worker_lock_line_names_its_holder_or_the_statuss_pid(line):
    """The worker lock's line names its holder (fslab delete and resume of a run a live worker holds say
    who): a pid that is no ASCII number is none, and the status's pid is named instead."""
    import tempfile

    from fslab.core.flocks import held_by
    from fslab.core.worklock import LOCK_FILE, describe_holder

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / LOCK_FILE).write_text(line + "\n", encoding="utf-8")
        said = describe_holder(folder, {"pid": 7, "host": "h"})
        words = line.split()
        mine = words and words[0].isascii() and words[0].isdigit() and len(words[0]) <= 19
        assert said == (f"pid {int(words[0])} on host {(words + [''])[1] or '?'}" if mine else "pid 7 on host h")
        assert held_by(Path(folder) / LOCK_FILE) == "" or mine


def test_a_damaged_claim_is_no_traceback_in_fslab_queue(tmp_path):
    """A claim file whose pid field was a '²' made fslab queue, stop and resume a traceback."""
    fixture = Path(__file__).parent / "fixtures" / "runs-0.1" / "20261123-181250-nca-910d"
    folder = shutil.copytree(fixture, tmp_path / "runs" / fixture.name)
    (folder / CLAIM_FILE).write_text("² 1795457570.0 vm -\n", encoding="utf-8")
    assert parse_holder("² 1 vm -").pid is None and parse_holder("9" * 5000).pid is None
    result = fslab_here("queue", cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


def test_a_claim_is_stale_only_when_its_holder_on_this_host_is_gone_and_the_run_still_waits(tmp_path):
    from fslab.execution.scheduler import waiting_runs

    dead, now, me = gone_pid(), time.time(), os.getpid()
    stale = queued(tmp_path, f"{dead} {now} {HOST} 123\n")
    reused = queued(tmp_path, f"{me} {now} {HOST} 1\n")  # this pid, but a process started at another time
    alive = queued(tmp_path, f"{me} {now} {HOST} {process_start(me)}\n")
    elsewhere = queued(tmp_path, f"{dead} {now} another-host 123\n")
    old = queued(tmp_path, f"{dead} {now}\n")  # an older fslab's line: no host, never judged by its pid
    submitting = queued(tmp_path, f"{dead} {now} {HOST} 123 slurm\n")  # its job may exist
    started = queued(tmp_path, f"{dead} {now} {HOST} 123\n", pid=dead)
    ended = queued(tmp_path, f"{dead} {now} {HOST} 123\n", state="killed")
    orphan = queued(tmp_path, f"{dead} {now} {HOST} 123\n", sweep="sweep-20261202-000000-abcd")  # no record
    assert read_holder(old.path).host is None and read_holder(elsewhere.path).host == "another-host"
    assert stale.stale_claim().pid == dead and reused.stale_claim().pid == me
    for run in (alive, elsewhere, old, submitting, started, ended):
        assert run.stale_claim() is None and not run.free() and not run.claim(), run.id
    assert orphan.free()
    # the scheduler takes the freed runs, but not one of a sweep never recorded
    assert [run.id for run in waiting_runs(tmp_path / "runs")] == [stale.id, reused.id]
    assert waiting_runs(tmp_path / "runs", freeing=False) == []  # the scheduler's cheap listing: claims not read
    assert stale.claim() and read_holder(stale.path).pid == me  # taken over, by one taker only
    assert stale.stale_claim() is None and not stale.claim()
    assert reused.claim(slurm=True) and read_holder(reused.path).slurm  # taken over to submit a job: marked so


def test_a_stale_claim_another_user_made_is_taken_over_by_one_taker(tmp_path, another_users):
    """A stale claim file this user cannot write (another member's, in a store a group shares) was never
    taken over: its run stayed queued until the file's owner removed it. It is locked read-only and
    replaced; of two takers waiting on it, one takes the run (the other finds another file there)."""
    import fcntl
    import threading

    stale = queued(tmp_path, f"{gone_pid()} {time.time()} {HOST} 123\n")
    another_users(stale.path / CLAIM_FILE)
    held = os.open(stale.path / CLAIM_FILE, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # both takers wait for it
    taken = []
    takers = [threading.Thread(target=lambda: taken.append(stale.claim())) for _ in range(2)]
    for taker in takers:
        taker.start()
    time.sleep(0.2)
    os.close(held)
    for taker in takers:
        taker.join()
    assert sorted(taken) == [False, True] and read_holder(stale.path).pid == os.getpid()
    assert stale.stale_claim() is None and not stale.claim()


def test_a_stop_of_a_queued_run_never_overwrites_what_its_worker_wrote_meanwhile(tmp_path, monkeypatch):
    """fslab stop of a queued run claimed it, then wrote killed over whatever the status then said: a run
    started meanwhile (by a queued SLURM job of a killed submission, say) lost its worker's record. Here
    the run is started and its worker ends as the claim is taken; the stop finds it ended, and keeps that."""
    from fslab.core.runstore import Run
    from fslab.execution import executor

    run = queued(tmp_path, None, state="queued", pid=None)
    (run.path / "config.json").write_text(json.dumps({"method": "nca", "train": {"processes": 1}}))
    taken = Run.claim

    def claimed_as_it_ran(self, *args, **kwargs):
        got = taken(self, *args, **kwargs)
        self.write_status(state="completed", pid=gone_pid(), exit_code=0, ended=time.time())
        return got

    monkeypatch.setattr(Run, "claim", claimed_as_it_ran)
    assert executor.stop(run) == "completed"
    status = run.status()
    assert (status["state"], status.get("error")) == ("completed", None)


def test_a_stop_before_the_worker_started_keeps_the_end_it_recorded_meanwhile(tmp_path, monkeypatch):
    """fslab stop of a run whose worker had not written its pid waited for it, read the status (no pid, no
    end) and wrote killed: a worker that started and ended between that read and the write lost its end.
    The read here is the stale one; the file holds the end; the stop keeps it."""
    from fslab.core.runstore import Run
    from fslab.execution import local

    run = queued(tmp_path, None, state="queued", pid=None)
    (run.path / "config.json").write_text(json.dumps({"method": "nca", "train": {"processes": 1}}))
    stale = run.status()
    run.write_status(state="completed", pid=gone_pid(), exit_code=0, ended=time.time())
    reads = iter([stale, stale])  # stop_worker's two reads before its write: before the worker wrote

    class ReadBefore(Run):
        def status(self):
            return next(reads, None) or super().status()

    monkeypatch.setattr(local, "wait_for_pid", lambda run, timeout: None)
    assert local.stop_worker(ReadBefore(run.path)) == "completed"
    assert (run.status()["state"], run.status().get("error")) == ("completed", None)


def test_a_sweep_killed_before_letting_its_runs_go_is_started_by_sweep_resume(project):
    """A sweep killed (SIGKILL, the OOM killer) after recording its runs and before letting them go left
    them claimed for ever: fslab sweep resume said 'nothing to resume: 2 queued' and no scheduler took them."""
    record = killed_sweep(project)
    runs = [project / "runs" / run_id for run_id in record["runs"]]
    holders = {read_holder(run).pid for run in runs}
    assert len(holders) == 1 and None not in holders
    resumed = fslab("sweep", "resume", record["id"], cwd=project)
    assert resumed.returncode == 0, resumed.stderr
    ids = ", ".join(path.name for path in runs)
    assert resumed.stderr == (f"2 queued runs of {record['id']} were held by pid {holders.pop()} on host {HOST}, "
                              f"which is gone (killed before it started them); free again: {ids}\n")
    wait_to_complete(runs)


def test_fslab_stop_and_resume_take_a_queued_run_whose_fslab_run_was_killed_before_starting_it(project):
    """fslab run killed between creating its run and starting the worker left the run queued and claimed:
    fslab resume refused it ('is queued'), and fslab stop waited 10 s for a worker that would never come."""
    for _ in range(2):
        killed_run(project)
    first, second = in_creation_order(project / "runs")
    pids = [read_holder(run).pid for run in (first, second)]
    stopped = fslab("stop", first.name, cwd=project)
    assert stopped.returncode == 0 and stopped.stdout == f"{first.name}: killed\n"
    assert stopped.stderr.splitlines()[0] == (f"run {first.name} was queued, held by pid {pids[0]} on host {HOST}, "
                                              f"which is gone (killed before it started the run); stopped without "
                                              f"waiting for it")
    assert json.loads((first / "status.json").read_text())["error"] == "stopped while queued"
    resumed = fslab("resume", second.name, cwd=project)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr == (f"run {second.name} was queued, held by pid {pids[1]} on host {HOST}, which is gone "
                              f"(killed before it started the run); started here\n")
    assert json.loads((second / "status.json").read_text())["state"] == "completed"


def test_a_queued_run_held_on_another_host_is_refused_with_how_to_free_it_then_started_by_resume(project):
    """A claim taken on another host (or by an older fslab, whose line names no host) is never judged by its
    pid here: fslab resume says who holds the run and how to free it, in fslab queue's line; once freed, fslab
    resume starts it."""
    killed_run(project)
    run = next((project / "runs").glob("2*"))
    for line, host in ((f"4242 {time.time()} gpu-node-7 99\n", "gpu-node-7"), (f"4242 {time.time()}\n", "?")):
        (run / CLAIM_FILE).write_text(line)
        refused = fslab("resume", run.name, cwd=project)
        assert refused.returncode == 2 and refused.stderr == (  # as fslab queue says it
            f"error: run {run.name} waits, held by pid 4242 on host {host}, which this machine cannot tell gone: if "
            f"it is, remove runs/{run.name}/.claimed and run fslab queue --start\n")
    (run / CLAIM_FILE).unlink()
    resumed = fslab("resume", run.name, cwd=project)
    assert resumed.returncode == 0 and resumed.stderr == "", resumed.stderr
    assert json.loads((run / "status.json").read_text())["state"] == "completed"


def test_a_run_claimed_to_submit_a_slurm_job_is_marked_so_and_never_judged_stale(project):
    """fslab run --executor slurm (and fslab resume --executor slurm of a freed queued run) killed after sbatch
    and before recording the job would leave a claim a scheduler here took as stale, training the run twice."""
    from .test_studies import fake_slurm_study

    env = fake_slurm_study(project)
    submitted = fslab("run", "nca", *TINY, "--epochs", "1", "--executor", "slurm", "--detach", cwd=project, env=env)
    assert submitted.returncode == 0, submitted.stderr
    killed_run(project)
    first, second = in_creation_order(project / "runs")
    assert read_holder(first).slurm and not read_holder(second).slurm
    resumed = fslab("resume", second.name, "--executor", "slurm", cwd=project, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert read_holder(second).slurm and json.loads((second / "status.json").read_text())["slurm_job_id"] == "101"

def test_fslab_stop_of_a_run_whose_slurm_submission_was_killed_stops_it_at_once_naming_the_job(project):
    """A queued run held by a SLURM submission killed before it recorded the job: fslab stop waited 10 s for a
    worker's pid and said nothing of the job that may still wait in SLURM's queue. It now stops the run at once,
    and says how to find and cancel that job."""
    killed_run(project)
    run = next((project / "runs").glob("2*"))
    dead = gone_pid()
    (run / CLAIM_FILE).write_text(f"{dead} {time.time()} {HOST} 123 slurm\n")
    stopped = fslab("stop", run.name, cwd=project)
    assert stopped.returncode == 0 and stopped.stdout == f"{run.name}: killed\n", stopped.stderr
    assert stopped.stderr.splitlines()[0] == (
        f"run {run.name} was queued, held by the SLURM submission of pid {dead} on host {HOST}, which was killed "
        f"before it recorded the job; stopped without waiting for it: if squeue --me --name fslab-{run.name} lists "
        f"a job, scancel it (started, it would end at once, the run being stopped)")
    status = json.loads((run / "status.json").read_text())
    assert (status["state"], status["error"]) == ("killed", "stopped while queued")


# The scheduler, killed (SIGKILL) after claiming a run and before starting its worker.
KILLED_SCHEDULER = """
import os, signal, sys
import fslab.execution.scheduler as scheduler
scheduler.start_in_slots = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
sys.exit(scheduler.main(sys.argv[1:]))
"""


def test_a_run_whose_scheduler_was_killed_before_starting_it_is_started_by_the_next_scheduler(project):
    """A scheduler killed between taking a queued run and starting its worker left it claimed: no later
    scheduler took it, fslab queue did not count it as waiting, and fslab sweep resume had nothing to do."""
    record = killed_sweep(project)
    runs = [project / "runs" / run_id for run_id in record["runs"]]
    for run in runs:  # as if the sweep had let them go
        (run / CLAIM_FILE).unlink()
    scheduler = subprocess.run([sys.executable, "-c", KILLED_SCHEDULER, "runs"], cwd=project, text=True,
                               capture_output=True, timeout=120)
    assert scheduler.returncode == -9
    taken = [run for run in runs if (run / CLAIM_FILE).exists()]
    assert len(taken) == 1 and read_holder(taken[0]).host == HOST
    queue = fslab("queue", cwd=project)
    assert queue.stdout.splitlines()[-1].startswith("no scheduler is running: 2 waiting runs will not start")
    pid = read_holder(taken[0]).pid  # the killed scheduler's
    resumed = fslab("sweep", "resume", record["id"], cwd=project)
    assert resumed.returncode == 0
    assert resumed.stderr == (f"1 queued run of {record['id']} was held by pid {pid} on host {HOST}, which is gone "
                              f"(killed before it started it); free again: {taken[0].name}\n")
    wait_to_complete(runs)


def test_fslab_stop_of_a_sweep_killed_before_letting_its_runs_go_stops_them_at_once_saying_so(project):
    """fslab stop SWEEP waited 10 s for each such run's worker, which would never come, and said nothing."""
    record = killed_sweep(project)
    pid = read_holder(project / "runs" / record["runs"][0]).pid
    stopped = fslab("stop", record["id"], cwd=project)
    assert stopped.returncode == 0 and sorted(stopped.stdout.splitlines()) == sorted(
        f"{run_id}: killed" for run_id in record["runs"])
    ids = ", ".join(line.split(":")[0] for line in stopped.stdout.splitlines())
    assert stopped.stderr.splitlines()[0] == (f"2 queued runs of {record['id']} were held by pid {pid} on host {HOST}, "
                                              f"which is gone (killed before it started them); stopped without "
                                              f"waiting for them: {ids}")
    assert not any("SLURM" in line for line in stopped.stderr.splitlines())


def test_fslab_stop_of_a_sweep_names_the_job_of_a_run_its_killed_slurm_submission_held(project):
    """A sweep's queued run held by a SLURM submission killed before it recorded its job: fslab stop SWEEP
    stopped it after waiting 10 s for a worker, saying nothing of the job that may be queued."""
    record = killed_sweep(project)
    dead = gone_pid()
    for run_id in record["runs"]:
        (project / "runs" / run_id / CLAIM_FILE).write_text(f"{dead} {time.time()} {HOST} 123 slurm\n")
    stopped = fslab("stop", record["id"], cwd=project)
    assert stopped.returncode == 0 and sorted(stopped.stdout.splitlines()) == sorted(
        f"{run_id}: killed" for run_id in record["runs"])
    assert stopped.stderr.splitlines()[:2] == [
        f"run {run_id} was queued, held by the SLURM submission of pid {dead} on host {HOST}, which was killed before "
        f"it recorded the job; stopped without waiting for it: if squeue --me --name fslab-{run_id} lists a job, "
        "scancel it (started, it would end at once, the run being stopped)"
        for run_id in (line.split(":")[0] for line in stopped.stdout.splitlines())]
    for run_id in record["runs"]:
        assert json.loads((project / "runs" / run_id / "status.json").read_text())["error"] == "stopped while queued"


def _limited_to(size: int):
    """A child's file-size limit (RLIMIT_FSIZE): every write past ``size`` bytes refused, as a full disk does."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def test_a_claim_the_disk_cannot_take_is_said_and_leaves_no_empty_claim(project):
    """fslab stop of a queued run on a full disk made its claim file and could not write the line in it:
    `error: File too large`, naming no file, and the empty claim, naming no taker to judge, held the run
    for good (fslab resume: `is queued; only killed, lost or failed runs can resume`; no scheduler took it)."""
    run = queued(project, None, state="queued")
    done = subprocess.run([sys.executable, "-m", "fslab", "stop", run.id], cwd=project, capture_output=True,
                          text=True, preexec_fn=_limited_to(0), timeout=120)
    assert (done.returncode, done.stderr) == (1, f"error: File too large: runs/{run.id}/{CLAIM_FILE}\n")
    assert not (run.path / CLAIM_FILE).exists() and run.status()["state"] == "queued"
    assert fslab_here("stop", run.id, cwd=project).returncode == 0 and run.status()["state"] == "killed"


def test_a_stale_claim_the_disk_cannot_take_over_keeps_its_gone_holders_line(tmp_path):
    """Taking a stale claim over emptied the file before writing the new line: on a full disk it stayed
    empty, naming no taker, and the run it held was never judged free again."""
    gone = gone_pid()
    run = queued(tmp_path, f"{gone} 1.0 {HOST} -\n", state="queued")
    code = ("import sys; from fslab.core.runstore import find_run\n"
            "print(find_run(sys.argv[1], sys.argv[2]).claim())\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "runs"), run.id], capture_output=True,
                          text=True, preexec_fn=_limited_to(0), timeout=60)
    assert done.stdout == "False\n", done.stderr
    assert read_holder(run.path).pid == gone and run.stale_claim() is not None
    assert run.claim() and read_holder(run.path).pid == os.getpid()  # once there is room


def test_a_claim_file_its_taker_never_wrote_is_stale_after_its_grace_and_taken_by_one(tmp_path):
    """A claim file left empty (its taker SIGKILLed between making it and writing its line) or damaged named no
    holder to judge: no scheduler took its run, for good, and fslab resume said only 'is queued; only killed, lost
    or failed runs can resume'. Once it has stayed so for UNWRITTEN_GRACE_S on the store's clock while the run
    waits, it is stale: taken over by one taker, and fslab stop says whose claim it was. A damaged line (words,
    no pid) is left to a person, and fslab resume names the file and what to do."""
    from fslab.core.claims import UNWRITTEN_GRACE_S
    from fslab.execution.scheduler import waiting_runs

    lines = ("", "", "\0\0\0\0", "", "x garbage\n")  # NULs: a file made, its data lost with the machine's power
    fresh, empty, damaged, stopped, garbled = (queued(tmp_path, line) for line in lines)
    started = queued(tmp_path, "", pid=gone_pid())
    old = time.time() - UNWRITTEN_GRACE_S - 5
    for run in (empty, damaged, stopped, garbled, started):
        os.utime(run.path / CLAIM_FILE, (old, old))
    for run in (fresh, started, garbled):  # its taker may be writing it still; a run started is not waiting
        assert run.stale_claim() is None and not run.free() and not run.claim(), run.id
    assert {run.id for run in waiting_runs(tmp_path / "runs")} == {empty.id, damaged.id, stopped.id}
    assert empty.stale_claim().describe() == (f"a process that never wrote its claim (.claimed empty for over "
                                              f"{UNWRITTEN_GRACE_S:g} s)")
    assert empty.claim() and read_holder(empty.path).pid == os.getpid()  # taken over, by one taker only
    assert empty.stale_claim() is None and not empty.claim()
    assert damaged.claim(slurm=True) and read_holder(damaged.path).slurm
    done = fslab_here("stop", stopped.id, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == f"{stopped.id}: killed\n", done
    assert done.stderr.startswith(f"run {stopped.id} was queued, held by a process that never wrote its claim "
                                  f"(.claimed empty for over {UNWRITTEN_GRACE_S:g} s), which is gone"), done
    refused = fslab_here("resume", fresh.id, cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr == (
        f"error: run {fresh.id} is queued; only killed, lost or failed runs can resume; its claim, "
        f"runs/{fresh.id}/.claimed, names no taker yet (left empty by one killed before it wrote it, or being "
        f"written; taken over once {UNWRITTEN_GRACE_S:g} s old): if no fslab command is starting the run, remove the "
        f"file and run fslab resume {fresh.id} again\n"), refused
    refused = fslab_here("resume", garbled.id, cwd=tmp_path)  # as fslab queue says it
    assert refused.returncode == 2 and refused.stderr == (
        f"error: run {garbled.id} will not start: its claim file runs/{garbled.id}/.claimed holds 'x garbage', which "
        f"names no process (damaged, by hand or on disk); if no fslab command is starting the run, remove the file "
        f"and run fslab queue --start, or stop the run: fslab stop {garbled.id}\n"), refused



def test_fslab_queue_marks_a_run_whose_claim_file_is_damaged_and_fslab_stop_stops_it_at_once(tmp_path):
    """A claim file whose line names no process (words, bytes that are no text) or that cannot be read held its
    run for good: fslab queue listed it as waiting and said nothing, and fslab stop waited 10 s for a worker no
    taker would start, then stopped it without a word on the file. One cut short to a pid names no host: a taker
    this machine cannot tell gone."""
    words, garbled, unreadable, cut = (queued(tmp_path, line) for line in ("x garbage\n", None, None, "41"))
    (garbled.path / CLAIM_FILE).write_bytes(b"\xff\xfe\x00 9\n")
    (unreadable.path / CLAIM_FILE).mkdir()  # open() fails, as for a file this user cannot read

    def file(run) -> Path:
        return Path("runs") / run.id / CLAIM_FILE

    listed = fslab_here("queue", cwd=tmp_path)
    assert listed.returncode == 0 and listed.stderr == "", listed
    lines = {line.split()[1]: line for line in listed.stdout.splitlines() if line.startswith("run ")}
    for run, what in [(words, "holds 'x garbage', which names no process"),
                      (garbled, "holds '\ufffd\ufffd\\x00 9', which names no process"),
                      (unreadable, "cannot be read (Is a directory)")]:
        assert lines.pop(run.id) == (
            f"run {run.id} will not start: its claim file {file(run)} {what} (damaged, by hand or on disk); if no "
            f"fslab command is starting the run, remove the file and run fslab queue --start, or stop the run: "
            f"fslab stop {run.id}")
    assert lines == {cut.id: f"run {cut.id} waits, held by pid 41 on host ?, which this machine cannot tell gone: "
                             f"if it is, remove {file(cut)} and run fslab queue --start"}
    rows = [json.loads(line) for line in fslab_here("queue", "--json", cwd=tmp_path).stdout.splitlines()]
    problems = {row["id"]: row["problem"] for row in rows if row["type"] == "run"}
    assert set(problems) == {words.id, garbled.id, unreadable.id, cut.id} and all(problems.values()), problems
    began = time.monotonic()
    stopped = fslab_here("stop", words.id, cwd=tmp_path)
    assert time.monotonic() - began < 5, "it waited for a worker that no taker would start"
    assert stopped.returncode == 0 and stopped.stdout == f"{words.id}: killed\n", stopped
    assert stopped.stderr.startswith(
        f"run {words.id} was queued and its claim file {file(words)} holds 'x garbage', which names no process "
        f"(damaged), so no scheduler would have started it; stopped at once\n"), stopped
    assert words.id not in fslab_here("queue", cwd=tmp_path).stdout  # killed: no longer listed


def test_fslab_runs_show_and_resume_say_a_damaged_claim_in_fslab_queue_s_line(tmp_path):
    """fslab queue marked a queued run whose claim file names no process; fslab runs listed it as plainly queued,
    fslab show said nothing of it, and fslab resume said it in words of its own. Each now says fslab queue's line
    (Run.claim_problem): runs marks its state queued! and says the line after the table (and 'problem' with
    --json, null for the others), show says it under its state. An ended run's claim is not its problem."""
    words, plain, ended = queued(tmp_path, "x garbage\n"), queued(tmp_path, None), queued(tmp_path, "x\n")
    ended.write_status(state="killed")
    said = [line for line in fslab_here("queue", cwd=tmp_path).stdout.splitlines() if line.startswith("run ")]
    assert len(said) == 1 and said[0].startswith(f"run {words.id} will not start: its claim file "), said
    line = said[0]

    listed = fslab_here("runs", "--wide", cwd=tmp_path)
    assert listed.returncode == 0 and listed.stderr == "", listed
    states = {row.split("│")[1].strip(): row for row in listed.stdout.splitlines() if row.count("│") > 5}
    assert {run.id for run in (words, plain, ended)} == set(states), states
    assert " queued! " in states[words.id] and " queued " in states[plain.id] and "!" not in states[plain.id]
    assert [row for row in listed.stdout.splitlines() if row.startswith("run ")] == [line]
    rows = [json.loads(row) for row in fslab_here("runs", "--json", cwd=tmp_path).stdout.splitlines()]
    assert {row["id"]: row["problem"] for row in rows} == {words.id: line, plain.id: None, ended.id: None}

    shown = fslab_here("show", words.id, cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.splitlines()[1] == line, shown
    assert json.loads(fslab_here("show", words.id, "--json", cwd=tmp_path).stdout)["problem"] == line
    assert "will not start" not in fslab_here("show", plain.id, cwd=tmp_path).stdout
    refused = fslab_here("resume", words.id, cwd=tmp_path)  # where it said the file in words of its own
    assert (refused.returncode, refused.stdout, refused.stderr) == (2, "", f"error: {line}\n"), refused


def test_fslab_queue_marks_the_state_of_a_queued_run_whose_claim_is_damaged_as_fslab_runs_does(tmp_path):
    """fslab runs marks a queued run whose claim file names no process queued!; fslab queue's own table showed it
    plainly queued, its line after the table the only sign. --json keeps the state as it is, with its problem."""
    stuck, plain = queued(tmp_path, "x garbage\n"), queued(tmp_path, None)
    listed = fslab_here("queue", "--wide", cwd=tmp_path)
    assert listed.returncode == 0, listed
    states = {row.split("│")[1].strip(): row.split("│")[2].strip() for row in listed.stdout.splitlines()
              if row.count("│") > 3}
    assert states == {stuck.id: "queued!", plain.id: "queued"}, listed.stdout
    rows = [json.loads(row) for row in fslab_here("queue", "--json", cwd=tmp_path).stdout.splitlines()]
    assert {row["id"]: row["state"] for row in rows if row["type"] == "run"} == {stuck.id: "queued", plain.id: "queued"}


def test_fslab_runs_says_five_claim_problems_under_its_table_then_how_many_more(tmp_path):
    """A sweep's queued runs whose claims were all damaged would fill the screen under the table: five lines,
    then how many more (fslab queue says each)."""
    stuck = [queued(tmp_path, "x garbage\n") for _ in range(7)]
    listed = fslab_here("runs", cwd=tmp_path)
    lines = [line for line in listed.stdout.splitlines() if line.startswith("run ") or " more " in line]
    assert len(lines) == 6 and all(" will not start: its claim file " in line for line in lines[:5]), lines
    assert lines[5] == "2 more queued runs marked ! will not start unless a person acts; fslab queue says why for each"
    assert listed.stdout.count("queued!") == len(stuck)
