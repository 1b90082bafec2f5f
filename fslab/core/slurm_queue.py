"""Whether the SLURM job of a run that waits for it still exists.

A run submitted with ``--executor slurm`` stays ``queued`` without a pid
until its job starts the worker. A job that dies before that (a failing
``setup`` line, a node that fails at boot, an ``scancel`` typed by hand)
writes nothing into the run's folder, so the run's files alone would keep it
queued for ever. :func:`job_alive` asks the scheduler instead: ``squeue``
for the jobs of the user who submitted the run (one call, kept for a few
seconds, however many runs wait), or, for ``[slurm] cluster = "local"``,
whether the job's controller process still lives on this host.

It answers None, and the run stays queued, wherever it cannot know: no
``squeue`` here (a copy of the store on a laptop), ``squeue`` failing or
slow, a run another user submitted (their jobs may be hidden from us), or a
job submitted or requeued less than :data:`GRACE_S` ago (a requeue passes
through states in which the job may look ended).
"""

from __future__ import annotations

import getpass
import shutil
import subprocess
import time

from fslab.core.states import HOST, pid_alive
from fslab.core.text import ascii_whole

# The states squeue lists for a job that will not run again (squeue --states=all keeps ended jobs a few minutes).
ENDED_JOB_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                              "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT"})
# The keys of status.json that waits_for_job and job_alive read, beyond state, pid, host and created.
JOB_KEYS = ("executor", "slurm_job_id", "slurm_cluster", "slurm_user", "slurm_submitted", "requeued")
GRACE_S = 30.0  # after a submission or a requeue, a job is given this long before its absence counts
LISTING_TTL_S = 10.0  # one squeue listing serves every run asked about within this long
SQUEUE_TIMEOUT_S = 10.0

_listing: tuple[float, dict[str, str] | None] | None = None  # (time.monotonic() when asked, job id -> state)


def user() -> str | None:
    """The name SLURM knows this process's user by, or None if it cannot be told."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def waits_for_job(status: dict) -> bool:
    """Whether ``status`` is a run queued on SLURM whose job has not started its worker."""
    return (status.get("state") == "queued" and not status.get("pid") and status.get("executor") == "slurm"
            and isinstance(status.get("slurm_job_id"), str))


def job_alive(status: dict, now: float | None = None) -> bool | None:
    """True while the job of a run that waits for it (:func:`waits_for_job`)
    is pending, running or being requeued; False once it ended or SLURM no
    longer knows it; None where that cannot be known here."""
    job = status["slurm_job_id"]
    if status.get("slurm_cluster") == "local":  # the job id is its controller's pid on the submitting host
        pid = ascii_whole(job)
        return pid_alive(pid) if pid is not None and status.get("host") == HOST else None
    now = time.time() if now is None else now
    submitted = max((v for k in ("slurm_submitted", "requeued", "created")
                     if isinstance(v := status.get(k), (int, float))), default=0.0)
    if now - submitted < GRACE_S or status.get("slurm_user") != user():
        return None
    jobs = _jobs_of_user()
    if jobs is None:
        return None
    return job in jobs and jobs[job] not in ENDED_JOB_STATES


def _jobs_of_user() -> dict[str, str] | None:
    """This user's jobs as squeue lists them (id -> state, ended ones included),
    from a listing younger than :data:`LISTING_TTL_S` (so taken after any job
    old enough to be asked about was submitted); None if squeue is not here or
    does not answer."""
    global _listing
    now = time.monotonic()  # its age: never the time of day, which may be set back
    if _listing is not None and now - _listing[0] < LISTING_TTL_S:
        return _listing[1]
    _listing = (now, _ask_squeue())
    return _listing[1]


def _ask_squeue() -> dict[str, str] | None:
    name, squeue = user(), shutil.which("squeue")
    if name is None or squeue is None:
        return None
    try:
        done = subprocess.run([squeue, "--noheader", "--states=all", f"--user={name}", "--format=%i %T"],
                              capture_output=True, text=True, timeout=SQUEUE_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:  # the controller is down or refuses: nothing can be concluded
        return None
    jobs = {}
    for line in done.stdout.splitlines():
        words = line.split()
        if len(words) >= 2:
            jobs[words[0]] = words[1].upper()
    return jobs
