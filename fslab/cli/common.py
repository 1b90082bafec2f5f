"""What every command module shares: the typer app, the consoles, the options
``fslab run`` and ``fslab sweep`` have in common, and small formatting helpers.
Heavy modules (torch) are never imported here."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console, RenderHook
from rich.markup import escape

from fslab import __version__
from fslab.cli.typer_compat import adjust_typer
from fslab.core.config import PRECISIONS
from fslab.core.errors import UsageError
from fslab.core.text import printable

app = typer.Typer(
    rich_markup_mode="rich",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command inherits them
    help="fslab: few-shot learning runs from the command line. Start with [bold]fslab run nca[/bold].",
)


adjust_typer()  # help labels as the README writes them; plain values converted without pydantic
# Tables fit the terminal, or COLUMNS (else 80) when the output is not one; --wide
# prints them whole (fslab.cli.tables). Lines of text are never wrapped.
console = Console(soft_wrap=True, emoji=False)
err_console = Console(stderr=True, soft_wrap=True, emoji=False)


class _SayFirst(RenderHook):
    """The plugins' load failures not said yet (:func:`say_load_failures`), said before anything either
    console prints: rich calls it as it renders."""

    def process_renderables(self, renderables):
        say_load_failures()
        return renderables


for _shared in (console, err_console):
    _shared.push_render_hook(_SayFirst())

# -- shell completion: names from the registry and ids from the run store ----------
# The shell runs fslab on every TAB, so these import no torch and print nothing
# on failure: a broken plugin or an unreadable store just completes less.


def _matching(words: list[str], incomplete: str) -> list[str]:
    """The words that start with what was typed (typer keeps no others)."""
    return [w for w in words if w.startswith(incomplete)]


def _listing():
    """The plugin listing completion reads, loaded quietly: where it is loaded anew (a plugin
    changed), what a plugin prints or warns as it is imported is dropped (its stdout would be
    offered to the shell as a word, its stderr would land on the command line being typed). An
    fslab.toml that does not parse (being edited) leaves out only its plugin folders."""
    import contextlib
    import io
    import warnings

    from fslab.core.errors import ConfigError
    from fslab.core.listing import plugin_listing
    from fslab.core.settings import load_settings

    try:
        folders = load_settings().plugin_dirs
    except ConfigError:
        folders = ()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plugin_listing(folders)


def names_of(kind: str):
    """A completion function for names of registered ``kind`` components."""
    def complete(incomplete: str) -> list[str]:
        try:
            return _matching(_listing().names(kind), incomplete)
        except Exception:
            return []
    return complete


def run_ids(incomplete: str) -> list[str]:
    """Completion of RUN: ``last``, and the store's run ids, newest first (as listings order them: only the
    runs stamped within about a day of the newest have their status read)."""
    try:
        from fslab.core.runstore import newest_first, run_names

        runs_dir = settings().runs_dir
        return _matching(["last", *newest_first(runs_dir, run_names(runs_dir))], incomplete)
    except Exception:
        return []


def runs_in(*states: str):
    """A completion function for RUN where a command takes runs in ``states`` only (fslab resume:
    killed, lost or failed ones): ``last`` where the run it names (as the command finds it) is in one
    of them, then those run ids, newest first. Only the runs whose id starts with what was typed are
    read, each its status.json (and a live one's lock)."""
    def complete(incomplete: str) -> list[str]:
        try:
            from fslab.core.runstore import Run, newest_first, run_names

            runs_dir = settings().runs_dir
            return _matching(["last"] if _last_in(runs_dir, states) else [], incomplete) + [
                name for name in newest_first(runs_dir, _matching(run_names(runs_dir), incomplete))
                if Run(runs_dir / name).state() in states]
        except Exception:
            return []
    return complete


def _last_in(runs_dir, states: tuple[str, ...]) -> bool:
    """Whether ``last`` names a run in ``states``: the newest run, as find_run resolves it for the command."""
    from fslab.core.errors import RunNotFound
    from fslab.core.runstore import find_run

    try:
        return find_run(runs_dir, "last").state() in states
    except RunNotFound:  # no runs yet
        return False


def _sweep_ids(incomplete: str) -> list[str]:
    """The store's sweep ids, newest first (a record without one offers none: not 'None')."""
    try:
        from fslab.core.sweeps import sweep_records

        records = reversed(sweep_records(settings().runs_dir))
        return _matching([r["id"] for r in records if isinstance(r.get("id"), str)], incomplete)
    except Exception:
        return []


def sweep_ids(incomplete: str) -> list[str]:
    """Completion of SWEEP: ``last`` (the newest sweep), then the sweep ids."""
    return _matching(["last"], incomplete) + _sweep_ids(incomplete)


def runs_or_sweeps(incomplete: str) -> list[str]:
    """Completion of RUN|SWEEP|all: ``all``, sweep ids, then run ids."""
    return _matching(["all"], incomplete) + _sweep_ids(incomplete) + [i for i in run_ids(incomplete) if i != "last"]


def live_run_or_sweep(incomplete: str) -> list[str]:
    """Completion of fslab stop's RUN|SWEEP: ``last`` (where the newest run is queued or running), sweep ids,
    then the ids of queued and running runs."""
    from fslab.core.states import LIVE

    ids = runs_in(*LIVE)(incomplete)
    return ids[:1] + _sweep_ids(incomplete) + ids[1:] if ids[:1] == ["last"] else _sweep_ids(incomplete) + ids


def choices(*values: str):
    """A completion function for an option that takes one of ``values``."""
    return lambda incomplete: _matching(list(values), incomplete)


def comma_choices(*values: str):
    """A completion function for a comma-separated list of ``values`` (--state queued,failed):
    the values not yet listed, each after what was typed before the last comma."""
    def complete(incomplete: str) -> list[str]:
        head, _, last = incomplete.rpartition(",")
        listed = set(head.split(",")) if head else set()
        return [f"{head},{v}" if head else v for v in values if v not in listed and v.startswith(last)]
    return complete


def config_keys(grid: bool = False):
    """A completion function for ``--set KEY=VALUE`` (with ``grid``, ``--grid KEY=V1,V2``): every
    configuration key with its ``=`` (``train.lr=``; a plugin section's ``name`` and the parameters
    of each plugin of its kind, ``sinks.NAME.PARAM`` for each sink), and after ``SECTION.name=`` the
    plugins of that kind (where the shell passes the ``=`` along: zsh and fish; bash splits the word
    there). ``--grid`` adds its aliases and leaves out ``seed`` and ``method``, which a sweep sets itself."""
    def complete(incomplete: str) -> list[str]:
        try:
            return _matching(_config_words(incomplete, grid), incomplete)
        except Exception:
            return []
    return complete


def _config_words(incomplete: str, grid: bool) -> list[str]:
    from fslab.core.config import DEFAULTS
    from fslab.core.keys import PLUGIN_SECTIONS, SECTION_KEYS, SINKS

    listing = _listing()
    key, typed_value, _ = incomplete.partition("=")
    if typed_value or incomplete.endswith("="):  # a value: the plugins a section's name takes
        section = key.removesuffix(".name")
        return [f"{key}={name}" for name in listing.names(section)] if section in PLUGIN_SECTIONS else []
    own = ("seed", "method") if grid else ()  # what a sweep sets itself
    keys = [k for k, v in DEFAULTS.items() if not isinstance(v, dict) and k not in own] + [SINKS]
    keys += [f"{s}.{k}" for s, v in DEFAULTS.items() if isinstance(v, dict) and s not in (*PLUGIN_SECTIONS, SINKS)
             for k in v]
    for section in PLUGIN_SECTIONS:
        keys += [f"{section}.{k}" for k in SECTION_KEYS.get(section, ("name",))]
        keys += [f"{section}.{p}" for c in listing.of_kind(section) for p in c.get("params") or {}]
    keys += [f"{SINKS}.{c['name']}.{p}" for c in listing.of_kind("sink") for p in c.get("params") or {}]
    if grid:
        from fslab.execution.sweep import ALIASES

        keys += list(ALIASES)
    return [f"{k}=" for k in sorted(set(keys))]


RunRef = Annotated[str, typer.Argument(
    metavar="RUN", help="Run id, a unique part of it (such as the short ids tables show), 'last', or "
                        "its folder's path (runs/ID).",
    autocompletion=run_ids)]
BackboneOpt = Annotated[str | None, typer.Option(help="Backbone plugin, e.g. resnet12 or conv4.",
                                                 autocompletion=names_of("backbone"))]
DatasetOpt = Annotated[str | None, typer.Option(help="Dataset plugin (default: synthetic, built in).",
                                                autocompletion=names_of("dataset"))]
DataRootOpt = Annotated[str | None, typer.Option(
    help="Folder the dataset reads from (each dataset's layout: README, Datasets); its first run caches the "
         "decoded images in ROOT/.fslab-cache, or, where ROOT cannot be written (a lab's read-only copy), in "
         "~/.cache/fslab ($XDG_CACHE_HOME); --set dataset.cache_dir=DIR chooses another folder. A dataset that reads "
         "no files (synthetic) takes none: a root given it, with --dataset left out, is refused.")]
EpochsOpt = Annotated[int | None, typer.Option(help="Training epochs.")]
BatchSizeOpt = Annotated[int | None, typer.Option(help="Images per training batch.")]
LrOpt = Annotated[float | None, typer.Option(help="Initial learning rate.")]
SeedOpt = Annotated[int | None, typer.Option(help="Random seed.")]
DeviceOpt = Annotated[str | None, typer.Option(
    help="auto, cpu, cuda (a GPU) or cuda:N (cuda:N needs N+1 visible GPUs; checked before the run is created).",
    autocompletion=choices("auto", "cpu", "cuda"))]
GpusOpt = Annotated[int | None, typer.Option(
    "--gpus", help="Train on N GPUs at once (torchrun + DistributedDataParallel): each GPU embeds 1/N of every "
                   "batch and the loss sees the whole batch. With --device cpu: N gloo CPU processes (testing), "
                   "no more than the CPUs they run on (2 always).")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", metavar="KEY=VALUE", autocompletion=config_keys(),
    help="Any config key, e.g. --set loss.temperature=0.9 (repeatable); values are checked against what each key "
         "allows before a run is created.")]
SinkOpt = Annotated[list[str] | None, typer.Option(
    "--sink", metavar="NAME", autocompletion=names_of("sink"),
    help="Also send the run's events to this sink, e.g. tensorboard, mlflow or wandb (repeatable; see fslab plugins "
         "--kind sink); its parameters with --set sinks.NAME.KEY=VALUE. Added to the \\[run] sinks of fslab.toml "
         "(--set sinks=[] drops those, not this).")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON lines, one object per item, instead of a table.")]
WideFlag = Annotated[bool, typer.Option(
    "--wide", help="Print tables at their full width, whatever the terminal's (or COLUMNS) is.")]
ExecutorOpt = Annotated[str, typer.Option(
    help="local (a worker process here) or slurm (a SLURM job through submitit, settings in \\[slurm] of fslab.toml).",
    autocompletion=choices("local", "slurm"))]
SlurmOpt = Annotated[list[str] | None, typer.Option(
    "--slurm", metavar="KEY=VALUE",
    help="With --executor slurm: override a \\[slurm] setting, e.g. --slurm partition=gpu (repeatable).")]
# compare's, plot's and study report's --precision: whose scores they read (fslab.reports.compare.RunFiles)
ReadPrecision = Annotated[str, typer.Option(
    help="Scores of the network run in this precision: fp32, bf16 or fp16, the run's own or those fslab eval "
         "--precision saved beside them (auto: each run's own); runs without them are named and left out.",
    autocompletion=choices(*PRECISIONS))]


def shown(value: object) -> str:
    """Text from a run file, a plugin or the user, ready for a Rich console:
    control characters written out (:func:`fslab.core.text.printable`), markup escaped."""
    return escape(printable(value))


def ended_line(run_id: str, state: str, error: str, *, see_stderr: bool = True, again: str = "") -> str:
    """How a run that did not complete ended, as ``fslab run`` and ``fslab logs --follow`` say it:
    ``ID: failed: ERROR. See: fslab logs ID --stderr; AGAIN`` (an error's own last period kept once, and none
    put after its question, ``Did you mean 'x'? See:``, where it read ``'x'?. See:``)."""
    text = shown(error).rstrip()
    text = text[:-1] if text.endswith(".") and not text.endswith("..") else text
    see = f"{'' if text.endswith(('?', '!')) else '.'} See: fslab logs {run_id} --stderr" if see_stderr else ""
    return f"{run_id}: {state}: {text}{see}{f'; {again}' if again else ''}"


def settings(store: bool = True):
    """fslab.toml's settings; with ``store``, for a command that reads or writes
    the run store, whose runs folder must not be a link to nothing."""
    from fslab.core.settings import check_runs_link, load_settings

    loaded = load_settings()
    if store:
        check_runs_link(loaded.runs_dir)
    return loaded


def registry(project_settings=None):
    """The plugins' registry; the plugins that failed to load are said as :func:`say_load_failures` has it."""
    import fslab

    loaded: list[str] = []
    found = fslab.get_registry(project_settings, report=loaded.append)
    if loaded:  # loaded anew: its failures are held until the command writes, ends or fails
        _unsaid[:] = found.failures
    return found


# The load failures of the registry the command loaded, not yet said. Each is said on stderr, once, before the
# command's first line (or at its end); one that the command's error line says already (its plugin and why: a
# component of the plugin, Registry.get) is not said again, where it made two lines of one fault.
_unsaid: list = []


def say_load_failures(error: str = "") -> None:
    """Say each load failure not said yet, but those ``error`` (the command's error line) says already."""
    unsaid, _unsaid[:] = list(_unsaid), []
    for failure in unsaid:
        if not (f"'{failure.plugin}'" in error and failure.error in error):
            err_console.print(shown(failure.line), highlight=False)


def check_evaluator(label: str) -> None:
    """Refuse an ``--evaluator`` label whose evaluator no plugin registers
    (``knnn``), in one line with the names there are. Called where no run has
    scores by the label, so the labels of a plugin since uninstalled still work."""
    from fslab.core.errors import UnknownName

    name = label.partition("[")[0]
    names = registry().names("evaluator")
    if name not in names:
        raise UnknownName("evaluator", name, names)


# The options of fslab run (and sweep) that set a key whose range is checked, by the key they set.
OPTION_NAMES = {("train", "epochs"): "--epochs", ("train", "batch_size"): "--batch-size", ("train", "lr"): "--lr",
                ("seed",): "--seed", ("device",): "--device", ("train", "processes"): "--gpus"}


def same_value(key: str, one, other) -> bool:
    """Whether two values given a key are one: a data root is the same folder however it is written (d1, ./d1/
    and its absolute path, each taken from this folder)."""
    import os
    from pathlib import Path

    if key == "dataset.root" and isinstance(one, str | Path) and isinstance(other, str | Path):
        return os.path.abspath(os.path.expanduser(one)) == os.path.abspath(os.path.expanduser(other))
    return one == other


def _options_against_set(options: dict[tuple, object], set_layer: dict) -> None:
    """An option that gives a key another value than the same command's --set does (--lr 0.1 --set
    train.lr=0.2) is refused, as it is against a sweep file's [set]: --set is the later layer and won unsaid."""
    from fslab.core.assignments import toml_value
    from fslab.core.keys import dotted

    given = dotted(set_layer)
    for path, value in options.items():
        key = ".".join(path)
        if value is not None and key in given and not same_value(key, given[key], value):
            option = OPTION_NAMES.get(path) or "--" + {"backbone.name": "backbone", "dataset.name": "dataset",
                                                        "dataset.root": "data-root"}[key]
            raise UsageError(f"{option} {value} contradicts --set {key}={toml_value(given[key])}; give it in one "
                             f"of the two")


def overrides(backbone, dataset, data_root, epochs, batch_size, lr, seed, device, set_, gpus=None,
              sinks=None, file_set=()) -> list[dict]:
    """Config layers from the options of `fslab run`, then a sweep file's [set] (``file_set``),
    then the command's --set (one layer: :func:`fslab.core.assignments.assignments_layer`), then --sink."""
    from fslab.core.assignments import assignments_layer, nest
    from fslab.core.config import check_option
    from fslab.core.keys import SINKS

    options = {
        ("backbone", "name"): backbone, ("dataset", "name"): dataset, ("dataset", "root"): data_root,
        ("train", "epochs"): epochs, ("train", "batch_size"): batch_size, ("train", "lr"): lr,
        ("seed",): seed, ("device",): device, ("train", "processes"): gpus,
    }
    for path, option in OPTION_NAMES.items():  # a value out of range names the option: --gpus, not train.processes
        if options[path] is not None:
            check_option(".".join(path), options[path], option)
    layers = [nest(list(path), value) for path, value in options.items() if value is not None]
    _options_against_set(options, assignments_layer(set_) if set_ else {})
    layers += [assignments_layer(texts) for texts in (file_set, set_ or []) if texts]
    # --sink after --set: sinks=[] clears fslab.toml's sinks, not the ones named beside it
    return layers + [{SINKS: {name: {}}} for name in sinks or []]


def parse_shots(shots: str) -> list[int]:
    try:  # an empty item (1,,5) is a typo, as in --grid
        return [int(s) for s in shots.split(",")] if shots.strip() else []
    except ValueError:
        raise UsageError(f"--shots takes whole numbers separated by commas (e.g. 1,5), got '{shots}'") from None


def version_callback(value: bool) -> None:
    if value:
        console.print(f"fslab {__version__}")
        raise typer.Exit()


def say_damaged(damaged: dict[str, list[str]]) -> None:
    """On stderr: the saved evaluations a report left out as damaged (:func:`fslab.reports.compare.damaged_line`)."""
    from fslab.reports.compare import damaged_line

    if line := damaged_line(damaged):
        err_console.print(shown(line), highlight=False)
