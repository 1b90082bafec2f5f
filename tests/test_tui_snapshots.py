"""Snapshots of the dashboard's main screens (pytest-textual-snapshot): fixed
terminal sizes, frozen clock, cursor blink off, a run store written by the
test under a relative path, so the pictures do not depend on when or where
they are taken. Update them with ``pytest tests/test_tui_snapshots.py --snapshot-update``."""

from __future__ import annotations

from pathlib import Path

import pytest

from fslab.tui import make_app

from .test_tui_helpers import FROZEN, save_episode_scores, standard_store

pytest.importorskip("pytest_textual_snapshot")


@pytest.fixture
def app(tmp_path, monkeypatch, builtin_plugins):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    folders = standard_store(tmp_path / "runs")
    for seed, key in enumerate(("done0", "done1")):  # what training saves for fslab compare
        save_episode_scores(folders[key], seed)
    return make_app(Path("runs"), clock=lambda: FROZEN, tick=3600, cursor_blink=False)


async def settle(pilot):
    for _ in range(3):
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()


def test_runs_screen_wide(app, snap_compare):
    assert snap_compare(app, terminal_size=(120, 36), run_before=settle)


def test_runs_screen_80x24(app, snap_compare):
    assert snap_compare(app, terminal_size=(80, 24), run_before=settle)


def test_runs_screen_160x48(app, snap_compare):
    assert snap_compare(app, terminal_size=(160, 48), run_before=settle)


def test_help_screen_80x24(app, snap_compare):
    assert snap_compare(app, terminal_size=(80, 24), press=["question_mark"], run_before=settle)


def test_detail_screen_charts(app, snap_compare):
    async def open_first_completed(pilot):
        await settle(pilot)
        await pilot.press("end", "enter")  # the oldest run: completed, with every chart
        await settle(pilot)

    assert snap_compare(app, terminal_size=(120, 36), run_before=open_first_completed)


def test_detail_screen_of_failed_run(app, snap_compare):
    async def open_failed(pilot):
        await settle(pilot)
        await pilot.press("down", "enter")
        await settle(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=open_failed)


async def compare_seeds(pilot):
    await settle(pilot)
    await pilot.press("down", "space", "space", "space", "c")  # failed, done1, done0
    await settle(pilot)


def test_compare_screen(app, snap_compare):
    assert snap_compare(app, terminal_size=(120, 36), run_before=compare_seeds)


def test_compare_screen_80x24(app, snap_compare):
    assert snap_compare(app, terminal_size=(80, 24), run_before=compare_seeds)


def test_detail_screen_80x24(app, snap_compare):
    async def open_first_completed(pilot):
        await settle(pilot)
        await pilot.press("end", "enter")
        await settle(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=open_first_completed)


def test_launch_form(app, snap_compare):
    async def open_form(pilot):
        await settle(pilot)
        await pilot.press("n")
        await settle(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=open_form)
