"""The faults and the bad inputs, each a function of a fresh :class:`Lab`.

A fault scenario returns a line saying what happened; it raises
:class:`Unhandled` if fslab did not handle it as it promises, :class:`DataLost`
if a run lost anything it had, :class:`Skipped` if this machine cannot stage
it. A bad input must be refused with exit code 2, one ``error:`` line and no
run folder made.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

from tests.faults.lab import RUN_ARGS, DataLost, Lab, check, fill, mounted
from tests.runs_helpers import TINY

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "runs-0.1"


def kill_worker(lab: Lab, signum: int) -> str:
    run = lab.start()
    lab.first_checkpoint(run)
    os.kill(lab.status(run)["pid"], signum)
    expected = "lost" if signum == signal.SIGKILL else "killed"
    lab.wait(lambda: lab.state(run) == expected, timeout=30, what=f"the run to be {expected}")
    check(zip_intact(run), "the checkpoint did not survive", DataLost)
    done = lab.fslab("resume", run.name)
    check(done.returncode == 0, f"resume failed: {done.stderr.strip()[-300:]}")
    lab.intact(run)
    return f"{expected}, then resumed to the end"


def worker_sigkill(lab: Lab) -> str:
    return kill_worker(lab, signal.SIGKILL)


def worker_sigterm(lab: Lab) -> str:
    return kill_worker(lab, signal.SIGTERM)


def kill_parent(lab: Lab, signum: int) -> str:
    """``fslab run`` in the foreground is killed outright (SIGKILL: nothing can be
    done there); its worker, in a session of its own, trains on to the end."""
    parent = lab.popen("run", "nca", *RUN_ARGS)
    run = lab.wait(lambda: next(iter(sorted(lab.runs_dir.glob("2*"))), None), what="the run folder")
    lab.first_checkpoint(run)
    parent.send_signal(signum)
    parent.wait(30)
    check(lab.ended(run) == "completed", f"the run ended {lab.status(run).get('state')}")
    lab.intact(run)
    return "the worker trained on to the end"


def parent_sigkill(lab: Lab) -> str:
    return kill_parent(lab, signal.SIGKILL)


def parent_sigterm(lab: Lab) -> str:
    """``fslab run`` terminated (``kill``, ``timeout``): it stops its worker as Ctrl-C
    does, rather than leave it training with no one following; the run resumes whole."""
    parent = lab.popen("run", "nca", *RUN_ARGS)
    run = lab.wait(lambda: next(iter(sorted(lab.runs_dir.glob("2*"))), None), what="the run folder")
    lab.first_checkpoint(run)
    parent.send_signal(signal.SIGTERM)
    check(parent.wait(60) == 143, f"fslab run exited with {parent.returncode}, not 143")
    check(lab.ended(run) == "killed", f"the run ended {lab.status(run).get('state')}")
    lab.succeeds("resume", run.name, what="resume after the stop")
    lab.intact(run)
    return "the worker stopped as at Ctrl-C (exit 143), then resumed to the end"


def paused_worker(lab: Lab) -> str:
    run = lab.start()
    lab.first_checkpoint(run)
    pid = lab.status(run)["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        line = lab.one_line(lab.fslab("resume", run.name), 2)
        check("live worker" in line, f"resume said: {line}")
        lab.succeeds("stop", run.name, what="stop")
    finally:
        os.kill(pid, signal.SIGCONT)
    check(lab.ended(run) == "killed", "the paused run did not end killed")
    lab.succeeds("resume", run.name, what="resume after the stop")
    lab.intact(run)
    return "resume refused while paused; stopped, then resumed to the end"


def dies_before_its_first_status_write(lab: Lab) -> str:
    """A worker that dies at start-up (here, in its site customisation)."""
    folder = lab.folder / "crash"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        "import os, sys\nif 'fslab.execution.worker' in sys.orig_argv:\n    os._exit(3)\n")
    run = lab.start(env={"PYTHONPATH": str(folder)})
    lab.wait(lambda: lab.state(run) == "lost", timeout=5, what="the run to be lost")
    lab.one_line(lab.fslab("resume", run.name), 2)
    lab.one_line(lab.fslab("stop", run.name), 2)
    return "lost within seconds; resume and stop refuse in one line"


def two_resumes_at_once(lab: Lab) -> str:
    run = lab.start()
    lab.first_checkpoint(run)
    lab.succeeds("stop", run.name, what="stop")
    racers = [lab.popen("resume", run.name, "--detach") for _ in range(2)]
    said = sorted((p.wait(60), p.stderr.read().strip()[-300:]) for p in racers)
    codes = [code for code, _ in said]
    check(codes == [0, 2], f"exit codes {codes}: not exactly one resume; their stderr: {[err for _, err in said]}")
    check(lab.ended(run) == "completed", "the resumed run did not complete")
    check(len(lab.events(run, "resume")) == 1, "more than one worker resumed the run", DataLost)
    lab.intact(run)
    return "one resumed, the other refused in one line"


def stop_across_hosts(lab: Lab) -> str:
    from fslab.core.files import atomic_write_json

    run = lab.start("--epochs", "40")
    lab.first_checkpoint(run)
    bystander = subprocess.Popen(["sleep", "120"])
    try:
        for _ in range(20):  # the worker's heartbeat merges into the edited status
            atomic_write_json(run / "status.json", {**lab.status(run), "host": "another-host", "pid": bystander.pid})
        lab.succeeds("stop", run.name, what="stop")
        check(bystander.poll() is None, "an unrelated local process was signalled")
    finally:
        bystander.kill()
        bystander.wait()
    check(lab.ended(run) == "killed", "the run did not end killed")
    check(zip_intact(run), "the checkpoint did not survive", DataLost)
    return "stopped through the run folder; the unrelated pid untouched"


def damaged_files(lab: Lab) -> str:
    shutil.copytree(FIXTURE, lab.runs_dir)
    names = sorted(p.name for p in lab.runs_dir.iterdir() if p.is_dir())
    damage = [("config.json", '"hello"'), ("status.json", '{"state": "comp'), ("results.json", "[1,2]"),
              ("metrics.jsonl", '{"event":"train","step":1,"epoch":1,"loss":"x"}\n')]
    for name, (file, text) in zip(names, damage):
        (lab.runs_dir / name / file).write_text(text)
    for argv in (["runs", "--all"], ["runs", "--json", "--all"], ["compare", "all", "--queries", "5"], ["queue"],
                 *(["show", n] for n in names)):
        done = lab.fslab(*argv)
        check("Traceback" not in done.stderr and done.returncode in (0, 2), f"{argv}: {done.stderr.strip()[-200:]}")
    rows = [json.loads(line) for line in lab.fslab("runs", "--json", "--all").stdout.splitlines()]
    check(len(rows) == len(names), f"{len(rows)} of {len(names)} runs listed")
    return f"{len(names)} damaged runs listed, shown and compared beside the others"


def unreadable_folder(lab: Lab) -> str:
    shutil.copytree(FIXTURE, lab.runs_dir)
    hidden = sorted(p for p in lab.runs_dir.iterdir() if p.is_dir())[1]
    env = {}
    if os.geteuid() == 0:  # root reads every folder: refuse this one as the kernel would another user
        deny = lab.folder / "deny"
        deny.mkdir()
        from tests.test_damaged_runs import DENY

        (deny / "sitecustomize.py").write_text(DENY)
        env = {"PYTHONPATH": str(deny), "FSLAB_TEST_DENY": str(hidden.resolve())}
    else:
        hidden.chmod(0)
    try:
        rows = {r["id"]: r for r in map(json.loads, lab.fslab("runs", "--json", "--all", env=env).stdout.splitlines())}
        check(rows.get(hidden.name, {}).get("state") == "unreadable", "the folder was not listed as unreadable")
        for argv in (["runs"], ["compare", "all", "--queries", "5"], ["queue"], ["show", hidden.name]):
            done = lab.fslab(*argv, env=env)
            check(done.returncode == 0 and "Traceback" not in done.stderr, f"{argv}: {done.stderr.strip()[-200:]}")
        check("Permission denied" in lab.one_line(lab.fslab("logs", hidden.name, env=env), 1), "logs did not say why")
    finally:
        hidden.chmod(0o755)
    return "listed as unreadable with the reason; every command went on"


def full_disk_while_training(lab: Lab) -> str:
    store = lab.runs_dir
    with mounted("tmpfs", store, size="32m"):
        run = lab.start()
        lab.first_checkpoint(run)
        filler = fill(store)
        state = lab.ended(run)
        error = lab.status(run).get("error") or ""
        check(state == "failed" and "No space left on device" in error, f"ended {state}: {error!r}")
        check(zip_intact(run), "the previous checkpoint did not survive", DataLost)
        check(not list(run.rglob(".*.tmp")), "a temporary file was left", DataLost)
        filler.unlink()
        done = lab.fslab("resume", run.name)
        check(done.returncode == 0, f"resume after freeing the disk failed: {done.stderr.strip()[-200:]}")
        lab.intact(run)
    return "failed with the reason, previous checkpoint kept; resumed once there was room"


def full_disk_creating_a_run(lab: Lab) -> str:
    store = lab.runs_dir
    with mounted("tmpfs", store, size="1m"):
        fill(store)
        lab.one_line(lab.fslab("run", "nca", *TINY, "--detach"), 1)
        left = [p.name for p in store.iterdir() if p.name != "filler"]
        check(not left, f"a half-made run folder was left: {left}", DataLost)
    return "one line, no half-made folder"


def read_only_store(lab: Lab) -> str:
    source = lab.folder / "store-source"
    shutil.copytree(FIXTURE, source)
    with mounted("bind", lab.runs_dir, source=source):
        lab.one_line(lab.fslab("run", "nca", *TINY, "--detach"), 1)
        done = lab.fslab("runs", "--json", "--all")
        check(done.returncode == 0 and len(done.stdout.splitlines()) == 4, f"runs: {done.stderr.strip()[-200:]}")
        done = lab.fslab("compare", "all", "--queries", "5")
        check(done.returncode == 0, f"compare: {done.stderr.strip()[-200:]}")
    return "fslab run refused in one line; listing and comparing went on"


def corrupt_checkpoints(lab: Lab) -> str:
    shutil.copytree(FIXTURE, lab.runs_dir)
    stopped = lab.runs_dir / "20261123-181312-nca-018e"
    last = stopped / "checkpoints" / "last.pt"
    last.write_bytes(last.read_bytes()[:1000])
    lab.one_line(lab.fslab("resume", stopped.name), 2)
    check(lab.status(stopped).get("state") == "killed", "the refused resume changed the run", DataLost)
    done = lab.runs_dir / "20261123-181250-nca-910d"
    shutil.copy(last, done / "checkpoints" / "last.pt")
    lab.one_line(lab.fslab("eval", done.name, "--episodes", "5", "--queries", "5"), 2)  # as resume: exit 2
    return "resume and eval refused in one line"


def zip_intact(run: Path) -> bool:
    import zipfile

    path = run / "checkpoints" / "last.pt"
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (OSError, zipfile.BadZipFile):
        return False


FAULTS = {
    "worker killed (SIGKILL)": worker_sigkill,
    "worker stopped (SIGTERM)": worker_sigterm,
    "fslab run killed (SIGKILL)": parent_sigkill,
    "fslab run terminated (SIGTERM)": parent_sigterm,
    "worker paused (SIGSTOP)": paused_worker,
    "worker dies before its first status write": dies_before_its_first_status_write,
    "two resumes at once": two_resumes_at_once,
    "stop of another host's run": stop_across_hosts,
    "damaged run files": damaged_files,
    "a folder this user cannot read": unreadable_folder,
    "disk full while training": full_disk_while_training,
    "disk full while making a run": full_disk_creating_a_run,
    "read-only run store": read_only_store,
    "damaged checkpoints": corrupt_checkpoints,
}

# Bad input: exit code 2, one line, no run folder. (argv, fslab.toml or None)
def folder_tree(classes: int, per_class: int = 20, empty: str | None = None) -> dict[str, bytes | None]:
    """A folder dataset's files by path (None: an empty folder). The checks
    count files without decoding them, so the bytes need not be an image."""
    files: dict[str, bytes | None] = {f"{split}/{split}-class{c}/{i:02d}.png": b"not decoded before the run exists"
                                      for split in ("train", "val", "test") for c in range(classes)
                                      for i in range(per_class)}
    if empty is not None:
        files[empty] = None
    return files


BAD_INPUTS = {
    "unknown method": (["run", "ncaa"], None),
    "unknown config key": (["run", "nca", "--set", "train.epoch=3"], None),
    "a value of the wrong type": (["run", "nca", "--set", "train.lr=fast"], None),
    "an unknown plugin parameter": (["run", "nca", "--set", "loss.temprature=0.5"], None),
    "a loss that needs episodes with a plain sampler": (["run", "nca", "--set", "loss.name=protonet",
                                                        "--set", "sampler.name=iid"], None),
    "more GPUs than visible": (["run", "nca", "--gpus", "4", "--device", "cuda"], None),
    "a TOML syntax error": (["run", "nca"], "[run\nseed = 1\n"),
    "an unknown fslab.toml section": (["run", "nca"], "[runs]\nseed = 1\n"),
    "zero epochs": (["run", "nca", "--epochs", "0"], None),
    "a batch of one": (["run", "nca", "--batch-size", "1"], None),
    "an impossible synthetic split": (["run", "nca", "--set", "dataset.classes=24"], None),
    "a dataset root that does not exist": (["run", "nca", "--dataset", "folder", "--data-root", "/nonexistent"],
                                           None),
    "an unknown --slurm key": (["run", "nca", "--executor", "slurm", "--slurm", "partion=gpu"], None),
    "an unknown executor": (["run", "nca", "--executor", "pbs"], None),
    "a sweep with a bad grid value": (["sweep", "nca", "--grid", "train.lr=0.1,fast"], None),
    "a sweep file with an unknown key": (["sweep", "--file", "sweep.toml"],
                                         "sweep.toml:method = 'nca'\nseeds = 2\nbogus = 1\n"),
    "a sweep file listing a grid value twice": (["sweep", "--file", "sweep.toml"],
                                                "sweep.toml:method = 'nca'\n[grid]\n'train.lr' = [0.1, 0.1]\n"),
    "resume of a run that does not exist": (["resume", "nosuchrun"], None),
    "eval of a run that does not exist": (["eval", "nosuchrun"], None),
    "compare in an unknown format": (["compare", "all", "--format", "xlsx"], None),
    "plot of an unknown size": (["plot", "batch-size", "all", "--size", "tiny"], None),
    "runs with an unknown state": (["runs", "--state", "finished"], None),
    "a 20,000-character value": (["run", "nca", "--set", "loss.temperature=" + "x" * 20000], None),
    # Each of these once failed in the worker, after the run folder existed (some after training).
    "zero test episodes": (["run", "nca", "--set", "eval.test_episodes=0"], None),
    "test shots no split can give": (["run", "nca", "--set", "eval.shots=[1000]"], None),
    "zero ways": (["run", "nca", "--set", "eval.ways=0"], None),
    "more ways than validation classes": (["run", "nca", "--set", "eval.ways=100"], None),
    "a negative learning rate": (["run", "nca", "--lr", "-0.1"], None),
    "an infinite learning rate": (["run", "nca", "--lr", "inf"], None),
    "a NaN learning rate": (["run", "nca", "--lr", "nan"], None),
    "a GPU this machine lacks": (["run", "nca", "--device", "cuda:7"], None),
    "a zero temperature": (["run", "nca", "--set", "loss.temperature=0"], None),
    "a negative SupCon temperature": (["run", "nca", "--set", "loss.name=supcon", "--set", "loss.temperature=-1"],
                                      None),
    "more sampler ways than training classes": (["run", "protonet", "--set", "sampler.ways=500"], None),
    "per_class with ways and queries": (["run", "protonet", "--set", "sampler.per_class=16"], None),
    "a folder split with fewer classes than ways": (
        ["run", "nca", "--dataset", "folder", "--data-root", "tree"], {"tree": folder_tree(classes=3)}),
    "an empty class folder": (["run", "nca", "--dataset", "folder", "--data-root", "tree"],
                              {"tree": folder_tree(classes=5, empty="test/class9")}),
    "a number typer cannot parse": (["run", "nca", "--epochs", "abc"], None),
    "a bad [run] value in fslab.toml": (["run", "nca"], "[run]\ntrain = {lr = -1.0}\n"),
}


def bad_input(lab: Lab, argv: list[str], files: str | dict | None) -> str:
    """``files``: text for fslab.toml (or ``sweep.toml:`` and its text), or
    ``{folder: {path: bytes, or None for an empty folder}}`` made in the project."""
    if isinstance(files, dict):
        for folder, tree in files.items():
            for relative, data in tree.items():
                path = lab.folder / folder / relative
                if data is None:
                    path.mkdir(parents=True)
                else:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(data)
    elif files is not None:
        name, _, text = files.partition(":") if files.startswith("sweep.toml:") else ("fslab.toml", "", files)
        target = lab.folder / name
        if name == "fslab.toml":  # keep the lab's own settings, broken the way the input says
            text = target.read_text() + "\n" + text
        target.write_text(text)
    line = lab.one_line(lab.fslab(*argv), 2)
    made = [p.name for p in lab.runs_dir.iterdir()] if lab.runs_dir.is_dir() else []
    check(not [m for m in made if m not in ("sweeps", ".slots")], f"a run folder was made: {made}")
    return line
