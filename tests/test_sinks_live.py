"""Sinks fed by a live run (fslab.core.sinks): every event, in order, after it is
in metrics.jsonl; a sink that raises, sleeps or cannot be imported never fails,
slows or blocks the run, and is reported once; the configuration's sinks
section (--sink, [run] sinks, --set sinks.NAME.KEY) is checked like any other."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from fslab.core import sinks as feeding
from fslab.core.config import resolve
from fslab.core.runstore import Run
from fslab.core.settings import Settings
from fslab.core.types import SinkRun
from fslab.reports.compare import flatten, run_settings

from .runs_helpers import TINY, events, fslab

# Sinks of a local plugin folder: one that records, and the three kinds of trouble.
SINKS_PLUGIN = '''
import json
import time

from fslab.plugin import hookimpl


class Record:
    def __init__(self, run, *, path: str = "record.jsonl"):
        self.file = open(path, "w")
        self.run = run

    def write(self, event):
        self.file.write(json.dumps(event) + "\\n")
        self.file.flush()

    def close(self):
        self.file.write(json.dumps({"closed": self.run.state}) + "\\n")
        self.file.close()


class Imports:
    """Says whether the worker had imported its training (torch) before building the sinks."""

    def __init__(self, run, *, path: str = "imports.json"):
        import sys

        training = sys.modules.get("fslab.training.train")
        with open(path, "w") as file:
            json.dump({"training_imported": hasattr(training, "train")}, file)

    def write(self, event):
        pass

    def close(self):
        pass


class Raises:
    def __init__(self, run):
        pass

    def write(self, event):
        if event["event"] == "train":
            raise RuntimeError("the tracker's server said no")

    def close(self):
        pass


class Sleeps:
    def __init__(self, run, *, seconds: float = 3600.0):
        self.seconds = seconds

    def write(self, event):
        time.sleep(self.seconds)

    def close(self):
        time.sleep(self.seconds)


@hookimpl
def register_sinks(register):
    register(Record, name="record", description="every event as a JSON line")
    register(Imports, name="imports", description="tells what was imported when it was built")
    register(Raises, name="raises", description="fails on the first train event")
    register(Sleeps, name="sleeps", description="never returns in time")
    register("fslab_local_plugins.not_installed:Sink", name="unimportable", description="its package is missing",
             params={})
'''


class Collect:
    def __init__(self, run, *, into: list, fail_on: str = "", delay: float = 0.0):
        self.run, self.into, self.fail_on, self.delay = run, into, fail_on, delay

    def write(self, event):
        time.sleep(self.delay)
        if event["event"] == self.fail_on:
            raise ValueError("boom\nsecond line")
        self.into.append(event)

    def close(self):
        self.into.append({"closed": self.run.state})


class FakeRegistry:
    """Builds the sinks of these unit tests; the real registry is exercised by the end-to-end tests."""

    def get(self, kind, name):  # what a line blaming a sink names: it and its plugin
        return SimpleNamespace(named=f"sink '{name}' from plugin 'fake'")

    def create(self, kind, name, context=None, **params):
        assert kind == "sink"
        if name == "missing":
            raise ImportError("No module named 'tracker'")
        return Collect(context["run"], **params)


def feed_of(sinks: dict, wait: float | None = None) -> tuple[feeding.SinkFeed, list[str]]:
    said: list[str] = []
    run = SinkRun("r1", "/nowhere", {"sinks": sinks})
    return feeding.SinkFeed(FakeRegistry(), run, say=said.append, wait=wait), said


EVENTS = [{"event": "start"}, *({"event": "train", "step": i} for i in range(1, 6)), {"event": "end"}]


def test_every_event_reaches_every_sink_in_order_then_the_final_state():
    first, second = [], []
    feed, said = feed_of({"a": {"into": first}, "b": {"into": second}})
    for event in EVENTS:
        feed(event)
    feed.close("completed")
    assert first == second == [*EVENTS, {"closed": "completed"}]
    assert said == []


def test_a_sink_that_raises_is_reported_once_and_fed_no_more_while_the_others_go_on():
    good, bad = [], []
    feed, said = feed_of({"good": {"into": good}, "bad": {"into": bad, "fail_on": "train"}})
    for event in EVENTS:
        feed(event)
    feed.close("completed")
    assert good == [*EVENTS, {"closed": "completed"}] and bad == [{"event": "start"}]
    assert said == ["sink 'bad' from plugin 'fake' failed on a train event: ValueError: boom second line; "
                    "the run goes on without it"]


def test_a_live_run_s_sink_failures_are_kept_in_its_folder_with_the_step_they_came_at(tmp_path):
    """Two sinks that fail, one on its third train event, one as it starts: each kept in sink_failures.json
    with what it was doing, its one-line error and the step and epoch of the event it failed on."""
    run = SinkRun("r1", tmp_path, {"sinks": {"late": {"into": [], "fail_on": "train"}, "missing": {}}})
    feed = feeding.SinkFeed(FakeRegistry(), run, say=lambda line: None, record=True)
    for event in [{"event": "start"}, {"event": "eval", "epoch": 1}, {"event": "train", "step": 8, "epoch": 2}]:
        feed(event)
    feed.close("completed")
    failures = feeding.failures(tmp_path)
    assert {name: {k: v for k, v in failure.items() if k != "time"} for name, failure in failures.items()} == {
        "late": {"failed": "on a train event", "error": "ValueError: boom second line", "step": 8, "epoch": 2},
        "missing": {"failed": "to start", "error": "ImportError: No module named 'tracker'"}}
    assert feeding.failure_line("r1", "missing", failures["missing"], "running") == (
        "sink 'missing' failed to start: ImportError: No module named 'tracker'; it has nothing of the run: once the "
        "run has ended, catch it up with: fslab export r1 --to missing")
    feeding.caught_up(tmp_path, "late")  # fslab export sent it the whole run
    assert list(feeding.failures(tmp_path)) == ["missing"]
    feeding.caught_up(tmp_path, "missing")
    assert not (tmp_path / feeding.SINK_FAILURES).exists()


def test_a_sink_that_fell_behind_or_had_not_finished_is_kept_as_a_failed_one(tmp_path, monkeypatch):
    """A sink that lost events falling behind, or was still writing when the run's wait for its sinks ran out,
    was said only in stderr.log: fslab show said nothing, as if the tracker had the whole run. Each is kept in
    sink_failures.json: the first event it missed (falling behind) or the last it took (unfinished)."""
    monkeypatch.setattr(feeding, "QUEUE_SIZE", 2)
    run = SinkRun("r1", tmp_path, {"sinks": {"slow": {"into": [], "delay": 0.3}}})
    feed = feeding.SinkFeed(FakeRegistry(), run, say=lambda line: None, record=True)
    events = [{"event": "train", "epoch": 1, "step": step} for step in range(1, 8)]
    feed(events[0])
    while not feed.feeders[0].events.empty():  # the sink has taken step 1 and sleeps on it
        time.sleep(0.001)
    for event in events[1:]:  # steps 2 and 3 fill its queue: 4 to 7 are dropped
        feed(event)
    feed.close("completed", wait=10.0)
    kept = {k: v for k, v in feeding.failures(tmp_path)["slow"].items() if k != "time"}
    assert kept == {"failed": "to keep up", "error": "missed 4 events it fell behind on", "epoch": 1, "step": 4}
    assert feeding.failure_line("r1", "slow", kept, "completed") == (
        "sink 'slow' failed to keep up at epoch 1, step 4: missed 4 events it fell behind on; it has the run without "
        "those events: catch it up with: fslab export r1 --to slow")

    feeding.caught_up(tmp_path, "slow")
    feed = feeding.SinkFeed(FakeRegistry(), run, say=lambda line: None, record=True)
    feed(events[0])
    while not feed.feeders[0].events.empty():
        time.sleep(0.001)
    feed(events[1])
    feed.close("completed", wait=0.1)  # it sleeps on step 1 still
    kept = {k: v for k, v in feeding.failures(tmp_path)["slow"].items() if k != "time"}
    assert kept == {"failed": "to finish", "error": "had not finished 0.1 s after the run ended", "epoch": 1,
                    "step": 1}
    assert feeding.failure_line("r1", "slow", kept, "completed") == (
        "sink 'slow' failed to finish at epoch 1, step 1: had not finished 0.1 s after the run ended; it lacks what "
        "it had not written by then: catch it up with: fslab export r1 --to slow")


def test_sinks_a_worker_cannot_start_at_all_are_each_kept_as_failed_to_start(tmp_path, monkeypatch, capsys):
    """A worker that could not read the registry (a plugin folder gone, a broken fslab.toml) ran without its
    sinks, said only in stderr.log: fslab show said nothing of them. Each is kept as failing to start."""
    from fslab.core import registry
    from fslab.execution.worker import open_sinks

    from .test_tui_helpers import complete_config, write_run

    def unreadable(*args, **kwargs):
        raise RuntimeError("plugin folder 'mine' is gone")

    monkeypatch.setattr(registry, "load_registry", unreadable)
    monkeypatch.chdir(tmp_path)
    folder = write_run(tmp_path / "runs", "20260101-000000-nca-sink", state="running",
                       cfg=complete_config(sinks={"mlflow": {}, "tensorboard": {}}))
    assert open_sinks(Run(folder)) is None
    assert "the run's sinks could not be started: RuntimeError: plugin folder 'mine' is gone" in capsys.readouterr().err
    kept = {name: {k: v for k, v in failure.items() if k != "time"} for name, failure in
            feeding.failures(folder).items()}
    failed = {"failed": "to start", "error": "RuntimeError: plugin folder 'mine' is gone"}
    assert kept == {"mlflow": failed, "tensorboard": failed}


def test_a_sink_that_cannot_start_is_reported_once():
    feed, said = feed_of({"missing": {}})
    for event in EVENTS:
        feed(event)
    feed.close("failed")
    assert said == ["sink 'missing' from plugin 'fake' failed to start: ImportError: No module named 'tracker'; "
                    "the run goes on without it"]


def test_a_slow_sink_never_blocks_drops_beyond_its_queue_and_is_left_behind(monkeypatch):
    monkeypatch.setattr(feeding, "QUEUE_SIZE", 3)
    monkeypatch.setattr(feeding, "CLOSE_WAIT", 0.3)
    got = []
    feed, said = feed_of({"slow": {"into": got, "delay": 0.5}})
    for event in EVENTS:  # 7 events into a queue of 3 while the sink sleeps on the first
        feed(event)
    feed.close("completed")
    dropped = feed.feeders[0].dropped
    assert dropped >= len(EVENTS) - 3 - 1  # at most the queue and the one in the sink's hands got through
    assert said[0].startswith("sink 'slow' is falling behind: events are dropped for it until it catches up")
    assert said[1] == f"sink 'slow' missed {dropped} events it fell behind on"
    assert said[2].startswith("sink 'slow' had not finished 0.3 s after the run ended")
    assert len(said) == 3


def test_the_feeds_own_wait_replaces_the_default(monkeypatch):
    """A worker gives its feed [sinks] close_wait_s of fslab.toml; close() then waits that long, not CLOSE_WAIT."""
    monkeypatch.setattr(feeding, "CLOSE_WAIT", 60.0)
    got = []
    feed, said = feed_of({"slow": {"into": got, "delay": 5.0}}, wait=0.25)
    feed({"event": "start"})
    thread = feed.feeders[0].thread
    join, waited = thread.join, []

    def timed_join(timeout=None):  # what close() gives the sink: the feed's 0.25 s, not CLOSE_WAIT's 60
        waited.append(timeout)
        join(timeout)

    thread.join = timed_join
    feed.close("completed")
    assert len(waited) == 1 and waited[0] is not None and 0 <= waited[0] <= 0.25, waited
    assert said == ["sink 'slow' had not finished 0.25 s after the run ended; what it had not written is missing "
                    "there (fslab export replays the run)"]


# -- the configuration ------------------------------------------------------------


def test_sinks_come_from_the_toml_list_the_options_and_set(registry):
    settings = Settings(run={"sinks": ["tensorboard"]})
    config = resolve("nca", registry=registry, settings=settings,
                     overrides=[{"sinks": {"tensorboard": {"log_dir": "/tmp/tb"}}}])
    assert config["sinks"] == {"tensorboard": {"log_dir": "/tmp/tb"}}
    assert resolve("nca", registry=registry, settings=Settings())["sinks"] == {}
    none = resolve("nca", registry=registry, settings=settings, overrides=[{"sinks": []}])  # --set sinks=[]
    assert none["sinks"] == {}


def test_sink_named_beside_set_sinks_empty_is_kept(registry):
    """fslab run --sink mlflow --set sinks=[] with fslab.toml's sinks = ["tensorboard"]: sinks=[] (none of
    fslab.toml's) also dropped the --sink given beside it, and the run had no sink, silently."""
    from fslab.cli.common import overrides

    settings = Settings(run={"sinks": ["tensorboard"]})

    def sinks(*set_):
        layers = overrides(None, None, None, None, None, None, None, None, list(set_), sinks=["mlflow"])
        return resolve("nca", registry=registry, settings=settings, overrides=layers)["sinks"]

    assert list(sinks("sinks=[]")) == ["mlflow"]
    assert sinks("sinks.mlflow.experiment=x")["mlflow"]["experiment"] == "x"  # --set still gives its parameters
    assert sorted(sinks()) == ["mlflow", "tensorboard"]


@pytest.mark.parametrize("toml_sinks", [["tensorboard"], {"tensorboard": {}}])
def test_a_bad_sink_option_is_not_blamed_on_fslab_toml_s_list_of_sinks(registry, toml_sinks):
    """fslab.toml's sinks = ["tensorboard"] names sinks, no parameter: --set sinks.mlflow.bogus=1 was
    said to be '(set by sinks in [run] of fslab.toml)'. An unknown sink the list names still is."""
    from pathlib import Path

    from fslab.core.errors import FslabError

    settings = Settings(path=Path("fslab.toml"), run={"sinks": toml_sinks})
    with pytest.raises(FslabError) as caught:
        resolve("nca", registry=registry, settings=settings, overrides=[{"sinks": {"mlflow": {"bogus": 1}}}])
    assert str(caught.value).startswith("unknown parameter 'sinks.mlflow.bogus' for sink 'mlflow'.")
    assert "fslab.toml" not in str(caught.value)
    with pytest.raises(FslabError) as caught:
        resolve("nca", registry=registry, settings=Settings(path=Path("fslab.toml"), run={"sinks": ["tensorbord"]}))
    assert str(caught.value).endswith("(set by sinks in [run] of fslab.toml)")


@pytest.mark.parametrize("layer, expected", [
    ({"sinks": {"tensorbored": {}}}, "Unknown sink 'tensorbored'"),
    ({"sinks": {"tensorboard": {"logdir": "x"}}},
     "unknown parameter 'sinks.tensorboard.logdir' for sink 'tensorboard'. Did you mean 'log_dir'?"),
    ({"sinks": {"tensorboard": {"log_dir": 3}}}, "config key 'sinks.tensorboard.log_dir' must be a string, got 3"),
    ({"sinks": "tensorboard"}, "'sinks' must be a list of sink names"),
])
def test_a_bad_sink_is_one_line(registry, layer, expected):
    from fslab.core.errors import FslabError

    with pytest.raises(FslabError) as caught:
        resolve("nca", registry=registry, settings=Settings(), overrides=[layer])
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_runs_that_differ_only_in_sinks_are_one_group_in_compare(tmp_path):
    from fslab.core.runstore import Run

    base = {"method": "nca", "seed": 0, "train": {"lr": 0.1}, "sinks": {}}
    other = {**base, "sinks": {"tensorboard": {"log_dir": ""}}}
    run = Run(tmp_path / "r")
    assert run_settings(run, flatten(base), None, "--group-by") == run_settings(run, flatten(other), None, "--group-by")


# -- real runs ----------------------------------------------------------------------


def _comparable(run_dir) -> list[dict]:
    """The run's events without what depends on the clock."""
    return [{k: v for k, v in e.items() if k not in ("time", "images_per_s")} for e in events(run_dir)]


@pytest.mark.slow
def test_a_run_with_failing_and_hanging_sinks_ends_as_one_without_sinks(project):
    (project / "mine").mkdir()
    (project / "mine" / "trackers.py").write_text(SINKS_PLUGIN)
    # [sinks] close_wait_s: how long the worker waits for its sinks (the hanging one) once the run has ended
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n\n[run]\nsinks = ['record']\n\n"
                                        "[sinks]\nclose_wait_s = 2.5\n")
    record = project / "record.jsonl"
    # the run without sinks trains beside the one with them, which waits 2.5 s on its hanging sink once it ended
    plain = subprocess.Popen([sys.executable, "-m", "fslab", "run", "nca", *TINY, "--epochs", "2", "--seed", "3",
                              "--set", "sinks=[]"], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    with_sinks = fslab("run", "nca", *TINY, "--epochs", "2", "--seed", "3", "--sink", "raises", "--sink", "sleeps",
                       "--sink", "unimportable", "--set", f"sinks.record.path={json.dumps(str(record))}",
                       "--sink", "imports", "--set", f"sinks.imports.path={json.dumps(str(project / 'imports.json'))}",
                       cwd=project)
    assert with_sinks.returncode == 0, with_sinks.stderr
    _, plain_err = plain.communicate(timeout=300)
    assert plain.returncode == 0, plain_err
    sinked, unsinked = sorted((project / "runs").iterdir(), key=lambda p: json.loads(
        (p / "config.json").read_text())["sinks"] == {})
    config = json.loads((sinked / "config.json").read_text())
    assert set(config["sinks"]) == {"record", "raises", "sleeps", "unimportable", "imports"}
    # sinks start once torch is imported: a sink importing torch's modules while the worker imported torch
    # left torch half initialised for both, and failed the run
    assert json.loads((project / "imports.json").read_text()) == {"training_imported": True}
    assert json.loads((unsinked / "config.json").read_text())["sinks"] == {}

    assert json.loads((sinked / "results.json").read_text())["test"] == \
        json.loads((unsinked / "results.json").read_text())["test"]
    assert _comparable(sinked) == _comparable(unsinked)
    recorded = [json.loads(line) for line in record.read_text().splitlines()]
    assert recorded[:-1] == events(sinked) and recorded[-1] == {"closed": "completed"}

    stderr = (sinked / "stderr.log").read_text()
    assert stderr.count("sink 'raises' from plugin 'local:trackers' failed on a train event: RuntimeError: the "
                        "tracker's server said no; the run goes on without it") == 1
    assert stderr.count("sink 'unimportable' from plugin 'local:trackers' failed to start: PluginError:") == 1
    assert stderr.count("sink 'sleeps' had not finished 2.5 s after the run ended") == 1
    assert "Traceback" not in stderr
    # each is kept for fslab show, the one still writing when the wait ran out too
    kept = {name: failure["failed"] for name, failure in feeding.failures(sinked).items()}
    assert kept == {"raises": "on a train event", "unimportable": "to start", "sleeps": "to finish"}
    shown = fslab("show", sinked.name, cwd=project).stdout
    assert ("sink 'sleeps' failed to finish: had not finished 2.5 s after the run ended; it lacks what it had not "
            f"written by then: catch it up with: fslab export {sinked.name} --to sleeps") in shown.splitlines()
    status = json.loads((sinked / "status.json").read_text())
    assert status["state"] == "completed" and status["exit_code"] == 0
    # what fslab.testing feeds a sink under test is shaped as this real run's events
    from fslab.testing.checks import sink_events

    def shapes(stream):
        return {(e["event"], e.get("split")): sorted(e) for e in stream}
    assert shapes(sink_events()) == shapes(events(unsinked))


FLAKY_SINK = """
from fslab.plugin import hookimpl


class Flaky:
    \"\"\"Takes a live run's first two train events, then raises: a tracker whose server went away.\"\"\"

    def __init__(self, run):
        self.run, self.trains = run, 0

    def write(self, event):
        if event["event"] == "train" and not self.run.replay:
            self.trains += 1
            if self.trains > 2:
                raise ConnectionResetError("the tracker's server\\nwent away")

    def close(self):
        pass


@hookimpl
def register_sinks(register):
    register(Flaky, name="flaky", description="fails after two train events of a live run")
"""


@pytest.mark.slow
def test_fslab_show_says_which_sink_failed_where_and_how_to_catch_it_up(project):
    """A sink that failed as the run trained was said only in the worker's stderr.log: fslab show said nothing,
    and the tracker's missing steps were found days later. fslab show (text and --json) names it, the step it
    failed at and its error, with the export that catches it up; once exported, the failure is gone."""
    from .runs_helpers import fslab_here

    (project / "mine").mkdir()
    (project / "mine" / "flaky.py").write_text(FLAKY_SINK)
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    trained = fslab("run", "nca", *TINY, "--epochs", "2", "--sink", "flaky", cwd=project)
    assert trained.returncode == 0, trained.stderr
    run_id = next((project / "runs").glob("2*")).name
    shown = fslab_here("show", run_id, cwd=project)
    line = (f"sink 'flaky' failed on a train event at epoch 1, step 3: ConnectionResetError: the tracker's server "
            f"went away; it has nothing of the run after that: catch it up with: fslab export {run_id} --to flaky")
    assert shown.returncode == 0 and shown.stdout.splitlines()[1] == line, shown.stdout
    as_json = json.loads(fslab_here("show", run_id, "--json", cwd=project).stdout)["sink_failures"]
    assert {k: v for k, v in as_json["flaky"].items() if k != "time"} == {
        "failed": "on a train event", "error": "ConnectionResetError: the tracker's server went away",
        "epoch": 1, "step": 3}
    assert fslab_here("export", run_id, "--to", "flaky", cwd=project).returncode == 0
    assert "sink 'flaky'" not in fslab_here("show", run_id, cwd=project).stdout
    assert json.loads(fslab_here("show", run_id, "--json", cwd=project).stdout)["sink_failures"] == {}
