"""A run queued for a SLURM job that ended without starting its worker is lost,
not queued for ever: squeue (a stand-in on PATH) and, for submitit's local
executor, the job's controller process decide; where neither can tell, the run
stays queued."""

import json
import os
import shutil
import stat
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fslab.core import slurm_queue
from fslab.core.runstore import Run
from fslab.core.states import HOST
from fslab.core.worklock import observed_state

from .runs_helpers import TINY, fslab


@pytest.fixture
def squeue(tmp_path, monkeypatch):
    """A stand-in squeue printing ``tmp_path/jobs`` (exit code in ``tmp_path/rc``) and counting its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "squeue"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$@" >> {tmp_path}/calls
        cat {tmp_path}/jobs 2>/dev/null
        exit $(cat {tmp_path}/rc 2>/dev/null || echo 0)
    """))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(slurm_queue, "_listing", None)

    def answer(jobs: str, rc: int = 0) -> None:
        (tmp_path / "jobs").write_text(jobs)
        (tmp_path / "rc").write_text(str(rc))
        slurm_queue._listing = None  # a new answer, as after the listing's few seconds

    answer.calls = lambda: (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return answer


def waiting(job="77", age=100.0, **more):
    now = time.time()
    return {"state": "queued", "host": HOST, "created": now - age, "executor": "slurm", "slurm_cluster": "slurm",
            "slurm_job_id": job, "slurm_user": slurm_queue.user(), "slurm_submitted": now - age, **more}


@pytest.mark.parametrize(("jobs", "state"), [
    ("77 PENDING\n", "queued"), ("77 RUNNING\n", "queued"), ("12 FAILED\n77 REQUEUED\n", "queued"),
    ("77 FAILED\n", "lost"), ("77 NODE_FAIL\n", "lost"), ("77 CANCELLED\n", "lost"),
    ("", "lost"), ("78 PENDING\n", "lost"),  # SLURM no longer knows the job
])
def test_squeue_decides_whether_a_run_waiting_for_its_job_is_lost(tmp_path, squeue, jobs, state):
    squeue(jobs)
    assert observed_state(tmp_path, waiting()) == state
    (call,) = squeue.calls()
    assert call.split() == ["--noheader", "--states=all", f"--user={slurm_queue.user()}", "--format=%i", "%T"]


def test_where_squeue_cannot_tell_the_run_stays_queued(tmp_path, squeue, monkeypatch):
    squeue("", rc=1)  # the controller is down
    assert observed_state(tmp_path, waiting()) == "queued"
    squeue("")
    assert observed_state(tmp_path, waiting(age=5.0)) == "queued"  # just submitted: squeue may lag
    assert observed_state(tmp_path, waiting(requeued=time.time() - 5)) == "queued"  # a requeue under way
    assert observed_state(tmp_path, waiting(slurm_user="someone-else")) == "queued"  # their jobs may be hidden
    assert observed_state(tmp_path, waiting(slurm_user=None)) == "queued"  # submitted by an older fslab
    assert squeue.calls() == [f"--noheader --states=all --user={slurm_queue.user()} --format=%i %T"]
    assert observed_state(tmp_path, waiting()) == "lost"
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    slurm_queue._listing = None
    assert observed_state(tmp_path, waiting()) == "queued"  # no squeue here (a copy of the store)


def test_one_squeue_listing_serves_every_run_for_a_few_seconds(tmp_path, squeue):
    squeue("1 PENDING\n2 FAILED\n")
    states = [observed_state(tmp_path, waiting(job)) for job in ("1", "2", "3") * 20]
    assert states == ["queued", "lost", "lost"] * 20
    assert len(squeue.calls()) == 1
    slurm_queue._listing = (time.monotonic() - slurm_queue.LISTING_TTL_S - 1, slurm_queue._listing[1])
    assert observed_state(tmp_path, waiting("1")) == "queued" and len(squeue.calls()) == 2


def test_only_a_run_waiting_for_its_job_asks_squeue(tmp_path, squeue):
    squeue("")
    for status in (waiting(pid=os.getpid()), waiting(state="completed"), waiting(executor="local"),
                   waiting(slurm_job_id=None), {"state": "queued", "created": time.time() - 100}):
        assert observed_state(tmp_path, status) != "lost"
    assert squeue.calls() == []


def test_a_worker_that_wrote_its_state_meanwhile_is_not_lost(tmp_path, squeue):
    """Read queued, then the job started its worker, trained and ended before squeue was asked."""
    squeue("77 COMPLETED\n")
    (tmp_path / "status.json").write_text(json.dumps({**waiting(), "state": "completed", "pid": 5}))
    assert observed_state(tmp_path, waiting()) == "completed"
    (tmp_path / "status.json").write_text(json.dumps(waiting()))
    assert observed_state(tmp_path, waiting()) == "lost"


@settings(max_examples=100, deadline=None)
@example("²")  # ValueError: str.isdigit() takes it, int() does not
@example("9" * 5000)  # ValueError: int() reads 4,300 digits at most
@given(st.sampled_from(["٣", "0", str(os.getpid()), "99999999999999999999"]) | st.text(max_size=8))
def test_a_local_jobs_id_of_any_text_is_judged_never_raised(job):
    """A local cluster's job id is its controller's pid on the host that submitted it: alive or not,
    unknown where the text is no ASCII number."""
    state = observed_state(Path("no-such-run"), waiting(job, slurm_cluster="local"))
    assert state in ("queued", "lost")
    if job == str(os.getpid()):
        assert state == "queued"


def test_fslab_runs_lists_a_run_whose_status_names_a_damaged_local_job_id(tmp_path):
    """A status.json whose local job id was '²' made fslab runs, show and queue a traceback."""
    from .runs_helpers import fslab_here

    fixture = Path(__file__).parent / "fixtures" / "runs-0.1" / "20261123-181250-nca-910d"
    folder = shutil.copytree(fixture, tmp_path / "runs" / fixture.name)
    (folder / "status.json").write_text(json.dumps({**json.loads((folder / "status.json").read_text()),
                                                    **waiting("²", slurm_cluster="local"), "pid": None}))
    for argv in (["runs"], ["show", "last"], ["queue"]):
        result = fslab_here(*argv, cwd=tmp_path)
        assert result.returncode == 0 and "Traceback" not in result.stderr, (argv, result.stderr)


def test_a_local_job_whose_setup_fails_leaves_its_run_lost_with_the_reason(project):
    """submitit's local executor: the job's setup line fails, so its controller exits without
    starting the worker. The run was listed as queued for ever; it is lost, resumable as any."""
    (project / "fslab.toml").write_text("[slurm]\ncluster = 'local'\nsetup = ['exit 3']\n")
    submitted = fslab("run", "nca", *TINY, "--epochs", "1", "--executor", "slurm", cwd=project)
    assert submitted.returncode == 0, submitted.stderr
    (run_dir,) = (project / "runs").iterdir()
    run = Run(run_dir)
    status = run.status()
    assert (status["slurm_cluster"], status["slurm_user"]) == ("local", slurm_queue.user())
    deadline = time.time() + 30
    while run.state() != "lost" and time.time() < deadline:
        time.sleep(0.1)
    assert run.state() == "lost" and run.status()["state"] == "queued"
    listed = fslab("runs", "--json", cwd=project)
    assert json.loads(listed.stdout.splitlines()[0])["state"] == "lost"
    shown = fslab("show", run_dir.name, cwd=project).stdout.splitlines()
    assert f"SLURM job {status['slurm_job_id']}, which ended (or SLURM forgot it) before it started the run's " \
           f"worker; submitit's files and SLURM's logs: runs/{run_dir.name}/slurm/" in shown
    again = fslab("resume", run_dir.name, cwd=project)
    assert again.returncode == 2 and again.stderr == (
        f"error: run {run_dir.name} has no checkpoint (it stopped before it started); start it again with the "
        f"same settings: fslab run --like {run_dir.name}\n")
