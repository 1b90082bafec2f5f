"""One run in depth: live charts, every evaluation, configuration and logs."""

from __future__ import annotations

import json
import threading
from collections import deque

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Log, Static, TabbedContent, TabPane

from fslab.core import schemas
from fslab.core.config import NOT_HERE
from fslab.core.events import is_validation, logged_evaluator, precision_note, score_cell
from fslab.core.runstore import Run
from fslab.core.sinks import failure_line, failures
from fslab.core.states import LIVE, LOST_AFTER_S, heartbeat_age, heartbeat_stale
from fslab.core.text import count, printable
from fslab.core.timing import TimeSplit, time_line
from fslab.reports.compare import metrics_name
from fslab.tui import model
from fslab.tui.charts import LineChart, MinMaxSeries, Plot
from fslab.tui.messages import RunRead
from fslab.tui.tailing import RunDelta, RunFollower, StoreChanges

# Tabs short enough that their labels (with their number key) fit 80
# columns, and the charts split so that each tab's charts fit a 24-line screen.
TABS = ("train", "pairs", "val", "evals", "config", "stdout", "stderr")
TAB_HELP = {"train": "Training loss and learning rate", "pairs": "Positive and negative pairs per batch",
            "val": "Validation score by epoch, in % (mAP for a retrieval evaluator)", "evals": "Every evaluation",
            "config": "Resolved configuration", "stdout": "Standard output, followed",
            "stderr": "Standard error, followed"}
# Keys that scroll a tab's content (its widget, by tab), the focus staying on the tab bar.
SCROLL_KEYS = (("up,k", "up", "one line up"), ("down,j", "down", "one line down"), ("pageup", "page_up", "a page up"),
               ("pagedown", "page_down", "a page down"), ("home", "home", "to its top"), ("end", "end", "to its end"))
SCROLLED = {"evals-tab": "#evals", "config": "#config-scroll", "stdout": "#stdout-log", "stderr": "#stderr-log"}
BANNERED = ("failed", "lost")  # the states whose run screen says why it stopped in a banner, stderr's end below
BANNER_STDERR_LINES = 8
BANNER_FRAME = 4  # the banner's border and padding, in columns
BANNER_SPARE_LINES = 18  # lines of the screen the banner leaves to the rest (the charts' 6 included)
SUMMARY_FRAME = 2  # the summary's padding, in columns
SINK_LINES = 3  # the most lines of the summary a sink that failed takes (its error cut short to fit)
TIMED_FIELDS = ("event", "time", "epoch", "split", "seconds", "source")  # what fslab.core.timing reads of an event
SERIES = ("loss", "lr", "positives", "negatives", "val", "val_lo", "val_hi")


class RunHistory:
    """What the run screen draws of its run's events, folded in the follow thread: the charts'
    series, the evaluations' new rows and where the time went. The UI thread only takes copies:
    opening a run of 200,000 logged steps held it for seconds, and each new event of such a run
    folded every event again there for the time line."""

    def __init__(self) -> None:
        self.series = {name: MinMaxSeries() for name in SERIES}
        self.timed: list[dict] = []  # the events that say where the run's time went (fslab.core.timing)
        self.times: tuple = (None, None, None)  # the status's started, ended and resumed
        self.split = TimeSplit(*self.times)  # the fold of timed, for those times
        self.time_line = ""
        self.val_metrics: set[str] = set()  # what the validations scored (accuracy, map): the val chart's title

    def fold(self, delta: RunDelta, fresh: bool) -> tuple[dict[str, MinMaxSeries] | None, list[list[Text]]]:
        """Fold one read (``fresh``: the run's files read again from the top); copies of the series
        when they changed (else None), and a row per new evaluation."""
        s, rows = self.series, []
        if delta.reset or fresh:  # resumed (the file cut back to a checkpoint), or its folder back
            for series in s.values():
                series.clear()
            self.timed.clear()
            self.val_metrics.clear()
        # the events fslab show times: those with the fields of their kind (a damaged line is not the run's time)
        timed = [{k: event[k] for k in TIMED_FIELDS if k in event} for event in delta.events
                 if schemas.event(event) is not None]
        self.timed += timed
        for event in delta.events:
            try:
                if event.get("event") == "train":
                    step = event["step"]
                    for name in ("loss", "lr", "positives", "negatives"):
                        if event.get(name) is not None:
                            s[name].append(step, float(event[name]))
                elif event.get("event") == "eval":
                    if is_validation(event):  # in percent, as the evals tab and fslab show give the score
                        acc, ci = 100 * float(event["accuracy"]), 100 * float(event["ci95"])
                        s["val"].append(event["epoch"], acc)
                        s["val_lo"].append(event["epoch"], acc - ci)
                        s["val_hi"].append(event["epoch"], acc + ci)
                        metric = event.get("metric", "accuracy")  # as metric_label reads it: not text is accuracy
                        self.val_metrics.add(metric if isinstance(metric, str) else "accuracy")
                    rows.append([Text(printable(event["split"])),
                                 Text(printable(logged_evaluator(event) + precision_note(event))),
                                 *(Text(printable(event.get(k, "-"))) for k in
                                   ("ways", "shots", "queries", "episodes", "epoch")),
                                 Text(score_cell(event))])
            except (KeyError, TypeError, ValueError):  # a damaged line: not drawn (the summary counts it)
                pass
        series_changed = changed = bool(delta.events or delta.reset or fresh)
        times = self.times if delta.status is None else tuple(delta.status.get(k)
                                                              for k in ("started", "ended", "resumed"))
        if delta.reset or fresh or times != self.times:  # the fold starts again, over every event
            self.times, self.split = times, TimeSplit(*times).add(self.timed)
            changed = True
        else:  # the new events only: a run of 200,000 steps took a tenth of a second a tick otherwise
            self.split.add(timed)
        if changed:
            spent = self.split.result()
            self.time_line = time_line(spent) if spent["total_s"] > 0 else ""
        return ({name: series.snapshot() for name, series in s.items()} if series_changed else None), rows


class EvalsTable(DataTable):
    """The run's evaluations, a row each: a row opens nothing (each is of this run), so enter is no key here
    (Textual's 'Select', which ? listed, did nothing)."""

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return action != "select_cursor" and super().check_action(action, parameters)


def val_title(metrics) -> str:
    """The val chart's title: what the run's validations scored, named as fslab compare names pooled scores
    (``accuracy``, ``mAP`` for a retrieval evaluator), in percent as the evals tab gives them."""
    return f"validation {metrics_name(metrics)} (%) by epoch (band: 95% CI)"


class DetailScreen(Screen):
    BINDINGS = [
        Binding("escape,backspace", "app.pop_screen", "back", key_display="esc", tooltip="Back to the runs"),
        Binding("s", "stop", "stop", tooltip="Stop the run (queued or running)"),
        Binding("r", "resume", "resume",
                tooltip="Resume the run (killed, lost or failed), or start it (queued, nobody holds it)"),
        *(Binding(str(i), f"tab('{tab}')", tab, show=False, tooltip=TAB_HELP[tab]) for i, tab in enumerate(TABS, 1)),
        # the focus stays on the tab bar (←→ change tabs): these scroll the tab's own content, which no key reached
        *(Binding(key, f"scroll_tab('{how}')", f"scroll {label}", show=False,
                  tooltip=f"Scroll the evals, config, stdout or stderr tab {label}")
          for keys, how, label in SCROLL_KEYS for key in keys.split(",")),  # a binding a key: ? shows each
    ]

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.follower: RunFollower | None = None
        self._lock = threading.Lock()
        self.series = {name: MinMaxSeries() for name in SERIES}  # what the charts draw, copies of history's
        self.history = RunHistory()  # folded in the follow thread, under _lock
        self.stderr_tail: deque[str] = deque(maxlen=BANNER_STDERR_LINES)
        self.time_line = ""  # where the run's time went, as fslab show says it ('' before any)
        self.sink_failures: dict[str, dict] = {}  # the sinks that failed as it trained, as fslab show reads them
        self.missing = False
        self.config_problem: str | None = None  # why the config tab shows no configuration, as it says it now
        self.claim_problem: str | None = None  # why the queued run will not start unless a person acts (fslab queue's)

    def compose(self) -> ComposeResult:
        s = self.series
        yield Header()
        yield Static(id="banner")
        yield Static(id="summary")
        with TabbedContent(id="tabs"):
            with TabPane("1 train", id="train"), Grid(classes="chart-pair"):
                yield LineChart("training loss", Plot([("loss", s["loss"])]), id="chart-loss")
                yield LineChart("learning rate", Plot([("lr", s["lr"])], steps=True), id="chart-lr")
            with TabPane("2 pairs", id="pairs"), Grid(classes="chart-pair"):
                yield LineChart("positive pairs per batch", Plot([("positives", s["positives"])]), id="chart-pos")
                yield LineChart("negative pairs per batch", Plot([("negatives", s["negatives"])]), id="chart-neg")
            with TabPane("3 val", id="val"):
                yield LineChart(val_title(()),
                                Plot([("val", s["val"])], (s["val_lo"], s["val_hi"])), id="chart-val")
            with TabPane("4 evals", id="evals-tab"):
                yield EvalsTable(id="evals", cursor_type="row")
            with TabPane("5 config", id="config"), VerticalScroll(id="config-scroll"):
                yield Static(id="config-text")
            with TabPane("6 stdout", id="stdout"):
                yield Log(id="stdout-log", max_lines=2000)
            with TabPane("7 stderr", id="stderr"):
                yield Log(id="stderr-log", max_lines=2000)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#evals", DataTable).add_columns("split", "evaluator", "ways", "shots", "queries", "episodes",
                                                        "epoch", "accuracy ± 95% CI (%)")
        self.follower = RunFollower(self.app.runs_dir / self.run_id)
        self.update_header()
        self.follow()
        self.set_interval(self.app.tick, self.follow)

    @work(thread=True, group="follow", exit_on_error=False)
    def follow(self) -> None:
        if not self._lock.acquire(blocking=False):
            return
        try:
            fresh = self.missing and self.follower.path.is_dir()
            if fresh:  # back (moved back, rsynced in): read it afresh
                self.follower = RunFollower(self.follower.path)
            row = self.app.rows.get(self.run_id)  # its state as the table reads it: lost included
            delta = self.follower.read(ended=row is not None and row.state not in LIVE)
            series, rows = (None, []) if delta.missing else self.history.fold(delta, fresh)
            # read here, off the UI thread: the worker writes it as a sink fails, fslab export removes it
            sinks = {} if delta.missing else failures(self.follower.path)
            # its claim read only while it is queued, as fslab runs reads it: fslab queue's line
            problem = Run(self.follower.path).claim_problem() if row is not None and row.state == "queued" else None
            read = RunRead(delta, series, rows, self.history.time_line, sinks, tuple(self.history.val_metrics),
                           None if delta.missing else problem, self.root_not_here(delta.config))
        finally:
            self._lock.release()
        self.post_message(read)

    def root_not_here(self, config: dict | None) -> str | None:
        """The data root of a configuration just read where it is no folder on this machine, as fslab show
        marks it (:func:`fslab.core.config.root_not_here`); read off the UI thread, the plugins loaded once."""
        if config is None:
            return None
        import fslab
        from fslab.core.config import root_not_here

        return root_not_here(config.get("dataset"), fslab.get_registry(self.app.settings, report=lambda line: None))

    def on_run_read(self, message: RunRead) -> None:
        self.apply(message)
        self.update_header()

    def apply(self, read: RunRead) -> None:
        delta = read.delta
        if delta.missing:
            self.missing = True
            return
        evals = self.query_one("#evals", DataTable)
        back, self.missing = self.missing, False
        if back:  # its folder is back: every file is read again from the top
            for log in self.query(Log):
                log.clear()
            self.stderr_tail.clear()
        if delta.reset or back:  # resumed: the file was cut back to a checkpoint and is read again
            evals.clear()
        if read.series is not None:
            for name, series in read.series.items():
                self.series[name].take(series)
            self.query_one("#chart-val", LineChart).title = val_title(read.val_metrics)
            for chart in self.query(LineChart):
                chart.refresh()
        for row in read.rows:
            evals.add_row(*row)
        self.time_line = read.time_line
        self.sink_failures = read.sink_failures
        self.claim_problem = read.claim_problem
        if delta.config is not None:
            self.config_problem = None
            gone = f"data root {read.root_not_here} {NOT_HERE}\n" if read.root_not_here else ""  # as fslab show
            self.query_one("#config-text", Static).update(Text(gone + json.dumps(delta.config, indent=2,
                                                                                 sort_keys=True)))
        elif delta.config_problem not in (None, self.config_problem):  # read again at each tick until it can be:
            self.config_problem = delta.config_problem  # the tab's line set again only when the reason changed
            self.query_one("#config-text", Static).update(Text(f"no configuration to show: "
                                                               f"{printable(delta.config_problem)}", style="yellow"))
        if delta.stdout:
            self.query_one("#stdout-log", Log).write_lines(delta.stdout)
        if delta.stderr:
            self.query_one("#stderr-log", Log).write_lines(delta.stderr)
            self.stderr_tail.extend(delta.stderr)

    def apply_store_changes(self, changes: StoreChanges) -> None:
        if any(r.id == self.run_id for r in changes.rows) or self.run_id in changes.removed:
            self.update_header()

    def update_header(self) -> None:
        row = self.app.rows.get(self.run_id)
        banner = self.query_one("#banner", Static)
        if row is None or self.missing:
            banner.update(Text(f"run {self.run_id}: its folder is gone (deleted while open)", style="bold red"))
            banner.display = True
            return
        named = " · ".join(f"{what} {'-' if value is None else value}" for what, value in (
            ("method", row.method), ("loss", row.loss_fn), ("backbone", row.backbone), ("dataset", row.dataset),
            ("seed", row.seed), *((("sweep", row.sweep),) if row.sweep else ())))  # its peers: as fslab show names it
        problem = self.claim_problem if row.state == "queued" else None  # queued!, as the runs table marks it
        summary = Text.assemble(
            (printable(row.id), "bold"), "  ", model.state_text(row, problem), "  ",
            printable(named) + " · "
            f"epoch {model.epoch_text(row).plain} · step {row.step or 0}"
            f"{'/' + str(row.total_steps) if row.total_steps else ''} · "
            f"elapsed {model.duration(model.elapsed(row, self.app.clock()))} · "
            f"ETA {model.duration(model.eta(row, self.app.clock()))}",
        )
        now = self.app.clock() + row.clock_ahead  # the heartbeat's host's present
        if model.usage_text(row):
            summary.append(" · " + model.usage_text(row))
        beat = {"state": row.state, "heartbeat": row.heartbeat}  # the row's, as the table's: one reading of the status
        if heartbeat_stale(beat, row.beat_every, now):  # still running: its worker holds the lock, paused or stuck
            summary.append(f" · heartbeat stale ({model.duration(heartbeat_age(beat, now))} ago)", style="yellow")
        if row.corrupt:  # the summary's count, as the table's ! and fslab show --json's corrupt
            summary.append(f" · {count(row.corrupt, 'corrupt metrics line')} skipped", style="yellow")
        if row.note:
            summary.append(f" · {printable(row.note)}", style="yellow")
        if self.claim_problem and row.state == "queued":  # fslab queue's line: the run will not start on its own
            summary.append("\n")
            summary.append(printable(self.claim_problem), style="yellow")
        if row.error and row.error != row.note and row.state not in BANNERED:  # a killed run's why: fslab show's line
            summary.append(f" · error: {printable(row.error)}", style="yellow")
        for line in self.sink_lines(row):  # its tracker lacks the rest: fslab show's own line
            summary.append("\n")
            summary.append_text(line)
        if self.time_text():
            summary.append("\n" + self.time_text(), style="dim")
        self.query_one("#summary", Static).update(summary)
        banner.display = row.state in BANNERED
        if banner.display:
            banner.update(self.why_it_stopped(row))

    def sink_lines(self, row) -> list[Text]:
        """fslab show's line for each sink that failed as the run trained, in at most :data:`SINK_LINES` lines
        of the summary each, so the charts keep theirs at 80x24: a long error is cut short (fslab show and the
        stderr tab have it whole), never the export that catches the sink up."""
        width = max(20, self.app.size.width - SUMMARY_FRAME)
        lines = []
        for name, failure in self.sink_failures.items():
            room = None
            while True:
                line = Text(printable(failure_line(row.id, name, failure, row.state, room)), style="yellow")
                if room == 0 or len(line.wrap(self.app.console, width)) <= SINK_LINES:
                    break
                room = max(0, (len(failure["error"]) if room is None else room) - width // 2)
            lines.append(line)
        return lines

    def time_text(self) -> str:
        """Where the run's time went, as fslab show prints it ('' before any); folded in the follow
        thread (RunHistory), and only when events or the status changed."""
        return self.time_line

    def why_it_stopped(self, row) -> Text:
        """Why the run stopped, then the last lines of stderr, in as many lines
        as the screen spares (6 at 80x24, so the tab's charts still fit): the
        reason gets at most 3 of them, the stderr lines are cut at the width,
        and the lines shown are the last ones, where a traceback's exception is."""
        if row.state == "failed":
            why = Text(f"FAILED: {printable(row.error or 'no error recorded')}", style="bold red")
        else:
            why = Text("LOST: the worker died without writing an end state (its process is gone and the run's "
                       f"lock free, or, on another host, no heartbeat for {LOST_AFTER_S:.0f} s)", style="bold red")
            if row.error:
                why.append(f": {printable(row.error)}")
        width = max(20, self.app.size.width - BANNER_FRAME)
        budget = max(3, min(BANNER_STDERR_LINES + 2, self.app.size.height - BANNER_SPARE_LINES))
        reason = list(why.wrap(self.app.console, width))
        if len(reason) > min(3, budget - 2):
            reason = reason[:min(3, budget - 2)]
            reason[-1].truncate(width - 1)
            reason[-1].append("…")
        out = Text("\n").join(reason)
        lines = list(self.stderr_tail)[-(budget - len(reason) - 1):]
        out.append("\nlast lines of stderr:" if lines else "\nstderr is empty", style="bold")
        for line in lines:
            shown = Text("  " + line)
            shown.truncate(width, overflow="ellipsis")
            out.append("\n")
            out.append_text(shown)
        return out

    def on_resize(self) -> None:
        self.update_header()  # the banner fits its lines to the screen

    def action_tab(self, tab: str) -> None:
        self.query_one("#tabs", TabbedContent).active = "evals-tab" if tab == "evals" else tab

    def action_scroll_tab(self, how: str) -> None:
        """Scroll the active tab's table, configuration or log (a chart's tab has nothing to scroll)."""
        shown = SCROLLED.get(self.query_one("#tabs", TabbedContent).active)
        if shown is not None:
            getattr(self.query_one(shown), f"scroll_{how}")(animate=False)

    def shows(self, run_id: str) -> bool:
        """Whether this is ``run_id``'s screen, the run s and r act on."""
        return self.run_id == run_id

    def action_stop(self) -> None:
        self.app.request_stop(self.run_id)

    def action_resume(self) -> None:
        self.app.request_resume(self.run_id)
