"""`--executor slurm`: runs as submitit jobs, checked with submitit's local executor
(``[slurm] cluster = "local"``) and, for the sbatch file and scancel, with stand-in
SLURM commands on PATH."""

import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fslab.core.errors import ConfigError
from fslab.core.settings import Settings, load_settings

from .runs_helpers import TINY, events, fslab, fslab_here, wait_for
from .test_resume import SLOW_NCA, trajectory


def status(run_dir):
    return json.loads((run_dir / "status.json").read_text())


@pytest.mark.parametrize("table", ['{ account = ["a", "b"] }', "{ exclusive = false }", '{ "a\\nb" = "x" }',
                                   '{ account = "lab\\n#SBATCH --x" }', "{ mem = nan }", "{ a = { b = 1 } }"])
def test_sbatch_options_that_would_not_be_one_sbatch_line_are_refused(tmp_path, table):
    """submitit writes each [slurm] sbatch option as '#SBATCH --KEY=VALUE': a list or table was written as
    Python spells it, false as '--exclusive=False', and a key or value with a line break put lines of its
    own into the batch script (a partition's name too). Each is refused in one line naming the key; what
    sbatch takes is read."""
    path = tmp_path / "fslab.toml"
    path.write_text(f"[slurm]\nsbatch = {table}\n")
    with pytest.raises(ConfigError, match=r"^.*fslab\.toml: 'slurm\.sbatch' must be a table of sbatch options "
                                          r"\(names of letters, digits, - and _; each a line of text, a number or "
                                          r"true\), e\.g\. .*, got "):
        load_settings(path)
    path.write_text('[slurm]\npartition = "gpu\\n#SBATCH --qos=high"\n')  # the same line break in the partition
    with pytest.raises(ConfigError, match=r"'slurm\.partition' must be a partition's name, one line of text, got "):
        load_settings(path)
    path.write_text('[slurm]\nsbatch = { account = "lab", exclusive = true, nodes = 1, mem-per-cpu = "4G" }\n')
    assert load_settings(path).slurm.sbatch == {"account": "lab", "exclusive": True, "nodes": 1, "mem-per-cpu": "4G"}


def test_slurm_settings_are_checked(tmp_path):
    path = tmp_path / "fslab.toml"
    path.write_text("[slurm]\npartition = 'gpu'\ntimeout_min = 90\nsbatch = { account = 'lab' }\n")
    settings = load_settings(path)
    assert settings.slurm.partition == "gpu" and settings.slurm.timeout_min == 90
    assert settings.slurm.cluster == "slurm" and settings.slurm.sbatch == {"account": "lab"}
    path.write_text("[slurm]\npartion = 'gpu'\n")
    with pytest.raises(ConfigError, match="unknown key 'slurm.partion'. Did you mean 'partition'?"):
        load_settings(path)
    path.write_text("[slurm]\ncluster = 'pbs'\n")
    with pytest.raises(ConfigError, match="'slurm.cluster' must be \"slurm\" or \"local\", got \"pbs\""):
        load_settings(path)

    from fslab.execution.slurm import job_options

    settings = Settings()  # the built-in settings: no fslab.toml
    assert job_options(settings, ["partition=debug", "timeout_min=30"]).partition == "debug"
    with pytest.raises(ConfigError, match="--slurm timeout_min must be a whole number of minutes >= 1, got \"soon\""):
        job_options(settings, ["timeout_min=soon"])
    with pytest.raises(ConfigError, match="unknown --slurm key 'gpu_per_job'. Did you mean 'gpus_per_job'?"):
        job_options(settings, ["gpu_per_job=2"])
    # an infinite memory request was passed on to sbatch; the file and --slurm say it in one line
    path.write_text("[slurm]\nmem_gb = inf\n")
    with pytest.raises(ConfigError) as error:
        load_settings(path)
    assert str(error.value) == f"{path}: 'slurm.mem_gb' must be a finite number of GB >= 0 (0: the partition's " \
                               f"default), got inf"
    with pytest.raises(ConfigError, match=r"^--slurm mem_gb must be a finite number of GB >= 0 .*, got inf$"):
        job_options(settings, ["mem_gb=inf"])
    assert job_options(settings, ["mem_gb=0.5"]).mem_gb == 0.5
    # a time limit no longer than the signal's delay: SLURM (and the local executor) signalled each job as it
    # started, which checkpointed and requeued it before a step, until max_requeues ran out
    with pytest.raises(ConfigError, match=r"^slurm signal_delay_s = 120 must be less than the job's time limit, "
                                          r"timeout_min = 2 \(120 s; set by --slurm timeout_min\): each job would "
                                          r"be told to checkpoint and requeue as it starts; raise timeout_min or "
                                          r"lower signal_delay_s$"):
        job_options(settings, ["timeout_min=2"])
    assert job_options(settings, ["timeout_min=2", "signal_delay_s=60"]).timeout_min == 2
    path.write_text("[slurm]\ntimeout_min = 1\n")
    with pytest.raises(ConfigError, match=rf"\(60 s; set by \[slurm\] of {re.escape(str(path))}\)"):
        job_options(load_settings(path))


def test_without_submitit_the_error_says_how_to_install_it(project, monkeypatch):
    (project / "nosubmitit" / "submitit").mkdir(parents=True)
    (project / "nosubmitit" / "submitit" / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "PYTHONPATH": str(project / "nosubmitit")}
    result = fslab("run", "nca", "--executor", "slurm", cwd=project, env=env)
    assert result.returncode == 2
    assert result.stderr == "error: --executor slurm needs submitit; install it with: pip install 'fslab[slurm]' " \
                            "(or: pip install submitit)\n"
    assert not (project / "runs").exists()
    bad = fslab("run", "nca", "--executor", "slrum", cwd=project)
    assert bad.returncode == 2 and bad.stderr.strip() == \
        "error: unknown executor 'slrum'. Did you mean 'slurm'? Allowed: local, slurm."
    stray = fslab("sweep", "nca", "--slurm", "partition=gpu", cwd=project)
    assert stray.returncode == 2 and "--slurm settings apply only with --executor slurm" in stray.stderr


def test_without_slurm_a_job_is_refused_before_any_run_exists(project):
    """No srun on the PATH: run, sweep and study run say so in one line and leave no
    queued run behind for a later local scheduler to train. An option this machine cannot take is bad
    input, exit code 2, as --device cuda without a GPU is (it exited with 1, as a failure of fslab's)."""
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # python and fslab, no srun
    for argv in (["run", "nca", *TINY], ["sweep", "nca", *TINY, "--seeds", "2"],
                 ["study", "run", "nca-fig2", "--scale", "quick"]):
        result = fslab_here(*argv, "--executor", "slurm", cwd=project, env=env)  # the CLI in this process
        assert result.returncode == 2 and result.stderr == (
            'error: SLURM is not available here (no srun on the PATH); to try --executor slurm on this machine, '
            'set [slurm] cluster = "local" in fslab.toml\n'), argv
    assert not (project / "runs").exists() or not any((project / "runs").iterdir())


FAKE_SBATCH = """#!/bin/sh
cp "$1" "{folder}/sbatch-script.sh"
echo "Submitted batch job 4242"
"""
FAKE_SCANCEL = """#!/bin/sh
echo "$@" >> "{folder}/scancel.calls"
"""


def test_sbatch_file_follows_the_settings_and_stop_cancels_the_job(project, monkeypatch):
    """Stand-in sbatch/srun/scancel: submitit writes the real sbatch file and runs the real commands."""
    bin_dir = project / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("scancel", FAKE_SCANCEL), ("srun", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text.format(folder=project))
        (bin_dir / name).chmod(0o755 | stat.S_IEXEC)
    (project / "fslab.toml").write_text(textwrap.dedent("""
        [slurm]
        partition = "gpu"
        timeout_min = 90
        gpus_per_job = 2
        cpus_per_task = 6
        mem_gb = 32
        signal_delay_s = 150
        sbatch = { account = "lab", qos = "high" }
        setup = ["module load cuda"]
    """))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = fslab("run", "nca", *TINY, "--executor", "slurm", "--slurm", "partition=debug", cwd=project, env=env)
    assert result.returncode == 0, result.stderr
    (run_dir,) = (project / "runs").iterdir()
    assert result.stdout.strip() == f"run {run_dir.name}: submitted as SLURM job 4242; " \
                                    f"follow it with: fslab logs {run_dir.name} --follow"
    got = status(run_dir)
    assert ((got["state"], got["slurm_job_id"], got["slurm_cluster"], got["executor"])
            == ("queued", "4242", "slurm", "slurm"))
    script = (project / "sbatch-script.sh").read_text()
    for line in ("#SBATCH --partition=debug", "#SBATCH --time=90", "#SBATCH --gpus-per-node=2",
                 "#SBATCH --cpus-per-task=6", "#SBATCH --mem=32GB", "#SBATCH --account=lab", "#SBATCH --qos=high",
                 "#SBATCH --signal=USR2@150", f"#SBATCH --job-name=fslab-{run_dir.name}", "module load cuda"):
        assert line in script.splitlines(), line
    assert str(run_dir / "slurm") in script

    stopped = fslab("stop", run_dir.name, cwd=project, env=env)
    assert stopped.returncode == 0 and stopped.stdout.strip() == f"{run_dir.name}: killed"
    assert (project / "scancel.calls").read_text().split() == ["4242"]
    assert status(run_dir)["error"] == "job 4242 cancelled"


ARGS = [*TINY, "--epochs", "3", "--seed", "5", "--set", "loss.name=slow-nca"]


@pytest.fixture
def local_cluster(project):
    (project / "mine").mkdir()
    (project / "mine" / "slow.py").write_text(textwrap.dedent(SLOW_NCA))
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n[slurm]\ncluster = 'local'\n")
    return project


def ended(run_dir):
    return status(run_dir)["state"] in ("completed", "failed", "killed")


@pytest.mark.slow
def test_jobs_match_a_local_run_and_a_preempted_job_resumes_from_its_checkpoint(local_cluster):
    project = local_cluster
    reference = project / "runs" / fslab("run", "nca", *ARGS, "--detach", cwd=project).stdout.strip()
    plain = fslab("run", "nca", *ARGS, "--executor", "slurm", "--detach", cwd=project).stdout.strip()
    preempted = fslab("run", "nca", *ARGS, "--executor", "slurm", "--detach", cwd=project).stdout.strip()
    run_dir = project / "runs" / preempted

    # what SLURM does to a preempted job: USR2 to the job's process, then a requeue
    wait_for(lambda: [e for e in events(run_dir, "train") if e["epoch"] == 2], what="epoch 2 to start")
    first = status(run_dir)
    assert first["state"] == "running", first
    os.kill(first["pid"], signal.SIGUSR2)
    wait_for(lambda: status(run_dir).get("requeues") == 1, what="the job to be requeued")
    wait_for(lambda: ended(reference), timeout=180, what="the reference run to end")
    wait_for(lambda: ended(run_dir) and ended(project / "runs" / plain), timeout=180, what="both jobs to end")

    for run_id in (plain, preempted):
        got = status(project / "runs" / run_id)
        assert got["state"] == "completed" and got["exit_code"] == 0 and got["error"] is None, got
        assert got["executor"] == "slurm" and got["slurm_cluster"] == "local"
        # submitit pickles the job's result after the job function (which wrote status.json) returns
        result_file = project / "runs" / run_id / "slurm" / f"{got['slurm_job_id']}_0_result.pkl"
        wait_for(result_file.exists, timeout=120, what="submitit's result file")
        assert trajectory(project / "runs" / run_id) == trajectory(reference)
        assert json.loads((project / "runs" / run_id / "results.json").read_text())["test"] == \
            json.loads((reference / "results.json").read_text())["test"]
    got = status(run_dir)
    assert got["requeues"] == 1 and got["attempts"] == 2 and got["slurm_job_id"] == first["slurm_job_id"]
    assert got["pid"] != first["pid"]  # a new process, the same job
    (resumed,) = events(run_dir, "resume")
    assert 1 <= resumed["epoch"] < 3  # from a checkpoint taken before the signal, not from scratch
    assert [e["step"] for e in events(run_dir, "train")] == list(range(1, len(events(run_dir, "train")) + 1))
    assert "preempted or out of time; requeued" in (run_dir / "stderr.log").read_text()


@pytest.mark.slow
def test_a_sweep_of_jobs_stops_and_resumes(local_cluster):
    project = local_cluster
    result = fslab("sweep", "nca", *ARGS, "--executor", "slurm", cwd=project)
    assert result.returncode == 0, result.stderr
    sweep_id = result.stdout.split(":")[0]
    assert result.stdout.strip() == f"{sweep_id}: 1 run submitted as SLURM jobs; follow them with: fslab runs"
    (run_id,) = json.loads((project / "runs" / "sweeps" / f"{sweep_id}.json").read_text())["runs"]
    run_dir = project / "runs" / run_id
    wait_for(lambda: events(run_dir, "train"), what="training to start")
    assert status(run_dir)["sweep"] == sweep_id
    controller = int(status(run_dir)["slurm_job_id"])
    result = fslab("stop", run_id, cwd=project)
    assert result.returncode == 0 and result.stdout.strip() == f"{run_id}: killed"
    got = status(run_dir)
    assert got["state"] == "killed" and got["error"] == "stopped by SIGTERM"

    def gone():
        try:
            os.kill(controller, 0)
        except ProcessLookupError:
            return True
        return open(f"/proc/{controller}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"

    wait_for(gone, timeout=120, what="the job's controller to exit")

    again = fslab("sweep", "resume", sweep_id, cwd=project)  # where its runs last ran, as fslab stop's hint says
    assert again.stdout.strip() == f"{sweep_id}: 1 run submitted again as SLURM jobs", again.stderr
    wait_for(lambda: ended(run_dir), timeout=180, what="the resubmitted job to end")
    got = status(run_dir)
    assert got["state"] == "completed" and int(got["slurm_job_id"]) != controller
    # from its checkpoint, or from scratch if it was stopped in epoch 1: either way no step twice
    steps = [e["step"] for e in events(run_dir, "train")]
    assert steps == list(range(1, len(steps) + 1))
    assert len(events(run_dir, "start")) == 1 + len(events(run_dir, "resume"))


COUNTING_SBATCH = """#!/bin/sh
n=$(cat "{folder}/next-job" 2>/dev/null || echo 100)
echo $((n + 1)) > "{folder}/next-job"
echo "Submitted batch job $n"
"""
BOOM = """
    from fslab.plugin import hookimpl


    def boom(z, labels, support=None):
        raise RuntimeError("boom")


    @hookimpl
    def register_losses(register):
        register(boom, name="boom", description="fails at its first step")
"""


@pytest.mark.slow
@pytest.mark.parametrize("fail_fast", [True, False])
def test_a_failed_job_of_a_fail_fast_sweep_cancels_the_jobs_still_queued(project, fail_fast):
    """Stand-in sbatch/scancel: the jobs stay pending; the first one is then run the way
    SLURM would run it (its job body, with SLURM's environment) and fails."""
    bin_dir = project / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", COUNTING_SBATCH), ("scancel", FAKE_SCANCEL), ("srun", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text.format(folder=project))
        (bin_dir / name).chmod(0o755)
    (project / "mine").mkdir()
    (project / "mine" / "boom.py").write_text(textwrap.dedent(BOOM))
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    flag = ["--fail-fast"] if fail_fast else []
    result = fslab("sweep", "nca", *TINY, "--set", "loss.name=boom", "--seeds", "3", *flag,
                   "--executor", "slurm", cwd=project, env=env)
    assert result.returncode == 0, result.stderr
    sweep_id = result.stdout.split(":")[0]
    runs = json.loads((project / "runs" / "sweeps" / f"{sweep_id}.json").read_text())["runs"]
    jobs = {run_id: status(project / "runs" / run_id)["slurm_job_id"] for run_id in runs}
    assert sorted(jobs.values()) == ["100", "101", "102"]

    first, *others = runs
    job_env = {**env, "SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": jobs[first]}
    job = subprocess.run([sys.executable, "-c", "import sys; from fslab.execution.slurm_job import TrainingJob; "
                          "TrainingJob(sys.argv[1])()", str(project / "runs" / first)],
                         cwd=project, env=job_env, capture_output=True, text=True, timeout=120)
    assert job.returncode != 0
    got = status(project / "runs" / first)
    assert (got["state"], got["error"]) == ("failed", "loss 'boom' from plugin 'local:boom' failed: RuntimeError: boom")
    calls = (project / "scancel.calls").read_text().split() if (project / "scancel.calls").exists() else []
    if fail_fast:
        assert sorted(calls) == sorted(jobs[r] for r in others)
        for run_id in others:
            got = status(project / "runs" / run_id)
            assert (got["state"], got["error"]) == ("killed", f"sweep stopped: run {first} failed (fail-fast)")
        assert "fail-fast: cancelled 2 queued runs" in (project / "runs" / first / "stderr.log").read_text()
    else:
        assert calls == [] and [status(project / "runs" / r)["state"] for r in others] == ["queued", "queued"]


@pytest.mark.slow
@pytest.mark.usefixtures("torchrun_tmp")  # its torchrun's folder: under tmp_path
def test_a_two_process_job_runs_torchrun_in_the_job_and_survives_preemption(local_cluster):
    """--device cpu --gpus 2 as a job: the same steps as the same run started locally; USR2 to
    the job stops its ranks, and the requeued job resumes them from the checkpoint."""
    from fslab.execution.local import child_pids

    project = local_cluster
    two = [*ARGS, "--device", "cpu", "--gpus", "2"]
    reference = project / "runs" / fslab("run", "nca", *two, "--detach", cwd=project).stdout.strip()
    preempted = fslab("run", "nca", *two, "--executor", "slurm", "--detach", cwd=project).stdout.strip()
    run_dir = project / "runs" / preempted
    wait_for(lambda: [e for e in events(run_dir, "train") if e["epoch"] == 2], timeout=180, what="epoch 2 to start")
    first = status(run_dir)
    assert first["state"] == "running" and first["processes"] == 2, first
    (job_process,) = child_pids(int(first["slurm_job_id"]))  # the local executor's controller runs the job
    os.kill(job_process, signal.SIGUSR2)
    wait_for(lambda: status(run_dir).get("requeues") == 1, what="the job to be requeued")
    wait_for(lambda: ended(run_dir) and ended(reference), timeout=180, what="the requeued job and the reference to end")
    assert status(reference)["state"] == "completed"

    got = status(run_dir)
    assert (got["state"], got["processes"], got["requeues"], got["attempts"]) == ("completed", 2, 1, 2), got
    assert got["slurm_job_id"] == first["slurm_job_id"] and got["pid"] != first["pid"]
    assert trajectory(run_dir) == trajectory(reference)
    (resumed,) = events(run_dir, "resume")
    assert 1 <= resumed["epoch"] < 3
    assert [e["step"] for e in events(run_dir, "train")] == list(range(1, len(events(run_dir, "train")) + 1))


# The two tests below were the end of the one above (73 s in all on a loaded 2-core machine): apart,
# two test processes can share them out.
@pytest.mark.slow
@pytest.mark.usefixtures("torchrun_tmp")  # its torchrun's folder: under tmp_path
def test_fslab_stop_passes_sigterm_through_a_two_process_job_to_torchrun(local_cluster):
    """fslab stop: the job passes SIGTERM on to torchrun, whose rank 0 records the stop."""
    from fslab.core.states import pid_alive

    project = local_cluster
    two = [*ARGS, "--device", "cpu", "--gpus", "2"]
    stopped = fslab("run", "nca", *two, "--executor", "slurm", "--detach", cwd=project).stdout.strip()
    wait_for(lambda: events(project / "runs" / stopped, "train"), timeout=180, what="training to start")
    torchrun = status(project / "runs" / stopped)["pid"]
    result = fslab("stop", stopped, cwd=project, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == f"{stopped}: killed", result.stderr
    assert status(project / "runs" / stopped)["error"] == "stopped by SIGTERM"
    wait_for(lambda: not pid_alive(torchrun), timeout=120, what="torchrun to exit")


def test_a_job_of_more_processes_than_its_gpus_is_refused_in_one_line(local_cluster):
    project = local_cluster
    bin_dir = project / "bin"  # a stand-in srun: SLURM is here, so the job's shape is what is checked
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    no_gpus = fslab_here("run", "nca", *TINY, "--gpus", "2", "--device", "cuda", "--executor", "slurm", "--slurm",
                         "cluster='slurm'", "--slurm", "gpus_per_job=1", cwd=project,
                         env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert no_gpus.returncode == 2 and no_gpus.stderr.strip() == \
        "error: --gpus 2 (train.processes) in a SLURM job needs gpus_per_job >= 2, got 1; pass --slurm " \
        "gpus_per_job=2 or set it in [slurm] of fslab.toml"


def test_sweep_resume_goes_where_the_runs_to_queue_again_last_ran(tmp_path):
    """As fslab resume goes by a run: a sweep of SLURM jobs, stopped, went on as local workers when
    resumed as fslab stop's hint says (fslab sweep resume SWEEP), training on the login node."""
    from fslab.core.errors import UsageError
    from fslab.core.sweeps import save_sweep
    from fslab.execution.executor import sweep_executor

    runs, made = tmp_path / "runs", []

    def sweep(*statuses):
        names = []
        for status in statuses:
            made.append(f"20261128-000000-nca-{len(made):04x}")
            names.append(made[-1])
            (runs / made[-1]).mkdir(parents=True)
            (runs / made[-1] / "status.json").write_text(json.dumps(status))
        return save_sweep(runs, f"sweep-20261128-000000-{len(made):04x}", runs=names)["id"]

    jobs = sweep({"state": "killed", "executor": "slurm"}, {"state": "completed", "executor": "local"})
    assert sweep_executor(runs, jobs) == "slurm"
    local = sweep({"state": "failed"}, {"state": "killed", "executor": "local"})
    assert sweep_executor(runs, local) == "local"
    assert sweep_executor(runs, sweep({"state": "completed", "executor": "slurm"})) == "local"  # nothing to resume
    # none to requeue but one never submitted (Ctrl-C while submitting): where the submitted ones went
    assert sweep_executor(runs, sweep({"state": "queued", "executor": "slurm"}, {"state": "queued"})) == "slurm"
    assert sweep_executor(runs, sweep({"state": "completed", "executor": "local"}, {"state": "queued"})) == "local"
    both = sweep({"state": "killed", "executor": "slurm"}, {"state": "killed", "executor": "local"})
    with pytest.raises(UsageError) as error:
        sweep_executor(runs, both)
    assert str(error.value) == (f"runs of {both} last ran both here and as SLURM jobs; say where they go on: "
                                f"fslab sweep resume {both} --executor local (or --executor slurm)")
    refused = fslab("sweep", "resume", both, cwd=tmp_path)
    assert (refused.returncode, refused.stderr.strip()) == (2, f"error: {error.value}")


@pytest.mark.slow
@pytest.mark.usefixtures("torchrun_tmp")  # its torchrun's folder: under tmp_path
def test_a_two_process_job_out_of_requeues_fails_as_a_one_process_job_does(local_cluster):
    """With max_requeues spent, submitit stops the job instead of requeuing it: the run failed
    with its reason, as a one-process job's does; it ended `killed`, 'stopped by SIGTERM', the
    stop rank 0 recorded when the job stopped the ranks for a requeue that never came."""
    from fslab.execution.local import child_pids

    project = local_cluster
    # submitit takes a signal as the time limit where the job ran past min(80%, all but 10 minutes) of it
    two = [*ARGS, "--device", "cpu", "--gpus", "2", "--executor", "slurm", "--slurm", "max_requeues=0",
           "--slurm", "timeout_min=10", "--slurm", "signal_delay_s=30"]
    run_dir = project / "runs" / fslab("run", "nca", *two, "--detach", cwd=project).stdout.strip()
    wait_for(lambda: events(run_dir, "checkpoint"), timeout=180, what="the first checkpoint")
    (job_process,) = child_pids(int(status(run_dir)["slurm_job_id"]))
    os.kill(job_process, signal.SIGUSR2)  # out of time, with no requeue left
    wait_for(lambda: ended(run_dir) and status(run_dir)["state"] != "killed", timeout=180, what="the run to fail")
    got = status(run_dir)
    assert (got["state"], got["exit_code"]) == ("failed", 1), got
    assert got["error"] == "UncompletedJobError: Job not requeued because: timed-out too many times."
    assert (run_dir / "checkpoints" / "last.pt").exists()  # fslab resume goes on from it


KILLING_SBATCH = """#!/bin/sh
echo "Submitted batch job 4242"
kill -9 $PPID
"""


def test_a_run_whose_submitter_was_killed_after_sbatch_says_how_to_free_it(project):
    """fslab killed between sbatch and recording the job id left its run queued, its claim marked for SLURM
    (never judged stale: a job may be queued). fslab resume said only 'is queued; only killed, lost or failed
    runs can resume', and fslab sweep resume passed it over in silence: each now says the submission was
    killed, and how to free the run by hand."""
    bin_dir = project / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", KILLING_SBATCH), ("srun", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    killed = fslab("sweep", "nca", *TINY, "--seeds", "1", "--executor", "slurm", cwd=project, env=env)
    assert killed.returncode == -signal.SIGKILL
    (run_dir,) = (project / "runs").glob("2*")
    (record,) = (project / "runs" / "sweeps").glob("*.json")
    sweep = record.stem
    assert status(run_dir)["state"] == "queued" and not status(run_dir).get("slurm_job_id")
    how = (rf"held by the SLURM submission of pid \d+ on host \S+, which was killed before it recorded the job: "
           rf"if squeue --me --name fslab-{run_dir.name} lists no job, remove runs/{run_dir.name}/\.claimed and run ")

    resumed = fslab("resume", run_dir.name, cwd=project, env=env)
    assert resumed.returncode == 2
    assert re.fullmatch(rf"error: run {run_dir.name} is queued, {how}fslab resume {run_dir.name} again\n",
                        resumed.stderr), resumed.stderr
    again = fslab("sweep", "resume", sweep, cwd=project, env=env)
    assert again.returncode == 2
    assert re.fullmatch(rf"error: sweep {sweep} has nothing to resume: 1 queued; run {run_dir.name} is queued, "
                        rf"{how}fslab sweep resume {sweep} again\n", again.stderr), again.stderr
    (run_dir / ".claimed").unlink()  # as the line says: no job of it in SLURM's queue
    (bin_dir / "sbatch").write_text('#!/bin/sh\necho "Submitted batch job 4343"\n')
    freed = fslab("resume", run_dir.name, cwd=project, env=env)
    assert freed.returncode == 0, freed.stderr
    assert status(run_dir)["slurm_job_id"] == "4343"


def test_a_two_process_job_writes_its_status_only_after_the_submitter_has_let_the_run_go(tmp_path, monkeypatch):
    """The submitter holds the run's lock from its check of the run to its record of the job id (read, merge,
    write of status.json). A --gpus N job took no lock before writing its own id and attempt count, so one that
    started while sbatch returned could have its write overwritten by the submitter's stale merge (attempts
    lost). Now it waits for that lock, as a one-process job does; here the lock is never let go, and the job,
    told to wait no time, refuses without writing or starting its ranks."""
    from fslab.core.runstore import create_run
    from fslab.execution import slurm_job
    from fslab.execution.handover import launch_lock

    run = create_run(tmp_path / "runs", "nca", {"train": {"processes": 2}})
    started = []
    monkeypatch.setattr(slurm_job, "_log_to_run", lambda run: None)
    monkeypatch.setattr(slurm_job, "run_ranks", lambda job, run, resume: started.append(run.write_status(attempts=1)))
    monkeypatch.setattr(slurm_job, "WORKER_WAIT_S", 0.0, raising=False)
    before = run.status()
    with launch_lock(run):  # the submitter, between sbatch and recording the job id
        assert slurm_job.run_job(slurm_job.TrainingJob(str(run.path))) == "refused"
    assert started == [] and run.status() == before
    slurm_job.run_job(slurm_job.TrainingJob(str(run.path)))  # let go: the job goes on
    assert len(started) == 1 and run.status()["attempts"] == 1
