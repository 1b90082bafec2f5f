"""Marked runs side by side, as ``fslab compare`` shows them: grouped by
everything but the seed, test accuracy pooled over every episode of a group's
runs, paired differences to the first group; their loss curves overlaid."""

from __future__ import annotations

import threading

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from fslab.core.events import table_score
from fslab.core.runstore import Run, in_creation_order
from fslab.core.text import count, percent, printable, queries_text
from fslab.core.values import is_number
from fslab.reports.compare import (
    compare,
    cut_text,
    damaged_line,
    left_out_lines,
    metrics_name,
    shapes_text,
    unscored_line,
)
from fslab.tui.charts import IntervalChart, LineChart, MinMaxSeries, Plot
from fslab.tui.messages import RunsFollowed
from fslab.tui.tailing import RunFollower, StoreChanges

SHOTS = (1, 5)


class GroupsTable(DataTable):
    """The compared groups, a row each: enter opens a run of the group (Textual's 'Select' did nothing)."""

    BINDINGS = [Binding("enter", "select_cursor", "open", tooltip="Open a run of the group (again: its next run)")]


class CompareScreen(Screen):
    BINDINGS = [Binding("escape,backspace", "app.pop_screen", "back", key_display="esc", tooltip="Back to the runs")]

    def __init__(self, run_ids: list[str]) -> None:
        super().__init__()
        self.run_ids = run_ids
        self.followers: list[RunFollower] = []
        self.losses = {run_id: MinMaxSeries() for run_id in run_ids}  # what the chart draws: copies of _folded's
        self._folded = {run_id: MinMaxSeries() for run_id in run_ids}  # folded in the follow thread, under _lock
        self._lock = threading.Lock()
        self._stale = True  # the report must be computed again
        self.gone: list[str] = []  # the compared runs whose folders are gone, as last shown
        self.group_runs: list[list[str]] = []  # each row's runs, as fslab compare groups them
        self.opened: dict[tuple[str, ...], str] = {}  # the run enter last opened, by its group's runs

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="compare"):
            runs = count(len(self.run_ids), "run")
            yield Static(Text(f"{runs}, grouped as fslab compare groups them (every setting but the seed and "
                              f"those that leave the test as it is); test accuracy pooled over all episodes of a "
                              f"group's runs"), id="compare-note")
            yield GroupsTable(id="groups", cursor_type="row")
            yield Static(id="paired")
            with Horizontal(id="compare-charts"):
                yield IntervalChart(id="chart-accuracy")
                yield LineChart("training loss", Plot([(run_id, self.losses[run_id]) for run_id in self.run_ids]),
                                id="chart-compare")
        yield Footer()

    def on_mount(self) -> None:
        # the numbers first, the group's settings (as long as its differences) last: a wide label never
        # pushes them off the screen; # names the group in the interval chart
        self.query_one("#groups", DataTable).add_columns("#", "seed values", "runs", "test 1-shot (%)",
                                                         "test 5-shot (%)", "episodes", "group")
        self.followers = [RunFollower(self.app.runs_dir / run_id) for run_id in self.run_ids]
        # compared oldest first, as fslab compare all and fslab compare SWEEP take them: the first group, the
        # baseline of the paired differences, was the newest marked run's (a sweep's last learning rate, its
        # differences to the others the opposite of fslab compare's)
        self.oldest_first = in_creation_order(self.app.runs_dir, self.run_ids)
        self.follow()
        self.set_interval(self.app.tick, self.follow)

    @work(thread=True, group="follow", exit_on_error=False)
    def follow(self) -> None:
        """Read the runs' new events; when an evaluation arrived (or at first),
        compute the comparison again, in this worker thread."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            deltas = [f.read(logs=False) for f in self.followers]
            # the losses folded here, not on the UI thread: seconds there for runs of 200,000 steps
            losses = {d.run_id: self._folded[d.run_id].snapshot() for d in deltas
                      if fold_losses(self._folded[d.run_id], d)}
            stale = self._stale or any(d.reset or any(e.get("event") == "eval" for e in d.events) for d in deltas)
            present = [Run(self.app.runs_dir / run_id) for run_id in self.oldest_first
                       if (self.app.runs_dir / run_id).is_dir()]
            gone = [f.path.name for f in self.followers if not f.path.is_dir()]
            report = None
            if stale and present:  # episodes of the runs' own shape, as fslab compare reads them by default
                report = compare(present, shots=SHOTS, ways=None, queries=None)
            self._stale = stale and not present
        finally:
            self._lock.release()
        self.post_message(RunsFollowed(report, losses, gone))

    def on_runs_followed(self, message: RunsFollowed) -> None:
        for run_id, series in message.series.items():
            self.losses[run_id].take(series)
        if message.series:
            self.query_one("#chart-compare", LineChart).refresh()
        if message.report is not None:
            self.gone = message.gone
            self.show_report(message.report)
        elif message.gone != self.gone and len(message.gone) == len(self.run_ids):  # nothing left to compare
            self.gone = message.gone
            self.query_one("#compare-note", Static).update(Text(
                f"{count(len(self.run_ids), 'run')}: every one deleted while open", style="bold red"))
            self.query_one("#groups", DataTable).clear()
            self.group_runs = []
            self.query_one("#paired", Static).update("")
            self.query_one("#chart-accuracy", IntervalChart).blocks = []
            self.query_one("#chart-accuracy", IntervalChart).refresh(layout=True)

    def apply_store_changes(self, changes: StoreChanges) -> None:
        if any(r.id in self.losses for r in changes.rows) or any(r in self.losses for r in changes.removed):
            self._stale = True  # a run ended, resumed or was deleted: what is pooled may have changed

    def show_report(self, report: dict) -> None:
        self.query_one("#compare-note", Static).update(Text(
            f"{count(len(self.run_ids), 'run')}, grouped as fslab compare groups them (every setting but the "
            f"seed and those that leave the test as it is); test accuracy on {report['ways']}-way episodes with "
            f"{queries_text(report['queries'])}, pooled over all episodes of a group's runs"
            + printable(cut_text(report))  # runs scored on more, read on their first as many, as the title says
            + (f"; left out, deleted while open: {printable(', '.join(self.gone))}" if self.gone else "")
            # the runs left out, each reason as fslab compare says it (a repeat of a run's settings and seed
            # too, which the screen passed over without a word), and those without scores, with their state
            + "".join(f"; {printable(line)}" for line in (*left_out_lines(report), unscored_line(report)) if line)
            + (f"; split by the data their runs were scored on (neither pooled nor paired across it): "
               f"{printable('; '.join(report['data_split']))}" if report.get("data_split") else "")
            + "".join(f"; {printable(run)} left out, scored on {shapes_text(shapes)}"
                      for run, shapes in report["other_shapes"].items())
            + (f"; {printable(damaged)}" if (damaged := damaged_line(report.get("damaged") or {})) else "")))
        table = self.query_one("#groups", DataTable)
        table.clear()
        self.group_runs = [row["runs"] for row in report["groups"]]
        for number, row in enumerate(report["groups"], 1):
            one, five = row["results"].get("1-shot"), row["results"].get("5-shot")
            # the runs with scores, fslab compare's seeds: counted again here, a run with 1-shot scores alone
            # and one with 5-shot scores alone were one run with scores
            unscored = len(row["runs"]) - row["seeds"]
            missing = f" ({unscored} without test scores)" if unscored else ""
            episodes = ", ".join(f"{s}: {v['episodes']}" for s, v in sorted(row["results"].items()))
            table.add_row(Text(f"#{number}"), Text(printable(", ".join(str(s) for s in row["seed_values"]))),
                          Text(f"{len(row['runs'])}{missing}"), Text(table_score(one)), Text(table_score(five)),
                          Text(episodes or "-"), Text(printable(row["group"])))
        self.show_intervals(report)
        lines = [f"{p['group']} − {p['baseline']}, {p['shots']}-shot: {percent(p['difference'], sign=True)} ± "
                 f"{percent(p['ci95'])} points (paired over {p['episodes']} episodes)" for p in report["paired"]]
        self.query_one("#paired", Static).update(Text(printable("\n".join(lines), lines=True)))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter (or a click on the highlighted row): the run screen of the group's first run still there,
        and of its next one at each enter again on the group, as the runs table opens a run."""
        from fslab.tui.detail_screen import DetailScreen

        if event.cursor_row >= len(self.group_runs):
            return
        runs = self.group_runs[event.cursor_row]
        present = [run_id for run_id in runs if run_id in self.app.rows]
        if not present:
            self.notify(f"group #{event.cursor_row + 1}: every run of it was deleted (their folders are gone)",
                        markup=False)
            return
        last = self.opened.get(tuple(runs))
        run_id = present[(present.index(last) + 1) % len(present)] if last in present else present[0]
        self.opened[tuple(runs)] = run_id
        if len(present) > 1:
            self.notify(f"group #{event.cursor_row + 1}: run {present.index(run_id) + 1} of {len(present)}, "
                        f"{run_id}; enter again opens the next", markup=False)
        self.app.push_screen(DetailScreen(run_id))

    def show_intervals(self, report: dict) -> None:
        """The groups' pooled test accuracy ± 95% CI as intervals, a block per shot count."""
        chart = self.query_one("#chart-accuracy", IntervalChart)
        chart.blocks = []
        for shots in SHOTS:
            scored = [(number, row, row["results"][f"{shots}-shot"]) for number, row in enumerate(report["groups"], 1)
                      if f"{shots}-shot" in row["results"]]
            # named by what was pooled, as fslab plot's y axis: a retrieval evaluator's mAP is no accuracy
            metrics = {result.get("metric", "accuracy") for _, _, result in scored}
            chart.blocks.append((f"test {shots}-shot {metrics_name(metrics)} (%) ± 95% CI", [
                (f"#{number} {printable(row['group'])}", result["accuracy"], result["ci95"])
                for number, row, result in scored]))
        chart.refresh(layout=True)



def fold_losses(series: MinMaxSeries, delta) -> bool:
    """Fold one read of a run's training losses into ``series``; whether it changed."""
    changed = delta.reset
    if delta.reset:  # resumed: the file was cut back to a checkpoint and is read again
        series.clear()
    for event in delta.events:
        step, loss = event.get("step", 0), event.get("loss")
        # a damaged line (a step that is text or null) is passed over, as the run screen passes it
        if event.get("event") == "train" and is_number(step) and is_number(loss):
            series.append(float(step), float(loss))
            changed = True
    return changed


