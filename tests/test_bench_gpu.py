"""benchmarks/bench_gpu.py keeps working on the CPU, and counts what it claims to count."""

from __future__ import annotations

import json
import types

import pytest
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


def test_kernels_and_operators_fall_in_the_category_their_name_says():
    bench = load_bench()
    names = {  # CUDA kernels as cuDNN, cuBLAS, PyTorch and Triton name them, and CPU operators
        "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64": "conv & matmul",
        "sm90_xmma_wgrad_implicit_gemm_indexed_wo_smem_bf16bf16_bf16f32_f32_nhwckrsc_nhwc": "conv & matmul",
        "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn": "conv & matmul",
        "triton_tem_fused_convolution_0": "conv & matmul",
        "aten::mkldnn_convolution": "conv & matmul",
        "aten::addmm": "conv & matmul",
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<__nv_bfloat16, float, float, 512, true, 1, true>": "batch norm",
        "triton_red_fused__native_batch_norm_legit_functional_leaky_relu_0": "batch norm",
        "aten::native_batch_norm_backward": "batch norm",
        "void at::native::(anonymous namespace)::max_pool_forward_nhwc<c10::BFloat16>": "pooling",
        "aten::max_pool2d_with_indices_backward": "pooling",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::TensorListMetadata<3>>":
            "optimiser",
        "Optimizer.step#SGD.step": "optimiser",
        "aten::_foreach_add_": "optimiser",
        "Memcpy DtoD (Device -> Device)": "copies & layout",
        "void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16>": "copies & layout",
        "aten::copy_": "copies & layout",
        "triton_poi_fused_leaky_relu_leaky_relu_backward_3": "elementwise & other",
        "triton_poi_fused_convert_element_type_1": "elementwise & other",  # a cast, not a convolution
        "triton_poi_fused_convolution_leaky_relu_2": "elementwise & other",  # a convolution's epilogue
        "triton_red_fused__native_batch_norm_legit_functional_convolution_3": "batch norm",
        "void cudnn::cnn::conv2d_grouped_direct_kernel<float>": "conv & matmul",
        "aten::convolution_backward": "conv & matmul",
        "void at::native::vectorized_elementwise_kernel<4, at::native::leaky_relu_kernel>": "elementwise & other",
        "aten::logsumexp": "elementwise & other",
        "aten::scatter_": "elementwise & other",
    }
    assert {name: bench.category(name) for name in names} == names


def test_a_profile_splits_the_kernel_time_and_says_how_busy_and_how_fast_the_products_were():
    bench = load_bench()
    profile = bench.time_by_category([("sm90_xmma_fprop_implicit_gemm", 0.006), ("aten::cudnn_convolution", 0.002),
                                      ("bn_fw_tr_1C11", 0.001), ("vectorized_elementwise_kernel", 0.001)])
    assert profile["conv & matmul"] == 0.008 and profile["pooling"] == 0.0 and len(profile) == 6
    # 10 ms of kernels in a 12.5 ms step; 4 TFLOP of products in 8 ms is 500 TFLOP/s, half of a 1,000 peak
    b = bench.bound(profile, 0.0125, 4e12, 1000.0)
    assert abs(b["busy"] - 0.8) < 1e-12 and abs(b["gemm_of_peak"] - 0.5) < 1e-12
    assert abs(b["shares"]["conv & matmul"] - 0.8) < 1e-12 and abs(sum(b["shares"].values()) - 1) < 1e-12
    # MFU = the products' share of peak × their share of kernel time × busy: 0.5 × 0.8 × 0.8
    assert abs(4e12 / 0.0125 / 1e15 - b["gemm_of_peak"] * b["shares"]["conv & matmul"] * b["busy"]) < 1e-12


def test_the_profile_of_a_cpu_step_covers_its_operators(tmp_path, capsys, registry):
    bench = load_bench()
    out = tmp_path / "rows.jsonl"
    bench.main(["--device", "cpu", "--backbones", "conv4", "--losses", "nca", "--modes", "fp32", "--no-bare",
                "--batch-size", "8", "--image-size", "16", "--steps", "1", "--warmup", "1", "--profile",
                "--json", str(out)])
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    shares = row["bound"]["shares"]
    assert abs(sum(shares.values()) - 1) < 1e-9
    # Conv4's own operators: convolutions, batch norm, pooling all take time; no peak is known on the CPU
    assert min(shares["conv & matmul"], shares["batch norm"], shares["pooling"]) > 0
    assert row["bound"]["gemm_of_peak"] is None and 0 < row["bound"]["busy"] <= 1
    # as measured, and in the table; the shares in their order of size, which varies with the machine's load
    lines = [line for line in capsys.readouterr().out.splitlines() if "operator time: " in line]
    assert len(lines) == 2 and all("conv & matmul" in line and "batch norm" in line for line in lines)


@pytest.mark.slow
def test_a_timed_run_s_parts_add_up_to_its_time(registry):
    bench = load_bench()
    parts = bench.time_recipe(["run", "nca", "--backbone", "conv4", "--dataset", "synthetic", "--device", "cpu",
                               "--epochs", "2", "--set", "backbone.hidden=8", "--set", "eval.test_episodes=20",
                               "--set", "eval.val_episodes=10", "--set", "eval.val_every=2"])
    spent = sum(parts[bench.key(part)] for part in bench.PARTS)
    assert abs(spent - parts["run_s"]) < 1e-6 and parts["total_s"] == spent and parts["wall_s"] >= parts["run_s"]
    assert (parts["epochs"], parts["validations"], parts["compile_s"]) == (2, 1, 0.0)
    assert min(parts["start_s"], parts["first_epoch_s"], parts["training_s"], parts["test_s"]) > 0
    assert len(bench.recipe_lines(parts)) == len(bench.PARTS) + 1


def test_an_unknown_mode_is_one_line_naming_the_modes(capsys):
    bench = load_bench()
    with pytest.raises(SystemExit) as stop:
        bench.main(["--device", "cpu", "--modes", "bf16,fp33"])
    assert stop.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.endswith("unknown mode fp33; the modes are fp32, bf16, bf16+compile, bf16+max-autotune")
