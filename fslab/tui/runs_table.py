"""A virtual table of runs: only the visible lines are ever rendered.

Textual's DataTable lays out every row (0.8 s for 1,000 runs here); this widget
draws line by line from a list of run ids and asks for a row's cells only when
that row is on screen, so first paint and ticks cost the same for 10 runs or
10,000. The first ``frozen`` columns stay put while the rest scroll sideways.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.geometry import Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip


class RunsTable(ScrollView, can_focus=True):
    """Rows are run ids; ``cells(run_id)`` gives a row's Text cells."""

    COMPONENT_CLASSES = {"runs-table--header", "runs-table--cursor", "runs-table--marked"}
    DEFAULT_CSS = """
    RunsTable { height: 1fr; }
    RunsTable > .runs-table--header { text-style: bold; background: $panel; }
    RunsTable > .runs-table--cursor { background: $accent 50%; text-style: bold; }
    RunsTable > .runs-table--marked { text-style: underline; }
    """
    BINDINGS = [
        Binding("up,k", "move(-1)", "up", show=False),
        Binding("down,j", "move(1)", "down", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("home", "jump(0)", "first", show=False),
        Binding("end", "jump(-1)", "last", show=False),
        Binding("left", "scroll_columns(-8)", "scroll left", show=False),
        Binding("right", "scroll_columns(8)", "scroll right", show=False),
    ]
    cursor = reactive(0, always_update=True)

    def __init__(self, columns: tuple[str, ...], widths: tuple[int, ...], cells: Callable[[str], list[Text]],
                 frozen: int = 2, **kwargs) -> None:
        super().__init__(**kwargs)
        self.columns, self.widths, self.cells, self.frozen = columns, widths, cells, frozen
        self.ids: list[str] = []
        self.shown: set[str] = set()  # the same ids, to look up
        self.marked: set[str] = set()
        self._cache: dict[str, list[Segment]] = {}
        self._frozen_width = sum(widths[:frozen]) + frozen
        self._scroll_width = sum(widths[frozen:]) + len(widths) - frozen

    # -- data ----------------------------------------------------------------
    @property
    def cursor_id(self) -> str | None:
        return self.ids[self.cursor] if 0 <= self.cursor < len(self.ids) else None

    def set_ids(self, ids: list[str]) -> None:
        """Show these runs in this order, keeping the cursor on the same run."""
        current = self.cursor_id
        self.ids = ids
        self.shown = set(ids)
        self.virtual_size = Size(self._frozen_width + self._scroll_width, len(ids) + 1)
        if current in ids:
            self.cursor = ids.index(current)
        else:
            self.cursor = min(self.cursor, max(0, len(ids) - 1))
        self.refresh()

    def invalidate(self, run_ids) -> None:
        """Those rows changed: draw them again (if they are on screen)."""
        for run_id in run_ids:
            self._cache.pop(run_id, None)
        self.refresh()

    def invalidate_all(self) -> None:
        self._cache.clear()
        self.refresh()

    # -- drawing -------------------------------------------------------------
    def _line(self, cells: list[Text]) -> list[Segment]:
        line = Text(no_wrap=True, overflow="ellipsis")
        for cell, width in zip(cells, self.widths):
            cell = cell.copy()
            cell.truncate(width, overflow="ellipsis", pad=True)
            line.append_text(cell)
            line.append(" ")
        return list(line.render(self.app.console))

    def _row_segments(self, run_id: str) -> list[Segment]:
        segments = self._cache.get(run_id)
        if segments is None:
            segments = self._cache[run_id] = self._line(self.cells(run_id))
        return segments

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        scroll_x, scroll_y = self.scroll_offset
        if y == 0:
            segments = self._line([Text(c) for c in self.columns])
            style = self.get_component_rich_style("runs-table--header")
        else:
            index = scroll_y + y - 1
            if index >= len(self.ids):
                return Strip.blank(width, self.rich_style)
            run_id = self.ids[index]
            segments = self._row_segments(run_id)
            style = self.rich_style
            if run_id in self.marked:
                style += self.get_component_rich_style("runs-table--marked")
            if index == self.cursor:
                style += self.get_component_rich_style("runs-table--cursor")
        strip = Strip(segments)
        frozen = strip.crop(0, self._frozen_width)
        moving = strip.crop(self._frozen_width + scroll_x, self._frozen_width + scroll_x + width)
        joined = Strip.join([frozen, moving]).crop(0, width).extend_cell_length(width)
        return joined.apply_style(style) if isinstance(style, Style) else joined

    # -- keys ------------------------------------------------------------------
    def watch_cursor(self, old: int, new: int) -> None:
        if not self.ids:
            return
        visible = max(1, self.size.height - 1)
        top = self.scroll_offset.y
        if new < top:
            self.scroll_to(y=new, animate=False)
        elif new >= top + visible:
            self.scroll_to(y=new - visible + 1, animate=False)
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
        self.scroll_to(x=max(0, self.scroll_offset.x + delta), animate=False)

    def on_click(self, event) -> None:
        index = self.scroll_offset.y + event.y - 1
        if event.y >= 1 and 0 <= index < len(self.ids):
            self.cursor = index
