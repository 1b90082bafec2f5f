"""Sweep records in the run store, and choosing runs by id, sweep or ``all``.

A sweep is recorded in ``runs/sweeps/<sweep-id>.json`` (its method, grid,
seeds, ``fail_fast`` and run ids); its runs carry the sweep id in their status.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from fslab.core.creation import creation_key, newest_first
from fslab.core.errors import FslabError, RunNotFound, UsageError, did_you_mean
from fslab.core.files import NEW_FILE_MODE, atomic_write_json, read_json
from fslab.core.runstore import (
    SWEEPS,
    Run,
    as_id,
    closest_ids,
    find_run,
    is_path,
    list_runs,
    matching_names,
    run_names,
    sweeps_named,
)
from fslab.core.settings import project_above
from fslab.core.text import count


def new_sweep_id(runs_dir: Path, name: str = "") -> str:
    """An id for a new sweep (``name``: a study's, after it) that no other sweep of the store has
    or is taking: its runs' status names it before :func:`save_sweep` writes the record, so two
    sweeps queued in the same second must not draw one suffix. It is held by a hidden file
    made with ``O_EXCL`` beside where the record goes, until the record is written or
    :func:`release_sweep_id` lets it go."""
    folder = Path(runs_dir) / SWEEPS
    folder.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        sweep_id = f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}" + (f"-{name}" if name else "")
        try:
            os.close(os.open(_held(runs_dir, sweep_id), os.O_CREAT | os.O_EXCL | os.O_WRONLY, NEW_FILE_MODE))
        except FileExistsError:
            continue
        except FileNotFoundError:  # the folder, empty, removed by a sweep withdrawn just now: made again
            folder.mkdir(parents=True, exist_ok=True)
            continue
        if not (folder / f"{sweep_id}.json").exists():
            return sweep_id
        release_sweep_id(runs_dir, sweep_id)  # an earlier sweep's, whose record was written
    raise FslabError(f"could not find a free sweep id in {folder}")


def _held(runs_dir: Path, sweep_id: str) -> Path:
    return Path(runs_dir) / SWEEPS / f".{sweep_id}.taken"


def release_sweep_id(runs_dir: Path, sweep_id: str) -> None:
    """Let go of an id :func:`new_sweep_id` gave; for a sweep withdrawn before its record was written, the
    records' folder goes too where that leaves it empty (a withdrawn sweep leaves nothing)."""
    _held(runs_dir, sweep_id).unlink(missing_ok=True)
    try:
        (Path(runs_dir) / SWEEPS).rmdir()  # only if empty: never where a record is
    except OSError:
        pass


def save_sweep(runs_dir: Path, sweep_id: str, **record) -> dict:
    """Write the record of a new sweep (its id from :func:`new_sweep_id`, held until now)."""
    folder = Path(runs_dir) / SWEEPS
    folder.mkdir(parents=True, exist_ok=True)
    record = {"id": sweep_id, **record, "created": time.time()}
    atomic_write_json(folder / f"{sweep_id}.json", record)
    release_sweep_id(runs_dir, sweep_id)
    return record


def sweep_records(runs_dir: Path) -> list[dict]:
    """Every sweep's record, oldest first: in the order the sweeps were made in, as runs are listed
    (:mod:`fslab.core.creation`: ids begin with their host's local time, the record keeps its UNIX time)."""
    folder = Path(runs_dir) / SWEEPS
    paths = list(folder.glob("sweep-*.json")) if folder.is_dir() else []
    found = [(path.stem, record) for path, record in zip(paths, map(read_json, paths)) if readable(record)]
    found.sort(key=lambda item: creation_key(item[0], item[1].get("created"), SWEEP_STAMP_AT))
    return [record for _, record in found]


SWEEP_STAMP_AT = len("sweep-")  # where a sweep id's local time begins


def newest_sweep(runs_dir: Path, names: list[str]) -> str | None:
    """The sweep of ``names`` (sorted) made last (:func:`fslab.core.creation.newest_first`), None if none."""
    record = lambda name: read_json(Path(runs_dir) / SWEEPS / f"{name}.json") or {}
    return next(newest_first(names, lambda name: record(name).get("created"), SWEEP_STAMP_AT), None)


def readable(record: dict | None) -> bool:
    """Whether a sweep record names its runs as a list of run ids: names of
    folders inside the run store (a ``../`` or a number would reach elsewhere
    or nowhere)."""
    runs = record.get("runs") if record else None
    return isinstance(runs, list) and all(map(is_run_id, runs))


def is_run_id(name) -> bool:
    """Whether ``name`` can be a run folder's name inside the store."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def sweep_name(runs_dir: Path, ref: str) -> str:
    """The id of the sweep ``ref`` names: its id, a unique part of it, its record's path
    (``runs/sweeps/<id>.json``), or ``last`` (the sweep made last, :func:`newest_sweep`)."""
    ref = record_named(runs_dir, ref) or ref
    folder = Path(runs_dir) / SWEEPS
    names = sorted(p.stem for p in folder.glob("sweep-*.json")) if folder.is_dir() else []
    refuse_records_folder(runs_dir, ref)
    found = [newest_sweep(runs_dir, names)] if ref == "last" and names else [
        n for n in names if n == ref] or [n for n in names if ref in n]
    if not names:
        raise UsageError(f"no sweeps yet: {folder}/ holds no sweep's record, so '{ref}' names none; start one with: "
                         f"fslab sweep METHOD --seeds 3{project_above()}")
    if not found:
        raise no_sweep(f"'{ref}'", ref, names)
    if len(found) > 1:
        raise UsageError(f"'{ref}' matches several sweeps. Sweeps: {', '.join(names)}")
    return found[0]


def refuse_records_folder(runs_dir: Path, ref: str) -> None:
    """A UsageError where ``ref``, given as a SWEEP, is the records' folder itself (``runs/sweeps/``), saying
    what it holds, as RUN|SWEEP refuses it; nothing for any other ``ref``."""
    folder = Path(runs_dir) / SWEEPS
    if is_path(ref) and Path(os.path.expanduser(ref)).resolve() == folder.resolve():
        names = sorted(p.stem for p in folder.glob("sweep-*.json")) if folder.is_dir() else []
        raise UsageError(f"{folder}/ holds the sweeps' records, not a sweep: give a sweep's id, or its record's path, "
                         f"{folder}/<id>.json. Sweeps: {', '.join(names) or '(none yet)'}")


def no_sweep(given: str, ref: str, names: list[str]) -> UsageError:
    """The one line for a sweep id (``given`` as the command line wrote it) that no sweep's id holds:
    the closest id, where one is close, and every sweep there is."""
    meant = closest_ids(ref, names) or did_you_mean(ref, names)  # 1ae6 for the sweep that ends 1ae5, as run ids
    return UsageError(f"{given} matches no sweep.{meant} Sweeps: {', '.join(names) or '(none yet)'}")


def record_named(runs_dir: Path, ref: str) -> str | None:
    """The sweep id of the record whose path ``ref`` is (``runs/sweeps/<id>.json``, as the shell completes
    it), if it is one of this store's records; None otherwise."""
    if not is_path(ref):
        return None
    where = Path(os.path.expanduser(ref)).resolve()
    if where.parent != (Path(runs_dir) / SWEEPS).resolve() or not where.is_file():
        return None
    return where.stem if where.name.startswith("sweep-") and where.suffix == ".json" else None


def load_sweep(runs_dir: Path, ref: str) -> dict:
    """A sweep's record by id, unique part of it, or ``last``; one that cannot be read is a UsageError
    naming the two ways to remove it (:func:`damaged_sweep`)."""
    name = sweep_name(runs_dir, ref)
    path = Path(runs_dir) / SWEEPS / f"{name}.json"
    record = read_json(path)
    if not readable(record):
        raise UsageError(f"sweep record {path} cannot be read (it must be JSON listing its runs' ids); remove it "
                         f"with its runs: fslab delete {name}, or alone: rm {path}")
    return record


def damaged_sweep(runs_dir: Path, ref: str) -> tuple[Path, list[str]] | None:
    """For a sweep whose record cannot be read (half a file, an edit gone wrong), the record's path and its
    runs: the run ids it still names, where it is a list of them in part, and the runs whose status names
    the sweep (each run keeps its sweep's id there); None for a sweep whose record reads."""
    name = sweep_name(runs_dir, ref)
    path = Path(runs_dir) / SWEEPS / f"{name}.json"
    record = read_json(path)
    if readable(record):
        return None
    named = record.get("runs") if record else None
    ids = [run_id for run_id in named if is_run_id(run_id)] if isinstance(named, list) else []
    ids += [run_id for run_id in run_names(runs_dir)
            if run_id not in ids and Run(Path(runs_dir) / run_id).status().get("sweep") == name]
    return path, ids


def sweep_runs(runs_dir: Path, record: dict) -> list[Run]:
    return [Run(Path(runs_dir) / run_id) for run_id in record["runs"]]


def select_runs(runs_dir: Path, refs: list[str], verb: str, *, whole: bool = False,
                damaged: list[Path] | None = None) -> list[Run]:
    """The runs named on a command line: run ids (or unique parts of them),
    sweep ids (every run of the sweep) or ``all``; each run once, where it is first
    named. None at all (``all`` in an empty store, sweeps without runs) is a
    UsageError saying which, with what the command would ``verb`` them. ``whole``: a path
    must name a run's folder, not a file in it (:func:`fslab.core.runstore.find_run`). A sweep
    whose record cannot be read is a UsageError, unless ``damaged`` is given (fslab delete): then
    its record's path is added to it, and its runs are those :func:`damaged_sweep` finds."""
    if refs == ["all"]:
        runs = list_runs(runs_dir)
        if not runs:
            raise UsageError(f"no runs to {verb}: {runs_dir}/ holds none yet (start one with: fslab run METHOD)")
        return runs
    if "all" in refs:
        raise UsageError("'all' names every run: give it alone, or name the runs and sweeps")
    runs = []
    for ref in map(as_id, refs):  # 2e05/ as 2e05
        if names_sweep(runs_dir, ref) and damaged is not None and (found := damaged_sweep(runs_dir, ref)):
            damaged += [found[0]] if found[0] not in damaged else []  # named twice: removed, and said, once
            runs += [Run(Path(runs_dir) / run_id) for run_id in found[1]]
        elif names_sweep(runs_dir, ref):
            runs += sweep_runs(runs_dir, load_sweep(runs_dir, ref))
        else:
            runs.append(run_or_sweep(runs_dir, ref, whole=whole))
    if not runs and not damaged:  # only sweeps, each without runs
        named = "the sweeps named hold" if len(refs) > 1 else "the sweep named holds"
        raise UsageError(f"no runs to {verb}: {named} none (list runs and sweeps with: fslab runs)")
    once = {run.id: run for run in reversed(runs)}  # a run named twice (a sweep and one of its runs) counts once
    runs = [run for run in runs if once.pop(run.id, None) is not None]
    if verb != "delete" and not any(run.path.is_dir() for run in runs):  # only sweeps named, their runs rm -r'd
        ids = ", ".join(run.id for run in runs[:3]) + (", ..." if len(runs) > 3 else "")
        one = len(refs) == 1
        named = "the sweep's record names" if one else "the sweeps' records name"
        are = "is" if len(runs) == 1 else "are all"
        raise UsageError(f"no runs to {verb}: the {count(len(runs), 'run')} {named} {are} gone, deleted by hand "
                         f"({ids}); remove the {'record' if one else 'records'} with: fslab delete {' '.join(refs)}")
    return runs


def run_or_sweep(runs_dir: Path, ref: str, *, whole: bool = False) -> Run:
    """:func:`fslab.core.runstore.find_run` where a sweep is taken too (RUN|SWEEP): an id that names neither and
    is close to no run's id but to a sweep's suggests the sweep (``1ae6`` for the one that ends ``1ae5``)."""
    try:
        return find_run(runs_dir, ref, whole=whole)
    except RunNotFound as exc:
        said = str(exc)
        meant = "" if not said.startswith(f"no run '{ref}' ") or "Did you mean" in said else closest_ids(
            ref, sweeps_named(runs_dir, ""))
        if not meant:
            raise
        raise RunNotFound(f"no run or sweep '{ref}' in {runs_dir}.{meant} List them with: fslab runs") from None


def names_sweep(runs_dir: Path, ref: str) -> bool:
    """Whether ``ref``, given where a run or a sweep is taken, names a sweep:
    a sweep id (``sweep-...``), or a part of sweep ids that is part of no run's
    id (a run's id comes first: ``4f2a`` is the run that ends so, if one does)."""
    if ref.startswith("sweep-") or record_named(runs_dir, ref):
        return True
    return ref != "last" and bool(sweeps_named(runs_dir, ref)) and not matching_names(ref, run_names(runs_dir))
