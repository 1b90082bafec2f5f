"""The fault-injection scenarios under pytest: every fault handled with nothing
lost, every bad input refused in one line before any run folder exists."""

from __future__ import annotations

import pytest

from tests.faults.lab import Lab, Skipped
from tests.faults.scenarios import BAD_INPUTS, FAULTS, bad_input


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAULTS))
def test_fault(name, tmp_path, builtin_plugins):
    try:
        FAULTS[name](Lab(tmp_path / "project"))
    except Skipped as why:
        pytest.skip(str(why))


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input(name, tmp_path, builtin_plugins):
    argv, files = BAD_INPUTS[name]
    bad_input(Lab(tmp_path / "project"), argv, files)
