"""Tables that fit the terminal: every wide table of the CLI is printed here.

A table is a list of :class:`Col` and rows of plain text. When the rows do
not fit the width (the terminal's; for output that is not a terminal,
``COLUMNS`` or 80; no limit with ``--wide``), the table gives way one step at
a time, in the order each table states: a column is dropped, or run ids are
shown by their shortest unique end (:func:`fslab.core.runstore.short_ids`,
which every command taking RUN accepts). What is left may then shrink: a
column marked ``wrap`` wraps, others are cut with ``…``; the id column is
never cut, and no header is: where the headers alone are wider than the
terminal, columns are left out whole, the last first, as the stated steps are
(a header cut to ``train.weight_…`` or ``test 5-sh…`` no longer says what its
column is).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from fslab.core.text import printable

SHORT_IDS = "short ids"  # a step: ids shown by their shortest unique end


@dataclass(frozen=True)
class Col:
    header: str
    justify: str = "left"
    wrap: bool = False  # may wrap onto more lines when space is short (else cut with …)
    is_id: bool = False  # the run id: never cut


def needed_width(widths: list[int]) -> int:
    """The width of a rich table with these column widths: a border and a
    space each side of every cell."""
    return sum(widths) + 3 * len(widths) + 1


def fit(columns: list[Col], rows: list[list[str]], width: int | None, steps: list[str],
        shorten: Callable[[list[str]], dict[str, str]] | None = None, title: str | None = None,
        moved: tuple[str, ...] = ()) -> Table:
    """A rich Table of ``rows`` for ``width`` columns of text (None: whatever
    the rows need), after as many of ``steps`` (headers to drop, or
    :data:`SHORT_IDS`) as it takes to fit; a dropped header in ``moved`` is one
    the caller prints under the table, which the caption says rather than "left out"."""
    rows = [[printable(cell) for cell in row] for row in rows]
    keep, done = list(range(len(columns))), []
    for step in [None, *steps]:
        if step == SHORT_IDS and shorten is not None:
            rows = _shortened(columns, rows, shorten)
            done.append(step)
        elif step is not None and step in [columns[i].header for i in keep]:
            keep = [i for i in keep if columns[i].header != step]
            done.append(step)
        widths = [max([cell_len(columns[i].header), *(cell_len(row[i]) for row in rows)]) for i in keep]
        if width is None or needed_width(widths) <= width:
            break
    if width is not None and needed_width(widths) > width:
        keep, widths, left_out = _narrowed(columns, keep, widths, width)
        done += left_out
    table = Table(title=title, title_justify="left", caption=_caption(done, width, moved), caption_justify="left")
    for i, shown in zip(keep, widths):
        col = columns[i]
        table.add_column(col.header, justify=col.justify, no_wrap=not col.wrap,
                         overflow="fold" if col.wrap else "ellipsis", width=shown)
    for row in rows:
        table.add_row(*(Text(row[i]) for i in keep))
    return table


def _narrowed(columns: list[Col], keep: list[int], natural: list[int], width: int) -> tuple[list, list, list]:
    """Where the stated steps leave the table wider than ``width``: the columns kept, their widths and the
    headers left out. Columns go whole, the last first (never an id), until every header fits whole
    (an id: its widest cell); then the widest above that least shrinks, a wrapping column's first."""
    least = {i: n if columns[i].is_id else cell_len(columns[i].header) for i, n in zip(keep, natural)}
    widths = dict(zip(keep, natural))
    keep, left_out = list(keep), []
    while needed_width([least[i] for i in keep]) > width:
        last = next((i for i in reversed(keep) if not columns[i].is_id), None)
        if last is None:  # the ids alone are wider: they are never cut
            break
        keep.remove(last)
        left_out.append(columns[last].header)
    while needed_width([widths[i] for i in keep]) > width:
        roomy = [i for i in keep if widths[i] > least[i]]
        if not roomy:
            break
        widths[max(roomy, key=lambda i: (columns[i].wrap, widths[i] - least[i]))] -= 1
    return keep, [widths[i] for i in keep], left_out


def _caption(done: list[str], width: int | None, moved: tuple[str, ...] = ()) -> str | None:
    """Says what was left out to fit (or moved under the table), and how to see it all."""
    if not done:
        return None
    dropped = [step for step in done if step != SHORT_IDS and step not in moved]
    below = [step for step in done if step in moved]
    parts = ([f"left out: {', '.join(dropped)}"] if dropped else []) + (["short ids"] if SHORT_IDS in done else [])
    parts += [f"{', '.join(below)} under the table"] if below else []
    return f"fitted to {width} columns ({'; '.join(parts)}); --wide shows all"


def _shortened(columns: list[Col], rows: list[list[str]], shorten) -> list[list[str]]:
    at = [i for i, col in enumerate(columns) if col.is_id]
    short = shorten([row[i] for row in rows for i in at])
    return [[short.get(cell, cell) if i in at else cell for i, cell in enumerate(row)] for row in rows]


def print_table(console, table_of: Callable[[int | None], Table], wide: bool = False) -> Table:
    """Print the table ``table_of(width)`` makes for the console's width, or
    at its full width with ``wide``; the table printed (what it kept)."""
    if wide:
        from rich.measure import Measurement

        table = table_of(None)
        from rich.console import Console

        natural = Measurement.get(console, console.options.update(max_width=100_000), table).maximum
        # print() cannot go wider than its console: a console as wide as the table
        Console(width=max(natural, console.width), soft_wrap=True, emoji=False,
                force_terminal=console.is_terminal).print(table)
    else:
        table = table_of(console.width)
        console.print(table)
    return table
