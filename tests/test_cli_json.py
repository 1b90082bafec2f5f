"""One JSON convention: every ``--json`` prints JSON lines, and each line has
exactly the keys the JSON table of docs/commands.md documents (``fslab eval --json`` is
checked by tests/test_eval_command.py, which trains the run it evaluates)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fslab.core.runstore import create_run

from .runs_helpers import fslab
from .test_tui_helpers import complete_config, history, save_episode_scores, write_run

COMMANDS = Path(__file__).resolve().parent.parent / "docs" / "commands.md"


def documented_keys(command: str) -> dict[str | None, set[str]]:
    """The keys the JSON table of docs/commands.md gives for ``fslab COMMAND ... --json``,
    by line type (None where the lines have no ``type``)."""
    for line in COMMANDS.read_text().splitlines():
        if line.startswith(f"| `fslab {command} ") and "--json`" in line.split("|")[1]:
            keys_cell = line.split("|")[3].split("; where they apply")[0]  # the keys every line has
            break
    else:
        raise AssertionError(f"docs/commands.md documents no JSON keys for fslab {command}")
    if "`type` (" not in keys_cell:
        return {None: _keys(keys_cell)}
    parts = re.split(r'`type` \(`"(\w+)"`\)', keys_cell)  # [before, kind, its keys; ..., kind, its keys]
    return {kind: _keys(text.split(";")[0]) | {"type"} for kind, text in zip(parts[1::2], parts[2::2])}


def _keys(cell: str) -> set[str]:
    """The backticked names of a cell, leaving out values in parentheses (nested ones too: innermost first)."""
    while (inner := re.sub(r"\([^()]*\)", "", cell)) != cell:
        cell = inner
    return {k for k in re.findall(r"`([a-z_0-9]+)`", cell)} - {"null"}


def lines_of(*argv, cwd) -> list[dict]:
    result = fslab(*argv, cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("\n") and all(line.strip() for line in result.stdout.splitlines())
    return [json.loads(line) for line in result.stdout.splitlines()]  # each line a whole object


@pytest.fixture
def store(project):
    runs = project / "runs"
    for run_id, lr in (("20260101-000000-nca-aaaa", 0.1), ("20260101-000001-nca-bbbb", 0.05)):
        folder = write_run(runs, run_id, cfg=complete_config(train={"lr": lr, "epochs": 3}), events=history())
        save_episode_scores(folder, seed=int(lr * 100))
    create_run(runs, "nca", complete_config())  # queued
    return project


def test_runs_show_queue_and_compare_print_the_documented_keys(store):
    runs = lines_of("runs", "--json", cwd=store)
    assert len(runs) == 3 and all(set(r) == documented_keys("runs")[None] for r in runs)
    assert runs[1]["loss_fn"] == "nca"
    [shown] = lines_of("show", "aaaa", "--json", cwd=store)
    assert set(shown) == documented_keys("runs")[None] | documented_keys("show")[None]
    queue = lines_of("queue", "--json", cwd=store)
    documented = documented_keys("queue")
    assert [q["type"] for q in queue] == ["run", "slot"]
    assert all(set(q) == documented[q["type"]] for q in queue)
    compared = lines_of("compare", "aaaa", "bbbb", "--json", cwd=store)
    documented = documented_keys("compare")
    assert [c["type"] for c in compared] == ["group", "group", "paired", "paired"]
    assert all(set(c) == documented[c["type"]] for c in compared)
    assert compared[0]["results"]["1-shot"]["episodes"] == 2000


def test_plugins_json_has_the_same_keys_for_every_component(project):
    rows = lines_of("plugins", "--json", cwd=project)
    documented = documented_keys("plugins")[None]
    assert all(documented <= set(row) for row in rows)
    assert all(isinstance(row["episodic"], bool) for row in rows)
    by_name = {(r["kind"], r["name"]): r for r in rows}
    assert by_name["loss", "protonet"]["episodic"] and not by_name["loss", "nca"]["episodic"]
    assert by_name["method", "nca"]["recipe"]["loss"]["name"] == "nca" and by_name["loss", "nca"]["recipe"] is None


def test_plugins_json_says_episodic_for_a_third_party_component(project):
    (project / "mine").mkdir()
    (project / "mine" / "mine.py").write_text(
        "from fslab.plugin import hookimpl\n\n"
        "def plain(z, labels, support=None):\n    return None\n\n"
        "@hookimpl\ndef register_losses(register):\n"
        "    register(plain, name='plain', description='no episodes')\n")
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    [row] = [r for r in lines_of("plugins", "--kind", "loss", "--json", cwd=project) if r["name"] == "plain"]
    assert row["episodic"] is False and row["recipe"] is None


def test_plot_json_is_one_line_with_the_documented_keys(store):
    [figure] = lines_of("plot", "train.lr", "aaaa", "bbbb", "--out", str(store / "lr.png"), "--json", cwd=store)
    assert set(figure) == documented_keys("plot")[None]


def test_study_list_and_show_print_json_lines(project):
    studies = lines_of("study", "list", "--json", cwd=project)
    assert studies and all(set(s) == documented_keys("study list")[None] for s in studies)
    [shown] = lines_of("study", "show", studies[0]["name"], "--json", cwd=project)
    assert shown["name"] == studies[0]["name"]


def test_study_show_prints_the_documented_keys(project):
    """The JSON table (then in the README) had no row for fslab study show --json."""
    (study,) = lines_of("study", "show", "nca-supcon", "--json", cwd=project)
    assert set(study) == documented_keys("study show")[None]
