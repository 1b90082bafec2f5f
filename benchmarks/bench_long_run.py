"""One long run, one command: ``python benchmarks/bench_long_run.py``.

Makes one completed run of 200,000 logged steps (``make_runs.py``: 100 epochs
of 2,000 steps, a validation and a checkpoint each; its ``metrics.jsonl`` about
40 MB), opens it in the dashboard's run screen, headless, and prints, measured
in this one run on this machine, the time the UI thread spends on it (the
dashboard answers no key meanwhile) against the old way, which folded every
event into the charts and the time line on the UI thread:

1. opening the run: the first read, folded and drawn;
2. one new step appended: the time line folds every event again (and in the follow thread:
   the old way's fold against the fold now, which adds the new step to the time line's);
3. opening the compare screen on it: its training losses folded into the chart;

then the check of every event against its kind's fields, which ``fslab show``
makes of the run, against the old check (generators in any() and all(), kept
here as they were), both giving the same events.

Options: ``--steps N`` (200000: steps per epoch times 100 epochs), ``--repeats N`` (3: the
fastest is shown).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import options  # noqa: E402
from make_runs import train_event, write_run  # noqa: E402

EPOCHS = 100


def make_long_run(root: Path, steps: int) -> Path:
    folder = root / "20260101-000000-nca-long"
    now = time.time()
    write_run(folder, 0, "completed", max(1, steps // EPOCHS), EPOCHS, now - 3 * steps, now, random.Random(0))
    return folder


def old_way(folder: Path, step: dict) -> tuple[dict, float]:
    """What the UI thread did before, on the same files: the whole fold of the first read (into
    the series, the evaluations' rows and the time line), then the fold of one new step (the
    time line over every event again: time_split); and the fold of that step as the follow thread
    makes it now (the time line's fold goes on from where it was)."""
    from fslab.core.timing import time_split
    from fslab.tui.charts import MinMaxSeries
    from fslab.tui.compare_screen import fold_losses
    from fslab.tui.detail_screen import RunHistory
    from fslab.tui.tailing import RunDelta, RunFollower

    history, read = RunHistory(), RunFollower(folder).read()
    new_step = RunDelta(read.run_id, [step], [], [], 0, None, None)
    from fslab.core import schemas

    snapshot, MinMaxSeries.snapshot = MinMaxSeries.snapshot, lambda self: self  # the UI folded its own series
    checked, schemas.event = schemas.event, lambda event: event  # and timed every event, damaged or not
    try:
        t0 = time.perf_counter()
        history.fold(read, False)
        t1 = time.perf_counter()
        history.fold(new_step, False)
        time_split(history.timed, *history.times)
        t2 = time.perf_counter()
        fold_losses(MinMaxSeries(), read)
        t3 = time.perf_counter()
    finally:
        MinMaxSeries.snapshot, schemas.event = snapshot, checked
    t4 = time.perf_counter()
    history.fold(new_step, False)
    return {"open": t1 - t0, "step": t2 - t1, "compare": t3 - t2, "thread": t2 - t1}, time.perf_counter() - t4


async def ui_thread(runs_dir: Path, folder: Path, step: dict) -> dict:
    """The UI thread's time on the run screen's reads now: opening the run, then one new step; then
    on the compare screen's first read of it."""
    from fslab.tui import make_app
    from fslab.tui.compare_screen import CompareScreen
    from fslab.tui.detail_screen import DetailScreen

    spent, phase = {"open": 0.0, "step": 0.0, "compare": 0.0}, ["open"]
    apply, followed = DetailScreen.apply, CompareScreen.on_runs_followed

    def timed_apply(self, read):
        t0 = time.perf_counter()
        apply(self, read)
        self.update_header()
        spent[phase[0]] += time.perf_counter() - t0

    def timed_followed(self, message):
        t0 = time.perf_counter()
        followed(self, message)
        spent["compare"] += time.perf_counter() - t0

    async def settle(app, pilot):
        for _ in range(3):
            await app.workers.wait_for_complete()
            await pilot.pause()

    DetailScreen.apply, CompareScreen.on_runs_followed = timed_apply, timed_followed
    try:
        app = make_app(runs_dir, tick=3600, cursor_blink=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await settle(app, pilot)
            app.push_screen(DetailScreen(folder.name))
            await settle(app, pilot)
            phase[0] = "step"
            with open(folder / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps(step) + "\n")
            app.screen.follow()
            await settle(app, pilot)
            assert app.screen.series["loss"].count == app.screen.history.series["loss"].count
            app.pop_screen()
            app.push_screen(CompareScreen([folder.name]))
            await settle(app, pilot)
            assert app.screen.losses[folder.name].count == app.screen._folded[folder.name].count > 0
    finally:
        DetailScreen.apply, CompareScreen.on_runs_followed = apply, followed
    return spent


def old_event(record):
    """schemas.event as it was: any() and all() over generators."""
    from fslab.core.schemas import EVENT_OPTIONS, EVENTS, SCORE, is_kind

    matches = lambda value, kinds: any(is_kind(value, kind) for kind in kinds)
    complete = lambda rec, schema: (rec if isinstance(rec, dict) and all(
        key in rec and matches(rec[key], kinds) for key, kinds in schema.items()) else None)
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        return None
    needed = EVENTS.get(record["event"])
    if needed is not None and not complete(record, needed):
        return None
    options = EVENT_OPTIONS.get(record["event"])
    if options is not None and not all(key not in record or matches(record[key], kinds)
                                       for key, kinds in options.items()):
        return None
    if record["event"] == "end" and not all(complete(score, SCORE) for score in record["results"].values()):
        return None
    return record


def schema_check(folder: Path, repeats: int) -> tuple[float, float]:
    """Fastest of ``repeats``: (the old check, the check now) of every event of the run."""
    from fslab.core.files import read_events
    from fslab.core.schemas import event

    events = read_events(folder / "metrics.jsonl")[0]
    times = {}
    for check in (old_event, event):
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            kept = [e for e in events if check(e) is not None]
            best = min(best, time.perf_counter() - t0)
        times[check] = (best, kept)
    (old, old_kept), (now, now_kept) = times[old_event], times[event]
    assert old_kept == now_kept
    return old, now


def main() -> None:
    parser = options.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    options.at_least(parser, args, steps=EPOCHS, repeats=1)
    print(options.machine())
    now, old = ({phase: [] for phase in ("open", "step", "thread", "compare", "show")} for _ in range(2))
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            runs_dir = Path(tmp) / "runs"
            folder = make_long_run(runs_dir, args.steps)
            step = train_event(time.time(), 10**7 + repeat, EPOCHS, random.Random(repeat))
            before, thread_now = old_way(folder, step)
            for phase, seconds in before.items():
                old[phase].append(seconds)
            now["thread"].append(thread_now)
            for phase, seconds in asyncio.run(ui_thread(runs_dir, folder, step)).items():
                now[phase].append(seconds)
            if repeat == 0:
                old_s, now_s = schema_check(folder, args.repeats)
                old["show"].append(old_s)
                now["show"].append(now_s)
    size = (args.steps // EPOCHS) * EPOCHS
    print(f"one run of {size:,} logged steps; the UI thread's time on its run screen and the compare "
          f"screen, and fslab show's check of its events; fastest of {args.repeats}")
    print(f"{'':<28}{'old way':>10}{'now':>10}{'old / now':>11}")
    for phase, what in (("open", "opening the run"), ("step", "one new step appended"),
                        ("thread", "  the step, follow thread"), ("compare", "compare screen: opening"),
                        ("show", "fslab show: events checked")):
        print(f"{what:<28}{ms(min(old[phase])):>10}{ms(min(now[phase])):>10}"
              f"{min(old[phase]) / min(now[phase]):>10.0f}x")


def ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f} ms"


if __name__ == "__main__":
    main()
