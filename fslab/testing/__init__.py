"""fslab's contract tests for plugin authors, as a pytest plugin.

fslab registers this module with pytest (the ``pytest11`` entry point), so
in any environment where fslab is installed a plugin's test suite can say::

    # tests/test_fslab_contracts.py
    from fslab.testing import ContractTests

    class TestContracts(ContractTests):
        plugins = ["my_plugin"]     # entry-point names; default: the ini option fslab_plugins

and ``pytest`` runs, for every component those plugins register, the checks
of :mod:`fslab.testing.checks`: losses, backbones, samplers, evaluators,
datasets, method recipes, sinks and studies, parameters against signatures, determinism.
A component that needs other inputs than the defaults gets them from the
class attributes (``backbone_params``, ``sampler_params``, ...), and a
dataset that reads files from :meth:`ContractTests.dataset_args`.

The plugin also adds the ini option ``fslab_plugins`` (``[tool.pytest.ini_options]``)
and the fixture ``fslab_registry``. Importing this module does not import torch.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["ContractTests", "registry_for"]

KIND_TESTS = {"test_loss": "loss", "test_backbone": "backbone", "test_sampler": "sampler",
              "test_evaluator": "evaluator", "test_dataset": "dataset", "test_method": "method", "test_sink": "sink",
              "test_study": "study"}

_registries: dict[tuple[str, ...], Any] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("fslab_plugins", type="args", default=[],
                  help="fslab plugins (entry-point names) whose components fslab.testing.ContractTests checks")


def registry_for(plugin_dirs: tuple[str, ...] = ()) -> Any:
    """Every installed fslab plugin (FSLAB_PLUGINS still restricts them) and
    the local plugin folders ``plugin_dirs``, loaded once per test session for each set of folders (as the
    paths they are: a test that moves to another folder with its own ``my_plugins`` gets that one's)."""
    from fslab.core.settings import plugin_folders

    key = plugin_folders(plugin_dirs)
    if key not in _registries:
        from fslab.core.registry import load_registry

        _registries[key] = load_registry(plugin_dirs)
    return _registries[key]


@pytest.fixture(scope="session")
def fslab_registry() -> Any:
    """The registry of every installed fslab plugin, for a plugin's own tests."""
    return registry_for()


def _no_local_plugin(plugin: str, plugin_dirs: tuple[str, ...]) -> str:
    """Why a ``local:<stem>`` plugin is not there: no plugin folder, a folder that is not one, no such file."""
    from pathlib import Path

    if not plugin_dirs:
        return f"no plugin folder to find '{plugin}' in: set plugin_dirs = (\"FOLDER\",) beside plugins"
    missing = [str(d) for d in plugin_dirs if not Path(d).is_dir()]
    if missing:
        return (f"plugin_dirs names {', '.join(missing)}, which is not a folder under the current directory "
                f"{Path.cwd()}; a relative folder is read from there, so give it from the test file: "
                f"str(Path(__file__).parent / \"{Path(missing[0]).name}\")")
    return f"no {plugin.removeprefix('local:')}.py in plugin_dirs {', '.join(map(str, plugin_dirs))}"


def _not_installed(plugin: str, loaded) -> str:
    """Why an entry-point plugin is not loaded: FSLAB_PLUGINS leaves it out, or it is not installed."""
    import os
    from importlib.metadata import entry_points

    only = os.environ.get("FSLAB_PLUGINS")
    if only is not None and plugin in {point.name for point in entry_points(group="fslab")}:
        return (f"fslab plugin '{plugin}' is installed, but FSLAB_PLUGINS={only} leaves it out: add it there, "
                f"or unset FSLAB_PLUGINS")
    from fslab.core.errors import did_you_mean

    # a plugin is named by its entry point: a package's name (qk_loss for qk_loss_loss) was told to install it
    hint = did_you_mean(plugin, sorted(loaded))
    return (f"no fslab plugin '{plugin}' is installed{'.' + hint if hint else ''} (entry points of group 'fslab': "
            f"{', '.join(sorted(loaded)) or 'none'}); pip install -e . first")


def _builds_on_an_empty_folder(registry: Any, name: str, args: dict) -> None:
    """Dataset ``name`` built as the default ``dataset_args`` builds it: one that refuses an empty
    folder (it reads files) is told where a test's files come from, not only what it lacked."""
    from fslab.core.errors import UsageError

    try:
        registry.create("dataset", name, **args)
    except UsageError as error:
        raise AssertionError(f"{name}: built with an empty folder as root, it says: {error}; a dataset that reads "
                             f"files gets them from dataset_args(self, name, tmp_path): override it to write a "
                             f"tiny layout under tmp_path and return {{'root': ..., **params}}") from error


class ContractTests:
    """Subclass it as ``Test...`` in a test module: one test per component
    of the plugins named in :attr:`plugins`, per contract."""

    plugins: list[str] | None = None  # entry-point names, or "local:<file stem>" with plugin_dirs
    plugin_dirs: tuple[str, ...] = ()  # local plugin folders (as plugin_dirs in fslab.toml)
    backbone_params: dict[str, dict] = {}  # parameters by backbone name, e.g. {"big": {"width": 8}}
    backbone_image_size: tuple[int, int] = (16, 16)
    sampler_params: dict[str, dict] = {}
    sampler_batch_size: int = 32
    evaluator_params: dict[str, dict] = {}
    sink_params: dict[str, dict] = {}  # e.g. {"my-tracker": {"mode": "offline"}}

    def dataset_args(self, name: str, tmp_path) -> dict | None:
        """The root and parameters to build dataset ``name`` with; override it
        to write a tiny layout under ``tmp_path``. The default builds it with
        an empty folder as root (enough for a generated dataset); None skips it."""
        return {"root": str(tmp_path)}

    # -- collection --------------------------------------------------------
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        name = metafunc.function.__name__
        if name == "test_plugin_loads":
            metafunc.parametrize("plugin", self._plugins(metafunc.config))
        elif name == "test_parameters":
            # recipes and studies are data: they have no parameters of their own
            components = self._components(metafunc.config,
                                          [k for k in KIND_TESTS.values() if k not in ("method", "study")])
            metafunc.parametrize("kind, name", components or [_nothing("component", 2)],
                                 ids=[f"{k}:{n}" for k, n in components] or None)
        elif name in KIND_TESTS:
            kind = KIND_TESTS[name]
            names = [n for _, n in self._components(metafunc.config, [kind])]
            self._check_params_named(kind, names)
            metafunc.parametrize("name", names or [_nothing(kind)])

    def _plugins(self, config: pytest.Config) -> list[str]:
        plugins = self.plugins
        if plugins is None:
            try:
                plugins = config.getini("fslab_plugins")
            except ValueError:  # fslab's pytest plugin is not loaded (pytest -p no:fslab.testing)
                plugins = []
        if not plugins:
            raise pytest.UsageError(f"{type(self).__name__}: name the fslab plugins to check, as the class attribute "
                                    "plugins = [...] or the ini option fslab_plugins")
        return [plugins] if isinstance(plugins, str) else list(plugins)  # plugins = "mine": one, not a letter each

    def _components(self, config: pytest.Config, kinds: list[str]) -> list[tuple[str, str]]:
        registry, plugins = self.registry, set(self._plugins(config))
        return [(kind, name) for kind in kinds for name in registry.names(kind)
                if registry.get(kind, name).plugin in plugins]

    def _check_params_named(self, kind: str, names: list[str]) -> None:
        """``backbone_params = {"big": ...}`` for a backbone the plugins do not register (a misspelt
        name) was never used, and its test ran with the defaults: said when the tests are collected."""
        from fslab.core.errors import did_you_mean

        given = getattr(self, f"{kind}_params", None) or {}
        for name in given if names else ():  # none registered: test_plugin_loads says why
            if name not in names:
                raise pytest.UsageError(f"{type(self).__name__}: {kind}_params names '{name}', but the plugins checked "
                                        f"register no {kind} of that name.{did_you_mean(name, names)} Their "
                                        f"{kind}s: {', '.join(names)}")

    @property
    def registry(self) -> Any:
        return registry_for(self._plugin_dirs())

    def _plugin_dirs(self) -> tuple[str, ...]:
        """``plugin_dirs`` as folders: one given alone (``("my_plugins")``, the comma forgotten) is one
        folder, not a folder per letter."""
        import os

        dirs = self.plugin_dirs
        return (dirs,) if isinstance(dirs, (str, os.PathLike)) else tuple(dirs)

    # -- the contracts -------------------------------------------------------
    def test_plugin_loads(self, plugin: str) -> None:
        from fslab.core.registry import HOOKS

        failed = {f.plugin: f.error for f in self.registry.failures}
        assert plugin not in failed, f"plugin '{plugin}' failed to load: {failed.get(plugin)}"
        if plugin.startswith("local:"):
            assert plugin in self.registry.plugins, _no_local_plugin(plugin, self._plugin_dirs())
        assert plugin in self.registry.plugins, _not_installed(plugin, self.registry.plugins)
        # a plugin with no hook passed, every other contract skipped for want of a component
        assert any(c.plugin == plugin for named in self.registry.components.values() for c in named.values()), (
            f"plugin '{plugin}' loads but registers no component: implement a hook of fslab "
            f"({', '.join(HOOKS.values())}) with @hookimpl above it, calling register(...)")

    def test_parameters(self, kind: str, name: str) -> None:
        from fslab.testing.checks import check_parameters

        check_parameters(self.registry, kind, name)

    def test_loss(self, name: str) -> None:
        from fslab.testing.checks import check_loss

        check_loss(self.registry, name)

    def test_backbone(self, name: str) -> None:
        from fslab.testing.checks import check_backbone

        size = self.backbone_image_size
        if not (isinstance(size, (tuple, list)) and len(size) == 2):
            raise AssertionError(f"backbone_image_size is the images' (height, width), such as (16, 16), got {size!r}")
        check_backbone(self.registry, name, self.backbone_params.get(name), tuple(size))

    def test_sampler(self, name: str) -> None:
        from fslab.testing.checks import check_sampler

        check_sampler(self.registry, name, self.sampler_params.get(name), self.sampler_batch_size)

    def test_evaluator(self, name: str) -> None:
        from fslab.testing.checks import check_evaluator

        check_evaluator(self.registry, name, self.evaluator_params.get(name))

    def test_dataset(self, name: str, tmp_path) -> None:
        from fslab.testing.checks import check_dataset

        args = self.dataset_args(name, tmp_path)
        if args is None:
            pytest.skip(f"dataset '{name}': no layout to read (override dataset_args to write one)")
        if type(self).dataset_args is ContractTests.dataset_args:
            _builds_on_an_empty_folder(self.registry, name, args)
        check_dataset(self.registry, name, args)

    def test_method(self, name: str) -> None:
        from fslab.testing.checks import check_method

        check_method(self.registry, name)

    def test_sink(self, name: str, tmp_path) -> None:
        from fslab.testing.checks import check_sink

        check_sink(self.registry, name, self.sink_params.get(name), tmp_path)

    def test_study(self, name: str, tmp_path) -> None:
        from fslab.testing.checks import check_study

        check_study(self.registry, name, tmp_path)


def _nothing(what: str, values: int = 1):
    """The one parameter of a contract with nothing to check: a skip that says so."""
    return pytest.param(*[None] * values, marks=pytest.mark.skip(reason=f"the plugins register no {what}"), id="none")
