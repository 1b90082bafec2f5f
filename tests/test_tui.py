"""The dashboard driven headless with Textual's Pilot, over tiny run stores
written by the tests (times frozen), plus its pure parts (tailing, pooling,
charts). One test starts a real tiny run from the launch form."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fslab.core.files import read_appended
from fslab.core.summary import RunSummary, SummaryFile
from fslab.core.text import percent
from fslab.tui import make_app
from fslab.tui.charts import LineChart, MinMaxSeries, Plot, downsample, render_chart
from fslab.tui.help_screen import key_lines
from fslab.tui.model import matches
from fslab.tui.tailing import StoreWatcher

from .runs_helpers import TINY
from .test_tui_helpers import (
    FROZEN,
    append,
    complete_config,
    config,
    evaluation,
    history,
    save_episode_scores,
    standard_store,
    train,
    write_run,
    write_status,
)


def drive(app, body, size=(120, 36)):
    """Run ``body(app, pilot)`` inside the headless app."""

    async def main():
        async with app.run_test(size=size) as pilot:
            await settle(app, pilot)
            await body(app, pilot)

    asyncio.run(main())


async def settle(app, pilot):
    """Let the store worker finish a tick and the UI apply it."""
    for _ in range(3):
        await app.workers.wait_for_complete()
        await pilot.pause()


async def open_compare(app, pilot, folders, keys=("done0", "done1", "failed")):
    """Mark the runs of ``keys`` in the runs table and open the compare screen on them."""
    table = app.screen.table
    for key in keys:
        table.cursor = table.ids.index(folders[key].name)
        await pilot.press("space")
    await pilot.press("c")
    await settle(app, pilot)


async def open_detail(app, pilot, run_id: str):
    """Select run ``run_id`` in the runs table and open its detail screen."""
    app.screen.table.cursor = app.screen.table.ids.index(run_id)
    await pilot.press("enter")
    await settle(app, pilot)


async def tick(app, pilot):
    app.poll_store()
    await settle(app, pilot)


def row_text(app, run_id):
    return " ".join(cell.plain for cell in app.screen.cells(run_id))


def screen_text(widget):
    return "\n".join(widget.render_line(y).text for y in range(widget.size.height))


@pytest.fixture
def store(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    return runs, standard_store(runs)


def fake_checkpoint(path):
    """A file shaped like a checkpoint (a zip archive) for tests that never load it."""
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("last/data.pkl", b"not loaded")


def frozen_app(runs, **kwargs):
    return make_app(runs, clock=lambda: FROZEN, tick=3600, cursor_blink=False, **kwargs)


# -- the runs table --------------------------------------------------------------


def test_table_lists_every_run_with_its_numbers(store):
    runs, folders = store

    async def body(app, pilot):
        table = app.screen.table
        ids = [f.name for f in folders.values()]
        assert table.ids == sorted(ids, reverse=True)  # newest first
        done = row_text(app, folders["done0"].name)
        # method, loss plugin, backbone, dataset, seed, state, progress, loss, pairs, best val, tests, elapsed
        for text in ("nca", "conv4", "synthetic", "completed", "3/3", "0.7722", "60/6000", "65.00±1.00",
                     "54.22±0.44", "71.07±0.39", "8:25"):
            assert text in done, (text, done)
        running = row_text(app, folders["running"].name)
        assert "running" in running and "1/3" in running and "10:05" in running  # elapsed from the frozen clock
        assert "failed" in row_text(app, folders["failed"].name)
        drawn = screen_text(table)
        assert folders["failed"].name in drawn and "protonet" in drawn and "failed" in drawn

    drive(frozen_app(runs), body)


def test_new_metrics_line_appears_after_a_tick_and_bad_lines_do_not(store):
    runs, folders = store
    live = folders["running"]

    async def body(app, pilot):
        assert "0.1234" not in row_text(app, live.name)
        append(live, json.dumps(train(5, 2, 0.1234)) + "\n")
        await tick(app, pilot)
        assert "0.1234" in row_text(app, live.name)
        assert "0.1234" in screen_text(app.screen.table)
        # A torn line is left for the next tick; a corrupt one is skipped and counted.
        torn = json.dumps(train(6, 2, 0.0777))
        append(live, "{not json}\n" + torn[:20])
        await tick(app, pilot)
        assert "0.0777" not in row_text(app, live.name) and app.rows[live.name].corrupt == 1
        append(live, torn[20:] + "\n")
        await tick(app, pilot)
        assert "0.0777" in row_text(app, live.name)
        status = str(app.screen.query_one("#status").render())
        assert "1 corrupt metrics line skipped" in status
        assert status.index("corrupt metrics line") < status.index("sort:")  # the note first: it must be read

    drive(frozen_app(runs), body)


def test_new_runs_state_changes_and_deleted_or_half_made_folders(store):
    runs, folders = store

    async def body(app, pilot):
        new = write_run(runs, "20260102-000000-nca-eeee", state="queued", events=[])
        (runs / "20260102-000001-nca-half").mkdir()  # half-created: no config.json yet
        status = json.loads((folders["running"] / "status.json").read_text())
        status.update(state="completed", ended=FROZEN)
        write_status(folders["running"], status)
        shutil.rmtree(folders["done1"])
        await tick(app, pilot)
        ids = app.screen.table.ids
        assert ids[0] == new.name and "queued" in row_text(app, new.name)
        assert folders["done1"].name not in ids and len(ids) == 4
        assert "completed" in row_text(app, folders["running"].name)
        assert "1 folder without config.json or status.json skipped" in str(app.screen.query_one("#status").render())
        # a run without its config.json is listed as unreadable, as fslab runs lists it
        damaged = write_run(runs, "20260102-000002-nca-conf", state="completed", events=[])
        (damaged / "config.json").unlink()
        await tick(app, pilot)
        assert (app.rows[damaged.name].state, app.rows[damaged.name].note) == ("unreadable", "config.json missing")
        (folders["done0"] / "status.json").write_text("{half a stat")  # unreadable: noted, not fatal
        (folders["done0"] / "metrics.jsonl").unlink()
        await tick(app, pilot)
        assert app.rows[folders["done0"].name].note == "status.json is cut short or not JSON (line 1, column 2)"
        assert app.rows[folders["done0"].name].state == "unreadable"
        assert "!" in row_text(app, folders["done0"].name)
        # a deleted run is a note; many deleted at once are one note, not a screen of them
        notes = []
        app.notify = lambda message, **kw: notes.append(message)
        for i in range(5):
            write_run(runs, f"20260103-00000{i}-nca-gone", state="queued", events=[])
        await tick(app, pilot)
        for i in range(5):
            shutil.rmtree(runs / f"20260103-00000{i}-nca-gone")
        shutil.rmtree(new)
        await tick(app, pilot)
        assert len(notes) == 1 and notes[0].startswith("6 runs were deleted (") and notes[0].endswith(", ...)")
        shutil.rmtree(folders["done0"])
        await tick(app, pilot)
        assert notes[1:] == [f"run {folders['done0'].name} was deleted"]

    drive(frozen_app(runs), body)


def test_a_runs_folder_made_a_file_while_open_is_said_not_no_runs_yet(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()

    async def body(app, pilot):
        status = lambda: str(app.screen.query_one("#status").render())
        assert f"no runs in {runs} yet: press n to start one" in status()
        runs.rmdir()
        runs.write_text("x")
        await tick(app, pilot)
        assert f"{runs} is a file, not the runs folder: move or rename it" in status()
        assert "no runs in" not in status()

    drive(frozen_app(runs), body)


def test_the_dashboard_opened_in_a_project_s_subfolder_names_the_project_above(tmp_path, monkeypatch):
    """fslab tui in a project's subfolder (a store copied elsewhere, opened from its notebooks/) said only "no runs
    in runs yet: press n to start one", which would start a second store there; it names the fslab.toml above and
    FSLAB_CONFIG, as fslab runs does."""
    (tmp_path / "fslab.toml").write_text("[project]\n")
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    monkeypatch.delenv("FSLAB_CONFIG", raising=False)

    async def body(app, pilot):
        status = str(app.screen.query_one("#status").render())
        assert status.endswith("no runs in runs yet: press n to start one; a project's fslab.toml is above this "
                               "folder (../fslab.toml), but fslab reads the fslab.toml and runs/ of the folder it "
                               "runs in: run it in .., or here with FSLAB_CONFIG=../fslab.toml"), status

    drive(frozen_app(Path("runs")), body)


def test_a_deleted_marked_run_is_no_longer_counted_as_marked(store):
    """The status line kept counting a marked run after its folder was deleted ('2 marked' with one
    mark left) until something rebuilt the table."""
    runs, folders = store

    async def body(app, pilot):
        table = app.screen.table
        for key in ("done0", "failed"):
            table.cursor = table.ids.index(folders[key].name)
            await pilot.press("space")
        shutil.rmtree(folders["failed"])
        await tick(app, pilot)
        assert table.marked == {folders["done0"].name}
        assert str(app.screen.query_one("#status").render()).endswith(" · 1 marked")

    drive(frozen_app(runs), body)


def test_filter_by_typing_and_sort(store):
    runs, folders = store

    async def body(app, pilot):
        table = app.screen.table
        await pilot.press("slash", *"state:failed")
        await pilot.pause()
        assert table.ids == [folders["failed"].name]
        await pilot.press("escape")
        await pilot.press("slash", *"resnet12")
        await pilot.pause()
        assert table.ids == [folders["failed"].name]
        await pilot.press("escape")
        await pilot.press("slash", *"nca running")
        await pilot.pause()
        assert table.ids == [folders["running"].name]
        await pilot.press("escape")
        assert len(table.ids) == 4 and app.focused is table
        await pilot.press("o", "o", "o", "o", "o")  # id -> state -> method -> loss -> best val -> test 5-shot
        await pilot.pause()
        assert app.screen.sort_by == "test 5-shot"
        assert table.ids[:2] == [folders["done1"].name, folders["done0"].name]  # 73.07 before 71.07
        await pilot.press("O")
        await pilot.pause()
        assert table.ids[0] == folders["done0"].name  # ascending; runs without a test stay last
        assert set(table.ids[2:]) == {folders["failed"].name, folders["running"].name}

    drive(frozen_app(runs), body)


def test_sweep_filters_the_runs_of_one_sweep(store):
    """A sweep's runs could not be told apart in the table (no column, no filter field: sweep:4b55 was an
    unknown field) while fslab runs --sweep picks them; the filter now has a sweep field."""
    runs, folders = store
    for key in ("done0", "done1"):
        status = json.loads((folders[key] / "status.json").read_text())
        write_status(folders[key], {**status, "sweep": "sweep-20260101-100000-4b55"})

    async def body(app, pilot):
        table = app.screen.table
        await pilot.press("slash", *"sweep:4b55")
        await pilot.pause()
        assert sorted(table.ids) == sorted([folders["done0"].name, folders["done1"].name])
        assert "unknown" not in str(app.screen.query_one("#status").render())
        await pilot.press("escape", "slash", *"swep:4b55")
        await pilot.pause()
        assert "unknown filter field swep: use id, method, loss, backbone, dataset, seed, state, sweep" in str(
            app.screen.query_one("#status").render())

    drive(frozen_app(runs), body)


def test_sweep_last_filters_the_newest_sweeps_runs(store):
    """fslab runs --sweep last lists the newest sweep's runs; the filter's sweep:last matched nothing
    (no sweep id holds 'last'). It now names the newest sweep, as the listing resolves it, and follows
    a sweep recorded while the dashboard is open. The status line says which sweep that is, and, before
    the store has any sweep, why the table is empty (it was left empty, unexplained)."""
    runs, folders = store
    older, newer = "sweep-20260101-100000-4b55", "sweep-20260102-100000-9c01"
    for key, sweep in (("done0", older), ("done1", newer)):
        status = json.loads((folders[key] / "status.json").read_text())
        write_status(folders[key], {**status, "sweep": sweep})

    async def body(app, pilot):
        table = app.screen.table
        status = lambda: str(app.screen.query_one("#status").render())
        await pilot.press("slash", *"sweep:last")
        await pilot.pause()
        assert table.ids == [] and "filter: sweep:last (no sweep yet: sweep:last matches no run)" in status()
        (runs / "sweeps").mkdir()
        (runs / "sweeps" / f"{older}.json").write_text(json.dumps({"runs": [folders["done0"].name]}))
        app.screen.rebuild()
        await pilot.pause()
        assert table.ids == [folders["done0"].name] and f"filter: sweep:last (sweep:last is {older})" in status()
        (runs / "sweeps" / f"{newer}.json").write_text(json.dumps({"runs": [folders["done1"].name]}))
        await tick(app, pilot)
        app.screen.rebuild()
        await pilot.pause()
        assert table.ids == [folders["done1"].name] and f"(sweep:last is {newer})" in status()
        assert "unknown" not in status()

    drive(frozen_app(runs), body)


def test_filter_terms():
    row = RunSummary(id="x", state="failed", method="nca", dataset="synthetic", error="CUDA out of memory")
    assert matches(row, "") and matches(row, "NCA synth") and matches(row, "state:fail") and matches(row, "cuda")
    assert not matches(row, "state:running") and not matches(row, "protonet") and not matches(row, "method:synthetic")
    # a field the run lacks is shown as '-': 'none' (or 'no') found the word None behind it
    assert not matches(row, "none") and not matches(row, "seed:no") and matches(row, "seed:")


def test_text_from_run_files_is_never_markup(tmp_path):
    runs = tmp_path / "runs"
    folder = write_run(runs, "20260101-000000-x-[b]ad", state="failed", cfg=config(method="[b]m[/b]"),
                       events=history()[:3], error="[bold]boom[/bold] [link=x]", stderr="[i]trace[/i]\n")

    async def body(app, pilot):
        assert "[b]m[/b]" in row_text(app, folder.name)
        assert "[b]m[/b]" in screen_text(app.screen.table)
        await pilot.press("enter")
        await settle(app, pilot)
        banner = str(app.screen.query_one("#banner").render())
        assert "FAILED: [bold]boom[/bold] [link=x]" in banner and "[i]trace[/i]" in banner

    drive(frozen_app(runs), body)


def test_control_characters_from_run_files_are_shown_not_obeyed(tmp_path):
    """A raw escape in a log, an error or a name would clear or retitle the
    terminal; the dashboard writes such characters out."""
    runs = tmp_path / "runs"
    folder = write_run(runs, "20260101-000000-nca-esc", state="failed", cfg=config(method="m\x1b[31m"),
                       events=history()[:3], error="boom\x1b[2J", stderr="trace\x1b]0;title\x07\n")

    async def body(app, pilot):
        assert "m\\x1b[31m" in row_text(app, folder.name)
        await pilot.press("enter")
        await settle(app, pilot)
        banner = str(app.screen.query_one("#banner").render())
        assert "\x1b" not in banner and "boom\\x1b[2J" in banner and "trace\\x1b]0;title\\x07" in banner
        log = app.screen.query_one("#stderr-log")
        assert list(log.lines) == ["trace\\x1b]0;title\\x07"]

    drive(frozen_app(runs), body)


# -- detail and compare -------------------------------------------------------------


def test_detail_shows_charts_evaluations_config_and_follows_logs(store):
    runs, folders = store

    async def body(app, pilot):
        await open_detail(app, pilot, folders["done0"].name)
        detail = app.screen
        assert type(detail).__name__ == "DetailScreen" and detail.run_id == folders["done0"].name
        assert detail.query_one("#evals").row_count == 5  # 3 val + 2 test
        assert detail.series["loss"].count == 12 and detail.series["val"].count == 3
        assert "no data" not in str(detail.query_one("#chart-loss").render())
        assert '"backbone"' in str(detail.query_one("#config-text").render())
        assert detail.query_one("#banner").display is False
        log = detail.query_one("#stdout-log")
        assert log.line_count == 2
        with open(folders["done0"] / "stdout.log", "a") as fh:
            fh.write("a new line\n")
        detail.follow()
        await settle(app, pilot)
        assert log.line_count == 3 and log.lines[-1] == "a new line"
        await pilot.press("escape")
        assert type(app.screen).__name__ == "RunsScreen"

    drive(frozen_app(runs), body)



def test_a_run_whose_folder_comes_back_is_followed_again(store):
    """A run screen whose folder went away (moved, deleted, to be rsynced in again) said 'its folder
    is gone' for good, while the runs table listed the run again once it was back."""
    runs, folders = store
    folder = folders["failed"]

    async def both_tick(app, pilot, detail):
        await tick(app, pilot)
        detail.follow()
        await settle(app, pilot)

    async def body(app, pilot):
        await open_detail(app, pilot, folder.name)
        detail = app.screen
        banner = detail.query_one("#banner")
        folder.rename(runs / "elsewhere")
        await both_tick(app, pilot, detail)
        assert "its folder is gone" in str(banner.render())
        (runs / "elsewhere").rename(folder)
        await both_tick(app, pilot, detail)
        await both_tick(app, pilot, detail)
        assert str(banner.render()).startswith("FAILED: RuntimeError: CUDA out of memory")
        assert detail.series["loss"].count == 4 and detail.query_one("#evals").row_count == 1  # read once, not twice
        assert detail.query_one("#stderr-log").line_count == 3

    drive(frozen_app(runs), body)


def test_the_time_line_is_computed_again_only_when_events_or_the_status_changed(store, monkeypatch):
    """Every header update (each tick, and each store change of the run) folded every event of the run
    again, on the UI thread: a tenth of a second or more a time for a run with 200,000 logged steps.
    A new event is now added to the fold, in the follow thread, and the others are not folded again."""
    from fslab.core.timing import TimeSplit

    runs, folders = store
    calls = []  # the events each fold was given
    real = TimeSplit.add
    monkeypatch.setattr(TimeSplit, "add", lambda self, events: calls.extend(events) or real(self, events))

    async def body(app, pilot):
        await open_detail(app, pilot, folders["running"].name)
        detail = app.screen
        summary = detail.query_one("#summary")
        before, line = len(calls), str(summary.render()).split("\n")[1]
        assert before >= 1 and line.startswith("time: ")
        for _ in range(3):
            detail.update_header()
            await tick(app, pilot)
        assert len(calls) == before
        append(folders["running"], json.dumps(train(5, 2, 1.0, t=FROZEN - 30)) + "\n")
        detail.follow()
        await settle(app, pilot)
        assert len(calls) == before + 1 and calls[-1]["time"] == FROZEN - 30  # the new step alone
        assert str(summary.render()).split("\n")[1] != line  # the new step's time is counted

    drive(frozen_app(runs), body)


def test_the_run_screen_folds_its_run_s_events_off_the_ui_thread(store, monkeypatch):
    """Opening a run folded every event into the charts, and each new event every event again into
    the time line, on the UI thread: seconds for a run of 200,000 logged steps, with the dashboard
    frozen meanwhile. The follow thread folds them now; the UI takes copies, drawn the same."""
    import threading

    from fslab.core.timing import TimeSplit
    from fslab.tui import charts

    runs, folders = store
    on_ui = []
    real_split, real_append = TimeSplit.add, charts.MinMaxSeries.append

    def split(self, events):
        on_ui.append(("time_split", threading.current_thread() is threading.main_thread()))
        return real_split(self, events)

    def appended(self, x, y):
        on_ui.append(("append", threading.current_thread() is threading.main_thread()))
        return real_append(self, x, y)

    monkeypatch.setattr(TimeSplit, "add", split)
    monkeypatch.setattr(charts.MinMaxSeries, "append", appended)

    async def body(app, pilot):
        await open_detail(app, pilot, folders["running"].name)
        detail = app.screen
        append(folders["running"], json.dumps(train(5, 2, 1.0, t=FROZEN - 30)) + "\n")
        detail.follow()
        await settle(app, pilot)
        assert {what for what, _ in on_ui} == {"time_split", "append"}
        assert not [what for what, ui in on_ui if ui]  # none on the UI thread
        assert detail.series["loss"].count == 5 and detail.series["loss"].buckets[-1][1] == 5  # the new step drawn
        assert detail.time_line and detail.time_line in str(detail.query_one("#summary").render())

    drive(frozen_app(runs), body)


def test_the_evals_tab_labels_a_score_by_its_metric_as_fslab_show_does(tmp_path):
    """A retrieval evaluation's mAP was shown as a bare number under 'accuracy', where fslab show says mAP."""
    runs = tmp_path / "runs"
    events = history(epochs=1)
    events[-1].update(evaluator="retrieval-map[images_per_class=20]", metric="map", accuracy=0.4064, ci95=0.0123)
    done = write_run(runs, "20260101-100000-nca-rmap", events=events)

    async def body(app, pilot):
        await open_detail(app, pilot, done.name)
        evals = app.screen.query_one("#evals")
        cells = [[c.plain for c in evals.get_row_at(i)] for i in range(evals.row_count)]
        assert cells[-1][1] == "retrieval-map[images_per_class=20]" and cells[-1][-1] == "mAP 40.64±1.23"
        assert cells[-2][-1] == "54.22±0.44"  # an accuracy stays unlabelled

    drive(frozen_app(runs), body)

def test_the_val_chart_is_in_percent_and_named_by_its_metric_as_the_evals_tab_gives_the_scores(tmp_path):
    """The val chart's axis went from 0.467 to 0.685 where the evals tab and fslab show said 50.20±3.53, and a
    retrieval run's validation mAP was drawn as 'validation accuracy'."""
    runs = tmp_path / "runs"
    plain = write_run(runs, "20260101-100000-nca-accu", events=history(epochs=3))
    events = history(epochs=3)
    for event in events:
        if event["event"] == "eval":
            event.update(evaluator="retrieval-map[images_per_class=20]", metric="map")
    retrieval = write_run(runs, "20260101-100100-nca-rmap", events=events)

    async def body(app, pilot):
        for folder, metric in ((plain, "accuracy"), (retrieval, "mAP")):
            await open_detail(app, pilot, folder.name)
            await pilot.press("3")
            await settle(app, pilot)
            chart = screen_text(app.screen.query_one("#chart-val"))
            assert chart.startswith(f"validation {metric} (%) by epoch")
            # validations of 55, 60 and 65% ± 1: the axis runs from 54.0 to 66.0, in percent
            assert "66.0│" in chart and "54.0│" in chart and "0.66" not in chart
            await pilot.press("escape")
            await settle(app, pilot)

    drive(frozen_app(runs), body)


def test_the_config_tab_says_why_it_has_no_configuration_and_shows_it_once_it_can_be_read(tmp_path):
    """The config tab of a run whose config.json was missing or cut short was blank, saying nothing."""
    runs = tmp_path / "runs"
    missing = write_run(runs, "20260101-100000-nca-gone", events=history(epochs=1))
    saved = (missing / "config.json").read_text()
    (missing / "config.json").unlink()
    cut = write_run(runs, "20260101-100100-nca-cuts", events=history(epochs=1))
    (cut / "config.json").write_text('{"method": "nca", ')

    async def body(app, pilot):
        for folder, why in ((missing, "config.json missing"), (cut, "config.json is cut short or not JSON")):
            await open_detail(app, pilot, folder.name)
            await pilot.press("5")
            text = str(app.screen.query_one("#config-text").render())
            assert text.startswith(f"no configuration to show: {why}"), text
            assert why in str(app.screen.query_one("#summary").render())  # the run's note says the same
            await pilot.press("escape")
            await settle(app, pilot)
        await open_detail(app, pilot, missing.name)
        (missing / "config.json").write_text(saved)  # put back from a copy
        app.screen.follow()
        await settle(app, pilot)
        assert '"backbone"' in str(app.screen.query_one("#config-text").render())

    drive(frozen_app(runs), body)


def test_the_config_tab_marks_a_data_root_that_is_not_on_this_machine_as_fslab_show_does(tmp_path):
    """The config tab showed a run's data root that is gone (a store copied to another machine) as any
    other; it says so above the configuration, in fslab show's words, and not for a root that is there."""
    from .test_tui_helpers import config

    runs = tmp_path / "runs"
    gone = write_run(runs, "20260101-100000-nca-gone", events=history(epochs=1),
                     cfg={**config(dataset="miniimagenet"), "dataset": {"name": "miniimagenet",
                                                                        "root": str(tmp_path / "moved")}})
    here = write_run(runs, "20260101-100100-nca-here", events=history(epochs=1),
                     cfg={**config(dataset="miniimagenet"), "dataset": {"name": "miniimagenet", "root": str(tmp_path)}})

    async def body(app, pilot):
        texts = []
        for folder in (gone, here):
            await open_detail(app, pilot, folder.name)
            await pilot.press("5")
            texts.append(str(app.screen.query_one("#config-text").render()))
            await pilot.press("escape")
            await settle(app, pilot)
        assert texts[0].startswith(f"data root {tmp_path / 'moved'} (not on this machine)\n{{"), texts[0]
        assert texts[1].startswith("{") and "not on this machine" not in texts[1]

    drive(frozen_app(runs), body)


def test_the_config_tab_sets_its_no_configuration_line_only_when_the_reason_changes(tmp_path):
    """Each tick read config.json again and set the tab's 'no configuration to show' line again, the same line:
    a refresh of the tab (a flicker) every second for as long as the file was missing."""
    runs = tmp_path / "runs"
    folder = write_run(runs, "20260101-100000-nca-gone", events=history(epochs=1))
    saved = (folder / "config.json").read_text()
    (folder / "config.json").unlink()

    async def body(app, pilot):
        await open_detail(app, pilot, folder.name)
        text = app.screen.query_one("#config-text")
        shown = []
        update = text.update
        text.update = lambda content="", **kw: shown.append(str(content)) or update(content, **kw)
        for _ in range(3):
            app.screen.follow()
            await settle(app, pilot)
        assert shown == []  # the same reason: the line stays as it is
        (folder / "config.json").write_text('{"method": ')  # cut short now: another reason, said
        app.screen.follow()
        await settle(app, pilot)
        assert len(shown) == 1 and shown[0].startswith("no configuration to show: config.json is cut short")
        (folder / "config.json").write_text(saved)
        app.screen.follow()
        await settle(app, pilot)
        assert len(shown) == 2 and '"backbone"' in shown[-1]

    drive(frozen_app(runs), body)


def test_the_run_screen_of_a_killed_run_says_why_it_stopped_as_fslab_show_does(tmp_path):
    """fslab show prints a killed run's error ('sweep stopped: run ... failed (fail-fast)'); its run screen,
    with no banner for a killed run, said only 'killed'."""
    runs = tmp_path / "runs"
    why = "sweep stopped: run 20260101-100000-nca-aaaa failed (fail-fast)"
    killed = write_run(runs, "20260101-100100-nca-kill", state="killed", error=why, events=history(epochs=1))
    done = write_run(runs, "20260101-100200-nca-done", events=history(epochs=1))

    async def body(app, pilot):
        await open_detail(app, pilot, killed.name)
        assert "killed  method nca" in str(app.screen.query_one("#summary").render())
        assert f" · error: {why}" in str(app.screen.query_one("#summary").render())
        assert app.screen.query_one("#banner").display is False
        await pilot.press("escape")
        await open_detail(app, pilot, done.name)
        assert "error" not in str(app.screen.query_one("#summary").render())

    drive(frozen_app(runs), body)


def test_the_run_screen_of_a_queued_run_whose_claim_is_damaged_says_so_in_fslab_queue_s_line(tmp_path):
    """fslab queue says of a queued run whose claim file names no process that it will not start, and what to
    do; the run screen said only 'queued'. Its line goes once the file is removed."""
    from fslab.core.runstore import Run

    runs = tmp_path / "runs"
    stuck, waiting = (write_run(runs, f"20260101-1001{n}0-nca-wait", state="queued") for n in (0, 1))
    for folder in (stuck, waiting):  # queued, nothing started for it: no worker's pid
        write_status(folder, {"state": "queued", "created": FROZEN - 60})
    (stuck / ".claimed").write_text("x garbage\n")
    line = Run(stuck).claim_problem()
    assert line.startswith(f"run {stuck.name} will not start: its claim file {stuck / '.claimed'} holds 'x garbage'")

    async def body(app, pilot):
        await open_detail(app, pilot, stuck.name)
        assert line in str(app.screen.query_one("#summary").render()).replace("\n", " ")
        (stuck / ".claimed").unlink()
        app.screen.follow()  # its next tick
        await settle(app, pilot)
        assert "will not start" not in str(app.screen.query_one("#summary").render())
        await pilot.press("escape")
        await open_detail(app, pilot, waiting.name)
        assert "queued" in str(app.screen.query_one("#summary").render())
        assert "will not start" not in str(app.screen.query_one("#summary").render())

    drive(frozen_app(runs), body)


def test_the_runs_table_marks_a_queued_run_whose_claim_is_damaged_queued_as_fslab_runs_does(tmp_path, monkeypatch):
    """fslab runs marks a queued run whose claim file names no process queued!; the dashboard's runs table showed it
    plainly queued. Its mark goes at the tick after the file is removed. A tick reads only the queued runs' claim
    files, each once (an ended run's .claimed is never read), and hands on only the problems that changed."""
    import fslab.core.runstore as runstore

    runs = tmp_path / "runs"
    stuck, waiting = (write_run(runs, f"20260101-1001{n}0-nca-wait", state="queued") for n in (0, 1))
    for folder in (stuck, waiting):  # queued, nothing started for it: no worker's pid
        write_status(folder, {"state": "queued", "created": FROZEN - 60})
    ended = write_run(runs, "20260101-100200-nca-done", events=history(epochs=1))
    for folder in (stuck, ended):
        (folder / ".claimed").write_text("x garbage\n")
    read = []
    monkeypatch.setattr(runstore, "read_claim", lambda path, real=runstore.read_claim: read.append(path) or real(path))
    line = runstore.Run(stuck).claim_problem()
    watcher, read[:] = StoreWatcher(runs, clock=lambda: FROZEN), []
    assert watcher.poll().problems == {stuck.name: line}
    assert sorted(read) == sorted([stuck, waiting]), read
    assert watcher.poll().problems == {}  # nothing changed: nothing to redraw

    async def body(app, pilot):
        assert [app.screen.cells(run.name)[2].plain for run in (stuck, waiting, ended)] == [
            "queued!", "queued", "completed"]
        (stuck / ".claimed").unlink()
        await tick(app, pilot)
        assert app.screen.cells(stuck.name)[2].plain == "queued" and app.problems == {}

    drive(frozen_app(runs), body)


def test_the_run_screen_names_the_sweep_of_a_sweep_s_run_as_fslab_show_does(store):
    """fslab show names a run's sweep (method nca, ..., seed 0, sweep sweep-...); its run screen did not."""
    runs, folders = store
    status = json.loads((folders["done0"] / "status.json").read_text())
    write_status(folders["done0"], {**status, "sweep": "sweep-20260101-100000-4b55"})

    async def body(app, pilot):
        await open_detail(app, pilot, folders["done0"].name)
        assert "seed 0 · sweep sweep-20260101-100000-4b55 · epoch" in str(app.screen.query_one("#summary").render())
        await pilot.press("escape")
        await open_detail(app, pilot, folders["done1"].name)
        assert "sweep" not in str(app.screen.query_one("#summary").render())

    drive(frozen_app(runs), body)


def test_the_keys_scroll_the_evals_config_and_log_tabs_though_the_focus_is_on_the_tab_bar(tmp_path):
    """A long run's evals tab (a row per validation) showed its first rows only: the focus stays on the tab
    bar, where end, page down and the arrows did nothing, and ? named no key that scrolled it."""
    runs = tmp_path / "runs"
    lines = "".join(f"epoch {i} step {i}: loss 1.0\n" for i in range(200))
    run = write_run(runs, "20260101-100000-nca-long", events=history(epochs=60, steps_per_epoch=1), stdout=lines)

    async def body(app, pilot):
        await open_detail(app, pilot, run.name)
        keys = dict(key_lines(app.screen))
        assert keys["end"] == "Scroll the evals, config, stdout or stderr tab to its end"
        for tab, shown in (("4", "#evals"), ("5", "#config-scroll"), ("6", "#stdout-log")):
            await pilot.press(tab)
            await settle(app, pilot)
            widget = app.screen.query_one(shown)
            assert widget.max_scroll_y > 0
            await pilot.press("home")
            assert widget.scroll_offset.y == 0
            await pilot.press("pagedown")
            assert widget.scroll_offset.y > 0
            await pilot.press("end")
            assert widget.scroll_offset.y == widget.max_scroll_y
            await pilot.press("up")
            assert widget.scroll_offset.y == widget.max_scroll_y - 1
        assert type(app.focused).__name__ == "ContentTabs"  # ←→ still change tabs

    drive(frozen_app(runs), body, size=(100, 30))


def test_detail_of_a_failed_run_says_why_at_the_top(store):
    runs, folders = store

    async def body(app, pilot):
        await open_detail(app, pilot, folders["failed"].name)
        banner = app.screen.query_one("#banner")
        assert banner.display is True
        text = str(banner.render())
        assert "FAILED: RuntimeError: CUDA out of memory" in text and 'File "train.py"' in text
        assert "no data" in str(app.screen.query_one("#chart-loss").render()) or app.screen.series["loss"].count

    drive(frozen_app(runs), body)



def test_the_last_log_line_of_an_ended_run_shows_though_no_newline_ends_it(tmp_path):
    """A worker killed in the middle of a line (or a message printed without a newline) left that line out
    of the stderr tab and of a failed run's banner for good, while fslab logs prints it. Once the run has
    ended it is shown; a live run's unfinished line still waits for its newline."""
    runs = tmp_path / "runs"
    failed = write_run(runs, "20260101-100000-nca-fail", state="failed", events=history()[:3], error="killed",
                       stderr="Traceback (most recent call last):\nValueError: the last line, unfinished")
    live = write_run(runs, "20260101-110000-nca-live", state="running", events=history()[:3],
                     stdout="epoch 1\nepoch 2 step 3 of")

    async def body(app, pilot):
        from textual.widgets import Log

        await open_detail(app, pilot, failed.name)
        assert "ValueError: the last line, unfinished" in str(app.screen.query_one("#banner").render())
        assert list(app.screen.query_one("#stderr-log", Log).lines)[-1] == "ValueError: the last line, unfinished"
        await pilot.press("escape")
        await open_detail(app, pilot, live.name)
        assert list(app.screen.query_one("#stdout-log", Log).lines) == ["epoch 1"]
        append_text(live / "stdout.log", " 10\n")
        app.screen.follow()
        await settle(app, pilot)
        assert list(app.screen.query_one("#stdout-log", Log).lines) == ["epoch 1", "epoch 2 step 3 of 10"]

    drive(frozen_app(runs), body)


def append_text(path, text):
    with open(path, "a") as fh:
        fh.write(text)


def test_detail_header_says_what_the_table_says_of_a_damaged_run(tmp_path):
    """The header printed 'method None · loss None ...' for a run whose configuration is unreadable, and
    'epoch 0/3' for a completed run whose events are gone, where the table says '-' and '3/3'."""
    runs = tmp_path / "runs"
    damaged = write_run(runs, "20260101-100000-nca-cfgl", cfg=[1, 2], events=history())
    emptied = write_run(runs, "20260101-110000-nca-none", events=[])

    async def body(app, pilot):
        await open_detail(app, pilot, damaged.name)
        header = str(app.screen.query_one("#summary").render())
        assert "method - · loss - · backbone - · dataset - · seed - · epoch 3/3 · step 12/12" in header
        assert "None" not in header
        await pilot.press("escape")
        await open_detail(app, pilot, emptied.name)
        header = str(app.screen.query_one("#summary").render())
        assert "method nca · loss nca · backbone conv4 · dataset synthetic · seed 0 · epoch 3/3 · step 0" in header
        await pilot.press("escape")
        assert app.screen.cells(emptied.name)[4].plain == "3/3"  # the table's epoch cell

    drive(frozen_app(runs), body)


def test_a_status_with_values_of_the_wrong_type_opens_as_fslab_show_reads_it(tmp_path):
    """A status.json whose ended or resumed is not a number (hand-edited, or from another tool)
    stopped the dashboard with a TypeError when its run was opened; the run screen now reads the
    status as fslab show does (wrong types left out), and says the same time line."""
    from fslab.core.runstore import Run
    from fslab.core.timing import time_line, time_split

    runs = tmp_path / "runs"
    folder = write_run(runs, "20260101-100000-nca-stat", events=history())
    status = json.loads((folder / "status.json").read_text())
    write_status(folder, {**status, "ended": "soon", "resumed": [1]})

    async def body(app, pilot):
        await open_detail(app, pilot, folder.name)
        assert type(app.screen).__name__ == "DetailScreen"
        run = Run(folder)
        shown = run.status()
        expected = time_line(time_split(run.events(), shown.get("started"), shown.get("ended"), shown.get("resumed")))
        assert expected in str(app.screen.query_one("#summary").render())

    drive(frozen_app(runs), body)


def test_the_run_screen_leaves_out_fslab_eval_s_time_and_damaged_lines_as_fslab_show_does(tmp_path):
    """An fslab eval of a checkpoint while the run trained logs its evaluation into the run's metrics
    with its source; the run screen dropped the source and charged the training's time up to it to
    the test (10 s of the second epoch here), where fslab show leaves such an evaluation out. It also
    timed a damaged line (a train event whose loss is no number), which fslab show leaves out."""
    from fslab.core.runstore import Run
    from fslab.core.timing import time_line, time_split

    runs = tmp_path / "runs"
    events = history()
    at = next(i for i, e in enumerate(events) if e["event"] == "train" and e["epoch"] == 2)
    later = {**evaluation("test", 1, 0.5, 0.01, 100, t=events[at]["time"] + 10), "source": "fslab eval"}
    damaged = {**train(9, 1, 1.0, t=events[at]["time"] + 5), "loss": "nan?"}  # a line fslab show leaves out too
    events[at + 1:at + 1] = [damaged, later]
    folder = write_run(runs, "20260101-100000-nca-fsev", events=events)

    async def body(app, pilot):
        await open_detail(app, pilot, folder.name)
        run = Run(folder)
        shown = run.status()
        expected = time_line(time_split(run.events(), shown.get("started"), shown.get("ended"), shown.get("resumed")))
        assert "first epoch 80.0 s, training 160.0 s" in expected and "test 10.0 s" in expected
        assert expected in str(app.screen.query_one("#summary").render())

    drive(frozen_app(runs), body)


def test_the_run_screen_counts_corrupt_lines_as_the_table_and_fslab_show_do(tmp_path):
    """The run screen counted the lines it could not draw (2 here) where the table's ! and
    fslab show --json count every line that is no event of the expected shape (3)."""
    from fslab.core.summary import read_summary

    runs = tmp_path / "runs"
    folder = write_run(runs, "20260101-100000-nca-crpt", events=history())
    append(folder, '{"event": "train", "step": "x", "epoch": 1, "loss": 1.0}\n'
                   '{"event": "start", "total_steps": "many", "time": "now"}\nnot json\n')

    async def body(app, pilot):
        await open_detail(app, pilot, folder.name)
        assert app.rows[folder.name].corrupt == read_summary(folder).corrupt == 3
        assert " · 3 corrupt metrics lines skipped" in str(app.screen.query_one("#summary").render())

    drive(frozen_app(runs), body)


def test_a_long_traceback_leaves_the_charts_their_lines_and_shows_its_last_line_at_80x24(tmp_path):
    """The banner took 12 lines, cut at the bottom: the exception line of the traceback was hidden
    and the training loss chart was one line high."""
    runs = tmp_path / "runs"
    error = ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity; "
             "75.01 GiB already allocated; 1.20 GiB free; 77.00 GiB reserved in total by PyTorch)")
    frames = "".join(f'  File "/a/long/path/to/module_{i}.py", line {10 * i}, in function_{i}\n    call(a, b, c)\n'
                     for i in range(6))
    failed = write_run(runs, "20260101-120000-protonet-cccc", state="failed", events=history()[:6], error=error,
                       stderr="Traceback (most recent call last):\n" + frames + error + "\n")

    async def body(app, pilot):
        await open_detail(app, pilot, failed.name)
        banner = app.screen.query_one("#banner")
        lines = str(banner.render()).splitlines()
        assert banner.outer_size.height == len(lines) + 2 <= 8  # its border included
        assert lines[0].startswith("FAILED: RuntimeError: CUDA out of memory.") and lines[3] == "last lines of stderr:"
        assert lines[-1].startswith("  RuntimeError: CUDA out of memory.") and lines[-1].endswith("…")
        assert lines[-2] == "      call(a, b, c)"  # the lines shown are the last ones
        assert all(len(line) <= 76 for line in lines)
        assert app.screen.query_one("#chart-loss").size.height >= 6

    drive(frozen_app(runs), body, size=(80, 24))

def test_a_paused_run_whose_worker_holds_its_lock_is_running_with_a_stale_heartbeat(tmp_path):
    from fslab.core.worklock import take

    runs = tmp_path / "runs"
    folder = write_run(runs, "20260101-000000-nca-paus", state="running", events=history()[:4])
    status = json.loads((folder / "status.json").read_text())
    write_status(folder, {**status, "heartbeat": FROZEN - 1000})
    fd = take(folder)  # its worker holds the lock: alive, though paused for 16 minutes

    async def body(app, pilot):
        assert app.rows[folder.name].state == "running"
        await pilot.press("enter")
        await settle(app, pilot)
        assert "heartbeat stale (16:40 ago)" in str(app.screen.query_one("#summary").render())
        assert app.screen.query_one("#banner").display is False
        write_status(folder, {**status, "heartbeat": FROZEN - 1})  # resumed: a fresh beat
        await tick(app, pilot)  # the table's reading of the store, before the screen's own reading of the run's files
        assert "heartbeat stale" not in str(app.screen.query_one("#summary").render())  # it stayed a refresh longer

    try:
        drive(frozen_app(runs), body)
    finally:
        os.close(fd)
    write_status(folder, {**status, "heartbeat": FROZEN - 1000})
    states = {}

    async def without_lock(app, pilot):  # another host's run, no lock held: the heartbeat decides
        states[folder.name] = app.rows[folder.name].state

    drive(frozen_app(runs), without_lock)
    assert states == {folder.name: "lost"}


def test_the_run_screen_names_a_sink_that_failed_in_fslab_show_s_line_and_drops_it_once_exported(
        store, monkeypatch):
    """A sink that failed as the run trained was named by fslab show only: the run screen said nothing of a
    tracker lacking the rest of the run. It shows fslab show's own line, read as the worker writes it, and
    drops it once fslab export has sent the sink the whole run."""
    from fslab.core import sinks

    from .runs_helpers import fslab_here

    runs, folders = store
    folder = folders["done0"]
    monkeypatch.delenv("FSLAB_CONFIG", raising=False)

    async def body(app, pilot):
        await open_detail(app, pilot, folder.name)
        detail = app.screen
        assert "sink 'mlflow'" not in str(detail.query_one("#summary").render())
        sinks.record_failure(folder, "mlflow", {"failed": "on a train event", "error": "ConnectionError: refused",
                                                "time": FROZEN, "epoch": 2, "step": 7})  # as the worker keeps it
        detail.follow()
        await settle(app, pilot)
        shown = fslab_here("show", folder.name, cwd=runs.parent)
        line = next(line for line in shown.stdout.splitlines() if line.startswith("sink 'mlflow'"))
        assert line == (f"sink 'mlflow' failed on a train event at epoch 2, step 7: ConnectionError: refused; it has "
                        f"nothing of the run after that: catch it up with: fslab export {folder.name} --to mlflow")
        assert "\n" + line + "\n" in str(detail.query_one("#summary").render())
        sinks.caught_up(folder, "mlflow")  # fslab export sent it the whole run
        detail.follow()
        await settle(app, pilot)
        assert "sink 'mlflow'" not in str(detail.query_one("#summary").render())

    drive(frozen_app(runs), body)


def test_a_sink_s_long_error_is_cut_short_on_the_run_screen_never_its_export_and_the_charts_fit_80x24(store):
    """Two sinks that failed with a 300-character error each took 12 of the run screen's 24 lines at 80x24,
    leaving its charts 3: each now takes at most 3 lines, its error cut short, the export still whole."""
    from fslab.core import sinks

    runs, folders = store
    folder = folders["done0"]
    for name in ("mlflow", "wandb"):
        sinks.record_failure(folder, name, {"failed": "on a train event", "error": "ConnectionError: " + "x " * 140,
                                            "time": FROZEN, "epoch": 2, "step": 7})

    async def body(app, pilot):
        await open_detail(app, pilot, folder.name)
        summary = app.screen.query_one("#summary")
        shown = [summary.render_line(y).text.rstrip() for y in range(summary.size.height)]
        ends = [i for i, line in enumerate(shown) if line.endswith(("--to mlflow", "--to wandb"))]
        starts = [i for i, line in enumerate(shown) if line.startswith("sink '")]
        assert len(starts) == len(ends) == 2 and all(end - start < 3 for start, end in zip(starts, ends))
        assert "…; it has nothing of the run after" in " ".join(shown)
        assert app.screen.query_one("#chart-loss").size.height >= 6

    drive(frozen_app(runs), body, size=(80, 24))


def test_compare_screen_shows_what_fslab_compare_computes(store):
    """The compare screen calls fslab compare's grouping and pooling: its cells
    are the report's, and the report's numbers are those of all episodes pooled."""
    import statistics

    from fslab.core.runstore import Run
    from fslab.reports.compare import compare

    runs, folders = store
    scores = {key: save_episode_scores(folders[key], seed=i) for i, key in enumerate(("done0", "done1"))}

    async def body(app, pilot):
        await open_compare(app, pilot, folders)
        screen = app.screen
        assert type(screen).__name__ == "CompareScreen"
        groups = screen.query_one("#groups")
        assert groups.row_count == 2
        cells = [[c.plain for c in groups.get_row_at(i)] for i in range(2)]
        nca = next(r for r in cells if "method=nca" in r[6])
        assert nca[0] in ("#1", "#2") and nca[1] == "0, 1" and nca[2] == "2"
        pooled = scores["done0"][5] + scores["done1"][5]  # brute force over every episode
        mean, ci = statistics.fmean(pooled), 1.96 * statistics.pstdev(pooled) / len(pooled) ** 0.5
        assert nca[4] == f"{100 * mean:.2f}±{100 * ci:.2f}"
        assert nca[5] == "1-shot: 4000, 5-shot: 4000"
        report = compare([Run(folders[k]) for k in ("done0", "done1", "failed")])
        row = next(r for r in report["groups"] if "method=nca" in r["group"])
        assert row["results"]["5-shot"]["accuracy"] == pytest.approx(mean, abs=1e-12)
        failed = next(r for r in cells if "method=protonet" in r[6])
        assert "1 without test scores" in failed[2] and failed[3] == "-"
        assert len(screen.query_one("#chart-compare").plot.series) == 3

    drive(frozen_app(runs), body)



def test_enter_on_a_compared_group_opens_its_runs_and_the_evals_tab_lists_no_enter(store):
    """Enter on the compare screen's groups and on the run screen's evaluations was Textual's 'Select', which
    ? listed and which did nothing. On a group it now opens the run screen of the group's run (its next
    one at each enter again); on an evaluation (of the run on screen) enter is no key, and ? lists none."""
    runs, folders = store
    notes = []

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        await open_compare(app, pilot, folders)
        compared = app.screen
        assert ("⏎", "Open a run of the group (again: its next run)") in key_lines(compared)
        groups = compared.query_one("#groups")
        row = next(i for i in range(groups.row_count) if "method=nca" in groups.get_row_at(i)[6].plain)
        groups.move_cursor(row=row)
        opened = []
        for _ in range(3):  # the group's two seeds, then the first again
            await pilot.press("enter")
            await settle(app, pilot)
            assert type(app.screen).__name__ == "DetailScreen"
            opened.append(app.screen.run_id)
            await pilot.press("escape")
            await settle(app, pilot)
            assert app.screen is compared
        assert opened == [folders["done0"].name, folders["done1"].name, folders["done0"].name]
        assert notes[-1] == f"group #{row + 1}: run 1 of 2, {folders['done0'].name}; enter again opens the next"
        groups.move_cursor(row=1 - row)  # the protonet group: one run, opened without a note
        await pilot.press("enter")
        await settle(app, pilot)
        assert app.screen.run_id == folders["failed"].name and len(notes) == 3
        await pilot.press("4")
        await settle(app, pilot)
        app.screen.query_one("#evals").focus()
        await pilot.pause()
        assert all(keys != "⏎" for keys, _ in key_lines(app.screen)), key_lines(app.screen)
        await pilot.press("enter")
        await settle(app, pilot)
        assert app.screen.run_id == folders["failed"].name  # nothing opened

    drive(frozen_app(runs), body)


def test_the_compare_screen_names_the_runs_it_leaves_out_as_fslab_compare_does(store):
    """Of two marked runs with the same settings and seed, the screen pooled the newer without a word (fslab
    compare names the other on stderr), said of a failed run '1 without test yet', never its state, and counted
    the runs with scores by itself: two seeds, one scored 1-shot alone and the other 5-shot alone, were
    '2 (1 without test yet)', where fslab compare counts two seeds with scores."""
    runs, folders = store
    again = write_run(runs, "20260101-140000-nca-eeee", cfg=config(seed=0), events=history())  # done0's twin
    for folder, seed, unscored in ((folders["done0"], 0, 5), (again, 2, 5), (folders["done1"], 1, 1)):
        save_episode_scores(folder, seed=seed)
        (folder / "evaluations" / f"test-centroid-5way-{unscored}shot-15q-2000ep-seed0-epoch3.json").unlink()

    async def body(app, pilot):
        await open_compare(app, pilot, {**folders, "again": again}, keys=("done0", "done1", "failed", "again"))
        groups = app.screen.query_one("#groups")
        nca, protonet = sorted(([c.plain for c in groups.get_row_at(i)] for i in range(groups.row_count)),
                               key=lambda row: "method=protonet" in row[6])
        assert "method=nca" in nca[6] and nca[1:3] == ["0, 1", "2"]  # both seeds have scores, of one shots each
        assert protonet[2] == "1 (1 without test scores)"
        note = str(app.screen.query_one("#compare-note").render())
        assert note.endswith(f"; 1 run left out, each repeating the settings and seed of another (the newest with "
                             f"results counts): {folders['done0'].name}; 1 run without test scores (left out): "
                             f"{folders['failed'].name} (failed)")

    drive(frozen_app(runs), body)


def test_the_compare_screen_takes_the_oldest_marked_run_s_group_as_its_baseline_as_fslab_compare_does(store):
    """The screen compared the marked runs newest first, so its first group, the baseline of the paired
    differences, was the newest run's: a sweep's last setting, where fslab compare SWEEP (and all) take its
    first, and each difference was the opposite of fslab compare's."""
    from fslab.core.runstore import list_runs
    from fslab.reports.compare import compare

    runs, folders = store
    slower = {}
    for seed, run_id in ((0, "20260101-140000-nca-eeee"), (1, "20260101-150000-nca-ffff")):  # newer, lr 0.2
        slower[seed] = write_run(runs, run_id, cfg={**config(seed=seed), "train": {**config()["train"], "lr": 0.2}},
                                 events=history())
    for seed, folder in enumerate((folders["done0"], folders["done1"], slower[0], slower[1])):
        save_episode_scores(folder, seed=seed)  # scores of their own, paired by the runs' seeds
    marked = {"done0": folders["done0"], "done1": folders["done1"], "slow0": slower[0], "slow1": slower[1]}
    report = compare([run for run in list_runs(runs) if run.path in marked.values()])  # as fslab compare all
    assert [p["baseline"] for p in report["paired"]] == ["train.lr=0.1", "train.lr=0.1"]

    async def body(app, pilot):
        await open_compare(app, pilot, marked, keys=tuple(marked))
        groups = app.screen.query_one("#groups")
        assert [groups.get_row_at(i)[6].plain for i in range(2)] == ["train.lr=0.1", "train.lr=0.2"]
        lines = [f"train.lr=0.2 − train.lr=0.1, {p['shots']}-shot: {percent(p['difference'], sign=True)} ± "
                 f"{percent(p['ci95'])} points (paired over {p['episodes']} episodes)" for p in report["paired"]]
        assert str(app.screen.query_one("#paired").render()) == "\n".join(lines)

    drive(frozen_app(runs), body)


def test_a_damaged_metrics_line_does_not_stop_the_compare_screen(store):
    """A train line whose step is text or null stopped the dashboard with a TypeError from the
    loss chart when its run was compared; the run screen skips such a line, and so does compare."""
    runs, folders = store
    append(folders["running"], json.dumps({"event": "train", "step": "7", "epoch": 2, "loss": 1.0}) + "\n"
           + json.dumps({"event": "train", "step": None, "epoch": 2, "loss": 1.0}) + "\n"
           + json.dumps(train(7, 2, 0.9)) + "\n")

    async def body(app, pilot):
        await open_compare(app, pilot, folders, keys=("running", "done0"))
        assert type(app.screen).__name__ == "CompareScreen"
        losses = app.screen.losses
        assert losses[folders["running"].name].count == 5  # 4 logged steps before, the good line after
        assert losses[folders["done0"].name].count == 12

    drive(frozen_app(runs), body)


def test_the_compare_screen_folds_the_losses_off_the_ui_thread(store, monkeypatch):
    """The compare screen appended every training loss of the runs to its chart on the UI thread:
    over a second there for two runs of 200,000 steps. The follow thread folds them; the UI takes copies."""
    import threading

    from fslab.tui import charts

    runs, folders = store
    on_ui, real_append = [], charts.MinMaxSeries.append
    monkeypatch.setattr(charts.MinMaxSeries, "append", lambda self, x, y: (
        on_ui.append(threading.current_thread() is threading.main_thread()), real_append(self, x, y))[1])

    async def body(app, pilot):
        await open_compare(app, pilot, folders, keys=("running", "done0"))
        screen = app.screen
        append(folders["running"], json.dumps(train(5, 2, 0.25)) + "\n")
        screen.follow()
        await settle(app, pilot)
        losses = screen.losses[folders["running"].name]
        assert losses.count == 5 and losses.buckets[-1] == [5, 5, 0.25, 0.25]  # the new step drawn
        assert screen.losses[folders["done0"].name].count == 12
        assert on_ui and not any(on_ui)  # every loss folded, none on the UI thread

    drive(frozen_app(runs), body)


def test_compare_takes_every_marked_run_also_those_the_filter_hides(store):
    """With one marked run shown and another hidden by the filter, c compared the shown one alone,
    while the status line said '2 marked'."""
    runs, folders = store

    async def body(app, pilot):
        table = app.screen.table
        for key in ("done0", "done1"):
            table.cursor = table.ids.index(folders[key].name)
            await pilot.press("space")
        await pilot.press("slash", *"bbbb", "enter")
        await settle(app, pilot)
        assert table.ids == [folders["done1"].name]
        await pilot.press("c")
        await settle(app, pilot)
        assert app.screen.run_ids == [folders["done1"].name, folders["done0"].name]
        assert app.screen.query_one("#groups").get_row_at(0)[2].plain.split()[0] == "2"  # both seeds, one group

    drive(frozen_app(runs), body)


def test_compare_reads_retrieval_runs_on_the_episodes_they_were_scored_on(tmp_path):
    """retrieval-map sets its own episode shape (10 images per class: 9 queries), not eval.queries:
    the compare screen read 15-query episodes and said '2 (2 without test yet)' of two tested runs,
    where fslab compare --queries 9 pools their mAP. Runs scored at two shapes are read as fslab
    compare reads them, the others named."""
    import random
    import statistics

    runs = tmp_path / "runs"
    cfg = {**config(), "evaluator": {"name": "retrieval-map", "images_per_class": 10}}
    label = "retrieval-map[images_per_class=10]"
    pooled = []
    for seed in (0, 1):
        folder = write_run(runs, f"2026010{seed + 1}-100000-nca-map{seed}", cfg={**cfg, "seed": seed},
                           events=history(tests=()))
        rng = random.Random(seed)
        scores = [rng.uniform(0.3, 0.7) for _ in range(40)]
        pooled += scores
        record = {"split": "test", "ways": 5, "shots": 1, "queries": 9, "episodes": 40, "evaluator": label,
                  "metric": "map", "seed": 0, "stream": 2, "epoch": 3, "accuracies": scores,
                  "accuracy": statistics.fmean(scores), "ci95": 0.01}
        (folder / "evaluations").mkdir()
        (folder / "evaluations" / f"test-{label}-5way-1shot-9q-40ep-seed0-epoch3.json").write_text(json.dumps(record))
    accuracy = write_run(runs, "20251231-100000-nca-acc0", events=history())  # the oldest: listed last
    save_episode_scores(accuracy, seed=2)

    async def body(app, pilot):
        async def compare(run_ids):
            for run_id in run_ids:
                app.screen.table.cursor = app.screen.table.ids.index(run_id)
                await pilot.press("space")
            await pilot.press("c")
            await settle(app, pilot)
            return ([cell.plain for cell in app.screen.query_one("#groups").get_row_at(0)],
                    str(app.screen.query_one("#compare-note").render()))

        row, note = await compare([f"2026010{seed + 1}-100000-nca-map{seed}" for seed in (0, 1)])
        mean, ci = statistics.fmean(pooled), 1.96 * statistics.pstdev(pooled) / len(pooled) ** 0.5
        assert row[2:5] == ["2", f"mAP {100 * mean:.2f}±{100 * ci:.2f}", "-"]
        assert "on 5-way episodes with 9 queries" in note
        # the interval chart names what it draws, as fslab plot's axis does (it said 'accuracy' of an mAP)
        assert [title for title, _ in app.screen.query_one("#chart-accuracy").blocks][0] == \
            "test 1-shot mAP (%) ± 95% CI"
        await pilot.press("escape")
        await settle(app, pilot)
        row, note = await compare([accuracy.name])  # three marked, scored at two shapes: the papers' 15 queries,
        assert "on 5-way episodes with 15 queries" in note  # the others named, as fslab compare names them
        assert note.endswith("".join(f"; 2026010{seed + 1}-100000-nca-map{seed} left out, scored on 5-way, 9 queries "
                                     f"(--ways 5 --queries 9)" for seed in (0, 1)))  # oldest first

    drive(frozen_app(runs), body)


def test_compare_screen_leaves_out_a_run_from_a_newer_fslab_and_says_so(store):
    """The first marked run's configuration from a newer fslab stopped the screen's reader:
    no groups, no loss curves and no word why."""
    runs, folders = store
    save_episode_scores(folders["done0"], seed=0)
    newer = write_run(runs, "20260101-170000-nca-newr", cfg={**complete_config(), "config_version": 99},
                      events=history())

    async def body(app, pilot):
        table = app.screen.table
        for run_id in (newer.name, folders["done0"].name):
            table.cursor = table.ids.index(run_id)
            await pilot.press("space")
        await pilot.press("c")
        await settle(app, pilot)
        screen = app.screen
        groups = screen.query_one("#groups")
        assert groups.row_count == 1
        row = [c.plain for c in groups.get_row_at(0)]
        assert row[1:3] == ["0", "1"] and row[5] == "1-shot: 2000, 5-shot: 2000"
        note = str(screen.query_one("#compare-note").render())
        assert f"1 run left out, each one whose configuration cannot be read: {newer.name}" in note
        chart = screen.query_one("#chart-compare").plot
        assert [series.count for _, series in chart.series] == [12, 12]  # both runs' losses are drawn

    drive(frozen_app(runs), body)


def test_compare_screen_names_a_damaged_saved_evaluation_as_fslab_compare_does(store):
    """A saved evaluation holding NaN was left out of the screen's pooling without a word, where fslab compare
    names it on stderr with the fslab eval that scores its episodes again."""
    runs, folders = store
    save_episode_scores(folders["done0"], seed=0)
    save_episode_scores(folders["done1"], seed=1)
    name = "test-centroid-5way-1shot-15q-2000ep-seed0-epoch3.json"
    damaged = folders["done1"] / "evaluations" / name
    damaged.write_text(damaged.read_text().replace("0.", "NaN, 0.", 1).replace(", 0.", ", ", 1))

    async def body(app, pilot):
        await open_compare(app, pilot, folders, ("done0", "done1"))
        note = str(app.screen.query_one("#compare-note").render())
        assert "1 saved evaluation left out, damaged (" in note
        assert f"{folders['done1'].name}/evaluations/{name}" in note
        assert f"score those episodes again with: fslab eval {folders['done1'].name}" in note

    assert json.loads(damaged.read_text())["accuracies"][0] != json.loads(damaged.read_text())["accuracies"][0]  # NaN
    drive(frozen_app(runs), body)


def test_compare_screen_names_the_runs_read_on_their_first_episodes_as_fslab_compare_does(store):
    """A run scored only on more episodes than another is read on its first as many as every run reaches;
    fslab compare's title names it, and the screen's note, which pooled it the same, said nothing."""
    runs, folders = store
    save_episode_scores(folders["done0"], seed=0, episodes=20)
    save_episode_scores(folders["done1"], seed=1, episodes=50)

    async def body(app, pilot):
        await open_compare(app, pilot, folders, ("done0", "done1"))
        note = " ".join(str(app.screen.query_one("#compare-note").render()).split())
        assert (f"pooled over all episodes of a group's runs, each run read on its first 20 episodes, the most every "
                f"run reaches (1 run scored on more, so cut: {folders['done1'].name})") in note

    drive(frozen_app(runs), body)


def test_new_run_like_a_run_whose_configuration_cannot_be_read_is_a_note_not_a_crash(store):
    """N on a run saved by a newer fslab raised NewerConfig out of the dashboard (a traceback)."""
    runs, folders = store
    newer = write_run(runs, "20260101-170000-nca-newr", cfg={**complete_config(), "config_version": 99},
                      events=history())
    notes = []

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append((message, kw.get("severity")))
        app.screen.table.cursor = app.screen.table.ids.index(newer.name)
        await pilot.press("N")
        await settle(app, pilot)
        assert type(app.screen).__name__ == "RunsScreen"
        assert notes == [(f"run {newer.name}: configuration version 99 was written by a newer fslab (this one "
                          f"reads versions up to {CONFIG_VERSION}); upgrade fslab", "error")]

    from fslab.core.config import CONFIG_VERSION

    app = frozen_app(runs)
    drive(app, body)
    assert app.return_code in (None, 0)


def test_new_run_like_a_run_deleted_while_its_form_is_open_or_before_n_says_it_was_deleted(store):
    """N's form open on a run that fslab delete removed from another shell said, at ctrl+s, that the run
    'has no readable configuration'; N on a run deleted since the table's last read said the same. Both
    now say the run was deleted; nothing is launched."""
    runs, folders = store
    like_it = write_run(runs, "20260101-170000-nca-like", cfg=complete_config(seed=4), events=history())
    launched, notes = [], []

    async def body(app, pilot):
        app.launch = lambda method, overrides, registry: launched.append(overrides)
        app.notify = lambda message, **kw: notes.append(message)
        app.screen.table.cursor = app.screen.table.ids.index(like_it.name)
        await pilot.press("N")
        await settle(app, pilot)
        form = app.screen
        assert type(form).__name__ == "LaunchScreen"
        shutil.rmtree(like_it)
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is form and launched == []
        said = f"run {like_it.name} was deleted (its folder is gone), so there is no run to start one like; n starts"
        assert str(form.query_one("#launch-error").render()).startswith(said)
        await pilot.press("escape")
        await pilot.pause()
        assert like_it.name in app.rows  # not read deleted yet: no tick since
        await pilot.press("N")
        await settle(app, pilot)
        assert type(app.screen).__name__ == "RunsScreen" and notes and notes[-1].startswith(said)

    drive(frozen_app(runs), body)


def test_new_run_like_a_run_fslab_run_like_refuses_is_its_note_not_a_form_or_a_crash(store):
    """N on a run whose method no plugin registers now stopped the dashboard (the form's method
    list raised InvalidSelectValueError); on one whose config.json is damaged it opened a form
    that launched nothing like it. Both are now the line fslab run --like prints."""
    runs, folders = store
    gone = write_run(runs, "20260101-170000-gone-meth", cfg={**config(), "method": "gone"}, events=history())
    damaged = write_run(runs, "20260101-180000-nca-dmgd", cfg=config(), events=history())
    (damaged / "config.json").write_text("{not json")
    notes = []

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        for folder in (gone, damaged):
            app.screen.table.cursor = app.screen.table.ids.index(folder.name)
            await pilot.press("N")
            await settle(app, pilot)
            assert type(app.screen).__name__ == "RunsScreen"
        assert notes[0] == (f"run {gone.name} was trained with method 'gone', which no installed plugin registers "
                            f"(fslab plugins --kind method lists those that are); install its plugin to start a "
                            f"run like it")
        assert notes[1] == f"run {damaged.name} has no readable configuration to start a run like it from"
        assert len(notes) == 2

    app = frozen_app(runs)
    drive(app, body)
    assert app.return_code in (None, 0)


# -- actions ----------------------------------------------------------------------------


def test_stop_asks_then_calls_the_core_stop(tmp_path, monkeypatch):
    from fslab.execution import executor

    runs = tmp_path / "runs"
    folder = runs / "20260101-000000-nca-live"
    # a stand-in worker: stop signals only a process whose command line runs the worker on the run's folder
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "fslab.execution.worker",
                                str(folder)])
    try:
        write_run(runs, folder.name, state="running", events=history()[:4])
        status = json.loads((folder / "status.json").read_text())
        status.update(host=socket.gethostname(), pid=sleeper.pid, heartbeat=time.time())
        write_status(folder, status)
        calls = []
        real_stop = executor.stop
        monkeypatch.setattr(executor, "stop", lambda run, **kw: calls.append(run.id) or real_stop(run, grace=5))

        async def body(app, pilot):
            await pilot.press("s")
            assert type(app.screen).__name__ == "ConfirmScreen"
            await pilot.press("n")  # no: nothing happens
            await settle(app, pilot)
            assert calls == [] and sleeper.poll() is None
            await pilot.press("s", "y")
            await settle(app, pilot)
            assert calls == [folder.name]
            assert json.loads((folder / "status.json").read_text())["state"] == "killed"
            await tick(app, pilot)
            assert app.rows[folder.name].state == "killed"
            await pilot.press("s")  # a killed run cannot be stopped again: no dialog
            assert type(app.screen).__name__ == "RunsScreen"

        drive(make_app(runs, tick=3600, cursor_blink=False), body)
        assert sleeper.wait(5) is not None
    finally:
        sleeper.kill()
        sleeper.wait()



def test_a_stop_refused_because_the_run_ended_meanwhile_is_its_own_line(store, monkeypatch):
    """The note read 'could not stop RUN: UsageError: run RUN is completed, ...': a class name, not words."""
    from fslab.core.errors import UsageError
    from fslab.execution import executor

    runs, folders = store
    live = folders["running"].name

    def ended(run, **kw):
        raise UsageError(f"run {run.id} is completed, not running; nothing to stop")

    monkeypatch.setattr(executor, "stop", ended)
    notes = []

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        app.screen.table.cursor = app.screen.table.ids.index(live)
        await pilot.press("s", "y")
        await settle(app, pilot)
        assert notes[-1] == f"could not stop {live}: run {live} is completed, not running; nothing to stop"

    drive(frozen_app(runs), body)

def test_d_deletes_an_ended_run_after_asking_and_refuses_a_live_one(store):
    """d is fslab delete for the run under the cursor: asked first, the folder gone, the row with it."""
    runs, folders = store
    failed, live = folders["failed"].name, folders["running"].name
    notes = []

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        table = app.screen.table
        table.cursor = table.ids.index(live)
        await pilot.press("d")  # running: no dialog, what to do instead
        assert type(app.screen).__name__ == "RunsScreen"
        assert notes[-1] == f"{live} is running; s stops it first, then d deletes it"
        table.cursor = table.ids.index(failed)
        await pilot.press("d")
        assert type(app.screen).__name__ == "ConfirmScreen"
        await pilot.press("n")
        await settle(app, pilot)
        assert folders["failed"].is_dir()
        await pilot.press("d", "y")
        await settle(app, pilot)
        assert not folders["failed"].exists() and failed not in app.rows and failed not in table.ids
        assert notes[-1] == f"run {failed} was deleted"
        assert sorted(p.name for p in runs.iterdir()) == sorted(f.name for k, f in folders.items() if k != "failed")

    drive(frozen_app(runs), body)


def test_r_starts_a_queued_run_whose_claim_is_stale_as_fslab_resume_does(tmp_path, monkeypatch):
    """fslab resume starts a queued run nobody holds (its starter killed on this host before starting it);
    r in the dashboard refused it ('is queued; only killed, lost or failed runs can resume'). It now asks,
    then calls executor.resume, which takes the stale claim over, and says who held it."""
    from fslab.core.claims import CLAIM_FILE, read_holder
    from fslab.core.runstore import create_run
    from fslab.core.states import HOST
    from fslab.execution import executor

    runs = tmp_path / "runs"
    run = create_run(runs, "nca", complete_config())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid of this host whose process is gone
    (run.path / CLAIM_FILE).write_text(f"{child.pid} {time.time()} {HOST} 123\n")
    started = []
    monkeypatch.setattr(executor, "_start", lambda run, **kw: started.append((run.id, kw)) or executor.Started(run))
    notes = []

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        await pilot.press("r")
        await settle(app, pilot)  # r: fslab resume's checks answer from a worker thread
        assert type(app.screen).__name__ == "ConfirmScreen", notes
        await pilot.press("y")
        await settle(app, pilot)
        assert started == [(run.id, {"resume": False, "slurm": None, "slots": []})], notes
        assert read_holder(run.path).pid == os.getpid()  # the stale claim taken over, by this process
        assert notes[-1] == (f"run {run.id} was queued, held by pid {child.pid} on host {HOST}, which is gone "
                             f"(killed before it started the run); started here")

    drive(frozen_app(runs), body)


def test_r_leaves_a_queued_sweep_run_to_the_scheduler_running_as_fslab_resume_does(tmp_path, monkeypatch):
    """r asked 'Start queued run ... here? Nothing holds it' of a sweep's run waiting for a slot, and started it
    beside the slots of the scheduler running. It says fslab resume's line instead, and asks nothing."""
    from fslab.core.flocks import hold_shared
    from fslab.core.runstore import create_run
    from fslab.core.sweeps import save_sweep
    from fslab.execution import executor
    from fslab.execution.scheduler import presence_path

    runs = tmp_path / "runs"
    run = create_run(runs, "nca", complete_config(), sweep="sweep-20261203-100000-abcd")
    save_sweep(runs, "sweep-20261203-100000-abcd", runs=[run.id], method="nca")
    presence_path(runs).parent.mkdir(parents=True, exist_ok=True)
    alive = hold_shared(presence_path(runs))  # as a living scheduler of the store holds it
    started = []
    monkeypatch.setattr(executor, "_start", lambda run, **kw: started.append(run.id) or executor.Started(run))
    notes = []

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        await pilot.press("r")
        await settle(app, pilot)
        assert type(app.screen).__name__ == "RunsScreen" and started == [], notes
        assert notes[-1] == (f"run {run.id} is queued in sweep-20261203-100000-abcd and waits for a slot: the "
                             f"scheduler running starts it when one frees, in queue order, and resume starts no "
                             f"queued run beside it, outside the slots ([scheduler] in fslab.toml); follow it "
                             f"with: fslab queue")

    try:
        drive(frozen_app(runs), body)
    finally:
        os.close(alive)
    assert not run.claimed()


def test_r_hands_a_killed_sweep_run_back_to_the_scheduler_running_as_fslab_resume_does(tmp_path, monkeypatch):
    """r, y on a sweep's killed run started its worker beside the slots of the sweep's scheduler running. It is
    queued again for that scheduler, as fslab resume queues it, and the note says so in fslab resume's line."""
    from fslab.core.flocks import hold_shared
    from fslab.core.runstore import Run
    from fslab.core.sweeps import save_sweep
    from fslab.execution import executor
    from fslab.execution.scheduler import presence_path

    runs, sweep = tmp_path / "runs", "sweep-20261203-100000-abcd"
    folder = write_run(runs, "20260101-000000-nca-kill", state="killed", events=history()[:7], cfg=complete_config())
    fake_checkpoint(folder / "checkpoints" / "last.pt")
    status = json.loads((folder / "status.json").read_text())
    (folder / "status.json").write_text(json.dumps({**status, "sweep": sweep}))
    save_sweep(runs, sweep, runs=[folder.name], method="nca")
    presence_path(runs).parent.mkdir(parents=True, exist_ok=True)
    alive = hold_shared(presence_path(runs))  # as a living scheduler of the store holds it
    started = []
    monkeypatch.setattr(executor, "_start", lambda run, **kw: started.append(run.id) or executor.Started(run))
    notes = []

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        await pilot.press("r")
        await settle(app, pilot)
        await pilot.press("y")
        await settle(app, pilot)
        assert started == [] and notes[-1] == (
            f"run {folder.name} is queued again in {sweep}: the scheduler running resumes it from its last checkpoint "
            f"when a slot frees, in queue order, never beside the slots ([scheduler] in fslab.toml); follow it with: "
            f"fslab queue"), notes

    try:
        drive(frozen_app(runs), body)
    finally:
        os.close(alive)
    assert Run(folder).state() == "queued" and not Run(folder).claimed()


def test_s_stops_a_running_run_whose_config_json_cannot_be_read_as_fslab_stop_does(tmp_path):
    """s on a running run whose config.json was damaged (listed unreadable) said it was unreadable and that only
    queued or running runs can be stopped, where fslab stop went by its status.json: its worker trained on. It
    asks, stops the worker its status.json names, and says what fslab stop says of it."""
    from fslab.core.runstore import create_run

    from .test_damaged_runs import stand_in_worker

    runs = tmp_path / "runs"
    run = create_run(runs, "nca", complete_config())
    worker = stand_in_worker(run)
    (run.path / "config.json").write_text('{"method": "nc')
    notes = []

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        assert app.rows[run.id].state == "unreadable"
        await pilot.press("s")
        await pilot.pause()
        assert type(app.screen).__name__ == "ConfirmScreen", notes
        await pilot.press("y")
        await settle(app, pilot)
        assert worker.wait(timeout=30) < 0, notes
        assert notes[-1] == (f"{run.id}: killed; its config.json is missing or unreadable (fslab show {run.id} says "
                             f"why), so it was stopped as its status.json said it was running; put the file back "
                             f"from a copy of the run, then start it again (fslab run --like {run.id}): it wrote no "
                             f"checkpoint")

    try:
        drive(frozen_app(runs), body)
    finally:
        worker.kill()
        worker.wait()
    assert run.status()["state"] == "killed"


def test_s_again_on_an_unreadable_running_run_being_stopped_says_so_as_for_any_run(tmp_path, monkeypatch):
    """s, y on a running run whose config.json is damaged (listed unreadable), then s again while its stop was
    under way, asked again: the tick let go of it at once, as its row never reads running. It says the run is
    being stopped already, as for any run, until the stop answers; then s says the run is killed."""
    import threading

    from fslab.core.runstore import create_run
    from fslab.execution import executor

    from .test_damaged_runs import stand_in_worker

    runs = tmp_path / "runs"
    run = create_run(runs, "nca", complete_config())
    worker = stand_in_worker(run)
    (run.path / "config.json").write_text('{"method": "nc')
    go_on, real_stop = threading.Event(), executor.stop
    monkeypatch.setattr(executor, "stop", lambda run, **kw: go_on.wait(30) and real_stop(run, grace=5))
    notes = []

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        await pilot.press("s", "y")
        await pilot.pause()
        await app.poll_store().wait()  # a tick while the stop is under way
        await pilot.pause()
        await pilot.press("s")
        await pilot.pause()
        assert type(app.screen).__name__ == "RunsScreen" and notes[-1] == f"{run.id} is being stopped already"
        go_on.set()
        await settle(app, pilot)
        assert notes[-1].startswith(f"{run.id}: killed; "), notes
        await pilot.press("s")
        await pilot.pause()
        assert notes[-1] == f"{run.id} is killed; only queued or running runs can be stopped"

    try:
        drive(frozen_app(runs), body)
    finally:
        go_on.set()
        worker.kill()
        worker.wait()


def test_q_in_a_confirm_dialog_answers_no_and_never_quits_the_dashboard(store, monkeypatch):
    """q in the dialog of d, s or r quit the whole dashboard (the app's q), which its footer did not show;
    it now answers no, as n and esc do, in every confirm dialog, and the footer says so."""
    from fslab.execution import executor

    runs, folders = store
    failed, live = folders["failed"].name, folders["running"].name
    killed = write_run(runs, "20260101-000001-nca-kill", state="killed", events=history()[:7], cfg=complete_config())
    fake_checkpoint(killed / "checkpoints" / "last.pt")
    calls = []
    monkeypatch.setattr(executor, "stop", lambda run, **kw: calls.append(("stop", run.id)))
    monkeypatch.setattr(executor, "resume", lambda run, **kw: calls.append(("resume", run.id)))

    async def body(app, pilot):
        table = app.screen.table
        for run_id, key in ((failed, "d"), (live, "s"), (killed.name, "r")):
            table.cursor = table.ids.index(run_id)
            await pilot.press(key)
            await settle(app, pilot)
            assert type(app.screen).__name__ == "ConfirmScreen"
            assert "n/esc/q" in str(app.screen.query_one("Footer").query("FooterKey").nodes[-1].render())
            await pilot.press("q")
            await settle(app, pilot)
            assert app.is_running and type(app.screen).__name__ == "RunsScreen", key
        assert calls == [] and folders["failed"].is_dir()

    drive(frozen_app(runs), body)


def test_stop_pressed_again_before_the_table_reads_the_run_stopped_does_not_ask_again(store, monkeypatch):
    """s, y, then s again before the next tick asked again, and the second stop said 'could not stop RUN:
    run RUN is killed, not running; nothing to stop'."""
    from fslab.core.errors import FslabError
    from fslab.execution import executor

    runs, folders = store
    live = folders["running"].name
    calls = []

    def stop(run, **kw):
        calls.append(run.id)
        if len(calls) != 2:
            raise FslabError(f"run {run.id} is killed, not running; nothing to stop")
        return "killed"

    monkeypatch.setattr(executor, "stop", stop)
    notes = []

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        app.screen.table.cursor = app.screen.table.ids.index(live)
        await pilot.press("s", "y")  # a stop that failed: s asks again
        await settle(app, pilot)
        assert notes[-1].startswith(f"could not stop {live}: ")
        await pilot.press("s", "y")
        await settle(app, pilot)
        assert app.rows[live].state == "running"  # the fake stop wrote nothing: the table still reads it running
        await pilot.press("s")
        await pilot.pause()
        assert type(app.screen).__name__ == "RunsScreen" and calls == [live, live]
        assert notes[-1] == f"{live} is being stopped already"
        assert sum(note.startswith("could not stop") for note in notes) == 1, notes

    drive(frozen_app(runs), body)


def test_s_on_a_run_in_a_state_fslab_does_not_know_says_so_as_fslab_stop_does(tmp_path):
    """s on a run whose status.json names a newer fslab's state ('paused', in which its worker may live) said
    it was unreadable, 'only queued or running runs can be stopped', where fslab stop names the state."""
    runs = tmp_path / "runs"
    folder = write_run(runs, "20260101-000000-nca-pause", state="paused", events=history()[:4])
    notes = []

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        assert app.rows[folder.name].state == "unreadable"
        await pilot.press("s")
        await pilot.pause()
        assert type(app.screen).__name__ == "RunsScreen" and notes == [
            f"{folder.name} cannot be stopped by this fslab: its status.json records the state 'paused', which "
            f"this fslab does not know (a run's status says queued, running, completed, failed or killed); a newer "
            f"fslab may have written it, or an edit by hand; if it is running, stop it with the fslab that wrote it"]

    drive(frozen_app(runs), body)


def test_stop_or_resume_confirmed_after_the_run_s_folder_was_deleted_says_it_was_deleted(tmp_path):
    """Stop said 'is unreadable, not running', resume 'its lock file: No such file or directory'."""
    runs = tmp_path / "runs"
    live = write_run(runs, "20260101-000000-nca-live", state="running", events=history()[:4])
    killed = write_run(runs, "20260101-000001-nca-kill", state="killed", events=history()[:7], cfg=complete_config())
    fake_checkpoint(killed / "checkpoints" / "last.pt")
    notes = []

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        for folder, key, doing in ((live, "s", "stop"), (killed, "r", "resume")):
            app.screen.table.cursor = app.screen.table.ids.index(folder.name)
            await pilot.press(key)
            await settle(app, pilot)
            assert type(app.screen).__name__ == "ConfirmScreen", notes
            shutil.rmtree(folder)
            await pilot.press("y")
            await settle(app, pilot)
            gone = f"run {folder.name} was deleted (its folder {folder} is gone); nothing to {doing}"
            assert any(note.endswith(gone) for note in notes), notes
        assert notes[-1] == f"run {killed.name} was deleted (its folder {killed} is gone); nothing to resume"
        assert f"could not stop {live.name}: run {live.name} was deleted (its folder {live} is gone); nothing to stop" \
            in notes
        # s or r on the screen of a run a tick read deleted: said, not silence
        done = write_run(runs, "20260101-000002-nca-done", events=history())
        await tick(app, pilot)
        await open_detail(app, pilot, done.name)
        shutil.rmtree(done)
        await tick(app, pilot)
        for key, doing in (("s", "stop"), ("r", "resume")):
            await pilot.press(key)
            await settle(app, pilot)
            assert notes[-1] == f"run {done.name} was deleted (its folder is gone); nothing to {doing}"

    drive(frozen_app(runs), body)


def test_r_on_a_run_this_user_cannot_write_says_why_before_asking(tmp_path, monkeypatch):
    """On a read-only copy of a store (another user's, a tar unpacked read-only), r asked "Resume run ...?"
    and refused only once answered y; it now says fslab resume's line at once and asks nothing. (Root writes
    every folder: os.access refuses this one here.)"""
    runs = tmp_path / "runs"
    killed = write_run(runs, "20260101-000000-nca-kill", state="killed", events=history()[:7], cfg=complete_config())
    fake_checkpoint(killed / "checkpoints" / "last.pt")
    writable = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: writable(path, mode, **kw)
                        and os.path.abspath(path) != str(killed))
    notes = []

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        await pilot.press("r")
        await settle(app, pilot)
        assert type(app.screen).__name__ == "RunsScreen"
        assert notes == [f"cannot write into {killed}: fslab resume keeps the training's status, logs and checkpoints "
                         f"in the run's folder; resume a copy in a store this user can write (cp -r {killed} "
                         f"OTHER/runs/)"]

    drive(frozen_app(runs), body)


def test_resume_asks_then_calls_the_core_resume(tmp_path, monkeypatch):
    from fslab.execution import executor

    runs = tmp_path / "runs"
    killed = write_run(runs, "20260101-000000-nca-kill", state="killed", events=history()[:7], cfg=complete_config())
    write_run(runs, "20260101-000001-nca-done", events=history())
    started = []
    monkeypatch.setattr(executor, "start_worker", lambda run, resume=False: started.append((run.id, resume)) or
                        subprocess.Popen([sys.executable, "-c", "pass"]))

    async def body(app, pilot):
        notes = []
        app.notify = lambda message, **kw: notes.append(message)
        await pilot.press("r")  # the newest run is completed: nothing to resume, no dialog
        await settle(app, pilot)  # its checks answer from a worker thread
        assert type(app.screen).__name__ == "RunsScreen"
        assert notes[-1] == ("run 20260101-000001-nca-done is completed; only killed, lost or failed runs can resume; "
                             "to train a run like it from the start: fslab run --like 20260101-000001-nca-done; "
                             "N starts a new run like it here")  # fslab resume's words
        (runs / "20260101-000001-nca-done" / "status.json").write_text('{"state": "compl')  # a copy cut short
        app.rows["20260101-000001-nca-done"].state = "unreadable"
        await pilot.press("r")
        await settle(app, pilot)
        assert type(app.screen).__name__ == "RunsScreen" and notes[-1].startswith(
            "run 20260101-000001-nca-done is unreadable: its status.json is missing or cannot be read")
        await pilot.press("down", "r")
        await settle(app, pilot)
        assert started == [] and "has no checkpoint" in notes[-1]  # the core's check, shown as is
        fake_checkpoint(killed / "checkpoints" / "last.pt")
        await pilot.press("r")
        await settle(app, pilot)
        await pilot.press("y")
        await settle(app, pilot)
        assert started == [(killed.name, True)] and notes[-1] == f"resuming {killed.name}"

    drive(frozen_app(runs), body)


def test_r_checks_the_checkpoint_off_the_ui_thread_and_the_dashboard_answers_keys_meanwhile(tmp_path, monkeypatch):
    """r read the whole checkpoint (fslab resume's check that it is whole) on the UI thread: the dashboard
    answered no key for as long as a checkpoint of gigabytes took. The check now runs in a worker thread."""
    import threading

    from fslab.execution import checks

    runs = tmp_path / "runs"
    write_run(runs, "20260101-000000-nca-done", events=history())
    killed = write_run(runs, "20260101-000001-nca-kill", state="killed", events=history()[:7], cfg=complete_config())
    fake_checkpoint(killed / "checkpoints" / "last.pt")
    real, release, on_ui_thread = checks.check_resumable, threading.Event(), []

    def slow_check(run, **kw):  # a checkpoint that takes long to read: until the test releases it
        on_ui_thread.append(threading.current_thread() is threading.main_thread())
        release.wait(timeout=5)
        return real(run, **kw)

    monkeypatch.setattr(checks, "check_resumable", slow_check)
    notes = []

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        table = app.screen.table
        assert table.ids[table.cursor] == killed.name
        await pilot.press("r")
        await pilot.pause()
        await pilot.press("down")  # answered while the check reads the checkpoint
        await pilot.pause()
        assert type(app.screen).__name__ == "RunsScreen" and table.cursor == 1
        await pilot.press("up", "r")  # one check at a time for a run, and one dialog
        await pilot.pause()
        assert notes == [f"checking whether {killed.name} can resume (its checkpoint is read whole) ..."]
        release.set()
        await settle(app, pilot)
        assert type(app.screen).__name__ == "ConfirmScreen" and on_ui_thread == [False]

    drive(frozen_app(runs), body)


def test_r_asks_only_where_the_run_is_still_shown_once_its_check_answers(tmp_path, monkeypatch):
    """r checks in a worker thread; its dialog opened on whatever screen showed when the check answered: over
    the compare screen opened meanwhile, over the runs table once the run's screen was left, or on the table
    with the cursor moved to another run (y would resume the run not under it). It now asks only on the screen
    r was pressed on, still on the run; else it says the run can resume and that r on it asks again."""
    import threading

    from fslab.execution import checks

    runs = tmp_path / "runs"
    write_run(runs, "20260101-000000-nca-done", events=history())
    killed = write_run(runs, "20260101-000001-nca-kill", state="killed", events=history()[:7], cfg=complete_config())
    fake_checkpoint(killed / "checkpoints" / "last.pt")
    real, release = checks.check_resumable, threading.Event()
    monkeypatch.setattr(checks, "check_resumable", lambda run, **kw: release.wait(timeout=10) and real(run, **kw))
    notes = []
    moved, left = (f"{killed.name} can resume; not asked, as {why} while it was checked: r on it asks again"
                   for why in ("the cursor left it", "its screen was left"))

    async def answered(app, pilot, screen, note):
        release.set()
        await settle(app, pilot)
        release.clear()
        assert (type(app.screen).__name__, notes[-1] if notes else None) == (screen, note)

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        await pilot.press("r", "down")  # another run under the cursor
        await pilot.pause()
        await answered(app, pilot, "RunsScreen", moved)
        await pilot.press("up", "r", "space", "c")  # the compare screen opened meanwhile
        await pilot.pause()
        await answered(app, pilot, "CompareScreen", left)
        await pilot.press("escape", "up", "enter", "r", "escape")  # the run's screen, left meanwhile (space moved down)
        await pilot.pause()
        await answered(app, pilot, "RunsScreen", left)
        await pilot.press("enter", "r")  # still on it: asked there
        await pilot.pause()
        await answered(app, pilot, "ConfirmScreen", left)  # no new note
        assert len(notes) == 3 and app.screen.question.startswith(f"Resume run {killed.name} ")
        await pilot.press("n")

    try:
        drive(frozen_app(runs), body)
    finally:
        release.set()


def test_r_on_a_run_stopped_before_its_first_checkpoint_says_so_without_a_dialog(tmp_path):
    """r on a killed run without a checkpoint asked 'Resume run RUN from its last checkpoint?', and y
    then said it had none. Now fslab resume's refusal comes at once, with the dashboard's way on (N)."""
    runs = tmp_path / "runs"
    killed = write_run(runs, "20260101-000000-nca-kill", state="killed", events=history()[:3], cfg=complete_config())

    async def body(app, pilot):
        notes = []
        app.notify = lambda message, **kw: notes.append(message)
        await pilot.press("r")
        await settle(app, pilot)
        assert type(app.screen).__name__ == "RunsScreen"
        assert notes == [f"run {killed.name} has no checkpoint (it stopped before its first epoch ended); start it "
                         f"again with the same settings: fslab run --like {killed.name}; N starts a new run like it "
                         f"here"]
        fake_checkpoint(killed / "checkpoints" / "last.pt")
        await pilot.press("r")
        await settle(app, pilot)
        assert type(app.screen).__name__ == "ConfirmScreen" and len(notes) == 1

    drive(frozen_app(runs), body)


def test_the_compare_screen_leaves_out_a_run_deleted_while_open(store):
    """A compared run whose folder was deleted stayed pooled in its group (its episodes, its seed) until
    the screen was opened again; it is now left out and named, and once every one is gone, so says the note."""
    runs, folders = store
    for seed, key in enumerate(("done0", "done1")):
        save_episode_scores(folders[key], seed)

    async def body(app, pilot):
        await open_compare(app, pilot, folders, keys=("done0", "done1"))
        groups = app.screen.query_one("#groups")
        assert [cell.plain for cell in groups.get_row_at(0)][1:3] == ["0, 1", "2"]
        shutil.rmtree(folders["done1"])
        await tick(app, pilot)
        app.screen.follow()
        await settle(app, pilot)
        assert [cell.plain for cell in groups.get_row_at(0)][1:3] == ["0", "1"]
        note = str(app.screen.query_one("#compare-note").render())
        assert note.endswith(f"; left out, deleted while open: {folders['done1'].name}")
        shutil.rmtree(folders["done0"])
        await tick(app, pilot)
        app.screen.follow()
        await settle(app, pilot)
        assert str(app.screen.query_one("#compare-note").render()) == "2 runs: every one deleted while open"
        assert groups.row_count == 0 and app.screen.query_one("#chart-accuracy").blocks == []

    drive(frozen_app(runs), body)


def test_r_on_a_run_with_a_live_worker_says_so_without_a_dialog(tmp_path):
    """r on a running run asked 'Resume run RUN from its last checkpoint? Its metrics after that checkpoint are
    cut back.', and only y said that a worker still held it: the check before the dialog read the state as its
    launch does under the run's lock (no worker can hold it then). It now probes the lock."""
    from fslab.core.worklock import name_holder, take

    runs = tmp_path / "runs"
    folder = write_run(runs, "20260101-000000-nca-live", state="running", events=history()[:7], cfg=complete_config())
    fake_checkpoint(folder / "checkpoints" / "last.pt")
    status = json.loads((folder / "status.json").read_text())
    write_status(folder, {**status, "pid": 4242, "host": socket.gethostname()})
    fd = take(folder)  # its worker, as far as anyone can tell
    name_holder(fd, 4242)

    async def body(app, pilot):
        notes = []
        app.notify = lambda message, **kw: notes.append(message)
        await pilot.press("r")
        await settle(app, pilot)
        assert type(app.screen).__name__ == "RunsScreen"
        assert notes == [f"run {folder.name} still has a live worker (pid 4242 on host {socket.gethostname()}, "
                         f"running); stop it with: fslab stop {folder.name}; s stops it here"]

    try:
        drive(frozen_app(runs), body)
    finally:
        os.close(fd)


def test_a_rewritten_metrics_file_is_read_again(tmp_path):
    from fslab.core.files import atomic_write_text
    from fslab.tui.tailing import RunFollower

    runs = tmp_path / "runs"
    folder = write_run(runs, "r", state="killed", events=history())
    keeper, follower = SummaryFile(folder), RunFollower(folder)
    keeper.refresh(FROZEN)
    summary = keeper.summary
    assert summary.step == 12 and summary.best_val["accuracy"] == pytest.approx(0.65) and summary.test
    assert len(follower.read().events) == len(history())
    # fslab resume cuts metrics.jsonl back to a checkpoint (write-then-rename), then appends again
    kept = history()[:7]  # start, 4 steps, val of epoch 1, its checkpoint
    atomic_write_text(folder / "metrics.jsonl", "".join(json.dumps(e) + "\n" for e in kept))
    keeper.refresh(FROZEN)
    assert summary.step == 4 and summary.best_val["accuracy"] == pytest.approx(0.55) and summary.test == {}
    delta = follower.read()
    assert delta.reset and len(delta.events) == 7
    append(folder, json.dumps(train(5, 2, 0.5)) + "\n")
    keeper.refresh(FROZEN)
    assert summary.step == 5 and not follower.read().reset


def test_the_run_screen_reads_a_huge_log_from_its_last_lines_not_whole(tmp_path):
    """The run screen's stdout and stderr tabs keep the last LOG_TAIL_LINES lines, but read the
    whole log to find them: a warning printed at every step of a long run made gigabytes to read
    (and hold) before the screen showed. The first read starts at those lines; new ones follow."""
    from fslab.tui.tailing import LOG_TAIL_LINES, RunFollower

    folder = write_run(tmp_path / "runs", "r", state="running", events=history())
    lines = [f"warning {i}: " + "w" * 200 for i in range(20 * LOG_TAIL_LINES)]
    (folder / "stderr.log").write_text("\n".join(lines) + "\n" + "a line being writ")
    follower = RunFollower(folder)
    size = (folder / "stderr.log").stat().st_size
    start = follower.stderr.tail.offset
    assert size - start == len("\n".join(lines[-(LOG_TAIL_LINES - 1):]) + "\n" + "a line being writ")
    assert follower.read().stderr == lines[-(LOG_TAIL_LINES - 1):]
    append(folder, "ten\n", name="stderr.log") if "name" in append.__code__.co_varnames else None
    with open(folder / "stderr.log", "a") as fh:
        fh.write("ten\nnext\n")
    assert follower.read().stderr == ["a line being written", "next"]


def test_command_palette_lists_every_action(store):
    runs, _ = store

    async def body(app, pilot):
        commands = list(app.get_system_commands(app.screen))
        titles = [c.title for c in commands]
        assert {"Open", "Mark", "Compare", "Stop", "Resume", "New run", "Filter", "Sort", "Reverse", "Quit",
                "Help"} <= set(titles)
        assert len(titles) == len(set(titles)), titles  # Quit once, not twice
        helps = {c.title: c.help for c in commands}
        assert helps["Compare"] == "Compare the marked runs (c)" and not any("key:" in h for h in helps.values())
        await pilot.press("ctrl+p")
        await pilot.pause()
        assert type(app.screen).__name__ == "CommandPalette"

    drive(frozen_app(runs), body)


def test_launch_form_shows_what_fslab_run_would_refuse_and_creates_nothing(project):
    """The form checks as the launch does (executor.prepare): an episode the
    dataset's splits cannot give is shown in the form, before any run exists."""
    runs = project / "runs"

    async def body(app, pilot):
        from textual.widgets import Input

        await pilot.press("n")
        await pilot.pause()
        form = app.screen
        form.query_one("#settings", Input).value = "eval.ways=100"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert type(app.screen).__name__ == "LaunchScreen"
        assert "'eval.ways' must be at most 40" in str(form.query_one("#launch-error").render())
        assert not runs.exists() or not any(runs.iterdir())

    drive(make_app(runs, tick=3600, cursor_blink=False), body)


def test_the_launch_form_takes_no_data_root_for_a_dataset_that_reads_none(project):
    """The data root field said "(fslab.toml's [data_roots], else data/DATASET)" with synthetic chosen, which reads
    no files: a root typed there was saved unread. It is emptied and disabled while such a dataset is chosen."""

    async def body(app, pilot):
        from textual.widgets import Input, Select

        await pilot.press("n")
        await pilot.pause()
        form = app.screen
        root = form.query_one("#data-root", Input)
        root.value = "/data/mini"
        form.query_one("#dataset", Select).value = "synthetic"
        await pilot.pause()
        assert (root.disabled, root.value, root.placeholder) == (True, "", "(synthetic reads no files)")
        form.query_one("#dataset", Select).value = "folder"
        await pilot.pause()
        assert not root.disabled and root.placeholder == "(fslab.toml's [data_roots], else data/DATASET)"

    drive(make_app(project / "runs", tick=3600, cursor_blink=False), body)


def test_enter_in_a_text_field_of_the_launch_form_launches_and_on_a_choice_opens_it(project):
    """Enter in a field of the form did nothing: only ctrl+s or the button launched."""
    runs = project / "runs"

    async def body(app, pilot):
        from textual.widgets import Input, Select

        launched = []
        app.launch = lambda method, overrides, registry: launched.append((method, overrides))
        await pilot.press("n")
        await pilot.pause()
        form = app.screen
        form.query_one("#settings", Input).value = "eval.ways=100"
        form.query_one("#settings", Input).focus()
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is form and launched == []
        assert "'eval.ways' must be at most 40" in str(form.query_one("#launch-error").render())
        form.query_one("#backbone", Select).focus()
        await pilot.press("enter")  # a choice's list opens; nothing is launched
        await pilot.pause()
        assert form.query_one("#backbone", Select).expanded and launched == []
        await pilot.press("escape")
        await pilot.pause()
        form.query_one("#settings", Input).value = ""
        form.query_one("#seed", Input).value = "7"
        form.query_one("#seed", Input).focus()
        await pilot.press("enter")
        await pilot.pause()
        assert launched == [("nca", [{"seed": 7}])] and app.screen is not form
        assert not runs.exists() or not any(runs.iterdir())

    drive(make_app(runs, tick=3600, cursor_blink=False), body)


def test_an_empty_seed_or_epochs_field_is_not_marked_invalid(project):
    """Tabbing through the form left the empty seed and epochs fields red (Textual's integer check
    found no integer), though empty means the default; a field holding no integer still is red."""
    runs = project / "runs"

    async def body(app, pilot):
        from textual.widgets import Input

        await pilot.press("n")
        await pilot.pause()
        form = app.screen
        seed, epochs = form.query_one("#seed", Input), form.query_one("#epochs", Input)
        for field in (seed, epochs, form.query_one("#settings", Input)):
            field.focus()
            await pilot.pause()
        assert not seed.has_class("-invalid") and not epochs.has_class("-invalid")
        seed.value = "abc"  # the integer input refuses letters as typed; set as a paste would
        seed.focus()
        epochs.focus()
        await pilot.pause()
        assert seed.has_class("-invalid") == (not seed.value.isdigit())

    drive(make_app(runs, tick=3600, cursor_blink=False), body)


def test_a_seed_or_epochs_field_holding_no_number_is_refused_in_the_configurations_words(project):
    """The integer fields let '-', '+' and '1_' be typed (the start of -5, +5, 1_000); launching showed
    int()'s "invalid literal for int() with base 10: '-'". Now the configuration's check says it, as
    fslab run --set seed=- does, and nothing is created."""
    runs = project / "runs"

    async def body(app, pilot):
        from textual.widgets import Input

        await pilot.press("n")
        await pilot.pause()
        form = app.screen
        for key, text, line in (("seed", "-", "config key 'seed' must be an integer, got \"-\""),
                                ("epochs", "1_", "config key 'train.epochs' must be an integer, got \"1_\"")):
            form.query_one(f"#{key}", Input).value = text
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert type(app.screen).__name__ == "LaunchScreen"
            assert str(form.query_one("#launch-error").render()) == line
            form.query_one(f"#{key}", Input).value = ""
        assert not runs.exists() or not any(runs.iterdir())

    drive(make_app(runs, tick=3600, cursor_blink=False), body)


def test_n_where_no_plugin_registers_a_method_is_a_note_not_a_crash(project, monkeypatch):
    """With no method registered (FSLAB_PLUGINS naming a backbone plugin only, or the method plugins failing
    to load), n stopped the dashboard with IndexError while the form chose its default method; it is now
    one note, and the dashboard goes on."""
    monkeypatch.setenv("FSLAB_PLUGINS", "resnet12")
    notes = []

    async def body(app, pilot):
        notify = app.notify
        app.notify = lambda message, **kw: notes.append((message, kw.get("title"))) or notify(message, **kw)
        await pilot.press("n")
        await settle(app, pilot)
        assert type(app.screen).__name__ == "RunsScreen"

    app = make_app(project / "runs", tick=3600, cursor_blink=False)
    drive(app, body)
    assert app.return_code in (None, 0)
    assert notes == [("no run can start: no plugin loaded registers a method (fslab plugins --kind method lists "
                      "them)", "no new run")]


def test_new_run_like_a_run_says_an_empty_field_keeps_the_runs_value(project):
    """N's form showed the new-run form's hints in its empty fields (seed '0', '(recipe default)'), but an
    emptied field keeps the saved value: a seed field cleared to get seed 0 started seed 4 again. They say
    '(as saved)' there now; n's form keeps its hints."""
    runs = project / "runs"
    write_run(runs, "20260101-100000-nca-four", events=history(), cfg=complete_config(seed=4))
    launched = []

    async def body(app, pilot):
        from textual.widgets import Input, Select

        app.launch = lambda method, overrides, registry: launched.append(overrides)
        await pilot.press("N")
        await settle(app, pilot)
        form = app.screen
        seed = form.query_one("#seed", Input)
        assert seed.value == "4"
        seed.value = ""
        hints = [form.query_one(f"#{key}", Input).placeholder for key in ("seed", "epochs")]
        prompts = [form.query_one(f"#{key}", Select).prompt for key in ("backbone", "dataset")]
        assert hints == prompts == ["(as saved)", "(as saved)"]
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        assert [layer.get("seed") for layer in launched[0] if "seed" in layer] == [4]  # the saved configuration's
        await pilot.press("n")
        await settle(app, pilot)
        assert app.screen.query_one("#seed", Input).placeholder == "0"

    drive(make_app(runs, tick=3600, cursor_blink=False), body)


def test_new_run_like_a_run_whose_sections_are_not_tables_is_refused_in_the_form(project):
    """N on a run whose config.json holds a section as a text or a list (backbone = "conv4") stopped
    the dashboard with AttributeError while the form filled itself in; the form now opens and its
    launch says what fslab run --like says."""
    runs = project / "runs"
    folder = write_run(runs, "20260101-100000-nca-sect", events=history(),
                       cfg={**complete_config(), "backbone": "conv4", "train": [1], "seed": "x"})

    async def body(app, pilot):
        await pilot.press("N")
        await settle(app, pilot)
        form = app.screen
        assert type(form).__name__ == "LaunchScreen"
        assert [form.query_one(f"#{key}").value for key in ("seed", "epochs")] == ["", ""]
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        assert type(app.screen).__name__ == "LaunchScreen"
        assert str(form.query_one("#launch-error").render()).startswith("'backbone' is a section; choose the plugin")
        assert [p.name for p in runs.iterdir()] == [folder.name]

    app = make_app(runs, tick=3600, cursor_blink=False)
    drive(app, body)
    assert app.return_code in (None, 0)


def test_new_run_like_a_run_whose_data_root_is_gone_says_what_moves_it_in_the_form(project, registry, tmp_path):
    """N on a run trained on a folder that is gone showed the dataset's line, which points at --data-root
    (the form had none) and [data_roots] of fslab.toml (the saved root overrides it). The form now says
    what fslab run --like says, with the form's way to give the root: its data root field; a root given
    there is checked."""
    from .test_cli_rerun import resolved_run

    old = resolved_run(project, registry)
    gone = tmp_path / "moved-away"
    saved = {**old.config(), "dataset": {"name": "folder", "root": str(gone), "cache_dir": "", "grayscale": False,
                                         "image_size": 16}}
    (old.path / "config.json").write_text(json.dumps(saved))
    (project / "fslab.toml").write_text(f"[data_roots]\nfolder = '{tmp_path / 'elsewhere'}'\n")

    async def body(app, pilot):
        from textual.widgets import Input

        await pilot.press("N")
        await settle(app, pilot)
        form = app.screen
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert type(app.screen).__name__ == "LaunchScreen"
        assert str(form.query_one("#launch-error").render()) == (
            f"run {old.id} was trained on {gone}, which is not a folder now; a run like it reads its data there "
            f"too: if the data moved, give where it lies with the data root field")
        form.query_one("#data-root", Input).value = str(tmp_path / "nor-here")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert f"the data root {tmp_path / 'nor-here'} is not a folder" in str(form.query_one("#launch-error").render())
        assert list((project / "runs").iterdir()) == [old.path]

    drive(make_app(project / "runs", tick=3600, cursor_blink=False), body)


@pytest.mark.slow
def test_launch_form_starts_a_real_tiny_run(project):
    runs = project / "runs"
    tiny_sets = [v for flag, v in zip(TINY, TINY[1:]) if flag == "--set"] + ["train.batch_size=32"]

    async def body(app, pilot):
        from textual.widgets import Input, Select

        await pilot.press("n")
        await pilot.pause()
        form = app.screen
        assert type(form).__name__ == "LaunchScreen"
        assert form.query_one("#method", Select).value == "nca"
        form.query_one("#backbone", Select).value = "conv4"
        form.query_one("#epochs", Input).value = "1"
        form.query_one("#seed", Input).value = "3"
        form.query_one("#settings", Input).value = "train.epoch=1"  # a typo is shown in the form
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "Did you mean 'epochs'?" in str(form.query_one("#launch-error").render())
        form.query_one("#settings", Input).value = " ".join(tiny_sets)
        notes = []
        notify = app.notify
        app.notify = lambda message, **kw: notes.append(message) or notify(message, **kw)
        await pilot.press("ctrl+s")
        deadline = time.time() + 300  # a run's start and training, on a loaded machine
        while not app.rows and time.time() < deadline:
            await tick(app, pilot)
        assert type(app.screen).__name__ == "RunsScreen"
        [run_id] = app.rows
        assert notes == [f"started {run_id}"]
        while app.rows[run_id].state != "completed" and time.time() < deadline:
            await asyncio.sleep(0.3)
            await tick(app, pilot)
        row = app.rows[run_id]
        assert row.state == "completed", row
        assert row.backbone == "conv4" and row.seed == 3 and row.epochs == 1 and "1-shot" in row.test
        saved = json.loads((runs / run_id / "config.json").read_text())
        assert saved["backbone"]["hidden"] == 8 and saved["train"]["batch_size"] == 32

    drive(make_app(runs, tick=3600, cursor_blink=False), body)


@pytest.mark.slow
def test_the_launch_form_s_data_root_field_is_checked_as_fslab_run_checks_it_and_trains_on_it(project, tmp_path):
    """The form had no data root where fslab run has --data-root: a dataset on disk could only be reached
    through fslab.toml or --set. The field is checked as the option is (a folder that is not there is the
    dataset's one line, in the form; no run folder made), and the run trains on the folder given."""
    from .test_datasets_disk import make_folder_tree

    runs = project / "runs"
    make_folder_tree(tmp_path / "images", classes=6, per_class=10, size=(16, 16))
    sets = ("backbone.hidden=8 dataset.image_size=16 train.batch_size=20 train.log_every=1 eval.val_episodes=4 "
            "eval.test_episodes=8 eval.queries=5 eval.center_images=16 train.heartbeat=0.2")

    async def body(app, pilot):
        from textual.widgets import Input, Select

        await pilot.press("n")
        await pilot.pause()
        form = app.screen
        form.query_one("#backbone", Select).value = "conv4"
        form.query_one("#dataset", Select).value = "folder"
        form.query_one("#epochs", Input).value = "1"
        form.query_one("#settings", Input).value = sets
        form.query_one("#data-root", Input).value = str(tmp_path / "no-images")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert type(app.screen).__name__ == "LaunchScreen"
        error = str(form.query_one("#launch-error").render())
        assert error.startswith(f"folder: the data root {tmp_path / 'no-images'} is not a folder. Expected layout: ")
        assert "\n" not in error
        assert not runs.exists() or not any(runs.iterdir())
        form.query_one("#data-root", Input).value = f" {tmp_path / 'images'} "
        await pilot.press("ctrl+s")
        deadline = time.time() + 300  # a run's start and training, on a loaded machine
        while not app.rows and time.time() < deadline:
            await tick(app, pilot)
        [run_id] = app.rows
        saved = json.loads((runs / run_id / "config.json").read_text())
        assert saved["dataset"]["name"] == "folder" and saved["dataset"]["root"] == str(tmp_path / "images")
        while app.rows[run_id].state != "completed" and time.time() < deadline:
            await asyncio.sleep(0.3)
            await tick(app, pilot)
        assert app.rows[run_id].state == "completed", app.rows[run_id]

    drive(make_app(runs, tick=3600, cursor_blink=False), body)


# The end of a script that starts the dashboard as `fslab tui` does, its FslabApp.run replaced by the
# script's headless_run (a Pilot driving it): the CLI's own path to the dashboard, in a process of its own.
AS_FSLAB_TUI = """
tui_app.FslabApp.run = headless_run
from fslab.cli import app
try:
    app(["tui"])
except SystemExit as exit:
    assert not exit.code, exit.code
"""


def test_fslab_tui_does_not_import_torch(project, store):
    runs, _ = store
    shutil.copytree(runs, project / "runs")
    code = textwrap.dedent("""
        import asyncio, sys
        import fslab.tui.app as tui_app

        def headless_run(self):
            async def go():
                async with self.run_test(size=(80, 24)) as pilot:
                    for _ in range(2400):  # the store's first read, in a worker: up to 2 minutes on a loaded machine
                        await pilot.pause(0.05)
                        if self.rows:
                            break
                    await pilot.press("enter")
                    await pilot.pause(0.3)
                    await pilot.press("escape", "n")
                    await pilot.pause(0.3)
                    print("SCREEN", type(self.screen).__name__, "ROWS", len(self.rows))
            asyncio.run(go())
    """) + AS_FSLAB_TUI + 'print("TORCH", "torch" in sys.modules)\n'

    result = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "SCREEN LaunchScreen ROWS 4" in result.stdout, result.stdout
    assert "TORCH False" in result.stdout


def test_the_launch_form_reads_fslab_toml_as_it_is_when_launching(project):
    """fslab tui read fslab.toml once, at its start: a [run] default written while it was open was left
    out of what the form checked and launched, so it started a run fslab run refused. Driven through the
    CLI, as the dashboard is started; the launch itself is recorded, not started."""
    code = textwrap.dedent("""
        import asyncio
        from pathlib import Path
        import fslab.tui.app as tui_app

        def headless_run(self):
            self.launch = lambda method, overrides, registry: print("LAUNCHED", method)
            async def go():
                async with self.run_test(size=(100, 30)) as pilot:
                    await pilot.pause()
                    Path("fslab.toml").write_text("[run]\\neval.ways = 100\\n")
                    await pilot.press("n")
                    await pilot.pause()
                    await pilot.press("ctrl+s")
                    await pilot.pause()
                    print("SCREEN", type(self.screen).__name__)
                    if type(self.screen).__name__ == "LaunchScreen":
                        print("ERROR", self.screen.query_one("#launch-error").render())
            asyncio.run(go())
    """) + AS_FSLAB_TUI
    result = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "LAUNCHED" not in result.stdout and "SCREEN LaunchScreen" in result.stdout, result.stdout
    assert "'eval.ways' must be at most 40" in result.stdout and "(set by eval.ways in [run] of fslab.toml)" in \
        result.stdout, result.stdout
    assert not (project / "runs").exists() or not any((project / "runs").iterdir())


def test_n_with_fslab_toml_broken_since_the_dashboard_opened_says_its_line(project):
    """fslab.toml is read again for each launch; one broken meanwhile was said as 'cannot load plugins:
    fslab.toml:1:5: ...', as if a plugin had failed. It is the file's line now, as fslab run says it."""
    notes = []

    async def body(app, pilot):
        notify = app.notify
        app.notify = lambda message, **kw: notes.append((kw.get("title"), message)) or notify(message, **kw)
        (project / "fslab.toml").write_text("[run\n")
        await pilot.press("n")
        await settle(app, pilot)
        assert type(app.screen).__name__ == "RunsScreen"

    drive(make_app(project / "runs", tick=3600, cursor_blink=False), body)
    [(title, line)] = notes
    assert title == "no new run" and line.startswith("fslab.toml:1:5: TOML syntax error")


# -- the parts underneath --------------------------------------------------------------


def test_tailing_reads_only_what_is_new(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b"')
    chunk, offset = read_appended(path, 0)
    assert chunk == b'{"a": 1}\n' and offset == 9
    assert read_appended(path, offset) == (b"", 9)
    with open(path, "ab") as fh:
        fh.write(b": 2}\n")
    assert read_appended(path, offset) == (b'{"b": 2}\n', 18)
    assert read_appended(tmp_path / "missing", 5) == (b"", 5)


def test_watcher_batches_and_skips_unchanged_ended_runs(tmp_path):
    runs = tmp_path / "runs"
    for i in range(9):
        write_run(runs, f"2026-{i}", events=history())
    batches = []
    watcher = StoreWatcher(runs, clock=lambda: FROZEN)
    last = watcher.poll(on_batch=batches.append, batch=2)
    assert [len(b.rows) for b in batches] == [2, 4] and len(last.rows) == 3  # each batch twice the last
    assert [r.id for b in [*batches, last] for r in b.rows] == [f"2026-{i}" for i in range(8, -1, -1)]
    assert watcher.poll().rows == []  # nothing changed, nothing re-read
    keeper = SummaryFile(runs / "2026-0")
    keeper.refresh(FROZEN)
    assert keeper.summary.loss == pytest.approx(3.0 * math.exp(-12 / 5) + 0.5)
    assert keeper.summary.first_train[1] == 1


def test_the_first_batch_is_the_newest_runs_by_creation_whatever_zone_stamped_their_ids(tmp_path):
    """New runs were read in the reverse order of their names, and the first screenful handed over
    was the 60 highest ids: a run of a host 11 hours behind UTC, made last, has an id that sorts among
    the oldest, so the first screen left the newest run out until the whole store had loaded."""
    import calendar

    runs = tmp_path / "runs"
    made = {}
    for i in range(65):  # a host in UTC: an id's stamp is its creation time
        stamp = f"20260101-{12 + i // 60:02d}{i % 60:02d}00"
        made[f"{stamp}-nca-{i:04x}"] = calendar.timegm(time.strptime(stamp, "%Y%m%d-%H%M%S"))
    made["20260101-031000-nca-ffff"] = calendar.timegm((2026, 1, 1, 14, 10, 0))  # 03:10 at UTC-11: the newest
    for run_id, created in made.items():
        write_run(runs, run_id, events=history(), started=created + 1)
    batches = []
    StoreWatcher(runs, clock=lambda: FROZEN).poll(on_batch=batches.append, batch=60)
    newest = sorted(made, key=made.get, reverse=True)
    assert [r.id for r in batches[0].rows] == newest[:60] and newest[0].endswith("ffff")


def test_minmax_series_stays_bounded_and_keeps_spikes():
    series = MinMaxSeries(capacity=256)
    for i in range(100_000):
        series.append(i, 1000.0 if i == 77_777 else math.sin(i / 1000))
    series.append(1, float("nan"))  # not finite: ignored
    assert series.count == 100_000 and len(series.buckets) <= 256
    assert (max(b[3] for b in series.buckets) == 1000.0
            and min(b[2] for b in series.buckets) == pytest.approx(-1, abs=1e-3))
    columns = downsample(series.buckets, 50, 0, 99_999)
    assert max(c[1] for c in columns if c) == 1000.0
    text = render_chart(Plot([("loss", series)]), 60, 10, "loss")
    assert len(text.plain.splitlines()) == 10 and "   1,000│" in text.plain and "-1│" in text.plain


def test_chart_placeholder_when_it_cannot_draw():
    assert render_chart(Plot([("loss", MinMaxSeries())]), 60, 10) is None  # no data
    one = MinMaxSeries()
    one.append(1, 2.0)
    assert render_chart(Plot([("x", one)]), 5, 10) is None  # too narrow
    assert render_chart(Plot([("x", one)]), 60, 4) is not None  # a single point draws

    class Sized(LineChart):
        size = type("S", (), {"width": 60, "height": 10})()

    assert "(no data yet)" in Sized("loss").render().plain


def test_the_dashboard_resumes_through_the_checks_of_fslab_resume(project, monkeypatch):
    """The dashboard and ``fslab resume`` take one path (the executor): a
    killed ``--gpus 2`` run on a machine without GPUs is refused by both with
    the same line, and a run that was a SLURM job is sent back to SLURM by both
    (here, where SLURM is missing, both say so). The dashboard says it when r is pressed, before it asks (it
    asked, then refused once answered y)."""
    from .runs_helpers import fslab

    runs = project / "runs"
    gpus = write_run(runs, "20260101-000000-nca-gpus", state="killed", events=history()[:7],
                     cfg=complete_config(device="auto", train={"epochs": 3, "processes": 2}))
    job = write_run(runs, "20260101-000001-nca-slrm", state="killed", events=history()[:7], cfg=complete_config())
    status = json.loads((job / "status.json").read_text())
    write_status(job, {**status, "executor": "slurm", "slurm_job_id": "7"})
    for folder in (gpus, job):
        fake_checkpoint(folder / "checkpoints" / "last.pt")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, here and in the CLI's process
    monkeypatch.setenv("PATH", str(project))  # no srun: the SLURM executor cannot start
    said = {}
    for folder in (gpus, job):
        out = fslab("resume", folder.name, cwd=project)
        assert out.returncode != 0 and out.stderr.startswith("error: "), out.stderr
        said[folder.name] = out.stderr.strip().removeprefix("error: ")
    assert "--gpus 2 (train.processes) needs 2 GPUs but 0 are visible here" in said[gpus.name]
    assert "SLURM is not available here" in said[job.name]

    async def body(app, pilot):
        notes = []
        app.notify = lambda message, **kw: notes.append(message)
        for folder in (job, gpus):  # newest first
            app.screen.table.cursor = app.screen.table.ids.index(folder.name)
            await pilot.press("r")
            await settle(app, pilot)
            assert type(app.screen).__name__ == "RunsScreen"  # refused before any dialog asks
            assert notes[-1] in (said[folder.name], said[folder.name] + "; N starts a new run like it here")

    drive(make_app(runs, tick=3600, cursor_blink=False), body)


def test_fslab_tui_exits_non_zero_when_the_dashboard_stopped_on_an_error(project, monkeypatch):
    """Textual prints the error and returns; the shell must still see that it failed."""
    from typer.testing import CliRunner

    import fslab.tui.app as tui_app
    from fslab.cli import app

    def crash(self):
        self._return_code = 1  # what Textual records when a handler raised

    monkeypatch.setattr(tui_app.FslabApp, "run", crash)
    assert CliRunner().invoke(app, ["tui"]).exit_code == 1
    monkeypatch.setattr(tui_app.FslabApp, "run", lambda self: None)
    assert CliRunner().invoke(app, ["tui"]).exit_code == 0


def test_web_options_without_web_are_one_line_not_a_terminal_dashboard(tmp_path):
    """fslab tui --port 8080 (--web forgotten) opened the dashboard in the terminal, the option unused."""
    from .runs_helpers import fslab

    for option, value in (("--port", "8080"), ("--host", "0.0.0.0"), ("--token", "a-long-token")):
        result = fslab("tui", option, value, cwd=tmp_path, timeout=60)
        assert (result.returncode, result.stderr) == (
            2, f"error: {option} applies only with --web (fslab tui --web {option} ...); without --web the "
               f"dashboard opens in this terminal\n")


def test_a_tick_that_is_not_a_positive_number_of_seconds_is_one_line(tmp_path):
    """0, a negative or nan; and one so short (1e-05: its timers left the dashboard no time to draw, so it
    hung) that the dashboard would never show."""
    from .runs_helpers import fslab

    for tick in ("0", "-1", "nan", "0.00001"):
        for web in ([], ["--web"]):  # refused before the dashboard, or textual-serve, is looked for
            result = fslab("tui", *web, "--tick", tick, cwd=tmp_path, timeout=60)
            assert (result.returncode, result.stderr) == (
                2, f"error: --tick must be a number of seconds from 0.1 up, got {float(tick)}; e.g. --tick 1\n"), web
