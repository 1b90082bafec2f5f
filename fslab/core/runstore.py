"""The run store: one folder per run under ``runs/``, plain files only.

``runs/<id>/``
  config.json     the resolved configuration (written once, atomically)
  status.json     state, pid, host, times, heartbeat, exit code, error (atomic rewrites)
  metrics.jsonl   one JSON event per line, append-only
  stdout.log, stderr.log   the worker's output
  checkpoints/last.pt      the latest end-of-epoch checkpoint (atomic)
  results.json    final test accuracies (atomic)

Readers never trust a last line without its newline (it may still be written)
and skip lines that do not parse.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fslab.core.config import migrate
from fslab.core.errors import ConfigError, FslabError, RunNotFound
from fslab.core.files import atomic_write_json, read_events, read_json

STATES = ("queued", "running", "completed", "failed", "killed", "lost")
ENDED = ("completed", "failed", "killed")
# A live run rewrites its heartbeat every few seconds; this long without one is lost.
LOST_AFTER_S = 120.0


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs here and is not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@dataclass(frozen=True)
class Run:
    path: Path

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoints" / "last.pt"

    def config(self) -> dict:
        """The run's configuration, migrated to the current version (so readers
        never need fallbacks for keys older fslabs did not write); ``{}`` while
        ``config.json`` is missing or unreadable."""
        saved = read_json(self.path / "config.json")
        if not saved:
            return {}
        try:
            return migrate(saved)
        except ConfigError as error:
            raise ConfigError(f"run {self.id}: {error}") from None

    def status(self) -> dict:
        return read_json(self.path / "status.json") or {}

    def results(self) -> dict | None:
        return read_json(self.path / "results.json")

    def write_status(self, **fields: Any) -> dict:
        status = {**self.status(), **fields}
        atomic_write_json(self.path / "status.json", status)
        return status

    def state(self, status: dict | None = None, now: float | None = None) -> str:
        """The run's state; a queued or running run whose process is gone, or
        whose heartbeat stopped, is ``lost``."""
        status = self.status() if status is None else status
        state = status.get("state", "lost")
        if state in ENDED:
            return state
        now = time.time() if now is None else now
        pid = status.get("pid")
        if state == "queued" and not pid:
            return state  # waiting for a scheduler slot, however long that takes
        if pid and status.get("host") == socket.gethostname() and not pid_alive(int(pid)):
            return "lost"
        last_sign = status.get("heartbeat") or status.get("created") or 0
        if now - last_sign > LOST_AFTER_S:
            return "lost"
        return state if state in STATES else "lost"

    def events(self) -> list[dict]:
        return read_events(self.metrics_path)[0]

    def events_of(self, kind: str) -> list[dict]:
        return [e for e in self.events() if e.get("event") == kind]

    def claim(self) -> bool:
        """Take this queued run for starting. Exactly one caller ever wins
        (``O_EXCL``), so two schedulers never start the same run."""
        try:
            fd = os.open(self.path / ".claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with open(fd, "w") as fh:
            fh.write(f"{os.getpid()} {time.time()}\n")
        return True

    def claimed(self) -> bool:
        return (self.path / ".claimed").exists()

    def save_accuracies(self, result: dict, accuracies) -> Path:
        """Per-episode accuracies of one evaluation, in ``evaluations/``, named
        by everything that fixes its episodes (split, evaluator, shape, episode
        count, seed, checkpoint epoch), so runs can be compared episode by episode."""
        folder = self.path / "evaluations"
        folder.mkdir(exist_ok=True)
        key = (f"{result['split']}-{result['evaluator']}-{result['ways']}way-{result['shots']}shot-"
               f"{result['queries']}q-{result['episodes']}ep-seed{result['seed']}-epoch{result['epoch']}")
        path = folder / f"{key}.json"
        atomic_write_json(path, {**result, "accuracies": [round(float(a), 6) for a in accuracies]})
        return path

    def saved_accuracies(self) -> list[dict]:
        """Every evaluation saved by :meth:`save_accuracies`."""
        folder = self.path / "evaluations"
        found = [read_json(p) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
        return [f for f in found if f is not None]

    def summary(self) -> dict:
        """What a listing shows of a run: identity, state, progress, accuracies."""
        status, config = self.status(), self.config()
        events = self.events()  # one read serves the last step and the best validation
        last = next((e for e in reversed(events) if e.get("event") == "train"), {})
        val = [e for e in events if e.get("event") == "eval" and e.get("split") == "val"]
        best = max(val, key=lambda e: e["accuracy"], default=None)
        return {
            "id": self.id,
            "state": self.state(status),
            "method": config.get("method"),
            "backbone": config.get("backbone", {}).get("name"),
            "dataset": config.get("dataset", {}).get("name"),
            "seed": config.get("seed"),
            "epoch": last.get("epoch"),
            "epochs": config.get("train", {}).get("epochs"),
            "step": last.get("step"),
            "loss": last.get("loss"),
            "positives": last.get("positives"),
            "negatives": last.get("negatives"),
            "best_val": best and {"accuracy": best["accuracy"], "ci95": best["ci95"]},
            "test": (self.results() or {}).get("test"),
            "created": status.get("created"),
            "error": status.get("error"),
        }


def new_run_id(method: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{method}-{secrets.token_hex(2)}"


def create_run(runs_dir: Path, method: str, config: dict) -> Run:
    """A new run folder with its config and a ``queued`` status. ``mkdir`` is
    atomic, so two runs started in the same second never share a folder."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        path = runs_dir / new_run_id(method)
        try:
            path.mkdir()
        except FileExistsError:
            continue
        (path / "checkpoints").mkdir()
        run = Run(path)
        atomic_write_json(path / "config.json", config)
        run.write_status(state="queued", host=socket.gethostname(), created=time.time())
        return run
    raise FslabError(f"could not create a new run folder in {runs_dir}")


def list_runs(runs_dir: Path) -> list[Run]:
    """Every run folder, oldest first (by creation time, then id: ids made in
    the same second differ only by their random suffix); folders without a
    config are skipped."""
    if not runs_dir.is_dir():
        return []
    runs = [Run(p) for p in runs_dir.iterdir() if p.is_dir() and (p / "config.json").exists()]
    return sorted(runs, key=lambda r: (r.status().get("created", 0), r.id))


def find_run(runs_dir: Path, ref: str) -> Run:
    """A run by id, unique id prefix, unique substring, or ``last``."""
    runs = list_runs(runs_dir)
    if ref == "last":
        if not runs:
            raise RunNotFound(f"no runs in {runs_dir} yet; start one with: fslab run nca")
        return max(runs, key=lambda r: (r.status().get("created", 0), r.id))
    for matcher in (lambda r: r.id == ref, lambda r: r.id.startswith(ref), lambda r: ref in r.id):
        found = [r for r in runs if matcher(r)]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            names = ", ".join(r.id for r in found[:5])
            raise RunNotFound(f"'{ref}' matches {len(found)} runs ({names}{', ...' if len(found) > 5 else ''}); give more of the id")
    raise RunNotFound(f"no run '{ref}' in {runs_dir}. List them with: fslab runs")
