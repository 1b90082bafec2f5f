"""Line charts drawn with braille dots, fed by bounded min/max series.

``MinMaxSeries`` keeps at most ``capacity`` buckets: when full, neighbours are
merged (each keeps its min and max), so a run with 100,000 logged steps costs
what one with 1,000 does, and spikes survive downsampling. ``LineChart`` draws
one or more series (plus an optional band, e.g. a 95% CI) and shows a
placeholder when it has nothing it can draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rich.text import Text
from textual.widget import Widget

from fslab.core.text import percent, unsigned_zero

# Braille dot bits by (column, row) inside a 2×4 cell.
DOTS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
PALETTE = ("cyan", "magenta", "yellow", "green", "red", "blue", "bright_white", "bright_cyan")
# The palette's colours drawn solid, then dashed, then dotted: the 9th line is not the 1st again. Each dash is
# (dot columns drawn, dot columns left out), its legend swatch beside it.
DASHES = ((1, 0), (4, 2), (1, 2))
SWATCHES = ("■", "╍", "┄")
STROKES = ("─", "╌", "┄")  # an interval's line (render_intervals) in each dash
AXIS_WIDTH = 9


def line_look(index: int) -> tuple[str, int]:
    """The colour and the dash (an index into :data:`DASHES`, :data:`SWATCHES`, :data:`STROKES`) of a chart's
    ``index``-th line: a pair of its own for each of the first 24 lines (8 colours, 3 dashes), in the chart as in
    its legend, and for the ``index``-th group of the interval chart."""
    dash, colour = divmod(index, len(PALETTE))
    return PALETTE[colour], dash % len(DASHES)


class MinMaxSeries:
    """An append-only series stored as ≤ ``capacity`` (x0, x1, ymin, ymax) buckets."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self.buckets: list[list[float]] = []
        self.per_bucket = 1  # points per bucket (doubles at each merge)
        self._fill = 0  # points in the last bucket
        self.count = 0

    def clear(self) -> None:
        self.buckets, self.per_bucket, self._fill, self.count = [], 1, 0, 0

    def append(self, x: float, y: float) -> None:
        if not (math.isfinite(x) and math.isfinite(y)):
            return
        self.count += 1
        if self.buckets and self._fill < self.per_bucket:
            b = self.buckets[-1]
            b[1], b[2], b[3] = x, min(b[2], y), max(b[3], y)
            self._fill += 1
            return
        if len(self.buckets) >= self.capacity:
            merged = []
            for i in range(0, len(self.buckets) - 1, 2):
                a, b = self.buckets[i], self.buckets[i + 1]
                merged.append([a[0], b[1], min(a[2], b[2]), max(a[3], b[3])])
            if len(self.buckets) % 2:
                merged.append(self.buckets[-1])
            self.buckets = merged
            self.per_bucket *= 2
        self.buckets.append([x, x, y, y])
        self._fill = 1

    def extend(self, points) -> None:
        for x, y in points:
            self.append(x, y)

    def snapshot(self) -> MinMaxSeries:
        """A copy, which this series' later appends leave alone (one thread folds, another draws)."""
        copy = MinMaxSeries(self.capacity)
        copy.buckets, copy.per_bucket = [list(b) for b in self.buckets], self.per_bucket
        copy._fill, copy.count = self._fill, self.count
        return copy

    def take(self, other: MinMaxSeries) -> None:
        """Hold ``other``'s points (a snapshot: no copy is made)."""
        self.capacity, self.buckets, self.per_bucket = other.capacity, other.buckets, other.per_bucket
        self._fill, self.count = other._fill, other.count


def downsample(buckets: list[list[float]], columns: int, x_lo: float, x_hi: float) -> list[tuple[float, float] | None]:
    """Per column of the plot: (ymin, ymax) of the buckets that fall in it."""
    out: list[tuple[float, float] | None] = [None] * columns
    span = (x_hi - x_lo) or 1.0
    for x0, x1, lo, hi in buckets:
        mid = (x0 + x1) / 2
        col = min(columns - 1, max(0, int((mid - x_lo) / span * (columns - 1) + 0.5)))
        cur = out[col]
        out[col] = (lo, hi) if cur is None else (min(cur[0], lo), max(cur[1], hi))
    return out


def fill_gaps(spans: list[tuple[float, float] | None], steps: bool = False) -> list[tuple[float, float] | None]:
    """Columns between two drawn ones get linearly interpolated spans, so a
    sparse series (one point per epoch) still draws as a line; with ``steps``
    they hold the last value until the next (a learning rate logged at a few
    steps is a step function, not a ramp)."""
    out = list(spans)
    filled = [i for i, span in enumerate(spans) if span is not None]
    for a, b in zip(filled, filled[1:]):
        (lo_a, hi_a), (lo_b, hi_b) = spans[a], spans[b]
        mid_a, mid_b = (lo_a + hi_a) / 2, (lo_b + hi_b) / 2
        if steps:
            out[a + 1:b] = [(lo_a, lo_a)] * (b - a - 1) if lo_a == hi_a else [(mid_a, mid_a)] * (b - a - 1)
            continue
        for k in range(a + 1, b):
            t = (k - a) / (b - a)
            if lo_a == hi_a and lo_b == hi_b:
                value = mid_a + (mid_b - mid_a) * t
                out[k] = (value, value)
            else:
                out[k] = (lo_a + (lo_b - lo_a) * t, hi_a + (hi_b - hi_a) * t)
    return out


def _fmt(value: float) -> str:
    """One x value: whole numbers plain (steps, epochs), else 3 significant digits."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e9 else f"{value:.3g}"


def axis_format(lo: float, hi: float) -> str:
    """One format for every y label of an axis, chosen from its range: fixed
    decimals enough to tell the labels apart, or scientific for very large or
    very small values (never one label in units and the next in ``e+03``)."""
    top = max(abs(lo), abs(hi))
    span = hi - lo
    if top >= 1e6 or (0 < top < 1e-3):
        return "{:.2e}"
    decimals = 0 if span <= 0 else max(0, min(4, 2 - math.floor(math.log10(span))))
    return f"{{:,.{decimals}f}}"


def nice_step(span: float, count: int) -> float:
    """The 1, 2, 2.5 or 5 × 10^k step that cuts ``span`` into at most about ``count`` parts."""
    raw = span / max(1, count)
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw * 0.999)


def x_axis(x_lo: float, x_hi: float, width: int) -> str:
    """``width`` characters labelling the x axis: the first and last values at
    the ends and round values (a 1, 2, 2.5 or 5 step) in between, about one every
    12 columns, none overlapping another."""
    line = [" "] * width
    first, last = _fmt(x_lo), _fmt(x_hi)
    line[:len(first)] = first[:width]
    if x_hi != x_lo and len(first) + 1 + len(last) <= width:
        line[width - len(last):] = last
    span = x_hi - x_lo
    if span <= 0 or not math.isfinite(span):
        return "".join(line[:width])
    whole = float(x_lo).is_integer() and float(x_hi).is_integer()  # steps, epochs: whole labels
    step = nice_step(span, width // 12)
    step = max(1, round(step)) if whole else step
    free_from, free_to = len(first) + 1, width - len(last) - 1  # columns the end labels leave free
    value = math.ceil(x_lo / step) * step
    while value < x_hi:
        label = _fmt(round(value, 10))
        at = round((value - x_lo) / span * (width - 1)) - len(label) // 2
        if at >= free_from and at + len(label) <= free_to:
            line[at:at + len(label)] = label
            free_from = at + len(label) + 1
        value += step
    return "".join(line[:width])


@dataclass
class Plot:
    """What one chart draws: named series and an optional band (low, high series)."""

    series: list[tuple[str, MinMaxSeries]] = field(default_factory=list)
    band: tuple[MinMaxSeries, MinMaxSeries] | None = None
    steps: bool = False  # hold each value until the next (a schedule), instead of a line between them


def render_chart(plot: Plot, width: int, height: int, title: str = "") -> Text | None:
    """The chart as Text of ``height`` lines, or None when it cannot be drawn."""
    plot_w, plot_h = width - AXIS_WIDTH, height - 2  # title line and x-axis line
    drawn = [(name, s) for name, s in plot.series if s.buckets]
    if plot_w < 4 or plot_h < 1 or not drawn:
        return None
    every = [s for _, s in drawn] + (list(plot.band) if plot.band and plot.band[0].buckets else [])
    x_lo = min(s.buckets[0][0] for s in every)
    x_hi = max(s.buckets[-1][1] for s in every)
    y_lo = min(min(b[2] for b in s.buckets) for s in every)
    y_hi = max(max(b[3] for b in s.buckets) for s in every)
    if y_hi == y_lo:  # a flat series: a band of ±10% around it (a 0.05 lr must not get a negative axis)
        pad = abs(y_lo) * 0.1 or 0.5
        y_lo, y_hi = y_lo - pad, y_hi + pad
    cols, rows = plot_w * 2, plot_h * 4
    grid = [[0] * plot_w for _ in range(plot_h)]
    owner: list[list[str | None]] = [[None] * plot_w for _ in range(plot_h)]

    def dot_row(y: float) -> int:
        return min(rows - 1, max(0, int((y_hi - y) / (y_hi - y_lo) * (rows - 1) + 0.5)))

    def paint(col: int, r0: int, r1: int, style: str) -> None:
        for r in range(min(r0, r1), max(r0, r1) + 1):
            cell_r, cell_c = r // 4, col // 2
            grid[cell_r][cell_c] |= DOTS[col % 2][r % 4]
            owner[cell_r][cell_c] = style

    if plot.band and plot.band[0].buckets:
        lows = fill_gaps(downsample(plot.band[0].buckets, cols, x_lo, x_hi))
        highs = fill_gaps(downsample(plot.band[1].buckets, cols, x_lo, x_hi))
        for col, (lo, hi) in enumerate(zip(lows, highs)):
            if lo is not None and hi is not None:
                paint(col, dot_row(lo[0]), dot_row(hi[1]), "grey50")
    for index, (_, series) in enumerate(drawn):
        style, dash = line_look(index)
        on, off = DASHES[dash]
        previous = None
        for col, span in enumerate(fill_gaps(downsample(series.buckets, cols, x_lo, x_hi), plot.steps)):
            if span is None:
                continue
            r_top, r_bottom = dot_row(span[1]), dot_row(span[0])
            current = (r_top, r_bottom)
            if previous is not None:  # overlap the previous column so the line is unbroken
                r_bottom = max(r_bottom, previous[0])
                r_top = min(r_top, previous[1])
            if col % (on + off) < on:  # a dashed or dotted line's gaps left out
                paint(col, r_top, r_bottom, style)
            previous = current

    out = Text(title[:width], style="bold")
    fmt = axis_format(y_lo, y_hi)
    labelled = {0: y_hi, plot_h - 1: y_lo}
    if plot_h >= 5:
        labelled[(plot_h - 1) // 2] = y_hi - (y_hi - y_lo) * ((plot_h - 1) // 2) / (plot_h - 1)
    for r in range(plot_h):
        label = unsigned_zero(fmt.format(labelled[r])) if r in labelled else ""
        # The axis is dim; the dots are not (a dim row would dull every line's colour).
        out.append("\n" + label.rjust(AXIS_WIDTH - 1)[: AXIS_WIDTH - 1] + "│", style="dim")
        for c in range(plot_w):
            bits = grid[r][c]
            out.append(chr(0x2800 + bits) if bits else " ", style=owner[r][c] or "")
    out.append("\n" + " " * (AXIS_WIDTH - 1) + "└" + x_axis(x_lo, x_hi, plot_w), style="dim")
    return out


class LineChart(Widget):
    """A titled braille line chart; set ``plot`` and call ``refresh()``."""

    DEFAULT_CSS = "LineChart { height: 10; }"

    def __init__(self, title: str, plot: Plot | None = None, placeholder: str = "no data yet", **kwargs) -> None:
        super().__init__(**kwargs)
        self.title = title
        self.plot = plot or Plot()
        self.placeholder = placeholder

    def render(self) -> Text:
        legend = [name for name, s in self.plot.series if name and s.buckets]
        rows = legend_rows(legend, self.size.width) if len(legend) > 1 else []
        try:
            chart = render_chart(self.plot, self.size.width, self.size.height - len(rows), self.title)
        except (ValueError, ZeroDivisionError, OverflowError) as exc:
            chart, self.placeholder = None, f"cannot draw: {exc}"
        if chart is None:
            return Text(self.title, style="bold") + Text(f"\n({self.placeholder})", style="dim italic")
        for row in rows:
            chart.append_text(Text("\n") + row)
        return chart


def legend_rows(names: list[str], width: int) -> list[Text]:
    """The legend (`` ■ name`` in each series' colour, ``╍`` or ``┄`` for a dashed or dotted one) in lines
    of at most ``width`` cells, a name never split across two: every series stays named however narrow the
    chart (a name wider than the chart is cut)."""
    rows: list[Text] = []
    for i, name in enumerate(names):
        colour, dash = line_look(i)
        entry = Text(f" {SWATCHES[dash]} {name}", style=colour)
        if rows and rows[-1].cell_len + entry.cell_len <= width:
            rows[-1].append_text(entry)
        else:
            rows.append(entry)
        rows[-1].truncate(max(1, width), overflow="ellipsis")
    return rows


def render_intervals(blocks: list[tuple[str, list[tuple[str, float, float]]]], width: int) -> Text | None:
    """Accuracy ± CI per group as horizontal intervals (``├──●──┤``): one
    block per title (e.g. 1-shot, 5-shot), one line per (group, mean, ci),
    every line of a block on the block's own axis, each group's in a colour and dash of its own
    (:func:`line_look`, as the loss curves': ``├╌╌●╌╌┤`` the 9th, in the 1st's colour)."""
    value_w = 12  # " 56.22±0.40 "
    # Group labels give way (keeping their head, "#2 train.lr=...") so the intervals get 16 columns.
    label_w = max(6, min(24, width - value_w - 17, max((len(g) for _, rows in blocks for g, _, _ in rows), default=0)))
    plot_w = width - label_w - value_w - 1
    if plot_w < 8 or not any(rows for _, rows in blocks):
        return None
    out = Text()
    for title, rows in blocks:
        if not rows:
            continue
        lo = min(m - c for _, m, c in rows)
        hi = max(m + c for _, m, c in rows)
        pad = (hi - lo) * 0.05 or 0.005
        lo, hi = lo - pad, hi + pad
        at = lambda v: min(plot_w - 1, max(0, round((v - lo) / (hi - lo) * (plot_w - 1))))  # noqa: B023
        out.append(("\n" if out else "") + title, style="bold")
        for index, (group, mean, ci) in enumerate(rows):
            cells = [" "] * plot_w
            left, mid, right = at(mean - ci), at(mean), at(mean + ci)
            colour, dash = line_look(index)
            for c in range(left, right + 1):
                cells[c] = STROKES[dash]
            cells[left], cells[right], cells[mid] = "├", "┤", "●"
            name = group if len(group) <= label_w else group[:label_w - 1] + "…"
            out.append("\n" + name.ljust(label_w) + " ")
            out.append("".join(cells), style=colour)
            out.append(f" {percent(mean)}±{percent(ci)}".ljust(value_w))
        low, high = (unsigned_zero(f"{100 * end:.1f}") for end in (lo, hi))  # a padded end just below 0: 0.0
        axis = low.ljust(plot_w - len(high)) + high
        out.append("\n" + " " * label_w + " " + axis, style="dim")
    return out


class IntervalChart(Widget):
    """Accuracy ± 95% CI per group; set ``blocks`` and call ``refresh()``."""

    DEFAULT_CSS = "IntervalChart { height: auto; }"

    def __init__(self, placeholder: str = "no test accuracy yet", **kwargs) -> None:
        super().__init__(**kwargs)
        self.blocks: list[tuple[str, list[tuple[str, float, float]]]] = []
        self.placeholder = placeholder

    def render(self) -> Text:
        chart = render_intervals(self.blocks, self.size.width)
        if chart is None:
            drawn = any(rows for _, rows in self.blocks)
            return Text("(too narrow to draw)" if drawn else f"({self.placeholder})", style="dim italic")
        return chart
