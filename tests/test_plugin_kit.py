"""The plugin author kit: `fslab new plugin`, and fslab.testing's checks
failing on components that break their contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fslab.cli import app
from fslab.kit import KINDS

runner = CliRunner()


def test_new_plugin_writes_a_package_with_one_module_per_kind(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["new", "plugin", "fslab_margin", "--kind", "loss", "--kind", "evaluator"])
    assert result.exit_code == 0, result.output
    package = tmp_path / "fslab_margin"
    assert sorted(p.name for p in (package / "fslab_margin").iterdir()) == ["__init__.py", "evaluator.py", "loss.py"]
    pyproject = (package / "pyproject.toml").read_text()
    assert 'fslab_margin_loss = "fslab_margin.loss"' in pyproject and "[project.entry-points.fslab]" in pyproject
    tests = (package / "tests" / "test_contracts.py").read_text()
    assert "plugins = ['fslab_margin_loss', 'fslab_margin_evaluator']" in tests
    for path in package.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")


@pytest.mark.parametrize("argv, message", [
    (["new", "plugin", "Bad-Name"], "is not a valid package name"),
    (["new", "plugin", "class"], "is not a valid package name"),
    (["new", "plugin", "ok", "--kind", "los"], "Did you mean 'loss'?"),
    (["new", "plugin", "taken"], "already exists"),
])
def test_new_plugin_refuses_in_one_line(tmp_path, argv, message):
    (tmp_path / "taken").mkdir()
    result = subprocess.run([sys.executable, "-m", "fslab", *argv], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "ok").exists()


BROKEN = '''
import torch
from fslab.plugin import LossOutput, hookimpl

def detached(z, labels, support=None, *, margin: float = 1.0):
    loss = z[:1].pow(2).sum()           # only the first row gets a gradient
    return LossOutput(loss, 10_000, 0)  # more positives than the batch has pairs

def clumsy(support, query, *, k: int = 1):
    return torch.zeros(query.shape[:2], dtype=torch.long)  # always way 0

class Lazy:
    def __init__(self, in_channels, *, width: int = 8):
        self.out_dim = width

@hookimpl
def register_losses(register):
    register(detached, name="detached", description="broken")

@hookimpl
def register_evaluators(register):
    register(clumsy, name="clumsy", description="broken")

@hookimpl
def register_backbones(register):
    register("fslab_local_plugins.broken:Lazy", name="lazy", description="declares another default",
             params={"width": 16})
'''


@pytest.fixture
def broken(tmp_path, builtin_plugins):
    from fslab.core.registry import load_registry

    (tmp_path / "broken.py").write_text(BROKEN)
    return load_registry([tmp_path])


def test_the_checks_catch_what_breaks_a_contract(broken):
    from fslab.testing.checks import check_evaluator, check_loss, check_parameters

    with pytest.raises(AssertionError, match="detached: positives = 10000, outside 0..60"):
        check_loss(broken, "detached")
    with pytest.raises(AssertionError, match="clumsy: 0.3. accuracy on well-separated classes"):
        check_evaluator(broken, "clumsy")
    with pytest.raises(AssertionError, match=r"declares params \{'width': 16\}.*are \{'width': 8\}"):
        check_parameters(broken, "backbone", "lazy")
    check_evaluator(broken, "centroid")  # the built-in keeps them all
    check_parameters(broken, "loss", "detached")


@pytest.mark.slow
def test_a_generated_package_installs_lists_and_passes_its_own_tests(tmp_path):
    """Every kind, installed editable into a fresh venv that sees this environment's packages."""
    kinds = [arg for kind in KINDS for arg in ("--kind", kind)]
    made = subprocess.run([sys.executable, "-m", "fslab", "new", "plugin", "fslab_every", *kinds], cwd=tmp_path,
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # a venv made from a venv sees the base interpreter only: add this one's packages (fslab's dependencies, pip)
    (Path(site) / "parent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {**os.environ, "FSLAB_STRICT_PLUGINS": "1"}
    env.pop("FSLAB_PLUGINS", None)
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                              str(tmp_path / "fslab_every")], capture_output=True, text=True, env=env)
    assert install.returncode == 0, install.stderr
    listed = subprocess.run([str(python), "-m", "fslab", "plugins", "--json"], capture_output=True, text=True,
                            env=env, cwd=tmp_path)
    ours = {(c["kind"], c["name"]) for c in map(json.loads, listed.stdout.splitlines())
            if c["plugin"].startswith("fslab_every_")}
    assert ours == {(kind, "fslab-every") for kind in KINDS}, listed.stderr
    tested = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"], capture_output=True,
                            text=True, env=env, cwd=tmp_path / "fslab_every")
    assert tested.returncode == 0, tested.stdout[-3000:]
    assert "17 passed" in tested.stdout and "skipped" not in tested.stdout, tested.stdout[-2000:]


LOCAL_PLUGIN = '''
from fslab.plugin import LossOutput, hookimpl

def sloppy(z, labels, support=None, *, margin: float = 1.0):
    return LossOutput(z.pow(2).sum(), -1, 0)  # a negative pair count

def tidy(z, labels, support=None):
    return LossOutput(z.pow(2).mean(), 0, 0)  # compares no two embeddings

@hookimpl
def register_losses(register):
    register(sloppy, name="sloppy", description="breaks the pair counts")
    register(tidy, name="tidy", description="keeps the contract")
'''


def test_contract_tests_read_the_ini_option_and_fail_a_broken_component(tmp_path):
    """The pytest route an author takes: the plugin named in the ini option
    fslab_plugins, the tests one ContractTests subclass."""
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "mine.py").write_text(LOCAL_PLUGIN)
    (tmp_path / "pytest.ini").write_text("[pytest]\nfslab_plugins = local:mine\n")
    (tmp_path / "test_mine.py").write_text(
        "from fslab.testing import ContractTests\n\n\n"
        "class TestMine(ContractTests):\n    plugin_dirs = ('local',)\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "fslab.testing", "-p", "no:cacheprovider",
                             "-q", "-rfs"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "FAILED test_mine.py::TestMine::test_loss[sloppy]" in result.stdout
    assert "sloppy: positives = -1, outside 0..60" in result.stdout
    # the other loss, both parameter checks and the loading pass; the kinds the plugin lacks are skipped, saying so
    assert "1 failed, 4 passed, 5 skipped" in result.stdout and "the plugins register no sampler" in result.stdout
    assert "test_loss[tidy] PASSED" in subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "fslab.testing", "-p", "no:cacheprovider", "-v"], cwd=tmp_path,
        capture_output=True, text=True).stdout
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    unnamed = subprocess.run([sys.executable, "-m", "pytest", "-p", "fslab.testing", "-p", "no:cacheprovider"],
                             cwd=tmp_path, capture_output=True, text=True)
    assert unnamed.returncode != 0 and "name the fslab plugins to check" in unnamed.stdout + unnamed.stderr


def test_declared_values_are_refused_at_launch_and_listed(tmp_path):
    def fslab(*argv):
        return subprocess.run([sys.executable, "-m", "fslab", *argv], cwd=tmp_path, capture_output=True, text=True)

    refused = fslab("run", "nca", "--set", "evaluator.name=knn", "--set", "evaluator.k=-3")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip() == "error: config key 'evaluator.k' must be at least 0, got -3"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    listed = {c["name"]: c for c in map(json.loads, fslab("plugins", "--kind", "loss", "--json").stdout.splitlines())}
    assert listed["protonet"]["allowed"] == {"distance": "one of euclidean, cosine"}
    assert "allowed" not in listed["nca"]  # its ranges are cross-checked by its own check=
    table = fslab("plugins", "--kind", "backbone").stdout
    assert "hidden=64 (at least 1)" in table


def test_new_plugin_imports_no_torch(tmp_path):
    code = ("import sys\nfrom fslab.cli import app\ntry:\n"
            "    app(['new', 'plugin', 'fslab_light', '--kind', 'backbone', '--kind', 'method'])\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print('torch loaded:', 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "torch loaded: False" in result.stdout
    assert (tmp_path / "fslab_light" / "fslab_light" / "method.py").exists()
