"""Shell completion of plugin names and run ids, as bash asks for it: the
real ``fslab`` entry point with ``_FSLAB_COMPLETE=complete_bash``, and never
importing torch (the shell runs fslab on every TAB)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .test_tui_helpers import complete_config, write_run

IDS = ["20261123-153000-nca-4f2a", "20261124-090000-protonet-9c01"]


def complete(words: str, project) -> list[str]:
    """What bash would be offered for ``words`` (the last one is being typed)."""
    code = ("import sys\nfrom fslab.cli import main\nsys.argv = ['fslab']\ntry:\n    main()\nfinally:\n"
            "    sys.stderr.write('TORCH' if 'torch' in sys.modules else 'NO TORCH')\n")
    env = {**os.environ, "_FSLAB_COMPLETE": "complete_bash", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
    done = subprocess.run([sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stderr.endswith("NO TORCH"), done.stderr
    return done.stdout.split()


@pytest.fixture
def store(project):
    for run_id in IDS:
        write_run(project / "runs", run_id, cfg=complete_config())
    return project


@pytest.mark.parametrize("words, expected", [
    ("fslab run --backbone res", ["resnet12", "resnet12-nca"]),
    ("fslab run --dataset mini", ["miniimagenet"]),
    ("fslab run protonet-s", ["protonet-snell", "protonet-snell-1shot"]),
    ("fslab sweep map", ["map-dlm", "map-ssvm"]),
    ("fslab eval last --evaluator k", ["knn"]),
    ("fslab compare all --evaluator ce", ["centroid"]),
    ("fslab runs --method nca-", ["nca-half-pairs", "nca-replacement"]),
    ("fslab plugins --kind s", ["sampler", "study", "sink"]),
])
def test_plugin_names_complete(project, words, expected):
    assert complete(words, project) == expected


@pytest.mark.parametrize("words, expected", [
    ("fslab run nca --set train.l", ["train.log_every=", "train.lr="]),
    ("fslab run nca --set loss.temp", ["loss.temperature="]),  # every loss's parameters
    ("fslab run --set sinks.t", ["sinks.tensorboard.log_dir="]),
    ("fslab run --set s", ["sampler.drop_last=", "sampler.name=", "sampler.per_class=", "sampler.queries=",
                           "sampler.shots=", "sampler.ways=", "seed=", "sinks=", "sinks.mlflow.experiment=",
                           "sinks.mlflow.tracking_uri=", "sinks.tensorboard.log_dir=", "sinks.wandb.dir=",
                           "sinks.wandb.mode=", "sinks.wandb.project="]),
    ("fslab sweep nca --grid batch", ["batch_size="]),  # --grid's aliases
    ("fslab sweep nca --grid se", []),  # a sweep numbers its seeds itself
    ("fslab sweep nca --grid me", []),  # and runs one method (method= was offered, then refused)
    ("fslab study run nca-table3 --set eval.sh", ["eval.shots="]),
    ("fslab run --set sampler.name=f", ["sampler.name=fixed"]),  # as zsh and fish pass the word
    ("fslab run --set train.lr=0", []),
])
def test_config_keys_complete_after_set_and_grid(project, words, expected):
    assert complete(words, project) == expected


def test_run_ids_complete_newest_first(store):
    assert complete("fslab show ", store) == ["last", *IDS[::-1]]
    assert complete("fslab eval 20261123", store) == [IDS[0]]
    assert complete("fslab run --like 2026112", store) == IDS[::-1]
    assert complete("fslab compare a", store) == ["all"]
    assert complete("fslab logs nothing", store) == []


SWEEP = "sweep-20261124-090000-9c01"


@pytest.fixture
def swept(store):
    (store / "runs" / "sweeps").mkdir()
    (store / "runs" / "sweeps" / f"{SWEEP}.json").write_text(json.dumps({"id": SWEEP, "runs": IDS[1:]}))
    return store


def test_sweep_resume_completes_sweep_ids(swept):
    """After ``fslab sweep resume`` comes a sweep id, not a method; the first word may be ``resume``."""
    assert complete("fslab sweep resume ", swept) == ["last", SWEEP]  # last: the newest sweep
    assert complete("fslab sweep r", swept) == ["ring", "resume"]
    assert complete(f"fslab sweep resume {SWEEP} ", swept) == []
    assert complete("fslab sweep nca ", swept) == []


def test_stop_completes_what_it_takes(swept):
    """fslab stop takes a run, a sweep or ``last``, never ``all`` (compare's); the store's runs are completed,
    so ``last`` names none it takes."""
    assert complete("fslab stop ", swept) == [SWEEP]
    assert complete("fslab stop a", swept) == []
    assert complete("fslab compare a", swept) == ["all"]


def test_resume_and_stop_complete_the_runs_they_take(swept):
    """fslab resume offered every run, though it takes only killed, lost and failed ones, and fslab stop
    every run, though it takes only queued and running ones (a store of hundreds of completed runs
    buried the few a TAB is pressed for)."""
    import time

    runs = swept / "runs"
    states = {"20261125-100000-nca-aaaa": {"state": "killed"}, "20261125-110000-nca-bbbb": {"state": "failed"},
              "20261125-120000-nca-cccc": {"state": "running", "host": "elsewhere", "heartbeat": 1.0},  # lost
              "20261125-130000-nca-dddd": {"state": "running", "host": "elsewhere", "heartbeat": time.time() + 600},
              "20261125-140000-nca-eeee": {"state": "queued"}}
    for run_id, status in states.items():
        write_run(runs, run_id, cfg=complete_config())
        (runs / run_id / "status.json").write_text(json.dumps({"created": 1.0, **status}))
    gone = time.time() - 1000  # cccc's status unwritten for 1000 s: its worker on the other host is gone
    os.utime(runs / "20261125-120000-nca-cccc" / "status.json", (gone, gone))
    (runs / "20261125-150000-nca-ffff").mkdir()  # status.json not written yet: nothing to act on
    # last is eeee (ffff has no status.json yet: no run to find_run), queued: fslab stop takes it, resume not
    assert complete("fslab resume ", swept) == ["20261125-120000-nca-cccc", "20261125-110000-nca-bbbb",
                                                "20261125-100000-nca-aaaa"]
    assert complete("fslab resume 20261125-11", swept) == ["20261125-110000-nca-bbbb"]
    assert complete("fslab stop ", swept) == ["last", SWEEP, "20261125-140000-nca-eeee", "20261125-130000-nca-dddd"]
    assert complete("fslab stop 20261124", swept) == []  # both completed


@pytest.mark.parametrize("words", ["fslab run --executor ", "fslab resume last --executor ",
                                   "fslab sweep nca --executor ", "fslab study run x --executor "])
def test_executor_completes(project, words):
    assert complete(words, project) == ["local", "slurm"]


@pytest.mark.parametrize("words, expected", [
    ("fslab eval last --split ", ["test", "val"]),
    ("fslab plot pairs all --split v", ["val"]),
    ("fslab compare all --format ", ["table", "md", "latex", "csv", "json"]),
    ("fslab study report nca-fig2 --format l", ["latex"]),
    ("fslab study run nca-fig2 --scale ", ["paper", "quick"]),
    ("fslab plot ", ["batch-size", "pairs"]),
    ("fslab runs --state k", ["killed"]),
    ("fslab runs --state queued,failed,", ["queued,failed,running", "queued,failed,completed",
                                         "queued,failed,killed", "queued,failed,lost", "queued,failed,unreadable"]),
    ("fslab new plugin mine --kind s", ["sampler", "study", "sink"]),
    ("fslab study show nca-fig", ["nca-fig2", "nca-fig3", "nca-fig4"]),
])
def test_option_values_complete(project, words, expected):
    """Options of a fixed set of values complete them; a study name completes from the registry."""
    assert complete(words, project) == expected


def test_sweep_ids_and_study_files_complete(swept):
    (swept / "studies").mkdir()
    (swept / "studies" / "mine.toml").write_text("")
    (swept / "studies" / "notes.txt").write_text("")
    assert complete("fslab runs --sweep ", swept) == ["last", SWEEP]
    assert complete("fslab study show studies/", swept) == ["studies/mine.toml"]


@pytest.mark.parametrize("words, expected", [
    ("fslab run nca --device ", ["auto", "cpu", "cuda"]),
    ("fslab sweep nca --device c", ["cpu", "cuda"]),
    ("fslab eval last --device a", ["auto"]),
    ("fslab study run nca-fig2 --dataset mini", ["miniimagenet"]),
])
def test_device_and_study_dataset_complete(project, words, expected):
    assert complete(words, project) == expected


def test_a_sweep_record_without_an_id_completes_nothing(swept):
    """A hand-edited record without a string id is passed over, never offered as 'None' or '5'."""
    folder = swept / "runs" / "sweeps"
    (folder / "sweep-20261125-090000-aaaa.json").write_text(json.dumps({"runs": IDS[:1]}))
    (folder / "sweep-20261125-090000-bbbb.json").write_text(json.dumps({"id": 5, "runs": IDS[:1]}))
    assert complete("fslab sweep resume ", swept) == ["last", SWEEP]


def test_a_plugin_that_prints_as_it_loads_adds_nothing_to_completion(project):
    """The first TAB after a plugin changed loads the plugins: what one prints or warns
    as it is imported is neither offered as a name nor written over the command line."""
    (project / "mine").mkdir()
    (project / "mine" / "noisy.py").write_text(
        "import sys, warnings\nprint('hello from a plugin')\nwarnings.warn('old API')\nsys.stderr.write('noise\\n')\n")
    (project / "fslab.toml").write_text('[project]\nplugin_dirs = ["mine"]\n')
    code = ("import sys\nfrom fslab.cli import main\nsys.argv = ['fslab']\ntry:\n    main()\nfinally:\n"
            "    sys.stderr.write('END')\n")
    env = {**os.environ, "_FSLAB_COMPLETE": "complete_bash", "COMP_WORDS": "fslab run --backbone c",
           "COMP_CWORD": "3"}
    done = subprocess.run([sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout.split("\n"), done.stderr) == (0, ["conv4", ""], "END")


def test_a_broken_fslab_toml_still_completes_the_installed_plugins(project):
    """A project's fslab.toml half-edited: the plugins it names cannot be known, the installed ones still are."""
    (project / "fslab.toml").write_text("[project\nplugin_dirs = ['mine']\n")
    assert complete("fslab run nca-", project) == ["nca-half-pairs", "nca-replacement"]
    assert complete("fslab run --backbone res", project) == ["resnet12", "resnet12-nca"]
    assert "train.lr=" in complete("fslab run nca --set train.l", project)  # keys too (it offered none)


def test_last_is_offered_only_where_the_run_it_names_is_one_the_command_takes(project):
    """fslab resume and fslab stop offered ``last`` whatever the newest run was: a TAB completed
    ``fslab stop last`` over a completed run, which the command then refused. ``last`` is offered where
    the run the command would find by it (fslab.core.runstore.find_run) is in a state the command takes."""
    import time

    from fslab.cli.common import live_run_or_sweep, runs_in
    from fslab.core.runstore import find_run
    from fslab.core.states import RESUMABLE

    runs, resumable = project / "runs", runs_in(*RESUMABLE)
    assert resumable("") == [] and live_run_or_sweep("") == []  # no runs yet: last names none

    def add(run_id, **status):
        write_run(runs, run_id, cfg=complete_config())
        (runs / run_id / "status.json").write_text(json.dumps({"created": 1.0, **status}))
        assert find_run(runs, "last").id == run_id

    add("20261125-100000-nca-aaaa", state="killed")
    assert resumable("") == ["last", "20261125-100000-nca-aaaa"] and resumable("la") == ["last"]
    assert live_run_or_sweep("") == [] and live_run_or_sweep("la") == []
    add("20261125-110000-nca-bbbb", state="running", host="elsewhere", heartbeat=time.time() + 600)
    assert resumable("") == ["20261125-100000-nca-aaaa"] and resumable("la") == []  # resume last: refused
    assert live_run_or_sweep("") == ["last", "20261125-110000-nca-bbbb"]
    add("20261125-120000-nca-cccc", state="completed")
    assert resumable("") == ["20261125-100000-nca-aaaa"] and live_run_or_sweep("") == ["20261125-110000-nca-bbbb"]
