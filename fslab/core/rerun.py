"""A new run made from an old one: ``fslab run --like RUN``, and the
dashboard's "new run from this run", both through :func:`like`; and what is
said about a run's checkpoint after a stop (:func:`after_stop`).

The new run gets the old one's saved configuration, every key of it (method,
backbone, dataset, training and evaluation keys, plugin parameters), as a
layer above the recipe and ``[run]`` of fslab.toml, so neither a recipe nor
fslab.toml changed since can make it differ; the options given now go on top,
as ``fslab run``'s options go on top of the recipe.
"""

from __future__ import annotations

from fslab.core.commands import like_command
from fslab.core.errors import FslabError, UsageError
from fslab.core.runstore import Run

NOT_SETTINGS = ("method", "config_version")  # the recipe's name and the layout's version: not layer keys


def check_checkpoint_whole(run: Run, doing: str) -> None:
    """A UsageError, in one line, for a checkpoint cut short (a worker killed in a way
    write-then-rename cannot help, a copy or an rsync that stopped half-way) or with bytes
    changed since it was written (a failing disk, a bad copy), which torch would load as
    weights (:func:`fslab.core.files.archive_damage`: the whole file is read once).
    ``doing``: what cannot be done with it ("resume", "be evaluated")."""
    from fslab.core.files import archive_damage

    if run.checkpoint_path.exists() and (damage := archive_damage(run.checkpoint_path)) is not None:
        raise UsageError(f"the checkpoint of run {run.id} is damaged ({run.checkpoint_path} {damage}); it cannot "
                         f"{doing}: copy it again from where the run trained, or train the run again with: "
                         f"{like_command(run.id)}")


def check_evaluable(run: Run) -> None:
    """A UsageError, in one line, unless ``run`` has a whole checkpoint to evaluate. Torch-free, so
    ``fslab eval`` refuses a run without one before it loads torch (seconds)."""
    from fslab.core.states import LIVE

    if not run.checkpoint_path.exists():
        state = run.state()
        if state == "completed" and run.events_of("checkpoint"):  # it was written: the file went since
            raise UsageError(f"run {run.id} completed, but its checkpoint {run.checkpoint_path} is gone (deleted, or "
                             f"not copied with the run's folder); copy it back from where the run trained, or train "
                             f"the run again with: {like_command(run.id)}")
        ended = state not in LIVE
        raise UsageError(f"run {run.id} has no checkpoint{'' if ended else ' yet'} (one is written after each "
                         f"epoch{'; it ended before its first' if ended else ''})"
                         + (f"; train it again with: {like_command(run.id)}" if ended else ""))
    check_checkpoint_whole(run, "be evaluated")


def like(run: Run, options: list[dict], registry, only_recipe: bool = False) -> tuple[str, list[dict]]:
    """The method and the configuration layers of a new run like ``run``,
    with ``options`` (the layers of ``fslab run``'s options) on top. A new
    dataset name leaves the old dataset's root behind (the new one's is
    found as for any run). A saved recipe or plugin that no installed plugin
    registers now, and no option replaces, is refused naming the run
    (:func:`_check_installed`); ``only_recipe``: the recipe alone (the
    dashboard's form, whose fields may yet replace a plugin)."""
    config = run.config()
    method = config.get("method")
    if not isinstance(method, str) or not method:
        raise UsageError(f"run {run.id} has no readable configuration to start a run like it from")
    saved = {key: value for key, value in config.items() if key not in NOT_SETTINGS}
    dataset = saved.get("dataset")
    chosen = [layer["dataset"]["name"] for layer in options
              if isinstance(layer.get("dataset"), dict) and "name" in layer["dataset"]]
    if chosen and isinstance(dataset, dict) and chosen[-1] != dataset.get("name"):
        saved["dataset"] = {"name": chosen[-1]}
    _check_installed(run.id, method, {} if only_recipe else saved, options, registry)
    return method, [saved, *options]


def _check_installed(run_id: str, method: str, saved: dict, options: list[dict], registry) -> None:
    """A UsageError naming run ``run_id``, where its recipe, or a plugin of its saved configuration
    ``saved`` that no option replaces, is registered by no installed plugin now: the registry's
    "Unknown method 'x'. Allowed: ..." read as if the command line had named it (said as
    :func:`fslab.core.config.uninstalled` says it for fslab resume and fslab eval)."""
    from fslab.core.config import choosing_option, uninstalled
    from fslab.core.keys import PLUGIN_SECTIONS

    if (line := uninstalled(registry, run_id, "method", method)) is not None:
        raise UsageError(f"{line} to start a run like it")
    for section in PLUGIN_SECTIONS:
        name = saved[section].get("name") if isinstance(saved.get(section), dict) else None
        replaced = any(isinstance(layer.get(section), dict) and "name" in layer[section] for layer in options)
        if isinstance(name, str) and not replaced and (line := uninstalled(registry, run_id, section, name)):
            raise UsageError(f"{line} to start a run like it, or give it another: "
                             f"{like_command(run_id)} {choosing_option(section)}NAME")


def after_stop(run: Run) -> str:
    """What a stopped run keeps: its last checkpoint and how to continue from
    it, or, stopped before its first checkpoint, how to start it again. One whose
    config.json cannot be read (listed as unreadable) was stopped as its status.json
    said it was: that is said, and that the file goes back before either."""
    if not _config_readable(run):
        was = "queued" if run.status().get("started") is None else "running"
        then = (f"resume it from its last checkpoint, {run.checkpoint_path}" if run.checkpoint_path.exists()
                else f"start it again ({like_command(run.id)}): it wrote no checkpoint")
        return (f"its config.json is missing or unreadable (fslab show {run.id} says why), so it was stopped as its "
                f"status.json said it was {was}; put the file back from a copy of the run, then {then}")
    if run.checkpoint_path.exists():
        return f"last checkpoint kept in {run.checkpoint_path}; continue with: fslab resume {run.id}"
    return f"no checkpoint yet (it stopped {stopped_when(run)}); start it again with: {like_command(run.id)}"


def _config_readable(run: Run) -> bool:
    try:
        return bool(run.config())
    except FslabError:  # a newer fslab's: readable, by that fslab
        return True


def stopped_when(run: Run) -> str:
    """Why a stopped run has no checkpoint: it never started (stopped while
    queued), it stopped during its first epoch, or after it with the checkpoint it announced not
    written (its write failed, a full disk: the run failed), or it was killed (SIGKILL, the
    machine's end) while its first checkpoint was written, in the background while
    the second epoch trained: the temporary file it was writing is left. A temporary file
    whose writer lives (on another node sharing the runs folder, its own is not judged by
    a pid of this one: :func:`fslab.core.files.writer_gone`) is said as being written, by whom."""
    from fslab.core.files import temporary_writer, writer_gone
    from fslab.core.states import HOST, process_named

    if run.status().get("started") is None:
        return "before it started"
    half = sorted(run.checkpoint_path.parent.glob(f".{run.checkpoint_path.name}.*.tmp"))
    writing = [path for path in half if temporary_writer(path) is not None and not writer_gone(path)]
    if writing:
        pid, host = temporary_writer(writing[0])  # no host: an earlier version's name, whose pid runs here
        return (f"while its first checkpoint was being written, which {process_named(pid, host or HOST)} "
                f"is writing still, in {writing[0].relative_to(run.path)}: fslab resume {run.id} once it is written")
    if half:
        return (f"while its first checkpoint was being written, and left it half-written in "
                f"{half[0].relative_to(run.path)}")
    if run.events_of("checkpoint"):  # announced, never on disk: its write failed (a full disk), or never began
        if run.status().get("state") == "failed":
            return (f"after its first epoch ended, its first checkpoint's write having failed: fslab show {run.id} "
                    f"says why")
        return "after its first epoch ended, before its first checkpoint was on disk"
    return "before its first epoch ended"
