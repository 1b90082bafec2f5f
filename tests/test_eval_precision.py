"""``fslab eval`` embeds in the precision the run recorded at its start, wherever it runs."""

import json
import os

import pytest

from .conftest import BUILTIN_PLUGINS
from .runs_helpers import TINY, events, fslab, fslab_here

pytestmark = pytest.mark.slow


@pytest.fixture
def gpu_bf16_run(project):
    """A run as a CUDA GPU leaves it with ``train.precision=auto`` (bf16 there), copied to this CPU machine:
    trained here in bf16, then its configuration and start event made what the GPU's would say."""
    env = {**os.environ, "FSLAB_PLUGINS": BUILTIN_PLUGINS}
    env.pop("FSLAB_CONFIG", None)
    trained = fslab("run", "nca", *TINY, "--epochs", "2", "--set", "train.precision=bf16", cwd=project, env=env)
    assert trained.returncode == 0, trained.stderr[-2000:]
    run_dir = next((project / "runs").glob("2*"))
    config = json.loads((run_dir / "config.json").read_text())
    config["train"]["precision"], config["device"] = "auto", "cuda"
    (run_dir / "config.json").write_text(json.dumps(config))
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for event in lines:
        if event["event"] == "start":
            assert (event["precision"], event["eval_precision"]) == ("bf16", "bf16")
            event["device"] = "cuda:0"
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    return run_dir


def test_eval_on_the_cpu_embeds_in_the_precision_the_run_trained_in(project, gpu_bf16_run):
    """auto resolved again on the CPU was fp32: fslab eval --device cpu scored the training's own episodes in
    another precision and saved them in place of the training's test scores, which compare then read while
    fslab runs showed the training's."""
    run_dir = gpu_bf16_run
    saved = {p.name: p.read_text() for p in (run_dir / "evaluations").iterdir()}
    own = {e["shots"]: (round(e["accuracy"], 9), round(e["ci95"], 9))
           for e in events(run_dir, "eval") if e["split"] == "test"}
    result = fslab_here("eval", run_dir.name, "--device", "cpu", "--episodes", "40", "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    scored = [json.loads(line) for line in result.stdout.splitlines()]
    assert {r["shots"]: (round(r["accuracy"], 9), round(r["ci95"], 9)) for r in scored} == own
    assert [r["precision"] for r in scored] == ["bf16", "bf16"]
    assert (run_dir / "features" / "test-epoch2-bf16.pt").is_file()
    assert not (run_dir / "features" / "test-epoch2.pt").exists()
    for name, text in saved.items():  # the same episodes, scored alike: the training's scores as they were
        before, after = json.loads(text), json.loads((run_dir / "evaluations" / name).read_text())
        assert after["accuracies"] == before["accuracies"] and after["precision"] == "bf16"
    line = fslab_here("eval", run_dir.name, "--device", "cpu", "--episodes", "40", "--shots", "5", cwd=project)
    assert "(centroid, checkpoint of epoch 2, network in bf16)" in line.stdout, line.stdout


def test_a_run_that_recorded_no_precision_is_scored_as_its_configuration_resolves(project, gpu_bf16_run):
    """A start event written before precisions were recorded: eval.precision resolved for the device it runs on."""
    run_dir = gpu_bf16_run
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for event in lines:
        if event["event"] == "start":
            del event["precision"], event["eval_precision"]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    result = fslab_here("eval", run_dir.name, "--device", "cpu", "--episodes", "40", "--shots", "1", "--json",
                        cwd=project)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["precision"] == "fp32"
    assert (run_dir / "features" / "test-epoch2.pt").is_file()
