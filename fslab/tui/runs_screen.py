"""The main screen: every run in one live table, filterable and sortable."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Static

from fslab.core.settings import project_above
from fslab.core.states import LIVE
from fslab.core.text import count
from fslab.tui import model
from fslab.tui.runs_table import RunsTable
from fslab.tui.tailing import StoreChanges

SORT_ORDER = tuple(model.SORTS)
MARKERS = {False: "▲", True: "▼"}  # ascending, descending


class RunsScreen(Screen):
    # The footer shows what fits at 80 columns; ``?`` lists every key.
    BINDINGS = [
        Binding("enter", "open", "open", tooltip="Open the run: charts, evaluations, config, logs"),
        Binding("space", "mark", "mark", show=False, tooltip="Mark or unmark the run (for compare)"),
        Binding("c", "compare", "compare", show=False, tooltip="Compare the marked runs"),
        Binding("s", "stop", "stop", show=False, tooltip="Stop the queued or running run"),
        Binding("r", "resume", "resume", show=False,
                tooltip="Resume the killed, lost or failed run, or start a queued one nobody holds"),
        Binding("d", "delete", "delete", show=False, tooltip="Delete the ended run for good (asks first)"),
        Binding("n", "launch", "new run", tooltip="Start a new run from a form"),
        Binding("N", "launch_like", "new run like this", key_display="N", show=False,
                tooltip="Start a new run with this run's settings (the form pre-filled, as fslab run --like)"),
        Binding("slash", "filter", "filter", key_display="/", tooltip="Filter runs by words or field:text"),
        Binding("o", "sort", "sort", tooltip="Sort by the next column (click a header to sort by it)"),
        Binding("O", "reverse", "reverse", key_display="O", show=False, tooltip="Reverse the sort order"),
        Binding("escape", "clear_filter", "clear filter", show=False, tooltip="Clear the filter"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.query_text = ""
        self.sort_by = "id"
        self.reverse = True  # newest runs first

    def compose(self) -> ComposeResult:
        yield Header()
        yield Input(placeholder="/ filter: words, or method:nca state:running dataset:… (esc clears)", id="filter")
        yield RunsTable(model.COLUMNS, model.WIDTHS, self.cells, id="runs")
        yield Static(id="status", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#filter", Input).cursor_blink = self.app.cursor_blink
        self.query_one(RunsTable).focus()
        self.rebuild()

    @property
    def table(self) -> RunsTable:
        return self.query_one(RunsTable)

    def cells(self, run_id: str) -> list[Text]:
        return model.row_cells(self.app.rows[run_id], self.app.clock(), run_id in self.table.marked,
                               self.app.problems.get(run_id))

    # -- keeping the table in step with the store --------------------------------
    def visible_ids(self) -> list[str]:
        query = model.newest_sweep(self.query_text, self.app.runs_dir)  # sweep:last, read at each rebuild
        rows = [r for r in self.app.rows.values() if model.matches(r, query)]
        return [r.id for r in model.sort_rows(rows, self.sort_by, self.reverse, self.app.clock())]

    def rebuild(self) -> None:
        table = self.table
        table.marked &= set(self.app.rows)
        ids = self.visible_ids()
        if ids != table.ids:
            table.set_ids(ids)
        table.invalidate_all()
        marker = MARKERS[self.reverse]
        table.set_labels([f"{c}{marker}" if c == self.sort_by else c for c in model.COLUMNS])
        self.update_status()

    def apply_store_changes(self, changes: StoreChanges) -> None:
        table = self.table
        # Sorted by id and unfiltered (the default), the order changes only when
        # runs come or go; then a tick costs the changed rows, not a sort of all.
        arrived = any(row.id not in table.shown for row in changes.rows)
        table.marked -= set(changes.removed)  # a deleted run is no longer marked (nor counted as marked)
        if changes.removed or arrived or self.query_text or self.sort_by != "id":
            ids = self.visible_ids()
            if ids != table.ids:
                table.set_ids(ids)
        # Changed rows, and live rows whose elapsed time and ETA move with the clock.
        live = [r.id for r in self.app.rows.values() if r.state in LIVE]
        table.invalidate([r.id for r in changes.rows] + live + list(changes.problems))
        self.update_status()

    def update_status(self) -> None:
        rows = self.app.rows.values()
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.state] = counts.get(r.state, 0) + 1
        states = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        parts = [f"{len(self.table.ids)} of {len(self.app.rows)} runs" + (f" ({states})" if states else "")]
        # what explains the table's (!) markers comes first: the line wraps, but the most needed goes first
        noted = sum(1 for r in rows if r.note)
        corrupt = sum(r.corrupt for r in rows)
        if noted:
            parts.append(f"{count(noted, 'run')} with unreadable files (!)")
        if corrupt:
            parts.append(f"{count(corrupt, 'corrupt metrics line')} skipped (!)")
        if self.app.skipped:  # not runs (or runs being created): fslab runs leaves them out too
            parts.append(f"{count(len(self.app.skipped), 'folder')} without config.json or status.json skipped")
        parts.append(f"sort: {self.sort_by}{MARKERS[self.reverse]}")
        unknown = model.unknown_fields(self.query_text)
        if unknown:
            parts.insert(0, f"unknown filter field {', '.join(unknown)}: use {', '.join(model.FIELDS)}")
        elif self.query_text:
            parts.append(f"filter: {self.query_text}{model.last_sweep_said(self.query_text, self.app.runs_dir)}")
        left, right = self.table.hidden_columns()
        if left or right:
            parts.append(f"←{left} →{right} columns")
        if self.table.marked:
            parts.append(f"{len(self.table.marked)} marked")
        if not self.app.rows and self.app.runs_dir.is_file():  # made a file since the dashboard opened
            parts.append(f"{self.app.runs_dir} is a file, not the runs folder: move or rename it")
        elif not self.app.rows:  # opened in a project's subfolder: the project above is named, as fslab runs names it
            parts.append(f"no runs in {self.app.runs_dir} yet: press n to start one{project_above()}")
        self.query_one("#status", Static).update(Text(" · ".join(parts)))

    # -- filter --------------------------------------------------------------------
    def on_input_changed(self, event: Input.Changed) -> None:
        self.query_text = event.value
        unknown = model.unknown_fields(event.value)
        event.input.set_class(bool(unknown), "-unknown-field")
        event.input.border_title = (f"unknown field {', '.join(unknown)}: use {', '.join(model.FIELDS)}"
                                    if unknown else None)
        self.rebuild()

    def on_resize(self) -> None:
        self.call_after_refresh(self.update_status)

    def on_runs_table_header_clicked(self, event: RunsTable.HeaderClicked) -> None:
        """Sort by the clicked column; a second click reverses it."""
        if event.column not in model.SORTS:
            return
        if event.column == self.sort_by:
            self.reverse = not self.reverse
        else:
            self.sort_by = event.column
        self.rebuild()

    def on_runs_table_columns_scrolled(self, event: RunsTable.ColumnsScrolled) -> None:
        self.update_status()  # its ←N →M count of hidden columns

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.table.focus()

    def action_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_clear_filter(self) -> None:
        self.query_one("#filter", Input).value = ""
        self.table.focus()

    # -- sort ------------------------------------------------------------------------
    def action_sort(self) -> None:
        self.sort_by = SORT_ORDER[(SORT_ORDER.index(self.sort_by) + 1) % len(SORT_ORDER)]
        self.rebuild()

    def action_reverse(self) -> None:
        self.reverse = not self.reverse
        self.rebuild()

    # -- actions on runs ------------------------------------------------------------
    def action_open(self) -> None:
        from fslab.tui.detail_screen import DetailScreen

        run_id = self.table.cursor_id
        if run_id is not None:
            self.app.push_screen(DetailScreen(run_id))

    def action_mark(self) -> None:
        run_id = self.table.cursor_id
        if run_id is None:
            return
        self.table.marked ^= {run_id}
        self.table.invalidate([run_id])
        self.table.action_move(1)
        self.update_status()

    def action_compare(self) -> None:
        from fslab.tui.compare_screen import CompareScreen

        # every marked run, as the status line counts them: in the table's order, then those the filter hides
        marked, shown = self.table.marked, self.table.shown
        chosen = [i for i in self.table.ids if i in marked] + [i for i in self.app.rows if i in marked - shown]
        if len(chosen) < 1:
            self.notify("mark runs with space first, then press c", markup=False)
            return
        self.app.push_screen(CompareScreen(chosen))

    def shows(self, run_id: str) -> bool:
        """Whether the cursor is on ``run_id``, the run s, r and d act on."""
        return self.table.cursor_id == run_id

    def action_stop(self) -> None:
        if self.table.cursor_id is not None:
            self.app.request_stop(self.table.cursor_id)

    def action_resume(self) -> None:
        if self.table.cursor_id is not None:
            self.app.request_resume(self.table.cursor_id)

    def action_delete(self) -> None:
        if self.table.cursor_id is not None:
            self.app.request_delete(self.table.cursor_id)

    def action_launch(self) -> None:
        self.app.request_launch()

    def action_launch_like(self) -> None:
        if self.table.cursor_id is not None:
            self.app.request_launch(like=self.table.cursor_id)
