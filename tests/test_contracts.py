"""Registry-driven contracts for fslab's own plugins: the same checks a
third-party plugin gets from fslab.testing (ContractTests), with the small
parameters the built-ins need to run on the CPU in seconds; then the promises
only some built-ins make."""

from __future__ import annotations

import pytest

from fslab.core.errors import UsageError
from fslab.testing import ContractTests
from fslab.testing.checks import build_loss, episode

from .conftest import BUILTIN_PLUGINS
from .test_datasets_disk import FAKES


class TestBuiltinContracts(ContractTests):
    plugins = BUILTIN_PLUGINS.split(",")
    backbone_params = {
        "conv4": {"hidden": 8},
        "resnet12": {"widths": [4, 4, 8, 8]},
        "resnet12-nca": {"widths": [4, 4, 8, 8]},
        "wrn28-10": {"depth": 10, "widen_factor": 1},
    }
    sampler_params = {"episodic": {"shots": 2, "per_class": 4}}

    def dataset_args(self, name, tmp_path):
        """A tiny copy of the dataset's layout (tests/test_datasets_disk.py), 8-pixel images."""
        build, params = FAKES[name]
        build(tmp_path)
        if name != "synthetic":
            params = {**params, "image_size": 8}
        if "check_counts" in self.registry.get("dataset", name).params:
            params = {**params, "check_counts": False}  # the standard counts would need the full download
        return {"root": str(tmp_path), **params}


def _episodic_losses() -> list[str]:
    registry = TestBuiltinContracts().registry
    return [n for n in registry.names("loss")
            if registry.get("loss", n).info.get("episodic") and registry.get("loss", n).plugin in BUILTIN_PLUGINS]


@pytest.mark.parametrize("name", _episodic_losses())
def test_episodic_losses_refuse_a_batch_without_support_rows(registry, name):
    z, labels, _ = episode()
    with pytest.raises(UsageError, match="episodic sampler"):
        build_loss(registry, name)(z, labels, None)
