"""How a run computes (train.precision, channels_last, compile, deterministic):
the network in the run's precision, the loss and the evaluation in float32,
recorded in the start event, deterministic for a seed and precision."""

from __future__ import annotations

import os

import pytest
import torch

from fslab.core.config import resolve, run_config
from fslab.core.settings import Settings
from fslab.training import distributed, evaluation
from fslab.training.build import to_input
from fslab.training.numerics import resolve_numerics

from .runs_helpers import TINY, events, fslab, fslab_here, train_run


def numerics_for(registry, *overrides, device="cpu"):
    config = resolve("nca", registry=registry, settings=Settings(), overrides=[{"device": device}, *overrides])
    return resolve_numerics(run_config(config), torch.device(device))


@pytest.fixture
def registry(builtin_plugins):
    from fslab.core.registry import load_registry

    return load_registry()


def test_auto_is_float32_in_the_default_format_on_the_cpu(registry):
    numerics = numerics_for(registry)
    assert (numerics.precision, numerics.eval_precision, numerics.channels_last) == ("fp32", "fp32", False)
    assert numerics.describe()["tf32"] is False  # TF32 is a CUDA matter
    chosen = numerics_for(registry, {"train": {"precision": "bf16", "channels_last": "on"}})
    assert (chosen.precision, chosen.eval_precision, chosen.channels_last) == ("bf16", "bf16", True)
    assert numerics_for(registry, {"train": {"precision": "bf16"}, "eval": {"precision": "fp32"}}).eval_precision \
        == "fp32"


def test_the_network_runs_in_bf16_and_the_loss_sees_float32(registry):
    torch.manual_seed(0)
    numerics = numerics_for(registry, {"train": {"precision": "bf16"}})
    backbone = registry.create("backbone", "conv4", in_channels=3, hidden=8)
    seen = {}

    def loss(z, labels, support=None):
        seen["dtype"] = z.dtype
        return z.pow(2).sum()

    inner = []
    backbone.register_forward_hook(lambda module, args, out: inner.append(out.dtype))
    step = distributed.training_step(backbone, torch.nn.Identity(), loss, distributed.World(),
                                     torch.device("cpu"), numerics.autocast)
    out = step(torch.randn(6, 3, 16, 16), torch.tensor([0, 0, 1, 1, 2, 2]))
    assert inner == [torch.bfloat16] and seen["dtype"] == torch.float32
    out.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in backbone.parameters())


def test_features_are_embedded_in_the_eval_precision_and_returned_in_float32(registry):
    torch.manual_seed(0)
    backbone = registry.create("backbone", "conv4", in_channels=3, hidden=8)
    images = torch.randint(0, 256, (10, 3, 16, 16), dtype=torch.uint8)
    exact = evaluation.extract_features(backbone, images, 4, "cpu", to_input)
    numerics = numerics_for(registry, {"train": {"precision": "bf16", "channels_last": "on"}})
    low = evaluation.extract_features(backbone.to(memory_format=torch.channels_last), images, 4, "cpu",
                                      lambda b: numerics.memory_format(to_input(b)),
                                      autocast=lambda: numerics.autocast(numerics.eval_precision))
    assert exact.dtype == low.dtype == torch.float32
    assert not torch.equal(exact, low)  # bf16 did run
    assert torch.allclose(exact, low, rtol=0.05, atol=0.05)  # and only rounded


RUN = [*TINY, "--epochs", "2", "--device", "cpu"]


def run_once(project, *extra):
    return train_run(project, "nca", *RUN, *extra)


@pytest.mark.slow
def test_a_bf16_channels_last_run_records_its_numerics_and_repeats_exactly(project):
    settings = ["--set", "train.precision=bf16", "--set", "train.channels_last=on", "--set", "train.deterministic=true"]
    first, results = run_once(project, *settings)
    (start,) = events(first, "start")
    assert {k: start[k] for k in ("precision", "eval_precision", "channels_last", "compile", "tf32")} == \
        {"precision": "bf16", "eval_precision": "bf16", "channels_last": True, "compile": "off", "tf32": False}
    second, again = run_once(project, *settings)
    assert again == results  # same seed, same precision, same machine: the same numbers
    assert [e["loss"] for e in events(first, "train")] == [e["loss"] for e in events(second, "train")]
    fp32, fp32_results = run_once(project)
    assert [e["loss"] for e in events(fp32, "train")] != [e["loss"] for e in events(first, "train")]
    assert events(fp32, "start")[0]["precision"] == "fp32"


@pytest.mark.slow
def test_an_fp16_run_scales_its_loss_and_keeps_the_scale_in_the_checkpoint(project):
    folder, _ = run_once(project, "--set", "train.precision=fp16")
    checkpoint = torch.load(folder / "checkpoints" / "last.pt", weights_only=True)
    assert checkpoint["grad_scaler"]["scale"] > 0
    assert checkpoint["grad_scaler"]["scale"] < 65536  # the first steps overflowed and were skipped ...
    assert "lr_scheduler.step()" not in (folder / "stderr.log").read_text()  # ... which PyTorch warns of for nothing
    result = fslab_here("eval", folder.name, "--episodes", "20", "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    assert (folder / "features" / "test-epoch2-fp16.pt").exists()  # features embedded in fp16 are cached apart


@pytest.mark.slow
def test_a_compiled_run_logs_its_compile_time_apart_and_saves_plain_weights(project):
    folder, _ = run_once(project, "--epochs", "1", "--set", "train.compile=default", "--set", "train.log_every=1")
    (compiled_event,) = events(folder, "compile")
    assert compiled_event["mode"] == "default" and compiled_event["seconds"] > 0 and compiled_event["step"] == 1
    first, *others = events(folder, "train")  # the first step's interval holds nothing but the compiling step:
    assert first["step"] == 1 and "images_per_s" not in first  # no rate (not a rate of 0)
    assert others and all(e["images_per_s"] > 0 for e in others)
    assert "step 1: loss" in (folder / "stdout.log").read_text().split("- img/s")[0]
    checkpoint = torch.load(folder / "checkpoints" / "last.pt", weights_only=True)
    assert not any(key.startswith("_orig_mod") for key in checkpoint["model"])  # the uncompiled module's weights


def test_compile_on_a_cpu_without_a_compiler_is_refused_before_a_run_exists(project):
    result = fslab("run", "nca", *RUN, "--set", "train.compile=default", cwd=project,
                   env={**os.environ, "PATH": "/nonexistent", "CXX": ""})
    assert result.returncode == 2 and "needs a C++ compiler" in result.stderr
    assert not (project / "runs").exists() or not any((project / "runs").glob("2*"))


def _compilers(folder, *names):
    """A PATH folder holding executables of these names (each prints a version)."""
    folder.mkdir()
    for name in names:
        (folder / name).write_text("#!/bin/sh\necho 1.0\n")
        (folder / name).chmod(0o755)
    return str(folder)


@pytest.mark.parametrize(("on_path", "cxx", "refused"), [
    (("c++", "clang++"), None, "g++"),  # torch runs g++ on Linux when $CXX is unset, not c++ or clang++
    (("g++",), "/nonexistent/g++", "$CXX ('/nonexistent/g++')"),  # torch runs $CXX, not the g++ on PATH
    (("g++",), "", "$CXX ('')"),  # an empty $CXX is what torch runs, and fails on
    (("g++",), None, None),
    (("clang++",), "clang++ -O2", None),  # a command with arguments: its first word is the compiler
])
def test_compile_on_the_cpu_checks_the_compiler_torch_runs(tmp_path, monkeypatch, on_path, cxx, refused):
    from fslab.core.config import DEFAULTS
    from fslab.core.errors import UsageError
    from fslab.execution.checks import check_compile

    monkeypatch.setenv("PATH", _compilers(tmp_path / "bin", *on_path))
    if cxx is None:
        monkeypatch.delenv("CXX", raising=False)
    else:
        monkeypatch.setenv("CXX", cxx)
    config = {"device": "cpu", "train": {**DEFAULTS["train"], "compile": "default"}}
    if refused is None:
        check_compile(config, None)
        return
    with pytest.raises(UsageError, match="needs a C\\+\\+ compiler") as error:
        check_compile(config, None)
    assert f"and {refused}, the one torch.compile runs, is not found" in str(error.value)


def test_fslab_eval_embeds_with_the_runs_deterministic_algorithms(registry, monkeypatch):
    from types import SimpleNamespace

    from fslab.training import run_eval

    monkeypatch.setattr(run_eval, "load_checkpoint", lambda path, device: {"epoch": 1})
    run = SimpleNamespace(checkpoint_path=None)

    def checkpoint(deterministic):
        config = resolve("nca", registry=registry, settings=Settings(),
                         overrides=[{"device": "cpu"}, {"train": {"deterministic": deterministic}}])
        return run_eval.Checkpoint(run, run_config(config), torch.device("cpu"), registry)

    try:
        checkpoint(True)  # as its training evaluated it (on CUDA: TF32 and cudnn's autotuning too)
        assert torch.are_deterministic_algorithms_enabled()
        checkpoint(False)  # the next run evaluated in the same process gets its own
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_a_run_that_compiles_nothing_never_imports_torch_dynamo():
    """Setting the deterministic switch (torch.use_deterministic_algorithms) imports torch._inductor and
    torch._dynamo: 1-2 s of every worker's start on a CPU, for runs that compile nothing and leave the
    switch off. It is set only where it changes something or where compiling brings inductor anyway."""
    import subprocess
    import sys

    code = ("import sys, torch\nfrom fslab.training.numerics import Numerics, apply_backend_settings\n"
            "cpu = torch.device('cpu')\n"
            "def applied(deterministic, compile='off'):\n"
            "    apply_backend_settings(Numerics(cpu, 'fp32', 'fp32', False, compile, False, deterministic))\n"
            "    return (torch.are_deterministic_algorithms_enabled(), 'torch._dynamo' in sys.modules)\n"
            "print(applied(False), applied(True), applied(False))\n"
            "import torch._inductor.config as inductor\n"
            "inductor.deterministic = True  # as TORCHINDUCTOR_DETERMINISTIC=1 sets it\n"
            "print(applied(False, 'default'), inductor.deterministic)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines() == ["(False, False) (True, True) (False, True)", "(False, True) False"], \
        done.stderr


def test_a_network_that_is_no_longer_finite_is_named_by_its_first_broken_tensor():
    """A batch-norm variance that overflowed (a huge --lr) leaves the training loss finite,
    since training mode normalises with the batch's own statistics; the state names it."""
    from fslab.training.train import nonfinite_tensor

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    head = torch.nn.Identity()
    assert nonfinite_tensor({"model": model, "head": head, "loss": lambda z: z}) is None
    model[1].running_var[2] = float("inf")
    assert nonfinite_tensor({"model": model, "head": head}) == "model's 1.running_var holds inf"
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")
    assert nonfinite_tensor({"model": model}) == "model's 0.weight holds nan"  # the first in the network's order
    assert nonfinite_tensor({"head": head, "loss": model[0]}) == "loss's weight holds nan"  # a loss's own parameters


def test_a_buffer_infinite_by_design_is_not_taken_for_a_network_that_diverged():
    """A backbone may keep an attention mask of -inf as a buffer: only what was finite when the
    network was built must stay finite, so such a network trains and is evaluated as before."""
    from fslab.training.checkpoint import finite_names, nonfinite_entry
    from fslab.training.train import labelled_state, nonfinite_tensor

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    model.register_buffer("mask", torch.full((2, 2), float("-inf")).triu(1))
    watched = finite_names(labelled_state({"model": model}))
    assert "model's mask" not in watched and "model's 1.running_var" in watched
    assert nonfinite_tensor({"model": model}, watched) is None
    model[1].running_var[0] = float("inf")
    assert nonfinite_tensor({"model": model}, watched) == "model's 1.running_var holds inf"
    assert nonfinite_entry(model.state_dict(), finite_names(torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).state_dict())) == "1.running_var holds inf"


def test_compile_in_a_local_cluster_job_checks_this_machines_compiler(monkeypatch):
    """[slurm] cluster = "local" runs the job here: a compile it cannot do was submitted, and the job
    failed with torch's InvalidCxxCompiler, where a run here was refused before it existed."""
    from fslab.core.config import DEFAULTS
    from fslab.core.errors import UsageError
    from fslab.core.settings import SlurmSettings
    from fslab.execution.checks import check_compile

    monkeypatch.setenv("CXX", "/nonexistent/g++")
    config = {"device": "cpu", "train": {**DEFAULTS["train"], "compile": "default"}}
    with pytest.raises(UsageError, match="needs a C\\+\\+ compiler"):
        check_compile(config, SlurmSettings(cluster="local"))
    check_compile(config, SlurmSettings())  # a cluster's job compiles on its node, whose compiler is not seen here
