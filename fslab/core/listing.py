"""What ``fslab plugins`` and shell completion list, without importing every plugin.

Listing the registered components means importing every plugin module and
reading every distribution's metadata: most of the start-up of ``fslab
plugins`` and of a TAB. So a full load leaves behind what it found (each
component as ``fslab plugins --json`` describes it, and the plugins that
failed) in the user's cache folder, with a fingerprint of what that depended
on: fslab's version and registry code, the folders on ``sys.path`` (installing
or removing a distribution changes their modification time), every plugin
module and local plugin file imported, the module that defines each
component's target (a local plugin may register a class of the project's own
package), and every study file read and the folder it was found in (a study
file added beside it). A listing
whose fingerprint still matches reads that file; any other loads the plugins
again and rewrites it. A listing in which a plugin imported but failed to
register its components is not saved: what it read is not known. Building a component (``fslab run``, ``fslab.create``)
always loads the plugins themselves; so does a listing under
``FSLAB_PLUGINS`` or ``FSLAB_STRICT_PLUGINS``, and any listing when
``FSLAB_NO_CACHE`` is set.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

from fslab.core.settings import plugin_folders

FORMAT = 1
# The environment that changes what a load finds: such a listing is never cached.
UNCACHED_WHEN = ("FSLAB_PLUGINS", "FSLAB_STRICT_PLUGINS", "FSLAB_NO_CACHE")


@dataclass(frozen=True)
class Listing:
    """The plugin kinds, every registered component as ``fslab plugins --json``
    describes it, and ``(plugin, error)`` for each plugin that failed to load."""

    kinds: list[str]
    components: list[dict]
    failures: list[tuple[str, str]]

    def names(self, kind: str) -> list[str]:
        return sorted(c["name"] for c in self.components if c["kind"] == kind)

    def check_kind(self, kind: str) -> None:
        """One line naming the kinds when ``kind`` is none of them."""
        from fslab.core.errors import UnknownName

        if kind not in self.kinds:
            raise UnknownName("plugin kind", kind, self.kinds)

    def of_kind(self, kind: str) -> list[dict]:
        return sorted((c for c in self.components if c["kind"] == kind), key=lambda c: c["name"])


def plugin_listing(plugin_dirs=(), *, load=None) -> Listing:
    """The registry's listing, from the cache when it is still true, else from
    ``load()`` (by default :func:`fslab.core.registry.load_registry`)."""
    dirs = list(plugin_folders(plugin_dirs))
    cached = not any(os.environ.get(name) for name in UNCACHED_WHEN)
    path = _cache_path(dirs)
    if cached:
        found = _read(path)
        if found is not None:
            return found
    if load is None:
        from fslab.core.registry import load_registry

        registry = load_registry(dirs)
    else:
        registry = load()
    # as saved: a listing shows the same whether it was loaded or read back
    from fslab.core.registry import KINDS

    found = json.loads(json.dumps({
        "kinds": KINDS,
        "components": [registry.get(kind, name).describe() for kind in registry.components
                       for name in registry.names(kind)],
        "failures": [[f.plugin, f.error] for f in registry.failures]}, default=str))
    listing = Listing(found["kinds"], found["components"], [tuple(f) for f in found["failures"]])
    # a plugin that imported but failed to register (a broken study file) read files no one can
    # name: its listing is not kept, so mending them is seen at the next listing
    if cached and not any(plugin in registry.plugins for plugin, _ in listing.failures):
        _write(path, listing, _depends_on(registry, dirs))
    return listing


# -- the fingerprint ------------------------------------------------------------


def _stamp(path: str) -> list | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def _fingerprint(files: list[str]) -> dict:
    """fslab's version and core code (what loads and checks plugins: an edit of an editable
    install is seen), the ``sys.path`` folders, and ``files``, each stamped."""
    import fslab

    core = sorted(str(p) for p in Path(__file__).parent.glob("*.py"))  # not imported: listing stays cheap
    here = os.getcwd()
    folders = [p for p in sys.path if p and p != here and os.path.isdir(p)]
    return {"format": FORMAT, "fslab": fslab.__version__, "python": sys.executable,
            "stamps": {p: _stamp(p) for p in [*core, *folders, *files]}}


def _depends_on(registry, dirs: list[str]) -> list[str]:
    """The files a load read: the modules of each entry-point plugin's package,
    the local plugin files, the module each component's target was defined in
    (its parameters are read from its signature), and the study files and their
    folders; for a plugin that failed to import, its file too, so that mending
    it is seen at once."""
    packages = set()
    files = []
    origins = [origin for _, origin in registry.plugins.values()]
    for origin in [*origins, *registry.failed_origins.values()]:
        if origin.startswith("entry point "):
            module = origin.removeprefix("entry point ").split(":")[0]
            packages.add(module.split(".")[0])
            files.append(_module_file(module))
        else:
            files.append(origin)
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and name.split(".")[0] in packages:
            files.append(file)
    for components in registry.components.values():  # a target imported from a module of another package
        for component in components.values():
            module = sys.modules.get(getattr(component.target, "__module__", None) or "")
            files.append(getattr(module, "__file__", None))
    studies = [str(c.target) for c in registry.components.get("study", {}).values()]
    files += studies + [os.path.dirname(study) for study in studies]  # a study file added beside them
    files += dirs  # a file added to a plugin folder
    return sorted(set(files) - {None})


def _module_file(module: str) -> str | None:
    """Where ``module`` would be imported from (a module whose import failed
    is gone from ``sys.modules``), or None where it cannot be told."""
    from importlib.util import find_spec

    try:
        spec = find_spec(module)
    except (Exception, SystemExit):  # a parent package that fails to import, a name that is no module
        return None
    return spec.origin if spec is not None and spec.has_location else None


# -- the cache file ---------------------------------------------------------------


def _cache_path(dirs: list[str]) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fslab"
    key = zlib.crc32("\0".join([sys.executable, *dirs]).encode())
    return base / f"plugins-{key:08x}.json"


def _read(path: Path) -> Listing | None:
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved["fingerprint"]["format"] != FORMAT or saved["fingerprint"] != _fingerprint(saved["files"]):
            return None
        return Listing(saved["kinds"], saved["components"], [tuple(f) for f in saved["failures"]])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, listing: Listing, files: list[str]) -> None:
    """Save the listing; a cache folder that cannot be written only costs the next listing its speed."""
    from fslab.core.files import atomic_write_text

    record = {"fingerprint": _fingerprint(files), "files": files, "kinds": listing.kinds,
              "components": listing.components, "failures": listing.failures}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(record, default=str), durable=False)
    except OSError:
        pass
