"""The plugin listing that ``fslab plugins`` and completion read: the same as
a full load, read back while nothing it depends on changed, loaded again as
soon as something did (fslab.core.listing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fslab.core.listing import plugin_listing
from fslab.core.registry import load_registry

LOSS = '''from fslab.plugin import LossOutput, hookimpl


def {name}(z, labels, support=None, *, scale: float = 1.0):
    return LossOutput(z.sum() * scale, 0, 0)


@hookimpl
def register_losses(register):
    register({name}, name="{name}", description="{description}")
'''


@pytest.fixture
def listing_env(tmp_path, monkeypatch):
    """The real environment's plugins (no FSLAB_PLUGINS: that bypasses the cache),
    a cache folder of the test's own, and a local plugin folder."""
    for name in ("FSLAB_PLUGINS", "FSLAB_STRICT_PLUGINS", "FSLAB_NO_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "margin.py").write_text(LOSS.format(name="margin", description="first"))
    return folder


def _loaded(folder) -> list[dict]:
    """What a full load describes, as the listing keeps it (through JSON)."""
    registry = load_registry([folder])
    return json.loads(json.dumps([registry.get(k, n).describe() for k in registry.components
                                  for n in registry.names(k)], default=str))


def test_the_cached_listing_equals_a_full_load(listing_env):
    def no_load():
        raise AssertionError("the listing loaded the plugins although its cache was true")

    first = plugin_listing([listing_env])
    assert list((listing_env.parent / "cache" / "fslab").glob("plugins-*.json"))
    again = plugin_listing([listing_env], load=no_load)
    assert first.components == again.components == _loaded(listing_env)
    assert "margin" in again.names("loss") and "nca" in again.names("loss")
    margin = next(c for c in again.of_kind("loss") if c["name"] == "margin")
    assert margin["description"] == "first" and margin["params"] == {"scale": 1.0}


def test_a_changed_plugin_file_or_a_new_one_is_seen_at_once(listing_env):
    plugin_listing([listing_env])
    path = listing_env / "margin.py"
    path.write_text(LOSS.format(name="margin", description="second, edited"))
    stamp = time.time_ns() + 5_000_000_000  # a clock that ticks coarsely must still show the edit
    os.utime(path, ns=(stamp, stamp))
    edited = plugin_listing([listing_env])
    assert next(c for c in edited.of_kind("loss") if c["name"] == "margin")["description"] == "second, edited"

    (listing_env / "hinge.py").write_text(LOSS.format(name="hinge", description="new"))
    assert "hinge" in plugin_listing([listing_env]).names("loss")


def test_a_plugin_file_that_failed_to_import_and_is_mended_in_place_is_seen_at_once(listing_env):
    path = listing_env / "margin.py"
    path.write_text(LOSS.format(name="margin", description="mended").replace("from fslab.plugin", "from nowhere"))
    assert plugin_listing([listing_env]).failures == [("local:margin", f"ModuleNotFoundError: No module named "
                                                                       f"'nowhere'; raised loading {path.resolve()} "
                                                                       f"(a file of plugin_dirs in fslab.toml)")]
    with path.open("w") as file:  # rewritten in place, as editors save: the folder itself does not change
        file.write(LOSS.format(name="margin", description="mended"))
    stamp = time.time_ns() + 5_000_000_000
    os.utime(path, ns=(stamp, stamp))
    mended = plugin_listing([listing_env])
    assert mended.failures == []
    assert next(c for c in mended.of_kind("loss") if c["name"] == "margin")["description"] == "mended"


def test_the_cache_depends_on_every_core_module_that_loads_and_checks_plugins(listing_env):
    """An edited rule of fslab.core.limits (an editable install) changes what a load reports."""
    import fslab.core

    plugin_listing([listing_env])
    (cache,) = (listing_env.parent / "cache" / "fslab").glob("plugins-*.json")
    stamped = json.loads(cache.read_text())["fingerprint"]["stamps"]
    core = os.path.dirname(fslab.core.__file__)
    for module in ("registry.py", "limits.py", "errors.py", "config.py"):
        assert stamped[os.path.join(core, module)] is not None


def test_a_damaged_cache_file_is_loaded_again(listing_env):
    plugin_listing([listing_env])
    (cache,) = (listing_env.parent / "cache" / "fslab").glob("plugins-*.json")
    cache.write_text('{"fingerprint": ')
    assert plugin_listing([listing_env]).components == _loaded(listing_env)


@pytest.mark.parametrize("variable", ["FSLAB_PLUGINS", "FSLAB_NO_CACHE"])
def test_a_restricted_or_uncached_listing_always_loads(listing_env, monkeypatch, variable):
    plugin_listing([listing_env])
    monkeypatch.setenv(variable, "margin" if variable == "FSLAB_PLUGINS" else "1")
    loads = []

    def counted():
        loads.append(1)
        return load_registry([listing_env])

    plugin_listing([listing_env], load=counted)
    assert loads == [1]


def test_listing_from_the_cache_imports_no_plugin_module(listing_env):
    code = ("import sys; from fslab.core.listing import plugin_listing; "
            f"found = plugin_listing([{str(listing_env)!r}]); "
            "print(len(found.names('loss')), sorted(m for m in sys.modules if m.startswith('fslab_plugins')))")
    env = {**os.environ}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    count, imported = first.stdout.split(" ", 1)
    assert imported.strip() != "[]"  # the first listing loaded the plugins
    assert second.stdout.strip() == f"{count} []"  # the second read them back, importing none


STUDIES = '''from pathlib import Path

from fslab.plugin import hookimpl, register_study_files


@hookimpl
def register_studies(register):
    register_study_files(register, Path(__file__).parent / "studies")
'''


def _study_file(folder, name: str, split: str = "val"):
    """A copy of a built-in study under another name (and split)."""
    import fslab_plugins.studies

    text = (Path(fslab_plugins.studies.__file__).parent / "nca-fig2.toml").read_text()
    text = text.replace('name = "nca-fig2"', f'name = "{name}"', 1).replace('split = "val"', f'split = "{split}"', 1)
    (folder / f"{name}.toml").write_text(text)


def test_a_study_file_added_beside_a_listed_one_is_seen_at_once(listing_env):
    (listing_env / "mystudies.py").write_text(STUDIES)
    (listing_env / "studies").mkdir()
    _study_file(listing_env / "studies", "my-fig2")
    assert "my-fig2" in plugin_listing([listing_env]).names("study")
    _study_file(listing_env / "studies", "my-fig2b")  # neither plugin file nor listed study changed
    assert {"my-fig2", "my-fig2b"} <= set(plugin_listing([listing_env]).names("study"))


def test_a_broken_study_file_mended_in_place_is_seen_at_once(listing_env):
    (listing_env / "mystudies.py").write_text(STUDIES)
    (listing_env / "studies").mkdir()
    _study_file(listing_env / "studies", "my-fig2", split="vall")
    broken = plugin_listing([listing_env])
    assert [plugin for plugin, _ in broken.failures] == ["local:mystudies"] and "vall" in broken.failures[0][1]
    _study_file(listing_env / "studies", "my-fig2")  # the same file, rewritten: its folder does not change
    mended = plugin_listing([listing_env])
    assert mended.failures == [] and "my-fig2" in mended.names("study")


def test_a_module_a_local_plugin_imports_its_loss_from_edited_in_place_is_seen_at_once(listing_env, monkeypatch):
    """The parameters listed are read from the target's signature, in a module of the project's
    own (here on sys.path): an edit of it in place (the folder unchanged) was listed as it was."""
    lib = listing_env.parent / "lib"
    lib.mkdir()
    helper = lib / "mylosses.py"
    code = "from fslab.plugin import LossOutput\n\n\ndef hinge(z, labels, support=None, *, margin: float = {}):\n" \
           "    return LossOutput(z.sum() * margin, 0, 0)\n"
    helper.write_text(code.format("1.0"))
    monkeypatch.syspath_prepend(str(lib))
    (listing_env / "reg.py").write_text("from mylosses import hinge\n\nfrom fslab.plugin import hookimpl\n\n\n"
                                        "@hookimpl\ndef register_losses(register):\n"
                                        "    register(hinge, name='hinge', description='a hinge')\n")
    assert next(c for c in plugin_listing([listing_env]).of_kind("loss") if c["name"] == "hinge")["params"] == {
        "margin": 1.0}
    with helper.open("w") as file:
        file.write(code.format("2.0"))
    stamp = time.time_ns() + 5_000_000_000
    os.utime(helper, ns=(stamp, stamp))
    sys.modules.pop("mylosses", None)  # a new process imports the edited file
    assert next(c for c in plugin_listing([listing_env]).of_kind("loss") if c["name"] == "hinge")["params"] == {
        "margin": 2.0}
    sys.modules.pop("mylosses", None)
