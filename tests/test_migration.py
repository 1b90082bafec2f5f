"""Configurations saved by older fslabs: migrated to the current version, on read."""

import copy
import json
import shutil
from pathlib import Path

import pytest

from fslab.core.config import merge, resolve, run_config
from fslab.core.errors import ConfigError
from fslab.core.migrations import ADDED_IN_VERSION_2, CONFIG_VERSION, migrate
from fslab.core.runstore import Run, create_run
from fslab.core.settings import Settings

from .runs_helpers import assert_same_test, fslab

FIXTURE_RUNS = Path(__file__).parent / "fixtures" / "runs-0.1"
FIXTURE_CONFIGS = sorted(FIXTURE_RUNS.glob("*/config.json"))
# Keys added while fslab 0.1 was developed; configurations saved before each one lack it.
ADDED_DURING_0_1 = [("train", "optimizer"), ("train", "projection_dim"), ("train", "processes"),
                    ("eval", "before_training"), ("eval", "feature_stages")]


def saved_config(path: Path) -> dict:
    return json.loads(path.read_text())


def without(config: dict, keys) -> dict:
    config = copy.deepcopy(config)
    for section, key in keys:
        del config[section][key]
    return config


def resolved_for(registry, saved: dict) -> dict:
    """What resolve() gives for the settings a saved configuration names."""
    settings = {k: v for k, v in saved.items() if k != "method"}
    # The runs computed in fp32 without compilation: the values migration gives the keys of version 2.
    resolved = resolve(saved["method"], registry=registry, settings=Settings(),
                       overrides=[merge(ADDED_IN_VERSION_2, settings)])
    # A plugin parameter added since (synthetic's channels) is not written into a saved configuration:
    # the plugin gets its default when the run is built (fslab.core.plugin_params.check_plugins, the trainer).
    for section in ("dataset", "backbone", "loss", "sampler", "evaluator"):
        if section in saved:
            resolved[section] = {k: v for k, v in resolved[section].items() if k in saved[section]}
    # a new run of synthetic, which reads no files, has no root; migration keeps the one an earlier fslab filled in
    if not registry.reads_files(saved["dataset"]["name"]) and "root" in saved["dataset"]:
        resolved["dataset"]["root"] = saved["dataset"]["root"]
    return resolved


def test_fixture_configs_are_version_0():
    assert len(FIXTURE_CONFIGS) == 4
    assert all("config_version" not in saved_config(p) for p in FIXTURE_CONFIGS)


@pytest.mark.parametrize("path", FIXTURE_CONFIGS, ids=lambda p: p.parent.name[-4:])
def test_a_version_0_config_migrates_to_what_resolve_gives(registry, path):
    saved = saved_config(path)
    expected = resolved_for(registry, saved)
    assert migrate(saved) == expected
    assert saved == saved_config(path)  # the argument is left alone
    # An older 0.1 configuration, written before these keys existed, trained as the fixture did.
    assert migrate(without(saved, ADDED_DURING_0_1)) == expected
    assert run_config(without(saved, ADDED_DURING_0_1)).as_dict() == expected


def test_missing_keys_get_what_older_code_did_not_todays_default(registry, monkeypatch):
    """The filled values are fixed by the past: a changed default must not move them."""
    import fslab.core.config as config_module

    monkeypatch.setitem(config_module.DEFAULTS["train"], "optimizer", "adam")
    monkeypatch.setitem(config_module.DEFAULTS["eval"], "feature_stages", 3)
    old = without(saved_config(FIXTURE_CONFIGS[0]), ADDED_DURING_0_1 + [("train", "heartbeat")])
    del old["evaluator"]
    migrated = migrate(old)
    assert (migrated["train"]["optimizer"], migrated["train"]["processes"], migrated["train"]["projection_dim"],
            migrated["train"]["heartbeat"]) == ("sgd", 1, 0, 5.0)
    assert (migrated["eval"]["feature_stages"], migrated["eval"]["before_training"]) == (1, False)
    assert migrated["evaluator"] == {"name": "centroid"}


def test_migration_keeps_what_was_saved_and_is_idempotent():
    saved = without(saved_config(FIXTURE_CONFIGS[0]), ADDED_DURING_0_1)
    saved["train"]["optimizer"] = "adam"  # saved values are never replaced
    saved["evaluator"] = {"name": "knn", "k": 3}
    migrated = migrate(saved)
    assert migrated["train"]["optimizer"] == "adam" and migrated["evaluator"] == {"name": "knn", "k": 3}
    assert migrated["config_version"] == CONFIG_VERSION
    assert migrate(migrated) is migrated  # current: returned as it is


def test_a_config_from_a_newer_fslab_is_one_clear_error(tmp_path):
    newer = {**saved_config(FIXTURE_CONFIGS[0]), "config_version": CONFIG_VERSION + 1}
    newest = CONFIG_VERSION + 1
    with pytest.raises(ConfigError, match=rf"^configuration version {newest} was written by a newer fslab .*; "
                                          r"upgrade fslab$"):
        migrate(newer)
    run = create_run(tmp_path / "runs", "nca", newer)
    with pytest.raises(ConfigError, match=rf"^run {run.id}: configuration version {newest} .*upgrade fslab$"):
        run.config()
    with pytest.raises(ConfigError, match=r"config_version must be a whole number"):
        migrate({"config_version": "1"})


def test_run_config_returns_current_version_configs(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(FIXTURE_RUNS, runs)
    for folder in sorted(runs.iterdir()):
        run = Run(folder)
        assert run.config() == migrate(saved_config(folder / "config.json"))
        assert run.config()["config_version"] == CONFIG_VERSION
    assert Run(tmp_path / "nothing-here").config() == {}


@pytest.mark.slow
def test_a_stopped_0_1_run_resumes_to_its_uninterrupted_twin(project):
    """018e was stopped after epoch 2 by fslab 0.1 and 53db is the same run
    left to finish; the resumed run must end on 53db's numbers, also when its
    configuration predates the keys added during 0.1."""
    shutil.copytree(FIXTURE_RUNS, project / "runs")
    stopped = next((project / "runs").glob("*-018e"))
    config = saved_config(stopped / "config.json")
    (stopped / "config.json").write_text(json.dumps(without(config, ADDED_DURING_0_1)))
    result = fslab("resume", "018e", cwd=project)
    assert result.returncode == 0, result.stderr
    assert_same_test(stopped, next((project / "runs").glob("*-53db")))


def test_a_version_1_config_computed_in_fp32_without_compilation(registry):
    """Version 2 added how the step computes; a version-1 run resumes as it trained (no autocast,
    no channels-last, no compile, no TF32 matrix products, no deterministic algorithms)."""
    current = resolve("nca", registry=registry, settings=Settings())
    assert (current["train"]["precision"], current["train"]["channels_last"], current["eval"]["precision"]) == \
        ("auto", "auto", "auto")
    version_1 = copy.deepcopy(current)
    version_1["config_version"] = 1
    for key in ("precision", "channels_last", "compile", "tf32", "deterministic"):
        del version_1["train"][key]
    del version_1["eval"]["precision"]
    del version_1["sinks"]
    migrated = migrate(version_1)
    assert migrated["config_version"] == CONFIG_VERSION == 5
    assert {k: migrated["train"][k] for k in ("precision", "channels_last", "compile", "tf32", "deterministic")} == \
        {"precision": "fp32", "channels_last": "off", "compile": "off", "tf32": False, "deterministic": False}
    assert migrated["eval"]["precision"] == "fp32"
    typed = run_config(version_1)
    assert (typed.train.precision, typed.train.tf32, typed.eval.precision) == ("fp32", False, "fp32")


def test_a_version_2_config_had_no_sinks(registry):
    """Version 3 added the sinks: a run saved before sent its events nowhere else."""
    version_2 = resolve("nca", registry=registry, settings=Settings())
    version_2["config_version"] = 2
    del version_2["sinks"]
    migrated = migrate(version_2)
    assert migrated["config_version"] == CONFIG_VERSION and migrated["sinks"] == {}
    assert run_config(version_2).sinks == {}


def test_a_version_3_config_validated_after_every_epoch(registry):
    """Version 4 added eval.val_every: a run saved before validated after every epoch, and is read so
    even where today's default would say otherwise."""
    version_3 = resolve("nca", registry=registry, settings=Settings(), overrides=[{"eval": {"val_every": 7}}])
    assert version_3["eval"]["val_every"] == 7
    version_3["config_version"] = 3
    del version_3["eval"]["val_every"]
    migrated = migrate(version_3)
    assert migrated["config_version"] == CONFIG_VERSION == 5 and migrated["eval"]["val_every"] == 1
    assert run_config(version_3).eval.val_every == 1


def test_a_version_4_config_tested_the_final_network_on_the_test_split_only(registry):
    """Version 5 added eval.final_val and eval.extra_ways: a run saved before scored its final network on
    the test split only, at eval.ways only."""
    version_4 = resolve("nca", registry=registry, settings=Settings(),
                        overrides=[{"eval": {"final_val": True, "extra_ways": [20]}}])
    assert version_4["eval"]["final_val"] is True and version_4["eval"]["extra_ways"] == [20]
    version_4["config_version"] = 4
    del version_4["eval"]["final_val"], version_4["eval"]["extra_ways"]
    migrated = migrate(version_4)
    assert migrated["config_version"] == CONFIG_VERSION == 5
    assert migrated["eval"]["final_val"] is False and migrated["eval"]["extra_ways"] == []
    assert run_config(version_4).eval.final_val is False and run_config(version_4).eval.extra_ways == ()
