"""Make N fake run folders, shaped like real ones, for the dashboard benchmark.

    python benchmarks/make_runs.py DIR [--runs 1000] [--live 20] [--steps 60] [--scores]

Each run has config.json, status.json, metrics.jsonl (start, train every step,
val eval per epoch, test evals), stdout.log, stderr.log and, when completed,
results.json. States are mixed: mostly completed, some failed, killed and
lost, and ``--live`` running runs whose status has this host and the pid of
the calling process (so they count as alive) and a fresh heartbeat; the
benchmark then appends metrics to them. Deterministic for a given seed.
"""

from __future__ import annotations

import json
import math
import os
import random
import socket
import statistics
import sys
import time
from pathlib import Path

from fslab.core.clocks import written_at

sys.path.insert(0, str(Path(__file__).parent))
import options  # noqa: E402

METHODS = (("nca", "nca", "iid"), ("protonet", "protonet", "episodic"))
BACKBONES = ("resnet12", "conv4")
SWEEP_RUNS = 20  # runs a sweep makes at once
SWEEP_EVERY = 8 * 3600  # seconds between sweeps: 10,000 runs span about five months


def config_for(method: str, loss: str, sampler: str, backbone: str, seed: int, epochs: int) -> dict:
    return {
        "method": method, "seed": seed, "device": "auto",
        "dataset": {"name": "synthetic", "root": "data/synthetic", "classes": 200, "image_size": 16},
        "backbone": {"name": backbone}, "loss": {"name": loss}, "sampler": {"name": sampler},
        "evaluator": {"name": "centroid"},
        "train": {"epochs": epochs, "batch_size": 128, "lr": 0.025, "log_every": 1},
        "eval": {"ways": 5, "shots": [1, 5], "queries": 15, "test_episodes": 2000},
    }


def train_event(t: float, step: int, epoch: int, rng: random.Random) -> dict:
    loss = 5.0 * math.exp(-step / 80) + 0.5 + rng.random() * 0.2
    return {"event": "train", "time": t, "step": step, "epoch": epoch, "loss": loss,
            "positives": 60 + rng.randrange(20), "negatives": 6800 + rng.randrange(400),
            "lr": 0.025, "images_per_s": 50 + rng.random() * 5, "rows_without_positive": 50.0}


def write_run(folder: Path, index: int, state: str, steps_per_epoch: int, epochs: int, created: float,
              now: float, rng: random.Random, scores: bool = False) -> None:
    method, loss, sampler = METHODS[index % 2]
    backbone = BACKBONES[(index // 2) % 2]
    folder.mkdir(parents=True)
    (folder / "checkpoints").mkdir()
    (folder / "config.json").write_text(json.dumps(config_for(method, loss, sampler, backbone, index % 5, epochs),
                                                   indent=2))
    done_epochs = epochs if state == "completed" else max(1, epochs // 2)
    t = created + 5
    lines = [{"event": "start", "time": t, "device": "cpu", "epochs": epochs, "steps_per_epoch": steps_per_epoch,
              "total_steps": epochs * steps_per_epoch, "train_images": 3600}]
    step = 0
    for epoch in range(1, done_epochs + 1):
        for _ in range(steps_per_epoch):
            step += 1
            t += 1
            lines.append(train_event(t, step, epoch, rng))
        acc = 0.5 + 0.2 * epoch / epochs + rng.random() * 0.02
        lines.append({"event": "eval", "time": t, "split": "val", "ways": 5, "shots": 5, "queries": 15,
                      "episodes": 300, "accuracy": acc, "ci95": 0.01, "epoch": epoch, "step": step})
        lines.append({"event": "checkpoint", "time": t, "epoch": epoch, "step": step, "path": "checkpoints/last.pt"})
    results = None
    if state == "completed":
        results = {}
        for shots, base in ((1, 0.55), (5, 0.72)):
            acc, ci, episodes = base + rng.random() * 0.02, 0.004, 2000
            if scores:  # per-episode accuracies as training saves them, for fslab compare
                acc, ci, episodes = save_scores(folder, rng, shots, base, index % 5, epochs)
            results[f"{shots}-shot"] = {"accuracy": acc, "ci95": ci}
            lines.append({"event": "eval", "time": t, "split": "test", "ways": 5, "shots": shots, "queries": 15,
                          "episodes": episodes, "accuracy": acc, "ci95": ci, "step": step})
        lines.append({"event": "end", "time": t, "results": results})
    with open(folder / "metrics.jsonl", "w") as fh:
        fh.writelines(json.dumps(e) + "\n" for e in lines)
    (folder / "stdout.log").write_text("".join(f"line {i}\n" for i in range(len(lines))))
    (folder / "stderr.log").write_text("Traceback (most recent call last):\nRuntimeError: boom\n"
                                       if state == "failed" else "")
    live = state == "running"
    status = {"state": "running" if state in ("running", "lost") else state, "created": created, "started": created + 1,
              "host": socket.gethostname() if live else "elsewhere", "pid": os.getpid() if live else 1,
              "heartbeat": now if live else created + 100}
    if state in ("completed", "failed", "killed"):
        status.update(ended=t, exit_code=0 if state == "completed" else 1,
                      error="RuntimeError: boom" if state == "failed" else None)
    (folder / "status.json").write_text(json.dumps(status))
    if results:
        (folder / "results.json").write_text(json.dumps({"test": results, "episodes": episodes, "ways": 5}))
    stamp_as_written(folder, created, t, status)


def stamp_as_written(folder: Path, created: float, last_event: float, status: dict) -> None:
    """Each file's modification time set to when its run wrote it last, as in a lab's store: the
    configuration at creation, the metrics, logs and scores at the last event, the status at the time it
    records as written (fslab.core.clocks). A status.json stamped now whose heartbeat is months old reads
    as written by a host whose clock is months behind, and its run (a lost run of another host) as
    running for two minutes: every such run was checked each tick as a live one."""
    times = {"config.json": created, "status.json": written_at(status)}
    for path in (*folder.iterdir(), *folder.glob("evaluations/*")):
        if path.is_file():
            at = times.get(path.name, last_event)
            os.utime(path, (at, at))


def save_scores(folder: Path, rng: random.Random, shots: int, base: float, seed: int, epochs: int,
                episodes: int = 100) -> tuple[float, float, int]:
    """Per-episode accuracies of a test evaluation in ``evaluations/`` (5-way, 15
    queries: k/75), as training saves them; returns their mean, CI and count."""
    accuracies = [min(75, max(0, round(rng.gauss(75 * base, 6)))) / 75 for _ in range(episodes)]
    mean = statistics.fmean(accuracies)
    ci = 1.96 * statistics.pstdev(accuracies) / math.sqrt(episodes)
    record = {"split": "test", "ways": 5, "shots": shots, "queries": 15, "episodes": episodes,
              "evaluator": "centroid", "metric": "accuracy", "seed": 0, "stream": 2, "epoch": epochs,
              "accuracy": mean, "ci95": ci, "accuracies": accuracies}
    (folder / "evaluations").mkdir(exist_ok=True)
    name = f"test-centroid-5way-{shots}shot-15q-{episodes}ep-seed0-epoch{epochs}.json"
    (folder / "evaluations" / name).write_text(json.dumps(record))
    return mean, ci, episodes


def make_runs(root: Path, runs: int = 1000, live: int = 20, steps_per_epoch: int = 12, epochs: int = 5,
              seed: int = 0, scores: bool = False) -> list[Path]:
    """Write ``runs`` run folders under ``root``, made as a lab makes them: sweeps of
    :data:`SWEEP_RUNS` runs 50 ms apart, one sweep every :data:`SWEEP_EVERY` seconds, each
    id stamped with the local time its run was created, as fslab stamps it; the newest
    ``live`` are running. With ``scores``, completed runs also keep per-episode test
    accuracies for ``fslab compare``. Returns the live runs' folders."""
    rng = random.Random(seed)
    now = time.time()
    live_dirs = []
    sweeps = -(-runs // SWEEP_RUNS)
    for index in range(runs):
        state = ("running" if index >= runs - live
                 else ("completed", "completed", "completed", "failed", "killed", "lost")[index % 6])
        created = now - 3600 - (sweeps - index // SWEEP_RUNS) * SWEEP_EVERY + (index % SWEEP_RUNS) * 0.05
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(created))
        folder = Path(root) / f"{stamp}-{METHODS[index % 2][0]}-{index % 65536:04x}"
        write_run(folder, index, state, steps_per_epoch, epochs, created, now, rng, scores)
        if state == "running":
            live_dirs.append(folder)
    return live_dirs


def main() -> None:
    parser = options.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--live", type=int, default=20)
    parser.add_argument("--steps", type=int, default=12, help="training steps per epoch (5 epochs)")
    parser.add_argument("--scores", action="store_true", help="per-episode test accuracies for fslab compare")
    args = parser.parse_args()
    if args.runs < 0 or not 0 <= args.live <= args.runs or args.steps < 1:
        parser.error(f"--runs must be at least 0, --live from 0 to --runs and --steps at least 1; got --runs "
                     f"{args.runs}, --live {args.live}, --steps {args.steps}")
    make_runs(args.root, args.runs, args.live, args.steps, scores=args.scores)
    print(f"{args.runs} runs in {args.root}")


if __name__ == "__main__":
    main()
