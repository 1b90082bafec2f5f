"""Storage faults are one line and lose nothing: a full disk while a run folder
is made or a checkpoint written, a damaged or refused checkpoint, a plugin
that exits at import, terminal escapes in run files."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fslab.core.errors import FslabError

from .runs_helpers import fslab_here

FIXTURE = Path(__file__).parent / "fixtures" / "runs-0.1"
RUN = "20261123-181250-nca-910d"


def fslab(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "fslab", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def one_error_line(done) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode in (1, 2) and len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_a_full_disk_while_making_a_run_leaves_no_half_made_folder(tmp_path, monkeypatch):
    from fslab.core import runstore

    def full(path, obj, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(runstore, "atomic_write_json", full)
    with pytest.raises(FslabError, match="cannot write the new run folder .*No space left on device"):
        runstore.create_run(tmp_path / "runs", "nca", {"method": "nca"})
    assert list((tmp_path / "runs").iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(FslabError, match="cannot create the runs folder"):
        runstore.create_run(tmp_path / "file" / "runs", "nca", {})


def test_a_failed_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch):
    import torch

    from fslab.training import checkpoint

    path = tmp_path / "last.pt"
    checkpoint.save_checkpoint(path, {"epoch": 1})

    def full(obj, target):
        Path(target).write_bytes(b"half")
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(FslabError, match="cannot write the checkpoint .*file write failed; the previous"):
        checkpoint.save_checkpoint(path, {"epoch": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left
    monkeypatch.undo()
    assert checkpoint.read_checkpoint(path, "cpu") == {"epoch": 1}


def test_a_checkpoint_written_in_the_background_is_the_state_when_it_was_submitted(tmp_path, monkeypatch):
    import threading

    import torch

    from fslab.training import checkpoint

    path = tmp_path / "last.pt"
    weights = torch.zeros(3)
    release = threading.Event()
    real_save = checkpoint.save_checkpoint

    def slow(target, state):  # the write waits until training has changed the weights
        release.wait(120)  # set below, once the weights changed: no time of its own decides
        real_save(target, state)

    monkeypatch.setattr(checkpoint, "save_checkpoint", slow)
    writer = checkpoint.CheckpointWriter(path)
    writer.submit({"epoch": 1, "model": {"w": weights}, "optimizer": {"state": [weights * 2]}})
    weights += 7  # the next step, in place, while the file is being written
    assert not path.exists()
    release.set()
    writer.wait()
    saved = checkpoint.read_checkpoint(path, "cpu")
    assert saved["epoch"] == 1 and torch.equal(saved["model"]["w"], torch.zeros(3))
    assert torch.equal(saved["optimizer"]["state"][0], torch.zeros(3))
    writer.submit({"epoch": 2, "model": {"w": weights}})
    writer.wait()
    assert torch.equal(checkpoint.read_checkpoint(path, "cpu")["model"]["w"], torch.full((3,), 7.0))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_a_failed_background_write_is_raised_by_the_next_call_and_keeps_the_previous(tmp_path, monkeypatch):
    import torch

    from fslab.training import checkpoint

    path = tmp_path / "last.pt"
    writer = checkpoint.CheckpointWriter(path)
    writer.submit({"epoch": 1})
    writer.wait()

    def full(obj, target):
        Path(target).write_bytes(b"half")
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(torch, "save", full)
    writer.submit({"epoch": 2})  # fails in its thread; nothing is raised yet
    with pytest.raises(FslabError, match="cannot write the checkpoint .*the previous checkpoint is kept"):
        writer.submit({"epoch": 3})  # raised before epoch 3's write starts: the run fails here
    writer.wait()  # a failure is reported once
    writer.submit({"epoch": 4})  # fails in its thread too
    writer.close()  # a run ending on another error: no second report
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    assert checkpoint.read_checkpoint(path, "cpu") == {"epoch": 1}


def test_a_checkpoint_is_on_the_disk_itself_before_it_replaces_the_last_and_after_its_event(tmp_path, monkeypatch):
    """A checkpoint was renamed over the last one without an fsync (status and results had one): a machine
    that went down (power, a hard reset) right after could keep an empty or zero-filled last.pt, and the
    run lose every epoch. Its event is flushed first, so the file never outlives it."""
    import torch

    from fslab.core import files
    from fslab.core.eventlog import EventLog
    from fslab.core.runstore import create_run
    from fslab.training.checkpoint import save_checkpoint

    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    path = run.checkpoint_path
    path.parent.mkdir(parents=True, exist_ok=True)
    synced.clear()
    save_checkpoint(path, {"epoch": 1, "model": {"w": torch.ones(3)}})
    assert synced == [str(files.temporary_path(path))]  # the whole file, before the rename
    log = EventLog(run, echo=False)
    log.write("checkpoint", epoch=1, step=7, path="checkpoints/last.pt")
    synced.clear()
    log.sync()
    assert synced == [str(run.metrics_path)]
    log.close()


class NotWeights:
    """Pickled into a checkpoint, it would run code on load; weights-only loading refuses it."""


@pytest.mark.slow
def test_damaged_and_refused_checkpoints_are_one_line(tmp_path, builtin_plugins):
    import torch

    project = tmp_path / "project"
    shutil.copytree(FIXTURE, project / "runs")
    stopped = project / "runs" / "20261123-181312-nca-018e"
    last = stopped / "checkpoints" / "last.pt"
    last.write_bytes(last.read_bytes()[:1000])  # cut short, as by a crash of a non-atomic copy
    resumed = fslab_here("resume", stopped.name, cwd=project)
    assert resumed.returncode == 2 and one_error_line(resumed) == (
        f"error: the checkpoint of run {stopped.name} is damaged (runs/{stopped.name}/checkpoints/last.pt is not a "
        f"complete checkpoint file); it cannot resume: copy it again from where the run trained, or train the run "
        f"again with: fslab run --like {stopped.name}")
    assert json.loads((stopped / "status.json").read_text())["state"] == "killed"  # nothing changed
    done = project / "runs" / RUN
    for cut in (last.read_bytes(), b""):  # fslab eval says the same (it said "[Errno 22] Invalid argument", or
        (done / "checkpoints" / "last.pt").write_bytes(cut)  # "EOFError", with exit code 1), and writes nothing
        before = (done / "metrics.jsonl").read_bytes(), sorted(p.name for p in done.iterdir())
        evaluated = fslab_here("eval", RUN, "--episodes", "5", "--queries", "5", cwd=project)
        assert evaluated.returncode == 2 and one_error_line(evaluated).startswith(
            f"error: the checkpoint of run {RUN} is damaged (runs/{RUN}/checkpoints/last.pt is not a complete "
            f"checkpoint file); it cannot be evaluated: copy it again")
        assert ((done / "metrics.jsonl").read_bytes(), sorted(p.name for p in done.iterdir())) == before
    torch.save({"epoch": 2, "model": NotWeights()}, done / "checkpoints" / "last.pt")
    line = one_error_line(fslab_here("eval", RUN, "--episodes", "5", "--queries", "5", cwd=project))
    assert "cannot be loaded: it holds objects other than tensors" in line and "would run code" in line
    assert "weights_only=False" not in line  # torch's advice, which would run the file's code


def changed_in_place(path: Path, part: str) -> None:
    """Bytes of ``path``'s zip member ``part`` (``data/0``: a tensor's bytes) changed in place, as a failing
    disk or a bad copy changes them: the file keeps its size and its zip directory, only the bytes differ."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("/" + part))
    data = bytearray(path.read_bytes())
    name_length = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little")
    extra_length = int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_length + extra_length
    data[start:start + 8] = bytes(255 - b for b in data[start:start + 8])
    path.write_bytes(bytes(data))


def test_a_checkpoint_whose_bytes_changed_is_refused_not_loaded_as_weights(tmp_path, builtin_plugins):
    """torch.load checks no CRC: a checkpoint with a tensor's bytes changed on disk loaded, and a resume
    trained on (and fslab eval scored) weights that were never trained; one whose pickle's bytes changed
    was said to hold objects that "would run code", and the resume failed in the worker with exit code 1."""
    import torch

    from fslab.training.checkpoint import CHECKPOINT_KEYS, load_checkpoint

    path = tmp_path / "last.pt"
    torch.save({**dict.fromkeys(CHECKPOINT_KEYS), "epoch": 1, "model": {"w": torch.arange(64.0)}}, path)
    assert load_checkpoint(path, "cpu")["model"]["w"].sum() == 2016
    changed_in_place(path, "data/0")
    with pytest.raises(FslabError, match=r"cannot be loaded: it has bytes changed since it was written: its part "
                                         r"data/0 fails its checksum$"):
        load_checkpoint(path, "cpu")

    project = tmp_path / "project"
    shutil.copytree(FIXTURE, project / "runs")
    stopped = project / "runs" / "20261123-181312-nca-018e"
    for part in ("data/0", "data.pkl"):
        shutil.copy(FIXTURE / stopped.name / "checkpoints" / "last.pt", stopped / "checkpoints" / "last.pt")
        changed_in_place(stopped / "checkpoints" / "last.pt", part)
        for command, doing in (("resume", "resume"), ("eval", "be evaluated"))[:2 if part == "data/0" else 1]:
            refused = fslab_here(command, stopped.name, cwd=project)
            assert refused.returncode == 2 and one_error_line(refused) == (
                f"error: the checkpoint of run {stopped.name} is damaged (runs/{stopped.name}/checkpoints/last.pt "
                f"has bytes changed since it was written: its part {part} fails its checksum); it cannot {doing}: "
                f"copy it again from where the run trained, or train the run again with: "
                f"fslab run --like {stopped.name}")
        assert json.loads((stopped / "status.json").read_text())["state"] == "killed"  # nothing changed


def test_a_plugin_that_exits_at_import_is_reported_not_obeyed(project):
    (project / "mine").mkdir()
    (project / "mine" / "quitter.py").write_text("import sys\nsys.exit(3)\n")
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    done = fslab("plugins", "--kind", "method", cwd=project)
    assert done.returncode == 1 and "nca" in done.stdout  # listed whole, then the failure's exit code
    assert "'local:quitter' failed to load: SystemExit: 3" in done.stderr


def test_escapes_in_run_files_never_reach_the_terminal(project):
    shutil.copytree(FIXTURE, project / "runs")
    folder = project / "runs" / RUN
    status = json.loads((folder / "status.json").read_text())
    (folder / "status.json").write_text(json.dumps({**status, "state": "failed", "error": "boom\x1b[2J\x07"}))
    (folder / "stderr.log").write_text("line\x1b]0;title\x07\n")
    for argv in (["show", RUN], ["runs"], ["logs", RUN, "--stderr"], ["runs", "--json"]):
        done = fslab_here(*argv, cwd=project)
        assert done.returncode == 0, done.stderr
        assert "\x1b" not in done.stdout and "\x07" not in done.stdout, argv
    assert "boom\\x1b[2J\\x07" in fslab_here("show", RUN, cwd=project).stdout


def test_a_long_value_is_clipped_in_the_error(project):
    line = one_error_line(fslab_here("run", "nca", "--set", "loss.temperature=" + "x" * 20000, cwd=project))
    assert len(line) < 1100 and "more characters" in line


def test_a_long_error_keeps_its_end_where_the_command_to_run_is():
    """Errors were cut after 400 characters, losing the command at the end of a line that names several
    runs and their holders (fslab sweep resume's nothing-to-resume line lost its second remedy)."""
    from fslab.core.text import clip

    text = "start " + "".join(f"{i:04d}" for i in range(300)) + " run fslab sweep resume abcd again"
    clipped = clip(text, 400)
    assert clipped.startswith(text[:320]) and clipped.endswith(text[-80:])
    assert clipped == f"{text[:320]}… ({len(text) - 400} more characters) …{text[-80:]}"
    assert clip(text, len(text)) == text


def test_a_host_copy_keeps_every_container_s_type_and_shares_no_tensor():
    from collections import Counter, OrderedDict, namedtuple

    import torch

    from fslab.training.checkpoint import host_copy

    weights = OrderedDict(w=torch.ones(2))
    weights._metadata = {"": {"version": 1}}  # as Module.state_dict() leaves it
    pair = namedtuple("Pair", "first second")(torch.zeros(1), 3)
    state = {"model": weights, "milestones": Counter({70: 1, 90: 1}), "rng": (3, [1, 2], None), "pair": pair}
    copied = host_copy(state)
    assert type(copied["model"]) is OrderedDict and copied["model"]._metadata == {"": {"version": 1}}
    assert type(copied["milestones"]) is Counter and copied["milestones"][50] == 0
    assert copied["rng"] == (3, [1, 2], None) and type(copied["pair"]).__name__ == "Pair"
    weights["w"] += 1  # training goes on in place
    pair.first.add_(5)
    assert torch.equal(copied["model"]["w"], torch.ones(2)) and torch.equal(copied["pair"].first, torch.zeros(1))


def test_any_error_of_a_background_write_reaches_the_training_thread(tmp_path, monkeypatch):
    import torch

    from fslab.training import checkpoint

    def broken(obj, target):
        Path(target).write_bytes(b"half")
        raise TypeError("cannot pickle 'generator' object")

    monkeypatch.setattr(torch, "save", broken)
    writer = checkpoint.CheckpointWriter(tmp_path / "last.pt")
    writer.submit({"epoch": 1})
    with pytest.raises(TypeError, match="cannot pickle"):
        writer.wait()
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_is_announced_before_its_write_starts_and_a_stop_there_writes_nothing(tmp_path, monkeypatch):
    from fslab.training import checkpoint

    path = tmp_path / "last.pt"
    order = []
    real_save = checkpoint.save_checkpoint
    monkeypatch.setattr(checkpoint, "save_checkpoint", lambda target, state: (order.append(f"write {state['epoch']}"),
                                                                               real_save(target, state)))
    writer = checkpoint.CheckpointWriter(path)
    writer.submit({"epoch": 1}, announce=lambda: order.append("event 1"))
    writer.wait()
    assert order == ["event 1", "write 1"]  # the events name every epoch the file can hold

    class Stopped(BaseException):
        pass

    def stop_arrives():
        order.append("event 2")
        raise Stopped  # the signal lands just after the event is written

    with pytest.raises(Stopped):
        writer.submit({"epoch": 2}, announce=stop_arrives)
    writer.close()
    assert order == ["event 1", "write 1", "event 2"]
    assert checkpoint.read_checkpoint(path, "cpu") == {"epoch": 1}  # a resume from epoch 1 finds its event


def test_a_feature_cache_fslab_did_not_write_whole_is_embedded_again(tmp_path):
    """A cache cut short, emptied or replaced was a traceback in fslab eval (an empty one: 'aborted')."""
    import torch

    from fslab.training.run_eval import cached_features

    cache = tmp_path / "test-epoch1.pt"
    features, labels = torch.randn(6, 4), torch.arange(6) % 3
    torch.save({"features": features, "labels": labels, "epoch": 1}, cache)
    kept = cached_features(cache)
    assert kept is not None and torch.equal(kept[0], features) and torch.equal(kept[1], labels)
    whole = cache.read_bytes()
    for damaged in [whole[:200], b"", {"labels": labels}, [1, 2], {"features": features[:4], "labels": labels},
                    {"features": features, "labels": labels.float()}, {"features": features[0], "labels": labels[:4]}]:
        if isinstance(damaged, bytes):
            cache.write_bytes(damaged)
        else:
            torch.save(damaged, cache)
        assert cached_features(cache) is None, damaged
    cache.unlink()
    cache.mkdir()
    assert cached_features(cache) is None and cached_features(tmp_path / "none.pt") is None


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGUSR2"])
def test_a_stop_signal_during_the_event_lands_once_the_write_is_under_way(tmp_path, signame):
    """SIGTERM (fslab stop) or SIGUSR2 (a SLURM preemption, which submitit's handler turns into
    SystemExit and a requeue) sent while the checkpoint's event is logged: the handler runs after
    the write has started, so the stopping run keeps the checkpoint its events name (the first
    epoch's included). SIGUSR2 was not held: a preempted job left the event without its file, and
    the requeued job, finding no checkpoint, trained the run again from its first step."""
    import signal

    from fslab.training import checkpoint

    signum = getattr(signal, signame)

    class Stopped(BaseException):
        pass

    def handler(signum, frame):
        raise Stopped

    path = tmp_path / "last.pt"
    writer = checkpoint.CheckpointWriter(path)
    before = signal.signal(signum, handler)
    try:
        with pytest.raises(Stopped):
            writer.submit({"epoch": 1}, announce=lambda: os.kill(os.getpid(), signum))
        writer.close()  # as the stopping run does
    finally:
        signal.signal(signum, before)
    assert checkpoint.read_checkpoint(path, "cpu") == {"epoch": 1}


def test_a_write_that_the_folder_refuses_names_the_file_not_its_temporary(tmp_path):
    """On a read-only store, fslab stop of another host's run said `runs/ID/..stop-request.PID.tmp`:
    the temporary file's name, from removing it again, which the folder refused too. (Here a file
    stands where the folder should be: both fail alike, as root too.)"""
    from fslab.core.files import atomic_write_json

    (tmp_path / "run").write_text("")
    target = tmp_path / "run" / ".stop-request"
    with pytest.raises(NotADirectoryError) as caught:
        atomic_write_json(target, {"host": "elsewhere"})
    assert caught.value.filename == str(target) and caught.value.errno == errno.ENOTDIR


def test_a_checkpoint_is_read_for_its_checksums_once_per_process_unless_rewritten(tmp_path, monkeypatch):
    """fslab eval checked the CRCs of every part of the checkpoint three times (the CLI's check before torch
    loads, the evaluation's, the load): three reads of a file of hundreds of megabytes at the papers' sizes."""
    import time
    import zipfile

    from fslab.core import files

    reads = []
    testzip = zipfile.ZipFile.testzip
    monkeypatch.setattr(zipfile.ZipFile, "testzip", lambda self: reads.append(1) or testzip(self))
    path = tmp_path / "last.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("last/data/0", b"\0" * 64)
    long_ago = time.time_ns() - 60 * 10**9
    os.utime(path, ns=(long_ago, long_ago))
    assert [files.archive_damage(path) for _ in range(3)] == [None] * 3 and len(reads) == 1
    changed_in_place(path, "data/0")  # written now: the time of a change is coarse, so a fresh file is read again
    assert files.archive_damage(path).endswith("its part data/0 fails its checksum") and len(reads) == 2
    assert files.archive_damage(path).endswith("fails its checksum") and len(reads) == 3
    os.utime(path, ns=(long_ago + 1, long_ago + 1))  # old enough again: the answer stands for the process
    assert files.archive_damage(path).endswith("fails its checksum") and len(reads) == 4
    assert files.archive_damage(path).endswith("fails its checksum") and len(reads) == 4


def test_fslab_eval_removes_the_feature_file_a_killed_fslab_eval_left_half_written(project):
    """An fslab eval killed as it wrote a split's features (SIGKILL, the out-of-memory killer) left its
    .NAME.PID.tmp in features/ for good: only a worker's start removes such files, and a completed run starts
    none. The next fslab eval of the run removes it; the file of an fslab eval still writing is left."""
    from tests.runs_helpers import fslab_here

    shutil.copytree(FIXTURE / RUN, project / "runs" / RUN)
    features = project / "runs" / RUN / "features"
    features.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = features / f".test-features.pt.{int(gone.stdout)}.tmp"
    killed.write_bytes(b"\0" * 4096)  # half a feature cache
    writing = features / f".test-features.pt.{os.getppid()}.tmp"  # a live process's
    writing.write_bytes(b"\0" * 4096)
    evaluated = fslab_here("eval", RUN, "--episodes", "5", "--queries", "5", "--shots", "1", cwd=project)
    assert evaluated.returncode == 0, evaluated.stderr
    assert not killed.exists() and writing.exists()
    assert [p.name for p in features.iterdir() if p.suffix == ".pt"]  # and the split's features were cached


def test_fslab_eval_on_a_runs_folder_nodes_share_leaves_another_nodes_live_write(project):
    """A runs folder shared between a cluster's nodes: fslab eval on one node removed the feature file another
    node's fslab eval of the run was writing, because its pid ran no process here. Another host's temporary
    file is removed only once untouched for a day (its node lost); this host's killed writer's at once."""
    from fslab.core import files, states

    shutil.copytree(FIXTURE / RUN, project / "runs" / RUN)
    features = project / "runs" / RUN / "features"
    features.mkdir()
    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    writing = features / f".val-features.pt.{gone}@another-node.tmp"  # its pid: no process here
    lost = features / f".train-features.pt.{gone}@another-node.tmp"
    killed = features / f".test-features.pt.{gone}@{states.HOST}.tmp"
    for path in (writing, lost, killed):
        path.write_bytes(b"\0" * 4096)
    then = time.time() - files.OTHER_HOST_GONE_AFTER_S - 60
    os.utime(lost, (then, then))
    evaluated = fslab_here("eval", RUN, "--episodes", "5", "--queries", "5", "--shots", "1", cwd=project)
    assert evaluated.returncode == 0, evaluated.stderr
    assert [p.exists() for p in (writing, lost, killed)] == [True, False, False]


@pytest.mark.slow
def test_a_first_checkpoint_the_disk_refuses_is_said_as_that_not_as_a_stop_before_it(project):
    """A run whose first checkpoint the disk refused (full; here past the file-size limit, RLIMIT_FSIZE,
    which the worker inherits) failed saying `the previous checkpoint is kept`, where there was none, and
    fslab resume said it `stopped before its first epoch ended`, where the epoch had ended and its
    checkpoint been announced."""
    import resource

    from .runs_helpers import TINY

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))  # the events fit; the checkpoint, 43 kB, not

    done = subprocess.run([sys.executable, "-m", "fslab", "run", "nca", *TINY, "--epochs", "1", "--detach"],
                          cwd=project, capture_output=True, text=True, timeout=300, preexec_fn=limited)
    assert done.returncode == 0, done.stderr
    run = project / "runs" / done.stdout.strip()
    status = {}
    deadline = time.monotonic() + 240
    while status.get("state") not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.2)
        status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed" and status["error"].startswith("cannot write the checkpoint "), status
    assert status["error"].endswith("; the run has no earlier checkpoint"), status["error"]
    line = one_error_line(fslab("resume", run.name, cwd=project))
    assert line == (f"error: run {run.name} has no checkpoint (it stopped after its first epoch ended, its first "
                    f"checkpoint's write having failed: fslab show {run.name} says why); start it again with the "
                    f"same settings: fslab run --like {run.name}")
    assert not (run / "checkpoints" / "last.pt").exists() and not list(run.rglob(".*.tmp"))
