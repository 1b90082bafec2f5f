"""Scheduler latency, one command: ``python benchmarks/bench_scheduler.py``.

Queues ``--runs`` tiny real training runs with ``fslab sweep`` on one CPU slot
(``[scheduler] cpu_slots = 1``), so the real scheduler starts them one after
another, and measures for each hand-over the time from the slot freeing (the
previous run's worker process has exited: watched every millisecond) to the
next run's worker starting (the ``started`` time its worker writes into
``status.json`` when it marks the run running).

Printed, all from this one run on this machine:

- the hand-over latency, mean and max, and its ratio to the 1 s target;
- the baseline: the time a worker takes from being spawned directly to
  marking its run running (Python start-up and fslab's imports), which any
  scheduler pays; the difference is what the scheduler itself adds.

``--history N`` first fills the run store with N finished runs
(``make_runs.py``, each claimed as a started run is), since the scheduler
looks through the store for queued runs; the scheduler's CPU time while the
runs train is printed too.
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import options  # noqa: E402
from make_runs import make_runs  # noqa: E402

TINY = [
    "--backbone", "conv4", "--set", "backbone.hidden=8",
    "--set", "dataset.classes=24", "--set", "dataset.val_classes=6", "--set", "dataset.test_classes=6",
    "--set", "dataset.images_per_class=20", "--set", "dataset.image_size=16",
    "--batch-size", "32", "--epochs", "1", "--set", "eval.val_episodes=10", "--set", "eval.test_episodes=10",
    "--set", "eval.queries=5", "--set", "eval.center_images=32", "--set", "eval.before_training=false",
]


def read_status(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


class Exit:
    """Tells when a process has exited as a whole: every thread gone and its
    files closed, which is when the kernel releases its slot lock. A pidfd
    says exactly that (the thread-group leader shows as a zombie earlier,
    while torch's threads are still shutting down)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self.fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.fd = None  # already gone
        except (AttributeError, OSError):
            raise SystemExit("this benchmark needs Linux >= 5.3 (pidfd_open)") from None

    def done(self) -> bool:
        if self.fd is None:
            return True
        if select.select([self.fd], [], [], 0)[0]:
            os.close(self.fd)
            self.fd = None
            return True
        return False


def scheduler_pids(runs_dir: Path) -> list[int]:
    """The schedulers serving this benchmark's run store (read from /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"fslab.execution.scheduler" in argv and str(runs_dir).encode() in argv:
                pids.append(int(entry.name))
    return pids


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a live process, from /proc/PID/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_start(pid: int, boot: float) -> float | None:
    """Wall-clock time a process was created (10 ms resolution, /proc/PID/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def watch(run_dirs: list[Path], timeout: float, cpu: dict) -> list[tuple[float, float, float]]:
    """(spawned, started, exited) wall-clock times of each run's worker, in
    order; the scheduler's CPU time is sampled into ``cpu`` (pid -> last reading)."""
    boot = time.time() - float(Path("/proc/uptime").read_text().split()[0])
    times: list[list] = [[None, None, None, None] for _ in run_dirs]  # started, pid, exited, spawned
    deadline = time.time() + timeout
    last_sample = 0.0
    while time.time() < deadline and any(t[2] is None for t in times):
        if time.time() - last_sample > 0.1:
            last_sample = time.time()
            for pid in set(cpu) | set(scheduler_pids(run_dirs[0].parent)):
                reading = cpu_seconds(pid)
                if reading is not None:
                    cpu[pid] = reading
        for t, run_dir in zip(times, run_dirs):
            if t[1] is None:
                status = read_status(run_dir)
                if status.get("pid") and status.get("started"):
                    t[0], t[1] = status["started"], Exit(status["pid"])
                    t[3] = process_start(status["pid"], boot)
            if t[1] is not None and t[2] is None and t[1].done():
                t[2] = time.time()
        time.sleep(0.001)
    if any(t[2] is None for t in times):
        raise SystemExit(f"runs did not all finish within {timeout:.0f} s; see {run_dirs[0].parent}")
    return [(t[3], t[0], t[2]) for t in times]


def worker_startup(project: Path, env: dict, repeats: int) -> list[float]:
    """Baseline: spawn ``python -m fslab.execution.worker`` on a fresh run directly and
    time until its status says running (the worker then trains; it is stopped)."""
    from fslab.core.runstore import create_run

    out = []
    config = json.loads(next((project / "runs").glob("*/config.json")).read_text())
    for _ in range(repeats):
        run = create_run(project / "baseline", "nca", config)
        t0 = time.time()
        process = subprocess.Popen([sys.executable, "-m", "fslab.execution.worker", str(run.path)], cwd=project,
                                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not read_status(run.path).get("started"):
            time.sleep(0.001)
        out.append(read_status(run.path)["started"] - t0)
        process.terminate()
        process.wait()
    return out


def main() -> None:
    parser = options.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6, help="tiny runs queued on one slot (default 6)")
    parser.add_argument("--history", type=int, default=0, help="finished runs in the store beforehand")
    args = parser.parse_args()
    options.at_least(parser, args, runs=2, history=0)  # a hand-over is between two runs
    print(options.machine())
    with tempfile.TemporaryDirectory(prefix="fslab-bench-scheduler-") as tmp:
        project = Path(tmp)
        (project / "fslab.toml").write_text("[scheduler]\ngpus = []\ncpu_slots = 1\n")
        if args.history:
            make_runs(project / "runs", runs=args.history, live=0)
            for run_dir in (project / "runs").iterdir():  # as every run that was started is
                (run_dir / ".claimed").write_text("0 0\n")
        env = {**os.environ, "FSLAB_CONFIG": str(project / "fslab.toml")}
        env.pop("FSLAB_STRICT_PLUGINS", None)
        before = set((project / "runs").iterdir()) if (project / "runs").exists() else set()
        result = subprocess.run([sys.executable, "-m", "fslab", "sweep", "nca", "--seeds", str(args.runs), *TINY],
                                cwd=project, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"fslab sweep failed: {result.stderr.strip()}")
        sweep_id = result.stdout.split(":")[0]
        record = json.loads((project / "runs" / "sweeps" / f"{sweep_id}.json").read_text())
        run_dirs = [project / "runs" / r for r in record["runs"]]
        assert not before & set(run_dirs)
        cpu: dict[int, float] = {}
        wall = time.time()
        times = watch(run_dirs, timeout=120 + 60 * args.runs, cpu=cpu)
        wall = time.time() - wall
        times.sort(key=lambda t: t[1])
        gaps = [nxt[1] - prev[2] for prev, nxt in zip(times, times[1:])]
        reaction = [nxt[0] - prev[2] for prev, nxt in zip(times, times[1:]) if nxt[0] is not None]
        startup = [nxt[1] - nxt[0] for nxt in times[1:] if nxt[0] is not None]
        states = [read_status(d).get("state") for d in run_dirs]
        baseline = worker_startup(project, env, repeats=3)

    mean, worst = statistics.fmean(gaps), max(gaps)
    base = statistics.fmean(baseline)
    print(f"scheduler hand-over on 1 CPU slot, {len(gaps)} hand-overs ({args.runs} runs: "
          f"{', '.join(sorted(set(states)))}; {args.history} finished runs in the store)")
    print(f"  slot freed -> next worker running: mean {mean:.3f} s, max {worst:.3f} s "
          f"(each: {', '.join(f'{g:.3f}' for g in gaps)})")
    print(f"  against the 1 s target: mean {mean / 1.0:.2f}x, max {worst / 1.0:.2f}x of it")
    if reaction:
        print(f"  of which: slot freed -> next worker spawned (the scheduler's reaction, 10 ms resolution) "
              f"mean {statistics.fmean(reaction):.3f} s, max {max(reaction):.3f} s; "
              f"spawned -> running (the worker's own start-up) mean {statistics.fmean(startup):.3f} s")
    print(f"  for comparison, a worker spawned directly (no scheduler) -> running: {base:.3f} s "
          f"(mean of {len(baseline)})")
    print(f"  scheduler CPU time while the runs trained: {sum(cpu.values()):.2f} s over {wall:.1f} s "
          f"({100 * sum(cpu.values()) / wall:.1f}% of one core; sampled every 0.1 s)")


if __name__ == "__main__":
    main()
