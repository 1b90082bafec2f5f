"""Marked runs side by side: grouped by everything but the seed, test accuracy
pooled over each group's episodes, loss curves overlaid."""

from __future__ import annotations

import threading

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from fslab.tui import model
from fslab.tui.charts import LineChart, MinMaxSeries, Plot
from fslab.tui.messages import RunsFollowed
from fslab.tui.tailing import RunFollower, StoreChanges


class CompareScreen(Screen):
    BINDINGS = [Binding("escape,backspace", "app.pop_screen", "back", key_display="esc")]

    def __init__(self, run_ids: list[str]) -> None:
        super().__init__()
        self.run_ids = run_ids
        self.followers: list[RunFollower] = []
        self.configs: dict[str, dict] = {}
        self.losses = {run_id: MinMaxSeries() for run_id in run_ids}
        self._lock = threading.Lock()

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="compare"):
            yield Static(Text(f"{len(self.run_ids)} runs, grouped by every setting except the seed; "
                              "test accuracy pooled over all episodes of a group's runs"), id="compare-note")
            yield DataTable(id="groups", cursor_type="row")
            yield LineChart("training loss", Plot([(run_id, self.losses[run_id]) for run_id in self.run_ids]),
                            id="chart-compare")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#groups", DataTable).add_columns("group", "seeds", "runs", "test 1-shot (%)",
                                                         "test 5-shot (%)", "episodes")
        self.followers = [RunFollower(self.app.runs_dir / run_id) for run_id in self.run_ids]
        self.follow()
        self.set_interval(self.app.tick, self.follow)

    @work(thread=True, group="follow", exit_on_error=False)
    def follow(self) -> None:
        if not self._lock.acquire(blocking=False):
            return
        try:
            deltas = [f.read(logs=False) for f in self.followers]
        finally:
            self._lock.release()
        self.post_message(RunsFollowed(deltas))

    def on_runs_followed(self, message: RunsFollowed) -> None:
        changed = False
        for delta in message.deltas:
            if delta.reset:
                self.losses[delta.run_id].clear()
                changed = True
            if delta.config is not None:
                self.configs[delta.run_id] = delta.config
                changed = True
            for event in delta.events:
                if event.get("event") == "train" and isinstance(event.get("loss"), (int, float)):
                    self.losses[delta.run_id].append(event.get("step", 0), float(event["loss"]))
                    changed = True
                changed |= event.get("event") == "eval"
        if changed:
            self.query_one("#chart-compare", LineChart).refresh()
            self.update_groups()

    def apply_store_changes(self, changes: StoreChanges) -> None:
        if any(r.id in self.losses for r in changes.rows):
            self.update_groups()

    def update_groups(self) -> None:
        rows = self.app.rows
        configs = {r: self.configs[r] for r in self.run_ids if r in self.configs}
        tests = {r: rows[r].test for r in configs if r in rows}
        table = self.query_one("#groups", DataTable)
        table.clear()
        for group in model.group_runs(configs, tests):
            one, five = group.test.get("1-shot"), group.test.get("5-shot")
            episodes = ", ".join(f"{s}: {v['episodes']}" for s, v in sorted(group.test.items()) if v)
            missing = f" ({group.without_test} without test yet)" if group.without_test else ""
            table.add_row(Text(group.label), Text(", ".join(str(s) for s in group.seeds)),
                          Text(f"{len(group.run_ids)}{missing}"), Text(model.pct(one)), Text(model.pct(five)),
                          Text(episodes or "-"))
