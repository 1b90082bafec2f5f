"""The architecture rules hold, and they catch what they are meant to catch.

The rules live in pyproject.toml: import-linter contracts (layers, no cycles,
no torch/textual/matplotlib in the core, the dashboard without torch, plugins
through fslab.plugin only) and ruff. CI runs both; these tests run them too,
check the module graph for cycles with a second implementation (Tarjan's
strongly connected components over grimp's graph, imports inside functions
included), and plant a breach in a copy of the sources to see it named."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run(*argv: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def test_import_contracts_are_kept():
    done = run(str(BIN / "lint-imports"), "--no-cache")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_ruff_finds_nothing():
    done = run(str(BIN / "ruff"), "check", "fslab", "plugins", "tests", "benchmarks")
    assert done.returncode == 0, done.stdout + done.stderr


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): the components with more than one module."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_module_graph_has_no_cycle():
    import grimp

    graph = grimp.build_graph("fslab", "fslab_plugins", cache_dir=None)
    modules = {m for m in graph.modules if m.split(".")[0] in ("fslab", "fslab_plugins")}
    edges = {m: graph.find_modules_directly_imported_by(m) & modules for m in modules}
    assert strongly_connected(edges) == []
    # the check itself: a cycle is found
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_a_planted_breach_is_named(tmp_path):
    """In a copy of the sources, an import inside a function from the core up
    into the execution layer breaks the layer and cycle contracts, and the
    report names the module and line."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "fslab", src / "fslab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "plugins", src / "fslab_plugins", ignore=shutil.ignore_patterns("__pycache__", "splits"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(src / "fslab" / "core" / "errors.py", "a") as fh:
        fh.write("\n\ndef _planted():\n    from fslab.execution.executor import stop\n    return stop\n")
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = run(str(BIN / "lint-imports"), "--no-cache", cwd=tmp_path, env=env)
    assert done.returncode != 0
    assert "fslab.core.errors -> fslab.execution.executor" in done.stdout
    assert "Layers: cli > tui > reports | execution | testing | kit > training > core BROKEN" in done.stdout
    assert "No import cycle between modules or packages BROKEN" in done.stdout


def test_functions_fit_on_a_screen():
    """No function in fslab is over 65 lines (training's loop included)."""
    long = []
    for path in (ROOT / "fslab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 65:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert long == []


def test_every_source_folder_and_data_file_is_declared_to_ship():
    """pyproject's packages name every folder under fslab/ and plugins/ that a package name can
    name, and its package-data globs cover every file that is not Python: a folder left out is
    left out of the wheel (or warned about at every install), a data file left out is missing."""
    from fnmatch import fnmatch

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {"fslab": ROOT / "fslab", "fslab_plugins": ROOT / "plugins"}
    folders, undeclared_files = {}, []
    for top, root in roots.items():
        for folder in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
            parts = folder.relative_to(root).parts
            if "__pycache__" not in parts and all(part.isidentifier() for part in parts):
                folders[".".join([top, *parts])] = folder
    assert sorted(folders) == sorted(setup["packages"])
    for package, folder in folders.items():  # each file is its nearest package's data
        for path in folder.rglob("*"):
            nearest = max((f for f in folders.values() if f in path.parents), key=lambda f: len(f.parts))
            if (path.is_dir() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts
                    or nearest != folder):
                continue
            relative = path.relative_to(folder).as_posix()
            if not any(fnmatch(relative, glob) for glob in setup["package-data"].get(package, [])):
                undeclared_files.append(f"{package}: {relative}")
    assert undeclared_files == []


def map_entries(readme: str) -> dict[str, str]:
    """README's "How fslab is built" map: each entry's path (``fslab/core/``, ``fslab/plugin.py``) and its text."""
    import re

    section = readme[readme.index("## How fslab is built"):]
    block = section[section.index("```\n") + 4:]
    block = block[:block.index("```")]
    return dict(re.findall(r"^((?:fslab|plugins)/\S*)(.*?)(?=^\S|\Z)", block, flags=re.M | re.S))


def map_problems(entries: dict[str, str], root: Path) -> list[str]:
    """What the map gets wrong against the sources under ``root``: a package (a folder of fslab/ or plugins/
    with an __init__.py) or a top-level module of fslab/ without its entry, an entry for none, and in each
    package's entry a module not named (as ``name.py``) or one named that is not there (__init__.py may be
    named: the package itself)."""
    import re

    packages = {f"{top}/{p.parent.name}/": p.parent for top in ("fslab", "plugins")
                for p in (root / top).glob("*/__init__.py")}
    files = {f"fslab/{p.name}" for p in (root / "fslab").glob("*.py")}
    problems = [f"{path}: no entry" for path in sorted({*packages, *files} - set(entries))]
    problems += [f"{path}: listed but absent" for path in sorted(set(entries) - {*packages, *files})]
    for path, folder in sorted(packages.items()):
        named = set(re.findall(r"(\w+)\.py\b", entries.get(path, ""))) - {"__init__"}
        there = {m.stem for m in folder.glob("*.py")} - {"__init__"}
        problems += [f"{path}{m}.py: not in the map" for m in sorted(there - named)]
        problems += [f"{path}{m}.py: in the map but absent" for m in sorted(named - there)]
    return problems


def test_the_readme_map_names_every_module():
    """README's "How fslab is built" names each module of each package of fslab/ and plugins/ in that package's
    entry (as ``name.py``), and fslab/'s own modules each in an entry of its own: a module left out is one a
    newcomer cannot place (errors, events, timing, numerics, usage and a dozen more once were), one listed but
    gone sends them looking for it. The check itself: a map without a module, or with one that is gone, fails."""
    entries = map_entries((ROOT / "README.md").read_text())
    assert map_problems(entries, ROOT) == []
    cut = {**entries, "fslab/core/": entries["fslab/core/"].replace("claims.py", "claims")}
    cut.pop("fslab/__main__.py")
    cut["plugins/sinks/"] += " neptune.py (gone)"
    cut["fslab/gone/"] = "old.py"
    assert map_problems(cut, ROOT) == ["fslab/__main__.py: no entry", "fslab/gone/: listed but absent",
                                       "fslab/core/claims.py: not in the map",
                                       "plugins/sinks/neptune.py: in the map but absent"]


def test_every_plugin_kind_has_its_contract_test_and_its_template():
    """A plugin kind lives in several places (README, "Where new things go"): the registry's
    kinds (the kit's too: each has a template) and ContractTests' tests are the same set."""
    from fslab.core.registry import KINDS
    from fslab.testing import KIND_TESTS

    assert sorted(KIND_TESTS.values()) == sorted(KINDS)
    assert [k for k in KINDS if not (ROOT / "fslab" / "kit" / "templates" / f"{k}.py.tmpl").exists()] == []


def test_the_readme_map_names_every_command_under_its_module():
    """README's fslab/cli/ entry says which module holds each command (`runs (runs, show, logs)`):
    where a new command goes, and where to read one. `delete` was left out of its module's list."""
    import re

    from fslab.cli import COMMANDS

    readme = (ROOT / "README.md").read_text()
    entry = readme[readme.index("fslab/cli/ "):readme.index("fslab/tui/ ")]
    groups = {module: set(re.findall(r"\w+", words)) for module, words in re.findall(r"(\w+)\.py\s+\(([^)]*)\)", entry)}
    misplaced = [f"{command} ({module})" for command, module in COMMANDS.items()
                 if command not in groups.get(module, {module})]
    assert misplaced == []
