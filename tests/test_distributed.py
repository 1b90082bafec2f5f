"""--gpus N: N processes train exactly as one process on the whole batch.

Two gloo processes on the CPU each embed half of a global batch (the real
training step: augmentation drawn for the global batch, GlobalBatchNorm,
gather_with_grad, DistributedDataParallel); their loss, pair counts, every
parameter gradient and the batch-norm running statistics after one backward
pass must equal one process on the full batch, DropBlock's random blocks included.
"""

from __future__ import annotations

import json
import os
import socket
import textwrap

import pytest

from .runs_helpers import TINY, events, fslab, fslab_here, wait_for

# Its runs of --gpus 2 start torchrun, whose torchelastic_* folder goes under each test's tmp_path, not /tmp.
pytestmark = pytest.mark.usefixtures("torchrun_tmp")

# (name, episodic): every case runs one step of its loss on a batch of 15 or 16 rows.
CASES = [("nca", False), ("map-ssvm", False), ("supcon", False), ("classifier", False),
         ("protonet", True), ("lpn", True)]
CLASSES = 4


def make_loss(name):
    from fslab_plugins.methods.classifier import LinearClassifierLoss
    from fslab_plugins.methods.map import map_ssvm
    from fslab_plugins.methods.nca import nca, supcon
    from fslab_plugins.methods.protonet import protonet
    from fslab_plugins.methods.triplet_loss import LargeMarginProtoNet

    return {"nca": nca, "map-ssvm": map_ssvm, "supcon": supcon, "protonet": protonet,
            "classifier": LinearClassifierLoss(6, CLASSES), "lpn": LargeMarginProtoNet(positives=3, negatives=3)}[name]


def make_batch(episodic: bool):
    """uint8 images, labels and support mask of one global batch. The episode
    (3 ways × (2 shots + 3 queries) = 15 rows) splits 8/7, across a class."""
    import torch

    g = torch.Generator().manual_seed(7)
    if episodic:
        labels = torch.tensor([c for c in (2, 0, 3) for _ in range(5)])
        support = torch.tensor([True, True, False, False, False] * 3)
    else:
        labels = torch.arange(16) % CLASSES
        labels = labels[torch.randperm(16, generator=g)]
        support = None
    images = torch.randint(0, 256, (labels.numel(), 3, 8, 8), generator=g, dtype=torch.uint8)
    return images, labels, support


def one_step(world, name, episodic):
    """Loss, pair counts, gradients and running statistics after one backward
    pass of the training step, as ``fslab.training.train`` runs it on this rank."""
    import torch
    from fslab_plugins.backbones.networks import DropBlock

    from fslab.training import distributed
    from fslab.training.augment import augment
    from fslab.training.build import to_input

    torch.manual_seed(3)
    # DropBlock draws noise per row and rescales by a count over the batch: both must be the global batch's
    backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                   DropBlock(0.3, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(1),
                                   torch.nn.Linear(4, 6))
    loss_fn = make_loss(name)
    device = torch.device("cpu")
    backbone = distributed.synchronise_batch_norm(backbone, world, device)
    step = distributed.training_step(backbone, torch.nn.Identity(), loss_fn, world, device)
    images, labels, support = make_batch(episodic)
    own = world.rows(labels.numel())
    x = augment(to_input(images[own]), 1, True, torch.Generator().manual_seed(5), part=own, total=labels.numel())
    torch.manual_seed(11)  # the triplet sampler draws from the global generator: the same on every rank
    out = step(x, labels, support)
    out.loss.backward()
    params = list(backbone.named_parameters())
    if isinstance(loss_fn, torch.nn.Module):
        params += [(f"loss.{n}", p) for n, p in loss_fn.named_parameters()]
    bn = backbone[1]
    return {"loss": out.loss.item(), "positives": int(out.positives), "negatives": int(out.negatives),
            "grads": {n: p.grad.clone() for n, p in params},
            "running": torch.cat([bn.running_mean, bn.running_var]).clone(), "bn": type(bn).__name__}


def rank_main(rank, size, port, folder):
    """One of the spawned processes: join the gloo group, run every case."""
    import torch

    from fslab.training import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    world, _ = distributed.start("cpu", distributed.World(rank, rank, size))
    results = {name: one_step(world, name, episodic) for name, episodic in CASES}
    torch.save(results, os.path.join(folder, f"rank{rank}.pt"))
    distributed.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_world_splits_a_batch_into_contiguous_rows():
    from fslab.training.distributed import World

    assert [World(r, r, 2).rows(15) for r in range(2)] == [slice(0, 8), slice(8, 15)]
    assert World(0, 0, 3).counts(16) == [6, 5, 5]
    with pytest.raises(RuntimeError, match="cannot be split over 4 processes"):
        World(0, 0, 4).rows(3)


def test_augment_of_a_slice_equals_that_slice_of_the_whole_batch():
    import torch

    from fslab.training.augment import augment

    x = torch.randn(10, 3, 6, 6)
    whole = augment(x, 2, True, torch.Generator().manual_seed(1))
    part = augment(x[4:9], 2, True, torch.Generator().manual_seed(1), part=slice(4, 9), total=10)
    assert torch.equal(part, whole[4:9])


def test_two_gloo_processes_match_one_process_on_the_full_batch(tmp_path):
    import torch
    import torch.multiprocessing as mp

    from fslab.training.distributed import World

    mp.spawn(rank_main, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for name, episodic in CASES:
        single = one_step(World(), name, episodic)
        assert single["bn"] == "BatchNorm2d"
        for result in ranks:
            got = result[name]
            assert got["bn"] == "GlobalBatchNorm"
            assert got["loss"] == pytest.approx(single["loss"], rel=1e-5), name
            assert (got["positives"], got["negatives"]) == (single["positives"], single["negatives"]), name
            assert got["grads"].keys() == single["grads"].keys()
            for param, grad in single["grads"].items():
                assert torch.allclose(got["grads"][param], grad, rtol=1e-4, atol=1e-6), (name, param)
            assert torch.allclose(got["running"], single["running"], rtol=1e-5, atol=1e-6), name
    # the counts are the global batch's, not a half's: 4 classes x 4 rows -> 4 * C(4, 2) positive pairs
    assert ranks[0]["nca"]["positives"] == 24 and ranks[0]["nca"]["negatives"] == 96


def test_gpus_beyond_the_visible_ones_is_one_clear_line(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = fslab_here("run", "nca", "--gpus", "2", "--epochs", "1", cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --gpus 2 (train.processes) needs 2 GPUs but 0 are visible here; use --gpus 1, or --device cpu "
        "--gpus 2 for 2 gloo processes on the CPU (slow; for testing)"
    ]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_gpus_from_fslab_toml_name_the_file(tmp_path):
    # the line named --gpus only, so the file's [run] train.processes was not found in it to be named
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    (tmp_path / "fslab.toml").write_text("[run.train]\nprocesses = 2\n")
    done = fslab_here("run", "nca", "--epochs", "1", cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --gpus 2 (train.processes) needs 2 GPUs but 0 are visible here; use --gpus 1, or --device cpu "
        "--gpus 2 for 2 gloo processes on the CPU (slow; for testing) (set by train.processes in [run] of fslab.toml)"
    ]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_more_processes_than_rows_of_a_batch_is_one_clear_line(tmp_path):
    """Each process embeds a share of every batch: 3 processes and a batch of 2 rows started a run whose
    ranks failed at their first step; a sweep or a SLURM job is refused the same way, before anything exists."""
    for executor in ([], ["--executor", "slurm"]):
        done = fslab_here("run", "nca", "--device", "cpu", "--gpus", "3", "--set", "train.batch_size=2", *executor,
                          cwd=tmp_path)
        assert done.returncode == 2
        assert done.stderr.strip().splitlines() == [
            "error: --gpus 3 (train.processes) splits each batch of 2 rows (train.batch_size) over 3 processes, "
            "one row each at least; use a batch of at least 3 rows or --gpus 2 at most"
        ]
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
        (tmp_path / "fslab.toml").write_text("[slurm]\ncluster = 'local'\n")


def train_losses(run_dir):
    return [(e["step"], e["loss"], e["positives"], e["negatives"]) for e in events(run_dir, "train")]


def only_run(folder):
    runs = [p for p in (folder / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1
    return runs[0]


@pytest.mark.slow
def test_cli_run_on_two_gloo_processes_trains_like_one(tmp_path):
    """conv4 has batch norm: GlobalBatchNorm makes the two runs agree to float rounding.
    The first two losses (the forward pass, then one update with the gathered
    gradients) agree to 1e-5; rounding differences then grow with training."""
    losses = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as torchrun sets it for its ranks: the same kernels
    for processes in (1, 2):
        folder = tmp_path / f"p{processes}"
        folder.mkdir()
        done = fslab("run", "nca", "--device", "cpu", "--gpus", str(processes), "--epochs", "2", *TINY,
                     cwd=folder, env=env)
        assert done.returncode == 0, done.stderr
        run_dir = only_run(folder)
        status = json.loads((run_dir / "status.json").read_text())
        assert status["state"] == "completed" and status["processes"] == processes
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == len(set(lines))  # rank 1 wrote nothing
        kinds = [json.loads(line)["event"] for line in lines]
        assert kinds.count("start") == 1 and kinds.count("end") == 1 and kinds.count("checkpoint") == 2
        losses[processes] = train_losses(run_dir)
    one, two = losses[1], losses[2]
    assert [s for s, *_ in two] == list(range(1, len(two) + 1)) and len(two) == len(one) > 2
    for number, ((step1, loss1, pos1, neg1), (step2, loss2, pos2, neg2)) in enumerate(zip(one, two)):
        assert (step1, pos1, neg1) == (step2, pos2, neg2)
        assert loss2 == pytest.approx(loss1, rel=1e-5 if number < 2 else 1e-3), f"step {step1}"


def test_a_run_of_two_processes_leaves_nothing_in_the_temporary_folder(tmp_path, torchrun_tmp):
    """torchrun, given no log folder, made one with tempfile.mkdtemp(prefix="torchelastic_") in the user's
    temporary folder (TMPDIR, else /tmp) for each run of several processes and never removed it: one more
    folder in /tmp for every --gpus N run. Its log folder is now the run's .torchrun, removed when it ends. What
    stays is torch's compile cache, one folder per user (torchinductor_USER) that every run reuses."""
    done = fslab("run", "nca", "--device", "cpu", "--gpus", "2", "--epochs", "1", *TINY, cwd=tmp_path,
                 timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    run_dir = only_run(tmp_path)
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"
    assert [p.name for p in torchrun_tmp.iterdir() if not p.name.startswith("torchinductor_")] == []
    assert not (run_dir / ".torchrun").exists()


@pytest.mark.slow
def test_stop_ends_every_rank_and_resume_continues_under_torchrun(tmp_path):
    from fslab.core.states import pid_alive
    from fslab.execution.local import child_pids

    started = fslab("run", "nca", "--device", "cpu", "--gpus", "2", "--epochs", "500", "-d", *TINY, cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    run_dir = only_run(tmp_path)
    wait_for(lambda: events(run_dir, "checkpoint"), timeout=120, what="the first checkpoint")
    status = json.loads((run_dir / "status.json").read_text())
    launcher, ranks = status["pid"], child_pids(status["pid"])
    assert status["processes"] == 2 and len(ranks) == 2  # the pid is torchrun's; its children are the ranks
    stopped = fslab_here("stop", run_dir.name, cwd=tmp_path)
    assert stopped.returncode == 0 and stopped.stdout.strip().endswith("killed"), stopped.stderr
    wait_for(lambda: not any(pid_alive(p) for p in [launcher, *ranks]), timeout=120, what="every rank to exit")
    last = events(run_dir, "train")[-1]["step"]

    resumed = fslab("resume", run_dir.name, "-d", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    wait_for(lambda: len(events(run_dir, "train")) > last + 3 and events(run_dir, "resume"), timeout=120,
             what="training to go on after the resume")
    status = json.loads((run_dir / "status.json").read_text())
    assert status["processes"] == 2 and status["pid"] != launcher and len(child_pids(status["pid"])) == 2
    fslab_here("stop", run_dir.name, cwd=tmp_path)
    wait_for(lambda: not pid_alive(status["pid"]), timeout=120, what="torchrun to exit")
    # a clean stop: the ranks' line, and no traceback of torchrun's own SignalException after it
    assert "Traceback" not in (run_dir / "stderr.log").read_text()
    steps = [e["step"] for e in events(run_dir, "train")]
    assert steps == list(range(1, len(steps) + 1))  # cut back to the checkpoint, continued without a gap
    assert json.loads((run_dir / "status.json").read_text())["state"] == "killed"
    assert not (run_dir / ".torchrun").exists()  # torchrun's log folder, removed on a stop too


RANK_ONE_FAILS = """
    import os

    from fslab.plugin import hookimpl
    from fslab_plugins.methods.nca import nca


    def rank_one_fails(z, labels, support=None):
        if os.environ.get("RANK") == "1":
            raise RuntimeError("boom on rank 1")
        return nca(z, labels, support)


    @hookimpl
    def register_losses(register):
        register(rank_one_fails, name="rank-one-fails", description="fails on rank 1 only")
"""


@pytest.mark.slow
def test_a_rank_that_fails_fails_the_run_with_its_error(tmp_path):
    """Not `killed` (torchrun's SIGTERM to rank 0) nor rank 0's broken collective: the failed rank's line."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "boom.py").write_text(textwrap.dedent(RANK_ONE_FAILS))
    (tmp_path / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    done = fslab("run", "nca", "--device", "cpu", "--gpus", "2", *TINY, "--set", "loss.name=rank-one-fails",
                 cwd=tmp_path, timeout=180)
    assert done.returncode == 1
    status = json.loads((only_run(tmp_path) / "status.json").read_text())
    assert (status["state"], status["exit_code"]) == ("failed", 1)
    assert status["error"] == ("rank 1 failed: loss 'rank-one-fails' from plugin 'local:boom' failed: RuntimeError: "
                               "boom on rank 1")
    assert "boom on rank 1" in done.stderr


RANK_ONE_IS_KILLED = """
    import os
    import signal
    import subprocess
    import sys

    from fslab.plugin import hookimpl
    from fslab_plugins.methods.nca import nca

    # Another process, since rank 1 holds the GIL while it waits at the barrier for rank 0's validation.
    WATCH = "import os, signal, sys, time\\n" \\
            "while time.time() - os.path.getmtime('rank1.step') < 0.5: time.sleep(0.05)\\n" \\
            "os.kill(int(sys.argv[1]), signal.SIGKILL)"
    CALLS = [0]


    def rank_one_is_killed(z, labels, support=None):
        if os.environ.get("RANK") == "1":
            CALLS[0] += 1
            if CALLS[0] == 3 and os.environ["KILL_RANK_ONE"] == "step":
                os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer ends a process: no word
            with open("rank1.step", "w"):  # once no step came for half a second, rank 1 is killed
                pass
            if CALLS[0] == 1 and os.environ["KILL_RANK_ONE"] == "validation":
                subprocess.Popen([sys.executable, "-c", WATCH, str(os.getpid())])
        return nca(z, labels, support)


    @hookimpl
    def register_losses(register):
        register(rank_one_is_killed, name="rank-one-is-killed", description="SIGKILL on rank 1 in a step or validation")
"""


@pytest.mark.slow
@pytest.mark.parametrize("when", ["step", "validation"])
def test_a_rank_killed_without_a_word_fails_the_run_naming_it(tmp_path, when):
    """Rank 1 leaves no error of its own: the run is not failed with rank 0's broken collective
    (killed in a step) nor `killed` (in rank 0's validation, where torchrun's SIGTERM to rank 0
    comes first and read as a stop), but failed by rank 1's end."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "kill.py").write_text(textwrap.dedent(RANK_ONE_IS_KILLED))
    (tmp_path / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    done = fslab("run", "nca", "--device", "cpu", "--gpus", "2", *TINY, "--set", "loss.name=rank-one-is-killed",
                 # a validation of some seconds: 50,000 episodes took about 0.5 s, the watch's own
                 # threshold, so rank 1 was at times never seen idle and the run completed
                 "--set", "eval.val_episodes=300000", "--epochs", "2", cwd=tmp_path, timeout=180,
                 env={**os.environ, "KILL_RANK_ONE": when})
    assert done.returncode == 1
    status = json.loads((only_run(tmp_path) / "status.json").read_text())
    assert (status["state"], status["exit_code"]) == ("failed", 1)
    assert status["error"].startswith("rank 1 ended without a word"), status["error"]
    assert "rank 1 ended without a word" in done.stderr


@pytest.mark.parametrize("rank", [0, 1])
def test_a_step_broken_after_torchrun_ended_names_torchrun_not_the_collective(tmp_path, monkeypatch, rank):
    """torchrun SIGKILLed: the rank whose watch saw it gone first stops, which breaks the other rank's
    collective before that rank's own watch (once a second) saw anything. That rank is parented elsewhere
    by then: rank 0 fails the run naming torchrun's end, rank 1 leaves no error line of its own (CI once
    recorded gloo's "Connection closed by peer" as the run's error)."""
    import subprocess
    import sys

    from fslab.core.runstore import create_run
    from fslab.execution import worker

    run = create_run(tmp_path / "runs", "nca", {"method": "nca", "train": {"heartbeat": 60}})
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    torchrun = int(ended.stdout)  # a process that is gone, as the torchrun this rank started under
    for name, value in (("TORCHELASTIC_RUN_ID", "x"), ("WORLD_SIZE", "2"), ("RANK", str(rank))):
        monkeypatch.setenv(name, value)

    def broken(run, resume=False, listeners=()):
        raise RuntimeError("[gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:11454")

    monkeypatch.setattr(worker, "watch_torchrun", lambda: worker._torchrun.append(torchrun))
    monkeypatch.setattr(worker, "_torchrun", [])
    monkeypatch.setattr(worker, "stop_on_signals", lambda: None)
    monkeypatch.setattr(worker, "take_worker_lock", lambda run: 99)
    monkeypatch.setattr(worker, "import_train", lambda: broken)
    assert worker.main([str(run.path)]) == 1
    if rank == 0:
        assert run.status()["error"] == (f"torchrun (pid {torchrun}), which ran the run's 2 processes, ended without "
                                         f"a word (killed by a signal, as the out-of-memory killer kills, or "
                                         f"crashed), and its ranks stopped with it")
    else:
        assert not (run.path / worker.RANK_FAILED).exists() and (run.path / worker.RANK_ENDED.format(1)).exists()


@pytest.mark.slow
def test_torchrun_killed_without_a_word_fails_the_run_naming_it(tmp_path):
    """torchrun SIGKILLed (as the out-of-memory killer ends a process) cannot pass a stop on: its ranks stop
    themselves on seeing it gone, and the run failed rather than ended `killed` "stopped by SIGTERM", a stop
    nobody asked for. It resumes from its checkpoint as any failed run does."""
    import signal

    from fslab.core.states import pid_alive
    from fslab.execution.local import child_pids

    started = fslab("run", "nca", "--device", "cpu", "--gpus", "2", "--epochs", "500", "-d", *TINY, cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    run_dir = only_run(tmp_path)
    wait_for(lambda: events(run_dir, "checkpoint"), timeout=120, what="the first checkpoint")
    torchrun = json.loads((run_dir / "status.json").read_text())["pid"]
    ranks = child_pids(torchrun)
    os.kill(torchrun, signal.SIGKILL)
    wait_for(lambda: not any(pid_alive(p) for p in ranks), timeout=120, what="every rank to stop")
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["state"], status["exit_code"]) == ("failed", 1), status
    assert status["error"] == (f"torchrun (pid {torchrun}), which ran the run's 2 processes, ended without a word "
                               f"(killed by a signal, as the out-of-memory killer kills, or crashed), and its ranks "
                               f"stopped with it")
    resumed = fslab("resume", run_dir.name, "-d", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    wait_for(lambda: events(run_dir, "resume"), timeout=120, what="the resumed run")
    fslab_here("stop", run_dir.name, cwd=tmp_path)
    assert json.loads((run_dir / "status.json").read_text())["state"] == "killed"
