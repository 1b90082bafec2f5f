"""Project settings from ``fslab.toml`` (found in the working directory, or at
the path in ``FSLAB_CONFIG``)."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fslab.core.assignments import shown
from fslab.core.errors import ConfigError, did_you_mean
from fslab.core.sinks import CLOSE_WAIT
from fslab.core.text import clip

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

SETTINGS_FILE = "fslab.toml"
TOP_LEVEL = ("project", "data_roots", "run", "scheduler", "sinks", "slurm")


def _whole(value: Any) -> bool:
    return type(value) is int and value >= 1


def _gpu_list(value: Any) -> bool:
    return value == "auto" or (isinstance(value, list) and all(type(g) is int and g >= 0 for g in value)
                               and len(set(value)) == len(value))


def _one_line(text: str) -> bool:
    """Text that stays on its ``#SBATCH`` line: no line break (which began a line of the batch script's
    own) and no NUL."""
    return not any(char in text for char in "\n\r\0")


def _sbatch_options(value: Any) -> bool:
    """Each option as submitit writes it, ``#SBATCH --KEY=VALUE`` (``true``: ``#SBATCH --KEY``): a name
    of letters, digits, - and _, and one line of text, a whole or finite number, or true. A list, a
    table or false was written out as Python spells it (``--exclusive=False``), and a key holding a
    line break put its own lines into the batch script."""
    def one(option: Any) -> bool:
        if option is True or type(option) is int:
            return True
        if type(option) is float:
            return math.isfinite(option)
        return isinstance(option, str) and _one_line(option)
    return isinstance(value, dict) and all(re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", key) and one(option)
                                           for key, option in value.items())


# key -> (check, what the value must be)
PROJECT_KEYS = {
    "runs_dir": (lambda v: isinstance(v, str), "a string"),
    "plugin_dirs": (lambda v: isinstance(v, list) and all(isinstance(d, str) for d in v), "a list of folder names"),
}
SCHEDULER_KEYS = {
    "gpus": (_gpu_list, '"auto" or a list of distinct GPU indices (0, 1, ...)'),
    # a slot is a lock file the scheduler looks at: a few per GPU or core, not millions
    "runs_per_gpu": (lambda v: _whole(v) and v <= 64, "a whole number from 1 to 64"),
    "cpu_slots": (lambda v: _whole(v) and v <= 1024, "a whole number from 1 to 1024"),
}
SINKS_KEYS = {
    "close_wait_s": (lambda v: type(v) in (int, float) and 0 <= v <= 3600, "a number of seconds from 0 to 3600"),
}
SLURM_KEYS = {
    "cluster": (lambda v: v in ("slurm", "local"), '"slurm" or "local"'),
    "partition": (lambda v: isinstance(v, str) and _one_line(v), "a partition's name, one line of text"),
    "timeout_min": (_whole, "a whole number of minutes >= 1"),
    "gpus_per_job": (lambda v: type(v) is int and v >= 0, "a whole number >= 0"),
    "cpus_per_task": (_whole, "a whole number >= 1"),
    "mem_gb": (lambda v: type(v) in (int, float) and 0 <= v < math.inf,  # nan and inf fail
               "a finite number of GB >= 0 (0: the partition's default)"),
    "max_requeues": (lambda v: type(v) is int and v >= 0, "a whole number >= 0"),
    "signal_delay_s": (_whole, "a whole number of seconds >= 1"),
    "sbatch": (_sbatch_options, "a table of sbatch options (names of letters, digits, - and _; each a line of text, "
                                "a number or true), e.g. { account = \"lab\", qos = \"high\", exclusive = true }"),
    "setup": (lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v), "a list of shell lines"),
}
SECTION_KEYS = {"project": PROJECT_KEYS, "scheduler": SCHEDULER_KEYS, "sinks": SINKS_KEYS, "slurm": SLURM_KEYS}


@dataclass(frozen=True)
class SchedulerSettings:
    """``[scheduler]``: the slots queued runs (``fslab sweep``) start in."""

    gpus: str | tuple[int, ...] = "auto"  # "auto": every visible GPU; or these GPU indices
    runs_per_gpu: int = 1  # runs sharing one GPU
    cpu_slots: int = 1  # concurrent runs on a machine without GPUs


@dataclass(frozen=True)
class SinksSettings:
    """``[sinks]``: how a run treats the sinks it feeds (fslab.core.sinks)."""

    close_wait_s: float = CLOSE_WAIT  # seconds the sinks together get to finish once the run has ended


@dataclass(frozen=True)
class SlurmSettings:
    """``[slurm]``: the jobs of ``--executor slurm`` (fslab.toml explains every key)."""

    cluster: str = "slurm"  # or "local": submitit's local executor on this machine
    partition: str = ""  # "": the cluster's default partition
    timeout_min: int = 240
    gpus_per_job: int = 1
    cpus_per_task: int = 8
    mem_gb: float = 0  # 0: the partition's default memory
    max_requeues: int = 3
    signal_delay_s: int = 120
    sbatch: dict[str, Any] = field(default_factory=dict)  # any other sbatch option
    setup: tuple[str, ...] = ()  # shell lines run before the job

    def with_overrides(self, values: dict[str, Any]) -> SlurmSettings:
        """A copy with ``values`` (checked already) in place."""
        values = {k: tuple(v) if k == "setup" else v for k, v in values.items()}
        return dataclasses.replace(self, **values)


@dataclass(frozen=True)
class Settings:
    """What ``fslab.toml`` says, with paths resolved against its folder."""

    path: Path | None = None
    runs_dir: Path = field(default_factory=lambda: Path("runs"))
    plugin_dirs: tuple[Path, ...] = ()
    data_roots: dict[str, str] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    sinks: SinksSettings = field(default_factory=SinksSettings)
    slurm: SlurmSettings = field(default_factory=SlurmSettings)


def plugin_folders(plugin_dirs) -> tuple[str, ...]:
    """The plugin folders as the absolute paths they are now: what a registry loaded from them is keyed on,
    so two projects' ``plugin_dirs = ["mine"]`` (the same words, read in two folders) are two sets of plugins."""
    return tuple(str(Path(d).resolve()) for d in plugin_dirs)


def read_toml(path: Path) -> dict:
    """Parse a TOML file; a syntax error names the file, line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte {exc.start}, 0x{exc.object[exc.start]:02x}); "
                          f"TOML files are UTF-8: save it in that encoding") from None
    try:  # a byte-order mark (Windows editors write one) is no statement: TOML said 1:1 was invalid
        return tomllib.loads(text.removeprefix("\ufeff"))
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        where = re.search(r"\(at line (\d+), column (\d+)\)", message)
        if where:
            reason = message[: where.start()].strip()
            raise ConfigError(
                f"{path}:{where[1]}:{where[2]}: TOML syntax error: {reason} "
                f"(line {where[1]}, column {where[2]})"
            ) from None
        raise ConfigError(f"{path}: TOML syntax error: {message}") from None


def settings_path() -> Path:
    return Path(os.environ.get("FSLAB_CONFIG") or SETTINGS_FILE)  # set but empty: as if unset


def check_runs_link(runs_dir: Path) -> None:
    """A runs folder that is a link to a folder that is gone (a larger disk not
    mounted), or a file, is one line: listings said "no runs yet" and fslab run
    could not make the folder ("File exists")."""
    if runs_dir.is_symlink() and not runs_dir.exists():
        raise ConfigError(f"{runs_dir} is a link to {os.readlink(runs_dir)}, which does not exist (a disk not "
                          f"mounted?); mount or restore it, or remove the link")
    if runs_dir.exists() and not runs_dir.is_dir():  # a file: listed as no runs, and no run could be made
        raise ConfigError(f"{runs_dir} is a file, not a folder, where fslab keeps its runs; move or rename the "
                          f"file, or name another folder in fslab.toml ([project] runs_dir)")


def project_above() -> str:
    """Where neither this folder nor ``FSLAB_CONFIG`` gives an fslab.toml but a
    folder above this one holds one (a command run in a project's subfolder, which
    reads the subfolder's own runs/), what to do instead, after "; "; else ""."""
    if os.environ.get("FSLAB_CONFIG") or os.path.lexists(SETTINGS_FILE):
        return ""
    try:
        parents = Path.cwd().parents
    except OSError:  # the working folder was removed
        return ""
    for folder in parents:
        if (folder / SETTINGS_FILE).is_file():
            found = Path(os.path.relpath(folder / SETTINGS_FILE))
            return (f"; a project's fslab.toml is above this folder ({found}), but fslab reads the fslab.toml and "
                    f"runs/ of the folder it runs in: run it in {found.parent}, or here with FSLAB_CONFIG={found}")
    return ""


def load_settings(path: str | os.PathLike | None = None) -> Settings:
    """Read ``fslab.toml`` (``path``: another, as text or a Path). Where no file is named (neither ``path`` nor
    ``FSLAB_CONFIG``) and this folder has none, the built-in settings; a file named that does not exist is an error."""
    given = Path(path) if path else None  # a notebook's "…/fslab.toml" was "'str' has no attribute 'exists'"
    path = given or settings_path()
    if not path.exists():
        if path.is_symlink():  # a link whose target is gone is no missing file: its settings would be lost
            raise ConfigError(f"{path} is a link to {os.readlink(path)}, which does not exist; "
                              f"restore that file or remove the link")
        if given is not None:  # a mistyped path read as no file gave the defaults: another runs folder, no plugins
            raise ConfigError(f"the settings file {path} does not exist; give the path of an fslab.toml, or "
                              f"load_settings() for this folder's (the built-in settings where it has none)")
        if os.environ.get("FSLAB_CONFIG"):
            raise ConfigError(f"FSLAB_CONFIG names {path}, which does not exist")
        return Settings()
    data = read_toml(path)
    for key in data:
        if key not in TOP_LEVEL:
            section = next((name for name, keys in SECTION_KEYS.items() if key in keys), None)
            if section is not None and not isinstance(data[key], dict):
                raise ConfigError(f"{path}: '{key}' is a key of [{section}]; put it under a [{section}] line")
            raise ConfigError(
                f"{path}: unknown section [{key}].{did_you_mean(key, TOP_LEVEL)} "
                f"Allowed: {', '.join(f'[{k}]' for k in TOP_LEVEL)}."
            )
    project = _checked_table(data, "project", PROJECT_KEYS, path)
    base = path.parent
    roots = _table(data, "data_roots", path)
    for name, root in roots.items():
        if not isinstance(root, str):
            raise ConfigError(f"{path}: 'data_roots.{name}' must be a string path, got {shown(root)}")
    _paths_without_nul(path, {"project.runs_dir": project.get("runs_dir", ""),
                              **{f"project.plugin_dirs[{i}]": d for i, d in enumerate(project.get("plugin_dirs", []))},
                              **{f"data_roots.{name}": root for name, root in roots.items()}})
    scheduler = _checked_table(data, "scheduler", SCHEDULER_KEYS, path)
    if isinstance(scheduler.get("gpus"), list):
        scheduler["gpus"] = tuple(scheduler["gpus"])
    runs_dir = base / os.path.expanduser(project.get("runs_dir", "runs"))  # ~ as in [data_roots]
    try:
        is_file = runs_dir.exists() and not runs_dir.is_dir()
    except OSError as exc:  # a name too long for the file system: every command stopped on "File name too long"
        raise ConfigError(f"{path}: 'project.runs_dir' names a path this system cannot use ({exc.strerror}): "
                          f"{clip(str(runs_dir), 120)}; name a shorter one") from None
    if is_file:
        raise ConfigError(f"{path}: 'project.runs_dir' names {runs_dir}, which is a file, not a folder; "
                          f"name a folder (it is created if missing)")
    return Settings(
        path=path,
        scheduler=SchedulerSettings(**scheduler),
        sinks=SinksSettings(**_checked_table(data, "sinks", SINKS_KEYS, path)),
        slurm=SlurmSettings().with_overrides(_checked_table(data, "slurm", SLURM_KEYS, path)),
        runs_dir=runs_dir,
        plugin_dirs=tuple(base / os.path.expanduser(d) for d in project.get("plugin_dirs", [])),
        data_roots={k: str(base / os.path.expanduser(v)) for k, v in roots.items()},
        run=_run_table(data, path),
    )


def _paths_without_nul(path: Path, paths: dict[str, str]) -> None:
    """A path with a NUL character ("\\u0000" in TOML) names no file on any system: one line naming the
    key, where every command that read it stopped with Python's "ValueError: embedded null byte"."""
    for key, text in paths.items():
        if "\0" in text:
            raise ConfigError(f"{path}: '{key}' must be a path without NUL characters (\\u0000), got {shown(text)}")


def _run_table(data: dict, path: Path) -> dict:
    """``[run]``, with a relative ``dataset.root`` and ``dataset.cache_dir`` (``~`` expanded) taken from the
    file's folder, as ``[data_roots]`` and ``runs_dir`` are: a run started elsewhere (``FSLAB_CONFIG``) reads
    and writes the same folders."""
    run = _table(data, "run", path)
    dataset = run.get("dataset")
    for key in ("root", "cache_dir"):
        if isinstance(dataset, dict) and isinstance(dataset.get(key), str) and dataset[key]:
            dataset = {**dataset, key: str(path.parent / os.path.expanduser(dataset[key]))}
            run = {**run, "dataset": dataset}
    return run


def _checked_table(data: dict, section: str, schema: dict, path: Path) -> dict:
    """A table whose keys are all in ``schema`` and whose values pass its checks."""
    table = _table(data, section, path)
    for key, value in table.items():
        if key not in schema:
            raise ConfigError(
                f"{path}: unknown key '{section}.{key}'.{did_you_mean(key, schema)} "
                f"Allowed: {', '.join(sorted(schema))}."
            )
        check, what = schema[key]
        if not check(value):
            raise ConfigError(f"{path}: '{section}.{key}' must be {what}, got {shown(value)}")
    return table


def _table(data: dict, key: str, path: Path) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: '{key}' must be a table ([{key}]), got {shown(value)}")
    return value
