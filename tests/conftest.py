"""Shared fixtures: a registry of the built-in plugins only, and seeded data."""

from __future__ import annotations

import os

import hypothesis
import pytest

# One thread per process: the suite runs in two test processes on two cores, each
# starting tiny training runs of its own, and more threads than cores only contend.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Every property test draws the same examples on every run (a test's own settings inherit this):
# one that drew new ones could fail a CI run on an example no earlier run had tried.
hypothesis.settings.register_profile("fslab", derandomize=True, database=None)
hypothesis.settings.load_profile("fslab")


def _builtin_plugin_names() -> str:
    """fslab's own entry points, as installed (so a new built-in needs no edit here)."""
    from importlib.metadata import distribution

    return ",".join(sorted(ep.name for ep in distribution("fslab").entry_points if ep.group == "fslab"))


BUILTIN_PLUGINS = _builtin_plugin_names()


def builtin_registry():
    """fslab's own entry points, loaded strictly, outside any fixture (for parametrising at collection time)."""
    import os

    from fslab.core.registry import load_registry

    saved = {k: os.environ.get(k) for k in ("FSLAB_PLUGINS", "FSLAB_STRICT_PLUGINS")}
    os.environ["FSLAB_PLUGINS"], os.environ["FSLAB_STRICT_PLUGINS"] = BUILTIN_PLUGINS, "1"
    try:
        return load_registry()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def builtin_plugins(monkeypatch):
    """Load only the built-in entry points, so whatever else is installed in
    the environment cannot change a test; failures are reported, not raised
    (the default), and fslab's process-wide registry is rebuilt."""
    import fslab

    monkeypatch.setenv("FSLAB_PLUGINS", BUILTIN_PLUGINS)
    monkeypatch.delenv("FSLAB_STRICT_PLUGINS", raising=False)
    monkeypatch.setattr(fslab, "_registry", None)
    monkeypatch.setattr(fslab, "_registry_dirs", None)
    monkeypatch.setattr(fslab, "_registry_here", False)  # a registry a test sets stands until it sets another
    return BUILTIN_PLUGINS.split(",")


@pytest.fixture
def registry(builtin_plugins, monkeypatch):
    """A registry of the built-in plugins, loaded strictly: a built-in that
    fails to import is a test failure, not a warning."""
    from fslab.core.registry import load_registry

    monkeypatch.setenv("FSLAB_STRICT_PLUGINS", "1")
    return load_registry()


@pytest.fixture(autouse=True)
def textual_idle_in_short_naps(monkeypatch):
    """Textual's Pilot waits after each key press, and at each ``pilot.pause()``, until the app's process is idle:
    it sleeps 20 ms at a time until one such nap used under 1 ms of the process's CPU (5%). Here each nap is 5 ms
    and idle is under 0.25 ms of CPU in it, the same share: an app still at work is waited for as before, and
    one that has finished is seen to have in a quarter of the time (tests/test_tui.py took 114 s, idle for about
    half of it, and 71 s so). Only where a test module has imported Textual already (the dashboard's tests
    import it as they are collected); nothing is imported here."""
    import sys

    wait = sys.modules.get("textual._wait")
    if wait is not None:
        monkeypatch.setattr(wait, "SLEEP_GRANULARITY", 1 / 200)
        monkeypatch.setattr(wait, "SLEEP_IDLE", 1 / 200 / 20)


@pytest.fixture
def torch_seed():
    """Seed torch's global generator so a test's random data is fixed."""
    import torch

    torch.manual_seed(1234)
    return 1234


@pytest.fixture
def make_episode(torch_seed):
    """Factory for an episode laid out class by class (support then query rows)
    with non-contiguous label values: returns z, labels, support mask."""
    return episode_batch


@pytest.fixture
def make_class_batch(torch_seed):
    """Factory for ``classes`` × ``per_class`` rows in shuffled order."""
    return class_batch


def episode_batch(ways: int, shots: int, queries: int, dim: int = 8, label_offset: int = 0):
    import torch

    labels = torch.tensor([label_offset + 7 * c for c in range(ways) for _ in range(shots + queries)])
    support = torch.tensor(([True] * shots + [False] * queries) * ways)
    z = torch.randn(len(labels), dim, dtype=torch.float64, requires_grad=True)
    return z, labels, support


def class_batch(classes: int, per_class: int, dim: int = 8):
    import torch

    labels = torch.arange(classes).repeat_interleave(per_class)
    labels = labels[torch.randperm(len(labels))]
    z = torch.randn(len(labels), dim, dtype=torch.float64, requires_grad=True)
    return z, labels


@pytest.fixture
def project(tmp_path, builtin_plugins, monkeypatch):
    """An empty project folder to run the real CLI in (subprocesses inherit the env)."""
    folder = tmp_path / "project"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.delenv("FSLAB_CONFIG", raising=False)
    return folder


@pytest.fixture
def torchrun_tmp(tmp_path, monkeypatch):
    """A temporary folder under the test's tmp_path for the processes it starts (TMPDIR, which they inherit):
    torchrun, given no log folder, makes a torchelastic_* folder in the temporary folder for each run of several
    processes (--gpus N) and never removes it; fslab gives it the run's .torchrun, which it removes, and a test
    checks that nothing is left here (before, the tests that started it left hundreds in /tmp)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


@pytest.fixture
def another_users(monkeypatch):
    """``another_users(path)``: from now on this process may not open the file at ``path`` to write, as
    where another user made it in a store a group shares (the suite runs as root here, who may write
    any file, so ``os.open`` refuses it as the kernel refuses a user); reading it still works."""
    denied = set()
    real_open = os.open

    def refusing(path, flags, *args, **kwargs):
        if (os.path.abspath(path) in denied and flags & (os.O_WRONLY | os.O_RDWR) and not flags & os.O_EXCL
                and os.path.exists(path)):  # O_EXCL: the kernel says the file exists before that it is refused
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    return lambda path: denied.add(os.path.abspath(path))


def pytest_configure(config):
    """Compile fslab's sources to bytecode once, before any test starts a process. Where
    PYTHONDONTWRITEBYTECODE is set (as in some CI images), Python reads cached bytecode but never
    writes it, so each of the suite's hundreds of CLI and worker processes would compile fslab's
    own modules again: about half of a ``fslab runs`` call's time on this project's 2-core
    machine. The xdist workers start after this (it runs in the controller only)."""
    if hasattr(config, "workerinput"):
        return
    import compileall

    import fslab_plugins

    import fslab

    for package in (fslab, fslab_plugins):
        for folder in package.__path__:
            compileall.compile_dir(folder, quiet=2)  # a folder that is not writable is left as it is


def pytest_collection_modifyitems(config, items):
    """The longest tests first: the slow end-to-end ones (real training runs) start
    while the fast ones fill the gaps, instead of one long test running on alone at
    the end of the suite; the built-in studies' end-to-end tests, the longest, lead."""
    def weight(item) -> int:
        if "every_built_in_study" in item.name:
            return 0
        return 1 if item.get_closest_marker("slow") else 2

    items.sort(key=weight)  # stable: the order within each group stays the files'
