"""A run's data root: the one line every command says where it is gone (the data moved, a store copied
to a machine whose data lies elsewhere), and ``fslab resume RUN --data-root DIR``, which moves it.

A run reads its data from the root saved in its ``config.json``. ``fslab eval --data-root`` reads it
elsewhere for one evaluation; ``fslab resume --data-root`` moves it for good (:func:`moved_config`,
:func:`check_same_data`, :func:`save_data_root`), only onto the data the run started on, and keeps
where it was in an event.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from fslab.core.commands import like_command, resume_there_command
from fslab.core.config import filled_root, filled_root_source
from fslab.core.errors import UsageError
from fslab.core.eventlog import EventLog, first_start_data
from fslab.core.events import MOVED_ROOT
from fslab.core.files import atomic_write_json, read_json
from fslab.core.runstore import Run
from fslab.execution.checks import for_resume


def gone_root(dataset: dict, exc: UsageError) -> str | None:
    """The run's data root (its ``dataset`` section's), where ``exc`` is the dataset's line for
    that root and it is no folder now; else None. That line points at --data-root and
    [data_roots] of fslab.toml, which a run made before reads only through fslab eval's and fslab resume's
    --data-root."""
    root = (dataset or {}).get("root")
    if not isinstance(root, str) or not root or root not in str(exc) or Path(root).is_dir():
        return None
    return root


def like_root_gone(that_run: str, layers: list[dict], exc: UsageError, move: str,
                   settings=None) -> UsageError | None:
    """For a run like another (``layers[0]`` its saved configuration: fslab run --like, the dashboard's
    N), where ``exc`` is the dataset's line for the saved root and it is gone: :func:`data_root_gone`'s line,
    saying that ``move`` moves it (the dataset's line points at [data_roots] of fslab.toml, which the saved
    root, a layer above, overrides). ``that_run`` names the run."""
    return data_root_gone(that_run, layers[0].get("dataset"), exc, settings, reads="a run like it reads its data "
                          "there too: ", move=move)


def data_root_gone(that_run: str, dataset: dict, exc: UsageError, settings, *, move: str,
                   reads: str = "") -> UsageError | None:
    """The one line for a run whose saved data root is gone (``exc`` the dataset's line for it:
    :func:`gone_root`), as fslab eval, resume, sweep resume, run --like and the dashboard say it; else None.
    ``that_run`` names the run, ``reads`` says where what the command starts reads its data, and ``move``
    how to give where the data lies now, its ``DIR`` filled in with this project's folder for the dataset,
    where it has one (:func:`root_here`)."""
    if (root := gone_root(dataset, exc)) is None:
        return None
    if here := root_here(settings, dataset, root):
        move = (move.replace("DIR", f"{shlex.quote(here[0])} ({here[1]})") if "DIR" in move
                else f"{move} ({here[0]} is {here[1]})")
    return UsageError(f"{that_run} was trained on {root}, which is not a folder now; {reads}if the data moved, "
                      f"give where it lies with {move}")


def _link(folder: str, root: str) -> str:
    """The command that links ``folder`` at a run's data ``root``, after the ``mkdir -p`` of its parent where
    that is gone too (the first machine's folders: ln has nowhere to put the link)."""
    link = f"ln -s {shlex.quote(folder)} {shlex.quote(root)}"
    if not Path(root).parent.is_dir():
        link = f"mkdir -p {shlex.quote(str(Path(root).parent))} && {link}"
    return link


def root_here(settings, dataset: dict, root: str) -> tuple[str, str] | None:
    """Where a run's saved data ``root`` is gone (a store copied to another machine, its data with it) but this
    project keeps a folder for the run's dataset (:func:`fslab.core.config.filled_root`, an existing folder
    other than ``root``): that folder, and the words that say so; else None."""
    name = (dataset or {}).get("name")
    if settings is None or not isinstance(name, str):
        return None
    here = os.path.abspath(os.path.expanduser(filled_root(settings, name)))
    if here == os.path.abspath(root) or not os.path.isdir(here):
        return None
    return here, f"this project's folder for dataset '{name}', from {filled_root_source(settings, name)}"


def root_gone(run: Run, config: dict, exc: UsageError, settings=None, move: str | None = None) -> UsageError | None:
    """Where ``exc`` is the dataset's line for a run's data root that is gone: :func:`data_root_gone`'s
    line, saying where a resumed run reads its data, and that ``move`` moves it, by default ``fslab resume RUN
    --data-root DIR`` (fslab resume and the dashboard's r say it, sweep resume names its own; the dataset's
    line said [data_roots] of fslab.toml too, which a resume does not read)."""
    return data_root_gone(f"run {run.id}", config.get("dataset"), exc, settings,
                          reads="a resumed run reads its data there: ", move=move or resume_there_command(run.id))


def check_root_option(data_root: str | None) -> None:
    """fslab resume's and sweep resume's --data-root refused in one line where it is no folder (``~`` read as
    the home folder, as the move reads it: a quoted ``'~/data'`` is the folder it names)."""
    if data_root is not None and not os.path.isdir(os.path.expanduser(data_root)):
        raise UsageError(f"--data-root {data_root} is not a folder")


def moved_config(run: Run, data_root: str | None, registry, *, fileless: bool = False) -> dict | None:
    """The run's configuration with its data root moved to ``data_root`` (fslab resume --data-root: an
    absolute path), which the resume checks as it checks the run's own (:func:`fslab.execution.executor.
    checked_again`); None where none is given, or it is the run's own root. Refused in one line where it is
    no folder, or the run's dataset reads no files (synthetic: its root is none), but for ``fileless`` (a
    sweep's synthetic runs, which fslab sweep resume --data-root leaves as they are: None); a configuration
    that cannot be read is left to the check's line."""
    if data_root is None:
        return None
    check_root_option(data_root)
    config = run.config()
    dataset = config.get("dataset")
    if not isinstance(dataset, dict) or not isinstance(dataset.get("name"), str):
        return None
    if not registry.reads_files(dataset["name"]):
        if fileless:
            return None
        raise UsageError(f"run {run.id} trained on dataset '{dataset['name']}', which reads no files: --data-root "
                         f"gives it none; resume it without --data-root")
    root = os.path.abspath(os.path.expanduser(data_root))
    if dataset.get("root") == root:
        return None
    return {**config, "dataset": {**dataset, "root": root}}


def save_data_root(run: Run, config: dict, was: str | None) -> None:
    """Save the run's new data root (``config``'s, from :func:`moved_config`, checked, and found by
    :func:`check_same_data` to hold the data the run started on; ``was``, the root it leaves, is what that gave)
    in its config.json, where fslab show and every later resume read it; ``was`` is kept in a ``data_root``
    event of metrics.jsonl (``root``, ``was``), which the cut of a resume keeps, and said in a line of
    stdout.log (``fslab logs``)."""
    root = config["dataset"]["root"]
    saved = read_json(run.path / "config.json")
    if not isinstance(saved.get("dataset"), dict):  # an earlier form: saved as every reader reads it
        saved = run.config()
    saved["dataset"] = {**saved["dataset"], "root": root}
    atomic_write_json(run.path / "config.json", saved)
    log = EventLog(run, echo="log")  # one line in stdout.log, above the resume's own: fslab logs shows the move
    try:
        log.write(MOVED_ROOT, root=root, was=was)
    finally:
        log.close()


def check_same_data(run: Run, config: dict, registry, move: str | None = None) -> str | None:
    """A UsageError where the data at ``config``'s root is not that the run started on: a split whose outline
    (images, classes, digest of labels: :func:`fslab.training.record.split_outline`) differs from its first
    start's, or, where its first start recorded none (an earlier fslab's) but it trained, since no one can
    tell; a root the dataset cannot load (no train/ there) is its line as a resume says it
    (:func:`fslab.execution.checks.for_resume`: a resume reads no [data_roots]; ``move``, the command that
    resumes it elsewhere, by default fslab resume RUN --data-root DIR). A run that never started reads any
    data. Returns the root it leaves (the run's own)."""
    was = run.config().get("dataset", {}).get("root")
    was = was if isinstance(was, str) and was else None
    before = first_start_data(run)
    root = config["dataset"]["root"]
    if not before:
        if run.checkpoint_path.exists():
            link = f"link it where the run reads it ({_link(root, was)}) and resume it, or " if was else ""
            raise UsageError(f"run {run.id} recorded nothing of the data it started on (an earlier fslab started "
                             f"it), so --data-root cannot tell that {root} holds the same; {link}start anew there: "
                             f"fslab run --like {run.id} --data-root {shlex.quote(root)}")
        return was
    from fslab.training.record import outline_changes, outlines_at  # torch: only where there is data to compare

    try:
        now = outlines_at(config, registry, list(before))
    except UsageError as exc:  # its layout, say: the dataset's line names [data_roots], which no resume reads
        raise for_resume(exc, like_command(run.id), move or resume_there_command(run.id)) from None
    told = outline_changes(before, now)
    if told is not None:
        raise UsageError(f"--data-root {root} does not hold the data run {run.id} started on ({told}); resume it "
                         f"on the same files, or start anew on these: fslab run --like {run.id} --data-root "
                         f"{shlex.quote(root)}; nothing was changed")
    return was
