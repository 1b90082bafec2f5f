"""Sweeps and the slot scheduler, with real scheduler and worker processes."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import hypothesis
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fslab.core.assignments import toml_value
from fslab.core.errors import ConfigError, UsageError
from fslab.core.keys import repeated_value
from fslab.core.sweeps import new_sweep_id
from fslab.execution.sweep import expand, parse_grid

from .runs_helpers import TINY, fslab, fslab_here, wait_for


def test_grid_parsing_and_expansion():
    grid = parse_grid(["batch_size=128,256,512", "loss.temperature=0.9,1", "backbone=conv4,resnet12"])
    assert grid == {"train.batch_size": [128, 256, 512], "loss.temperature": [0.9, 1],
                    "backbone.name": ["conv4", "resnet12"]}
    combos = expand(grid, seeds=5, first_seed=10)
    assert len(combos) == 3 * 2 * 2 * 5
    assert combos[0] == [{"train": {"batch_size": 128}, "loss": {"temperature": 0.9}, "backbone": {"name": "conv4"}},
                         {"seed": 10}]
    assert [c[-1]["seed"] for c in combos[:6]] == [10, 11, 12, 13, 14, 10]
    with pytest.raises(ConfigError, match="--grid expects key=v1,v2"):
        parse_grid(["train.lr"])
    # a key given twice (here once through its alias) or a value listed twice would silently drop
    # values or train the same runs twice
    with pytest.raises(ConfigError, match=r"--grid names 'train.lr' twice; give all its values in one"):
        parse_grid(["lr=0.1", "train.lr=0.2"])
    with pytest.raises(ConfigError, match=r"--grid train.batch_size lists 128.0 twice"):
        parse_grid(["batch_size=128,256,128.0"])
    # true and 1 are two values (the error said "lists 1 twice" of true,1); each is checked as a run's value later
    assert parse_grid(["eval.center=true,1"]) == {"eval.center": [True, 1]}
    with pytest.raises(ConfigError, match=r"^--grid eval.center lists true twice"):
        parse_grid(["eval.center=true,false,true"])
    with pytest.raises(UsageError, match="--seeds must be at least 1"):
        expand(grid, seeds=0)
    # commas inside a list value do not split it; an empty key is named as a --grid mistake
    assert parse_grid(["train.milestones=[0.5,0.7],[0.3]", 'dataset="a,b",c']) == {
        "train.milestones": [[0.5, 0.7], [0.3]], "dataset.name": ["a,b", "c"]}
    with pytest.raises(ConfigError) as error:
        parse_grid(["=1,2"])
    assert str(error.value) == "--grid expects key=v1,v2,... (e.g. train.lr=0.1,0.05), got '=1,2'"
    # a stray comma made an empty value: an odd type error for a number, a run with '' for a string
    for text, key, raw in (("lr=0.1,,0.2", "train.lr", "0.1,,0.2"), ("lr=0.1,", "train.lr", "0.1,"),
                           ("dataset.root=/data/a, ", "dataset.root", "/data/a,")):
        with pytest.raises(ConfigError) as error:
            parse_grid([text])
        assert str(error.value) == f"--grid {key} has an empty value in '{raw}' (a comma with no value on one " \
                                   f'side); remove the stray comma, or write an empty string as ""'
    assert parse_grid(['dataset.root="",/data/a']) == {"dataset.root": ["", "/data/a"]}
    # what a sweep sets itself is no grid key: seeds would repeat one seed, a method would be dropped
    with pytest.raises(ConfigError, match=r"^--grid seed: a sweep's seeds come from --seeds N"):
        parse_grid(["seed=5,6"])
    with pytest.raises(ConfigError, match=r"^--grid method: a sweep runs one method"):
        parse_grid(["method=nca,protonet"])
    # a typo in --seeds is refused before any combination is built
    with pytest.raises(UsageError, match=r"^this sweep makes 12,000,000 runs, more than one sweep may queue"):
        expand(grid, seeds=1_000_000)


def grid_text(values: list) -> str:
    """``values`` as one --grid value list: each as --set writes it, a string holding a comma, a quote, a
    bracket or a brace in quotes (the README: a value splits at the commas outside brackets and quotes)."""
    def one(value) -> str:
        bare = toml_value(value)
        return toml_value(value, bare=False) if isinstance(value, str) and set(bare) & set(",\"'[]{}") else bare
    return ",".join(one(value) for value in values)


_GRID_VALUES = st.recursive(
    st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=5)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.example(['a",b', "c"])  # a quote escaped inside a quoted value closed its quotes: '"a\\"' was refused
@hypothesis.example([['"'], "x"])
@given(st.lists(_GRID_VALUES, min_size=1, max_size=4).filter(lambda values: repeated_value(values) is None))
def test_a_grid_of_values_written_as_set_writes_them_reads_back_each_value_once(values):
    """--grid KEY=TEXT gives back the values TEXT lists, in their order and types, however they are quoted."""
    grid = parse_grid([f"loss.x={grid_text(values)}"])
    assert grid == {"loss.x": values}
    assert [type(v) for v in grid["loss.x"]] == [type(v) for v in values]
    assert len(expand(grid, seeds=2)) == 2 * len(values)


def test_a_quoted_grid_value_may_hold_an_escaped_quote_and_a_comma():
    # the quotes were taken to close at \", so the comma after it split the value: '"a\\"' is not a TOML value
    assert parse_grid(['loss.name="a\\",b",c']) == {"loss.name": ['a",b', "c"]}
    assert parse_grid(['train.tags=["x\\""],[]']) == {"train.tags": [['x"'], []]}


@pytest.mark.parametrize("text, message", [
    ('seeds = "5"', "'seeds' must be a whole number of at least 1 (seeds per combination), got \"5\""),
    ("seeds = 2.5", "'seeds' must be a whole number of at least 1 (seeds per combination), got 2.5"),
    ("seeds = true", "'seeds' must be a whole number of at least 1 (seeds per combination), got true"),
    ('fail_fast = "yes"', "'fail_fast' must be true or false, got \"yes\""),
    ("grid = 5", "'grid' must be a table ([grid] followed by key = value lines), got 5"),
    ("set = [1]", "'set' must be a table ([set] followed by key = value lines), got [1]"),
    ("seed = 1", "unknown key 'seed'. Did you mean 'seeds'? Allowed: fail_fast, grid, method, seeds, set."),
    ("[grid]\nseed = [1, 2]", "grid.seed: a sweep's seeds come from --seeds N"),
    ("[grid.train]\nlr = [0.1, 0.1]", "grid.train.lr lists 0.1 twice"),
    ('[grid.train]\nlr = [0.1, 0.2]\n[grid]\n"train.lr" = [0.3]',  # else one list would be dropped unsaid
     "grid.train.lr is given twice (once dotted, once in a nested table); keep one"),
    ('[set]\n"train.epochs" = 1\n[set.train]\nepochs = 2',
     "set.train.epochs is given twice (once dotted, once in a nested table); keep one"),
    # no setting takes a TOML date or time, and config.json cannot hold one (a traceback, a run folder left)
    ('[set]\n"dataset.root" = 2026-01-01', 'set.dataset.root = 2026-01-01 is a TOML date or time, which no '
                                            'setting takes; quote it to give the text: "2026-01-01"'),
    ("[grid.train]\nlr = [0.1, 1979-05-27T07:32:00]", "grid.train.lr = 1979-05-27T07:32:00 is a TOML date or time"),
    # a value of the wrong type was said without the file ("config key 'train.lr' must be a number")
    ('[set]\n"train.lr" = "fast"', "set.train.lr must be a number, got \"fast\""),
    ('[grid]\n"train.batch_size" = [16, "x"]', "grid.train.batch_size must be an integer, got \"x\""),
    ('[grid]\n"eval.shots" = [[1], [5, "a"]]', "grid.eval.shots[1] must be an integer, got \"a\""),
])
def test_a_sweep_file_of_the_wrong_shape_is_one_line(tmp_path, text, message):
    from fslab.execution.sweep import read_sweep_file

    path = tmp_path / "s.toml"
    path.write_text(f'method = "nca"\n{text}\n')
    with pytest.raises(ConfigError) as error:
        read_sweep_file(path)
    assert str(error.value).startswith(f"{path}: {message}")


def test_a_sweep_file_takes_dotted_and_nested_keys(tmp_path):
    from fslab.execution.sweep import read_sweep_file

    path = tmp_path / "s.toml"
    path.write_text('method = "nca"\n[grid]\n"train.lr" = [0.1, 0.2]\n[grid.loss]\ntemperature = [1.0]\n'
                    '[set.train]\nepochs = 2\n')
    spec = read_sweep_file(path)
    assert spec["grid"] == {"train.lr": [0.1, 0.2], "loss.temperature": [1.0]}
    assert spec["set"] == {"train.epochs": 2}


def states(project):
    out = {}
    if not (project / "runs").exists():
        return out
    for run_dir in (project / "runs").iterdir():
        if (run_dir / "status.json").exists() and (run_dir / "config.json").exists():
            out[run_dir.name] = json.loads((run_dir / "status.json").read_text())
    return out


class ConcurrencyProbe:
    """Samples how many runs are running at once, and on which slots."""

    def __init__(self, project):
        self.project, self.peak, self.slot_clash, self.stop = project, 0, False, threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def sample(self):
        while not self.stop.is_set():
            running = [s for s in states(self.project).values() if s.get("state") == "running"]
            self.peak = max(self.peak, len(running))
            slots = [s.get("slot") for s in running]
            self.slot_clash |= len(slots) != len(set(slots))
            time.sleep(0.02)


@pytest.mark.slow
def test_sweep_runs_every_combination_within_the_slots_even_with_rival_schedulers(project):
    (project / "fslab.toml").write_text("[scheduler]\ngpus = []\ncpu_slots = 2\n")
    probe = ConcurrencyProbe(project)
    probe.thread.start()
    result = fslab("sweep", "nca", "--seeds", "2", "--grid", "lr=0.1,0.05", *TINY, "--epochs", "1", cwd=project)
    assert result.returncode == 0, result.stderr
    sweep_id = result.stdout.split(":")[0]
    # two more schedulers race the first one for the same queue and slots
    rivals = [subprocess.Popen([sys.executable, "-m", "fslab.execution.scheduler", str(project / "runs")], cwd=project)
              for _ in range(2)]
    wait_for(lambda: len(states(project)) == 4 and all(s["state"] == "completed" for s in states(project).values()),
             timeout=240, what="the sweep to complete")
    probe.stop.set()
    for rival in rivals:
        rival.wait(timeout=120)
    assert probe.peak == 2 and not probe.slot_clash
    record = json.loads((project / "runs" / "sweeps" / f"{sweep_id}.json").read_text())
    assert len(record["runs"]) == 4 and record["grid"] == {"train.lr": [0.1, 0.05]}
    configs = [json.loads((project / "runs" / r / "config.json").read_text()) for r in record["runs"]]
    assert sorted((c["train"]["lr"], c["seed"]) for c in configs) == [(0.05, 0), (0.05, 1), (0.1, 0), (0.1, 1)]
    for run_id in record["runs"]:
        status = json.loads((project / "runs" / run_id / "status.json").read_text())
        assert status["sweep"] == sweep_id and status["slot"] in ("cpu-0", "cpu-1")
        log = (project / "runs" / run_id / "stdout.log").read_text()
        assert log.count("training on cpu") == 1  # started exactly once
    report = json.loads(fslab_here("compare", sweep_id, "--format", "json", "--queries", "5", cwd=project).stdout)
    assert [(g["group"], g["seeds"]) for g in report["groups"]] == [("train.lr=0.1", 2), ("train.lr=0.05", 2)]
    assert report["groups"][0]["results"]["5-shot"]["episodes"] == 2 * 40  # two seeds of TINY's 40 test episodes


FLAKY = """
    from pathlib import Path

    from fslab.plugin import hookimpl
    from fslab_plugins.methods.nca import nca


    def flaky(z, labels, support=None, *, fail_seed: int = -1):
        if Path("fail.flag").exists() and Path("fail.flag").read_text() == str(fail_seed):
            raise RuntimeError("flaky loss failed on purpose")
        return nca(z, labels, support)


    @hookimpl
    def register_losses(register):
        register(flaky, name="flaky", description="fails while fail.flag names its fail_seed")
"""


@pytest.mark.slow
def test_fail_fast_cancels_the_queue_and_resume_requeues_only_what_failed(project):
    (project / "mine").mkdir()
    (project / "mine" / "flaky.py").write_text(textwrap.dedent(FLAKY))
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n[scheduler]\ngpus = []\ncpu_slots = 1\n")
    (project / "fail.flag").write_text("7")
    sweep_file = project / "sweep.toml"
    sweep_file.write_text(textwrap.dedent("""
        method = "nca"
        seeds = 1
        fail_fast = true
        [grid]
        "loss.fail_seed" = [0, 7, 1, 2]
        [set]
        "loss.name" = "flaky"
    """))
    result = fslab("sweep", "--file", str(sweep_file), *TINY, "--epochs", "1", cwd=project)
    assert result.returncode == 0, result.stderr
    sweep_id = result.stdout.split(":")[0]
    record = json.loads((project / "runs" / "sweeps" / f"{sweep_id}.json").read_text())
    order = record["runs"]  # fail_seed 0, 7, 1, 2 in this order; one slot runs them one by one

    def final():
        found = [json.loads((project / "runs" / r / "status.json").read_text())["state"] for r in order]
        return found if all(s in ("completed", "failed", "killed") for s in found) else None

    assert wait_for(final, timeout=180, what="the sweep to stop") == ["completed", "failed", "killed", "killed"]
    cancelled = json.loads((project / "runs" / order[2] / "status.json").read_text())
    assert cancelled["error"] == f"sweep stopped: run {order[1]} failed (fail-fast)"
    first_end = json.loads((project / "runs" / order[0] / "status.json").read_text())["ended"]

    (project / "fail.flag").unlink()
    again = fslab("sweep", "resume", sweep_id, cwd=project)
    assert again.stdout.strip() == f"{sweep_id}: 3 runs queued again"
    assert wait_for(lambda: final() == ["completed"] * 4 and final(), timeout=180, what="the resumed sweep")
    assert json.loads((project / "runs" / order[0] / "status.json").read_text())["ended"] == first_end
    # the run that failed before its first checkpoint started again from its beginning, and its metrics hold
    # that start alone: the failed start's events were kept before it, a step logged twice
    logged = [json.loads(line) for line in (project / "runs" / order[1] / "metrics.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in logged if e["event"] == "train"]
    assert [e["event"] for e in logged].count("start") == 1 and steps == sorted(set(steps)) and steps
    # the slot frees when the last worker process has exited, a moment after its status says completed
    def queue_items():
        return [json.loads(line) for line in fslab_here("queue", "--json", cwd=project).stdout.splitlines()]

    queue = wait_for(lambda: (q := queue_items()) and q[-1]["busy"] is False and q, timeout=120,
                     what="the slot to free")
    assert queue == [{"type": "slot", "slot": "cpu-0", "gpu": None, "busy": False, "problem": None}]


def test_sweep_with_a_bad_value_writes_nothing(project):
    result = fslab_here("sweep", "nca", "--grid", "train.epochs=1,two", cwd=project)
    assert result.returncode == 2 and "config key 'train.epochs' must be an integer, got \"two\"" in result.stderr
    assert not (project / "runs").exists() or not any((project / "runs").iterdir())


def test_a_grid_point_trains_as_the_same_values_given_with_set(project, registry):
    """A grid key was a layer of its own, in grid order: --grid loss.temperature=0.5,0.7 --grid
    loss.name=supcon made two runs both at supcon's default 0.1, and --set loss.temperature=0.5 with
    --grid loss.name=nca,supcon trained supcon at 0.1: the layer that chose the loss dropped the
    parameters given beside it, which one command's --sets never do."""
    from fslab.cli.common import overrides
    from fslab.core.settings import load_settings
    from fslab.execution.sweep import create_sweep

    def losses(grid, sets=(), file_set=()):
        base = overrides(None, None, None, None, None, None, None, "cpu", list(sets), file_set=list(file_set))
        _, runs = create_sweep("nca", parse_grid(grid), 1, base=base, settings=load_settings(), registry=registry)
        return [run.config()["loss"] for run in runs]

    supcon = registry.get("loss", "supcon").params
    assert [loss["temperature"] for loss in losses(["loss.temperature=0.5,0.7", "loss.name=supcon"])] == [0.5, 0.7]
    assert [loss["temperature"] for loss in losses(["loss.name=supcon", "loss.temperature=0.5,0.7"])] == [0.5, 0.7]
    assert losses(["loss.name=nca,supcon"], sets=["loss.temperature=0.5"]) == [
        {"name": "nca", "temperature": 0.5, "pair_fraction": 1.0}, {**supcon, "name": "supcon", "temperature": 0.5}]
    # a sweep file's [set] alike; what the recipe gave the loss it replaces is not carried over
    (nca_run, supcon_run) = losses(["loss.name=nca,supcon"], file_set=["loss.temperature=0.5"])
    assert supcon_run == {**supcon, "name": "supcon", "temperature": 0.5} and nca_run["temperature"] == 0.5
    assert losses(["loss.name=supcon"]) == [{**supcon, "name": "supcon"}]
    # a grid of tables sets the keys inside them: one the sweep also sets is refused, as for a plain grid key
    with pytest.raises(ConfigError, match=r"^'loss.temperature' is both a grid key and set by an option or the "):
        losses(["loss={name=\"nca\"},{name=\"supcon\",temperature=0.5}"], file_set=["loss.temperature=0.9"])
    # two spellings of one value (5 and [5] for a list key) would train the same runs twice
    with pytest.raises(ConfigError) as error:
        losses(["eval.shots=5,[5]", "loss.temperature=0.5,0.7"])
    assert str(error.value) == "the grid points eval.shots=5, loss.temperature=0.5 and eval.shots=[5], " \
                               "loss.temperature=0.5 are one configuration, so each would train the same runs: " \
                               "list one of them"
    # as fslab run with both --sets: a parameter the chosen plugin lacks is refused, not dropped for it
    with pytest.raises(ConfigError, match=r"^unknown parameter 'loss.temperature' for loss 'protonet'"):
        losses(["loss.name=nca,protonet"], sets=["loss.temperature=0.5"])


@pytest.mark.parametrize("value, message", [
    ("abc", "must be an integer, got \"abc\""), ("1.5", "must be an integer, got 1.5"),
    ("[1]", "must be an integer, got [1]"), ("true", "must be an integer, got true"),  # was seeds 1, 2
    ("-1", "must be a whole number from 0 to 2**63 - 1, got -1"),
])
def test_a_first_seed_of_the_wrong_type_is_one_line(project, value, message):
    """A sweep counts its seeds from the seed that --set or [set] gives: one that is no whole number
    was a traceback (TypeError) before any check, and true counted from 1."""
    result = fslab_here("sweep", "nca", "--device", "cpu", "--seeds", "2", "--set", f"seed={value}", cwd=project)
    assert (result.returncode, result.stderr) == (2, f"error: config key 'seed' {message}\n")
    (project / "s.toml").write_text(f'method = "nca"\n[set]\nseed = {value}\n'.replace("abc", '"abc"'))
    result = fslab_here("sweep", "--file", "s.toml", "--device", "cpu", cwd=project)
    # a type the file got wrong names the file; a number out of range is checked with the runs
    named = "config key 'seed'" if value == "-1" else "s.toml: set.seed"
    assert (result.returncode, result.stderr) == (2, f"error: {named} {message}\n")
    assert not (project / "runs").exists() or not any((project / "runs").iterdir())


def test_fslab_runs_sweep_shows_each_run_s_values_of_the_swept_keys(project, registry):
    """fslab runs --sweep listed a sweep's runs with nothing that told them apart but their ids: which
    learning rate each had took fslab show or fslab compare."""
    from fslab.cli.common import overrides
    from fslab.core.settings import load_settings
    from fslab.execution.sweep import create_sweep

    base = overrides(None, None, None, None, None, None, None, "cpu", [])
    grid = parse_grid(["train.lr=1e-3,0.5", 'train.milestones=[0.5,0.7]', 'dataset.colour="image",class'])
    sweep_id, runs = create_sweep("nca", grid, 1, base=base, settings=load_settings(), registry=registry)
    listed = fslab_here("runs", "--sweep", sweep_id, "--wide", cwd=project)
    assert listed.returncode == 0, listed.stderr
    header, *rows = [[cell.strip() for cell in line.split("│" if "│" in line else "┃")[1:-1]]
                     for line in listed.stdout.splitlines() if line.startswith(("┃", "│"))]
    assert header[5:9] == ["seed", "dataset.colour", "train.lr", "train.milestones"]  # as the record has them
    values = {row[0]: row[6:9] for row in rows}
    assert values == {run.id: [colour, lr, "[0.5, 0.7]"]
                      for run, lr, colour in zip(runs, ["0.001", "0.001", "0.5", "0.5"], ["image", "class"] * 2)}
    plain = fslab_here("runs", "--wide", cwd=project)  # without --sweep: the table as it was
    assert "train.lr" not in plain.stdout and "seed" in plain.stdout
    # last: the newest sweep, as a run's last is the newest run (it matched no sweep)
    assert fslab_here("runs", "--sweep", "last", "--wide", cwd=project).stdout == listed.stdout
    # fslab show names the run's sweep (it did not: only --json's status had it)
    assert f"seed 0, sweep {sweep_id}" in fslab_here("show", runs[0].id, cwd=project).stdout


def test_fslab_runs_sweep_shows_the_keys_inside_a_grid_of_tables(project, registry):
    """A grid of tables made one column named 'loss', as the training loss's, holding each run's whole
    table; at 80 columns the two went out together, with the one that told the runs apart."""
    from fslab.cli.common import overrides
    from fslab.core.settings import load_settings
    from fslab.execution.sweep import create_sweep

    base = overrides(None, None, None, None, None, None, None, "cpu", [])
    grid = parse_grid(['loss={name = "nca"},{name = "supcon", temperature = 0.5}'])
    sweep_id, runs = create_sweep("nca", grid, 1, base=base, settings=load_settings(), registry=registry)
    listed = fslab_here("runs", "--sweep", sweep_id, "--wide", cwd=project)
    assert listed.returncode == 0, listed.stderr
    header, *rows = [[cell.strip() for cell in line.split("│" if "│" in line else "┃")[1:-1]]
                     for line in listed.stdout.splitlines() if line.startswith(("┃", "│"))]
    assert header[5:8] == ["seed", "loss.name", "loss.temperature"] and header.count("loss") == 1
    assert {row[0]: row[6:8] for row in rows} == {runs[0].id: ["nca", "1.0"], runs[1].id: ["supcon", "0.5"]}
    fitted = fslab_here("runs", "--sweep", sweep_id, cwd=project, env={**os.environ, "COLUMNS": "100"}).stdout
    assert "loss.name" in fitted and "supcon" in fitted


def test_two_sweeps_queued_in_the_same_second_never_share_an_id(project, registry, monkeypatch):
    """A sweep's id is its second and two random bytes, and nothing kept a second sweep from drawing
    the same: its record replaced the first one's, and the runs of both, their status naming the one
    id, were one sweep to fslab stop, sweep resume and runs --sweep. Here both draw the same bytes."""
    import secrets

    from fslab.cli.common import overrides
    from fslab.core.settings import load_settings
    from fslab.core.sweeps import load_sweep, sweep_records
    from fslab.execution.sweep import create_sweep

    monkeypatch.setattr(time, "strftime", lambda fmt, *args: "20261128-120000" if "%H" in fmt else "2026")
    base = overrides(None, None, None, None, None, None, None, "cpu", [])
    made = []
    for _ in range(2):
        draws = iter(range(1000))  # the same draws for each sweep, its id's first (two in the same second)
        monkeypatch.setattr(secrets, "token_hex", lambda n, draws=draws: f"{next(draws):0{2 * n}x}")
        made.append(create_sweep("nca", parse_grid(["train.lr=0.1,0.2"]), 1, base=base, settings=load_settings(),
                                 registry=registry))
    (first, first_runs), (second, second_runs) = made
    assert first != second
    for sweep_id, runs in made:
        assert load_sweep(project / "runs", sweep_id)["runs"] == [run.id for run in runs]
        assert {run.status()["sweep"] for run in runs} == {sweep_id}
    assert len(sweep_records(project / "runs")) == 2
    assert not [p.name for p in (project / "runs" / "sweeps").iterdir() if p.name.startswith(".")]


def test_a_run_fslab_run_starts_is_never_waiting_for_a_scheduler(project, registry, monkeypatch):
    """fslab run created its run queued and claimed it a moment later: a scheduler of the project (a
    sweep's) that listed the waiting runs in between took it and started a worker of its own, beside
    the one fslab run then started. The run is claimed before its status says queued."""
    from fslab.cli.common import overrides
    from fslab.core.runstore import Run
    from fslab.core.settings import load_settings
    from fslab.execution import executor
    from fslab.execution.scheduler import waiting_runs

    seen, write_status = [], Run.write_status

    def a_scheduler_looks(self, **fields):  # what a scheduler listing the store then would start
        write_status(self, **fields)
        if fields.get("state") == "queued":
            seen.append([run.id for run in waiting_runs(self.path.parent)])

    monkeypatch.setattr(Run, "write_status", a_scheduler_looks)
    monkeypatch.setattr(executor, "_start", lambda run, **_: executor.Started(run))
    base = overrides(None, None, None, None, None, None, None, "cpu", [])
    started = executor.launch("nca", base, settings=load_settings(), registry=registry)
    assert seen == [[]] and started.run.claimed()


def test_last_names_the_newest_sweep_where_a_sweep_is_taken(tmp_path):
    from fslab.core.errors import UsageError
    from fslab.core.sweeps import load_sweep, save_sweep

    with pytest.raises(UsageError, match=r"^no sweeps yet: .*/sweeps/ holds no sweep's record, so 'last' names none"):
        load_sweep(tmp_path, "last")
    for sweep_id in ("sweep-20261124-090000-9c01", "sweep-20261125-080000-0001", "sweep-20261124-100000-ffff"):
        save_sweep(tmp_path, sweep_id, runs=[])
    assert load_sweep(tmp_path, "last")["id"] == "sweep-20261125-080000-0001"


def test_a_date_in_a_sweep_file_is_one_line_and_queues_nothing(project):
    """A TOML date in a sweep file's [set] was a traceback (TypeError: not a setting's value), and one in
    its [grid] a traceback that left a run folder without config.json."""
    (project / "s.toml").write_text('method = "nca"\n[set]\n"dataset.root" = 2026-01-01\n')
    result = fslab_here("sweep", "--file", "s.toml", "--device", "cpu", cwd=project)
    assert result.returncode == 2, result.stderr
    assert result.stderr == 'error: s.toml: set.dataset.root = 2026-01-01 is a TOML date or time, which no ' \
                            'setting takes; quote it to give the text: "2026-01-01"\n'
    (project / "s.toml").write_text('method = "nca"\n[grid]\n"dataset.root" = [2026-01-01, 2026-01-02]\n')
    result = fslab_here("sweep", "--file", "s.toml", "--device", "cpu", cwd=project)
    assert result.returncode == 2 and "grid.dataset.root = 2026-01-01 is a TOML date" in result.stderr
    assert not (project / "runs").exists() or not any((project / "runs").iterdir())


def test_a_data_root_written_another_way_does_not_contradict_the_sweep_file(project):
    """--data-root d1 against dataset.root = "/abs/d1" in [set] (the same folder, written two ways) was
    refused as a contradiction; another folder still is. The bad epochs stop it before anything is queued."""
    (project / "s.toml").write_text(f'method = "nca"\n[set]\n"dataset.root" = "{project / "d1"}"\n')
    for root in ("d1", "./d1/", str(project / "d1")):
        result = fslab_here("sweep", "--file", "s.toml", "--data-root", root, "--set", "train.epochs=abc", cwd=project)
        assert (result.returncode, result.stderr) == (2, "error: config key 'train.epochs' must be an integer, "
                                                         "got \"abc\"\n"), root
    result = fslab_here("sweep", "--file", "s.toml", "--data-root", "d2", "--set", "train.epochs=abc", cwd=project)
    assert result.returncode == 2 and "--data-root d2 contradicts dataset.root" in result.stderr
    assert not (project / "runs").exists() or not any((project / "runs").iterdir())


def test_a_sweep_refuses_a_grid_key_an_option_also_sets_and_a_method_its_file_contradicts(project):
    """The grid's values would silently replace the option's: nothing is queued."""
    for args in (["--batch-size", "64", "--grid", "batch_size=128,256"],
                 ["--set", "train.lr=0.5", "--grid", "train.lr=0.1,0.2"]):
        result = fslab_here("sweep", "nca", "--device", "cpu", *args, cwd=project)
        key = "train.batch_size" if "--batch-size" in args else "train.lr"
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip() == f"error: '{key}' is both a grid key and set by an option or the sweep " \
                                        f"file's [set]; the grid's values would replace it: leave out one of the two"
    (project / "s.toml").write_text('method = "nca"\n[set]\n"train.lr" = 0.3\n[grid]\n"train.lr" = [0.1]\n')
    result = fslab_here("sweep", "--file", "s.toml", "--device", "cpu", cwd=project)
    assert result.returncode == 2 and "'train.lr' is both a grid key" in result.stderr
    (project / "s.toml").write_text('method = "nca"\n')
    result = fslab_here("sweep", "protonet", "--file", "s.toml", "--device", "cpu", cwd=project)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: s.toml sweeps method 'nca', but the command names protonet; " \
                                    "leave METHOD out with --file"
    assert not (project / "runs").exists() or not any((project / "runs").iterdir())


def test_a_run_of_n_processes_takes_n_slots_on_different_gpus():
    from fslab.execution.slots import Slot, capacity, check_fits, pick_slots

    gpu_slots = [Slot(f"gpu{g}-{k}", g) for g in (0, 1, 2) for k in range(2)]  # runs_per_gpu = 2
    free = [(s, i) for i, s in enumerate(gpu_slots) if s.name != "gpu1-0"]
    assert [s.name for s, _ in pick_slots(free, 1)] == ["gpu0-0"]
    assert [s.name for s, _ in pick_slots(free, 3)] == ["gpu0-0", "gpu1-1", "gpu2-0"]
    assert pick_slots([(s, i) for i, s in enumerate(gpu_slots) if s.gpu == 0], 2) is None  # one GPU, twice
    assert capacity(gpu_slots) == 3 and capacity([Slot(f"cpu-{k}") for k in range(4)]) == 4
    cpu_slots = [(Slot(f"cpu-{k}"), k) for k in range(3)]
    assert [s.name for s, _ in pick_slots(cpu_slots, 3)] == ["cpu-0", "cpu-1", "cpu-2"]
    assert pick_slots(cpu_slots, 4) is None
    with pytest.raises(UsageError, match=r"--gpus 4 \(train.processes\) needs 4 slots .* but the scheduler has 3 "
                                         r"GPUs; use --gpus 3"):
        check_fits(4, gpu_slots)


def test_a_sweep_whose_runs_cannot_fit_the_slots_writes_nothing(project):
    # 2 gloo processes, which any machine may start (3 are more than a 2-core machine's CPUs, refused for that)
    (project / "fslab.toml").write_text("[scheduler]\ngpus = []\ncpu_slots = 1\n")
    result = fslab_here("sweep", "nca", "--device", "cpu", "--gpus", "2", *TINY, cwd=project)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --gpus 2 (train.processes) needs 2 slots on different GPUs (or CPU " \
                                    "slots), but the scheduler has 1 CPU slot (scheduler.cpu_slots in fslab.toml); " \
                                    "use --gpus 1 or fewer"
    assert not (project / "runs").exists() or not any((project / "runs").iterdir())
    bin_dir = project / "bin"  # a stand-in srun: SLURM is here, so the job's shape is what is checked
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    slurm = fslab_here("sweep", "nca", "--device", "cuda", "--gpus", "2", *TINY, "--executor", "slurm", cwd=project,
                  env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert slurm.returncode == 2
    assert "--gpus 2 (train.processes) in a SLURM job needs gpus_per_job >= 2, got 1" in slurm.stderr
    assert not (project / "runs").exists() or not any((project / "runs").iterdir())


def test_a_grid_point_the_slots_cannot_hold_begins_the_refusal(project):
    """fslab sweep --grid train.processes=2,1 with one CPU slot was refused in fslab run --gpus 2's words, naming
    no grid, where every other refusal of a point begins with it: the line names the point the slots cannot hold
    (the largest, wherever the grid lists it)."""
    (project / "fslab.toml").write_text("[scheduler]\ngpus = []\ncpu_slots = 1\n")
    result = fslab_here("sweep", "nca", "--device", "cpu", *TINY, "--grid", "train.processes=2,1", cwd=project)
    assert (result.returncode, result.stderr) == (2, (
        "error: grid point train.processes=2: --gpus 2 (train.processes) needs 2 slots on different GPUs (or CPU "
        "slots), but the scheduler has 1 CPU slot (scheduler.cpu_slots in fslab.toml); use --gpus 1 or fewer\n"))
    assert not (project / "runs").exists() or not [p for p in (project / "runs").iterdir() if p.name != "sweeps"]


@pytest.mark.parametrize("visible, expect", [
    ("0,1", "names GPU 3, but this machine shows GPUs 0, 1; list only those, or set gpus = \"auto\""),
    ("", "names GPUs 0, 3, but no GPU is visible here; set gpus = [] to run on CPU slots"),
])
def test_scheduler_gpus_this_machine_does_not_show_are_refused(project, monkeypatch, visible, expect):
    """A slot on a GPU the machine lacks gave its run no GPU at all: it trained on the CPU, or failed."""
    (project / "fslab.toml").write_text("[scheduler]\ngpus = [0, 3]\n")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible}
    for argv in (["sweep", "nca", "--device", "cpu", "--seeds", "2", *TINY],
                 ["study", "run", "nca-fig2", "--scale", "quick"]):
        result = fslab_here(*argv, cwd=project, env=env)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: ") and expect in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (project / "runs").exists() or not any((project / "runs").iterdir())
    from fslab.core.settings import SchedulerSettings
    from fslab.execution.slots import check_gpus_here

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    check_gpus_here(SchedulerSettings(gpus=(1,)))  # a GPU the machine shows passes


def test_fslab_queue_on_a_store_it_cannot_write_tells_busy_slots_from_free_ones(tmp_path, monkeypatch):
    """On a read-only copy of a store, fslab queue called every slot unusable and said to remove its lock
    file: it opened the file to write. A read-only descriptor holds the probe's lock as well."""
    import errno
    import fcntl

    from fslab.execution import slots as slot_module

    real_open = os.open

    def read_only(path, flags, *args, **kwargs):  # a read-only file system refuses every open to write
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    folder = tmp_path / "runs" / ".slots"
    folder.mkdir(parents=True)
    (folder / "cpu-0.lock").write_text("")
    monkeypatch.setattr(os, "open", read_only)
    slot = slot_module.Slot("cpu-0", None)
    assert slot_module.slot_state(folder, slot) == {"busy": False, "problem": None}
    fd = os.open(folder / "cpu-0.lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a worker in the slot
        assert slot_module.slot_state(folder, slot) == {"busy": True, "problem": None}
    finally:
        os.close(fd)


def test_slot_lock_files_another_user_made_still_hold_one_run_each(tmp_path, another_users):
    """In a runs folder a group shares, the slots' lock files one user's scheduler made (rw-r--r--) could not
    be opened to write by another's: their fslab sweep stopped with `Permission denied` and their scheduler
    used no slot. They are locked read-only (flock locks them the same): a slot held is refused to another."""
    from fslab.execution.slots import Slot, check_slot_files, lock_slot, slot_state

    folder = tmp_path / "runs" / ".slots"
    folder.mkdir(parents=True)
    slots = [Slot("cpu-0"), Slot("cpu-1")]
    for slot in slots:
        (folder / f"{slot.name}.lock").write_text("")
        another_users(folder / f"{slot.name}.lock")
    check_slot_files(tmp_path / "runs", slots)  # no error: a sweep may queue its runs
    held = lock_slot(folder, slots[0])
    try:
        assert held is not None and lock_slot(folder, slots[0]) is None  # one run per slot
        assert slot_state(folder, slots[0]) == {"busy": True, "problem": None}
        assert slot_state(folder, slots[1]) == {"busy": False, "problem": None}
    finally:
        os.close(held)
    assert slot_state(folder, slots[0]) == {"busy": False, "problem": None}


def test_a_slot_lock_that_cannot_be_opened_is_one_line_and_queues_nothing(project):
    """A slot's lock file replaced by a folder (or the slots' folder by a file) crashed the background
    scheduler after the runs were queued, and fslab queue with a traceback."""
    (project / "fslab.toml").write_text("[scheduler]\ngpus = []\ncpu_slots = 2\n")
    slots = project / "runs" / ".slots"
    (slots / "cpu-1.lock").mkdir(parents=True)
    result = fslab_here("sweep", "nca", "--device", "cpu", *TINY, cwd=project)
    assert result.returncode == 2
    assert result.stderr == ("error: runs/.slots/cpu-1.lock cannot be opened as a scheduler slot's lock file (Is a "
                             "directory); remove it (no run keeps anything there): fslab makes it again\n")
    assert [p.name for p in (project / "runs").iterdir()] == [".slots"]
    queue = [json.loads(line) for line in fslab_here("queue", "--json", cwd=project).stdout.splitlines()]
    assert [(q["slot"], q["busy"]) for q in queue] == [("cpu-0", False), ("cpu-1", None)]
    assert "cpu-1.lock cannot be opened" in queue[1]["problem"]
    assert queue[0]["problem"] is None  # every slot line has the key, as every --json line has its keys
    shown = fslab_here("queue", cwd=project)
    assert shown.returncode == 0 and "slots: cpu-0 free, cpu-1 unusable" in shown.stdout
    shutil.rmtree(slots)
    slots.write_text("")
    study = fslab_here("study", "run", "nca-supcon", "--scale", "quick", "--set", "device=cpu", cwd=project)
    assert study.returncode == 2 and study.stderr == (
        "error: runs/.slots is not a folder, where the scheduler keeps its slots' lock files; remove it (no run "
        "keeps anything there): fslab makes it again\n")
    assert [p.name for p in (project / "runs").iterdir()] == [".slots"]


@pytest.mark.slow
@pytest.mark.usefixtures("torchrun_tmp")  # its torchrun's folders: under tmp_path
def test_a_sweep_of_two_process_runs_gives_each_run_two_slots(project):
    """3 CPU slots and runs of 2 gloo processes: one run at a time, each holding two slots."""
    (project / "fslab.toml").write_text("[scheduler]\ngpus = []\ncpu_slots = 3\n")
    result = fslab("sweep", "nca", "--seeds", "2", "--device", "cpu", "--gpus", "2", *TINY, "--epochs", "1",
                   cwd=project)
    assert result.returncode == 0, result.stderr
    sweep_id = result.stdout.split(":")[0]
    record = json.loads((project / "runs" / "sweeps" / f"{sweep_id}.json").read_text())
    wait_for(lambda: all(s["state"] in ("completed", "failed") for s in states(project).values()),
             timeout=240, what="the sweep to end")
    got = [json.loads((project / "runs" / r / "status.json").read_text()) for r in record["runs"]]
    assert [(s["state"], s["processes"]) for s in got] == [("completed", 2), ("completed", 2)], got
    assert [s["slot"] for s in got] == ["cpu-0,cpu-1", "cpu-0,cpu-1"]  # the third slot was never enough
    assert got[1]["started"] > got[0]["ended"]  # the second waited for the first run's slots


@pytest.mark.slow
def test_stop_sweep_stops_its_queued_runs_first_then_its_running_one(project):
    from .test_resume import SLOW_NCA

    (project / "mine").mkdir()
    (project / "mine" / "slow.py").write_text(textwrap.dedent(SLOW_NCA))
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n[scheduler]\ngpus = []\ncpu_slots = 1\n")
    result = fslab("sweep", "nca", "--seeds", "3", *TINY, "--epochs", "20", "--set", "loss.name=slow-nca",
                   cwd=project)
    assert result.returncode == 0, result.stderr
    sweep_id = result.stdout.split(":")[0]
    order = json.loads((project / "runs" / "sweeps" / f"{sweep_id}.json").read_text())["runs"]

    def states():
        return [json.loads((project / "runs" / r / "status.json").read_text())["state"] for r in order]

    wait_for(lambda: states().count("running") == 1, what="one run to start in the one slot")
    running = order[states().index("running")]
    stopped = fslab("stop", sweep_id, cwd=project)
    assert stopped.returncode == 0, stopped.stderr
    queued = [r for r in order if r != running]
    assert stopped.stdout.splitlines() == [f"{r}: killed" for r in (*queued, running)]
    assert stopped.stderr.strip() == (f"3 runs of {sweep_id} stopped; each that had started keeps its last "
                                      f"checkpoint; go on with: fslab sweep resume {sweep_id}")
    assert states() == ["killed"] * 3
    assert [json.loads((project / "runs" / r / "status.json").read_text()).get("error") for r in queued] == [
        "stopped while queued"] * 2
    again = fslab("stop", sweep_id, cwd=project)
    assert again.returncode == 2 and again.stderr == f"error: sweep {sweep_id} has no queued or running run; " \
                                                      f"nothing to stop\n"


def test_a_store_that_refuses_writes_is_named_as_such_not_as_a_lock_file_to_remove(tmp_path, monkeypatch):
    """A read-only (or full) runs folder is the file system's refusal: the OSError goes on to
    the CLI's one line naming the file (exit 1, as fslab run says it), with no advice to remove
    a lock file that does not exist."""
    import errno
    from pathlib import Path

    from fslab.execution.slots import Slot, check_slot_files

    def refuse(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(OSError) as refused:
        check_slot_files(tmp_path / "runs", [Slot("cpu-0", None)])
    assert refused.type is OSError and refused.value.filename == str(tmp_path / "runs" / ".slots")


def test_a_requeued_run_holds_no_slot_until_a_scheduler_gives_it_one(tmp_path):
    from fslab.core.runstore import create_run
    from fslab.execution.sweep import requeue

    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    run.write_status(state="killed", pid=None, slot="cpu-0", gpus="0", error="stopped")
    (again,) = requeue(tmp_path / "runs", {"runs": [run.id]})
    status = again.status()
    assert (status["state"], status["slot"], status["gpus"], status["error"]) == ("queued", None, None, None)


def test_sweep_options_that_contradict_the_sweep_file_are_refused_not_dropped(tmp_path):
    """--seeds and --fail-fast used to be overruled without a word by the file's seeds and fail_fast."""
    from fslab.cli.launch import _sweep_spec

    path = tmp_path / "s.toml"
    path.write_text('method = "nca"\nseeds = 2\nfail_fast = false\n[grid]\n"train.lr" = [0.1, 0.2]\n')
    with pytest.raises(UsageError) as error:
        _sweep_spec([], path, 1, False, [])
    assert str(error.value) == f"--seeds 1 contradicts seeds = 2 in {path}; give it in one of the two"
    with pytest.raises(UsageError) as error:
        _sweep_spec([], path, None, True, [])
    assert str(error.value) == f"--fail-fast contradicts fail_fast = false in {path}; give it in one of the two"
    # options that agree with the file, or keys the file leaves out, are taken
    assert _sweep_spec([], path, 2, False, [])[1:3] == (2, False)
    path.write_text('method = "nca"\n')
    assert _sweep_spec([], path, 3, True, [])[1:3] == (3, True)
    assert _sweep_spec([], path, None, False, [])[1:3] == (1, False)
    assert _sweep_spec(["nca"], None, None, False, [])[1] == 1


def test_an_option_that_contradicts_the_sweep_file_s_set_is_refused_not_overruled(project):
    """The file's [set] is a layer above the options: --lr 0.5 against "train.lr" = 0.1 in it trained
    every run at 0.1 without a word (and --seed 7 counted the seeds from the file's seed)."""
    (project / "s.toml").write_text('method = "nca"\n[set]\n"train.lr" = 0.1\nseed = 3\n[set.backbone]\n'
                                    'name = "conv4"\n')
    for args, line in [(["--lr", "0.5"], "--lr 0.5 contradicts train.lr = 0.1"),
                       (["--seed", "7"], "--seed 7 contradicts seed = 3"),
                       (["--backbone", "resnet12"], '--backbone resnet12 contradicts backbone.name = "conv4"')]:
        result = fslab_here("sweep", "--file", "s.toml", "--device", "cpu", *args, cwd=project)
        assert (result.returncode, result.stderr) == (2, f"error: {line} in [set] of s.toml; give it in one of "
                                                         f"the two\n")
    # the same value is no contradiction: the sweep is checked on (here refused for its epochs)
    result = fslab_here("sweep", "--file", "s.toml", "--lr", "0.1", "--seed", "3", "--epochs", "0", cwd=project)
    assert result.returncode == 2 and "--epochs must be a whole number" in result.stderr
    assert not (project / "runs").exists() or not any((project / "runs").iterdir())


def test_a_run_whose_configuration_cannot_be_read_is_never_resumed_nor_requeued(tmp_path):
    """fslab resume of a killed run with a broken config.json said only "the configuration has no 'method'",
    and fslab sweep resume failed as a whole on it, where the README promises such a run is passed over."""
    from fslab.core.runstore import create_run
    from fslab.core.sweeps import save_sweep

    runs = tmp_path / "runs"
    good, bad = (create_run(runs, "nca", {"method": "nca", "seed": seed, "device": "cpu"}) for seed in (0, 1))
    good.write_status(state="completed", pid=None, sweep="sweep-1")  # nothing to requeue: no scheduler starts
    bad.write_status(state="killed", pid=None, error="stopped", sweep="sweep-1")
    (bad.path / "config.json").write_text("{bad")
    save_sweep(runs, "sweep-1", runs=[good.id, bad.id], method="nca")
    refused = fslab_here("resume", bad.id, cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr == (
        f"error: run {bad.id} cannot resume: its config.json is missing or unreadable (fslab runs lists it as "
        f"unreadable); put the file back from a copy of the run, then resume it\n")
    resumed = fslab_here("sweep", "resume", "sweep-1", cwd=tmp_path)
    assert resumed.returncode == 2 and resumed.stdout == "", resumed.stderr
    assert resumed.stderr == (
        f"error: sweep sweep-1 has nothing to resume: 1 completed, 1 with its config.json missing or unreadable "
        f"({bad.id}: put it back from a copy, then resume it); only its failed, killed or lost runs are queued again\n")
    assert bad.status()["state"] == "killed"  # nothing written to it


def test_sweep_resume_names_the_runs_whose_status_cannot_be_read(tmp_path):
    """A run of a sweep whose status.json was damaged (how it ended cannot be told: it may have failed)
    was passed over by fslab sweep resume without a word, though the README promises it names such a
    run on stderr; only runs whose config.json was damaged were named (4 of a 1,000-run sweep here)."""
    from fslab.core.runstore import create_run
    from fslab.core.sweeps import save_sweep

    runs = tmp_path / "runs"
    done, waiting, *damaged = (create_run(runs, "nca", {"method": "nca", "seed": seed}) for seed in range(5))
    done.write_status(state="completed", pid=None, sweep="sweep-1")
    for run in damaged:
        run.write_status(state="failed", pid=None, sweep="sweep-1")
        (run.path / "status.json").write_text('{"state": "fai')
    save_sweep(runs, "sweep-1", runs=[done.id, damaged[0].id], method="nca")
    refused = fslab_here("sweep", "resume", "sweep-1", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr == (
        f"error: sweep sweep-1 has nothing to resume: 1 completed, 1 with its status.json missing or unreadable "
        f"({damaged[0].id}: how it ended cannot be told: put it back from a copy, then resume it); only its "
        f"failed, killed or lost runs are queued again\n")
    waiting.write_status(state="queued", pid=None, sweep="sweep-2")
    save_sweep(runs, "sweep-2", runs=[waiting.id, *(run.id for run in damaged)], method="nca")
    resumed = fslab("sweep", "resume", "sweep-2", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr == (f"3 runs left as they are, their status.json missing or unreadable (how they ended "
                              f"cannot be told: put it back from a copy, then resume them): "
                              f"{', '.join(run.id for run in damaged)}\n")
    wait_for(lambda: waiting.claimed(), timeout=60, what="a scheduler to take the waiting run")
    assert all(run.status() == {} for run in damaged)  # nothing written to them


def test_sweep_resume_says_a_run_deleted_by_hand_is_deleted_not_damaged(tmp_path):
    """A sweep's run whose folder was removed by hand (rm -rf) was 'status.json missing or unreadable (how
    it ended cannot be told: put it back from a copy, then resume it)': it is said to be deleted."""
    import shutil

    from fslab.core.runstore import create_run
    from fslab.core.sweeps import save_sweep

    runs = tmp_path / "runs"
    done, gone = (create_run(runs, "nca", {"method": "nca", "seed": seed}) for seed in range(2))
    done.write_status(state="completed", pid=None, sweep="sweep-1")
    save_sweep(runs, "sweep-1", runs=[done.id, gone.id], method="nca")
    shutil.rmtree(gone.path)
    refused = fslab_here("sweep", "resume", "sweep-1", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr == (
        f"error: sweep sweep-1 has nothing to resume: 1 completed, 1 with its folder deleted ({gone.id}: the "
        f"sweep's record still names it; fslab delete drops a run from its record too); only its failed, killed "
        f"or lost runs are queued again\n")
    assert not gone.path.exists()  # nothing made again in its place


def test_sweep_resume_leaves_waiting_runs_to_the_scheduler_that_lives(tmp_path):
    """fslab sweep resume of a sweep whose runs only wait started a scheduler each time, and said so,
    though one of the store still ran: it says the running one takes them, and starts none."""
    import os

    from fslab.core.flocks import hold_shared
    from fslab.core.runstore import create_run
    from fslab.core.sweeps import save_sweep
    from fslab.execution.scheduler import presence_path

    runs = tmp_path / "runs"
    waiting = create_run(runs, "nca", {"method": "nca"})
    waiting.write_status(state="queued", pid=None, sweep="sweep-20261123-100000-abcd")
    save_sweep(runs, "sweep-20261123-100000-abcd", runs=[waiting.id], method="nca")
    presence_path(runs).parent.mkdir(parents=True)
    held = hold_shared(presence_path(runs))  # as a living scheduler holds it
    try:
        resumed = fslab_here("sweep", "resume", "abcd", cwd=tmp_path)
    finally:
        os.close(held)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == ("sweep-20261123-100000-abcd: no run to queue again; 1 queued run of it waits for a "
                              "slot, and the scheduler running takes it; follow it with: fslab queue\n")
    assert not (runs / "sweeps" / "scheduler.log").exists() and not waiting.claimed()  # none was started


def test_a_requeued_run_keeps_its_creation_time_and_fslab_queue_lists_the_start_order(tmp_path):
    """fslab sweep resume wrote the time of the requeue over a run's `created` (fslab runs --json
    then said the run was made today); and fslab queue listed waiting runs by id, where a
    scheduler starts them by the time they were queued: a sweep's runs, made in one second,
    were shown in the order of their random suffixes."""
    from fslab.core.runstore import Run
    from fslab.execution.scheduler import waiting_runs
    from fslab.execution.sweep import requeue

    runs = tmp_path / "runs"
    made = {"20261123-100000-nca-ffff": ("queued", 100.0), "20261123-100000-nca-0000": ("queued", 101.0),
            "20261123-090000-nca-cccc": ("killed", 50.0)}
    for run_id, (state, created) in made.items():
        (runs / run_id).mkdir(parents=True)
        (runs / run_id / "config.json").write_text('{"method": "nca"}')
        Run(runs / run_id).write_status(state=state, pid=None, created=created)
    old = Run(runs / "20261123-090000-nca-cccc")
    (again,) = requeue(runs, {"runs": [old.id]})
    status = again.status()
    assert status["state"] == "queued" and status["created"] == 50.0 and status["requeued"] > 1e9
    order = ["20261123-100000-nca-ffff", "20261123-100000-nca-0000", old.id]  # queued first, then requeued
    assert [run.id for run in waiting_runs(runs)] == order
    listed = fslab_here("queue", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [row["id"] for row in map(json.loads, listed.stdout.splitlines()) if row["type"] == "run"] == order
    rows = fslab_here("runs", "--json", cwd=tmp_path)
    assert {row["id"]: row["created"] for row in map(json.loads, rows.stdout.splitlines())}[old.id] == 50.0


def test_sweep_resume_with_nothing_to_resume_says_so_and_what_the_runs_are(tmp_path):
    """fslab sweep resume of a sweep whose runs were all completed or still running exited 0
    with "0 runs queued again"; it is refused in one line (exit 2, as fslab resume of a
    completed run is) that counts the runs by state, and writes nothing."""
    from fslab.core.runstore import create_run
    from fslab.core.sweeps import save_sweep

    runs = tmp_path / "runs"
    made = [create_run(runs, "nca", {"method": "nca", "seed": seed, "device": "cpu"}) for seed in range(3)]
    for run, state in zip(made, ("completed", "queued", "completed"), strict=True):
        run.write_status(state=state, pid=None, sweep="sweep-20261123-100000-abcd")
    assert made[1].claim()  # queued, and taken by a scheduler that is starting it
    save_sweep(runs, "sweep-20261123-100000-abcd", runs=[run.id for run in made], method="nca")
    before = [(run.path / "status.json").read_bytes() for run in made]
    resumed = fslab_here("sweep", "resume", "abcd", cwd=tmp_path)
    assert resumed.returncode == 2 and resumed.stdout == "", resumed.stderr
    assert resumed.stderr == ("error: sweep sweep-20261123-100000-abcd has nothing to resume: 2 completed, 1 queued; "
                              "only its failed, killed or lost runs are queued again\n")
    assert [(run.path / "status.json").read_bytes() for run in made] == before


def test_a_part_of_a_sweep_id_names_the_sweep_where_a_sweep_is_taken(tmp_path):
    """A bare part of a sweep id (its suffix, as a user copies it) said "no run 'abcd'" in
    fslab stop, compare, plot and export, whose help promises unique parts of sweep ids, and
    in fslab show, which takes one run, without naming the sweep."""
    from fslab.core.errors import RunNotFound
    from fslab.core.runstore import create_run, find_run
    from fslab.core.sweeps import names_sweep, save_sweep, select_runs

    runs = tmp_path / "runs"
    made = [create_run(runs, "nca", {"method": "nca", "seed": seed}) for seed in range(2)]
    for run in made:
        run.write_status(state="completed", pid=None, sweep="sweep-20261123-100000-abcd")
    save_sweep(runs, "sweep-20261123-100000-abcd", runs=[run.id for run in made], method="nca")
    for ref in ("abcd", "100000-abcd", "sweep-20261123-100000-abcd"):
        chosen = select_runs(runs, [ref], "compare")
        assert names_sweep(runs, ref) and [run.id for run in chosen] == [run.id for run in made]
    suffix = made[0].id[-4:]  # a run's own part comes first
    chosen = select_runs(runs, [suffix], "compare")
    assert not names_sweep(runs, suffix) and [run.id for run in chosen] == [made[0].id]
    # each run once, where first named: fslab export RUN RUN exported it twice and counted 2 runs
    assert [run.id for run in select_runs(runs, [suffix, "abcd", made[0].id], "compare")] == [made[0].id, made[1].id]
    assert not names_sweep(runs, "last") and not names_sweep(runs, "nope")
    with pytest.raises(RunNotFound) as error:
        find_run(runs, "abcd")
    assert str(error.value) == ("'abcd' names no run but sweep sweep-20261123-100000-abcd, and this command takes "
                                "one run; list the sweep's runs with: fslab runs --sweep sweep-20261123-100000-abcd")
    stopped = fslab_here("stop", "abcd", cwd=tmp_path)
    assert stopped.returncode == 2 and stopped.stderr == (
        "error: sweep sweep-20261123-100000-abcd has no queued or running run; nothing to stop\n")
    shown = fslab_here("show", "abcd", cwd=tmp_path)
    assert shown.returncode == 2 and "names no run but sweep sweep-20261123-100000-abcd" in shown.stderr
    save_sweep(runs, "sweep-20261123-110000-ef01", runs=[], method="nca")
    with pytest.raises(RunNotFound) as error:  # a part of two sweep ids said "no run 'sweep-2026'", naming neither
        find_run(runs, "sweep-2026")
    assert str(error.value) == ("'sweep-2026' names no run but 2 sweeps (sweep-20261123-100000-abcd, "
                                "sweep-20261123-110000-ef01), and this command takes one run; list a sweep's "
                                "runs with: fslab runs --sweep SWEEP")


def test_sweep_resume_starts_a_scheduler_for_queued_runs_whose_scheduler_is_gone(tmp_path):
    """A sweep's scheduler killed (or its machine rebooted) left its queued runs waiting for
    good: nothing was failed, killed or lost, so fslab sweep resume queued nothing and started
    no scheduler. It starts one for them, and says so."""
    from fslab.core.runstore import create_run
    from fslab.core.sweeps import save_sweep

    runs = tmp_path / "runs"
    done, waiting, broken = (create_run(runs, "nca", {"method": "nca", "seed": seed}) for seed in (0, 1, 2))
    done.write_status(state="completed", pid=None, sweep="sweep-20261123-100000-abcd")
    waiting.write_status(state="queued", pid=None, sweep="sweep-20261123-100000-abcd")
    broken.write_status(state="killed", pid=None, sweep="sweep-20261123-100000-abcd")
    (broken.path / "config.json").write_text("{bad")
    save_sweep(runs, "sweep-20261123-100000-abcd", runs=[done.id, waiting.id, broken.id], method="nca")
    resumed = fslab("sweep", "resume", "abcd", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr == (f"1 run left as it is, its config.json missing or unreadable (put it back from a copy, "
                              f"then resume it): {broken.id}\n")
    assert resumed.stdout == ("sweep-20261123-100000-abcd: no run to queue again; 1 queued run of it waits for a "
                              "slot, and a scheduler was started for it; follow it with: fslab queue\n")
    # the scheduler takes it (its configuration is no whole one: it then fails, with the reason)
    wait_for(lambda: waiting.claimed(), timeout=60, what="a scheduler to take the waiting run")
    assert done.status()["state"] == "completed"


def test_sweep_resume_given_a_part_of_a_run_id_names_the_run_and_its_sweep(tmp_path):
    """fslab sweep resume 4f2a, the short id of one of the sweep's runs as tables show it, said
    only that it matched no sweep, listing every sweep; it names the run, its sweep and the
    commands that resume either."""
    from fslab.core.runstore import create_run
    from fslab.core.sweeps import save_sweep

    runs = tmp_path / "runs"
    inside, alone = (create_run(runs, "nca", {"method": "nca", "seed": seed}) for seed in (0, 1))
    inside.write_status(state="killed", pid=None, sweep="sweep-20261123-100000-abcd")
    alone.write_status(state="killed", pid=None)
    save_sweep(runs, "sweep-20261123-100000-abcd", runs=[inside.id], method="nca")
    for run in (inside, alone):  # each stopped after a checkpoint: fslab resume goes on from it
        run.checkpoint_path.write_bytes(b"a checkpoint")
    said = fslab_here("sweep", "resume", inside.id[-4:], cwd=tmp_path)
    assert said.returncode == 2 and said.stderr == (
        f"error: '{inside.id[-4:]}' names no sweep but run {inside.id} of sweep sweep-20261123-100000-abcd; resume "
        f"the sweep with: fslab sweep resume sweep-20261123-100000-abcd, or the run alone with: fslab resume "
        f"{inside.id}\n")
    said = fslab_here("sweep", "resume", alone.id, cwd=tmp_path)
    assert said.returncode == 2 and said.stderr == (
        f"error: '{alone.id}' names no sweep but run {alone.id}; resume it with: fslab resume {alone.id}\n")
    assert inside.status()["state"] == alone.status()["state"] == "killed"  # nothing queued
    alone.write_status(state="completed", pid=None)  # fslab resume refuses it: the line named it all the same
    said = fslab_here("sweep", "resume", alone.id, cwd=tmp_path)
    assert said.returncode == 2 and said.stderr == (
        f"error: '{alone.id}' names no sweep but run {alone.id}; the run is completed: start a run like it with: "
        f"fslab run --like {alone.id}\n")
    # killed before its first checkpoint: fslab resume refuses it too (it said to resume it all the same)
    inside.checkpoint_path.unlink()
    inside.write_status(started=1.0)
    said = fslab_here("sweep", "resume", inside.id, cwd=tmp_path)
    assert said.returncode == 2 and said.stderr == (
        f"error: '{inside.id}' names no sweep but run {inside.id} of sweep sweep-20261123-100000-abcd; resume the "
        f"sweep with: fslab sweep resume sweep-20261123-100000-abcd; the run has no checkpoint (it stopped before "
        f"its first epoch ended): start a run like it with: fslab run --like {inside.id}\n")


def test_fslab_queue_says_when_no_scheduler_is_alive_to_start_the_waiting_runs(tmp_path, monkeypatch):
    """A sweep's scheduler killed (or its machine rebooted) left its queued runs waiting for good,
    and fslab queue showed them beside 'slots: cpu-0 free' as if they would start. Every scheduler
    holds a shared lock while it lives; fslab queue says so when none holds it."""
    import signal

    from fslab.core.flocks import is_held
    from fslab.core.runstore import create_run
    from fslab.execution.scheduler import presence_path, scheduler_running, start_scheduler
    from fslab.execution.slots import Slot, lock_slot

    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    run = create_run(runs, "nca", {"method": "nca"})
    run.write_status(sweep="sweep-20261128-100000-abcd")
    assert is_held(presence_path(runs)) is False  # no file yet: no scheduler ever ran
    (runs / ".slots").mkdir()
    slot = lock_slot(runs / ".slots", Slot("cpu-0"))  # the only slot busy: the scheduler waits, run untouched
    scheduler = start_scheduler(runs)
    try:
        wait_for(lambda: scheduler_running(runs), 60, "the scheduler's lock")
        alive = fslab_here("queue", cwd=tmp_path)
        assert alive.returncode == 0 and "no scheduler" not in alive.stdout, alive.stdout
        scheduler.send_signal(signal.SIGKILL)
        scheduler.wait(30)
        assert scheduler_running(runs) is False  # the kernel let go of a killed holder's lock
        gone = fslab_here("queue", cwd=tmp_path)
        assert gone.stdout.splitlines()[-1] == ("no scheduler is running: 1 waiting run will not start until one "
                                                "does; start one with: fslab queue --start")
        assert run.status()["state"] == "queued" and not run.claimed()
        # fslab queue --start starts one and does nothing more (fslab sweep resume also queued failed runs again)
        started = fslab_here("queue", "--start", cwd=tmp_path)
        assert started.stderr == "started a scheduler for 1 waiting run; it logs to runs/sweeps/scheduler.log\n"
        assert "no scheduler" not in started.stdout, started.stdout  # not said of the one just started
        wait_for(lambda: scheduler_running(runs), 60, "the scheduler fslab queue --start started")
        again = fslab_here("queue", "--start", cwd=tmp_path)
        assert again.stderr == "a scheduler is running already: it starts the 1 waiting run as slots free\n"
        assert run.status()["state"] == "queued"  # its slot still busy
    finally:
        if scheduler.poll() is None:
            scheduler.kill()
            scheduler.wait()
        os.close(slot)  # the slot freed: the scheduler --start started trains the run, then exits
    wait_for(lambda: run.status()["state"] not in ("queued", "running") and not scheduler_running(runs), 120,
             "the run started by fslab queue --start")
    assert fslab_here("queue", "--start", cwd=tmp_path).stderr == "no runs are waiting: no scheduler started\n"


# `fslab ARGS` as the real CLI runs it, with a Ctrl-C arriving as the sweep's record is about to be saved.
INTERRUPTED_RECORD = """
import os, signal, sys
import fslab.execution.sweep as sweep

signal.signal(signal.SIGINT, signal.default_int_handler)
def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
sweep.save_sweep = interrupted
sys.argv = ["fslab", *sys.argv[1:]]
from fslab.cli import main
main()
"""


@pytest.mark.parametrize("sent, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_sweep_interrupted_before_its_record_leaves_no_run_queued(project, sent, code):
    """Ctrl-C while fslab sweep created its runs left those created so far queued with no sweep record, for
    whichever scheduler the project started next to train, unasked; and it exited without a word. A SIGTERM
    (timeout, a job's end) killed it outright there, leaving them so, one of them half made."""
    argv = ["sweep", "nca", "--grid", "lr=0.1,0.05,0.02", *TINY, "--epochs", "1"]
    program = INTERRUPTED_RECORD.replace("signal.SIGINT)", f"signal.{sent})")
    result = subprocess.run([sys.executable, "-c", program, *argv], cwd=project, text=True,
                            capture_output=True, timeout=120)
    assert result.returncode == code and result.stderr == (
        "sweep interrupted while queueing: the runs it had created were removed, so nothing of it is left to "
        "train; the same command again queues it all\n")
    assert sorted(p.name for p in (project / "runs").iterdir() if not p.name.startswith(".")) in ([], ["sweeps"])


def test_a_sweep_interrupted_while_submitting_to_slurm_submits_the_rest_on_resume(project):
    """Ctrl-C while fslab sweep --executor slurm submitted its jobs left the rest queued with no job:
    fslab sweep resume took the sweep for a local one (no run to requeue) and started a scheduler on the
    login node for them, and with --executor slurm it submitted none of them."""
    from .test_studies import INTERRUPTED_SUBMIT, fake_slurm_study

    env = fake_slurm_study(project)
    argv = ["sweep", "nca", "--grid", "lr=0.1,0.05,0.02", *TINY, "--epochs", "1", "--executor", "slurm"]
    first = subprocess.run([sys.executable, "-c", INTERRUPTED_SUBMIT, *argv], cwd=project, env=env, text=True,
                           capture_output=True, timeout=120)
    sweep_id = json.loads(next((project / "runs" / "sweeps").glob("sweep-*.json")).read_text())["id"]
    assert first.returncode == 130 and first.stderr == (f"{sweep_id} interrupted while submitting its runs; those "
                                                        f"not yet started go on with: fslab sweep resume {sweep_id}\n")

    def jobs():
        return sorted(str(json.loads((d / "status.json").read_text()).get("slurm_job_id"))
                      for d in (project / "runs").iterdir() if d.name != "sweeps")

    # the first submitted; the second taken for submitting as Ctrl-C came (its job may exist: left); the third not
    assert jobs() == ["100", "None", "None"]
    again = fslab("sweep", "resume", sweep_id, cwd=project, env=env)  # where: as its submitted run went
    assert again.returncode == 0 and again.stdout == f"{sweep_id}: 1 run submitted again as SLURM jobs\n"
    assert jobs() == ["100", "101", "None"] and not (project / "runs" / "sweeps" / "scheduler.log").exists()
    assert (project / "next-job").read_text().strip() == "102"


def test_a_sweep_id_reads_as_its_creation_time_and_a_study_sweep_ends_with_the_study(monkeypatch, tmp_path):
    """fslab sweep and fslab study run both name their sweeps here: the ids sort by creation time,
    which fslab runs --sweep and the listing of sweeps rely on."""
    from types import SimpleNamespace

    import fslab.core.sweeps as sweeps

    when = time.gmtime(1_795_000_000)
    monkeypatch.setattr(sweeps, "time", SimpleNamespace(strftime=lambda fmt: time.strftime(fmt, when)))
    monkeypatch.setattr(sweeps, "secrets", SimpleNamespace(token_hex=lambda n: "ab12"[: 2 * n]))
    assert new_sweep_id(tmp_path) == "sweep-20261118-110640-ab12"
    assert new_sweep_id(tmp_path, "nca-fig2") == "sweep-20261118-110640-ab12-nca-fig2"


def test_sweep_show_and_stop_name_the_commands_that_do_it(project):
    """fslab sweep show SWEEP said "Unknown method 'show'" and fslab sweep stop SWEEP printed the usage
    line: neither said that fslab runs --sweep lists a sweep's runs and fslab stop stops them."""
    for argv, said in ((["show", "last"], "a sweep's runs are listed by: fslab runs --sweep last (last: the newest "
                                           "sweep)"),
                       (["status"], "a sweep's runs are listed by: fslab runs --sweep SWEEP (last: the newest sweep)"),
                       (["stop", "ab12"], "a sweep's queued and running runs are stopped by: fslab stop ab12"),
                       (["delete", "ab12"], "a sweep's ended runs are deleted, its record with them, by: fslab delete "
                                            "ab12")):
        refused = fslab_here("sweep", *argv, cwd=project)
        assert (refused.returncode, refused.stdout) == (2, "")
        assert refused.stderr == f"error: fslab sweep has no '{argv[0]}' (it takes METHOD, or resume SWEEP); {said}\n"
    assert not (project / "runs").exists()


def test_the_records_folder_given_as_a_sweep_is_refused_saying_what_it_holds(tmp_path, monkeypatch):
    """runs/sweeps/ given where only a SWEEP is taken (fslab runs --sweep, fslab sweep resume) said "matches no
    sweep", where fslab stop and compare (RUN|SWEEP) say what the folder holds, as the README says of SWEEP."""
    from pathlib import Path

    from fslab.core.sweeps import save_sweep, sweep_name

    runs = tmp_path / "runs"
    save_sweep(runs, "sweep-20261123-100000-abcd", runs=[], method="nca")
    monkeypatch.chdir(tmp_path)
    for ref in ("runs/sweeps/", "runs/sweeps", str(runs / "sweeps")):
        with pytest.raises(UsageError, match=r"^runs/sweeps/ holds the sweeps' records, not a sweep: give a sweep's "
                                             r"id, or its record's path, runs/sweeps/<id>\.json\. Sweeps: "
                                             r"sweep-20261123-100000-abcd$"):
            sweep_name(Path("runs"), ref)
    for argv in (["runs", "--sweep", "runs/sweeps/"], ["sweep", "resume", "runs/sweeps/"]):
        refused = fslab_here(*argv, cwd=tmp_path)
        assert (refused.returncode, refused.stdout) == (2, ""), argv
        assert refused.stderr.startswith("error: runs/sweeps/ holds the sweeps' records, not a sweep"), argv


def test_a_sweep_record_s_path_names_the_sweep_and_a_run_s_folder_is_named_by_sweep_resume(tmp_path, monkeypatch):
    """runs/sweeps/<id>.json (as the shell completes it) said "no run folder runs/sweeps" in fslab compare and
    stop and "matches no sweep" in fslab sweep resume, as runs/<id> did there instead of naming the run."""
    from fslab.core.runstore import create_run
    from fslab.core.sweeps import names_sweep, save_sweep, select_runs, sweep_name

    runs = tmp_path / "runs"
    made = [create_run(runs, "nca", {"method": "nca", "seed": seed}) for seed in range(2)]
    for run in made:
        run.write_status(state="completed", pid=None, sweep="sweep-20261123-100000-abcd")
    save_sweep(runs, "sweep-20261123-100000-abcd", runs=[run.id for run in made], method="nca")
    record = runs / "sweeps" / "sweep-20261123-100000-abcd.json"
    monkeypatch.chdir(tmp_path)
    for ref in (str(record), f"./{record.relative_to(tmp_path)}"):
        assert sweep_name(runs, ref) == "sweep-20261123-100000-abcd", ref
    assert names_sweep(runs, str(record)) and not names_sweep(runs, str(made[0].path))
    assert [run.id for run in select_runs(runs, [str(record)], "compare")] == [run.id for run in made]
    with pytest.raises(UsageError, match="matches no sweep"):  # a file beside the records is none
        sweep_name(runs, str(runs / "sweeps" / "scheduler.log"))
    listed = fslab_here("runs", "--sweep", "runs/sweeps/sweep-20261123-100000-abcd.json", "--json", cwd=tmp_path)
    assert sorted(json.loads(line)["id"] for line in listed.stdout.splitlines()) == sorted(run.id for run in made)
    stopped = fslab_here("stop", "runs/sweeps/sweep-20261123-100000-abcd.json", cwd=tmp_path)
    assert stopped.returncode == 2 and stopped.stderr == (
        "error: sweep sweep-20261123-100000-abcd has no queued or running run; nothing to stop\n")
    resumed = fslab_here("sweep", "resume", f"runs/{made[0].id}/", cwd=tmp_path)
    assert resumed.returncode == 2 and resumed.stderr.startswith(
        f"error: 'runs/{made[0].id}/' names no sweep but run {made[0].id} of sweep sweep-20261123-100000-abcd; ")


def test_sweep_resume_refuses_the_options_of_a_new_sweep(tmp_path):
    """fslab sweep resume SWEEP --epochs 3 (or --set, --seeds, --fail-fast...) dropped the options
    without a word and resumed the runs as they were queued; it is refused in one line naming what
    resume takes, and nothing is queued again."""
    from fslab.core.runstore import create_run
    from fslab.core.sweeps import save_sweep

    runs = tmp_path / "runs"
    run = create_run(runs, "nca", {"method": "nca", "seed": 0, "device": "cpu"})
    run.write_status(state="killed", pid=None, sweep="sweep-20261123-100000-abcd")
    save_sweep(runs, "sweep-20261123-100000-abcd", runs=[run.id], method="nca")
    before = (run.path / "status.json").read_bytes()
    resumed = fslab_here("sweep", "resume", "abcd", "--epochs", "3", "--set", "train.lr=0.5", cwd=tmp_path)
    assert resumed.returncode == 2 and resumed.stdout == "", resumed.stderr
    assert resumed.stderr == ("error: fslab sweep resume takes only --executor, --slurm and --data-root, not --epochs, "
                              "--set: the runs resume with the settings they were queued with; a new sweep takes them: "
                              "fslab sweep METHOD --epochs ...\n")
    flagged = fslab_here("sweep", "resume", "abcd", "--fail-fast", cwd=tmp_path)
    assert flagged.returncode == 2 and "not --fail-fast:" in flagged.stderr, flagged.stderr
    assert (run.path / "status.json").read_bytes() == before


def test_sweep_stop_eval_and_delete_of_last_name_the_newest_sweep_not_last(tmp_path):
    """fslab sweep rm last said "deleted ... by: fslab delete last", and sweep stop and eval likewise, but in
    fslab delete, stop and eval 'last' is the newest run, not the newest sweep: the line named a command
    that acts on one run. It names the newest sweep's id (listing words keep --sweep last, which is a sweep)."""
    from fslab.core.sweeps import save_sweep

    runs = tmp_path / "runs"
    for sweep_id in ("sweep-20261123-100000-abcd", "sweep-20261124-100000-ef01"):
        save_sweep(runs, sweep_id, runs=[], method="nca")
    for word, command in (("rm", "fslab delete"), ("stop", "fslab stop"), ("eval", "fslab eval")):
        refused = fslab_here("sweep", word, "last", cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.endswith(f"by: {command} sweep-20261124-100000-ef01\n"), refused.stderr
    listed = fslab_here("sweep", "show", "last", cwd=tmp_path)
    assert listed.stderr.endswith("by: fslab runs --sweep last (last: the newest sweep)\n"), listed.stderr


def test_a_sweep_s_runs_wait_for_a_scheduler_only_once_its_record_names_them(project, registry, monkeypatch):
    """A sweep queued each run, then tagged it with the sweep, then wrote the sweep's record: a scheduler of
    the project listing the store meanwhile took runs of no recorded sweep (an interruption then could not
    withdraw them, and a crash left them to train with no record naming them). They are held until the
    record is written, and name their sweep from their first status."""
    from fslab.cli.common import overrides
    from fslab.core.runstore import Run
    from fslab.core.settings import load_settings
    from fslab.execution import sweep
    from fslab.execution.scheduler import waiting_runs

    seen, write_status, save_sweep = [], Run.write_status, sweep.save_sweep

    def a_scheduler_looks(self, **fields):  # what a scheduler listing the store then would start
        write_status(self, **fields)
        seen.append((fields.get("sweep"), [run.id for run in waiting_runs(self.path.parent)]))

    def recorded_then_looks(runs_dir, sweep_id, **record):
        seen.append(("before the record", [run.id for run in waiting_runs(runs_dir)]))
        return save_sweep(runs_dir, sweep_id, **record)

    monkeypatch.setattr(Run, "write_status", a_scheduler_looks)
    monkeypatch.setattr(sweep, "save_sweep", recorded_then_looks)
    base = overrides(None, None, None, None, None, None, None, "cpu", [])
    sweep_id, runs = sweep.create_sweep("nca", parse_grid(["train.lr=0.1,0.2"]), 1, base=base,
                                        settings=load_settings(), registry=registry)
    assert seen == [(sweep_id, []), (sweep_id, []), ("before the record", [])]
    assert [run.id for run in waiting_runs(project / "runs")] == [run.id for run in runs]


def test_a_sweep_whose_record_cannot_be_written_leaves_no_run(project, registry, monkeypatch):
    from fslab.cli.common import overrides
    from fslab.core.settings import load_settings
    from fslab.execution import sweep

    def refused(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sweep, "save_sweep", refused)
    base = overrides(None, None, None, None, None, None, None, "cpu", [])
    with pytest.raises(OSError):
        sweep.create_sweep("nca", parse_grid(["train.lr=0.1,0.2"]), 1, base=base, settings=load_settings(),
                           registry=registry)
    assert not [p for p in (project / "runs").iterdir() if p.name != ".slots"]


def test_sweep_resume_with_nothing_to_resume_names_both_a_lost_submission_and_a_run_held_elsewhere(tmp_path):
    """A sweep whose queued runs were held both by a SLURM submission killed before it recorded its job
    and by a process on another host got a line naming the submission alone: how to free the other run
    was left out. Each is said, in that order."""
    from fslab.core.claims import CLAIM_FILE, HOST
    from fslab.core.runstore import create_run
    from fslab.core.sweeps import save_sweep

    runs = tmp_path / "runs"
    made = [create_run(runs, "nca", {"method": "nca", "seed": seed, "device": "cpu"}) for seed in range(2)]
    for run in made:
        run.write_status(state="queued", pid=None, sweep="sweep-20261123-100000-abcd")
    (made[0].path / CLAIM_FILE).write_text(f"4242 {time.time()} {HOST} 99 slurm\n")
    (made[1].path / CLAIM_FILE).write_text(f"4343 {time.time()} gpu-node-7 99\n")
    save_sweep(runs, "sweep-20261123-100000-abcd", runs=[run.id for run in made], method="nca")
    resumed = fslab_here("sweep", "resume", "abcd", cwd=tmp_path)
    assert resumed.returncode == 2 and resumed.stdout == "", resumed.stderr
    assert resumed.stderr == (
        f"error: sweep sweep-20261123-100000-abcd has nothing to resume: 2 queued; run {made[0].id} is queued, held "
        f"by the SLURM submission of pid 4242 on host {HOST}, which was killed before it recorded the job: if "
        f"squeue --me --name fslab-{made[0].id} lists no job, remove runs/{made[0].id}/.claimed and run fslab sweep "
        f"resume sweep-20261123-100000-abcd again; 1 queued run is held by pid 4343 on host gpu-node-7, which this "
        f"machine cannot tell gone: if it is, remove its runs/ID/.claimed ({made[1].id}) and run fslab sweep resume "
        f"sweep-20261123-100000-abcd again\n")


@pytest.mark.parametrize("raised, code", [(KeyboardInterrupt, 130), ("Terminated", 143)])
def test_a_sweep_interrupted_while_letting_its_runs_go_still_lets_all_go_and_keeps_the_signal(tmp_path, monkeypatch,
                                                                                              raised, code):
    """let_go raises its own SweepInterrupted over the interrupt it met, after letting every run go: the CLI's
    exit code (143 for a SIGTERM) is read from it (interrupted_code), which holds whether a SIGTERM came."""
    from fslab.core import runstore
    from fslab.core.errors import Terminated, interrupted_code
    from fslab.execution.sweep import SweepInterrupted, let_go

    runs = [runstore.create_run(tmp_path, "nca", {"method": "nca", "seed": seed}) for seed in range(3)]
    for run in runs:
        assert run.claim()
    unclaim, raised_once = runstore.Run.unclaim, []

    def interrupted_once(run):
        if not raised_once:
            raised_once.append(run.id)
            raise Terminated if raised == "Terminated" else raised
        unclaim(run)

    monkeypatch.setattr(runstore.Run, "unclaim", interrupted_once)
    with pytest.raises(SweepInterrupted) as caught:
        let_go(runs, "sweep-x")
    assert caught.value.sweep == "sweep-x" and interrupted_code(caught.value) == code
    assert [run.claim() for run in runs] == [True] * 3  # every one let go, the interrupted one on the next try


def test_resume_of_a_queued_sweep_run_takes_a_slot_never_one_beside_the_slots(project, monkeypatch):
    """fslab resume of a run queued in a sweep (one CPU slot, busy) started its worker at once, outside the
    slots: two runs trained where the user allowed one. It is left to the scheduler running, said in one
    line; with none running it starts only in a free slot, holding it as a scheduler's worker does (every slot
    busy: it waits for one, and a scheduler is started for it)."""
    import os

    from fslab.core.flocks import hold_shared
    from fslab.core.runstore import Run
    from fslab.execution import executor
    from fslab.execution.scheduler import presence_path
    from fslab.execution.slots import Slot, lock_slot, slot_in_use

    from .runs_helpers import LONG

    (project / "fslab.toml").write_text("[scheduler]\ngpus = []\ncpu_slots = 1\n")
    schedulers = []  # queued; no scheduler (killed), nor one started by resume: each asked for is named here
    monkeypatch.setattr(executor, "start_scheduler", schedulers.append)
    queued = fslab_here("sweep", "nca", "--seeds", "2", *TINY, "--epochs", LONG, cwd=project)
    assert queued.returncode == 0, queued.stderr
    sweep_id = queued.stdout.split(":")[0]
    first, second = (Run(project / "runs" / r) for r in
                     json.loads((project / "runs" / "sweeps" / f"{sweep_id}.json").read_text())["runs"])
    slots = project / "runs" / ".slots"
    held = lock_slot(slots, Slot("cpu-0"))  # as a worker of the scheduler that was killed holds it
    try:
        busy = fslab_here("resume", first.id, "--detach", cwd=project)
    finally:
        os.close(held)
    assert (busy.returncode, busy.stdout) == (0, (
        f"run {first.id} is queued in {sweep_id} and waits for a slot: every slot is busy and no scheduler was "
        f"running, so one was started, which starts it when a slot frees, in queue order, never beside the slots "
        f"([scheduler] in fslab.toml); follow it with: fslab queue\n")), busy.stderr
    assert first.state() == "queued" and not first.claimed() and not first.status().get("pid")
    assert [p.resolve() for p in schedulers] == [(project / "runs").resolve()] * 2  # the sweep's, then resume's
    try:
        started = fslab_here("resume", first.id, "--detach", cwd=project)
        assert (started.returncode, started.stdout) == (0, f"{first.id}\n"), started.stderr
        wait_for(lambda: first.state() == "running", what="the resumed run to start")
        assert first.status()["slot"] == "cpu-0" and slot_in_use(slots, Slot("cpu-0"))  # its worker holds it
        alive = hold_shared(presence_path(project / "runs"))  # as a living scheduler of the store holds it
        try:
            left = fslab_here("resume", second.id, "--detach", cwd=project)
        finally:
            os.close(alive)
        assert (left.returncode, left.stderr) == (2, (
            f"error: run {second.id} is queued in {sweep_id} and waits for a slot: the scheduler running starts "
            f"it when one frees, in queue order, and resume starts no queued run beside it, outside the slots "
            f"([scheduler] in fslab.toml); follow it with: fslab queue\n"))
        assert second.state() == "queued" and not second.claimed()
    finally:
        fslab_here("stop", first.id, second.id, cwd=project)
    assert first.state() == "killed"


def test_resume_of_a_killed_sweep_run_goes_back_to_the_scheduler_running_never_beside_the_slots(project, monkeypatch):
    """fslab resume of a sweep's killed run started its worker at once, outside the slots, while the sweep's
    scheduler ran: with cpu_slots = 1, two runs trained. Resumed with the scheduler running, it is queued again
    for it, said in one line; with none running, it starts only in a free slot (every slot busy: it is queued
    again and a scheduler is started for it)."""
    from fslab.core.flocks import hold_shared
    from fslab.core.runstore import Run
    from fslab.execution import executor
    from fslab.execution.scheduler import presence_path
    from fslab.execution.slots import Slot, lock_slot, slot_in_use

    from .runs_helpers import LONG

    (project / "fslab.toml").write_text("[scheduler]\ngpus = []\ncpu_slots = 1\n")
    schedulers = []  # queued; no scheduler (killed), nor one started by resume: each asked for is named here
    monkeypatch.setattr(executor, "start_scheduler", schedulers.append)
    queued = fslab_here("sweep", "nca", "--seeds", "1", *TINY, "--epochs", LONG, cwd=project)
    assert queued.returncode == 0, queued.stderr
    sweep_id = queued.stdout.split(":")[0]
    run = Run(project / "runs" / json.loads((project / "runs" / "sweeps" / f"{sweep_id}.json").read_text())["runs"][0])
    slots = project / "runs" / ".slots"

    def killed_after_a_checkpoint():
        wait_for(lambda: run.state() == "running" and run.checkpoint_path.exists(), what="a checkpoint")
        assert run.status()["slot"] == "cpu-0" and slot_in_use(slots, Slot("cpu-0"))  # its worker holds it
        assert fslab_here("stop", run.id, cwd=project).returncode == 0 and run.state() == "killed"

    try:
        assert fslab_here("resume", run.id, "--detach", cwd=project).returncode == 0  # queued: in the free slot
        killed_after_a_checkpoint()
        held = lock_slot(slots, Slot("cpu-0"))  # as another run's worker holds it
        try:
            busy = fslab_here("resume", run.id, "--detach", cwd=project)
        finally:
            os.close(held)
        assert (busy.returncode, busy.stdout) == (0, (
            f"run {run.id} is queued again in {sweep_id}: every slot is busy and no scheduler was running, so one "
            f"was started, which resumes it from its last checkpoint when a slot frees, in queue order, never "
            f"beside the slots ([scheduler] in fslab.toml); follow it with: fslab queue\n")), busy.stderr
        assert (run.state(), run.claimed(), run.status()["executor"]) == ("queued", False, "local")
        assert [p.resolve() for p in schedulers] == [(project / "runs").resolve()] * 2  # the sweep's, then resume's
        assert fslab_here("resume", run.id, "--detach", cwd=project).returncode == 0  # queued: in the free slot
        killed_after_a_checkpoint()
        held = lock_slot(slots, Slot("cpu-0"))
        alive = hold_shared(presence_path(project / "runs"))  # as a living scheduler of the store holds it
        try:
            back = fslab_here("resume", run.id, "--detach", cwd=project)
        finally:
            os.close(alive)
            os.close(held)
        assert (back.returncode, back.stdout) == (0, (
            f"run {run.id} is queued again in {sweep_id}: the scheduler running resumes it from its last checkpoint "
            f"when a slot frees, in queue order, never beside the slots ([scheduler] in fslab.toml); follow it with: "
            f"fslab queue\n")), back.stderr
        status = run.status()
        assert (run.state(), run.claimed(), status.get("pid"), status["executor"]) == ("queued", False, None, "local")
        assert not slot_in_use(slots, Slot("cpu-0"))  # nothing started
    finally:
        fslab_here("stop", run.id, cwd=project)
