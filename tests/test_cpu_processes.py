"""How many gloo processes a ``--device cpu --gpus N`` run may start: one per CPU they run on."""

import os

import pytest

from fslab.core.errors import UsageError
from fslab.core.settings import SlurmSettings
from fslab.execution.checks import check_cpu_processes, cpu_count

from .runs_helpers import TINY, fslab_here


def test_more_gloo_processes_than_cpus_are_refused_before_a_run_exists(project):
    """--device cpu --gpus 500 on a 2-core machine started 500 gloo processes (as many as the batch had
    rows), swamping the machine for a run no faster than one process's."""
    have = cpu_count()
    many = max(have, 2) + 1
    result = fslab_here("run", "nca", *TINY, "--batch-size", str(4 * many), "--device", "cpu", "--gpus", str(many),
                        cwd=project)
    cpus = f"{have} CPU{'s' if have != 1 else ''}"
    assert (result.returncode, result.stderr) == (2, (
        f"error: --device cpu --gpus {many} (train.processes) starts {many} gloo processes, more than the {cpus} "
        f"this machine lets fslab use; use --gpus {max(have, 2)} or fewer\n"))
    assert not (project / "runs").exists() or not any((project / "runs").iterdir())


@pytest.mark.parametrize("grid, refused", [
    ("train.processes=1,{many}", "--device cpu --gpus {many} (train.processes) starts {many} gloo processes, more "
                                 "than the {cpus} this machine lets fslab use; use --gpus {most} or fewer"),
    ("train.lr=0.1,-1", "config key 'train.lr' must be > 0 and at most 3.4e38 (float32's largest), got -1.0"),
])
def test_a_grid_point_a_run_refuses_is_named_with_its_value(project, grid, refused):
    """fslab sweep --device cpu --grid train.processes=1,5 on a 2-core machine was refused in the line of
    fslab run --gpus 5, naming no grid: the line begins with the grid point, as a study's names its grid key."""
    have = cpu_count()
    many, most = max(have, 2) + 1, max(have, 2)
    grid = grid.format(many=many)
    result = fslab_here("sweep", "nca", *TINY, "--batch-size", str(4 * many), "--device", "cpu", "--grid", grid,
                        cwd=project)
    point = grid.split("=")[0] + "=" + grid.split(",")[-1]
    refused = refused.format(many=many, most=most, cpus=f"{have} CPU{'s' if have != 1 else ''}")
    assert (result.returncode, result.stderr) == (2, f"error: grid point {point}: {refused}\n")
    assert not (project / "runs").exists() or not [p for p in (project / "runs").iterdir() if p.name != "sweeps"]


def test_a_slurm_job_s_gloo_processes_are_bounded_by_its_cpus(project):
    """A job's processes run on the CPUs SLURM gives it (cpus_per_task), not on this machine's."""
    bin_dir = project / "bin"  # a stand-in srun: SLURM is here, so the job's shape is what is checked
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = fslab_here("run", "nca", *TINY, "--device", "cpu", "--gpus", "9", "--executor", "slurm", cwd=project,
                        env=env)
    assert (result.returncode, result.stderr) == (2, (
        "error: --device cpu --gpus 9 (train.processes) starts 9 gloo processes, more than the 8 CPUs a SLURM job "
        "has (cpus_per_task); use --gpus 8 or fewer, or give the job more: --slurm cpus_per_task=9\n"))
    assert not (project / "runs").exists() or not any((project / "runs").iterdir())


@pytest.mark.parametrize("cpus, processes, refused", [(1, 2, False), (1, 3, True), (4, 4, False), (4, 5, True)])
def test_two_gloo_processes_are_allowed_anywhere_and_more_only_as_cpus_allow(monkeypatch, cpus, processes, refused):
    """A resumed run is told how to start again on fewer; a GPU run's processes are not CPU processes."""
    import fslab.execution.checks as checks

    monkeypatch.setattr(checks, "cpu_count", lambda: cpus)
    config = {"device": "cpu", "train": {"processes": processes}}
    again = "fslab run --like 20261202-000000-nca-abcd"
    if refused:
        with pytest.raises(UsageError, match=rf"more than the {cpus} CPUs? this machine lets fslab use; start it "
                                             rf"again on fewer: {again} --gpus {max(cpus, 2)}$"):
            check_cpu_processes(config, None, again)
    else:
        check_cpu_processes(config, None, again)
    check_cpu_processes({"device": "cuda", "train": {"processes": 64}}, None)  # GPUs: check_processes's
    local = SlurmSettings(cluster="local", cpus_per_task=64)  # a local job runs here: this machine's CPUs count
    if refused:
        with pytest.raises(UsageError, match="this machine lets fslab use"):
            check_cpu_processes(config, local)


def test_the_cpu_way_a_gpu_refusal_suggests_is_one_the_cpu_check_takes(tmp_path):
    """--gpus N on a machine without GPUs suggested --device cpu --gpus N, which the CPU check then refused
    where N is above this machine's CPUs: the suggestion is bounded as the check is."""
    allowed = max(cpu_count(), 2)
    many = allowed + 3
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    refused = fslab_here("run", "nca", *TINY, "--batch-size", str(4 * many), "--gpus", str(many), cwd=tmp_path,
                         env=env)
    assert (refused.returncode, refused.stderr) == (2, (
        f"error: --gpus {many} (train.processes) needs {many} GPUs but 0 are visible here; use --gpus 1, or "
        f"--device cpu --gpus {allowed} for {allowed} gloo processes on the CPU (slow; for testing, one per CPU "
        f"at most)\n"))
    check_cpu_processes({"device": "cpu", "train": {"processes": allowed}}, None)  # what it suggests is taken
    with pytest.raises(UsageError):  # as what it suggested before was not
        check_cpu_processes({"device": "cpu", "train": {"processes": many}}, None)



def test_gloo_processes_beyond_the_cpus_and_the_batch_are_told_the_tighter_bound(project):
    """fslab run nca --device cpu --gpus 500 (a batch of 128 by default) said 'use a batch of at least 500 rows
    or --gpus 128 at most', which the CPU check then refused on a 2-core machine: the CPUs' bound, here the
    tighter, is said first, as README says it, so that what it suggests the batch takes."""
    have = cpu_count()
    most = max(have, 2)
    result = fslab_here("run", "nca", *TINY, "--batch-size", str(2 * most + 2), "--device", "cpu", "--gpus",
                        str(4 * most + 4), cwd=project)
    cpus = f"{have} CPU{'s' if have != 1 else ''}"
    assert (result.returncode, result.stderr) == (2, (
        f"error: --device cpu --gpus {4 * most + 4} (train.processes) starts {4 * most + 4} gloo processes, more "
        f"than the {cpus} this machine lets fslab use; use --gpus {most} or fewer\n"))
