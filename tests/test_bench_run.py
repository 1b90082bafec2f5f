"""benchmarks/run.py, the one command of the README's Benchmarks: its training part runs a real
``fslab run`` the configuration check accepts, and its ratio counts images over seconds."""

from __future__ import annotations

import json
import re

import pytest

from .bench_helpers import load_benchmark


def load_bench():
    return load_benchmark("run")


def test_the_run_s_rate_is_its_intervals_images_over_their_seconds_after_the_first():
    bench = load_bench()
    train = [{"step": 2, "images_per_s": 1000.0},  # the warm-up interval, left out
             {"step": 4, "images_per_s": 100.0},  # 16 images in 0.16 s
             {"step": 6, "images_per_s": 50.0}]  # 16 images in 0.32 s
    # 32 images in 0.48 s, as the bare loop counts its steps; the mean of the two rates would say 75
    assert bench.logged_images_per_s(train, batch=8) == pytest.approx(32 / 0.48)


def test_a_real_fslab_run_of_a_few_steps_is_timed(project):
    """The run's settings passed fslab's configuration check (its 13 images a class could not
    hold a validation episode of 5 shots + 15 queries, and the benchmark stopped there)."""
    bench = load_bench()
    rate, timed, warmup = bench.fslab_images_per_s(project, "conv4", steps=4, batch=8)
    assert rate > 0
    (run,) = [path for path in (project / "runs").iterdir() if path.is_dir()]
    assert (run / "results.json").exists()
    # the steps the rate is over, for the bare loop to time as many: the whole epoch but its first interval
    start = next(e for e in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if e["event"] == "start")
    assert (warmup, timed) == (2, start["total_steps"] - 2)


def test_the_bare_loop_times_the_steps_the_run_timed_after_as_many_warm_up_steps(monkeypatch, capsys):
    """The run trains a whole epoch (45 steps at --steps 4 --batch-size 16, its episodes needing 6
    images a class) and skips its first logged interval (2 steps); the bare loop timed --steps steps
    after one, so at the smallest settings the ratio compared a warm loop with a cold one (4.2x)."""
    bench = load_bench()
    calls = []
    monkeypatch.setattr(bench, "startup", lambda project, repeats: None)
    monkeypatch.setattr(bench, "worker_startup", lambda project, repeats: None)
    monkeypatch.setattr(bench, "fslab_images_per_s", lambda project, backbone, steps, batch: (120.0, 43, 2))
    monkeypatch.setattr(bench, "bare_images_per_s", lambda *args: calls.append(args) or 100.0)
    bench.main(["--backbone", "conv4", "--steps", "4", "--batch-size", "16", "--repeats", "1"])
    assert calls == [("conv4", 43, 16, 2)]
    out = capsys.readouterr().out
    assert re.match(r"machine: .+, \d+ of \d+ CPUs, load average [\d.]+\n## CLI start-up", out)
    assert "each timed over 43 steps after 2 warm-up steps" in out and "ratio fslab / bare      1.200" in out


def test_the_worker_start_up_is_from_its_start_to_its_start_event(project, capsys):
    import json

    bench = load_bench()
    bench.worker_startup(project, repeats=1)
    (run,) = [path for path in (project / "runs").iterdir() if path.is_dir()]
    started = json.loads((run / "status.json").read_text())["started"]
    start = next(e for e in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if e["event"] == "start")
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("python -c import torch") and printed[1].split()[:4] == [
        "worker", "to", "first", "step"]
    assert float(printed[1].split()[4]) == pytest.approx(start["time"] - started, abs=0.0005)


@pytest.mark.parametrize(("argv", "said"), [
    (["--steps", "-3"], ": error: --steps must be at least 4 (two logged intervals: the first warms up), "
                        "got -3\n"),
    (["--batch-size", "1"], ": error: --batch-size must be at least 2 (NCA needs pairs), got 1\n"),
    (["--repeats", "0"], ": error: --repeats must be at least 1, got 0\n"),
    (["--backbone", "resnet13"], "unknown backbone 'resnet13'; the backbones are conv4, resnet12"),
])
def test_bad_options_are_one_line_and_exit_2_before_anything_is_timed(argv, said, capsys, registry):
    bench = load_bench()
    with pytest.raises(SystemExit) as stopped:
        bench.main(argv)
    assert stopped.value.code == 2
    captured = capsys.readouterr()
    assert said in captured.err and captured.out == ""
