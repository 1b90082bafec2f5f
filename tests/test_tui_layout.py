"""The dashboard at 80×24, 120×36 and 160×48: what is on screen, read from
the rendered lines (columns by priority, whole cells, the footer, the sort
marker, the help screen, unknown filter fields)."""

from __future__ import annotations

import re

import pytest
from rich.text import Text

from fslab.tui.charts import PALETTE, MinMaxSeries, Plot, render_chart, x_axis
from fslab.tui.runs_table import ID_COLUMN, fit

from .test_tui import drive, frozen_app, open_compare, open_detail, settle
from .test_tui_helpers import config, history, save_episode_scores, standard_store, write_run

SIZES = ((80, 24), (120, 36), (160, 48))


@pytest.fixture
def store(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    return runs, standard_store(runs)


def lines_of(app) -> list[str]:
    return [strip.text for strip in app.screen._compositor.render_strips()]


def table_lines(app) -> list[str]:
    table = app.screen.table
    return [table.render_line(y).text for y in range(min(table.size.height, len(table.ids) + 1))]


@pytest.mark.parametrize("size", SIZES)
def test_the_priority_columns_fit_and_the_footer_keeps_its_keys(store, size):
    runs, folders = store

    async def body(app, pilot):
        header, *rows = table_lines(app)
        for column in ("id", "state", "method", "epoch", "test 1-shot", "test 5-shot"):
            assert column in header, (column, header)
        assert "73.07±0.35" in rows[2] and "56.22±0.40" in rows[2]  # done1: both test accuracies, whole
        assert "protonet-cccc" in rows[1]  # an id may give way at its start, never its unique tail
        footer = lines_of(app)[-1]
        for key in ("open", "filter", "sort", "help", "quit"):
            assert key in footer, footer
        if size[0] >= 120:
            assert "20260101-120000-protonet-cccc" in rows[1] and "elapsed" in header
        if size[0] >= 160:
            assert "cpu" in header and "best val" in header

    drive(frozen_app(runs), body, size=size)


def test_sideways_scrolling_moves_by_whole_columns(store):
    runs, folders = store

    async def body(app, pilot):
        table = app.screen.table
        assert "loss" not in table_lines(app)[0].split()
        await pilot.press("right")
        header = table_lines(app)[0]
        assert header.split()[:2] == ["id▼", "method"]  # state scrolled away whole, the id stays
        for _ in range(30):
            await pilot.press("right")
        header = table_lines(app)[0].split()
        assert header[-1] == "+/-" and table.hidden_columns()[1] == 0
        left = table.hidden_columns()[0]
        status = str(app.screen.query_one("#status").render())
        assert left > 0 and f"←{left} →0 columns" in status  # the count follows the scrolling
        for _ in range(30):
            await pilot.press("left")
        assert table_lines(app)[0].split()[:3] == ["id▼", "state", "method"]
        right = table.hidden_columns()[1]
        assert f"←0 →{right} columns" in str(app.screen.query_one("#status").render()) and right > 0

    drive(frozen_app(runs), body, size=(80, 24))


def test_no_column_is_cut_by_the_scrollbar_of_more_runs_than_the_screen_holds(tmp_path):
    """With more runs than lines, the table's scrollbar took its last two columns: the columns that fit the
    whole width were shown, and the last one lost its end (``progres``, an ETA of 47:57 as ``47:5``)."""
    runs = tmp_path / "runs"
    for i in range(12):
        write_run(runs, f"20260101-{10 + i}0000-nca-{i:04x}", cfg=config(seed=i), events=history())

    async def body(app, pilot):
        table, cut = app.screen.table, []
        for width in range(60, 101):
            await pilot.resize_terminal(width, 16)
            await pilot.pause()
            assert table.show_vertical_scrollbar
            visible = table.scrollable_content_region.width  # what the scrollbar leaves
            header, row = (lines_of(app)[table.region.y + y][:visible] for y in (0, 1))
            cells = app.screen.cells(table.ids[0])
            cut += [(width, table.labels[c]) for c, _ in table.layout() if table.labels[c] not in header
                    or c != ID_COLUMN and cells[c].plain.strip() not in row]  # the id gives way at its start
        assert not cut

    drive(frozen_app(runs), body, size=(60, 16))


def test_a_cell_grows_its_column_instead_of_being_cut(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    events = history(epochs=3)[:6]
    events[0]["epochs"] = 28500
    write_run(runs, "20260101-130000-nca-eeee", state="running", cfg=config(epochs=28500), events=events)
    (runs / "20260101-130000-nca-eeee" / "metrics.jsonl").write_text(
        "".join(__import__("json").dumps({**e, "epoch": 1500} if e.get("event") == "train" else e) + "\n"
                for e in events))

    async def body(app, pilot):
        await pilot.pause()
        assert "1500/28500" in table_lines(app)[1]

    drive(frozen_app(runs), body, size=(120, 36))


def test_fit_never_cuts_a_number():
    assert fit(Text("1500/28500"), 8).plain == "…       "
    assert fit(Text("54.22±0.44"), 12).plain == "54.22±0.44  "
    assert fit(Text("20260101-120000-protonet-cccc"), 20, tail=True).plain == "…20000-protonet-cccc"
    assert fit(Text("a long text"), 8).plain == "a long… "


def test_sort_marker_per_column_sort_and_header_click(store):
    runs, folders = store

    async def body(app, pilot):
        table = app.screen.table
        assert table_lines(app)[0].split()[0] == "id▼"
        await pilot.press("o")
        assert "state▼" in table_lines(app)[0] and "id▼" not in table_lines(app)[0]
        await pilot.press("O")
        assert "state▲" in table_lines(app)[0]
        assert [app.rows[i].state for i in table.ids] == ["completed", "completed", "failed", "running"]
        x = table_lines(app)[0].index("test 5-shot")
        await pilot.click(table, offset=(x + 1, 0))
        assert app.screen.sort_by == "test 5-shot" and "test 5-shot▲" in table_lines(app)[0]
        assert table.ids[:2] == [folders["done0"].name, folders["done1"].name]  # 71.07 before 73.07
        await pilot.click(table, offset=(x + 1, 0))
        assert "test 5-shot▼" in table_lines(app)[0] and table.ids[0] == folders["done1"].name
        assert "sort: test 5-shot▼" in str(app.screen.query_one("#status").render())  # the status line, wrapped

    drive(frozen_app(runs), body, size=(80, 24))


def test_an_unknown_filter_field_is_named_with_the_fields_there_are(store):
    runs, _ = store

    async def body(app, pilot):
        await pilot.press("slash", *"stat:failed")
        await pilot.pause()
        screen = "\n".join(lines_of(app))
        assert "unknown field stat: use id, method, loss, backbone, dataset, seed, state" in screen
        await pilot.press("escape")
        await pilot.pause()
        assert "unknown field" not in "\n".join(lines_of(app))

    drive(frozen_app(runs), body, size=(80, 24))


@pytest.mark.parametrize("where", ["runs", "detail"])
def test_help_lists_every_key_of_the_screen(store, where):
    runs, _ = store

    async def body(app, pilot):
        if where == "detail":
            await pilot.press("enter")
            await settle(app, pilot)
        screen = app.screen
        await pilot.press("question_mark")
        await pilot.pause()
        assert type(app.screen).__name__ == "HelpScreen"
        shown = app.screen.lines
        keys = {k for line, _ in shown for k in line.split(", ")}
        for binding in screen.BINDINGS:
            what = binding.tooltip or binding.description
            assert any(what[:1].upper() + what[1:] == text for _, text in shown), what
        assert {app.get_key_display(b) for b in screen.BINDINGS} <= keys, keys
        assert "Quit the dashboard (runs go on)" in {text for _, text in shown}
        await pilot.press("escape")
        assert app.screen is screen

    drive(frozen_app(runs), body, size=(80, 24))


def test_the_help_screen_s_footer_shows_its_own_keys_not_those_of_the_run_screen(store):
    # the run screen's footer stayed below the help, offering s stop and r resume, which do nothing there
    runs, folders = store

    async def body(app, pilot):
        await open_detail(app, pilot, folders["done0"].name)
        assert "s stop" in lines_of(app)[-1]
        await pilot.press("question_mark")
        await pilot.pause()
        footer = lines_of(app)[-1]
        assert type(app.screen).__name__ == "HelpScreen"
        assert "esc close" in footer and "s stop" not in footer and "r resume" not in footer, footer
        await pilot.press("s")
        await pilot.pause()
        assert type(app.screen).__name__ == "HelpScreen"

    drive(frozen_app(runs), body, size=(80, 24))


def chart_of(points_by_name, *, steps=False, band=None, width=60, height=12):
    series = []
    for name, points in points_by_name.items():
        s = MinMaxSeries()
        s.extend(points)
        series.append((name, s))
    return render_chart(Plot(series, band, steps=steps), width, height, "t")


def test_chart_lines_are_drawn_in_their_legend_colours_not_dimmed():
    text = chart_of({"a": [(x, x) for x in range(50)], "b": [(x, 50 - x) for x in range(50)]})
    dots = [(text.plain[span.start:span.end], span.style) for span in text.spans
            if any(0x2800 < ord(c) <= 0x28FF for c in text.plain[span.start:span.end])]
    assert {style for _, style in dots} == {PALETTE[0], PALETTE[1]}  # cyan and magenta, nothing else
    # No span of the axis (dim) covers a dot: the colours reach the screen as the legend shows them.
    dim = [span for span in text.spans if "dim" in str(span.style)]
    for span in dim:
        assert not any(0x2800 < ord(c) <= 0x28FF for c in text.plain[span.start:span.end])


def test_more_lines_than_the_palette_has_colours_each_look_their_own_in_the_chart_and_its_legend():
    """The compare screen's loss chart drew its 9th run in the 1st's colour and line, the legend naming both
    with a cyan ■: two runs that could not be told apart. Each of 10 flat lines, one a row, now differs from
    every other in its colour or in which of its columns are drawn (solid, then dashed), as its legend says."""
    from fslab.tui.charts import legend_rows

    names = [f"run{i}" for i in range(10)]
    text = chart_of({name: [(x, i) for x in range(50)] for i, name in enumerate(names)}, width=69, height=22)
    rows = text.split()[1:-1]  # the plot's rows, below the title, above the x axis
    looks = []
    for row in rows:
        cells = row.plain.split("│", 1)[1]
        drawn = tuple(c != " " for c in cells)
        if any(drawn):
            offset = len(row.plain) - len(cells)
            styles = {str(span.style) for span in row.spans if span.end > offset}
            assert len(styles) == 1, styles  # one line a row
            looks.append((styles.pop(), drawn))
    assert len(looks) == len(names) and len(set(looks)) == len(names)  # no two lines share colour and dashes
    entries = [(row.plain.split()[0], str(row.style)) for row in legend_rows(names, 12)]  # one entry a row
    assert len(entries) == len(names) and len(set(entries)) == len(names)
    assert entries[0] == ("■", PALETTE[0]) and entries[8] == ("╍", PALETTE[0])  # the 9th: the 1st's colour, dashed


def test_more_groups_than_the_palette_has_colours_each_look_their_own_in_the_interval_chart():
    """The compare screen's interval chart drew its 9th group in the 1st's colour and line (├──●──┤ in cyan),
    where the loss curves beside it draw their 9th run dashed. Each of 10 groups now differs from every other
    in its colour or its stroke, as the curve of the same place does (line_look)."""
    from fslab.tui.charts import line_look, render_intervals

    rows = [(f"#{i + 1}", 0.5 + i / 100, 0.01) for i in range(10)]
    text = render_intervals([("test 5-shot", rows)], 70)
    looks = []
    for line in text.split()[1:-1]:  # a group a line, below the title, above the axis
        strokes = {c for c in line.plain if c in "─╌┄"}
        styles = {str(span.style) for span in line.spans}
        assert len(strokes) == 1 and len(styles) == 1, (line.plain, styles)
        looks.append((styles.pop(), strokes.pop()))
    assert len(looks) == 10 and len(set(looks)) == 10
    assert looks[0] == (line_look(0)[0], "─") and looks[8] == (line_look(0)[0], "╌")  # the 9th: the 1st's colour


def test_the_interval_chart_s_axis_never_starts_at_minus_zero():
    """A group scored 0.20 ± 0.19%: the axis, padded 5% below its lowest end, started at -0.009%, labelled -0.0."""
    from fslab.tui.charts import render_intervals

    axis = render_intervals([("test 1-shot", [("#1 a", 0.002, 0.0019)])], 60).plain.splitlines()[-1]
    assert axis.split() == ["0.0", "0.4"]


def test_chart_axes_are_labelled_in_one_format():
    lines = chart_of({"n": [(step, 7050.0 - step * 10) for step in range(0, 601)]}, width=69).plain.splitlines()
    x_labels = lines[-1].split("└")[1].split()
    assert x_labels[0] == "0" and x_labels[-1] == "600" and len(x_labels) >= 4
    assert [int(v) for v in x_labels] == sorted(int(v) for v in x_labels)
    y_labels = [line.split("│")[0].strip() for line in lines[1:-1] if line.split("│")[0].strip()]
    assert y_labels[0] == "7,050" and y_labels[-1] == "1,050" and len(y_labels) == 3
    assert all(re.fullmatch(r"\d,\d{3}", label) for label in y_labels)  # one format top to bottom, no e+03
    small = chart_of({"lr": [(1, 0.1), (6, 0.05), (12, 0.001)]}).plain.splitlines()
    labels = [line.split("│")[0].strip() for line in small[1:-1] if line.split("│")[0].strip()]
    assert len({len(label.split(".")[1]) for label in labels}) == 1, labels


def test_a_learning_rate_is_drawn_as_steps():
    points = [(1, 0.1), (8, 0.1), (9, 0.01), (12, 0.01)]
    stepped = chart_of({"lr": points[0:1] + points[2:3] + points[3:]}, steps=True, width=29, height=10)
    ramp = chart_of({"lr": points[0:1] + points[2:3] + points[3:]}, steps=False, width=29, height=10)
    top = lambda text: text.plain.splitlines()[1].split("│")[1]
    # Held at 0.1 until step 9: the top row is drawn over most of the width, not just at the start.
    assert top(stepped).count(" ") < len(top(stepped)) / 3 < top(ramp).count(" ")


def test_every_chart_of_the_detail_is_whole_on_an_80x24_screen_in_its_tab(store):
    runs, folders = store

    async def body(app, pilot):
        await open_detail(app, pilot, folders["done0"].name)
        tabs = next(line for line in lines_of(app) if "1 train" in line)
        assert all(f"{i} {name}" in tabs for i, name in enumerate(
            ("train", "pairs", "val", "evals", "config", "stdout", "stderr"), 1))  # the number keys, on screen
        for key, titles in (("1", ("training loss", "learning rate")),
                            ("2", ("positive pairs per batch", "negative pairs per batch")),
                            ("3", ("validation accuracy (%) by epoch",))):
            await pilot.press(key)
            await pilot.pause()
            screen = lines_of(app)
            for title in titles:
                assert any(title in line for line in screen), (title, screen)
            assert sum(line.count("└") for line in screen) == len(titles)  # each x axis (the chart's last line) shown
        assert "esc back" in lines_of(app)[-1] and "? help" in lines_of(app)[-1]

    drive(frozen_app(runs), body, size=(80, 24))


def test_the_evaluations_tab_tells_evaluators_apart(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    events = history()
    test5 = dict(events[-1])
    events.append({**test5, "evaluator": "knn[k=3]", "accuracy": 0.6543, "source": "fslab eval"})
    folder = write_run(runs, "20260101-100000-nca-aaaa", events=events)

    async def body(app, pilot):
        await pilot.press("enter", "4")
        await settle(app, pilot)
        table = app.screen.query_one("#evals")
        rows = [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]
        assert rows[-2][:2] == ["test", "centroid"] and rows[-1][:2] == ["test", "knn[k=3]"]
        assert rows[-1][-1] == "65.43±0.39" and rows[-2][-1] == "71.07±0.39"
        assert "evaluator" in "\n".join(lines_of(app))

    assert folder.name
    drive(frozen_app(runs), body, size=(80, 24))


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
def test_compare_draws_each_groups_accuracy_with_its_interval(tmp_path, size):
    runs = tmp_path / "runs"
    runs.mkdir()
    folders = standard_store(runs)
    for seed, key in enumerate(("done0", "done1")):
        save_episode_scores(folders[key], seed)
    folders["other"] = write_run(runs, "20260101-140000-nca-ffff", cfg=config(backbone="resnet12"), events=history())
    save_episode_scores(folders["other"], 7)

    async def body(app, pilot):
        await pilot.press("space", "space", "space", "space", "c")
        await settle(app, pilot)
        chart = app.screen.query_one("#chart-accuracy")
        text = chart.render().plain
        blocks = [block for _, block in chart.blocks]
        assert [len(rows) for rows in blocks] == [2, 2]  # two groups with a test, for 1-shot and 5-shot
        assert "test 1-shot accuracy (%) ± 95% CI" in text and "test 5-shot accuracy (%) ± 95% CI" in text
        for rows in blocks:
            for _group, mean, ci in rows:
                assert f"{100 * mean:.2f}±{100 * ci:.2f}" in text
        assert text.count("●") == 4 and text.count("├") == 4
        styles = {str(span.style) for span in chart.render().spans}
        assert {PALETTE[0], PALETTE[1]} <= styles
        screen = "\n".join(lines_of(app))
        assert "training loss" in screen and "test 5-shot accuracy" in screen
        assert screen.count("●") == 4  # drawn on screen, labels giving way at 80 columns

    drive(frozen_app(runs), body, size=size)


def test_x_axis_labels_are_round_values_between_the_ends():
    assert x_axis(0, 99999, 51).split() == ["0", "25000", "50000", "75000", "99999"]
    assert x_axis(1, 3, 70).split() == ["1", "2", "3"]  # epochs: whole numbers only
    assert x_axis(0, 600, 60).split() == ["0", "200", "400", "600"]
    assert x_axis(1, 12, 8).split() == ["1", "12"] and len(x_axis(1, 12, 8)) == 8


def test_the_compare_chart_names_every_marked_run_at_80x24(store):
    """The legend was one line cut at the chart's width: at 80 columns only the first run was named,
    so the other curves' colours could not be told apart."""
    runs, folders = store

    async def body(app, pilot):
        await open_compare(app, pilot, folders)
        chart = app.screen.query_one("#chart-compare")
        lines = str(chart.render()).splitlines()
        assert len(lines) <= chart.size.height
        named = [line.strip() for line in lines if "■" in line]
        assert sorted(named) == sorted(f"■ {folders[key].name}" for key in ("done0", "done1", "failed"))

    drive(frozen_app(runs), body, size=(80, 24))


def test_the_launch_form_shows_its_whole_error_and_buttons_below_24_lines(project):
    """At 60×20 the form's blank lines between fields pushed the end of a refusal, and the buttons, off the
    dialog (it cut '... gives the split that many' at 'split'); under 24 lines the fields now go without them."""
    from textual.widgets import Input

    from fslab.tui import make_app

    async def body(app, pilot):
        await pilot.press("n")
        await pilot.pause()
        app.screen.query_one("#settings", Input).value = "eval.ways=100"
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        shown = " ".join(" ".join(line.strip(" █") for line in lines_of(app)).split())
        assert "got 100; --set dataset.val_classes=100 gives the split that many" in shown
        assert "Launch (ctrl+s)" in shown and "epochs" in shown

    drive(make_app(project / "runs", tick=3600, cursor_blink=False), body, size=(60, 20))


def test_at_80x24_a_refusal_of_four_lines_shows_whole_with_the_launch_button(project, tmp_path):
    """At 80×24 the form kept blank lines between its seven fields, which left a refusal three lines: the
    four of a long data root that is not there pushed the Launch button off the dialog."""
    from textual.widgets import Input, Select

    from fslab.tui import make_app

    root = tmp_path / "a-long-path-to-images" / "that-were-never-copied-to-this-machine" / "mini"

    async def body(app, pilot):
        await pilot.press("n")
        await pilot.pause()
        app.screen.query_one("#dataset", Select).value = "folder"
        app.screen.query_one("#data-root", Input).value = str(root)
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        assert app.screen.query_one("#launch-error").size.height >= 4
        lines = lines_of(app)
        [at] = [i for i, line in enumerate(lines) if "Launch (ctrl+s)" in line]
        assert "▁▁▁▁" in lines[at + 1]  # the button whole, its lower edge inside the dialog

    drive(make_app(project / "runs", tick=3600, cursor_blink=False), body, size=(80, 24))


def test_a_shorter_terminal_keeps_the_selected_run_on_screen(tmp_path):
    """With the cursor on the last of many runs, a terminal made shorter left that row below the table's
    end (enter then opened a run no one could see); the table now scrolls to it."""
    runs = tmp_path / "runs"
    for i in range(40):
        write_run(runs, f"20260101-1000{i:02d}-nca-{i:04d}", events=history()[:3])

    async def body(app, pilot):
        await pilot.press("end")
        await settle(app, pilot)
        table = app.screen.table
        assert table.cursor_id == "20260101-100000-nca-0000"  # newest first: the oldest is last
        await pilot.resize_terminal(80, 14)
        await settle(app, pilot)
        assert any("nca-0000" in line for line in table_lines(app)[1:]), table_lines(app)

    drive(frozen_app(runs), body, size=(80, 24))
