"""benchmarks/bench_gpu.py keeps working on the CPU, and counts what it claims to count."""

from __future__ import annotations

import json
import types

import torch

from .bench_helpers import load_benchmark


def load_bench():
    return load_benchmark("bench_gpu")


def test_flops_of_a_step_are_the_convolutions_forward_and_backward(registry):
    """Conv4 (hidden 8) on 16×16: each 3×3 convolution costs 2·B·Cin·Cout·9·H·W forward, as much again
    for its weight gradient, and as much again for its input gradient except the first (the images
    need none); batch norm, ReLU and pooling are not counted by torch's counter."""
    bench = load_bench()
    model = registry.create("backbone", "conv4", in_channels=3, hidden=8)
    x, y = bench.batch_for(4, 16, torch.device("cpu"))
    forward = [2 * 4 * cin * 8 * 9 * size * size for cin, size in ((3, 16), (8, 8), (8, 4), (8, 2))]
    summed = lambda z, labels: types.SimpleNamespace(loss=z.sum())  # noqa: E731 - a loss without matrix products
    assert bench.step_flops(model, summed, x, y) == 3 * sum(forward) - forward[0]


def test_the_benchmark_runs_on_the_cpu_and_writes_its_rows(tmp_path, registry):
    bench = load_bench()
    out = tmp_path / "rows.jsonl"
    bench.main(["--device", "cpu", "--backbones", "conv4", "--losses", "nca", "--modes", "fp32,bf16",
                "--batch-size", "8", "--image-size", "16", "--steps", "1", "--warmup", "1", "--peak-tflops", "1",
                "--json", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["loss"], r["mode"]) for r in rows] == [("nca", "fp32"), ("nca", "bf16"), ("nca (by hand)", "bare fp32")]
    for row in rows:
        assert row["images_per_s"] > 0 and row["gflop_per_image"] > 0
        # MFU is the counted FLOPs per second over the peak given (1 TFLOP/s here)
        expected = row["gflop_per_image"] * 1e9 * row["images_per_s"] / 1e12
        assert abs(row["mfu"] - expected) <= 1e-9 * max(1.0, expected)
    assert rows[0]["gflop_per_image"] == rows[1]["gflop_per_image"]  # counted on the same eager step
