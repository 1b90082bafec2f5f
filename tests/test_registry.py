"""The plugin registry: discovery, failures, duplicates, parameters."""

import re
import sys
import textwrap
from pathlib import Path

import pytest

from fslab.core.errors import PluginError, UsageError
from fslab.core.registry import KINDS, load_registry

LOCAL_LOSS = """
    from fslab.plugin import LossOutput, hookimpl

    def scaled(z, labels, support=None, *, scale: float = 2.0):
        return LossOutput(z.sum() * scale, 0, 0)

    @hookimpl
    def register_losses(register):
        register(scaled, name="scaled", description="sum times a scale", paper="none")
"""


def write_plugin(folder, name, source):
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return folder



def installed_package(site: Path, package: str, entry_points: str, files: dict[str, str]) -> None:
    """``package`` (its ``files``, by name) installed in ``site`` as a distribution of version 0.1.0 named as pip
    names it (fslab_x: fslab-x), declaring ``entry_points`` (lines of its [fslab] group)."""
    (site / package).mkdir(parents=True)
    for name, text in files.items():
        (site / package / name).write_text(text)
    info = site / f"{package}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package.replace('_', '-')}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[fslab]\n{entry_points}")

def test_builtins_register_every_kind_with_metadata(builtin_plugins):
    registry = load_registry()
    for kind in KINDS:
        assert registry.names(kind), f"no built-in {kind}"
    nca = registry.get("loss", "nca")
    assert nca.params == {"temperature": 1.0, "pair_fraction": 1.0}
    assert "Eq. 3" in nca.description and "arXiv:2012.09831" in nca.paper
    assert nca.plugin == "nca" and nca.version.startswith("fslab ")
    assert nca.describe()["origin"] == "entry point fslab_plugins.methods.nca"


def test_local_plugin_folder_is_loaded_and_params_come_from_the_signature(builtin_plugins, tmp_path):
    folder = write_plugin(tmp_path / "local", "scaled", LOCAL_LOSS)
    registry = load_registry([folder])
    component = registry.get("loss", "scaled")
    assert component.params == {"scale": 2.0}
    assert component.plugin == "local:scaled" and component.origin.endswith("scaled.py")
    loss = registry.create("loss", "scaled", scale=3.0)

    class Z:  # stands in for a tensor: only .sum() is used
        def sum(self):
            return 5.0

    assert loss(Z(), None).loss == 15.0


def test_get_registry_loads_the_plugin_folders_of_the_settings_it_is_given(builtin_plugins, tmp_path, monkeypatch):
    """A notebook that asked for a component before naming its project's settings
    still gets their plugin folders: they were ignored once a registry was loaded."""
    import fslab
    from fslab.core.settings import Settings

    monkeypatch.chdir(tmp_path)  # no fslab.toml here: no plugin folder
    assert "scaled" not in fslab.available("loss")
    settings = Settings(plugin_dirs=(write_plugin(tmp_path / "local", "scaled", LOCAL_LOSS),))
    registry = fslab.get_registry(settings)
    assert "scaled" in registry.names("loss") and fslab.available("loss", "sca*") == ["scaled"]
    assert fslab.get_registry(settings) is registry is fslab.get_registry()  # loaded once for the same folders
    assert fslab.create("loss", "scaled", scale=3.0).keywords == {"scale": 3.0}


def test_two_projects_with_the_same_plugin_folder_name_each_get_their_own_plugins(builtin_plugins, tmp_path,
                                                                                    monkeypatch):
    """The registry was kept for the plugin_dirs as written: a notebook that moved from one project to another
    whose fslab.toml also says plugin_dirs = ["mine"] got the first project's plugins, by fslab.available()
    and by get_registry(load_settings()) alike. Folders are the paths they are now."""
    import fslab
    from fslab.core.settings import load_settings

    for project in ("a", "b"):
        (tmp_path / project).mkdir()
        (tmp_path / project / "fslab.toml").write_text('[project]\nplugin_dirs = ["mine"]\n')
        write_plugin(tmp_path / project / "mine", "scaled", LOCAL_LOSS.replace('"scaled"', f'"only_{project}"'))
    for project in ("a", "b", "a"):  # no settings given: this folder's
        monkeypatch.chdir(tmp_path / project)
        assert fslab.available("loss", "only_*") == [f"only_{project}"]
    for project in ("b", "a", "b"):  # each folder's settings given
        monkeypatch.chdir(tmp_path / project)
        assert fslab.get_registry(load_settings()).names("loss", "only_*") == [f"only_{project}"]
    monkeypatch.chdir(tmp_path / "a")  # the settings given last stand for a call that gives none
    assert fslab.available("loss", "only_*") == ["only_b"]
    from fslab import testing  # a plugin's contract tests: their registry was kept for ("mine",) as written

    monkeypatch.setattr(testing, "_registries", {})
    for project in ("a", "b"):
        monkeypatch.chdir(tmp_path / project)
        assert testing.registry_for(("mine",)).names("loss", "only_*") == [f"only_{project}"]


def test_unknown_parameter_and_name_suggest_the_closest(builtin_plugins):
    registry = load_registry()
    with pytest.raises(UsageError, match=r"unknown parameter 'loss.temprature'.*Did you mean 'temperature'"):
        registry.create("loss", "nca", temprature=0.5)
    with pytest.raises(UsageError, match=r"Unknown loss 'protonett'\. Did you mean 'protonet'\? Allowed: .*nca"):
        registry.get("loss", "protonett")
    with pytest.raises(UsageError, match=r"Unknown plugin kind 'losses'.*Did you mean 'loss'"):
        registry.names("losses")


def test_the_registrys_create_refuses_a_parameter_as_fslab_create_and_a_run_do(builtin_plugins):
    """registry.create('evaluator', 'centroid', k=3) said "has no parameter 'k'. Allowed: (none)." where
    fslab.create and --set evaluator.k=3 say centroid takes no parameters and name knn, whose k is: one line."""
    import fslab
    from fslab.core.errors import ConfigError

    registry = fslab.get_registry()
    for kind, name, params in (("evaluator", "centroid", {"k": 3}), ("loss", "nca", {"temprature": 0.5}),
                               ("evaluator", "knn", {"kk": 3})):
        with pytest.raises(ConfigError) as from_api:
            fslab.create(kind, name, **params)
        with pytest.raises(UsageError) as from_registry:
            registry.create(kind, name, **params)
        assert str(from_registry.value) == str(from_api.value), params
    assert str(from_registry.value) == "unknown parameter 'evaluator.kk' for evaluator 'knn'. Did you mean 'k'? " \
                                       "Allowed: k, ties."
    with pytest.raises(UsageError) as caught:
        registry.create("evaluator", "centroid", k=3)
    assert str(caught.value) == ("unknown parameter 'evaluator.k' for evaluator 'centroid', which takes no "
                                 "parameters. Evaluator 'knn' has it.")


def test_available_filters_by_glob(builtin_plugins):
    import fslab

    assert fslab.available("loss", "proto*") == ["protonet", "protonet-noproto", "protonet-nosq"]
    assert fslab.available("loss", "map-*") == ["map-dlm", "map-ssvm"]
    assert "nca" in fslab.available("loss")


def test_broken_plugin_is_reported_and_the_rest_keeps_working(builtin_plugins, tmp_path, monkeypatch):
    folder = write_plugin(tmp_path / "local", "broken", "import not_a_module_anywhere\n")
    write_plugin(folder, "scaled", LOCAL_LOSS)
    registry = load_registry([folder])
    assert [f.plugin for f in registry.failures] == ["local:broken"]
    assert "ModuleNotFoundError" in registry.failures[0].error
    assert "scaled" in registry.names("loss") and "nca" in registry.names("loss")
    monkeypatch.setenv("FSLAB_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match="plugin 'local:broken' failed to load"):
        load_registry([folder])


def test_a_plugin_that_failed_to_load_is_one_warning_at_the_callers_line(builtin_plugins, tmp_path, monkeypatch):
    """fslab.available, describe and create warn at the line that called them (a notebook's
    cell), as a warning should: the warnings named fslab/__init__.py, inside available."""
    import fslab

    monkeypatch.chdir(tmp_path)
    (tmp_path / "fslab.toml").write_text('[project]\nplugin_dirs = ["local"]\n')
    write_plugin(tmp_path / "local", "broken", "import not_a_module_anywhere\n")
    for call in (lambda: fslab.available("loss"), lambda: fslab.describe("loss", "nca"),
                 lambda: fslab.create("loss", "nca"), lambda: fslab.get_registry()):
        monkeypatch.setattr(fslab, "_registry", None)
        monkeypatch.setattr(fslab, "_warned", set())  # each call as a fresh process's first
        with pytest.warns(UserWarning) as caught:
            call()
        assert [str(w.message) for w in caught] == [
            "fslab plugin 'local:broken' failed to load: ModuleNotFoundError: No module named 'not_a_module_anywhere'"
            f"; raised loading {tmp_path / 'local' / 'broken.py'} (a file of plugin_dirs in fslab.toml)"]
        assert caught[0].filename == __file__
    assert "nca" in fslab.available("loss")


def test_a_plugin_folders_file_that_fails_to_load_is_named_by_its_path(builtin_plugins, tmp_path):
    """A plugin folder's file that raised on import, or did not parse, was named only as 'local:NAME', where
    an entry point's failure names the entry point and its package: the file is named now, in the one line."""
    folder = write_plugin(tmp_path / "mine", "boom", "raise RuntimeError('half-written plugin')\n")
    write_plugin(folder, "typo", "def f(:\n")
    write_plugin(folder, "named", "raise RuntimeError(__file__)\n")  # its words name the file already
    lines = [failure.line for failure in load_registry([folder]).failures]
    assert lines == [
        f"fslab plugin 'local:boom' failed to load: RuntimeError: half-written plugin; raised loading "
        f"{folder / 'boom.py'} (a file of plugin_dirs in fslab.toml)",
        f"fslab plugin 'local:named' failed to load: RuntimeError: {folder / 'named.py'}",
        f"fslab plugin 'local:typo' failed to load: SyntaxError: invalid syntax (typo.py, line 1); raised loading "
        f"{folder / 'typo.py'} (a file of plugin_dirs in fslab.toml)"]
    with pytest.raises(PluginError, match=re.escape(f"half-written plugin; raised loading {folder / 'boom.py'} ")):
        load_registry([folder], strict=True)


def test_a_register_hook_that_raises_names_its_file_or_entry_point(builtin_plugins, tmp_path, monkeypatch):
    """A plugin that imported but whose register hook raised as it registered was named only 'local:NAME' or its
    bare entry point, where one that raised on import names its file or entry point: the hook and where it is."""
    # fslab_raising: a package name of its own (the module stays imported; test_cli's fslab_late is another)
    hook = "from fslab.plugin import hookimpl\n\n@hookimpl\ndef register_losses(register):\n    raise KeyError('k')\n"
    folder = write_plugin(tmp_path / "mine", "late", hook)
    site = tmp_path / "site"
    installed_package(site, "fslab_raising", "late = fslab_raising\n", {"__init__.py": hook})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("FSLAB_PLUGINS", ",".join([*builtin_plugins, "late"]))
    assert sorted(failure.line for failure in load_registry([folder]).failures) == [
        "fslab plugin 'late' failed to load: KeyError: 'k'; raised by register_losses() of the entry point "
        "'late = \"fslab_raising\"' of fslab-raising 0.1.0 ([project.entry-points.fslab])",
        f"fslab plugin 'local:late' failed to load: KeyError: 'k'; raised by register_losses() of "
        f"{folder / 'late.py'} (a file of plugin_dirs in fslab.toml)"]


def test_a_broken_entry_point_is_one_warning_a_process_naming_it_and_its_package(builtin_plugins, tmp_path,
                                                                                 monkeypatch):
    """A notebook's plugins load again for another project's settings: the same broken entry point was
    warned of at every load, as "fslab plugin 'bad' failed to load: RuntimeError: half-written plugin",
    which named neither the package that ships it nor its entry point."""
    import warnings

    import fslab
    from fslab.core.settings import load_settings

    site = tmp_path / "site"
    installed_package(site, "fslab_bad", "bad = fslab_bad\n",
                      {"__init__.py": "raise RuntimeError('half-written plugin')\n"})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("FSLAB_PLUGINS", ",".join([*builtin_plugins, "bad"]))
    monkeypatch.setattr(fslab, "_warned", set())
    other = tmp_path / "other"
    other.mkdir()
    write_plugin(other / "local", "scaled", LOCAL_LOSS)
    (other / "fslab.toml").write_text('[project]\nplugin_dirs = ["local"]\n')
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # as a notebook shows each: the once is fslab's
        assert "nca" in fslab.available("loss")
        assert "scaled" in fslab.get_registry(load_settings(other / "fslab.toml")).names("loss")
        assert "scaled" not in fslab.get_registry(load_settings()).names("loss")
    assert [str(w.message) for w in caught] == [
        "fslab plugin 'bad' failed to load: RuntimeError: half-written plugin; raised loading the entry point "
        "'bad = \"fslab_bad\"' of fslab-bad 0.1.0 ([project.entry-points.fslab])"]
    assert [w.category for w in caught] == [UserWarning] and caught[0].filename == __file__


def test_an_entry_point_naming_the_hook_function_not_its_module_fails_loading(builtin_plugins, tmp_path,
                                                                              monkeypatch):
    """``mine = "fslab_mine:register_losses"`` (the hook, not its module): pluggy looked for @hookimpl functions
    on the function and found none, so the plugin loaded registering nothing, every command called its loss
    unknown without a word why, and its contract test said to implement the hook that was there."""
    site = tmp_path / "site"
    installed_package(site, "fslab_mine", "mine = fslab_mine:register_losses\nalso = fslab_mine:scaled\n",
                      {"__init__.py": textwrap.dedent(LOCAL_LOSS)})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("FSLAB_PLUGINS", ",".join([*builtin_plugins, "mine", "also"]))
    registry = load_registry()
    assert {f.plugin: f.error for f in registry.failures} == {
        "mine": "TypeError: fslab_mine:register_losses is a function, not a module: fslab calls the @hookimpl "
                "functions of what an entry point names, and it has none, so the plugin would register nothing; "
                "name the module that holds them: mine = \"fslab_mine\"; raised loading the entry point "
                "'mine = \"fslab_mine:register_losses\"' of fslab-mine 0.1.0 ([project.entry-points.fslab])",
        "also": "TypeError: fslab_mine:scaled is a function, not a module: fslab calls the @hookimpl functions of "
                "what an entry point names, and it has none, so the plugin would register nothing; name the module "
                "that holds them: also = \"fslab_mine\"; raised loading the entry point 'also = "
                "\"fslab_mine:scaled\"' of fslab-mine 0.1.0 ([project.entry-points.fslab])"}
    with pytest.raises(UsageError, match=r"Not among them: what plugins 'also' \(TypeError: fslab_mine:scaled .*\), "
                                         r"'mine' \(TypeError: .*\) register, which failed"):
        registry.get("loss", "scaled")  # both spell it (one module): neither is said to be its plugin


def test_an_entry_point_naming_a_module_without_hooks_fails_loading_naming_the_module_meant(builtin_plugins, tmp_path,
                                                                                           monkeypatch):
    """``mine = "fslab_hookless"`` (the package, its hooks in its loss.py) loaded registering nothing, in silence:
    fslab plugins listed none of its components and exited with 0, and every command called them unknown without
    a word why."""
    site = tmp_path / "site"
    installed_package(site, "fslab_hookless", "mine = fslab_hookless\nhelpers = fslab_hookless.helpers\n",
                      {"__init__.py": '"""The package."""\n', "loss.py": textwrap.dedent(LOCAL_LOSS),
                       "helpers.py": "def scale(x):\n    return 2 * x\n"})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("FSLAB_PLUGINS", ",".join([*builtin_plugins, "mine", "helpers"]))
    registry = load_registry()
    where = "of fslab-hookless 0.1.0 ([project.entry-points.fslab])"
    assert {f.plugin: f.error for f in registry.failures} == {
        "mine": "TypeError: module 'fslab_hookless' holds no @hookimpl function, so the plugin would register "
                "nothing; an entry point names the module that holds them: mine = \"fslab_hookless.loss\"; raised "
                f"loading the entry point 'mine = \"fslab_hookless\"' {where}",
        "helpers": "TypeError: module 'fslab_hookless.helpers' holds no @hookimpl function, so the plugin would "
                   "register nothing; an entry point names the module that holds them (fslab's hooks: register_losses, "
                   "register_backbones, register_samplers, register_evaluators, register_datasets, "
                   "register_methods, register_studies, register_sinks); raised loading the entry point 'helpers = "
                   f"\"fslab_hookless.helpers\"' {where}"}


def test_fslab_plugins_naming_no_installed_entry_point_is_a_load_failure_with_the_closest(builtin_plugins,
                                                                                          monkeypatch):
    """FSLAB_PLUGINS=...,protonett (a typo) loaded nothing of protonet, in silence: fslab plugins exited with 0
    without it, and fslab run protonet said "Unknown method 'protonet'" as if nothing had asked for it."""
    chosen = [name for name in builtin_plugins if name != "protonet"]
    monkeypatch.setenv("FSLAB_PLUGINS", ",".join([*chosen, "protonett", "local:mine"]))  # local: is no entry point
    registry = load_registry(strict=False)
    assert [(f.plugin, f.error) for f in registry.failures] == [(
        "protonett", "FSLAB_PLUGINS names it, and no installed package declares an fslab entry point of that name. "
                     "Did you mean 'protonet'? fslab plugins lists those installed with FSLAB_PLUGINS unset")]
    with pytest.raises(UsageError, match=r"Unknown method 'protonet'\..* Not among them: what plugin 'protonett' "):
        registry.get("method", "protonet")


def test_a_bare_assert_failing_a_plugin_names_its_file_line_and_statement(builtin_plugins, tmp_path):
    """docs/plugins.md has a plugin check fslab's API version at import with an ``assert``: on an older fslab
    the plugin failed to load with "AssertionError: ", which named neither the check nor the file."""
    check = 'assert tuple(map(int, API_VERSION.split("."))) >= (1, 99)'
    folder = write_plugin(tmp_path / "local", "newer", f"from fslab.plugin import API_VERSION\n{check}\n")
    (failure,) = load_registry([folder]).failures
    assert failure.error == f"AssertionError at {folder / 'newer.py'} line 2: {check}"


def test_a_plugin_importing_what_this_fslab_plugin_api_lacks_is_told_the_version_and_the_upgrade(
        builtin_plugins, tmp_path):
    """A plugin written for a newer fslab (or a name misspelt) failed with Python's "cannot import name
    'one_at_the_time' from 'fslab.plugin' (...)", which named no API version and no way on."""
    from fslab.plugin import API_VERSION

    folder = write_plugin(tmp_path / "local", "newer", "from fslab.plugin import hookimpl, one_at_the_time\n")
    write_plugin(folder, "newest", "from fslab.plugin import hookimpl, register_everything\n")
    errors = {f.plugin: f.error for f in load_registry([folder]).failures}
    assert errors["local:newer"].endswith(
        f"; fslab.plugin of this fslab (API_VERSION {API_VERSION}) has no 'one_at_the_time'. Did you mean "
        f"'one_at_a_time'? A plugin written for a newer fslab needs it: pip install -U fslab; raised loading "
        f"{folder / 'newer.py'} (a file of plugin_dirs in fslab.toml)")
    assert errors["local:newest"].startswith("ImportError: cannot import name 'register_everything' from "
                                             "'fslab.plugin'")
    assert errors["local:newest"].endswith(
        f"(API_VERSION {API_VERSION}) has no 'register_everything'. A plugin written for a newer fslab needs it: "
        f"pip install -U fslab; raised loading {folder / 'newest.py'} (a file of plugin_dirs in fslab.toml)")


def test_an_unknown_name_says_which_plugins_failed_to_load(builtin_plugins, tmp_path):
    """The name asked for may be one a broken plugin would have registered: the line says so."""
    folder = write_plugin(tmp_path / "local", "broken", "import not_a_module_anywhere\n")
    with pytest.raises(UsageError) as caught:
        load_registry([folder]).get("loss", "brokenloss")
    where = lambda name: f"; raised loading {folder / name}.py (a file of plugin_dirs in fslab.toml)"
    assert str(caught.value).endswith("Not among them: what plugin 'local:broken' registers, which failed to load "
                                      f"(ModuleNotFoundError: No module named 'not_a_module_anywhere'"
                                      f"{where('broken')}).")
    write_plugin(folder, "alsobroken", "raise RuntimeError('no')\n")
    with pytest.raises(UsageError) as caught:  # each with why it failed: the line says what its warning said
        load_registry([folder]).get("loss", "brokenloss")
    assert str(caught.value).endswith(
        f"Not among them: what plugins 'local:alsobroken' (RuntimeError: no{where('alsobroken')}), 'local:broken' "
        f"(ModuleNotFoundError: No module named 'not_a_module_anywhere'{where('broken')}) register, which failed "
        f"to load.")
    write_plugin(folder, "broken", "import not_a_module_anywhere\n\n# register(margin, name='brokenloss', ...)\n")
    with pytest.raises(UsageError) as caught:  # the one whose source names it: that plugin, and why
        load_registry([folder]).get("loss", "brokenloss")
    assert str(caught.value) == ("Unknown loss 'brokenloss': plugin 'local:broken', whose source names it, failed "
                                 f"to load: ModuleNotFoundError: No module named 'not_a_module_anywhere'"
                                 f"{where('broken')}")
    with pytest.raises(UsageError) as caught:  # nothing failed: the line is as it always was
        load_registry([]).get("loss", "brokenloss")
    assert str(caught.value).endswith("Allowed: " + ", ".join(load_registry([]).names("loss")) + ".")


def test_duplicate_names_name_both_providers(builtin_plugins, tmp_path):
    folder = write_plugin(tmp_path / "local", "again", LOCAL_LOSS.replace('name="scaled"', 'name="nca"'))
    with pytest.raises(PluginError,
                       match=r"loss 'nca' is registered twice: by plugin 'nca' fslab .* and by plugin 'local:again'.*"
                             r" Give yours another name \(the one its register call gives\), uninstall one of them"):
        load_registry([folder])


def test_misspelled_hook_is_an_error(builtin_plugins, tmp_path):
    source = LOCAL_LOSS.replace("def register_losses", "def register_loses")
    folder = write_plugin(tmp_path / "local", "typo", source)
    # it named the module by its repr (<module 'fslab_local_plugins.typo' from '...'>) and no hook to use
    with pytest.raises(PluginError, match=r"^plugin 'local:typo' \(fslab_local_plugins.typo\) implements "
                                          r"register_loses, which is not a hook of fslab. Did you mean "
                                          r"'register_losses'\? The hooks: register_losses, "):
        load_registry([folder])


def test_a_hook_without_hookimpl_fails_its_plugins_loading(builtin_plugins, tmp_path):
    # pluggy passed over the undecorated function: the plugin loaded with nothing registered, every
    # command called 'plain' unknown and fslab.testing skipped every contract, so a plugin's CI stayed green
    source = LOCAL_LOSS.replace("    @hookimpl\n", "")
    folder = write_plugin(tmp_path / "local", "plain", source)
    registry = load_registry([folder])
    assert [f.plugin for f in registry.failures] == ["local:plain"]
    assert registry.failures[0].error == (
        "TypeError: register_losses() is not decorated with @hookimpl, so fslab never calls it and the plugin "
        f"registers nothing: put @hookimpl (from fslab.plugin import hookimpl) above it; raised loading "
        f"{folder / 'plain.py'} (a file of plugin_dirs in fslab.toml)")
    with pytest.raises(UsageError, match=r"^Unknown loss 'scaled': plugin 'local:plain', whose source names it, "
                                         r"failed to load: TypeError: register_losses\(\) is not decorated"):
        registry.get("loss", "scaled")


@pytest.mark.parametrize("written", ["reg", "", "register, mode"])
def test_a_hook_that_cannot_take_register_fails_its_plugins_loading_in_one_line(builtin_plugins, tmp_path, written):
    # register_losses(reg) failed in pluggy's three lines ("Argument(s) {'reg'} are declared in the hookimpl but
    # can not be found in the hookspec"), register_losses() in Python's "got an unexpected keyword argument"
    source = LOCAL_LOSS.replace("def register_losses(register)", f"def register_losses({written})")
    folder = write_plugin(tmp_path / "local", "signature", source)
    registry = load_registry([folder])
    assert [f.plugin for f in registry.failures] == ["local:signature"]
    assert registry.failures[0].error == (
        f"TypeError: register_losses({written}) cannot take what fslab passes each hook, one argument named "
        f"register: write def register_losses(register); raised loading {folder / 'signature.py'} (a file of "
        f"plugin_dirs in fslab.toml)")


def test_two_plugin_folders_with_files_of_one_name_load_the_first_and_refuse_the_second_in_one_line(builtin_plugins,
                                                                                                   tmp_path):
    """Both were the module fslab_local_plugins.scaled: the second, imported, took the first's place in
    sys.modules, then failed in pluggy's words, 'Plugin name already registered: ...' and the repr of every
    plugin module, thousands of characters over two lines."""
    first = write_plugin(tmp_path / "mine", "scaled", LOCAL_LOSS)
    second = write_plugin(tmp_path / "theirs", "scaled", LOCAL_LOSS.replace('name="scaled"', 'name="scaled2"'))
    registry = load_registry([first, second], strict=False)
    assert [(f.plugin, f.error) for f in registry.failures] == [(
        "local:scaled", f"ValueError: {second / 'scaled.py'} has the name of {first / 'scaled.py'}, which loads "
                        f"first as the module fslab_local_plugins.scaled (each file of plugin_dirs is loaded under "
                        f"its own name): rename one of them")]
    assert registry.names("loss", "scaled*") == ["scaled"]
    assert sys.modules["fslab_local_plugins.scaled"].__file__ == str(first / "scaled.py")
    again = load_registry([first, tmp_path / "mine" / "."], strict=False)  # one folder named twice: loaded once
    assert not again.failures and again.names("loss", "scaled*") == ["scaled"]


def test_lazy_reference_must_declare_params(builtin_plugins, tmp_path):
    source = """
        from fslab.plugin import hookimpl

        @hookimpl
        def register_backbones(register):
            register("somewhere:Net", name="lazy", description="d")
    """
    folder = write_plugin(tmp_path / "local", "lazy", source)
    registry = load_registry([folder])
    assert "declare its params" in registry.failures[0].error


def test_lazy_reference_that_cannot_import_names_the_target(builtin_plugins, tmp_path):
    source = """
        from fslab.plugin import hookimpl

        @hookimpl
        def register_backbones(register):
            register("no_such_module_x:Net", name="lazy", description="d", params={})
    """
    registry = load_registry([write_plugin(tmp_path / "local", "lazy", source)])
    assert registry.get("backbone", "lazy").params == {}
    with pytest.raises(PluginError, match="points at 'no_such_module_x:Net'"):
        registry.create("backbone", "lazy", in_channels=1)


def test_a_lazy_target_misspelt_is_told_the_closest_name_there_is(builtin_plugins, tmp_path, monkeypatch):
    """A run failed with "points at 'mine_nets.network:SmallConvnet', which cannot be imported: module
    'mine_nets.network' has no attribute 'SmallConvnet'", where an entry point's typo is told its closest name."""
    (tmp_path / "mine_nets").mkdir()
    (tmp_path / "mine_nets" / "__init__.py").write_text("")
    (tmp_path / "mine_nets" / "network.py").write_text("class SmallConvNet:\n    pass\n")
    (tmp_path / "mine_nets" / "vision").mkdir()  # a typo in a package above the module: the rest kept
    (tmp_path / "mine_nets" / "vision" / "__init__.py").write_text("")
    (tmp_path / "mine_nets" / "vision" / "convnets.py").write_text("class SmallConvNet:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    named = "backbone 'lazy' from plugin 'local:lazy' points at"
    for target, message in [
        ("mine_nets.network:SmallConvnet", "which cannot be imported: module 'mine_nets.network' has no attribute "
                                           "'SmallConvnet'. Did you mean 'mine_nets.network:SmallConvNet'?"),
        ("mine_nets.netwrk:SmallConvNet", "which cannot be imported: No module named 'mine_nets.netwrk'. Did you "
                                          "mean 'mine_nets.network:SmallConvNet'?"),
        ("mine_nets.vison.convnets:SmallConvNet", "which cannot be imported: No module named 'mine_nets.vison'. Did "
                                                  "you mean 'mine_nets.vision.convnets:SmallConvNet'?"),
    ]:
        source = f"""
            from fslab.plugin import hookimpl

            @hookimpl
            def register_backbones(register):
                register({target!r}, name="lazy", description="d", params={{}})
        """
        registry = load_registry([write_plugin(tmp_path / "local", "lazy", source)])
        with pytest.raises(PluginError) as found:  # what a run checks before its folder is made: the same line
            registry.get("backbone", "lazy").check_target()
        assert str(found.value) == f"{named} '{target}', {message}"
        with pytest.raises(PluginError) as caught:
            registry.create("backbone", "lazy", in_channels=1)
        assert str(caught.value) == f"{named} '{target}', {message}"


def test_lazy_target_whose_module_fails_as_it_runs_is_the_plugins_error(builtin_plugins, tmp_path, monkeypatch):
    # fslab.create raised the module's NameError bare, a traceback naming neither component nor plugin
    (tmp_path / "lazy_broken_net.py").write_text("import math\nundefined_name_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    source = """
        from fslab.plugin import hookimpl

        @hookimpl
        def register_backbones(register):
            register("lazy_broken_net:Net", name="lazy", description="d", params={})
    """
    registry = load_registry([write_plugin(tmp_path / "local", "lazy", source)])
    with pytest.raises(PluginError) as caught:
        registry.create("backbone", "lazy", in_channels=1)
    assert str(caught.value) == ("backbone 'lazy' from plugin 'local:lazy' points at 'lazy_broken_net:Net', whose "
                                 "module failed as it was imported: NameError: name 'undefined_name_here' is not "
                                 "defined")


def test_a_required_argument_no_run_passes_is_the_plugins_error_naming_what_to_write(builtin_plugins, tmp_path,
                                                                                      monkeypatch):
    """A lazy target's keyword-only parameter left out of register(params=...) without a default, or a dataset
    taking its folder as path: each run failed with "needs hidden to be built (a run passes it itself); give
    hidden=...", as if the user had left out what fslab passes, where no run passes it."""
    (tmp_path / "undeclared_net.py").write_text(
        "class Net:\n    def __init__(self, in_channels, *, hidden: int, out_dim: int = 8):\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    source = """
        from fslab.plugin import hookimpl

        class Files:
            channels = 1

            def __init__(self, path, *, scale: int = 1):
                self.path = path

        @hookimpl
        def register_backbones(register):
            register("undeclared_net:Net", name="lazy", description="d", params={"out_dim": 8})

        @hookimpl
        def register_datasets(register):
            register(Files, name="files", description="d")
    """
    registry = load_registry([write_plugin(tmp_path / "local", "unfilled", source)])
    with pytest.raises(PluginError) as caught:
        registry.create("backbone", "lazy", in_channels=1)
    assert str(caught.value) == (
        "backbone 'lazy' from plugin 'local:unfilled': 'undeclared_net:Net' requires 'hidden', which is neither a "
        "value fslab fills in for a backbone (in_channels, image_size) nor a parameter with a default; give it a "
        "default after * (*, hidden=...) and declare it in register(params=...)")
    with pytest.raises(PluginError) as caught:
        registry.create("dataset", "files", root=str(tmp_path))
    assert str(caught.value) == (
        "dataset 'files' from plugin 'local:unfilled': its target requires 'path', which is neither a value fslab "
        "fills in for a dataset (root) nor a parameter with a default; a dataset that reads files is handed its "
        "folder as root (__init__(self, root, *, ...)); else give it a default after * (*, path=...)")


def test_method_recipes_are_dicts_naming_registered_plugins(builtin_plugins):
    registry = load_registry()
    for name in registry.names("method"):
        recipe = registry.create("method", name)
        for section in ("loss", "sampler", "evaluator"):
            assert recipe[section]["name"] in registry.names(section), (name, section)


def test_what_describe_and_create_give_is_the_callers_to_edit(builtin_plugins):
    """A notebook that edits a recipe from fslab.create("method", ...) or the
    parameters of fslab.describe(...) edits its own copy: the recipe a later run
    resolves and the defaults a later create builds with stay as registered."""
    import fslab
    from fslab.core.config import resolve
    from fslab.core.settings import Settings

    recipe = fslab.create("method", "protonet")
    recipe["loss"]["distance"] = "cosine"
    recipe["sampler"]["ways"] = 3
    fslab.describe("method", "protonet")["recipe"]["evaluator"]["name"] = "knn"
    fslab.describe("loss", "nca")["params"]["temperature"] = 5.0
    fslab.describe("backbone", "resnet12")["params"]["widths"].append(7)

    assert fslab.create("method", "protonet") == fslab.describe("method", "protonet")["recipe"] == {
        "loss": {"name": "protonet"}, "sampler": {"name": "episodic", "ways": 20, "shots": 5, "queries": 15},
        "evaluator": {"name": "centroid"}}
    config = resolve("protonet", registry=fslab.get_registry(), settings=Settings())
    assert (config["loss"]["distance"], config["sampler"]["ways"], config["evaluator"]["name"]) == \
        ("euclidean", 20, "centroid")
    assert fslab.create("loss", "nca").keywords["temperature"] == 1.0
    assert fslab.create("backbone", "resnet12", in_channels=1).out_dim == 640


def test_declared_params_of_lazy_targets_match_their_signatures(builtin_plugins):
    """A lazy reference declares its params by hand; they must agree with the code."""
    from fslab.core.registry import keyword_params

    registry = load_registry()
    for kind in KINDS:
        for name in registry.names(kind):
            component = registry.get(kind, name)
            if isinstance(component.target, str):
                assert keyword_params(component.resolve(), kind) == component.params, (kind, name)


def test_context_is_passed_only_to_targets_that_name_it(builtin_plugins):
    registry = load_registry()
    loss = registry.create("loss", "simpleshot", context={"out_dim": 8, "num_classes": 3, "other": 1})
    assert tuple(loss.classifier.weight.shape) == (3, 8)
    nca = registry.create("loss", "nca", temperature=0.5, context={"out_dim": 8, "num_classes": 3})
    assert nca.keywords == {"temperature": 0.5}


def test_the_public_create_checks_parameters_as_a_run_configuration_does(builtin_plugins):
    """fslab.create refuses what `fslab run --set` refuses, with the same line
    (one check: fslab.core.plugin_params.plugin_params), and builds with the rest."""
    import torch

    import fslab
    from fslab.core.config import resolve
    from fslab.core.errors import ConfigError
    from fslab.core.settings import Settings

    registry = fslab.get_registry()
    for name, params in [("lpn", {"distance": "manhattan"}), ("lpn", {"positives": 0}), ("lpn", {"margin": "wide"}),
                         ("nca", {"temperature": "hot"}), ("nca", {"temprature": 0.5})]:  # each method's own loss
        with pytest.raises(ConfigError) as from_create:
            fslab.create("loss", name, **params)
        with pytest.raises(ConfigError) as from_run:
            resolve(name, registry=registry, settings=Settings(), overrides=[{"loss": {"name": name, **params}}])
        assert str(from_create.value) == str(from_run.value), params
    assert "Did you mean 'temperature'? Allowed: pair_fraction, temperature." in str(from_create.value)

    # a loss or evaluator function is bound to its keyword-only parameters, never to what each call passes
    with pytest.raises(ConfigError, match=r"unknown parameter 'evaluator.support' for evaluator 'centroid'"):
        fslab.create("evaluator", "centroid", support=torch.zeros(2, 3))
    with pytest.raises(UsageError, match=r"unknown parameter 'loss.labels' for loss 'nca'\. Allowed"):
        registry.create("loss", "nca", labels=None)

    # values a run fills in (a backbone's input channels) pass through; declared ones are converted as in a run
    net = fslab.create("backbone", "conv4", in_channels=1, hidden=8)
    assert net(torch.zeros(2, 1, 16, 16)).shape == (2, 8)
    with pytest.raises(ConfigError, match=r"'backbone.in_chanels'.*Did you mean 'in_channels'"):
        fslab.create("backbone", "conv4", in_chanels=1)
    # ... and the whole numbers among them are checked as a run's would be, before torch sees them
    for value, expected in [("3", "must be an integer, got \"3\""), (3.0, "must be an integer, got 3.0"),
                            (0, "must be at least 1, got 0")]:
        with pytest.raises(ConfigError, match=rf"^config key 'backbone.in_channels' {re.escape(expected)}$"):
            fslab.create("backbone", "conv4", in_channels=value)
    with pytest.raises(ConfigError, match=r"^config key 'sampler.seed' must be a whole number from 0"):
        fslab.create("sampler", "iid", labels=[0, 1, 0, 1], batch_size=2, seed=-1)
    assert fslab.create("sampler", "iid", labels=[0, 1, 0, 1], batch_size=2, seed=0).batch_size == 2
    # what a run fills in and the caller left out is one line naming it, not the constructor's TypeError
    with pytest.raises(UsageError) as error:
        fslab.create("backbone", "conv4")
    assert str(error.value) == "backbone 'conv4' needs in_channels to be built (a run passes it itself); " \
                               "give in_channels=..."
    with pytest.raises(UsageError) as error:
        fslab.create("sampler", "iid", labels=[0, 1, 0, 1])
    assert str(error.value) == "sampler 'iid' needs batch_size, seed to be built (a run passes them itself); " \
                               "give batch_size=..., seed=..."
    with pytest.raises(UsageError, match=r"^a name pattern is text such as 'resnet\*', got 3$"):
        fslab.available("backbone", 3)
    # a kind or name that is not a string is an unknown one, not a TypeError
    with pytest.raises(UsageError, match=r"^Unknown plugin kind 'None'\. Allowed: backbone,"):
        fslab.create(None, "nca")
    with pytest.raises(UsageError, match=r"^Unknown loss '1'\. Allowed: lpn,"):
        fslab.create("loss", 1)
    # ... a study named by a number (it was AttributeError: no endswith), a name or kind as a list (TypeError)
    with pytest.raises(UsageError, match=r"^Unknown study '5'\. Allowed: lpn-table1,"):
        fslab.create("study", 5)
    with pytest.raises(UsageError, match=r"^Unknown loss '\['nca'\]'\. Allowed: lpn,"):
        fslab.create("loss", ["nca"])
    with pytest.raises(UsageError, match=r"^Unknown loss '\['nca'\]'\. Allowed: lpn,"):
        fslab.describe("loss", ["nca"])
    with pytest.raises(UsageError, match=r"^Unknown plugin kind '\['loss'\]'\. Allowed: backbone,"):
        fslab.create(["loss"], "nca")
    loss = fslab.create("loss", "nca", temperature=2)  # an int where the default is a float
    assert loss.keywords == {"temperature": 2.0, "pair_fraction": 1.0}
    assert type(loss.keywords["temperature"]) is float
    # a study is a file: create gives it parsed and checked, as fslab study show reads it
    study = fslab.create("study", "nca-supcon")
    assert (study.name, study.run_count()) == ("nca-supcon", 5) and study.sweeps[0].method == "supcon"
    with pytest.raises(UsageError, match=r"^study 'nca-supcon' takes no parameters, got seeds$"):
        fslab.create("study", "nca-supcon", seeds=2)


def test_a_studys_counts_refuse_a_scale_that_is_neither_paper_nor_quick(builtin_plugins):
    """study.run_count('fast'), ('Quick') or a seeds/points lookup at them counted the paper's runs."""
    import fslab

    study = fslab.create("study", "nca-supcon")
    assert (study.run_count(), study.run_count("paper")) == (5, 5)
    for scale, hint in (("fast", ""), ("Quick", " Did you mean 'quick'?"), (None, "")):
        for count, args in ((study.run_count, ()), (study.seeds, ()), (study.points, (study.sweeps[0],))):
            with pytest.raises(UsageError) as caught:
                count(*args, scale)
            assert str(caught.value) == f"a study's scale is one of paper, quick, got {scale!r}.{hint}"


def test_get_registry_refuses_a_path_in_one_line(builtin_plugins, tmp_path):
    """fslab.get_registry(Path(".../fslab.toml")), the file rather than its settings, was an AttributeError
    ('PosixPath' object has no attribute 'plugin_dirs')."""
    import fslab

    toml = tmp_path / "fslab.toml"
    for wrong in (toml, str(toml), {"plugin_dirs": ["local"]}):
        with pytest.raises(UsageError) as caught:
            fslab.get_registry(wrong)
        assert str(caught.value) == (
            "fslab.get_registry takes the settings fslab.core.settings.load_settings(path) reads from a fslab.toml, "
            f"not {wrong!r}; give get_registry(load_settings(Path(...)))")


def test_the_public_create_takes_numpy_numbers_as_python_ones(builtin_plugins):
    """A notebook's values often come from numpy (np.arange, an array's sum): they were refused,
    "must be an integer, got np.int64(3)"; they are checked and passed on as Python numbers."""
    import numpy as np

    import fslab
    from fslab.core.errors import ConfigError

    assert fslab.create("evaluator", "knn", k=np.int64(3)).keywords == {"k": 3, "ties": "nearest"}
    loss = fslab.create("loss", "nca", temperature=np.float32(0.5), pair_fraction=np.int64(1))
    assert loss.keywords == {"temperature": 0.5, "pair_fraction": 1.0}
    assert all(type(v) is float for v in loss.keywords.values())
    widths = list(np.array([4, 4, 8, 8]))
    assert fslab.create("backbone", "resnet12", in_channels=np.int64(1), widths=widths).out_dim == 8
    sampler = fslab.create("sampler", "iid", labels=[0, 1, 0, 1], batch_size=np.int64(2), seed=np.uint8(3))
    assert (sampler.batch_size, type(sampler.batch_size)) == (2, int)
    # ... and refused as Python's are
    with pytest.raises(ConfigError, match=r"^config key 'backbone.in_channels' must be at least 1, got 0$"):
        fslab.create("backbone", "conv4", in_channels=np.int64(0))
    with pytest.raises(ConfigError, match=r"^config key 'loss.temperature' must be a finite number, got nan$"):
        fslab.create("loss", "nca", temperature=np.float32("nan"))
    with pytest.raises(ConfigError, match=r"^config key 'evaluator.k' must be an integer, got np.True_$"):
        fslab.create("evaluator", "knn", k=np.bool_(True))


def test_the_public_create_checks_what_a_run_fills_in_that_is_no_number(builtin_plugins):
    """A sampler's labels, an evaluator's training_loss and a sink's run, given wrong, were the
    component's own TypeError or AttributeError ('NoneType' object has no attribute 'path')."""
    import fslab
    from fslab.core.errors import ConfigError

    for kind, name, params, expected in [
            ("sampler", "iid", {"labels": None, "batch_size": 2, "seed": 0},
             "'sampler.labels' must be the training split's labels, one whole number per image (a list, tensor or "
             "array), got None"),
            ("evaluator", "sen", {"training_loss": "sen"},
             "'evaluator.training_loss' must be the run's loss section, a dict such as {'name': 'sen', "
             "'eps_pos': 1.0}, or None, got 'sen'"),
            ("sink", "tensorboard", {"run": "runs/x"},
             "'sink.run' must be a fslab.plugin.SinkRun, the run the sink is told of, got 'runs/x'")]:
        with pytest.raises(ConfigError) as caught:
            fslab.create(kind, name, **params)
        assert str(caught.value) == f"config key {expected}"
    assert len(fslab.create("sampler", "iid", labels=(0, 1, 0, 1), batch_size=2, seed=0)) == 2
    assert fslab.create("evaluator", "sen", training_loss={"name": "sen", "eps_pos": 2.0}).keywords["training_loss"]


def test_the_public_create_refuses_labels_that_are_no_whole_numbers(builtin_plugins):
    """Labels as text or nested lists passed the check and failed inside the sampler (ValueError:
    invalid literal for int(), TypeError: int() argument ... not 'list'), and float labels drew
    batches; each is now the one line, its value shown on one line however long."""
    import numpy as np
    import torch

    import fslab
    from fslab.core.errors import ConfigError

    expected = ("config key 'sampler.labels' must be the training split's labels, one whole number per image "
                "(a list, tensor or array), got ")
    for labels, shown in [(["a", "b"] * 10, "['a', 'b', 'a', 'b', 'a', 'b', 'a', 'b', 'a', 'b', 'a', 'b', 'a', 'b',"
                                             " 'a', ..."),
                          ([[0, 1]] * 2, "[[0, 1], [0, 1]]"), ([0.5, 1.5], "[0.5, 1.5]"),
                          ([True, False], "[True, False]"),
                          (torch.zeros(2, 2, dtype=torch.long), "tensor([[0, 0], [0, 0]])"),
                          (torch.tensor([0.0, 1.0]), "tensor([0., 1.])"), (np.array([0.0, 1.0]), "array([0., 1.])")]:
        with pytest.raises(ConfigError) as caught:
            fslab.create("sampler", "episodic", labels=labels, batch_size=4, seed=0, ways=2, shots=1, queries=1)
        assert str(caught.value) == expected + shown
    for labels in [[0, 1] * 4, tuple(range(4)) * 2, np.arange(8) % 4, torch.arange(8) % 4,
                   list(torch.arange(8) % 4), np.arange(8, dtype=np.uint8) % 4]:
        assert len(fslab.create("sampler", "episodic", labels=labels, batch_size=4, seed=0, ways=2, shots=1,
                                queries=1)) == 2


def test_the_public_create_refuses_a_dataset_root_that_is_no_path(builtin_plugins, tmp_path):
    """root=5 read as the folder './5' ("the data root .../5 is not a folder"), root=['a'] as
    ".../['a']": a wrong type is said as one, and text or a Path still reach the dataset."""
    import fslab
    from fslab.core.errors import ConfigError

    for root in (5, ["data"], b"/data"):
        with pytest.raises(ConfigError) as caught:
            fslab.create("dataset", "folder", root=root)
        assert str(caught.value) == ("config key 'dataset.root' must be the dataset's folder, as text or a "
                                     f"pathlib.Path, or None, got {root!r}")
    for root in (tmp_path, str(tmp_path)):
        with pytest.raises(UsageError, match=rf"^folder: {tmp_path}/train not found\."):
            fslab.create("dataset", "folder", root=root)
    assert fslab.create("dataset", "synthetic", root=None).channels == 1


def test_the_public_create_takes_a_tuple_where_a_list_is_declared(builtin_plugins):
    """widths=(8, 16, 32, 64) was refused with "must be a list, got (8, 16, 32, 64)"."""
    import fslab
    from fslab.core.errors import ConfigError

    net = fslab.create("backbone", "resnet12", in_channels=1, widths=(8, 16, 32, 64))
    assert net.out_dim == 64 and net.stage_dims == [8, 16, 32, 64]
    with pytest.raises(ConfigError, match=r"^config key 'backbone\.widths\[2\]' must be an integer, got \"x\"$"):
        fslab.create("backbone", "resnet12", in_channels=1, widths=(8, 16, "x", 64))


def test_the_public_create_runs_the_plugins_own_check_as_fslab_run_set_does(builtin_plugins, tmp_path,
                                                                             monkeypatch):
    """What a component's check= refuses and its allowed= rules do not (a loss's or an
    evaluator's temperature, nca's pair_fraction) is refused by fslab.create with the
    line `fslab run --set` gives; the checks that need a run (the samplers') let create build."""
    import fslab

    from .runs_helpers import fslab as cli

    for kind, name, param, value in [("loss", "nca", "temperature", 0.0), ("loss", "nca", "pair_fraction", 2.0),
                                     ("evaluator", "soft", "temperature", 0.0)]:
        run = cli("run", "nca", "--set", f"{kind}.name={name}", "--set", f"{kind}.{param}={value}",
                  cwd=tmp_path, timeout=60)
        assert run.returncode == 2 and not (tmp_path / "runs").exists(), run.stderr
        with pytest.raises(UsageError) as created:
            fslab.create(kind, name, **{param: value})
        assert run.stderr.strip().splitlines() == [f"error: {created.value}"]
    labels = [c for c in range(4) for _ in range(8)]
    for name, params in [("fixed", {"ways": 2}), ("episodic", {"ways": 2, "shots": 1, "queries": 1}), ("iid", {}),
                         ("iid-replacement", {})]:
        assert next(fslab.create("sampler", name, labels=labels, batch_size=8, seed=0, **params).batches(0))
    # a third-party check written when context was always a run's (it reads context.config) is left to the run
    component = fslab.get_registry().get("loss", "nca")
    monkeypatch.setitem(component.info, "check", lambda params, context: context.config["train"]["batch_size"])
    with pytest.warns(UserWarning, match=r"check of loss .nca. .* failed: AttributeError.*context None"):
        assert fslab.create("loss", "nca", temperature=0.5) is not None


def test_every_built_in_parameter_refuses_a_wrong_value_in_one_line(builtin_plugins):
    """A string, a list or a negative number for each parameter of each
    built-in loss, sampler and evaluator is a configuration error, never a
    plugin check that fails on a value it did not expect."""
    import fslab
    from fslab.core.config import resolve
    from fslab.core.errors import FslabError
    from fslab.core.settings import Settings

    registry = fslab.get_registry()
    for kind in ("loss", "sampler", "evaluator"):
        for name in registry.names(kind):
            component = registry.get(kind, name)
            method = "protonet" if component.info.get("episodic") or (kind == "sampler" and name != "iid") else "nca"
            for param in component.params:
                for value in ("x", [], -1):
                    try:
                        resolve(method, registry=registry, settings=Settings(),
                                overrides=[{kind: {"name": name, param: value}}])
                    except FslabError as exc:
                        assert "the check of" not in str(exc), str(exc)


@pytest.mark.parametrize("keywords, message", [
    # a name that is no text broke every later command (fslab plugins: a TypeError from fnmatch)
    ('name=5, description="d"', "name= must be text without spaces"),
    ('name="my loss", description="d"', "got 'my loss'"),
    ('name="scaled", description=None', "description= must be text, got None"),
    ('name="scaled", description="d", params=["scale"]', "params= must be a dict"),
    # a truthy string made the loss episodic; a list of defaults, or a batch= that is no function,
    # failed fslab run with a traceback
    ('name="scaled", description="d", episodic="no"', "episodic= must be True or False, got 'no'"),
    ('name="scaled", description="d", defaults=[{"train": {}}]', "defaults= must be a dict"),
    ('name="scaled", description="d", batch=4', "batch= must be a function batch(params, batch_size), got 4"),
    # a check written check(params) loaded, and failed every run that used it (takes 1 positional argument)
    ('name="scaled", description="d", check=lambda params: None',
     "check= must be a function check(params, context), got <lambda>(params)"),
    ('name="scaled", description="d", batch=lambda params, batch_size, seed: 4',
     "batch= must be a function batch(params, batch_size), got <lambda>(params, batch_size, seed)"),
])
def test_register_refuses_keywords_of_the_wrong_type_as_its_plugins_load_failure(builtin_plugins, tmp_path,
                                                                                  keywords, message):
    source = LOCAL_LOSS.replace('name="scaled", description="sum times a scale", paper="none"', keywords)
    assert keywords in source
    registry = load_registry([write_plugin(tmp_path / "local", "typed", source)])
    assert [f.plugin for f in registry.failures] == ["local:typed"]
    assert message in registry.failures[0].error and "from plugin 'local:typed'" in registry.failures[0].error
    assert all(isinstance(n, str) for n in registry.names("loss"))


@pytest.mark.parametrize("target", ["fslab_local_plugins.typed", "fslab_local_plugins.typed:", "typed.scaled"])
def test_register_refuses_a_lazy_target_not_written_module_colon_attr(builtin_plugins, tmp_path, target):
    """It registered, and each use failed later: "points at 'fslab_local_plugins.typed', which cannot be
    imported: module 'fslab_local_plugins.typed' has no attribute ''"."""
    source = LOCAL_LOSS.replace("register(scaled,", f"register({target!r}, params={{'scale': 2.0}},")
    registry = load_registry([write_plugin(tmp_path / "local", "typed", source)])
    assert [f.plugin for f in registry.failures] == ["local:typed"]
    assert registry.failures[0].error == (f"TypeError: loss 'scaled' from plugin 'local:typed': a lazy target is "
                                          f"written 'module:attr' (e.g. 'my_pkg.networks:BigNet'), got {target!r}")
    good = LOCAL_LOSS.replace("register(scaled,", "register('fslab_local_plugins.typed:scaled', params={'scale': 2.0},")
    fine = load_registry([write_plugin(tmp_path / "fine", "typed", good)])
    assert not fine.failures and fine.get("loss", "scaled").params == {"scale": 2.0}


POSITIONAL = """
    from fslab.plugin import LossOutput, hookimpl


    def wide(z, labels, support=None, margin: float = 1.0):
        return LossOutput(margin * z.sum() * 0, None, None)


    class Tiny:
        def __init__(self, in_channels=3, hidden=4):
            self.out_dim = hidden


    @hookimpl
    def register_losses(register):
        register(wide, name="wide", description="margin declared before the star")


    @hookimpl
    def register_backbones(register):
        register(Tiny, name="tiny", description="hidden declared before the star")
"""


KWARGS_LOSSES = """
    from fslab.plugin import LossOutput, hookimpl

    def open_loss(z, labels, support=None, **kw):
        return LossOutput(z.sum() * kw.get("scale", 1.0), 0, 0)

    def scaled_open(z, labels, support=None, *, scale: float = 1.0, **kw):
        return LossOutput(z.sum() * scale, 0, 0)

    class Head:
        def __init__(self, num_classes, *, scale: float = 1.0):
            self.num_classes, self.scale = num_classes, scale

        def __call__(self, z, labels, support=None):
            return LossOutput(z.sum() * self.scale, 0, 0)

    @hookimpl
    def register_losses(register):
        register(open_loss, name="open", description="a function taking **kw")
        register(scaled_open, name="scaled-open", description="scale, then **kw")
        register(Head, name="head", description="a class naming num_classes")
"""


def test_a_loss_taking_kwargs_is_not_said_to_allow_what_fslab_fills_in(builtin_plugins, tmp_path, monkeypatch):
    """A loss function with **kw was said to allow num_classes and out_dim (fslab.create('loss', 'open',
    scal=2): "Allowed: num_classes, out_dim."), names its author never wrote; a class that names
    num_classes still lists it, and what fslab fills in is still taken."""
    import fslab
    from fslab.core.errors import ConfigError
    from fslab.core.settings import Settings

    monkeypatch.chdir(tmp_path)
    fslab.get_registry(Settings(plugin_dirs=(write_plugin(tmp_path / "local", "open", KWARGS_LOSSES),)))
    for name, allowed in (("open", ", which takes no parameters."), ("scaled-open", "Allowed: scale."),
                          ("head", "Allowed: num_classes, scale.")):
        with pytest.raises(ConfigError) as caught:
            fslab.create("loss", name, scal=2.0)
        assert str(caught.value).endswith(allowed), (name, str(caught.value))
    assert fslab.describe("loss", "open")["params"] == {}
    assert fslab.create("loss", "open", out_dim=8).keywords == {"out_dim": 8}


BROKEN_RECIPES = """
    from fslab.plugin import hookimpl

    @hookimpl
    def register_methods(register):
        register({"loss": "nca"}, name="bare-loss", description="a section given as a name")
        register({"train": 5}, name="bare-train", description="a section given as a number")
        register({"nope": 1, "loss": {"name": "nca"}}, name="stray", description="a key fslab has not")
"""


def test_a_recipe_of_the_wrong_shape_is_one_line(builtin_plugins, tmp_path):
    """fslab run with a recipe {"loss": "nca"} was AttributeError: 'str' object has no attribute 'get', one of
    {"train": 5} KeyError: 'batch_size', and a key fslab has not ({"nope": 1}) was dropped in silence; a
    recipe that is no dict of settings fails its plugin's loading."""
    from fslab.core.config import resolve
    from fslab.core.errors import ConfigError
    from fslab.core.settings import Settings

    registry = load_registry([write_plugin(tmp_path / "local", "recipes", BROKEN_RECIPES)])
    for method, message in [("bare-loss", "'loss' is a section; choose the plugin with loss.name=..."),
                            ("bare-train", "'train' is a section; set its keys, e.g. train.epochs=..."),
                            ("stray", "unknown config key 'nope'. Allowed: method, seed, ")]:
        with pytest.raises(ConfigError) as caught:
            resolve(method, registry=registry, settings=Settings())
        assert str(caught.value).startswith(f"method '{method}': {message}"), str(caught.value)
    (tmp_path / "listed").mkdir()
    (tmp_path / "listed" / "listed.py").write_text(
        "from fslab.plugin import hookimpl\n\n@hookimpl\ndef register_methods(register):\n"
        "    register([('loss', 'nca')], name='listed', description='pairs, not a dict')\n")
    failures = load_registry([tmp_path / "listed"]).failures
    assert [f.error for f in failures] == [
        "TypeError: method 'listed' from plugin 'local:listed': the target must be a dict, a partial configuration "
        "such as {'loss': {'name': 'nca'}}, got [('loss', 'nca')]"]


def test_a_parameter_declared_before_the_star_is_explained(tmp_path):
    # def wide(z, labels, support=None, margin=1.0): margin is no parameter fslab sets, and --set loss.margin=2
    # said only "Allowed: (none)"; the call's own arguments (support) get no such hint
    from fslab.core.errors import ConfigError
    from fslab.core.plugin_params import plugin_params

    registry = load_registry([write_plugin(tmp_path, "positional", POSITIONAL)])
    hint = ("('margin' is in its signature but not after a *: fslab sets keyword-only parameters only, "
            "so the plugin should declare it as def f(..., *, margin=...))")
    with pytest.raises(ConfigError) as caught:
        plugin_params(registry, "loss", "wide", {"margin": 2.0})
    assert str(caught.value) == (f"unknown parameter 'loss.margin' for loss 'wide', which takes no parameters. "
                                 f"Loss 'lpn' has it (so does 'triplet'). {hint}")  # the built-ins that declare it
    with pytest.raises(ConfigError) as caught:
        plugin_params(registry, "loss", "wide", {"support": 2.0})
    assert str(caught.value) == "unknown parameter 'loss.support' for loss 'wide', which takes no parameters."
    with pytest.raises(ConfigError, match=r"\('hidden' is in its signature but not after a \*"):
        plugin_params(registry, "backbone", "tiny", {"hidden": 8})


def test_the_readme_python_api_example_runs_and_gives_what_its_comments_show(tmp_path):
    """README's Python API example, run as written (with a batch for its `z, labels`): its comment
    said fslab.available("loss") gives ['nca', 'protonet'] (fourteen losses are built in) and that
    describe gives six keys (a line of fslab plugins --json, ten or more)."""
    import ast
    import json
    import subprocess
    import sys
    from pathlib import Path

    import torch

    import fslab

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    code = re.search(r"## Python API\n\n```python\n(.*?)```", text, re.S).group(1)
    scope = {"z": torch.randn(8, 16, requires_grad=True), "labels": torch.arange(4).repeat(2)}
    exec(code, scope)  # noqa: S102 - the README's own example
    assert type(scope["out"]).__name__ == "LossOutput" and scope["net"].out_dim > 0
    for line in code.splitlines():
        call, _, said = line.partition("#")
        said = said.strip()
        if call.startswith("fslab.available"):
            kind = re.match(r'fslab.available\("(\w+)"', call).group(1)
            got = [name for name in eval(call, scope)  # noqa: S307 - built-ins only: the README shows those
                   if fslab.describe(kind, name)["origin"].startswith("entry point fslab_plugins.")]
            if said.startswith("["):
                assert got == ast.literal_eval(said), line
            else:
                first, last = re.search(r"\['([^']+)', .*'([^']+)'\]", said).groups()
                assert len(got) > 2 and got == sorted(got) and (got[0], got[-1]) == (first, last), line
    listed = subprocess.run([sys.executable, "-m", "fslab", "plugins", "--kind", "loss", "--json"], cwd=tmp_path,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    (line,) = [json.loads(line) for line in listed if json.loads(line)["name"] == "nca"]
    assert set(fslab.describe("loss", "nca")) == set(line)


HALF_REGISTERED = """
    from fslab.plugin import hookimpl


    def first_loss(z, labels, support=None):
        return z.sum() * 0


    def second_loss(z, labels, support=None):
        return z.sum() * 0


    class Net:
        out_dim = 8

        def __init__(self, in_channels):
            pass


    @hookimpl
    def register_losses(register):
        register(first_loss, name="first", description="registered before its sampler hook raised")


    @hookimpl
    def register_samplers(register):
        raise RuntimeError("the sampler's index is missing")


    @hookimpl
    def register_methods(register):  # called after the raise: what it would register is not wanted either
        register({"loss": {"name": "first"}}, name="first-method", description="d")
"""

RAISES_MIDWAY = """
    from fslab.plugin import hookimpl


    def second_loss(z, labels, support=None):
        return z.sum() * 0


    @hookimpl
    def register_losses(register):
        register(second_loss, name="second", description="registered before the same hook raised")
        raise ValueError("no third loss")
"""


def test_a_plugin_whose_register_hook_raises_registers_nothing(builtin_plugins, tmp_path):
    """A plugin whose hook raised after it (or another of its hooks) had registered components was said to have
    failed to load, yet those components stayed: listed by fslab plugins, and runs trained with them."""
    folder = write_plugin(tmp_path / "local", "half", HALF_REGISTERED)
    write_plugin(folder, "midway", RAISES_MIDWAY)
    registry = load_registry([folder])
    assert {f.plugin: f.error.split(";")[0] for f in registry.failures} == {
        "local:half": "RuntimeError: the sampler's index is missing", "local:midway": "ValueError: no third loss"}
    for kind, name in (("loss", "first"), ("loss", "second"), ("method", "first-method")):
        assert name not in registry.names(kind), (kind, name)
    with pytest.raises(UsageError, match=r"^Unknown loss 'first': plugin 'local:half', whose source names it, "
                                         r"failed to load: RuntimeError: the sampler's index is missing"):
        registry.get("loss", "first")
    assert "nca" in registry.names("loss")  # the other plugins' components stay
