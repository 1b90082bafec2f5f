"""A scratch project to inflict faults on: the real CLI in subprocesses, tiny
runs slowed down enough to be interrupted, and checks that nothing was lost."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.runs_helpers import TINY

# NCA with a pause per step, so a fault lands in the middle of training.
SLOW_NCA = """
    import time

    from fslab.plugin import hookimpl
    from fslab_plugins.methods.nca import nca


    def slow_nca(z, labels, support=None, *, temperature: float = 1.0):
        time.sleep(0.05)
        return nca(z, labels, support, temperature=temperature)


    @hookimpl
    def register_losses(register):
        register(slow_nca, name="slow-nca", description="NCA with a pause per step")
"""
RUN_ARGS = [*TINY, "--epochs", "4", "--seed", "3", "--device", "cpu", "--set", "loss.name=slow-nca"]


class Unhandled(AssertionError):
    """fslab did not do what it promises: a traceback, a wrong state, more than one line."""


class DataLost(AssertionError):
    """A run lost something it had: a checkpoint, a step, its results."""


class Skipped(Exception):
    """The machine cannot stage this fault (no tmpfs, no bind mount); the reason."""


def check(condition: bool, message: str, kind: type[AssertionError] = Unhandled) -> None:
    if not condition:
        raise kind(message)


class Lab:
    """A project folder with the slow plugin; ``runs_dir`` may be moved (onto a tmpfs)."""

    def __init__(self, folder: Path, runs_dir: Path | None = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "mine").mkdir(exist_ok=True)
        (self.folder / "mine" / "slow.py").write_text(textwrap.dedent(SLOW_NCA))
        self.runs_dir = Path(runs_dir) if runs_dir else self.folder / "runs"
        (self.folder / "fslab.toml").write_text(
            f"[project]\nplugin_dirs = ['mine']\nruns_dir = '{self.runs_dir}'\n")
        self.env = {**os.environ, "FSLAB_CONFIG": str(self.folder / "fslab.toml")}
        self.env.pop("FSLAB_STRICT_PLUGINS", None)

    # -- commands ----------------------------------------------------------------
    def fslab(self, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fslab", *args], cwd=self.folder, capture_output=True,
                              text=True, timeout=timeout, env={**self.env, **(env or {})})

    def succeeds(self, *args: str, what: str) -> subprocess.CompletedProcess:
        """``fslab ARGS``, which must exit 0: else Unhandled, with the end of what it said on stderr."""
        done = self.fslab(*args)
        check(done.returncode == 0, f"{what} failed (exit code {done.returncode}): {done.stderr.strip()[-300:]}")
        return done

    def popen(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "fslab", *args], cwd=self.folder, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**self.env, **(env or {})})

    def start(self, *extra: str, env: dict | None = None) -> Path:
        """A detached tiny slow run; its folder."""
        done = self.fslab("run", "nca", *RUN_ARGS, *extra, "--detach", env=env)
        check(done.returncode == 0, f"fslab run --detach failed: {done.stderr.strip()}")
        return self.runs_dir / done.stdout.strip()

    def one_line(self, done: subprocess.CompletedProcess, code: int | None = None) -> str:
        """The single ``error:`` line of a refused command."""
        lines = done.stderr.strip().splitlines()
        check("Traceback" not in done.stderr, f"a traceback: {done.stderr.strip()[-300:]}")
        check(len(lines) == 1 and lines[0].startswith("error: "), f"not one error line: {done.stderr!r}")
        check(done.returncode == code if code is not None else done.returncode != 0,
              f"exit code {done.returncode}")
        return lines[0]

    # -- what a run holds ---------------------------------------------------------
    @staticmethod
    def status(run_dir: Path) -> dict:
        try:
            return json.loads((run_dir / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    @staticmethod
    def events(run_dir: Path, kind: str) -> list[dict]:
        try:
            lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        except OSError:
            return []
        found = []
        for line in lines:
            with contextlib.suppress(ValueError):
                if (event := json.loads(line)).get("event") == kind:
                    found.append(event)
        return found

    def state(self, run_dir: Path) -> str:
        done = self.fslab("runs", "--json", "--all")
        for row in map(json.loads, done.stdout.splitlines()):
            if row["id"] == run_dir.name:
                return row["state"]
        return "?"

    @staticmethod
    def wait(predicate, timeout: float = 120.0, what: str = "it") -> object:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if value := predicate():
                return value
            time.sleep(0.05)
        raise Unhandled(f"timed out waiting for {what}")

    def first_checkpoint(self, run_dir: Path) -> None:
        """Until the first checkpoint is on disk: its event comes first, and the
        file only once the background write has renamed it into place."""
        self.wait(lambda: self.events(run_dir, "checkpoint") and (run_dir / "checkpoints" / "last.pt").exists(),
                  what="the first checkpoint")

    def ended(self, run_dir: Path, timeout: float = 180.0) -> str:
        return self.wait(lambda: (s := self.status(run_dir).get("state")) in ("completed", "failed", "killed") and s,
                         timeout, "the run to end")

    def intact(self, run_dir: Path) -> None:
        """Completed with nothing lost: every step logged once, in order, each
        epoch validated once, the test results saved, no temporary file left."""
        check(self.status(run_dir).get("state") == "completed", f"run ended {self.status(run_dir).get('state')}",
              DataLost)
        steps = [e["step"] for e in self.events(run_dir, "train")]
        check(steps == sorted(set(steps)) and steps[-1] == self.events(run_dir, "start")[-1]["total_steps"],
              "training steps missing or repeated", DataLost)
        epochs = [e["epoch"] for e in self.events(run_dir, "eval") if e["split"] == "val"]
        check(epochs == list(range(1, 5)), f"validations {epochs}", DataLost)
        check((run_dir / "results.json").exists(), "no results.json", DataLost)
        leftovers = [p.name for p in run_dir.rglob(".*.tmp")]
        check(not leftovers, f"temporary files left: {leftovers}", DataLost)


@contextlib.contextmanager
def mounted(kind: str, target: Path, source: Path | None = None, size: str = "64m"):
    """A small tmpfs, or a read-only bind mount of ``source``, at ``target``
    for the block; Skipped where this machine does not allow mounting."""
    target.mkdir(parents=True, exist_ok=True)
    if kind == "tmpfs":
        argv = [["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)]]
    else:
        argv = [["mount", "--bind", str(source), str(target)], ["mount", "-o", "remount,ro,bind", str(target)]]
    for command in argv:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except OSError as exc:
            raise Skipped(f"cannot mount here ({exc})") from None
        if done.returncode != 0:
            subprocess.run(["umount", str(target)], capture_output=True)
            raise Skipped(f"cannot mount here: {done.stderr.strip() or 'mount failed'}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def fill(folder: Path) -> Path:
    """Write zeros into ``folder`` until its filesystem is full; the filler file."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as fh:
        for size in (1 << 20, 4096, 1):  # megabytes, then pages, then the last bytes
            with contextlib.suppress(OSError):
                while True:
                    fh.write(b"\0" * size)
    return filler
