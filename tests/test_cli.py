"""The CLI as a user meets it: listings, one-line errors, import hygiene."""

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fslab.core.runstore import create_run

from .runs_helpers import fslab, fslab_here


def test_help_and_version(project):
    result = fslab_here("--help", cwd=project)
    assert result.returncode == 0
    for command in ("run", "runs", "show", "logs", "stop", "plugins"):
        assert command in result.stdout
    assert fslab_here("--version", cwd=project).stdout.strip() == "fslab 0.1.0"


@pytest.mark.parametrize("argv", [["--help"], ["runs"], ["plugins"], ["runs", "--json"], ["export", "--help"]])
def test_listing_commands_do_not_import_torch(project, argv):
    code = textwrap.dedent(f"""
        import sys
        from fslab.cli import app
        try:
            app({argv!r})
        except SystemExit as exit:
            assert not exit.code, exit.code
        heavy = [m for m in ("torch", "numpy", "textual") if m in sys.modules]
        print("HEAVY", heavy)
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout


def test_every_command_is_listed_with_the_module_that_registers_it():
    from fslab import cli

    app = cli.app  # every command registered
    registered = {cli._name(c): c.callback.__module__ for c in app.registered_commands}
    registered |= {g.name: g.typer_instance.registered_commands[0].callback.__module__ for g in app.registered_groups}
    assert registered == {name: f"fslab.cli.{module}" for name, module in cli.COMMANDS.items()}


@pytest.mark.parametrize("command", ["runs", "show", "study", "compare"])
def test_a_command_imports_and_builds_only_its_own_module(project, command):
    """`fslab runs` does not import or build the other commands (~0.1 s of each
    call); what it prints is what the whole app prints."""
    code = textwrap.dedent(f"""
        import sys
        sys.argv = ["fslab", {command!r}, "--help"]
        from fslab.cli import main
        try:
            main()
        except SystemExit as exit:
            assert not exit.code, exit.code
        print("MODULES", sorted({{m for m in sys.modules if m.startswith("fslab.cli.")}}
                              - {{"fslab.cli.common", "fslab.cli.tables", "fslab.cli.typer_compat"}}))
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    from fslab.cli import COMMANDS

    assert result.stdout.splitlines()[-1] == f"MODULES ['fslab.cli.{COMMANDS[command]}']"
    whole = subprocess.run([sys.executable, "-c", code.replace("from fslab.cli import main",
                                                               "from fslab.cli import app, main\napp")],
                           cwd=project, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert whole.stdout.splitlines()[:-1] == result.stdout.splitlines()[:-1]
    assert len(eval(whole.stdout.splitlines()[-1].removeprefix("MODULES "))) == len(set(COMMANDS.values()))


def test_help_leaves_markdown_and_tracebacks_unimported_yet_usable(project):
    """fslab --help gives typer's help module stand-ins for rich.markdown and
    rich.traceback (markdown-it, pygments and rich.pretty cost ~65 ms of start-up);
    each stand-in still builds the real class if typer ever needs it."""
    code = textwrap.dedent("""
        import sys
        sys.argv = ["fslab", "--help"]
        from fslab.cli import main
        try:
            main()
        except SystemExit as exit:
            assert not exit.code, exit.code
        print("LOADED", [m for m in ("markdown_it", "pygments", "rich.pretty", "rich.traceback") if m in sys.modules])
        import typer.rich_utils as help_module
        try:
            1 / 0
        except ZeroDivisionError as exc:
            drawn = help_module.Traceback.from_exception(type(exc), exc, exc.__traceback__)
        print("BUILT", type(drawn).__module__, type(help_module.Markdown("*x*")).__module__)
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stdout and "Commands" in result.stdout
    assert "BUILT rich.traceback rich.markdown" in result.stdout


def test_plugins_lists_every_kind_with_origin(project):
    result = fslab_here("plugins", "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    by_kind = {}
    for row in rows:
        by_kind.setdefault(row["kind"], set()).add(row["name"])
        assert row["plugin"] and row["version"].startswith("fslab ")
    assert {"nca", "protonet"} <= by_kind["loss"]
    assert {"conv4", "resnet12"} <= by_kind["backbone"]
    assert {"iid", "episodic"} <= by_kind["sampler"]
    assert by_kind["evaluator"] >= {"centroid"} and by_kind["dataset"] >= {"synthetic"}
    assert {"nca", "protonet"} <= by_kind["method"]
    table = fslab_here("plugins", "--kind", "loss", cwd=project).stdout
    assert "nca" in table and "resnet12" not in table


def test_plugins_write_parameters_and_recipes_as_set_takes_them():
    from fslab.cli.plugins import _parameters
    from fslab.core.assignments import parse_assignment

    shown = _parameters({"kind": "loss", "params": {"distance": "euclidean", "margin": None, "weight": 1.0},
                         "allowed": {"distance": "one of euclidean, cosine"}})
    assert shown == "distance=euclidean (one of euclidean, cosine), margin=null, weight=1.0"  # not 'euclidean'
    recipe = {"loss": {"name": "nca"}, "eval": {"center": False}, "train": {"milestones": [0.5], "lr": 0.1},
              "per_dataset": {"omniglot": {"sampler": {"ways": 16}, "train": {"milestones": []}}}}
    text = _parameters({"kind": "method", "recipe": recipe})
    assert text == ("loss.name=nca, eval.center=false, train.milestones=[0.5], train.lr=0.1; "
                    "on omniglot: sampler.ways=16, train.milestones=[]")
    general = text.split("; ")[0].split(", ")
    assert [parse_assignment(pair) for pair in general] == [
        (["loss", "name"], "nca"), (["eval", "center"], False), (["train", "milestones"], [0.5]),
        (["train", "lr"], 0.1)]
    assert _parameters({"kind": "loss", "params": {"f": print}}) == "f=<built-in function print>"


@pytest.mark.parametrize(
    "argv, fslab_toml, expected",
    [
        (["run", "ncaa"], "", "Unknown method 'ncaa'. Did you mean 'nca'?"),
        (["run", "nca", "--backbone", "resnet21"], "", "Unknown backbone 'resnet21'. Did you mean 'resnet12'?"),
        (["run", "nca", "--set", "train.epoch=2"], "", "unknown config key 'train.epoch'. Did you mean 'epochs'?"),
        (["run", "nca", "--set", "train.epochs=two"], "", "config key 'train.epochs' must be an integer, got \"two\""),
        (["run", "nca", "--set", "loss.temprature=2"], "", "Did you mean 'temperature'?"),
        (["run", "nca"], "[run.train\nepochs = 2\n", "fslab.toml:1:"),
        (["run", "nca"], "[run]\ndevice = 3\n", "config key 'device' must be auto, cpu, cuda (a GPU) or cuda:N, got 3"),
        # a word key given a boolean names its words, not only "a string"
        (["run", "nca", "--set", "train.channels_last=true"], "",
         "config key 'train.channels_last' must be one of auto, on, off, got true"),
        (["run", "nca"], "[run.train]\ncompile = true\n",
         "config key 'train.compile' must be one of off, default, max-autotune, got true (set by train.compile in "
         "[run] of fslab.toml)"),
        (["run", "nca", "--device", "tpu"], "", "error: --device must be auto, cpu, cuda (a GPU) or cuda:N"),
        # an option's value out of range named the key it sets: config key 'train.processes' for --gpus 0
        (["run", "nca", "--gpus", "0"], "", "error: --gpus must be at least 1, got 0"),
        (["sweep", "nca", "--epochs", "0"], "", "error: --epochs must be a whole number from 1 to 1,000,000, got 0"),
        (["run", "nca", "--lr", "-1"], "", "error: --lr must be > 0 and at most 3.4e38 (float32's largest), got -1.0"),
        (["run", "nca", "--set", "train.processes=0"], "", "error: config key 'train.processes' must be at least 1"),
        (["run", "nca", "--set", "dataset.classes=24"], "",
         "synthetic: need at least 2 classes in each split, got dataset.classes=24, dataset.val_classes=40, "
         "dataset.test_classes=40; dataset.classes counts all three splits, so use dataset.classes >= 82"),
        (["run", "nca"], "[run.dataset]\nclasses = 24\n",  # a plugin's line that names the key names the file too
         "dataset.classes >= 82 (set by dataset.classes in [run] of fslab.toml)"),
        (["run", "nca"], "[run.dataset]\nimage_size = 4\n",
         "synthetic: dataset.image_size must be >= 8 pixels, got 4 (set by dataset.image_size in [run] of fslab.toml)"),
        (["plugins", "--kind", "losses"], "", "Unknown plugin kind 'losses'. Did you mean 'loss'?"),
        (["show", "nothing-like-this"], "", "no run 'nothing-like-this'"),
    ],
)
def test_bad_input_is_one_clear_line_and_writes_nothing(project, argv, fslab_toml, expected):
    if fslab_toml:
        (project / "fslab.toml").write_text(fslab_toml)
    before = create_run(project / "runs", "nca", {"method": "nca"})  # must survive untouched
    result = fslab_here(*argv, cwd=project)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr
    assert [p.name for p in (project / "runs").iterdir()] == [before.id]
    assert json.loads((before.path / "config.json").read_text()) == {"method": "nca"}


def test_runs_and_show_read_the_store(project):
    run = create_run(project / "runs", "nca", {"method": "nca", "backbone": {"name": "conv4"},
                                               "dataset": {"name": "synthetic"}, "seed": 1, "train": {"epochs": 4}})
    run.write_status(state="completed", exit_code=0)
    with open(run.metrics_path, "w") as fh:
        fh.write(json.dumps({"event": "train", "step": 10, "epoch": 2, "loss": 1.25,
                             "positives": 18, "negatives": 48}) + "\n")
        fh.write(json.dumps({"event": "eval", "split": "val", "ways": 5, "shots": 5, "queries": 15,
                             "episodes": 100, "epoch": 2, "accuracy": 0.61, "ci95": 0.02}) + "\n")
    rows = [json.loads(line) for line in fslab_here("runs", "--json", cwd=project).stdout.splitlines()]
    assert len(rows) == 1
    row = rows[0]
    assert ((row["id"], row["state"], row["method"], row["backbone"], row["seed"])
            == (run.id, "completed", "nca", "conv4", 1))
    assert (row["epoch"], row["loss"], row["positives"], row["negatives"]) == (2, 1.25, 18, 48)
    assert row["best_val"] == {"accuracy": 0.61, "ci95": 0.02, "episodes": 100, "epoch": 2}
    table = fslab_here("runs", "--wide", cwd=project).stdout
    assert "61.00±2.00" in table and "18/48" in table
    detail = json.loads(fslab_here("show", run.id[-4:], "--json", cwd=project).stdout)
    assert detail["evaluations"][0]["accuracy"] == 0.61 and detail["config"]["seed"] == 1


def test_runs_says_which_filter_matches_nothing_and_what_the_runs_have(project):
    done = create_run(project / "runs", "nca", {"method": "nca"})
    done.write_status(state="completed", exit_code=0, sweep="20261126-101010-sweep-ab12")
    create_run(project / "runs", "protonet", {"method": "protonet"}).write_status(state="failed", error="x")

    def listed(*argv):
        result = fslab_here("runs", *argv, cwd=project)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert listed("--sweep", "ab12", "--state", "killed") == (
        "no runs match --state killed (the runs have completed, failed)")
    assert listed("--method", "ncaa", "--state", "killed,lost") == (
        "no runs match --state killed,lost (the runs have completed, failed); "
        "--method ncaa (the runs have nca, protonet)")
    # each filter alone matches a run, the two together none
    assert listed("--method", "protonet", "--state", "completed") == (
        "no runs match --state and --method together (each matches some runs alone)")
    assert [json.loads(line)["id"] for line in listed("--sweep", "ab12", "--json").splitlines()] == [done.id]
    refused = fslab_here("runs", "--state", "", cwd=project)
    assert refused.returncode == 2 and refused.stderr == (
        "error: --state needs a value, got ''; leave the option out to list every run\n")
    # an empty item was dropped unsaid, where --grid and --shots refuse one as the typo it is
    refused = fslab_here("runs", "--state", "completed,,failed", cwd=project)
    assert refused.returncode == 2 and refused.stderr == (
        "error: --state takes states separated by commas (e.g. killed,failed), got 'completed,,failed'\n")


def test_runs_refuses_a_sweep_that_no_sweep_id_holds(project):
    """fslab runs --sweep nope listed nothing and exited 0, where fslab compare nope refuses an unknown
    sweep (exit code 2): a mistyped sweep id looked like a sweep without runs to a script."""
    from fslab.core.sweeps import save_sweep

    runs = project / "runs"
    create_run(runs, "nca", {"method": "nca"}).write_status(state="completed", sweep="20261126-101010-sweep-ab12")
    save_sweep(runs, "sweep-20261128-090000-cd34", runs=[], method="nca")
    for argv in (["--sweep", "nope"], ["--sweep", "nope", "--json"], ["--sweep", "nope", "--state", "failed"]):
        refused = fslab_here("runs", *argv, cwd=project)
        assert (refused.returncode, refused.stdout) == (2, "")
        assert refused.stderr == ("error: --sweep nope matches no sweep. Sweeps: 20261126-101010-sweep-ab12, "
                                  "sweep-20261128-090000-cd34\n")
    close = fslab_here("runs", "--sweep", "sweep-20261128-090000-cd35", cwd=project)
    assert close.returncode == 2 and "Did you mean 'sweep-20261128-090000-cd34'?" in close.stderr
    empty = fslab_here("runs", "--sweep", "cd34", cwd=project)  # a sweep with no runs listed: not a typo
    assert (empty.returncode, empty.stdout.strip()) == (0, "no runs match --sweep cd34 (the runs have "
                                                            "20261126-101010-sweep-ab12)")


def test_every_command_that_takes_a_run_takes_the_path_of_its_folder(project):
    """fslab show runs/<id>/ (the shell's completion) said no run 'runs/<id>/' in runs: a path is
    taken where its folder is a run of this store, by every command taking RUN, and one elsewhere
    is one line, exit code 2."""
    run = create_run(project / "runs", "nca", {"method": "nca"})
    run.write_status(state="completed", exit_code=0)
    (run.path / "stdout.log").write_text("the end\n")
    shown_ = fslab_here("show", f"./runs/{run.id}/", "--json", cwd=project)
    assert shown_.returncode == 0, shown_.stderr
    assert json.loads(shown_.stdout)["id"] == run.id
    logs = fslab_here("logs", str(run.path / "stdout.log"), cwd=project)
    assert (logs.returncode, logs.stdout) == (0, "the end\n")
    elsewhere = create_run(project.parent / "other" / "runs", "nca", {"method": "nca"})
    for argv in (["show", str(elsewhere.path)], ["stop", str(elsewhere.path)], ["resume", str(elsewhere.path)],
                 ["compare", str(elsewhere.path)], ["run", "--like", str(elsewhere.path)]):
        refused = fslab_here(*argv, cwd=project)
        assert (refused.returncode, refused.stderr.count("\n")) == (2, 1), argv
        assert refused.stderr.startswith(f"error: '{elsewhere.path}' belongs to a run of another store"), argv
    assert not any(p.name != run.id for p in (project / "runs").iterdir())


def test_runs_of_a_sweep_include_the_ones_whose_status_cannot_be_read(project):
    """fslab runs --sweep matched the sweep id in each run's status.json alone, so a run whose
    status.json was damaged dropped out of its sweep's listing (fslab sweep resume names it); the
    sweep's record lists its runs too."""
    from fslab.core.sweeps import save_sweep

    runs = project / "runs"
    kept, damaged = (create_run(runs, "nca", {"method": "nca", "seed": seed}) for seed in (1, 2))
    other = create_run(runs, "nca", {"method": "nca", "seed": 3})
    for run in (kept, damaged):
        run.write_status(state="completed", exit_code=0, sweep="sweep-20261128-090000-ab12")
    other.write_status(state="completed", exit_code=0)
    (damaged.path / "status.json").write_text('{"state": "compl')
    save_sweep(runs, "sweep-20261128-090000-ab12", runs=[kept.id, damaged.id], method="nca")
    listed = fslab_here("runs", "--sweep", "ab12", "--json", cwd=project)
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert sorted((row["id"], row["state"]) for row in rows) == sorted(
        [(kept.id, "completed"), (damaged.id, "unreadable")])


def test_run_names_from_files_are_not_markup(project):
    run = create_run(project / "runs", "nca", {"method": "[bold red]x[/]", "backbone": {"name": "[link=y]b"}})
    run.write_status(state="failed", error="[red]boom[/red]")
    shown = fslab_here("show", run.id, cwd=project)
    assert "[red]boom[/red]" in shown.stdout
    assert "[bold red]x[/]" in fslab_here("runs", cwd=project).stdout
    # nor are emoji codes (a plugin named smile.py was listed as "local😄")
    run.write_status(state="failed", error="see :smile: and :imp:")
    assert "see :smile: and :imp:" in fslab_here("show", run.id, cwd=project).stdout


def test_a_broken_plugin_is_reported_and_the_cli_keeps_working(project):
    (project / "mine").mkdir()
    (project / "mine" / "broken.py").write_text("raise RuntimeError('half-written plugin')\n")
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    result = fslab_here("plugins", "--kind", "loss", cwd=project)
    assert result.returncode == 1  # the listing is whole, and a script checking the plugins sees the failure
    assert result.stderr.strip() == (f"fslab plugin 'local:broken' failed to load: RuntimeError: half-written plugin; "
                                     f"raised loading {project / 'mine' / 'broken.py'} (a file of plugin_dirs in "
                                     f"fslab.toml)")
    assert "nca" in result.stdout and "protonet" in result.stdout
    assert "failed local:broken: RuntimeError: half-written plugin" in result.stdout
    # the last --kind only, before
    both = fslab_here("plugins", "--kind", "sink", "--kind", "evaluator", "--json", cwd=project)
    assert both.returncode == 1
    assert [json.loads(line)["kind"] for line in both.stdout.splitlines()] == ["sink"] * 3 + ["evaluator"] * len(
        [line for line in fslab_here("plugins", "--kind", "evaluator", "--json", cwd=project).stdout.splitlines()])


LAZY_PLUGIN = """
from fslab.plugin import hookimpl


@hookimpl
def register_backbones(register):
    register("lazynets.nets:SmallConvnet", name="typo", description="d", params={})
    register("lazynets.netz:SmallConvNet", name="module-typo", description="d", params={})
"""


def test_a_lazy_target_that_is_nowhere_is_refused_before_any_run_folder_is_made(project):
    """A plugin's lazy target misspelt ("pkg.mod:Clas") failed the run in its worker, its runs/<id>/
    left behind (a sweep's and a study's runs queued, each to fail so): one line now, nothing created,
    and the module is found and read, never run (it may import torch)."""
    (project / "mine").mkdir()
    (project / "mine" / "nets.py").write_text(LAZY_PLUGIN)
    (project / "lazynets").mkdir()
    (project / "lazynets" / "__init__.py").write_text("raise RuntimeError('run only where a run builds it')\n")
    (project / "lazynets" / "nets.py").write_text("raise RuntimeError('nor this')\n\nclass SmallConvNet:\n    pass\n")
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    typo = ("error: backbone 'typo' from plugin 'local:nets' points at 'lazynets.nets:SmallConvnet', which cannot be "
            "imported: module 'lazynets.nets' has no attribute 'SmallConvnet'. Did you mean "
            "'lazynets.nets:SmallConvNet'?\n")
    for command in (["run", "nca", "--backbone", "typo"], ["sweep", "nca", "--grid", "backbone.name=conv4,typo"],
                    ["study", "run", "nca-table3", "--scale", "quick", "--set", "backbone.name=typo"]):
        refused = fslab_here(*command, cwd=project)
        assert (refused.returncode, refused.stderr) == (1, typo), command
    module = fslab_here("run", "nca", "--backbone", "module-typo", cwd=project)
    assert module.stderr == ("error: backbone 'module-typo' from plugin 'local:nets' points at "
                             "'lazynets.netz:SmallConvNet', which cannot be imported: No module named "
                             "'lazynets.netz'. Did you mean 'lazynets.nets:SmallConvNet'?\n")
    assert not (project / "runs").exists() and "lazynets" not in sys.modules


def test_a_component_of_a_plugin_that_failed_to_load_is_one_line_naming_the_failure(project):
    """fslab run with a loss of a plugin that failed to load printed the load warning, then "Unknown loss
    'boomloss'. Allowed: ... Not among them: ...": two lines of one fault. The error says it now, alone; a
    command that goes on still says the failure, before what it prints."""
    (project / "mine").mkdir()
    (project / "mine" / "boom.py").write_text(
        "import not_installed_anywhere\nfrom fslab.plugin import hookimpl\n\n\n@hookimpl\n"
        "def register_losses(register):\n    register(not_installed_anywhere.loss, name='boomloss', description='d')\n")
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    why = (f"ModuleNotFoundError: No module named 'not_installed_anywhere'; raised loading "
           f"{project / 'mine' / 'boom.py'} (a file of plugin_dirs in fslab.toml)")
    refused = fslab("run", "nca", "--set", "loss.name=boomloss", cwd=project)
    assert (refused.returncode, refused.stderr) == (
        2, f"error: Unknown loss 'boomloss': plugin 'local:boom', whose source names it, failed to load: {why}\n")
    assert not (project / "runs").exists()
    shown = fslab_here("study", "show", "nca-table3", cwd=project)
    assert shown.returncode == 0 and "nca-table3" in shown.stdout
    assert shown.stderr == f"fslab plugin 'local:boom' failed to load: {why}\n"


NEW_LOSS_MODULE = """
from fslab.plugin import hookimpl


@hookimpl
def register_losses(register):
    register(lambda z, labels, support=None: None, name="nca-v2", description="d")
"""


def test_a_loss_of_an_entry_point_added_since_its_package_was_installed_says_to_install_it_again(
        project, tmp_path, monkeypatch):
    """An entry point added to pyproject.toml after pip install -e (a new plugin module) is not in the installed
    metadata, so its loss was "Unknown loss 'nca-v2'" and nothing more: the line now names the entry point and
    the command that refreshes the metadata, the current folder's project (not installed at all) too."""
    source = tmp_path / "source"  # installed editable, before the entry point 'v2' was added
    (source / "fslab_late").mkdir(parents=True)
    (source / "fslab_late" / "__init__.py").write_text("")
    (source / "fslab_late" / "v2.py").write_text(NEW_LOSS_MODULE)
    (source / "pyproject.toml").write_text('[project]\nname = "fslab-late"\nversion = "0.3.0"\n\n'
                                           '[project.entry-points.fslab]\nv2 = "fslab_late.v2"\n')
    info = tmp_path / "site" / "fslab_late-0.3.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fslab-late\nVersion: 0.3.0\n")
    (info / "direct_url.json").write_text(json.dumps({"url": source.as_uri(), "dir_info": {"editable": True}}))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.syspath_prepend(str(source))  # as the editable install's finder puts it
    refused = fslab_here("run", "nca", "--set", "loss.name=nca-v2", cwd=project)
    assert refused.returncode == 2 and refused.stderr.startswith("error: Unknown loss 'nca-v2'. Did you mean 'nca'?")
    assert refused.stderr.endswith(
        f". The entry point 'v2 = \"fslab_late.v2\"' of {source / 'pyproject.toml'} may register it, but the installed "
        f"fslab-late 0.3.0 lacks it (installed before it was added): install it again to refresh its entry points: "
        f"pip install -e {source}\n")
    (project / "pyproject.toml").write_text('[project]\nname = "fslab-never-installed"\n\n'
                                            '[project.entry-points.fslab]\nmine = "mine_losses"\n')
    (project / "mine_losses.py").write_text(NEW_LOSS_MODULE.replace("nca-v2", "mine-loss"))
    here = fslab_here("run", "nca", "--set", "loss.name=mine-loss", cwd=project)
    assert here.returncode == 2 and here.stderr.endswith(
        f"The entry point 'mine = \"mine_losses\"' of {project.resolve() / 'pyproject.toml'} may register it, but "
        f"fslab-never-installed is not installed: install it with: pip install -e .\n")
    assert not (project / "runs").exists()


def test_stopping_a_queued_run_takes_it_out_of_the_queue(project):
    run = create_run(project / "runs", "nca", {"method": "nca"})  # queued, waiting for a scheduler slot
    result = fslab_here("stop", run.id, cwd=project)
    assert result.returncode == 0 and result.stdout.strip() == f"{run.id}: killed"
    assert run.status()["error"] == "stopped while queued"
    assert not run.claim()  # no scheduler can start it any more


def test_stop_takes_several_runs_finds_each_first_and_passes_over_one_that_ended(project):
    runs = project / "runs"
    first, second, ended = (create_run(runs, "nca", {"method": "nca", "seed": seed}) for seed in range(3))
    ended.write_status(state="completed", ended=1.0)
    refused = fslab_here("stop", first.id, "nosuchrun", cwd=project)  # a bad id: nothing stopped
    assert refused.returncode == 2 and refused.stderr.startswith("error: no run 'nosuchrun'")
    assert first.state() == "queued"
    result = fslab_here("stop", first.id, ended.id, second.id, first.id[-4:], cwd=project)  # the first given twice
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{first.id}: killed", f"{second.id}: killed"]
    assert f"not stopped: run {ended.id} is completed, not running; nothing to stop" in result.stderr
    assert first.state() == second.state() == "killed" and ended.state() == "completed"
    none = fslab_here("stop", first.id, ended.id, cwd=project)  # none of them queued or running: the command fails
    assert none.returncode == 2 and none.stdout == ""
    assert none.stderr.splitlines()[-1] == ("error: none of the 2 runs or sweeps given was queued or running; "
                                            "nothing was stopped")


def test_stop_all_is_refused_naming_how_to_stop_every_live_run(project):
    run = create_run(project / "runs", "nca", {"method": "nca"})  # queued
    for argv in (["all"], [run.id, "all"]):
        result = fslab_here("stop", *argv, cwd=project)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr == ("error: fslab stop takes no 'all': name the runs or sweeps to stop, as in: "
                                 "fslab stop $(fslab runs --state queued,running --all -q)\n")
    assert run.state() == "queued"  # nothing stopped


def test_an_id_close_to_a_sweep_s_suggests_the_sweep_where_a_sweep_is_taken(project):
    """fslab stop, delete and eval take sweeps too: 1ae6, a typo of the sweep that ends 1ae5, said only 'no run'."""
    run = create_run(project / "runs", "nca", {"method": "nca"})
    (project / "runs" / "sweeps").mkdir(exist_ok=True)
    (project / "runs" / "sweeps" / "sweep-20261202-035819-1ae5.json").write_text(
        json.dumps({"id": "sweep-20261202-035819-1ae5", "runs": [run.id]}))
    for argv in (["stop", "1ae6"], ["delete", "1ae6", "--yes"], ["eval", "1ae6"],
                 ["export", "1ae6", "--to", "tensorboard"]):
        result = fslab_here(*argv, cwd=project)
        assert result.returncode == 2 and result.stdout == "", argv
        assert result.stderr == ("error: no run or sweep '1ae6' in runs. Did you mean 'sweep-20261202-035819-1ae5'? "
                                 "List them with: fslab runs\n"), argv
    for argv in (["runs", "--sweep", "1ae6"], ["sweep", "resume", "1ae6"]):  # where only a sweep is taken
        result = fslab_here(*argv, cwd=project)
        assert result.returncode == 2, argv
        assert "matches no sweep. Did you mean 'sweep-20261202-035819-1ae5'? Sweeps: " in result.stderr, argv
    one = fslab_here("show", "1ae6", cwd=project)  # a command that takes one run only suggests no sweep
    assert one.stderr == "error: no run '1ae6' in runs. List them with: fslab runs\n"
    assert run.state() == "queued"


def test_runs_ids_cut_at_the_limit_say_so_on_stderr(project):
    """fslab stop $(fslab runs --state queued -q) with 51 queued runs stopped 50, and no word said the 51st was
    left out: the table says 'the newest 50 shown', --ids and --json said nothing. The table said so of
    exactly 50 runs too, none left out."""
    made = [create_run(project / "runs", "nca", {"method": "nca", "seed": seed}) for seed in range(3)]
    for argv in (["-q"], ["--ids"], ["--json"]):
        cut = fslab_here("runs", "--limit", "2", *argv, cwd=project)
        assert cut.returncode == 0 and len(cut.stdout.splitlines()) == 2
        assert cut.stderr == "the newest 2 listed; --all or --limit N for more\n"
    whole = fslab_here("runs", "--all", "-q", cwd=project)
    assert sorted(whole.stdout.split()) == sorted(run.id for run in made) and whole.stderr == ""
    exactly = fslab_here("runs", "--limit", "3", cwd=project, env={**os.environ, "COLUMNS": "200"})  # none left out
    assert fslab_here("runs", "--limit", "3", "-q", cwd=project).stderr == "" and "newest" not in exactly.stdout
    assert "the newest 2 shown; --all or --limit N for more" in fslab_here("runs", "--limit", "2", cwd=project).stdout


def test_sweep_resume_given_no_sweep_or_two_says_what_it_takes(project):
    """It said 'usage: fslab sweep resume SWEEP', naming neither what was wrong nor what a SWEEP is."""
    none = fslab_here("sweep", "resume", cwd=project)
    assert none.returncode == 2 and none.stderr == (
        "error: fslab sweep resume takes one SWEEP (a sweep id, a unique part of one, its record's path or last), "
        "got none; the newest sweep is: fslab sweep resume last\n")
    two = fslab_here("sweep", "resume", "ab12", "cd34", cwd=project)
    assert two.returncode == 2 and "one SWEEP (a sweep id" in two.stderr and ", got 2: ab12 cd34; " in two.stderr


def _commands() -> list[str]:
    from typer.main import get_command

    from fslab.cli import app

    return sorted(get_command(app).commands)


@pytest.mark.parametrize("command", _commands())
def test_every_command_takes_h_and_its_help_reads_as_the_readme(project, command):
    result = fslab_here(command, "-h", cwd=project, env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    usage = next(line for line in result.stdout.splitlines() if "Usage:" in line)
    assert "{" not in usage and "<bool>" not in result.stdout and "SPEC" not in result.stdout
    if command in ("show", "logs", "resume"):
        assert usage.split()[-1] == "RUN"
    if command in ("eval", "delete", "stop"):
        assert usage.split()[-1] == "RUN|SWEEP..."
    if command == "compare":
        assert "knn[k=3]" in result.stdout


def _every_command():
    """Each command of the CLI with its path, subcommands of groups (study, new) included."""
    from typer.main import get_command

    from fslab.cli import app

    def walk(command, path):
        if hasattr(command, "commands"):  # a group (typer's own click classes)
            for name, sub in sorted(command.commands.items()):
                yield from walk(sub, [*path, name])
        else:
            yield path, command
    return list(walk(get_command(app), []))


STYLES = {"bold", "/bold", "dim", "/dim", "red", "/red", "green", "/green", "yellow", "/yellow", "cyan", "/cyan"}


def test_no_bracketed_word_of_a_help_text_is_eaten_as_markup():
    """`[run]` of fslab.toml or `knn[k=3]` in a help text reaches the screen (rich
    takes an unescaped `[word]` for a style and drops it)."""
    from typer.testing import CliRunner

    from fslab.cli import app

    for path, command in _every_command():
        texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
        words = {w for text in texts for w in re.findall(r"\\?\[([^\]\s]+)\]", text) if w not in STYLES}
        shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400"}).output
        flat = " ".join(shown.replace("│", " ").split())
        missing = sorted(w for w in words if f"[{w}]" not in flat)
        assert not missing, f"fslab {' '.join(path)} --help lost {missing}"


def test_help_paragraphs_fill_the_terminal_width():
    """fslab's main reflows every paragraph of a help text to the terminal (typer
    keeps the line breaks of all but the first): at 80 columns no prose line
    ends where the next line's first word would still have fitted, except in a
    paragraph marked to keep its lines (click's \\b)."""
    from typer.testing import CliRunner

    from fslab.cli import app
    from fslab.cli.typer_compat import reflow_help_paragraphs

    reflow_help_paragraphs()
    for path, command in _every_command():
        kept = {re.sub(r"\[/?\w+\]", "", line).strip() for paragraph in (command.help or "").split("\n\n")
                if paragraph.strip().startswith("\b") for line in paragraph.splitlines()}
        shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}).output
        prose = shown.split("╭")[0].splitlines()  # the description, above the boxes of options
        for line, after in zip(prose, prose[1:]):
            if line.strip() and after.strip() and line.strip() not in kept:
                assert len(line.rstrip()) + 1 + len(after.split()[0]) > 79, \
                    f"fslab {' '.join(path)} --help breaks early: {line.strip()!r} / {after.strip()!r}"


def test_each_command_is_listed_on_one_line_of_its_groups_help():
    """A group's --help lists each command by the first paragraph of its help, line breaks kept (typer's
    rich mode): one broken at the source's 120 columns came out as two ragged lines under `fslab --help`."""
    from typer.main import get_command

    from fslab.cli import app

    def every(command, path):
        yield path, command
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            yield from every(sub, [*path, name])

    for path, command in every(get_command(app), []):
        first = (command.short_help or command.help or "").strip().split("\n\n")[0]
        assert "\n" not in first.strip(), f"fslab {' '.join(path)}: its first help paragraph spans lines"


def test_the_readme_cites_papers_not_a_missing_spec():
    assert "SPEC" not in (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_following_a_run_shows_no_unknown_total_and_leaves_the_test_results_to_the_end(project):
    from io import StringIO

    from rich.console import Console

    from fslab.cli.follow import follow

    from .test_tui_helpers import history

    class Ended:  # the worker process, already gone
        def poll(self):
            return 0

    run = create_run(project / "runs", "nca", {"method": "nca"})
    out = StringIO()
    follow(run, Console(file=out, width=200), Ended(), poll=0)  # no start event yet
    assert "None" not in out.getvalue() and "step" not in out.getvalue()
    run.metrics_path.write_text("".join(json.dumps(e) + "\n" for e in history()))
    out = StringIO()
    follow(run, Console(file=out, width=200), Ended(), poll=0)
    text = out.getvalue()
    assert "step 12/12" in text and "val 5-way 5-shot" in text
    assert "test 5-way" not in text  # printed once, by fslab run, from results.json


def test_following_a_run_ends_as_soon_as_its_worker_exits_not_a_poll_later(project):
    """The follower waited a whole poll between reads, and once more after a read that still found
    events: every fslab run's end (its test results) came up to two polls after the worker's exit.
    It waits on the worker instead, and ends at the read that follows the exit."""
    from io import StringIO

    from rich.console import Console

    from fslab.cli.follow import follow

    from .test_tui_helpers import history

    run = create_run(project / "runs", "nca", {"method": "nca"})
    events = "".join(json.dumps(e) + "\n" for e in history())
    writer = ("import sys, time\ntime.sleep(0.5)\n"
              "open(sys.argv[1], 'a').write(sys.argv[2])\n")  # the worker's last events, then its exit
    process = subprocess.Popen([sys.executable, "-c", writer, str(run.metrics_path), events])
    out = StringIO()
    started = time.monotonic()
    follow(run, Console(file=out, width=200), process, poll=30)
    assert time.monotonic() - started < 15  # a poll of 30 s was slept through at least once
    assert process.returncode == 0 and "step 12/12" in out.getvalue()


def test_following_into_a_file_prints_one_plain_line_per_epoch_before_its_validation(project):
    """A log file or a SLURM job's output got nothing from the bar until the end, and then a
    line cut at 80 columns: it gets each epoch's last step, in full, before its validation."""
    from io import StringIO

    from rich.console import Console

    from fslab.cli.follow import follow

    from .test_tui_helpers import history

    class Ended:
        def poll(self):
            return 0

    run = create_run(project / "runs", "nca", {"method": "nca"})
    run.metrics_path.write_text("".join(json.dumps(e) + "\n" for e in history(epochs=3, steps_per_epoch=4)))
    out = StringIO()
    follow(run, Console(file=out, width=80), Ended(), poll=0)
    lines = out.getvalue().splitlines()
    assert [line.split(" step ")[0] if line.startswith("epoch") else line.split(",")[0] for line in lines] == [
        "epoch 1/3", "val 5-way 5-shot", "epoch 2/3", "val 5-way 5-shot", "epoch 3/3", "val 5-way 5-shot"]
    assert lines[0].startswith("epoch 1/3 step 4/12 loss 1.8480 pairs +60/-6000 50 img/s ETA ")
    assert lines[4].startswith("epoch 3/3 step 12/12 loss ") and "…" not in out.getvalue()


def test_following_a_resumed_run_prints_each_validation_once_though_its_file_is_rewritten(project):
    """fslab resume follows a run whose worker cuts metrics.jsonl back to its
    checkpoint and writes on: the validations read before the cut are not printed again."""
    from io import StringIO

    from rich.console import Console

    from fslab.cli.follow import follow

    from .test_tui_helpers import history

    events = history()
    run = create_run(project / "runs", "nca", {"method": "nca"})
    run.metrics_path.write_text("".join(json.dumps(e) + "\n" for e in events))

    lines = [json.dumps(e) + "\n" for e in events]
    cut = max(i for i, e in enumerate(events) if e.get("event") == "eval" and e.get("split") == "val") + 1

    class Resumed:  # the worker: cuts the file back to its checkpoint (after a validation), then writes on
        polls = 0

        def poll(self):
            self.polls += 1
            if self.polls == 2:
                run.metrics_path.write_text("".join(lines[:cut]))
            if self.polls == 3:
                with open(run.metrics_path, "a") as fh:
                    fh.write("".join(lines[cut:]))
            return 0 if self.polls > 3 else None

    out = StringIO()
    follow(run, Console(file=out, width=200), Resumed(), poll=0)
    vals = [line for line in out.getvalue().splitlines() if line.startswith("val ")]
    assert vals and len(vals) == len(set(vals)) == sum(1 for e in events if e.get("event") == "eval"
                                                      and e.get("split") == "val")


def test_following_a_resumed_run_shows_the_eta_of_its_latest_life(project):
    """A resumed run's first life is read in one go: its ETA is at the rate of the steps logged
    since the resume, as the dashboard's is (rich's own estimate took the burst for speed)."""
    import re
    import time
    from io import StringIO

    from rich.console import Console

    from fslab.cli.follow import follow

    class Ended:
        def poll(self):
            return 0

    now = time.time()

    def train(step, at):
        return {"event": "train", "time": at, "step": step, "epoch": 1, "loss": 0.5, "positives": 1,
                "negatives": 2, "images_per_s": 10.0}

    # 40 steps a day ago, a stop, then 20 steps at one a second: 40 steps left, about 40 s
    events = [{"event": "start", "time": now - 86400, "epochs": 2, "total_steps": 100},
              *(train(s, now - 86400 + s) for s in range(1, 41)),
              {"event": "start", "time": now - 21, "epochs": 2, "total_steps": 100},
              *(train(s, now - 60 + s) for s in range(41, 61))]
    run = create_run(project / "runs", "nca", {"method": "nca"})
    run.metrics_path.write_text("".join(json.dumps(e) + "\n" for e in events))
    out = StringIO()
    follow(run, Console(file=out, width=200, force_terminal=True), Ended(), poll=0)
    left = re.findall(r"ETA (\d+):(\d\d)", out.getvalue())[-1]
    assert 35 <= 60 * int(left[0]) + int(left[1]) <= 40, out.getvalue()
    assert "step 60/100" in out.getvalue() and "epoch 1/2" in out.getvalue()


def test_following_a_resumed_run_into_a_file_prints_its_old_steps_with_the_eta_they_had_once(project):
    """fslab resume into a file read a day-old life's lines anew: each step's ETA was taken at
    the time of reading (0:00, a day after the step), and the file, cut back and read again, printed
    an epoch's line a second time, its ETA a little lower. The ETA is now that of the step's time."""
    import time
    from io import StringIO

    from rich.console import Console

    from fslab.cli.follow import follow

    began = time.time() - 86400

    def train(step):  # one step a second, 10 steps an epoch, a day ago
        return {"event": "train", "time": began + step, "step": step, "epoch": (step - 1) // 10 + 1,
                "loss": 0.5, "positives": 1, "negatives": 2, "images_per_s": 10.0}

    events = [{"event": "start", "time": began, "epochs": 3, "total_steps": 30}, *(train(s) for s in range(1, 21))]
    lines = [json.dumps(e) + "\n" for e in events]
    run = create_run(project / "runs", "nca", {"method": "nca"})
    run.metrics_path.write_text("".join(lines))

    class Resumed:  # the worker cuts the file back to its checkpoint (epoch 1) and writes epoch 2 again
        polls = 0

        def poll(self):
            self.polls += 1
            if self.polls == 2:
                run.metrics_path.write_text("".join(lines[:11]))
            if self.polls == 3:
                with open(run.metrics_path, "a") as fh:
                    fh.write("".join(lines[11:]))
            return 0 if self.polls > 3 else None

    out = StringIO()
    follow(run, Console(file=out, width=200), Resumed(), poll=0)
    printed = [line for line in out.getvalue().splitlines() if line.startswith("epoch")]
    # rate from step 1 to 10: a step a second; 20 steps left at step 10, 10 at step 20
    assert [line.split(" ETA ")[1] for line in printed] == ["0:20", "0:10"], printed


def test_following_a_resume_prints_no_step_of_the_life_its_worker_cuts_away(project):
    """fslab resume read metrics.jsonl before its worker cut it back to the checkpoint: the steps after the
    checkpoint, trained again, printed twice, first at the rate of the life that was cut (635 img/s, then
    61 img/s). It now reads the file once the worker has replaced it (or has exited)."""
    import time
    from io import StringIO

    from rich.console import Console

    from fslab.cli.follow import events_file, follow
    from fslab.core.files import atomic_write_text

    began = time.time() - 60

    def train(step, rate):  # 10 steps an epoch
        return {"event": "train", "time": began + step, "step": step, "epoch": (step - 1) // 10 + 1,
                "loss": 0.5, "positives": 1, "negatives": 2, "images_per_s": rate}

    start = {"event": "start", "time": began, "epochs": 2, "total_steps": 20}
    checkpoint = {"event": "checkpoint", "time": began + 10, "epoch": 1, "step": 10, "path": "checkpoints/last.pt"}
    first_life = [start, *(train(s, 10.0) for s in range(1, 11)), checkpoint, *(train(s, 635.0) for s in range(11, 21))]
    kept = [start, *(train(s, 10.0) for s in range(1, 11)), checkpoint]
    second_life = [start, {"event": "resume", "time": began + 30, "epoch": 1, "step": 10},
                   *(train(s, 61.0) for s in range(11, 21))]
    run = create_run(project / "runs", "nca", {"method": "nca"})
    run.metrics_path.write_text("".join(json.dumps(e) + "\n" for e in first_life))
    before = events_file(run)

    class Resumed:  # the worker: imports torch for a while, then cuts the file back and trains epoch 2 again
        polls = 0

        def poll(self):
            self.polls += 1
            if self.polls == 4:
                atomic_write_text(run.metrics_path, "".join(json.dumps(e) + "\n" for e in kept))
            if self.polls == 5:
                with open(run.metrics_path, "a") as fh:
                    fh.write("".join(json.dumps(e) + "\n" for e in second_life))
            return 0 if self.polls > 5 else None

    out = StringIO()
    follow(run, Console(file=out, width=200), Resumed(), poll=0, until_replaced=before)
    printed = [line for line in out.getvalue().splitlines() if line.startswith("epoch")]
    assert [line.split(" img/s")[0].rsplit(" ", 1)[1] for line in printed] == ["10", "61"], printed


def test_a_run_stopped_while_queued_says_it_never_started(project):
    run = create_run(project / "runs", "nca", {"method": "nca", "seed": 0})
    stopped = fslab_here("stop", run.id, cwd=project)
    assert stopped.returncode == 0 and stopped.stdout == f"{run.id}: killed\n"
    assert stopped.stderr == (f"no checkpoint yet (it stopped before it started); start it again with: "
                              f"fslab run --like {run.id}\n")
    shown = fslab_here("show", run.id, cwd=project).stdout
    assert "seed 0" in shown and "pid" not in shown  # it never had a worker
    titled = fslab_here("runs", "--evaluator", "knn[k=3]", cwd=project, env={**os.environ, "COLUMNS": "200"}).stdout
    assert titled.splitlines()[0].strip() == "test: knn[k=3]"  # not read as markup


def test_show_names_the_settings_that_are_not_defaults_as_set_takes_them(project, registry):
    from fslab.core.assignments import parse_assignment
    from fslab.core.config import resolve
    from fslab.core.settings import Settings

    config = resolve("nca", registry=registry, settings=Settings(), overrides=[
        {"train": {"epochs": 3}, "loss": {"temperature": 0.5}, "backbone": {"name": "conv4"}}])
    run = create_run(project / "runs", "nca", config)
    lines = fslab_here("show", run.id, cwd=project, env={**os.environ, "COLUMNS": "1000"}).stdout.splitlines()
    (line,) = [x for x in lines if x.startswith("settings ")]
    pairs = {".".join(key): value for key, value in map(parse_assignment, line.split(": ", 1)[1].split(", "))}
    assert pairs["train.epochs"] == 3 and pairs["loss.temperature"] == 0.5 and pairs["backbone.name"] == "conv4"
    assert pairs["train.batch_size"] == 128  # the built-in dataset's own, not fslab's 512
    assert "loss.pair_fraction" not in pairs and "backbone.hidden" not in pairs  # the plugins' defaults
    assert "train.momentum" not in pairs and "seed" not in pairs and "method" not in pairs


def test_show_says_how_the_run_computed_as_its_latest_start_resolved_it(project):
    """fslab show named train.precision and the others only where they differ from the defaults, as asked:
    what auto became (bf16 on a GPU, fp32 on the CPU) was in metrics.jsonl alone."""
    run = create_run(project / "runs", "nca", {"method": "nca"})
    start = {"event": "start", "device": "cpu", "epochs": 1, "steps_per_epoch": 1, "train_images": 8}
    numerics = {"precision": "fp32", "eval_precision": "fp32", "channels_last": False, "compile": "off",
                "tf32": False, "deterministic": False}
    resumed = {**numerics, "precision": "bf16", "channels_last": True, "tf32": True, "compile": "default",
               "deterministic": True}
    run.metrics_path.write_text(json.dumps(start) + "\n")  # a run of fslab 0.1 recorded none: no line
    assert "computed" not in fslab_here("show", run.id, cwd=project).stdout
    run.metrics_path.write_text("".join(json.dumps(e) + "\n" for e in (
        {**start, **numerics}, {**start, "device": "cuda", **resumed, "eval_precision": "fp16"})))
    lines = fslab_here("show", run.id, cwd=project, env={**os.environ, "COLUMNS": "1000"}).stdout.splitlines()
    assert [x for x in lines if x.startswith("computed")] == [
        "computed on cuda in bf16 (features in fp16), channels-last, TF32, compiled (default), deterministic"]


def test_a_worker_ended_by_a_signal_is_named_and_a_name_in_other_case_is_suggested(project):
    from fslab.cli.launch import _signal_text
    from fslab.core.errors import did_you_mean

    assert _signal_text(-9) == "the worker was killed by SIGKILL (out of memory, or another program)"
    assert _signal_text(-15) == "the worker was ended by SIGTERM"
    assert _signal_text(1) == _signal_text(None) == ""
    assert did_you_mean("NCA", ["nca", "protonet"]) == " Did you mean 'nca'?"
    create_run(project / "runs", "nca", {"method": "nca"})
    empty = fslab_here("show", " ", cwd=project)
    assert empty.returncode != 0 and empty.stderr == (
        "error: an empty run id names no run; give a run id, a unique part of one, or 'last'\n")


def test_logs_of_a_run_without_output_says_so(project):
    run = create_run(project / "runs", "nca", {"method": "nca"})
    result = fslab_here("logs", run.id, cwd=project)
    assert result.returncode == 0 and result.stdout == ""
    assert result.stderr == (f"{run.id} has no stdout.log yet (its worker has not started, or wrote nothing "
                             f"there)\n")


def test_logs_tail_prints_the_last_lines_as_tail_n_does(project):
    """fslab logs printed a 240-epoch run's whole log; --tail N (-n N) prints its last N lines, a last
    line still being written counted as one, the way tail -n does; a negative N is one line."""
    import subprocess

    run = create_run(project / "runs", "nca", {"method": "nca"})
    lines = [f"epoch {i} " + "x" * (i * 2500 % 90001) for i in range(1, 60)]  # some longer than a 64 KiB read
    for text in ("\n".join(lines) + "\n", "\n".join(lines)):
        (run.path / "stdout.log").write_text(text)
        for argv, n in ((["-n", "3"], 3), (["--tail", "59"], 59), (["--tail", "500"], 500), (["-n", "0"], 0)):
            result = fslab_here("logs", run.id, *argv, cwd=project)
            expected = subprocess.run(["tail", "-n", str(n), str(run.path / "stdout.log")], capture_output=True,
                                      text=True).stdout
            assert result.returncode == 0 and result.stdout == expected, argv
    assert fslab_here("logs", run.id, cwd=project).stdout == "\n".join(lines)
    bad = fslab_here("logs", run.id, "-n", "-2", cwd=project)
    assert bad.returncode == 2 and bad.stderr == (
        "error: --tail must be 0 or more lines, got -2; leave it out for the whole log\n")


def test_show_and_logs_of_a_slurm_run_name_its_job_and_where_slurm_logs(project):
    # a SLURM job that died before its worker started left the run queued with no output: fslab logs said
    # only that the worker had not started, and fslab show named neither the job nor runs/<id>/slurm/
    run = create_run(project / "runs", "nca", {"method": "nca"})
    run.write_status(executor="slurm", slurm_job_id="4242", requeues=2)
    shown = fslab_here("show", run.id, cwd=project, env={**os.environ, "COLUMNS": "1000"}).stdout
    assert f"SLURM job 4242, requeued 2 times; submitit's files and SLURM's logs: runs/{run.id}/slurm/" in shown
    result = fslab_here("logs", run.id, cwd=project)
    assert result.returncode == 0 and result.stderr == (
        f"{run.id} has no stdout.log yet (its worker has not started, or wrote nothing there; its SLURM job 4242 "
        f"writes its own logs in runs/{run.id}/slurm/)\n")


def test_no_help_label_is_a_python_type():
    """An option's label in --help is a word the README uses (KIND, NAME, KEY=VALUE), never
    typer's name of the Python type (`fslab plugins --kind <list[str]>`)."""
    from typer.testing import CliRunner

    from fslab.cli import app

    for path, _command in _every_command():
        shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400"}).output
        assert "list[" not in shown and "<list" not in shown, f"fslab {' '.join(path)} --help: {shown}"


@pytest.mark.parametrize("command", ["compare", "plot"])
def test_episode_shape_defaults_in_help_name_the_configurations(command):
    """--ways and --queries default to the shape the runs' scores share, else to the eval.ways and
    eval.queries all their configurations have (fslab.reports.compare.scored_shape), before the
    papers' 5-way, 15 queries: the help said 'else 5' straight after the scores."""
    from typer.testing import CliRunner

    from fslab.cli import app

    shown = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "400"}).output
    flat = " ".join(shown.replace("│", " ").split())
    assert "else the ways their scores, then their configurations (eval.ways), all have; else 5" in flat
    assert "else the queries their scores, then their configurations (eval.queries), all have: --ways 20" in flat
    assert "; else 15)" in flat


def test_a_terminal_that_cannot_show_a_path_s_letters_gets_them_written_out_not_a_traceback(tmp_path):
    """A project in "données 日本/" shown where stdout is ASCII (PYTHONIOENCODING=ascii, a latin-1 locale):
    fslab show ended in a UnicodeEncodeError traceback."""
    from .test_tui_helpers import complete_config, history, write_run

    root = str(tmp_path / "données 日本")
    folder = write_run(tmp_path / "runs", "20260101-000000-nca-abcd", events=history(),
                       cfg=complete_config(dataset={"name": "miniimagenet", "root": root}))
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    env.pop("FSLAB_CONFIG", None)
    shown = fslab("show", folder.name, cwd=tmp_path, env=env)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr[-2000:]
    assert f"dataset.root={tmp_path}/donn\\xe9es \\u65e5\\u672c" in shown.stdout


def test_show_says_which_data_root_fslab_filled_in_and_lists_one_that_was_set(project):
    """fslab show listed dataset.root among the settings 'not fslab's defaults' for every run, the one
    fslab fills in where none was set (data/<dataset>, or [data_roots] of fslab.toml) too: it read as set.
    And it named data/synthetic for a run of synthetic, which reads no files and never makes that folder:
    an earlier fslab saved it; none is named now, nor for a run saved with none."""
    from .test_tui_helpers import complete_config, history, write_run

    (project / "fslab.toml").write_text('[data_roots]\nomniglot = "glyphs"\n')
    roots = {"20260101-000000-nca-aaaa": ("miniimagenet", project / "data" / "miniimagenet"),
             "20260101-000001-nca-bbbb": ("omniglot", project / "glyphs"),
             "20260101-000002-nca-cccc": ("miniimagenet", project / "mine"),
             "20260101-000003-nca-dddd": ("synthetic", project / "data" / "synthetic"),
             "20260101-000004-nca-eeee": ("synthetic", "")}
    for name, (dataset, root) in roots.items():
        write_run(project / "runs", name, events=history(),
                  cfg=complete_config(dataset={"name": dataset, "root": str(root)}))
        if dataset != "synthetic":
            Path(root).mkdir(parents=True, exist_ok=True)  # on this machine (one that is not is marked so: below)

    def lines(ref):
        shown_ = fslab_here("show", ref, cwd=project, env={**os.environ, "COLUMNS": "1000"})
        assert shown_.returncode == 0, shown_.stderr
        return shown_.stdout.splitlines()

    default, mapped, set_ = lines("aaaa"), lines("bbbb"), lines("cccc")
    filled = "as fslab fills it in where none is set"
    assert f"data root {project}/data/miniimagenet ({filled}: fslab's default, data/miniimagenet)" in default
    assert f"data root {project}/glyphs ({filled}: [data_roots] of fslab.toml)" in mapped
    assert not any("dataset.root=" in line for line in default + mapped)
    assert any(f"dataset.root={project}/mine" in line for line in set_)
    assert not any(line.startswith("data root") for line in set_)
    for synthetic in (lines("dddd"), lines("eeee")):
        assert not any("data root" in line or "dataset.root" in line for line in synthetic), synthetic


def test_show_marks_a_data_root_that_is_not_on_this_machine(project):
    """A store rsynced to a machine whose data lies elsewhere (or data moved since): fslab show named the run's
    data root as if it were there, which fslab resume and eval then refused; it marks it, in --json too."""
    from .test_tui_helpers import complete_config, history, write_run

    (project / "here").mkdir()
    roots = {"20260101-000000-nca-aaaa": ("miniimagenet", project / "elsewhere"),  # set, and gone
             "20260101-000001-nca-bbbb": ("miniimagenet", project / "data" / "miniimagenet"),  # filled in, gone
             "20260101-000002-nca-cccc": ("miniimagenet", project / "here"),
             "20260101-000003-nca-dddd": ("synthetic", project / "data" / "synthetic")}  # reads no files
    for name, (dataset, root) in roots.items():
        write_run(project / "runs", name, events=history(),
                  cfg=complete_config(dataset={"name": dataset, "root": str(root)}))

    def show(*args):
        shown_ = fslab_here("show", *args, cwd=project, env={**os.environ, "COLUMNS": "1000"})
        assert shown_.returncode == 0, shown_.stderr
        return shown_.stdout

    assert f"dataset.root={project}/elsewhere (not on this machine)," in show("aaaa")
    assert (f"data root {project}/data/miniimagenet (not on this machine) (as fslab fills it in where none is set: "
            f"fslab's default, data/miniimagenet)") in show("bbbb").splitlines()
    assert "not on this machine" not in show("cccc") + show("dddd")
    assert [json.loads(show(ref, "--json"))["data_root_gone"] for ref in ("aaaa", "bbbb", "cccc", "dddd")] == [
        True, True, False, False]


@pytest.mark.slow
def test_a_run_under_an_ascii_locale_completes_and_logs_in_utf8(tmp_path):
    """The worker's stdout.log took the locale's encoding: under an ASCII one the first evaluation's
    line (68.33 ± 5.07%) failed the run with a UnicodeEncodeError."""
    from .runs_helpers import TINY

    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    env.pop("FSLAB_CONFIG", None)
    done = fslab("run", "nca", *TINY, "--epochs", "1", "--set", "eval.val_episodes=5", "--set", "eval.test_episodes=5",
                 cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").glob("*-nca-*")
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"
    assert "±" in (run_dir / "stdout.log").read_text(encoding="utf-8")


def test_show_names_a_pid_only_for_a_worker_that_lives_or_died_unrecorded(project):
    """fslab show printed 'pid N' for a completed run, whose worker ended long ago (N may be another
    process's now); a lost run's pid stays (the worker that died)."""
    import time

    done = create_run(project / "runs", "nca", {"method": "nca"})
    done.write_status(state="completed", pid=4_000_000, host="elsewhere", ended=time.time())
    lost = create_run(project / "runs", "nca", {"method": "nca", "seed": 1})
    lost.write_status(state="running", pid=4_000_001, host="elsewhere", heartbeat=time.time() - 3600)
    os.utime(lost.path / "status.json", (time.time() - 3600,) * 2)  # unwritten since: its host's worker is gone
    for run, state, pid in ((done, "completed", None), (lost, "lost", 4_000_001)):
        shown = fslab_here("show", run.id, cwd=project)
        assert shown.returncode == 0 and f"  {state}  " in shown.stdout.splitlines()[0], shown.stdout
        second = shown.stdout.splitlines()[1]
        assert second.endswith(f", pid {pid}") if pid else "pid" not in second, second


def test_a_command_given_no_run_says_so_in_one_line(project):
    """fslab delete $(fslab runs --state failed -q), where no run failed, passes no id at all: typer's
    "Missing argument 'RUN|SWEEP'" gave no reason. Each command that takes runs says why."""
    run = create_run(project / "runs", "nca", {"method": "nca", "seed": 0})
    run.write_status(state="completed")
    listed = fslab_here("runs", "--state", "failed", "-q", cwd=project)
    assert (listed.returncode, listed.stdout) == (0, "")
    for command in (["delete", "--yes"], ["eval"], ["compare"], ["export", "--to", "tensorboard"], ["plot", "epoch"]):
        result = fslab_here(*command, *listed.stdout.split(), cwd=project)
        assert (result.returncode, result.stdout) == (2, ""), command
        assert result.stderr == (f"error: no run named: fslab {command[0]} takes RUN|SWEEP... (run ids, unique "
                                 "parts of them, 'last', runs' folders, sweep ids or 'all'), and a $(fslab runs ... "
                                 "-q) that listed no run passes none; nothing was done (list the runs with: "
                                 "fslab runs)\n")
    stop = "RUN|SWEEP... (run ids, unique parts of them, 'last', runs' folders or sweep ids)"  # no 'all'
    for command, takes in (("stop", stop), ("show", "RUN (a run id, a unique part of one, 'last' or a run's folder)")):
        result = fslab_here(command, cwd=project)
        assert result.returncode == 2
        assert result.stderr.startswith(f"error: no run named: fslab {command} takes {takes}, and a $("), command
    assert run.path.is_dir()
    other = fslab_here("study", "show", cwd=project)  # an argument that names no run: typer's line, as before
    assert other.stderr.startswith("error: Missing argument 'STUDY'.")


def _readme_commands(text: str) -> list[str]:
    """Every fslab command line a document shows: in `code` and in code blocks, one inside
    $(...) on its own, the first of alternatives written `run\\|sweep`."""
    spans = re.findall(r"`(fslab [^`]+)`", text)
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        spans += [line.strip() for line in block.splitlines() if line.strip().startswith("fslab ")]
    lines = []
    for span in spans:
        span = re.sub(r"\s+", " ", span.split("#")[0])
        inner = re.findall(r"\$\((fslab [^)]*)\)", span)
        lines += [re.sub(r"\$\([^)]*\)", "", span), *inner]
    return [re.sub(r"(\w)\\?\|[\w|\\]+", r"\1", line) for line in lines]


@pytest.mark.parametrize("document", ["README.md", "docs/commands.md", "docs/plugins.md"])
def test_every_option_the_documents_show_is_one_of_its_command(document):
    """A `fslab COMMAND --option` of the README or the plugin guide that COMMAND does not take sends a
    reader who copies it to an error: each option shown is checked against the command's own."""
    from typer.main import get_command

    from fslab.cli import app

    root = get_command(app)
    text = (Path(__file__).resolve().parent.parent / document).read_text()
    unknown = set()
    for line in _readme_commands(text):
        command, path = root, []
        for word in line.split()[1:]:
            if word not in getattr(command, "commands", {}):
                break
            command, path = command.commands[word], [*path, word]
        names = {"--help", "-h"} | {name for param in command.params
                                    for name in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]}
        unknown |= {(" ".join(path), option) for option in re.findall(r"(?<!\S)(--?[a-z][\w-]*)", line)
                    if option not in names}
    assert not unknown, f"{document} shows options its commands do not take: {sorted(unknown)}"


@pytest.mark.parametrize("argv", [["plugins"], ["plugins", "--json"], ["runs"], ["runs", "--json"], ["study", "list"]])
def test_a_listing_whose_reader_went_away_ends_quietly_as_unix_tools_do(project, argv):
    """`fslab plugins | head -1` exited 1 without a word (typer's and rich's handling of a broken pipe), the
    code of a fault; it ends as `git log | head -1` does, 141 (128 + SIGPIPE), and still says nothing."""
    create_run(project / "runs", "nca", {"method": "nca", "seed": 0})  # `fslab runs` has a line to write
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    try:
        result = subprocess.run([sys.executable, "-m", "fslab", *argv], cwd=project, stdout=write,
                                stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert (result.returncode, result.stderr) == (141, "")


@pytest.mark.parametrize("interrupted", ["the command line's own imports", "the command's module"])
def test_a_ctrl_c_while_the_command_line_loads_exits_130_without_a_traceback(project, interrupted):
    """Ctrl-C in the first half second of `fslab compare` or `fslab runs` (typer, rich, the command's module
    still importing) printed a KeyboardInterrupt traceback of thirty lines; in the command, typer's 130."""
    hook = ("import builtins\nreal = builtins.__import__\n"
            "def imported(name, *args, **kwargs):\n"
            "    if name == 'typer':\n        raise KeyboardInterrupt\n    return real(name, *args, **kwargs)\n"
            "builtins.__import__ = imported\n") if interrupted == "the command line's own imports" else (
            "import importlib\nreal = importlib.import_module\n"
            "def imported(name, *args):\n"
            "    if name == 'fslab.cli.runs':\n        raise KeyboardInterrupt\n    return real(name, *args)\n"
            "importlib.import_module = imported\n")
    code = hook + "import sys\nsys.argv = ['fslab', 'runs']\nfrom fslab.__main__ import main\nmain()\n"
    result = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stderr) == (130, "")


def test_an_option_that_contradicts_the_same_command_s_set_is_refused_not_overruled(tmp_path):
    """fslab run nca --lr 0.1 --set train.lr=0.2 trained at 0.2 without a word (--set the later layer), where
    the same --lr against a sweep file's [set] is refused; a value given twice alike is no contradiction."""
    from fslab.cli.common import overrides
    from fslab.core.errors import UsageError

    with pytest.raises(UsageError, match=r"^--lr 0\.1 contradicts --set train\.lr=0\.2; give it in one of the two$"):
        overrides(None, None, None, None, None, 0.1, None, None, ["train.lr=0.2"])
    assert overrides(None, None, "d1", None, None, 0.1, None, None, ["train.lr=0.1", "dataset.root=./d1/"])
    for command, line in [(["run", "nca", "--seed", "1", "--set", "seed=2"], "--seed 1 contradicts --set seed=2"),
                          (["run", "nca", "--backbone", "conv4", "--set", "backbone.name=resnet12"],
                           '--backbone conv4 contradicts --set backbone.name=resnet12'),
                          (["sweep", "nca", "--epochs", "2", "--set", "train.epochs=3"],
                           "--epochs 2 contradicts --set train.epochs=3")]:
        refused = fslab_here(*command, cwd=tmp_path)
        assert (refused.returncode, refused.stderr) == (2, f"error: {line}; give it in one of the two\n")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
