"""The run store at a lab's scale, one command: ``python benchmarks/bench_store.py``.

Makes 10,000 run folders with ``make_runs.py`` (50 of them live, each with
per-episode test scores for ``fslab compare``), then prints, measured in this
one run on this machine:

1. ``fslab runs`` (the newest 50), ``fslab runs --json --all`` and ``fslab
   compare all``, as real commands, against ``python -c pass``:
   - cold: no ``summary.json`` yet (a store written by fslab 0.1, or one whose
     summaries were deleted): every run's ``metrics.jsonl`` is folded once,
     as 0.1 did on every listing; this is the baseline;
   - warm: the summaries in place, as the worker leaves them (fastest and
     median of 5);
2. the dashboard over the same store: first screenful drawn, all runs loaded,
   and a refresh tick while the 50 live runs each append a metrics line
   (median and max of ``--ticks`` ticks).

Options: ``--runs N`` (10000), ``--live N`` (50), ``--ticks N`` (20).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import options  # noqa: E402
from bench_tui import measure, ms  # noqa: E402
from make_runs import make_runs  # noqa: E402

COMMANDS = {"fslab runs": ["runs"], "fslab runs --json --all": ["runs", "--json", "--all"],
            "fslab compare all": ["compare", "all", "--format", "json"]}


def wall(argv: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return seconds


def beat(live: list[Path]) -> None:
    """A fresh heartbeat for the live runs, as their workers would keep writing
    (else, two minutes after make_runs, they would count as lost)."""
    for folder in live:
        status = json.loads((folder / "status.json").read_text())
        (folder / "status.json").write_text(json.dumps({**status, "heartbeat": time.time()}))


def drop_summaries(runs_dir: Path) -> None:
    for entry in os.scandir(runs_dir):
        Path(entry.path, "summary.json").unlink(missing_ok=True)


def commands(project: Path, runs_dir: Path, live: list[Path], repeats: int = 5) -> None:
    """Each command cold once, then warm ``repeats`` times (fastest and median:
    a shared 2-core machine is noisy). fslab compare reads no summary: its
    cold run is just the first one."""
    fslab = [sys.executable, "-m", "fslab"]
    base = min(wall([sys.executable, "-c", "pass"], project) for _ in range(repeats))
    print(f"{'command':<26}{'cold':>8}{'warm: fastest':>15}{'median':>9}{'cold / fastest':>16}")
    print(f"{'python -c pass':<26}{'':>8}{base:15.2f}")
    for name, args in COMMANDS.items():
        beat(live)
        if name != "fslab compare all":
            drop_summaries(runs_dir)
        cold = wall([*fslab, *args], project)  # builds and saves what the warm runs read
        if name == "fslab runs":  # it reads 50 runs only: build the others' summaries for the next commands
            wall([*fslab, "runs", "--json", "--all"], project)
        warm = sorted(wall([*fslab, *args], project) for _ in range(repeats))
        median = statistics.median(warm)
        print(f"{name:<26}{cold:8.2f}{warm[0]:15.2f}{median:9.2f}{cold / warm[0]:15.1f}x")


def main() -> None:
    parser = options.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--live", type=int, default=50)
    parser.add_argument("--ticks", type=int, default=20)
    args = parser.parse_args()
    options.at_least(parser, args, runs=1, live=1, ticks=1)
    if args.live > args.runs:
        parser.error(f"--live must be at most --runs ({args.runs}), got {args.live}")
    print(options.machine())
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        runs_dir = project / "runs"
        t0 = time.perf_counter()
        live = make_runs(runs_dir, args.runs, args.live, scores=True)  # live runs carry this process's pid
        print(f"{args.runs} runs ({args.live} live) written in {time.perf_counter() - t0:.1f} s\n")
        print("## Commands (seconds)")
        commands(project, runs_dir, live)
        print("\n## Dashboard (summaries in place)")
        beat(live)
        result = asyncio.run(measure(runs_dir, live, args.ticks, args.runs))
    print(f"first screenful of runs drawn: {ms(result['first_paint'])}")
    print(f"all {args.runs} runs loaded: {ms(result['all_loaded'])}")
    print(f"refresh tick with {args.live} live runs, store read in the worker thread: "
          f"median {ms(statistics.median(result['reads']))}, max {ms(max(result['reads']))}")
    print(f"refresh tick, read + table update + redraw: median {ms(statistics.median(result['ticks']))}, "
          f"max {ms(max(result['ticks']))}")


if __name__ == "__main__":
    main()
