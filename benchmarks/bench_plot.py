"""fslab plot of one big sweep, one command: ``python benchmarks/bench_plot.py``.

Makes a sweep of 1,500 completed runs (``make_runs.py``, per-episode test
scores saved; 3 learning rates, a seed each run), then times, in this one run
on this machine, ``fslab plot``'s reading of them (:func:`fslab.reports.plot.series_data`)
and the step that keeps each point's scored runs: the old way compared every
run of a point with every other (lists), now it looks each up (sets); both keep
the same runs.

Options: ``--runs N`` (1500), ``--repeats N`` (3: the fastest is shown).
"""

from __future__ import annotations

import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import options  # noqa: E402
from make_runs import write_run  # noqa: E402

LRS = (0.01, 0.02, 0.05)


def make_sweep(root: Path, runs: int) -> None:
    rng, now = random.Random(0), time.time()
    for index in range(runs):
        folder = root / f"20260101-{index:06d}-nca-{index % 65536:04x}"
        write_run(folder, 0, "completed", 2, 2, now - 3600 - runs + index, now, rng, scores=True)
        config = json.loads((folder / "config.json").read_text())
        config["train"]["lr"], config["seed"] = LRS[index % len(LRS)], index
        (folder / "config.json").write_text(json.dumps(config))


def fastest(repeats: int, work) -> tuple[float, object]:
    best, result = math.inf, None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = work()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> None:
    parser = options.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    options.at_least(parser, args, runs=len(LRS), repeats=1)
    print(options.machine())
    from fslab.core.runstore import run_paths
    from fslab.reports.plot import series_data

    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = Path(tmp) / "runs"
        make_sweep(runs_dir, args.runs)
        from fslab.core.runstore import Run

        runs = [Run(path) for path in run_paths(runs_dir)]
        whole, data = fastest(args.repeats, lambda: series_data(runs, "train.lr", shots=(1, 5)))
    point = runs[::len(LRS)]  # the runs at one learning rate
    unscored = point[::3]  # as if a third had no scores (failed, killed or still running)
    old, old_kept = fastest(args.repeats, lambda: [r for r in point if r not in unscored])
    old_x, _ = fastest(args.repeats, lambda: [r for r in point if r in old_kept])
    now, now_kept = fastest(args.repeats, lambda: (lambda dropped: [r for r in point if r not in dropped])(
        set(unscored)))
    now_x, _ = fastest(args.repeats, lambda: (lambda kept: [r for r in point if r in kept])(set(now_kept)))
    assert old_kept == now_kept
    points = sum(len(series["points"]) for panel in data["panels"] for series in panel["series"])
    print(f"{args.runs:,} runs of one sweep, {points} points (fastest of {args.repeats}): fslab plot's read of them "
          f"{whole:.2f} s; keeping a point's scored runs ({len(point)} runs): old way (lists) "
          f"{1000 * (old + old_x):.1f} ms, sets {1000 * (now + now_x):.1f} ms, "
          f"old / now {(old + old_x) / (now + now_x):.0f}x")


if __name__ == "__main__":
    main()
