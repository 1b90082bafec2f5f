"""Tables that fit: at 80, 120 and 250 columns no run id is cut, columns give
way in the stated order, short ids are accepted by every command taking RUN,
and output that is not a terminal follows COLUMNS (or --wide)."""

from __future__ import annotations

import os
import re

import pytest

from fslab.core.runstore import find_run, short_ids

from .runs_helpers import fslab, fslab_here
from .test_tui_helpers import complete_config, history, write_run

IDS = [f"20261123-1530{i:02d}-protonet-best-{suffix}" for i, suffix in enumerate(("4f2a", "9c01", "4f2b", "2026"))]


@pytest.fixture
def store(project):
    for i, run_id in enumerate(IDS):
        write_run(project / "runs", run_id, cfg=complete_config(method="protonet-best", seed=i), events=history())
    return project


def table(*argv, columns: int | None, cwd, wide=False):
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    result = fslab(*argv, *(["--wide"] if wide else []), cwd=cwd, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def header(out: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith("┃"))
    return [cell.strip() for cell in line.strip("┃").split("┃")]


def test_short_ids_resolve_to_their_run_alone(store):
    runs = store / "runs"
    short = short_ids(runs, IDS)
    assert short[IDS[0]] == "4f2a" and short[IDS[1]] == "9c01"
    # "2026" begins every id: find_run would take it as a prefix of all of them, so it is made longer
    assert short[IDS[3]] == "t-2026"
    for run_id, end in short.items():
        assert find_run(runs, end).id == run_id
        assert fslab("show", end, "--json", cwd=store).returncode == 0


@pytest.mark.parametrize("columns", [80, 120, 250])
def test_runs_table_fits_and_never_cuts_an_id(store, columns):
    out = table("runs", columns=columns, cwd=store)
    assert max(len(line) for line in out.splitlines() if line.startswith(("┃", "│"))) <= columns
    assert "…" not in out
    heads = header(out)
    assert {"id", "method", "state", "epoch", "test 1-shot", "test 5-shot"} <= set(heads)
    ids = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    assert [find_run(store / "runs", shown).id for shown in ids] == IDS[::-1]  # newest first, as the dashboard
    if columns == 250:
        assert ids == IDS[::-1] and "fitted" not in out and "pairs +/-" in heads
    else:  # the least needed columns left out first, and said so
        assert "pairs +/-" not in heads
        assert re.search(rf"fitted to {columns} columns \(left out: pairs \+/-, .*\); --wide shows all", out)
    if columns == 80:
        assert ids == ["t-2026", "4f2b", "9c01", "4f2a"] and "short ids" in out


def test_wide_prints_every_column_and_a_pipe_follows_columns(store):
    wide = table("runs", columns=80, cwd=store, wide=True)
    assert "pairs +/-" in header(wide) and all(run_id in wide for run_id in IDS)
    piped = table("runs", columns=None, cwd=store)  # not a terminal, no COLUMNS: 80
    assert max(len(line) for line in piped.splitlines() if line.startswith("│")) <= 80


@pytest.mark.parametrize("columns", [80, 120, 250])
def test_plugins_tables_follow_columns(project, columns):
    out = table("plugins", "--kind", "backbone", columns=columns, cwd=project)
    assert max(len(line) for line in out.splitlines()) <= columns
    names = {line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")}
    assert {"conv4", "resnet12", "resnet12-nca", "wrn28-10"} <= names  # names are never cut


def test_queue_and_show_tables_fit_80_columns(store):
    from fslab.core.runstore import create_run

    queued = create_run(store / "runs", "protonet-best", complete_config())
    out = table("queue", columns=80, cwd=store)
    assert queued.id in out and max(len(line) for line in out.splitlines() if line.startswith("│")) <= 80
    shown = table("show", IDS[0], columns=60, cwd=store)
    assert "accuracy (%)" in header(shown) and "left out: queries" in shown


def test_runs_table_marks_what_an_unreadable_run_does_not_say_as_the_dashboard_does(store):
    """A run whose config.json cannot be read has no method, backbone or seed: the table
    showed `None` in each of those cells; it shows `-`, as the dashboard does."""
    (store / "runs" / IDS[0] / "config.json").write_text("[1")
    out = table("runs", columns=None, cwd=store, wide=True)
    heads = header(out)
    row = next(line for line in out.splitlines() if line.startswith("│") and IDS[0] in line)
    cells = dict(zip(heads, (cell.strip() for cell in row.strip("│").split("│")), strict=True))
    assert cells["state"] == "unreadable"
    assert "None" not in row
    assert [cells[key] for key in ("method", "loss fn", "backbone", "dataset", "seed")] == ["-"] * 5


@pytest.mark.parametrize("columns", [60, 80])
def test_a_narrow_runs_sweep_table_leaves_columns_out_whole_rather_than_cut_a_header(project, registry, columns,
                                                                                    monkeypatch):
    """Past its stated steps, the table shrank every column evenly: at 80 columns fslab runs --sweep
    showed ``train.weight_de…``, ``met…``, ``test 1-s…``, headers that no longer said what the column was.
    Columns go whole instead, the last first, and the caption names them."""
    import secrets

    draws = iter(["ab12", "c3d4", "e5f6", "a7b8", "c9d0"])  # the sweep's id, then its runs': short ids of 4
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(draws))
    from fslab.cli.common import overrides
    from fslab.core.settings import load_settings
    from fslab.execution.sweep import create_sweep, parse_grid

    base = overrides(None, None, None, None, None, None, None, "cpu", [])
    grid = parse_grid(["train.lr=0.1,0.01", "train.weight_decay=0.0005,0.0001"])
    sweep_id, runs = create_sweep("nca", grid, 1, base=base, settings=load_settings(), registry=registry)
    out = fslab_here("runs", "--sweep", sweep_id, cwd=project, env={**os.environ, "COLUMNS": str(columns)}).stdout
    assert max(len(line) for line in out.splitlines() if line.startswith(("┏", "┃", "│"))) <= columns
    heads = header(out)
    wide = header(fslab_here("runs", "--sweep", sweep_id, "--wide", cwd=project).stdout)
    assert set(heads) <= set(wide) and "…" not in "".join(heads)  # every header whole
    assert {"id", "train.lr", "train.weight_decay", "state"} <= set(heads)  # what tells the runs apart stays
    left_out = [head for head in wide if head not in heads]
    said = re.search(rf"fitted to {columns} columns \(left out: (.*); short ids\); --wide shows all", out)
    assert said and sorted(said[1].split(", ")) == sorted(left_out)
    assert [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")] == [
        "c9d0", "a7b8", "e5f6", "c3d4"]  # short ids, newest first
    assert ("test 5-shot" in left_out) and (("test 1-shot" in left_out) == (columns == 60))


def test_a_narrow_runs_sweep_table_keeps_the_seed_that_tells_its_runs_apart(project, registry):
    """At 80 columns fslab runs --sweep of a sweep with --seeds 2 left the seed out: two rows of one grid
    point (train.batch_size 128, 128) differed only by their scores, and their state was cut to ``comp…``.
    The seed stays, as the grid's keys do; a column goes whole instead, and a one-seed sweep is as it was."""
    from fslab.cli.common import overrides
    from fslab.core.settings import load_settings
    from fslab.execution.sweep import create_sweep, parse_grid

    base = overrides(None, None, None, None, None, None, None, "cpu", [])
    for seeds, kept in [(2, True), (1, False)]:
        sweep_id, _ = create_sweep("nca", parse_grid(["train.batch_size=64,128"]), seeds, base=base,
                                   settings=load_settings(), registry=registry)
        out = fslab_here("runs", "--sweep", sweep_id, cwd=project, env={**os.environ, "COLUMNS": "80"}).stdout
        heads = header(out)
        assert {"id", "train.batch_size", "state"} <= set(heads) and ("seed" in heads) == kept, out
        assert max(len(line) for line in out.splitlines() if line.startswith(("┏", "┃", "│"))) <= 80
        if kept:
            rows = [dict(zip(heads, (c.strip() for c in line.strip("│").split("│")), strict=True))
                    for line in out.splitlines() if line.startswith("│")]
            assert sorted((r["train.batch_size"], r["seed"]) for r in rows) == [
                ("128", "0"), ("128", "1"), ("64", "0"), ("64", "1")]
            assert {r["state"] for r in rows} == {"queued"}  # whole, not cut


@pytest.mark.parametrize("command", [("runs",), ("show", IDS[0]), ("plugins", "--kind", "loss")])
def test_no_table_cuts_or_folds_a_header_at_40_columns(store, command):
    """``epo…``, ``accuracy…``, a plugins header folded into ``desc``/``ript``/``ion``: each header is whole."""
    from fslab.cli.plugins import PLUGIN_COLUMNS
    from fslab.cli.runs import EVAL_COLUMNS, RUN_COLUMNS

    out = fslab_here(*command, cwd=store, env={**os.environ, "COLUMNS": "40"}).stdout
    heads = [head for line in out.splitlines() if line.startswith("┃") for head in header(line + "\n") if head]
    assert heads and set(heads) <= {col.header for col in [*RUN_COLUMNS, *EVAL_COLUMNS, *PLUGIN_COLUMNS]}
    assert "fitted to 40 columns (left out: " in out
