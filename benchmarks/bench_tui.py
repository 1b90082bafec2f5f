"""Dashboard benchmark, one command: ``python benchmarks/bench_tui.py``.

Makes 1,000 fake run folders (``make_runs.py``), 20 of them live, then prints,
measured in this one run on this machine:

1. import time of the dashboard (Textual included; torch never imported);
2. first paint: from starting the app to the first screenful of runs drawn,
   and to all runs loaded (the store is read newest first, in batches);
3. a refresh tick while the 20 live runs each append a metrics line: the
   worker thread's read of the store, and the whole tick (read + table update
   + redraw) as the UI sees it; median and max over ``--ticks`` ticks;
4. chart drawing for a run with 100 and with 100,000 logged steps.

Options: ``--runs N`` (1000), ``--live N`` (20), ``--ticks N`` (20), ``--cold`` (no
``summary.json`` yet, as in a store written by fslab 0.1: every run is folded
from its metrics as it loads).
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import options  # noqa: E402
from make_runs import make_runs, train_event  # noqa: E402


def ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f} ms"


async def measure(runs_dir: Path, live: list[Path], ticks: int, total: int) -> dict:
    from fslab.tui import make_app
    from fslab.tui.runs_table import RunsTable

    # First paint = the moment the table draws its first screenful of run rows (all of them, when
    # fewer than a screenful, as with a small --runs): RunsTable.render_line is wrapped to note when
    # the last visible row is drawn (line 0 is the header, run k is on line k).
    drawn: list[float] = []
    render_line = RunsTable.render_line

    def noting_render_line(self, y):
        if not drawn and y == min(self.size.height - 1, total) and len(self.ids) >= y:
            drawn.append(time.perf_counter())
        return render_line(self, y)

    RunsTable.render_line = noting_render_line
    app = make_app(runs_dir, tick=3600, cursor_blink=False)  # ticks driven by hand below
    started = time.perf_counter()
    async with app.run_test(size=(120, 36)) as pilot:
        while not drawn:
            await asyncio.sleep(0.001)
        first_paint = drawn[0] - started
        RunsTable.render_line = render_line
        while len(app.rows) < total:
            await asyncio.sleep(0.002)
        await app.workers.wait_for_complete()
        await pilot.pause()
        all_loaded = time.perf_counter() - started
        reads, whole = [], []
        import random

        rng = random.Random(1)
        for tick in range(ticks):
            for folder in live:
                event = train_event(time.time(), 1000 + tick, 3, rng)
                with open(folder / "metrics.jsonl", "a") as fh:
                    fh.write(json.dumps(event) + "\n")
            t0 = time.perf_counter()
            app.poll_store()
            await app.workers.wait_for_complete()
            await pilot.pause()
            whole.append(time.perf_counter() - t0)
            reads.append(app.last_poll_s)
            assert app.rows[live[0].name].step == 1000 + tick
    return {"first_paint": first_paint, "all_loaded": all_loaded, "reads": reads, "ticks": whole}


def chart_times() -> dict:
    from fslab.tui.charts import MinMaxSeries, Plot, render_chart

    out = {}
    for steps in (100, 100_000):
        series = MinMaxSeries()
        for i in range(steps):
            series.append(i, math.exp(-i / steps) + 0.01 * math.sin(i))
        t0 = time.perf_counter()
        for _ in range(10):
            render_chart(Plot([("loss", series)]), 100, 12, "loss")
        out[steps] = (time.perf_counter() - t0) / 10
    return out


def main() -> None:
    parser = options.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--live", type=int, default=20)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--cold", action="store_true",
                        help="start without summary.json files (a store written by fslab 0.1)")
    args = parser.parse_args()
    options.at_least(parser, args, runs=1, live=1, ticks=1)
    if args.live > args.runs:
        parser.error(f"--live must be at most --runs ({args.runs}), got {args.live}")
    print(options.machine())
    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = Path(tmp) / "runs"
        live = make_runs(runs_dir, args.runs, args.live)  # live runs carry this process's pid
        if not args.cold:  # the summaries in place, as the workers leave them
            from fslab.core.summary import list_summaries

            list_summaries(runs_dir, limit=None)
        t0 = time.perf_counter()
        import fslab.tui.app  # noqa: F401
        import_s = time.perf_counter() - t0
        result = asyncio.run(measure(runs_dir, live, args.ticks, args.runs))
    charts = chart_times()
    print(f"runs: {args.runs} ({args.live} live, each appending one metrics line per tick); "
          f"{'no summary.json yet' if args.cold else 'summaries in place'}")
    print(f"import fslab.tui (Textual included): {ms(import_s)}; torch imported: {'torch' in sys.modules}")
    print(f"first paint (app start -> first screenful of runs drawn): {ms(result['first_paint'])}")
    print(f"all {args.runs} runs loaded: {ms(result['all_loaded'])}")
    print(f"refresh tick, store read in the worker thread: median {ms(statistics.median(result['reads']))}, "
          f"max {ms(max(result['reads']))}")
    print(f"refresh tick, read + table update + redraw:   median {ms(statistics.median(result['ticks']))}, "
          f"max {ms(max(result['ticks']))} (tick interval: 1000 ms)")
    print(f"chart draw 100 x 12 cells: 100 steps {ms(charts[100])}, 100,000 steps {ms(charts[100_000])}")


if __name__ == "__main__":
    main()
