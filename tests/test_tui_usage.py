"""CPU, memory and GPU use of running runs: sampled by the worker into its
heartbeat in status.json (a real tiny run on CPU), and shown by the dashboard
from a written status (which never imports torch)."""

from __future__ import annotations

import json
import math
import re
import time

import hypothesis
from hypothesis import strategies as st

from fslab.core import schemas
from fslab.core.summary import read_summary
from fslab.execution.usage import UsageSampler, gpu_usage, resident_bytes
from fslab.tui.model import size

from .runs_helpers import TINY, fslab
from .test_tui import drive, frozen_app, open_detail
from .test_tui_helpers import FROZEN, standard_store, write_status
from .test_tui_layout import lines_of, table_lines


def test_the_sampler_measures_this_process():
    """CPU time over wall time, as os.times and the clock measure it around the
    sampler (on a shared machine a busy loop gets less than one core)."""
    import os

    wall0, cpu0 = time.monotonic(), sum(os.times()[:2])
    sampler = UsageSampler()
    end = time.process_time() + 0.3
    while time.process_time() < end:  # busy
        pass
    usage = sampler.sample()
    wall1, cpu1 = time.monotonic(), sum(os.times()[:2])
    expected = 100 * (cpu1 - cpu0) / (wall1 - wall0)
    assert usage["cpu_percent"] > 0 and abs(usage["cpu_percent"] - expected) < 0.2 * expected + 5
    assert usage["rss_bytes"] > 10 * 2**20 and abs(resident_bytes() - usage["rss_bytes"]) < 200 * 2**20
    assert schemas.conform(usage, schemas.USAGE) == usage


def test_a_real_run_writes_its_usage_into_the_heartbeat(project):
    result = fslab("run", "nca", *TINY, "--epochs", "2", cwd=project)
    assert result.returncode == 0, result.stderr
    [run_dir] = (project / "runs").iterdir()
    status = json.loads((run_dir / "status.json").read_text())
    usage = status["usage"]  # heartbeat every 0.2 s: the run beat several times
    assert usage["cpu_percent"] > 0 and usage["rss_bytes"] > 50 * 2**20  # torch is loaded
    assert not any(key.startswith("gpu_") for key in usage)  # CPU only: CUDA never set up, no GPU keys
    assert schemas.conform(usage, schemas.USAGE) == usage
    assert read_summary(run_dir).usage == usage


def test_no_gpu_keys_without_torch_or_cuda(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert gpu_usage() == {}


def test_the_dashboard_shows_the_usage_of_running_runs(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    folders = standard_store(runs)
    for key, usage in (("running", {"time": FROZEN - 1, "cpu_percent": 251.4, "rss_bytes": int(1.5 * 2**30),
                                    "gpu_allocated_bytes": 2 * 2**30, "gpu_reserved_bytes": 3 * 2**30,
                                    "gpu_utilization_percent": 87.0}),
                       ("done0", {"time": FROZEN - 200, "cpu_percent": 99.0, "rss_bytes": 2**30}),
                       ("done1", {"cpu_percent": "lots", "rss_bytes": -0.5})):  # damaged: ignored
        status = json.loads((folders[key] / "status.json").read_text())
        write_status(folders[key], {**status, "usage": usage})
    running = folders["running"].name

    async def body(app, pilot):
        assert app.rows[running].usage["cpu_percent"] == 251.4
        assert app.rows[folders["done1"].name].usage is None
        text = "\n".join(table_lines(app))
        assert "251%" in text and "1.5G" in text and "2.0G/3.0G" in text and "87%" in text
        assert "99%" not in text  # an ended run's last sample is not shown as if live
        await pilot.click(app.screen.table, offset=(x_of(app, "cpu") + 1, 0))
        assert app.screen.table.ids[0] == running
        await open_detail(app, pilot, running)
        summary = str(app.screen.query_one("#summary").render())
        assert "cpu 251% · mem 1.5G · gpu mem 2.0G/3.0G (allocated/reserved) · gpu 87%" in summary
        assert "cpu 251%" in "\n".join(lines_of(app))

    drive(frozen_app(runs), body, size=(200, 36))


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.example(999.6)  # 1000B
@hypothesis.example(102_350)  # 100.0K, six characters
@hypothesis.example(10**400)  # beyond a float: OverflowError (fslab's JSON reader refuses one past 64 bits)
@hypothesis.example(-5)  # -5B: a damaged status.json's rss_bytes
@hypothesis.example(-0.0)  # -0B
@hypothesis.given(st.integers(-10, 2**90) | st.floats())
def test_a_size_is_under_1000_of_the_smallest_unit_it_fits_one_decimal_under_100(n):
    text = size(n)
    try:
        bytes_ = float(n)
    except OverflowError:
        bytes_ = math.inf
    if not 0 <= bytes_ < math.inf:  # no memory holds it
        assert text == "-"
        return
    number, decimal, unit = re.fullmatch(r"(\d+)(\.\d)?([BKMGT])", text).groups()
    shown, power = float(number + (decimal or "")), "BKMGT".index(unit)
    assert shown < 1000 or unit == "T"
    assert (decimal is not None) == (unit != "B" and shown < 100)
    assert abs(shown - bytes_ / 1024**power) <= (0.05 if decimal else 0.5) * (1 + 1e-9)
    assert power == 0 or bytes_ / 1024**(power - 1) >= 999.5 * (1 - 1e-9)  # the unit below would show 1000


def test_a_size_that_rounds_to_1000_or_100_is_shown_in_the_next_unit_or_without_its_decimal():
    assert [size(n) for n in (999.6, 1_023_949, 102_350, 10**400, -1, -0.0)] == ["1.0K", "1.0M", "100K", "-", "-", "0B"]


def x_of(app, column: str) -> int:
    return table_lines(app)[0].index(column)


def test_gpu_usage_sums_the_visible_gpus_and_survives_a_missing_nvml(monkeypatch):
    """No GPU on this machine: a stand-in for torch.cuda with two devices, whose
    utilisation fails as it does without NVML (memory is still reported)."""
    import sys
    import types

    def no_nvml(device):
        raise ModuleNotFoundError("pynvml")

    cuda = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, device_count=lambda: 2,
                                 memory_allocated=lambda d: (d + 1) * 2**30, memory_reserved=lambda d: 4 * 2**30,
                                 utilization=no_nvml)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert gpu_usage() == {"gpu_allocated_bytes": 3 * 2**30, "gpu_reserved_bytes": 8 * 2**30}
    cuda.utilization = lambda d: 50.0 + 40 * d
    assert gpu_usage()["gpu_utilization_percent"] == 70.0
    cuda.is_initialized = lambda: False  # a CPU run: CUDA is never set up by sampling
    assert gpu_usage() == {}
    cuda.is_initialized = lambda: 1 / 0  # a driver gone wrong
    assert gpu_usage() == {}
