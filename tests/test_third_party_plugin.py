"""A plugin published as its own pip package is found and trains like a built-in."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from .runs_helpers import TINY, events, fslab

pytestmark = pytest.mark.slow

PYPROJECT = """
    [build-system]
    requires = ["setuptools>=70.1"]
    build-backend = "setuptools.build_meta"

    [project]
    name = "fslab-margin"
    version = "0.3.0"
    dependencies = ["fslab"]

    [project.entry-points.fslab]
    margin = "fslab_margin"
"""

PLUGIN = '''
    """A contrastive margin loss, as a third party would publish it."""
    import torch

    from fslab.plugin import LossOutput, hookimpl


    def margin_loss(z, labels, support=None, *, margin: float = 1.0):
        """Pull same-class pairs together, push other pairs beyond ``margin``."""
        d = torch.cdist(z, z)
        same = labels[:, None] == labels[None, :]
        upper = torch.ones_like(same).triu(1)
        pos, neg = same & upper, ~same & upper
        loss = (d[pos].pow(2).sum() + (margin - d[neg]).clamp(min=0).pow(2).sum()) / upper.sum()
        return LossOutput(loss, pos.sum(), neg.sum())


    @hookimpl
    def register_losses(register):
        register(margin_loss, name="margin", description="contrastive margin loss", paper="Hadsell et al. 2006")


    @hookimpl
    def register_methods(register):
        register({"loss": {"name": "margin", "margin": 2.0}, "sampler": {"name": "iid"},
                  "evaluator": {"name": "centroid"}}, name="margin", description="margin loss, iid batches")
'''


def test_pip_installed_plugin_is_listed_and_trains(project, tmp_path, monkeypatch):
    dist = tmp_path / "fslab-margin"
    (dist / "fslab_margin").mkdir(parents=True)
    (dist / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT))
    (dist / "fslab_margin" / "__init__.py").write_text(textwrap.dedent(PLUGIN))
    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(site), str(dist)],
        capture_output=True, text=True,
    )
    assert install.returncode == 0, install.stderr
    monkeypatch.setenv("PYTHONPATH", str(site) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("FSLAB_PLUGINS", os.environ["FSLAB_PLUGINS"] + ",margin")

    listed = [json.loads(line) for line in fslab("plugins", "--json", cwd=project).stdout.splitlines()]
    margin = next(c for c in listed if c["kind"] == "loss" and c["name"] == "margin")
    assert margin["version"] == "fslab-margin 0.3.0" and margin["params"] == {"margin": 1.0}
    assert margin["origin"] == "entry point fslab_margin"

    result = fslab("run", "margin", *TINY, "--epochs", "1", cwd=project)
    assert result.returncode == 0, result.stderr
    run_dir = next((project / "runs").iterdir())
    config = json.loads((run_dir / "config.json").read_text())
    assert config["loss"] == {"name": "margin", "margin": 2.0}
    for event in events(run_dir, "train"):  # all pairs of a 32-image batch are used
        assert event["positives"] + event["negatives"] == 32 * 31 // 2
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"


def _distribution(site, entry_points: str) -> None:
    """An installed distribution, as pip leaves one: its package and its dist-info (no pip run needed)."""
    (site / "fslab_typo").mkdir(parents=True)
    (site / "fslab_typo" / "__init__.py").write_text("")
    (site / "fslab_typo" / "losses.py").write_text(textwrap.dedent('''
        from fslab.plugin import LossOutput, hookimpl

        def fine(z, labels, support=None):
            return LossOutput(z.pow(2).mean(), 0, 0)

        @hookimpl
        def register_losses(register):
            register(fine, name="fine", description="a loss")
    '''))
    info = site / "fslab_typo-0.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fslab-typo\nVersion: 0.2.0\n")
    (info / "entry_points.txt").write_text(f"[fslab]\n{entry_points}\n")


@pytest.mark.parametrize("target, message", [
    # ModuleNotFoundError: No module named 'fslab_typo.lossez', naming neither the entry point nor its package
    ("fslab_typo.lossez", "ModuleNotFoundError: No module named 'fslab_typo.lossez'; the entry point 'typo = "
                          "\"fslab_typo.lossez\"' of fslab-typo 0.2.0 ([project.entry-points.fslab]) names it. Did "
                          "you mean 'fslab_typo.losses'?"),
    ("fslab_typo.losses:register_loses",
     "AttributeError: module 'fslab_typo.losses' has no attribute 'register_loses'; the entry point 'typo = "
     "\"fslab_typo.losses:register_loses\"' of fslab-typo 0.2.0 ([project.entry-points.fslab]) names it. Did you "
     "mean 'fslab_typo.losses:register_losses'?"),
])
def test_an_entry_point_with_a_typo_names_itself_its_distribution_and_the_closest_name(project, tmp_path,
                                                                                       monkeypatch, target, message):
    site = tmp_path / "site"
    _distribution(site, f"typo = {target}")
    monkeypatch.setenv("PYTHONPATH", str(site) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("FSLAB_PLUGINS", os.environ["FSLAB_PLUGINS"] + ",typo")
    monkeypatch.delenv("FSLAB_STRICT_PLUGINS", raising=False)
    result = fslab("plugins", "--kind", "loss", cwd=project)
    assert result.returncode == 1
    assert result.stderr.splitlines()[0] == f"fslab plugin 'typo' failed to load: {message}", result.stderr
