"""benchmarks/bench_studies.py: a study's cost from its configurations' measured parts."""

from __future__ import annotations

import json

import pytest

from .bench_helpers import load_benchmark


def load_bench():
    return load_benchmark("bench_studies")


def test_a_run_costs_its_epochs_steps_checkpoints_validations_test_and_compile():
    bench = load_bench()
    parts = {"step_s": 0.1, "first_step_s": 2.1, "steps_per_epoch": 75, "checkpoint_s": 0.2,
             "checkpoint_write_s": 3.0, "validation_s": 0.6, "test_s": 1.5, "val_every": 3}
    # 10 epochs of 75 steps and a checkpoint's copy (its 3 s write hides behind the 7.5 s of steps);
    # validations after epochs 3, 6, 9 and the last; the test; the first step's compile time beyond a step
    assert bench.run_seconds(parts, 10) == pytest.approx(10 * (75 * 0.1 + 0.2) + 4 * 0.6 + 1.5 + 2.0)
    assert bench.run_seconds({**parts, "val_every": 1}, 10) == pytest.approx(77 + 10 * 0.6 + 1.5 + 2.0)
    # a write of 9 s outlasts the steps by 1.5 s, which every epoch waits for
    assert bench.run_seconds({**parts, "checkpoint_write_s": 9.0}, 10) == pytest.approx(92 + 4 * 0.6 + 1.5 + 2.0)


def test_the_seeds_of_a_study_share_one_timed_configuration(tmp_path, capsys, registry):
    bench = load_bench()
    out = tmp_path / "studies.jsonl"
    bench.main(["nca-supcon", "--device", "cpu", "--image-size", "16", "--batch-size", "16", "--steps", "1",
                "--warmup", "0", "--train-images", "256", "--eval-images", "64", "--set", "eval.test_episodes=20",
                "--set", "eval.val_episodes=10", "--set", "backbone.widths=[8,16,32,64]", "--json", str(out)])
    printed = capsys.readouterr().out
    assert printed.count("nca-supcon supcon on miniimagenet") == 1  # 5 seeds, one configuration timed
    (line,) = [json.loads(text) for text in out.read_text().splitlines()]
    assert line["study"] == "nca-supcon" and line["runs"] == 5 and line["not_timed"] == []
    # the standard split's 38,400 training images, 16 a step here (--batch-size): 2,400 steps an epoch,
    # 120 epochs a run, 5 runs, and more besides (validations, checkpoints, tests)
    (parts,) = line["configurations"]
    assert (parts["rows"], parts["steps_per_epoch"], parts["val_every"]) == (16, 2400, 1)
    assert line["gpu_hours"] * 3600 == pytest.approx(5 * bench.run_seconds(parts, 120))
    assert line["gpu_hours"] * 3600 > 5 * 120 * 2400 * parts["step_s"]


STUDY_PLUGIN = """
from pathlib import Path

from fslab.plugin import hookimpl, register_study_files


@hookimpl
def register_studies(register):
    register_study_files(register, Path(__file__).parent / "files")
"""


def test_a_run_that_serves_two_places_of_a_study_is_priced_once(tmp_path, capsys, monkeypatch, registry):
    """A study whose two sweeps train alike (a baseline in two tables) trains it once (fslab study run,
    study show: study_plan.distinct_runs), where the benchmark priced each place: twice its cost. Its
    studies are those of plugin_dirs too, as fslab study run finds them."""
    from pathlib import Path

    bench = load_bench()
    source = (Path(__file__).parents[1] / "plugins" / "studies" / "nca-supcon.toml").read_text()
    source = source.replace('name = "nca-supcon"', 'name = "twice"').replace("seeds = 5", "seeds = 2")
    again = source[source.index("[[sweep]]"):source.index("[quick]")].replace('name = "supcon"', 'name = "again"')
    (tmp_path / "mine" / "files").mkdir(parents=True)
    (tmp_path / "mine" / "study.py").write_text(STUDY_PLUGIN)
    (tmp_path / "mine" / "files" / "twice.toml").write_text(source.replace("[quick]", again + "[quick]"))
    (tmp_path / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "studies.jsonl"
    bench.main(["twice", "--device", "cpu", "--image-size", "16", "--batch-size", "16", "--steps", "1",
                "--warmup", "0", "--train-images", "64", "--eval-images", "32", "--set", "eval.test_episodes=5",
                "--set", "eval.val_episodes=5", "--set", "backbone.widths=[8,16,32,64]", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "twice: 2 runs for 4 places (places alike in every setting share one), " in printed
    (line,) = [json.loads(text) for text in out.read_text().splitlines()]
    assert (line["runs"], line["places"]) == (2, 4)
    (parts,) = line["configurations"]
    assert line["gpu_hours"] * 3600 == pytest.approx(2 * bench.run_seconds(parts, 120))


def test_a_shrunk_batch_keeps_two_classes_of_every_sampler_s_per_class(registry):
    """--batch-size 16 on the CPU: Fig. 2's ProtoNet with 16 or 32 images a class still gets
    episodes of two classes (16 images left it one class, and the sampler refused it)."""
    from fslab.core.config import run_config
    from fslab.core.settings import Settings
    from fslab.core.studies import find_study
    from fslab.core.study_plan import resolve_study

    bench = load_bench()
    resolved = resolve_study(find_study(registry, "nca-fig2"), "paper", settings=Settings(), registry=registry)
    per_class = {}
    for _, config in resolved:
        cfg = run_config(config)
        batch = bench.timed_batch(cfg, 16)
        labels = [index // 32 for index in range(64 * 32)]
        sampler = registry.create("sampler", cfg.sampler["name"], labels=labels, batch_size=batch, seed=0,
                                  **bench.plugin_kwargs(cfg.sampler))
        assert len(next(iter(sampler.batches(0))).indices) == batch
        per_class[cfg.sampler.get("per_class")] = batch
        assert bench.timed_batch(cfg, 0) == cfg.train.batch_size
    assert per_class == {None: 16, 8: 16, 16: 32, 32: 64}


def test_the_cost_block_printed_for_a_gpu_is_what_a_study_file_records():
    from fslab.core.settings import tomllib  # tomli before Python 3.11
    from fslab.core.studies import parse_study

    from .test_studies import tiny

    bench = load_bench()
    block = bench.cost_block("NVIDIA H200", 2.06, "2026-11-26")
    study = parse_study(tiny(**tomllib.loads(block)), "tiny.toml")
    (cost,) = study.costs
    assert (cost.device, cost.gpu_hours, cost.date) == ("NVIDIA H200", 2.1, "2026-11-26")
    assert cost.how.startswith("python benchmarks/bench_studies.py, PyTorch 2.")
