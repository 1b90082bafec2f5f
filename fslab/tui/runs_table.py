"""A virtual table of runs: only the visible lines are ever rendered.

Textual's DataTable lays out every row (0.8 s for 1,000 runs here); this widget
draws line by line from a list of run ids and asks for a row's cells only when
that row is on screen, so first paint and ticks cost the same for 10 runs or
10,000.

Columns come in priority order. The first ``frozen`` ones (the mark and the
id) stay put; the others are shown whole, as many as fit, and ``←``/``→``
scroll them one column at a time, never by character. A column widens to the
widest cell it has drawn (up to a cap), so a number is never cut; when the
table is too narrow the id column gives way first, keeping the id's tail (its
time, method and random suffix: a unique substring every command accepts).
"""

from __future__ import annotations

from collections.abc import Callable

from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.events import Click
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

ID_COLUMN = 1
ID_MIN_WIDTH = 16
MUST_FIT = 5  # the id column shrinks so that this many columns after it fit (state … test 5-shot)
WIDTH_CAP = 40  # no column grows past this; a longer cell is shortened at a space


def fit(cell: Text, width: int, *, tail: bool = False) -> Text:
    """``cell`` in exactly ``width`` cells: padded, or shortened without cutting
    a word or number (its tail kept for ids, else whole words and ``…``)."""
    cell = cell.copy()
    if cell.cell_len <= width:
        cell.pad_right(width - cell.cell_len)
        return cell
    if tail:
        return Text("…") + cell[len(cell) - width + 1:]
    cut = cell.plain.rfind(" ", 0, width)
    cell = cell[:cut] if cut > 0 else Text("")
    cell.rstrip()
    cell.append("…")
    cell.pad_right(width - cell.cell_len)
    return cell


class RunsTable(ScrollView, can_focus=True):
    """Rows are run ids; ``cells(run_id)`` gives a row's Text cells."""

    class HeaderClicked(Message):
        """A column header was clicked (sort by it)."""

        def __init__(self, column: str) -> None:
            super().__init__()
            self.column = column

    class ColumnsScrolled(Message):
        """``←``/``→`` showed other columns (the screen's count of hidden ones changed)."""

    COMPONENT_CLASSES = {"runs-table--header", "runs-table--cursor", "runs-table--marked"}
    DEFAULT_CSS = """
    RunsTable { height: 1fr; overflow-x: hidden; }
    RunsTable > .runs-table--header { text-style: bold; background: $panel; }
    RunsTable > .runs-table--cursor { background: $accent 50%; text-style: bold; }
    RunsTable > .runs-table--marked { text-style: underline; }
    """
    BINDINGS = [
        Binding("up,k", "move(-1)", "up", show=False, tooltip="Move to the run above"),
        Binding("down,j", "move(1)", "down", show=False, tooltip="Move to the run below"),
        Binding("pageup", "page(-1)", "page up", show=False, tooltip="One page of runs up"),
        Binding("pagedown", "page(1)", "page down", show=False, tooltip="One page of runs down"),
        Binding("home", "jump(0)", "first", show=False, tooltip="Go to the first run"),
        Binding("end", "jump(-1)", "last", show=False, tooltip="Go to the last run"),
        Binding("left,h", "scroll_columns(-1)", "columns left", show=False,
                tooltip="Show the columns to the left, one at a time"),
        Binding("right,l", "scroll_columns(1)", "columns right", show=False,
                tooltip="Show the columns to the right, one at a time"),
    ]
    cursor = reactive(0, always_update=True)

    def __init__(self, columns: tuple[str, ...], widths: tuple[int, ...], cells: Callable[[str], list[Text]],
                 frozen: int = 2, **kwargs) -> None:
        super().__init__(**kwargs)
        self.columns, self.cells, self.frozen = columns, cells, frozen
        self.widths = [max(w, len(c)) for c, w in zip(columns, widths)]
        self.labels = list(columns)  # header text (the sort marker added by the screen)
        self.first = frozen  # the first scrollable column shown
        self.ids: list[str] = []
        self.shown: set[str] = set()  # the same ids, to look up
        self.marked: set[str] = set()
        self._cache: dict[str, list[Text]] = {}

    # -- data ----------------------------------------------------------------
    @property
    def view_width(self) -> int:
        """The columns the rows are drawn in: the width less the scrollbar's, which more runs than the
        screen holds bring (the columns laid out in the whole width lost their end under it)."""
        return self.scrollable_content_region.width

    @property
    def cursor_id(self) -> str | None:
        return self.ids[self.cursor] if 0 <= self.cursor < len(self.ids) else None

    def set_ids(self, ids: list[str]) -> None:
        """Show these runs in this order, keeping the cursor on the same run."""
        current = self.cursor_id
        self.ids = ids
        self.shown = set(ids)
        self.virtual_size = Size(self.view_width, len(ids) + 1)
        if current in ids:
            self.cursor = ids.index(current)
        else:
            self.cursor = min(self.cursor, max(0, len(ids) - 1))
        self.refresh()

    def set_labels(self, labels: list[str]) -> None:
        self.labels = labels
        self.refresh()

    def invalidate(self, run_ids) -> None:
        """Those rows changed: draw them again (if they are on screen)."""
        for run_id in run_ids:
            self._cache.pop(run_id, None)
        self.refresh()

    def invalidate_all(self) -> None:
        self._cache.clear()
        self.refresh()

    # -- layout ----------------------------------------------------------------
    def _row_cells(self, run_id: str) -> list[Text]:
        cells = self._cache.get(run_id)
        if cells is None:
            cells = self._cache[run_id] = self.cells(run_id)
            widened = False
            for i, cell in enumerate(cells):  # widen a column to what it must show
                if cell.cell_len > self.widths[i] < WIDTH_CAP:
                    self.widths[i], widened = min(WIDTH_CAP, cell.cell_len), True
            if widened:  # lines drawn before this one (the header too) are drawn again
                self.refresh()
        return cells

    def column_widths(self) -> list[int]:
        return [max(w, len(label)) for w, label in zip(self.widths, self.labels)]

    def layout(self, width: int | None = None) -> list[tuple[int, int]]:
        """(column, width) of each column shown at ``width`` cells: the frozen
        ones, then whole columns from ``first`` while they fit; the id column
        shrinks (down to ID_MIN_WIDTH) so that the first MUST_FIT fit whole."""
        width = self.view_width if width is None else width
        widths = self.column_widths()
        shown = [(i, widths[i]) for i in range(self.frozen)]
        used = sum(w + 1 for _, w in shown)
        for i in range(self.first, len(widths)):
            need = widths[i] + 1
            if used + need > width:
                spare = dict(shown).get(ID_COLUMN, 0) - ID_MIN_WIDTH
                short = used + need - width
                if i >= self.first + MUST_FIT or short > spare:
                    break
                shown = [(c, w - short if c == ID_COLUMN else w) for c, w in shown]
                used -= short
            shown.append((i, widths[i]))
            used += need
        return shown

    def hidden_columns(self) -> tuple[int, int]:
        """How many scrollable columns are hidden left and right of the view."""
        last = self.layout()[-1][0]
        return self.first - self.frozen, max(0, len(self.columns) - 1 - max(last, self.frozen - 1))

    # -- drawing -------------------------------------------------------------
    def _line(self, cells: list[Text], shown: list[tuple[int, int]]) -> Text:
        line = Text(no_wrap=True, overflow="crop")
        for column, width in shown:
            line.append_text(fit(cells[column], width, tail=column == ID_COLUMN))
            line.append(" ")
        return line

    def render_line(self, y: int) -> Strip:
        width = self.view_width
        scroll_y = self.scroll_offset.y
        if y == 0:
            style = self.get_component_rich_style("runs-table--header")
            cells = [Text(label) for label in self.labels]
        else:
            index = scroll_y + y - 1
            if index >= len(self.ids):
                return Strip.blank(width, self.rich_style)
            run_id = self.ids[index]
            cells = self._row_cells(run_id)
            style = self.rich_style
            if run_id in self.marked:
                style += self.get_component_rich_style("runs-table--marked")
            if index == self.cursor:
                style += self.get_component_rich_style("runs-table--cursor")
        line = self._line(cells, self.layout(width))
        strip = Strip(list(line.render(self.app.console))).crop(0, width).extend_cell_length(width)
        return strip.apply_style(style) if isinstance(style, Style) else strip

    # -- keys ------------------------------------------------------------------
    def watch_cursor(self, old: int, new: int) -> None:
        self.show_cursor()

    def show_cursor(self) -> None:
        """Scroll so that the cursor's row is on screen."""
        if not self.ids:
            return
        visible = max(1, self.size.height - 1)
        top = self.scroll_offset.y
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + visible:
            self.scroll_to(y=self.cursor - visible + 1, animate=False)
        self.refresh()

    def action_move(self, delta: int) -> None:
        if self.ids:
            self.cursor = max(0, min(len(self.ids) - 1, self.cursor + delta))

    def action_page(self, direction: int) -> None:
        self.action_move(direction * max(1, self.size.height - 2))

    def action_jump(self, index: int) -> None:
        if self.ids:
            self.cursor = index % len(self.ids)

    def action_scroll_columns(self, delta: int) -> None:
        """One column right (while some are hidden on the right) or left."""
        if delta > 0 and self.hidden_columns()[1] == 0:
            return
        first = max(self.frozen, min(len(self.columns) - 1, self.first + delta))
        if first != self.first:
            self.first = first
            self.post_message(self.ColumnsScrolled())
        self.refresh()

    def on_resize(self) -> None:
        self.virtual_size = Size(self.view_width, len(self.ids) + 1)
        self.call_after_refresh(self.show_cursor)  # a shorter terminal must not leave the selected run off screen

    def on_click(self, event: Click) -> None:
        if event.y == 0:
            x = 0
            for column, width in self.layout():
                if x <= event.x < x + width + 1:
                    self.post_message(self.HeaderClicked(self.columns[column]))
                    return
                x += width + 1
            return
        index = self.scroll_offset.y + event.y - 1
        if 0 <= index < len(self.ids):
            self.cursor = index
