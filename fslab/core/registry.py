"""Plugin discovery and the component registry.

Plugins are modules that implement the hooks in :mod:`fslab.core.hookspecs`. They are
found through the ``fslab`` entry-point group (built-ins included, no private
path) and in project-local plugin folders named in ``fslab.toml``.

Environment:
  FSLAB_PLUGINS=a,b     load only these entry points (by entry-point name; one not installed is a load failure)
  FSLAB_STRICT_PLUGINS=1  a plugin that fails to load is an error, not a warning
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from fslab.core import hookspecs
from fslab.core.declared_plugins import stale_entry_point
from fslab.core.errors import (
    FslabError,
    PluginError,
    UnknownName,
    UsageError,
    did_you_mean,
    exception_words,
    plugin_call,
)
from fslab.core.limits import check_rule, rule_of
from fslab.core.module_source import defined_names, files_of, spells
from fslab.core.param_defaults import mistyped_default, refused_defaults
from fslab.core.plugin_import import (
    closest_attribute,
    closest_module,
    closest_name,
    entry_point_error,
    hook_modules,
    load_entry_point,
    names_module,
    plugin_file_error,
    register_error,
)
from fslab.core.plugin_params import unknown_param_line
from fslab.core.types import trait_problem

ENTRY_POINT_GROUP = "fslab"
KINDS = ("loss", "backbone", "sampler", "evaluator", "dataset", "method", "study", "sink")
HOOKS = {
    "loss": "register_losses",
    "backbone": "register_backbones",
    "sampler": "register_samplers",
    "evaluator": "register_evaluators",
    "dataset": "register_datasets",
    "method": "register_methods",
    "study": "register_studies",
    "sink": "register_sinks",
}
# Losses and evaluators are called once per batch/episode block: a function
# target is bound to its parameters; every other target is built with them.
BOUND_KINDS = ("loss", "evaluator")
# Values fslab hands a component when its signature names them (before or after ``*``):
# they are not configuration parameters. A dataset's own ``image_size`` is a parameter.
FILLED_IN = {
    "loss": ("out_dim", "num_classes"),
    "evaluator": ("training_loss",),  # the run's loss section: its name and every parameter
    "backbone": ("in_channels", "image_size"),
    "sampler": ("labels", "batch_size", "seed"),
    "dataset": ("root",),
    "sink": ("run",),
}


def named(kind: str, name: str, plugin: str) -> str:
    """How a line that blames a component names it, and its plugin: ``loss 'boom' from plugin 'local:boom'``;
    :attr:`Component.named`, and what ``register()`` says of one it refuses before it is a component."""
    return f"{kind} '{name}' from plugin '{plugin}'"


@dataclass(frozen=True)
class Component:
    """One registered loss, backbone, sampler, evaluator, dataset, method or study
    (whose target is the path of its TOML file)."""

    kind: str
    name: str
    target: Any
    description: str
    paper: str
    params: dict
    plugin: str
    version: str | None
    origin: str
    info: dict = field(default_factory=dict)

    @property
    def named(self) -> str:
        """How a line that blames this component names it: ``loss 'boom' from plugin 'local:boom'``."""
        return named(self.kind, self.name, self.plugin)

    def built(self, build: Callable[[], Any], passes: tuple[type[BaseException], ...] = ()) -> Any:
        """``build()``, this component built by fslab (before a run exists, or by the worker): what its own
        code raises (not the UsageError of a value it refuses, nor ``passes``) is one line naming it and its
        plugin, ``sampler 'mine' from plugin 'mine' failed to build: KeyError: ...``."""
        return plugin_call(build, f"{self.named} failed to build", passes=passes)

    def resolve(self) -> Any:
        """The target itself, importing a lazy ``"module:attr"`` reference."""
        if not isinstance(self.target, str):
            return self.target
        module_name, _, attr = self.target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # a typo in the target (Did you mean ...), or a package it lacks
            raise PluginError(self._not_found(exc)) from exc
        except ImportError as exc:
            raise PluginError(f"{self._cannot}: {exc}") from exc
        except Exception as exc:  # the module's own code failed as it ran (a NameError): fslab.create raised it bare
            raise PluginError(f"{self.named} points at '{self.target}', whose module failed as it was imported: "
                              f"{exception_words(exc)}") from exc
        if not hasattr(module, attr):  # a typo: SmallConvnet for SmallConvNet
            raise PluginError(self._no_attribute(closest_attribute(module, attr)))
        return getattr(module, attr)

    def check_target(self) -> None:
        """The PluginError :meth:`resolve` would raise for a lazy target whose module, or its attribute, is
        nowhere, raised without running the module (:mod:`fslab.core.module_source`: importing it may import
        torch): a run's components are checked so before its folder is made, where a typo failed the run."""
        if not isinstance(self.target, str):
            return
        module_name, _, attr = self.target.partition(":")
        try:
            names = defined_names(module_name)
        except ModuleNotFoundError as exc:
            raise PluginError(self._not_found(exc)) from None
        if names is not None and attr not in names:
            raise PluginError(self._no_attribute(closest_name(attr, names)))

    @property
    def _cannot(self) -> str:
        return f"{self.named} points at '{self.target}', which cannot be imported"

    def _not_found(self, exc: ModuleNotFoundError) -> str:
        """The target's module, or one it imports, missing: the closest module there is where it is a typo."""
        module_name, _, attr = self.target.partition(":")
        close = closest_module(exc.name) if names_module(exc, module_name) else None
        close = close and close + module_name[len(exc.name):]  # pkg.lossez.nets: pkg.losses.nets, not pkg.losses
        return f"{self._cannot}: {exc}" + (f". Did you mean '{close}:{attr}'?" if close else "")

    def _no_attribute(self, close: str | None) -> str:
        module_name, _, attr = self.target.partition(":")
        return (f"{self._cannot}: module '{module_name}' has no attribute '{attr}'"
                + (f". Did you mean '{module_name}:{close}'?" if close else ""))

    def describe(self) -> dict:
        """A JSON-ready description, as ``fslab plugins --json`` prints it: a copy, so
        that a caller who edits it (a notebook) leaves the registered defaults alone."""
        return copy.deepcopy({
            "kind": self.kind,
            "name": self.name,
            "description": self.description,
            "paper": self.paper,
            "params": self.params,
            "plugin": self.plugin,
            "version": self.version,
            "origin": self.origin,
            **({"file": str(self.target)} if self.kind == "study" else {}),
            **{k: v for k, v in self.info.items() if _jsonable(v) and k != "allowed"},
            **({"allowed": self.allowed_text()} if self.info.get("allowed") else {}),
            # the same keys on every line: a component that did not say is not episodic
            "episodic": bool(self.info.get("episodic", False)),
            "recipe": self.target if self.kind == "method" else None,
        })

    def allowed_text(self) -> dict[str, str]:
        """What each parameter with a declared rule allows, in words: ``{"k": "at least 1"}``."""
        return {param: rule.text for param, rule in self.info.get("allowed", {}).items()}


@dataclass(frozen=True)
class LoadFailure:
    plugin: str
    error: str

    @property
    def line(self) -> str:
        return failure_line(self.plugin, self.error)


def failure_line(plugin: str, error: str) -> str:
    """How every surface (the commands, the dashboard, the Python API's warning) says a plugin failed to load."""
    return f"fslab plugin '{plugin}' failed to load: {error}"


def keyword_params(target: Any, kind: str = "") -> dict:
    """The keyword-only parameters of a function or class, with their defaults,
    but for the values fslab fills in for a component of ``kind`` (FILLED_IN)."""
    func = target.__init__ if inspect.isclass(target) else target
    params = {}
    for p in inspect.signature(func).parameters.values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in FILLED_IN.get(kind, ()):
            params[p.name] = None if p.default is inspect.Parameter.empty else p.default
    return params


class Registry:
    """Components by kind and name, plus the plugins that failed to load."""

    def __init__(self) -> None:
        self.components: dict[str, dict[str, Component]] = {k: {} for k in KINDS}
        self.failures: list[LoadFailure] = []
        self.plugins: dict[str, tuple[str | None, str]] = {}  # name -> (version, origin)
        self.failed_origins: dict[str, str] = {}  # a plugin that failed to import -> its origin, as in plugins

    # -- building ---------------------------------------------------------
    def add(self, component: Component) -> None:
        existing = self.components[component.kind].get(component.name)
        if existing is not None:
            where = "one file another name (its name key)" if component.kind == "study" else \
                "yours another name (the one its register call gives)"
            fix = f"Give {where}, uninstall"  # a plugin's author, told only to uninstall, would drop their own
            raise PluginError(
                f"{component.kind} '{component.name}' is registered twice: by "
                f"{_provider(existing)} and by {_provider(component)}. {fix} one "
                f"of them or restrict loading with FSLAB_PLUGINS."
            )
        self.components[component.kind][component.name] = component

    def drop(self, plugin: str) -> None:
        """Remove every component ``plugin`` registered: a plugin whose hook raised loads all or nothing, where
        what it registered before the raise was listed and trained with, while it was said to have failed."""
        for kind, components in self.components.items():
            self.components[kind] = {name: c for name, c in components.items() if c.plugin != plugin}

    # -- queries -----------------------------------------------------------
    def get(self, kind: str, name: str) -> Component:
        check_kind(kind)
        try:
            return self.components[kind][name]
        except (KeyError, TypeError):  # TypeError: a name that cannot be one (a list)
            error = UnknownName(kind, name, self.components[kind])
        if (owner := self.failed_owner(name)) is not None:  # the one line: the load failure is said nowhere else
            error.args = (f"Unknown {kind} '{name}': plugin '{owner.plugin}', whose source names it, failed to load: "
                          f"{owner.error}",)
        elif missing := self.missing_names():  # the name may be one a plugin that failed to load would have registered
            error.args = (f"{error.args[0]} Not among them: {missing}.",)
        if stale := stale_entry_point(name):  # or one an entry point added since its package was installed would
            error.args = (f"{error.args[0]} {stale}",)
        raise error

    def missing_names(self) -> str:
        """What the plugins that failed to load would have registered, in words, each with why it failed
        ('' where none failed)."""
        if not self.failures:
            return ""
        first, *more = self.failures
        return (f"what plugin '{first.plugin}' registers, which failed to load ({first.error})" if not more else
                f"what plugins {', '.join(f'{f.plugin!r} ({f.error})' for f in self.failures)} register, which "
                f"failed to load")

    def failed_owner(self, name: str) -> LoadFailure | None:
        """The plugin that failed to load whose source spells ``name`` in quotes (as its register call names a
        component), read without running it; None where no one plugin does."""
        owners = [f for f in self.failures if spells(self._source_files(f.plugin), name)]
        return owners[0] if len(owners) == 1 else None

    def _source_files(self, plugin: str) -> list[Path]:
        """The files of a plugin's source: a local plugin's file, or the module (a package's files) its entry
        point names; none where it is nowhere (a plugin folder that is missing)."""
        origin = self.failed_origins.get(plugin) or self.plugins.get(plugin, (None, ""))[1]
        if origin.startswith("entry point "):
            return files_of(origin.removeprefix("entry point ").partition(":")[0].strip())
        return [Path(origin)] if origin.endswith(".py") else []

    def names(self, kind: str, pattern: str = "*") -> list[str]:
        check_kind(kind)
        if not isinstance(pattern, str):
            raise UsageError(f"a name pattern is text such as 'resnet*', got {pattern!r}")
        return sorted(n for n in self.components[kind] if fnmatch.fnmatchcase(n, pattern))

    def accepts(self, kind: str, name: str, param: str) -> bool:
        """Whether building component ``name`` can take ``param`` (a target with ``**kwargs`` takes any)."""
        accepted = _accepted_names(self.get(kind, name).resolve(), kind)
        return accepted is None or param in accepted

    def reads_files(self, dataset: str) -> bool:
        """Whether ``dataset`` reads files from a data root: its constructor names ``root`` (or takes any
        keyword). One that does not (``synthetic``, drawn from its seed) is handed none, and no surface
        names, fills in or checks a data root for it. A dataset no plugin registers here is taken to read files."""
        try:
            return self.accepts("dataset", dataset, "root")
        except FslabError:
            return True

    def create(self, kind: str, name: str, context: dict | None = None, **kwargs: Any) -> Any:
        """Build component ``name`` of ``kind``; keyword arguments are checked
        against what the target accepts before anything runs.

        ``context`` holds values the trainer can offer (e.g. ``out_dim`` and
        ``num_classes`` for a loss with a classifier); each is passed only if
        the target's signature names it."""
        component = self.get(kind, name)
        target = component.resolve()
        if kind == "method":
            if kwargs:
                raise UsageError(f"method '{name}' is a recipe and takes no parameters")
            return copy.deepcopy(target)  # the caller's to edit: the registered recipe stays as it was
        accepted = _accepted_names(target, kind)
        if kind == "dataset" and accepted is not None and "root" not in accepted:  # one that reads no files
            kwargs = {k: v for k, v in kwargs.items() if k != "root"}
        if context:
            wanted = set(context) if accepted is None else accepted
            kwargs = {**{k: v for k, v in context.items() if k in wanted and k not in kwargs}, **kwargs}
        if accepted is not None:
            _refuse_unaccepted(self, component, kwargs, accepted)
        if kind in BOUND_KINDS and not inspect.isclass(target):
            bound = functools.partial(target, **kwargs)
            functools.update_wrapper(bound, target)
            return bound
        missing = _missing_names(target, kwargs)
        if unfilled := [m for m in missing if m not in FILLED_IN.get(kind, ())]:
            raise PluginError(_unfilled_line(component, unfilled[0]))
        if missing:  # what a run fills in (in_channels, labels, ...): one line, not Python's TypeError
            raise UsageError(f"{kind} '{name}' needs {', '.join(missing)} to be built (a run passes "
                             f"{'it' if len(missing) == 1 else 'them'} itself); give "
                             f"{', '.join(f'{m}=...' for m in missing)}")
        return target(**kwargs)


def _unfilled_line(component: Component, name: str) -> str:
    """Why building ``component`` fails on an argument ``name`` it requires that no run passes: neither a value
    fslab fills in for its kind nor a parameter with a default (a lazy target's keyword-only parameter left out
    of ``register(params=...)``, a dataset's folder named ``path`` for ``root``). The plugin's fault: its run
    failed saying "needs hidden to be built (a run passes it itself); give hidden=...", which no run does."""
    target = f"'{component.target}'" if isinstance(component.target, str) else "its target"
    filled = ", ".join(FILLED_IN.get(component.kind, ())) or "none"
    declare = " and declare it in register(params=...)" if isinstance(component.target, str) else ""
    fix = f"give it a default after * (*, {name}=...){declare}"
    if component.kind == "dataset":  # its folder under another name: reads_files took it for one that reads none
        fix = f"a dataset that reads files is handed its folder as root (__init__(self, root, *, ...)); else {fix}"
    return (f"{component.named}: {target} requires '{name}', which is neither a value fslab fills in for a "
            f"{component.kind} ({filled}) nor a parameter with a default; {fix}")


def _refuse_unaccepted(registry: Registry, component: Component, kwargs: dict, accepted: set[str]) -> None:
    """A keyword the target does not take: the caller's (a UsageError, said as a run's configuration says it:
    :func:`unknown_param_line`), or, where it is a parameter the plugin declared in ``register(params=...)``
    that its lazy target lacks, the plugin's (a PluginError: that was "has no parameter 'depth'", as if the
    user had set it, when nobody had)."""
    kind, name = component.kind, component.name
    bad = [k for k in kwargs if k not in accepted]
    declared = [k for k in bad if k in component.params]
    if declared:
        target = f"'{component.target}'" if isinstance(component.target, str) else "its target"
        raise PluginError(f"{component.named} declares the parameter '{declared[0]}' "
                          f"in register(params=...), which {target} does not take; declare its keyword-only "
                          f"parameters exactly (the contract tests compare them)")
    if bad:
        raise UsageError(unknown_param_line(registry, kind, name, bad[0], sorted(accepted)))


def create_dataset(registry: Registry, config: dict) -> Any:
    """The dataset a run configuration names: ``dataset.root`` as the root,
    every other key of the section but ``name`` as a plugin parameter."""
    section = config["dataset"]
    params = {k: v for k, v in section.items() if k not in ("name", "root")}
    return registry.create("dataset", section["name"], root=section["root"], **params)


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise UnknownName("plugin kind", kind, KINDS)


def _accepted_names(target: Any, kind: str = "") -> set[str] | None:
    """The keywords building ``target`` takes (None: any). A loss or evaluator
    function is bound to its keyword-only parameters only: the others
    (``z, labels, support``) are what each call passes."""
    func = target.__init__ if inspect.isclass(target) else target
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    if kind in BOUND_KINDS and not inspect.isclass(target):
        return {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return {p.name for p in params if p.name != "self" and p.kind is not inspect.Parameter.VAR_POSITIONAL}


def _missing_names(target: Any, given: dict) -> list[str]:
    """The arguments building ``target`` requires (no default) that ``given`` lacks."""
    func = target.__init__ if inspect.isclass(target) else target
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return []
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if inspect.isclass(target) and params and params[0].kind in named:
        params = params[1:]  # self
    return [p.name for p in params if p.kind in named and p.default is inspect.Parameter.empty
            and p.name not in given]


def _provider(c: Component) -> str:
    """Who registered ``c``: the plugin, its version and origin, and for a study its file (two packages'
    files giving one name are told apart by their paths)."""
    file = f", file {c.target}" if c.kind == "study" else ""
    return f"plugin '{c.plugin}'" + (f" {c.version}" if c.version else "") + f" ({c.origin}{file})"


def _jsonable(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, list, dict, type(None)))


# -- loading -----------------------------------------------------------------


def load_registry(plugin_dirs: Iterable[str | os.PathLike] = (), *, strict: bool | None = None) -> Registry:
    """Discover every plugin and collect what it registers."""
    if strict is None:
        strict = os.environ.get("FSLAB_STRICT_PLUGINS", "") not in ("", "0")
    only = os.environ.get("FSLAB_PLUGINS")
    allowed = None if only is None else {s.strip() for s in only.split(",") if s.strip()}

    pm = pluggy.PluginManager("fslab")
    pm.add_hookspecs(hookspecs)
    registry = Registry()

    def fail(plugin: str, exc: BaseException, error: str | None = None) -> None:
        error = error or exception_words(exc)
        if strict:
            raise PluginError(f"plugin '{plugin}' failed to load: {error}") from exc
        registry.failures.append(LoadFailure(plugin, error))

    _load_entry_points(pm, registry, allowed, fail)
    for folder in plugin_dirs:
        if not Path(folder).is_dir():
            fail(f"local:{Path(folder).name}", NotADirectoryError(
                f"{folder} is not a folder (plugin_dirs in fslab.toml names it)"))
            continue
        for path in sorted(Path(folder).glob("*.py")):
            name = f"local:{path.stem}"
            try:
                if _loaded_before(registry, name, path):
                    continue  # a folder plugin_dirs names twice
                _add_plugin(pm, _import_file(path), name)
            except (Exception, SystemExit) as exc:
                fail(name, exc, plugin_file_error(path, exc))
                registry.failed_origins[name] = str(path)
                continue
            registry.plugins[name] = (None, str(path))

    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(_unknown_hook(pm, exc)) from exc

    failed: set[str] = set()  # plugins whose hook raised: each registers nothing, its later hooks not called
    for kind, hook_name in HOOKS.items():
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            if impl.plugin_name in failed:
                continue
            version, origin = registry.plugins[impl.plugin_name]
            register = _register_callback(registry, kind, impl.plugin_name, version, origin)
            try:
                impl.function(register=register)
            except PluginError:
                raise
            except (Exception, SystemExit) as exc:
                failed.add(impl.plugin_name)
                registry.drop(impl.plugin_name)  # what it registered before it raised (in this hook or another)
                fail(impl.plugin_name, exc, register_error(impl.plugin_name, hook_name, origin, version, exc))
    return registry


def _load_entry_points(pm: pluggy.PluginManager, registry: Registry, allowed: set[str] | None,
                       fail: Callable[..., None]) -> None:
    """Add to ``pm`` the plugins of the ``fslab`` entry points (those ``allowed`` names, None: all), recording
    each in ``registry``; one that fails to load is ``fail``'s, with the entry point and its distribution."""
    from importlib.metadata import entry_points  # here: importing the registry module stays cheap

    labels: dict[str, str] = {}  # "name version" by distribution: its METADATA is parsed once, not per entry point
    declared = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    taken = {ep.value.partition(":")[0].strip() for ep in declared}  # the modules the entry points name
    for ep in declared:
        if allowed is not None and ep.name not in allowed:
            continue
        if pm.has_plugin(ep.name):
            continue  # the same distribution seen twice on sys.path
        try:
            _add_plugin(pm, load_entry_point(ep, _distribution_label(ep, labels)), ep.name, taken)
        except (Exception, SystemExit) as exc:  # a broken plugin (even one that exits) must not take fslab down
            fail(ep.name, exc, entry_point_error(ep, _distribution_label(ep, labels), exc))
            registry.failed_origins[ep.name] = f"entry point {ep.value}"
            continue
        registry.plugins[ep.name] = (_distribution_label(ep, labels), f"entry point {ep.value}")
    names = [ep.name for ep in declared]
    for name in sorted((allowed or set()) - set(names)):  # a typo there loaded nothing of it, in silence
        if not name.startswith("local:"):  # a plugin folder's files load whatever FSLAB_PLUGINS says
            fail(name, LookupError(name), f"FSLAB_PLUGINS names it, and no installed package declares an fslab "
                                          f"entry point of that name.{did_you_mean(name, names)} fslab plugins lists "
                                          f"those installed with FSLAB_PLUGINS unset")


def _add_plugin(pm: pluggy.PluginManager, module: Any, name: str, taken: set[str] | None = None) -> None:
    """Register a plugin's module with pluggy, refusing a function named as one of fslab's hooks but not
    decorated with ``@hookimpl``: pluggy passed over it, and the plugin loaded registering nothing, so every
    command called its components unknown and its contract tests were all skipped, never failed; and refusing
    an entry point's object that is no module and holds no hook (:func:`_holds_no_hook`), or, for an entry point
    (``taken``: the modules the group's entry points name), a module that holds none (:func:`_hookless_module`;
    a plugin folder's file may be a helper). A TypeError: the plugin's load failure."""
    for hook in HOOKS.values():
        function = getattr(module, hook, None)
        if callable(function) and not hasattr(function, f"{hookspecs.hookimpl.project_name}_impl"):
            raise TypeError(f"{hook}() is not decorated with @hookimpl, so fslab never calls it and the plugin "
                            f"registers nothing: put @hookimpl (from fslab.plugin import hookimpl) above it")
        if callable(function) and (problem := _hook_signature_problem(function, hook)):
            raise TypeError(problem)
    try:
        pm.register(module, name=name)
    except pluggy.PluginValidationError as exc:  # pluggy's words span lines: one line, as every load failure
        raise TypeError(" ".join(str(exc).split())) from None
    if not inspect.ismodule(module) and not pm.get_hookcallers(module):
        pm.unregister(module)
        raise TypeError(_holds_no_hook(module, name))
    if taken is not None and inspect.ismodule(module) and not pm.get_hookcallers(module):
        pm.unregister(module)
        raise TypeError(_hookless_module(module.__name__, name, taken))


def _hookless_module(module: str, plugin: str, taken: set[str]) -> str:
    """Why an entry point naming a module that holds no hook fails: ``mine = "pkg"`` for ``"pkg.method"`` (the
    package, its hooks in a module of it) loaded registering nothing, in silence: fslab plugins listed none of its
    components and exited with 0, every command called them unknown, and fslab study show said to install again
    the package that shipped a study, which was installed. The module meant, where one of the package's defines
    a hook that no other entry point names, is read from its source (:func:`hook_modules`)."""
    found = hook_modules(module, HOOKS.values(), taken)
    where = (f": {plugin} = \"{found[0]}\"" if len(found) == 1 else f" (one of {', '.join(found)})" if found
             else f" (fslab's hooks: {', '.join(HOOKS.values())})")
    return (f"module '{module}' holds no @hookimpl function, so the plugin would register nothing; an entry point "
            f"names the module that holds them{where}")


def _hook_signature_problem(function: Callable, hook: str) -> str:
    """Why fslab cannot call a hook as it calls each, ``hook(register=...)`` ('' where it can): one written
    ``register_losses(reg)`` failed its plugin's loading in pluggy's three lines ("Argument(s) {'reg'} are
    declared in the hookimpl but can not be found in the hookspec"), and ``register_losses()`` in Python's
    ``got an unexpected keyword argument 'register'``, neither saying what to write."""
    try:
        signature = inspect.signature(function)
        signature.bind(register=None)
    except ValueError:  # no signature to read: let the call tell
        return ""
    except TypeError:
        return (f"{hook}{signature} cannot take what fslab passes each hook, one argument named register: "
                f"write def {hook}(register)")
    return ""


def _holds_no_hook(target: Any, plugin: str) -> str:
    """Why an entry point naming something other than a module, that holds no hook, fails: pluggy calls the
    @hookimpl functions found on what an entry point names, so ``mine = "pkg.loss:register_losses"`` (the hook
    itself) or ``"pkg.loss:contrastive"`` (the loss) loaded registering nothing, every command calling the
    plugin's components unknown, and the contract test said to implement a hook that was there."""
    what = ("a function" if inspect.isroutine(target) else "a class" if inspect.isclass(target)
            else f"a {type(target).__name__} object")
    module = getattr(target, "__module__", None) or "its module"
    named = getattr(target, "__qualname__", None) or repr(target)
    return (f"{module}:{named} is {what}, not a module: fslab calls the @hookimpl functions of what an entry "
            f"point names, and it has none, so the plugin would register nothing; name the module that holds "
            f"them: {plugin} = \"{module}\"")


def _unknown_hook(pm: pluggy.PluginManager, exc: pluggy.PluginValidationError) -> str:
    """One line naming the plugin, the hook it misspelt and the closest of fslab's hooks."""
    found = re.search(r"unknown hook '(\w+)'", str(exc))
    if found is None:
        return f"a plugin implements a hook fslab does not define: {exc}"
    hook = found.group(1)
    plugin = pm.get_name(exc.plugin) if exc.plugin is not None else None
    return (f"plugin '{plugin}' ({getattr(exc.plugin, '__name__', '?')}) implements {hook}, which is not a hook "
            f"of fslab.{did_you_mean(hook, HOOKS.values())} The hooks: {', '.join(HOOKS.values())}.")


def _distribution_label(ep, labels: dict[str, str]) -> str | None:
    """``"fslab 0.1.0"``: the name and version of the distribution that ships ``ep``."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None
    key = str(getattr(dist, "_path", "")) or ep.value
    if key not in labels:
        metadata = dist.metadata  # parsing it is most of the cost of listing plugins
        labels[key] = f"{metadata['Name']} {metadata['Version']}"
    return labels[key]


def _register_callback(registry: Registry, kind: str, plugin: str, version, origin) -> Callable:
    def register(*args, **kwargs):
        try:
            inspect.signature(add).bind(*args, **kwargs)
        except TypeError as exc:  # Python's own words name a function the plugin author never saw
            raise TypeError(f"{kind} register() of plugin '{plugin}': {exc}; it is called as "
                            f"register(target, name='...', description='...', paper='...', params={{...}})") from None
        add(*args, **kwargs)

    def add(target, *, name: str, description: str, paper: str = "", params: dict | None = None, **info):
        blamed = named(kind, name, plugin)
        _check_arguments(blamed, name, description, paper, params, info)
        if kind == "method" and not (isinstance(target, dict) and all(isinstance(k, str) for k in target)):
            raise TypeError(f"{blamed}: the target must be a dict, a partial "
                            f"configuration such as {{'loss': {{'name': 'nca'}}}}, got {target!r:.100}")
        if kind == "study" and not isinstance(target, os.PathLike):
            raise TypeError(f"{blamed}: the target must be the pathlib.Path of its "
                            f"TOML file, got {target!r:.100}")
        if isinstance(target, str) and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", target):
            raise TypeError(f"{blamed}: a lazy target is written 'module:attr' "
                            f"(e.g. 'my_pkg.networks:BigNet'), got {target!r:.100}")
        if params is None:
            if isinstance(target, str):
                raise TypeError(
                    f"{blamed} is a lazy reference "
                    f"'{target}': declare its params={{...}} in register()"
                )
            params = {} if kind in ("method", "study") else keyword_params(target, kind)
            _check_defaults(target, kind, blamed)
            if kind not in ("method", "study") and (mistyped := mistyped_default(target, params, _key(kind, name))):
                raise TypeError(f"{blamed}: {mistyped}")
        if kind == "evaluator" and not isinstance(target, str) and (problem := trait_problem(target)):
            raise TypeError(f"{blamed}: {problem}")
        if "allowed" in info:
            info["allowed"] = _allowed_rules(info["allowed"], params, blamed)
        if "check" in info and (refused := refused_defaults(info["check"], params)):
            raise TypeError(f"{blamed}: its own check= refuses its defaults ({refused}); every run that leaves "
                            f"them unset would fail so: give each parameter a default the check accepts")
        registry.add(
            Component(kind, name, target, description, paper, dict(params), plugin, version, origin, info)
        )

    return register


# What register()'s keywords must be, checked when a component is registered: a wrong type is then the
# plugin's one load failure, never a traceback from a later command that uses the value.
INFO_TYPES = {
    "episodic": (bool, "True or False"),
    "check_early": (bool, "True or False"),
    "defaults": (dict, "a dict of configuration sections, e.g. {'train': {'epochs': 5}}"),
}
INFO_FUNCTIONS = {"check": "check(params, context)", "batch": "batch(params, batch_size)"}


def _check_arguments(who: str, name: Any, description: Any, paper: Any, params: Any, info: dict) -> None:
    """A TypeError naming the keyword of ``register()`` whose value has the wrong type."""
    if not isinstance(name, str) or not re.fullmatch(r"[^\s\[\]=,'\"]+", name):
        raise TypeError(f"{who}: name= must be text without spaces, brackets, '=' or ',' (it is written "
                        f"as --set loss.name=NAME), e.g. 'margin', got {name!r}")
    for keyword, value in (("description", description), ("paper", paper)):
        if not isinstance(value, str):
            raise TypeError(f"{who}: {keyword}= must be text, got {value!r:.100}")
    if params is not None and not isinstance(params, dict):
        raise TypeError(f"{who}: params= must be a dict {{parameter: default}}, got {params!r:.100}")
    for keyword, (wanted, text) in INFO_TYPES.items():
        if keyword in info and not isinstance(info[keyword], wanted):
            raise TypeError(f"{who}: {keyword}= must be {text}, got {info[keyword]!r:.100}")
    for keyword, signature in INFO_FUNCTIONS.items():
        if keyword in info and not (callable(info[keyword]) and _takes_two(info[keyword])):
            raise TypeError(f"{who}: {keyword}= must be a function {signature}, got {_called_as(info[keyword])}")


def _key(kind: str, name: str) -> str:
    """The section a component's parameters are set under: ``loss``, or ``sinks.NAME`` for a sink."""
    return f"sinks.{name}" if kind == "sink" else kind


def _takes_two(function: Any) -> bool:
    """Whether ``function`` can be called with two arguments, as fslab calls a check= or batch= function:
    one written check(params) failed every run that used it, while its plugin loaded."""
    try:
        inspect.signature(function).bind(None, None)
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): let the call tell
        return True
    return True


def _called_as(value: Any) -> str:
    """A function as it is called (``check(params)``), anything else as its repr."""
    try:
        return f"{value.__name__}{inspect.signature(value)}"
    except (AttributeError, TypeError, ValueError):
        return f"{value!r:.100}"


def _check_defaults(target: Any, kind: str, who: str) -> None:
    """A keyword-only parameter without a default (``*, margin``) was given None by every run that
    did not set it, a TypeError deep in its first step: each parameter a run sets needs a default."""
    if not callable(target):  # a recipe's dict, a study's Path
        return
    func = target.__init__ if inspect.isclass(target) else target
    for p in inspect.signature(func).parameters.values():
        if (p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
                and p.name not in FILLED_IN.get(kind, ())):
            raise TypeError(f"{who}: its parameter '{p.name}' has no default; a run sets it only when told to, "
                            f"and its type is its default's: give it one (*, {p.name}=...), None if it is optional")


def _allowed_rules(allowed: Any, params: dict, who: str) -> dict:
    """``register(..., allowed={param: rule})`` checked when it is registered:
    each key a declared parameter, each value a rule of :mod:`fslab.core.limits`
    that the parameter's default keeps."""
    if not isinstance(allowed, dict):
        raise TypeError(f"{who}: allowed= must be a dict {{parameter: rule}}, got {allowed!r}")
    rules = {}
    for param, declared in allowed.items():
        if param not in params:
            raise TypeError(f"{who}: allowed= names '{param}', which is not one of its parameters "
                            f"({', '.join(params) or 'none'})")
        try:
            rules[param] = rule_of(declared)
        except TypeError as exc:
            raise TypeError(f"{who}: allowed= for '{param}': {exc}") from None
        try:
            check_rule(param, params[param], rules[param])
        except UsageError as exc:
            raise TypeError(f"{who}: the default of '{param}' breaks its own rule: {exc}") from None
    return rules


def _loaded_before(registry: Registry, name: str, path: Path) -> bool:
    """Whether the file ``path`` has loaded (or failed to load) as plugin ``name`` already, a folder that
    plugin_dirs names twice; a ValueError where another folder's file has: both files are the module
    ``fslab_local_plugins.<stem>``, so the second, imported, took the first's place in ``sys.modules`` (a lazy
    target of the first then found the second's code) and failed in pluggy's words, the name already
    registered and every plugin module's repr after it, some thousand characters."""
    first = registry.plugins.get(name, (None, None))[1] or registry.failed_origins.get(name)
    if first is not None and Path(first).resolve() == path.resolve():
        return True
    if first is not None:
        raise ValueError(f"{path} has the name of {first}, which loads first as the module "
                         f"fslab_local_plugins.{path.stem} (each file of plugin_dirs is loaded under its own name): "
                         f"rename one of them")
    return False


def _import_file(path: Path):
    module_name = f"fslab_local_plugins.{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    # the package above it too: pickle imports ``fslab_local_plugins.NAME`` to find a class
    # defined in the file (a sampler must survive pickling), which fails without its parent
    parent = sys.modules.setdefault("fslab_local_plugins", type(sys)("fslab_local_plugins"))
    parent.__path__ = getattr(parent, "__path__", [])
    sys.modules[module_name] = module
    setattr(parent, path.stem, module)
    spec.loader.exec_module(module)
    return module
