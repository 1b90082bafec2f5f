"""``fslab eval`` embeds in the precision the run recorded at its start, wherever it runs."""

import json
import os
import shutil

import pytest

from .conftest import BUILTIN_PLUGINS
from .runs_helpers import TINY, events, fslab, fslab_here

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained_bf16(tmp_path_factory):
    """A run trained here in bf16, once for the module (each test copies it: ~2 s a test before)."""
    project = tmp_path_factory.mktemp("bf16")
    env = {**os.environ, "FSLAB_PLUGINS": BUILTIN_PLUGINS}
    env.pop("FSLAB_CONFIG", None)
    trained = fslab("run", "nca", *TINY, "--epochs", "2", "--set", "train.precision=bf16", cwd=project, env=env)
    assert trained.returncode == 0, trained.stderr[-2000:]
    return next((project / "runs").glob("2*"))


@pytest.fixture
def gpu_bf16_run(project, trained_bf16):
    """A run as a CUDA GPU leaves it with ``train.precision=auto`` (bf16 there), copied to this CPU machine:
    trained here in bf16 (a copy of the module's run in this project's store), then its configuration and start
    event made what the GPU's would say."""
    run_dir = shutil.copytree(trained_bf16, project / "runs" / trained_bf16.name)
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


def _scores(run_dir, pattern):
    """The per-episode scores of the run's saved evaluations whose file names match ``pattern``, by shots."""
    return {json.loads(p.read_text())["shots"]: json.loads(p.read_text())["accuracies"]
            for p in (run_dir / "evaluations").glob(pattern)}


def test_a_bf16_run_scored_in_fp32_is_saved_beside_its_own_scores_which_every_reader_keeps(project, gpu_bf16_run):
    """fslab eval --precision fp32 of a bf16 run: the same episodes embedded in fp32, in features of their own,
    saved beside the run's scores (..._fp32.json), never in their place; fslab runs, compare and a later fslab
    eval of the run's own precision read its own, and fslab show names the precision of the others."""
    run_dir = gpu_bf16_run
    own = [fslab_here("eval", run_dir.name, "--device", "cpu", "--episodes", "40", "--json", cwd=project)]
    assert own[0].returncode == 0, own[0].stderr
    saved = {p.name: p.read_text() for p in (run_dir / "evaluations").iterdir()}
    for episodes in ("40", "60"):  # 60: an fp32 count the run's own scores lack, which a reader mixing them takes
        done = fslab_here("eval", run_dir.name, "--device", "cpu", "--precision", "fp32", "--episodes", episodes,
                          "--json", cwd=project)
        assert done.returncode == 0, done.stderr
        scored = [json.loads(line) for line in done.stdout.splitlines()]
        assert [(r["precision"], r["run_precision"]) for r in scored] == [("fp32", "bf16")] * 2
        # embedded anew in fp32 (not read from the bf16 features), then cached apart for the second count
        assert [r["features_cached"] for r in scored] == ([False, True] if episodes == "40" else [True, True])
    assert (run_dir / "features" / "test-epoch2.pt").is_file()
    assert (run_dir / "features" / "test-epoch2-bf16.pt").is_file()
    assert {p.name: p.read_text() for p in (run_dir / "evaluations").iterdir() if p.name in saved} == saved
    beside = {p.name: json.loads(p.read_text()) for p in (run_dir / "evaluations").glob("*_fp32.json")}
    assert sorted(beside) == [f"test-centroid-5way-{n}shot-5q-{e}ep-seed0-epoch2_fp32.json"
                              for n in (1, 5) for e in (40, 60)]
    assert all((r["precision"], r["run_precision"]) == ("fp32", "bf16") for r in beside.values())
    listed = json.loads(fslab_here("runs", "--json", cwd=project).stdout)
    trained = {e["shots"]: e for e in events(run_dir, "eval") if e["split"] == "test" and "source" not in e}
    assert {int(k[0]): v["accuracy"] for k, v in listed["test"].items()} == {n: e["accuracy"]
                                                                              for n, e in trained.items()}
    assert {k: v["episodes"] for k, v in listed["test_by_evaluator"]["centroid"].items()} == {"1-shot": 40,
                                                                                              "5-shot": 40}
    again = fslab_here("eval", run_dir.name, "--device", "cpu", "--episodes", "40", "--json", cwd=project)
    assert again.stdout == own[0].stdout.replace('"features_cached": false', '"features_cached": true')
    compared = json.loads(fslab_here("compare", run_dir.name, "--format", "json", cwd=project).stdout)
    assert [(c["accuracy"], c["episodes"]) for c in compared["groups"][0]["results"].values()] == [
        (trained[n]["accuracy"], 40) for n in (1, 5)]
    shown = fslab_here("show", run_dir.name, "--wide", cwd=project).stdout
    assert shown.count("centroid, network in fp32") == 4 and shown.count("centroid ") >= 6, shown
    refused = fslab_here("eval", run_dir.name, "--device", "cpu", "--evaluator", "finetune", "--shots", "5",
                         "--precision", "bf16", cwd=project)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "error: evaluator 'finetune' fine-tunes the network on every episode in fp32, whatever --precision says: "
        "--precision bf16 would score it as fp32 does; leave --precision out, or give fp32"]


def test_a_rescore_in_another_precision_is_what_training_in_it_scored_and_stays_out_of_the_sinks(project):
    """Two runs alike but for eval.precision: each scored by fslab eval in the other's precision gives the
    other's own per-episode scores (the training mean that centres them embedded in that precision too); a
    run sent to a sink is sent again without those scores, which would replace its own there."""
    from .test_eval_command import RECORDING_SINK

    (project / "mine").mkdir()
    (project / "mine" / "recorder.py").write_text(RECORDING_SINK)
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    runs = {}
    for precision in ("bf16", "fp32"):
        done = fslab("run", "nca", *TINY, "--epochs", "2", "--set", f"eval.precision={precision}", "--sink",
                     "recorder", cwd=project)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[precision] = next(p for p in (project / "runs").glob("2*") if p not in runs.values())
    for precision, other in (("bf16", "fp32"), ("fp32", "bf16")):
        run_dir = runs[precision]
        done = fslab_here("eval", run_dir.name, "--precision", other, "--episodes", "40", cwd=project)
        assert done.returncode == 0, done.stderr
        assert f", network in {other}, not the run's {precision}): " in done.stdout
        assert _scores(run_dir, f"*_{other}.json") == _scores(runs[other], "*epoch2.json")
        kept = [e for e in events(run_dir) if e.get("run_precision") is None]
        assert len(kept) == len(events(run_dir)) - 2
        assert done.stderr == f"{run_dir.name}: sent again to recorder with the new scores ({len(kept)} events)\n"
        recorded = [json.loads(line) for line in (run_dir / "recorded.jsonl").read_text().splitlines()]
        assert recorded == kept


def test_a_precision_fslab_does_not_know_is_refused_in_one_line_before_torch_loads(project):
    import subprocess
    import sys

    from fslab.core.config import CONFIG_VERSION, DEFAULTS
    from fslab.core.runstore import create_run

    run = create_run(project / "runs", "nca", {**DEFAULTS, "method": "nca", "config_version": CONFIG_VERSION})
    code = ("import sys\nfrom fslab.cli import main\nsys.argv = ['fslab', 'eval', sys.argv[1], '--precision', "
            "'fp64']\ntry:\n    main()\nfinally:\n    sys.stderr.write('TORCH' if 'torch' in sys.modules else "
            "'NO TORCH')\n")
    done = subprocess.run([sys.executable, "-c", code, run.id], cwd=project, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("error: --precision must be one of auto, fp32, bf16, fp16, got \"fp64\". "
                           "Did you mean 'fp16'?\nNO TORCH")


def test_a_score_is_of_another_precision_only_where_it_names_the_runs_own_as_another():
    """The one rule every reader leaves such scores out by, and the words lines name them with."""
    from fslab.core.events import eval_line, other_precision

    event = {"split": "val", "ways": 5, "shots": 5, "episodes": 40, "accuracy": 0.5, "ci95": 0.01}
    rescored = {**event, "precision": "fp32", "run_precision": "bf16"}
    assert [other_precision(e) for e in (event, {**event, "precision": "bf16"}, rescored,
                                         {**rescored, "run_precision": "fp32"})] == [False, False, True, False]
    assert eval_line(rescored) == "val 5-way 5-shot, 40 episodes, network in fp32: 50.00 ± 1.00%"
    assert eval_line({**event, "precision": "bf16"}) == "val 5-way 5-shot, 40 episodes: 50.00 ± 1.00%"
