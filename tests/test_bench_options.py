"""Every benchmark refuses a wrong option in one line with exit 2 (argparse's error) before it
measures anything: not a traceback, and not after minutes of timing on a lent GPU."""

from __future__ import annotations

import sys

import pytest

from .bench_helpers import load_benchmark

# bench_gpu at a size that measures in a second, where an option checked too late would let it start
TINY_GPU = ["--device", "cpu", "--backbones", "conv4", "--losses", "nca", "--modes", "fp32", "--no-bare",
            "--batch-size", "8", "--image-size", "16", "--steps", "3", "--warmup", "1"]

REFUSED = [
    ("bench_gpu", ["--device", "gpu"], "--device must be cpu, cuda or cuda:N, got 'gpu'"),
    ("bench_gpu", ["--device", "cpu", "--backbones", "conv4,conv5"], "unknown backbone conv5; registered: conv4"),
    ("bench_gpu", ["--device", "cpu", "--losses", "ncaa"], "--losses: unknown loss ncaa; registered:"),
    ("bench_gpu", ["--device", "cpu", "--batch-size", "0"], "--batch-size must be at least 2, got 0"),
    ("bench_gpu", ["--device", "cpu", "--json", "{tmp}/nowhere/rows.jsonl"], "/nowhere; make it first"),
    ("bench_gpu", ["--device", "cpu", "--recipe", "--recipe-set", "train.lr"], "--recipe-set expects key=value"),
    ("bench_gpu", [*TINY_GPU, "--seconds", "inf"], "--seconds must be a number of seconds, 0 or more, got inf"),
    ("bench_gpu", [*TINY_GPU, "--seconds", "nan"], "--seconds must be a number of seconds, 0 or more, got nan"),
    ("bench_gpu", [*TINY_GPU, "--seconds", "-1"], "--seconds must be a number of seconds, 0 or more, got -1.0"),
    ("bench_gpu", [*TINY_GPU, "--peak-tflops", "inf"], "--peak-tflops must be a positive number of TFLOP/s"),
    ("bench_losses", ["--device", "cpu", "--steps", "0"], "--steps must be at least 1, got 0"),
    ("bench_losses", ["--device", "cpu", "--backbone", "resnet13"], "unknown backbone resnet13; registered:"),
    ("bench_map", ["--repeats", "0"], "--repeats must be at least 1, got 0"),
    ("bench_map", ["--device", "tpu"], "--device must be cpu, cuda or cuda:N, got 'tpu'"),
    ("bench_eval", ["--backbone", "resnet13"], "unknown backbone resnet13; registered:"),
    ("bench_eval", ["--device", "cuda:7"], "--device cuda:7: this machine has"),
    ("bench_pipeline", ["--device", "cpu", "--batch", "0"], "--batch must be at least 1, got 0"),
    ("bench_scheduler", ["--runs", "1"], "--runs must be at least 2, got 1"),
    ("bench_store", ["--runs", "5", "--live", "0"], "--live must be at least 1, got 0"),
    ("bench_tui", ["--runs", "5", "--ticks", "0"], "--ticks must be at least 1, got 0"),
    ("bench_tui", ["--runs", "5", "--live", "10"], "--live must be at most --runs (5), got 10"),
    ("make_runs", ["{tmp}/runs", "--runs", "3", "--live", "5"], "--live from 0 to --runs"),
    ("bench_data_checks", ["--scale", "0"], "--scale must be above 0 and at most 1, got 0.0"),
    ("bench_data_checks", ["--dir", "{tmp}/nowhere"], "/nowhere: there is no such folder; make it first"),
    ("bench_long_run", ["--steps", "50"], "--steps must be at least 100, got 50"),
    ("bench_long_run", ["--repeats", "0"], "--repeats must be at least 1, got 0"),
    ("bench_short_ids", ["--runs", "0"], "--runs must be at least 1, got 0"),
    ("bench_plot", ["--runs", "2"], "--runs must be at least 3, got 2"),
    ("bench_studies", ["--device", "cpu", "nca-figg2"], "Unknown study 'nca-figg2'. Did you mean 'nca-fig2'?"),
    ("bench_studies", ["--device", "cpu", "nca-fig2", "--set", "train.foo=1"], "unknown config key 'train.foo'"),
]


@pytest.mark.parametrize(("script", "argv", "said"), REFUSED)
def test_a_wrong_option_is_one_line_and_exit_2(script, argv, said, tmp_path, capsys, monkeypatch, registry):
    bench = load_benchmark(script)
    argv = [part.replace("{tmp}", str(tmp_path)) for part in argv]
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    with pytest.raises(SystemExit) as stopped:
        bench.main()
    assert stopped.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()  # one line: argparse's usage lines above it were left out
    assert f"{script}.py: error: " in line and said in line
    assert not (tmp_path / "runs").exists()


def test_bench_pipeline_says_it_needs_torchvision_before_writing_its_images(tmp_path, capsys, monkeypatch):
    bench = load_benchmark("bench_pipeline")
    find_spec = bench.importlib.util.find_spec
    monkeypatch.setattr(bench.importlib.util, "find_spec",
                        lambda name, *rest: None if name == "torchvision" else find_spec(name, *rest))
    monkeypatch.setattr(bench.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["bench_pipeline.py", "--device", "cpu", "--classes", "2", "--per-class", "4",
                                      "--batch", "4", "--size", "16"])
    with pytest.raises(SystemExit, match="torchvision is not installed here: pip install torchvision"):
        bench.main()
    assert list(tmp_path.iterdir()) == []
