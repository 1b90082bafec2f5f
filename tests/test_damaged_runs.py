"""No run file, however damaged, stops a reader: arbitrary bytes, truncations
of real files and valid JSON of the wrong shape are fed to every reader of the
run store (hypothesis, derandomised), and real commands over a store of broken
runs list, show and compare the others in one piece."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fslab.core.errors import UsageError
from fslab.core.files import Tail, json_object, read_json
from fslab.core.runstore import Run, find_run, list_runs
from fslab.core.summary import SummaryFile, list_summaries, read_summary
from fslab.core.sweeps import sweep_records
from fslab.reports.compare import compare

from .runs_helpers import fslab_here

FIXTURE = Path(__file__).parent / "fixtures" / "runs-0.1" / "20261123-181250-nca-910d"
FILES = ("config.json", "status.json", "metrics.jsonl", "results.json", "summary.json",
         "evaluations/test-centroid-5way-5shot-5q-40ep-seed0-epoch2.json")
CHECKS = settings(max_examples=60, derandomize=True, deadline=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["state", "pid", "created", "heartbeat", "error", "event", "step", "epoch", "loss",
                         "split", "shots", "ways", "queries", "episodes", "accuracy", "ci95", "test", "runs",
                         "accuracies", "evaluator", "seed", "train", "method", "format", "summary", "seen",
                         "status", "1-shot", "x"]), inner, max_size=6),
    max_leaves=12)


def read_everything(folder: Path) -> None:
    """Every reader a listing, a comparison or the dashboard uses on one run."""
    run = Run(folder)
    run.status(), run.results(), run.saved_accuracies(), run.events(), run.claimed()
    summary = read_summary(folder)
    assert summary.state in ("queued", "running", "completed", "failed", "killed", "lost", "unreadable")
    keeper = SummaryFile(folder)
    keeper.load()
    keeper.refresh()
    keeper.save()
    list_summaries(folder.parent, limit=None)
    list_runs(folder.parent)
    find_run(folder.parent, folder.name)
    compare([run])
    Tail(folder / "metrics.jsonl").events()


@pytest.fixture
def run_folder(tmp_path):
    def fresh() -> Path:
        folder = tmp_path / "runs" / FIXTURE.name
        shutil.rmtree(tmp_path / "runs", ignore_errors=True)
        shutil.copytree(FIXTURE, folder)
        read_summary(folder)  # a summary.json to damage too
        return folder
    return fresh


@CHECKS
@given(name=st.sampled_from(FILES), data=st.binary(max_size=300))
def test_arbitrary_bytes_in_any_run_file_are_never_fatal(run_folder, name, data):
    folder = run_folder()
    (folder / name).write_bytes(data)
    read_everything(folder)


@CHECKS
@given(name=st.sampled_from(FILES), cut=st.floats(0, 1))
def test_a_run_file_cut_anywhere_is_never_fatal(run_folder, name, cut):
    folder = run_folder()
    whole = (folder / name).read_bytes()
    (folder / name).write_bytes(whole[: int(cut * len(whole))])
    read_everything(folder)


@CHECKS
@given(name=st.sampled_from(FILES), value=json_values)
def test_valid_json_of_the_wrong_shape_is_never_fatal(run_folder, name, value):
    folder = run_folder()
    text = json.dumps(value)
    if name == "metrics.jsonl":  # a few lines of it, after the real ones
        text = (folder / name).read_text() + "\n".join(json.dumps(v) for v in [value, {"event": "eval", **(
            value if isinstance(value, dict) else {})}]) + "\n"
    (folder / name).write_text(text)
    read_everything(folder)


shaped_failures = st.dictionaries(st.text(max_size=8), st.fixed_dictionaries(
    {"failed": json_values, "error": json_values, "time": json_values},
    optional={"step": json_values, "epoch": json_values}) | json_values, max_size=3)


@CHECKS
@given(value=st.binary(max_size=300) | json_values | shaped_failures)
def test_a_damaged_sink_failures_file_gives_fslab_show_only_whole_records(tmp_path, value):
    """sink_failures.json, which fslab show reads, of any bytes or any JSON: each record it keeps has its
    text fields, and its step and epoch only as whole numbers, so its line can always be written."""
    from fslab.core.sinks import SINK_FAILURES, failure_line, failures

    path = tmp_path / SINK_FAILURES
    path.write_bytes(value) if isinstance(value, bytes) else path.write_text(json.dumps(value))
    for name, failure in failures(tmp_path).items():
        assert isinstance(failure["failed"], str) and isinstance(failure["error"], str)
        assert all(type(failure[key]) is int for key in ("step", "epoch") if key in failure)
        assert failure_line("r1", name, failure, "completed").startswith(f"sink '{name}' failed ")


@CHECKS
@given(value=json_values)
def test_a_damaged_sweep_record_is_left_out(tmp_path, value):
    folder = tmp_path / "runs" / "sweeps"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sweep-1.json").write_text(json.dumps(value))
    for record in sweep_records(tmp_path / "runs"):
        assert isinstance(record["runs"], list)


def test_read_json_takes_objects_only(tmp_path):
    path = tmp_path / "x.json"
    for text, expected in (("[1, 2]", None), ('"hello"', None), ("{bad", None), ('{"a": 1}', {"a": 1})):
        path.write_text(text)
        assert read_json(path) == expected
    path.write_bytes(b"\xff\xfe{}")
    assert read_json(path) is None
    assert read_json(tmp_path) is None  # a folder


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("value", ["[" * 5000 + "]" * 5000, str(10**400), "-" + "9" * 20, "1" * 30],
                         ids=["deep", "huge", "below-int64", "long"])
def test_deep_nesting_and_numbers_no_run_writes_are_never_fatal(run_folder, name, value):
    """A RecursionError and an OverflowError are no ValueError: they went past every reader."""
    folder = run_folder()
    text = (f'{{"event": "note", "time": 1.0, "x": {value}}}\n' if name == "metrics.jsonl"
            else f'{{"state": "running", "pid": {value}, "created": {value}, "started": {value}}}')
    with open(folder / name, "a" if name == "metrics.jsonl" else "w") as fh:
        fh.write(text)
    read_everything(folder)
    if name == "status.json":
        assert read_summary(folder).state == "unreadable"


def test_loads_refuses_what_no_run_writes():
    from fslab.core.files import loads

    assert loads('{"a": 18446744073709551615, "b": -9223372036854775808, "c": 1e400}') == {
        "a": 2**64 - 1, "b": -(2**63), "c": float("inf")}
    for text in (str(2**64), "[" * 5000 + "]" * 5000, "9" * 21):
        with pytest.raises(ValueError):
            loads(text)


def test_a_damaged_summary_json_is_folded_again_not_trusted(run_folder):
    folder = run_folder()
    truth = read_summary(folder)
    saved = json.loads((folder / "summary.json").read_text())
    for field, value in [("test", "x"), ("best_val", [1]), ("test", {"5-shot": {"accuracy": "high"}}),
                         ("first_train", [1]), ("epoch", 2.5), ("invented", 1)]:
        (folder / "summary.json").write_text(json.dumps({**saved, "summary": {**saved["summary"], field: value}}))
        assert read_summary(folder).to_dict() == truth.to_dict(), field
    (folder / "summary.json").write_text(json.dumps({**saved, "status": {**saved["status"], "state": 5}}))
    assert read_summary(folder).state == truth.state == "completed"


def test_an_event_appended_after_a_torn_line_starts_a_line_of_its_own(run_folder):
    from fslab.core.eventlog import EventLog

    folder = run_folder()
    with open(folder / "metrics.jsonl", "a") as fh:
        fh.write('{"event": "train", "ti')  # a writer killed mid-line
    log = EventLog(Run(folder), echo=False)
    log.write("note", text="after")
    log.write("note", text="again")
    log.close()
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    assert lines[-3] == '{"event": "train", "ti'
    assert [json.loads(line)["text"] for line in lines[-2:]] == ["after", "again"]


def test_a_sweep_record_naming_runs_outside_the_store_is_not_read(tmp_path):
    from fslab.core.sweeps import load_sweep

    folder = tmp_path / "runs" / "sweeps"
    folder.mkdir(parents=True)
    for name, runs in [("sweep-1-int", [5, None]), ("sweep-1-up", ["../outside"]), ("sweep-1-dot", [".."])]:
        (folder / f"{name}.json").write_text(json.dumps({"id": name, "method": "nca", "runs": runs}))
        with pytest.raises(UsageError, match=r"cannot be read \(it must be JSON listing its runs' ids\)"):
            load_sweep(tmp_path / "runs", name)
    assert sweep_records(tmp_path / "runs") == []


def test_a_run_with_an_unreadable_status_is_neither_resumed_nor_requeued(run_folder):
    """A completed run whose status.json broke would otherwise read as lost: resumable."""
    from fslab.core.states import pid_alive, run_state
    from fslab.execution.checks import check_resumable

    folder = run_folder()
    (folder / "status.json").write_text('{"state": "compl')
    assert Run(folder).state() == "unreadable" and run_state({"pid": 3}) == "unreadable"
    with pytest.raises(UsageError) as refused:
        check_resumable(Run(folder))
    # it said "only killed, lost or failed runs can resume", as if the run were in none of those states
    assert str(refused.value) == (
        f"run {folder.name} is unreadable: its status.json is missing or cannot be read (fslab show {folder.name} "
        f"says why), so how it ended cannot be told; put the file back from a copy of the run, then resume it")
    assert not any(pid_alive(pid) for pid in (0, -1, 2**31, 10**30))  # no process has these: never probed


@pytest.mark.parametrize("state", ["paused", "lost-forever"])
def test_a_run_whose_status_names_a_state_fslab_does_not_know_says_so_and_is_not_resumed(run_folder, state):
    """A state written by hand or by a newer fslab read as lost: fslab runs listed the completed run as lost
    with no word of why, and fslab resume trained it again from its last checkpoint."""
    from tests.runs_helpers import fslab_here

    folder = run_folder()
    status = json.loads((folder / "status.json").read_text())
    (folder / "status.json").write_text(json.dumps({**status, "state": state}))
    why = (f"status.json records the state '{state}', which this fslab does not know (a run's status says "
           f"queued, running, completed, failed or killed); a newer fslab may have written it, or an edit by hand")
    listed = fslab_here("runs", "--json", cwd=folder.parent.parent)
    assert [(r["state"], r["error"]) for r in map(json.loads, listed.stdout.splitlines())] == [("unreadable", why)]
    resumed = fslab_here("resume", folder.name, cwd=folder.parent.parent)
    assert (resumed.returncode, resumed.stderr) == (2, f"error: run {folder.name} cannot resume: its {why}; put "
                                                       f"back a status.json this fslab writes, or resume it with "
                                                       f"the fslab that wrote it\n")
    assert json.loads((folder / "status.json").read_text())["state"] == state  # nothing was started


def test_export_and_sweep_resume_name_a_state_fslab_does_not_know_not_a_damaged_file(run_folder):
    """fslab export and fslab sweep resume said such a run's status.json was missing or unreadable and to put
    it back from a copy, where the file is whole and names a state a newer fslab (or a hand) wrote."""
    from fslab.core.sweeps import save_sweep

    folder = run_folder()
    project = folder.parent.parent
    status = json.loads((folder / "status.json").read_text())
    (folder / "status.json").write_text(json.dumps({**status, "state": "archived", "sweep": "sweep-1"}))
    save_sweep(folder.parent, "sweep-1", runs=[folder.name], method="nca")
    why = ("status.json records the state 'archived', which this fslab does not know (a run's status says "
           "queued, running, completed, failed or killed); a newer fslab may have written it, or an edit by hand")
    exported = fslab_here("export", folder.name, "--to", "tensorboard", "--set", f"log_dir={project / 'tb'}",
                          cwd=project)
    assert (exported.returncode, exported.stderr.splitlines()[0]) == (1, (
        f"{folder.name}: its {why}; how it ended cannot be told, so nothing to export: put back a status.json "
        f"this fslab writes, or export it with the fslab that wrote it"))
    resumed = fslab_here("sweep", "resume", "sweep-1", cwd=project)
    assert (resumed.returncode, resumed.stderr) == (2, (
        f"error: sweep sweep-1 has nothing to resume: 1 with its status.json naming a state this fslab does not "
        f"know ({folder.name}: a newer fslab may have written it, or an edit by hand; resume it with the fslab "
        f"that wrote it, or put back a status.json this fslab writes); only its failed, killed or lost runs are "
        f"queued again\n"))
    assert json.loads((folder / "status.json").read_text())["state"] == "archived"  # nothing written to it


def test_stop_does_not_call_a_run_in_a_state_fslab_does_not_know_not_running(run_folder):
    """fslab stop said such a run 'is unreadable, not running', where a newer fslab's state ('paused', say)
    may be one its worker still lives in."""
    folder = run_folder()
    status = json.loads((folder / "status.json").read_text())
    (folder / "status.json").write_text(json.dumps({**status, "state": "paused"}))
    stopped = fslab_here("stop", folder.name, cwd=folder.parent.parent)
    assert (stopped.returncode, stopped.stderr) == (2, (
        f"error: run {folder.name} cannot be stopped by this fslab: its status.json records the state 'paused', "
        f"which this fslab does not know (a run's status says queued, running, completed, failed or killed); a "
        f"newer fslab may have written it, or an edit by hand; if it is running, stop it with the fslab that "
        f"wrote it\n"))
    assert json.loads((folder / "status.json").read_text())["state"] == "paused"


def stand_in_worker(run: Run) -> subprocess.Popen:
    """A live process of this host whose command line runs the worker on ``run`` (so a stop signals it), recorded
    as the run's running worker; it trains nothing."""
    import time

    from fslab.core.states import HOST

    from .runs_helpers import wait_for

    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "-m", "fslab.execution.worker",
                                str(run.path.resolve())])
    wait_for(lambda: b"fslab.execution.worker" in Path(f"/proc/{process.pid}/cmdline").read_bytes(),
             what="the stand-in worker to start")
    run.write_status(state="running", pid=process.pid, host=HOST, started=time.time(), heartbeat=time.time())
    return process


@pytest.mark.parametrize("damage", ["missing", '{"method": "nc'])
def test_stop_of_a_running_run_whose_config_json_cannot_be_read_stops_it_saying_by_what(tmp_path, damage):
    """fslab stop of a run whose config.json is missing or damaged (fslab runs lists it as unreadable) read
    running from its status.json, signalled nothing and ended in a traceback (KeyError: 'train'), its worker
    training on. It stops the worker its status.json names, and says it went by that file, and what then."""
    from fslab.core.runstore import create_run

    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    worker = stand_in_worker(run)
    try:
        if damage == "missing":
            (run.path / "config.json").unlink()
        else:
            (run.path / "config.json").write_text(damage)
        stopped = fslab_here("stop", run.id, cwd=tmp_path)
        assert (stopped.returncode, stopped.stdout) == (0, f"{run.id}: killed\n"), stopped.stderr
        assert stopped.stderr == (
            f"its config.json is missing or unreadable (fslab show {run.id} says why), so it was stopped as its "
            f"status.json said it was running; put the file back from a copy of the run, then start it again "
            f"(fslab run --like {run.id}): it wrote no checkpoint\n")
        assert worker.wait(timeout=30) < 0 and run.status()["state"] == "killed"
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.parametrize("status, why", [
    ('{"state": "paused", "pid": null}', "status.json records the state 'paused', which this fslab does not know (a "
     "run's status says queued, running, completed, failed or killed); a newer fslab may have written it, or an "
     "edit by hand"),
    ('{"state": "compl', "its status.json is missing or cannot be read, so how it ended cannot be told"),
])
def test_logs_follow_of_an_unreadable_run_ends_saying_why(run_folder, status, why):
    """fslab logs --follow ended such a run with 'unreadable: no error recorded. See: fslab logs RUN --stderr',
    where the reason is its status.json, which the worker's stderr does not tell."""
    folder = run_folder()
    (folder / "status.json").write_text(status)
    followed = fslab_here("logs", folder.name, "--follow", cwd=folder.parent.parent)
    assert followed.returncode == 0 and followed.stdout == (folder / "stdout.log").read_text()
    assert followed.stderr == f"{folder.name}: unreadable: {why}\n"


def test_resuming_a_completed_run_whose_config_broke_names_no_command_that_fails_too(run_folder):
    """fslab resume of such a run said to start one like it with fslab run --like, which refuses it."""
    from fslab.execution.checks import check_resumable

    folder = run_folder()
    assert Run(folder).state() == "completed"
    with pytest.raises(UsageError, match=r"fslab run --like"):
        check_resumable(Run(folder))  # with its configuration, --like is the way on
    (folder / "config.json").write_text('{"method": "nc')
    with pytest.raises(UsageError) as refused:
        check_resumable(Run(folder))
    assert "--like" not in str(refused.value)
    assert str(refused.value).endswith("is completed; only killed, lost or failed runs can resume; nor can a run "
                                       "like it start while its config.json is missing or unreadable (fslab runs "
                                       "lists it as unreadable): put the file back from a copy of the run")


def test_stop_signals_a_local_job_only_if_it_is_this_runs(run_folder):
    """status.json is a plain file: a slurm_job_id naming any process (or -1, every one) must not be signalled."""
    from fslab.execution.slurm import cancel_job, is_local_job_of

    folder = run_folder()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for job in (str(bystander.pid), "-1", "0"):
            assert not is_local_job_of(int(job), Run(folder))
            cancel_job(Run(folder), {"slurm_cluster": "local", "slurm_job_id": job})
        assert bystander.poll() is None  # still running
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("name", ["metrics.jsonl", "status.json", "config.json", "summary.json"])
def test_a_fifo_or_a_device_in_a_run_folder_is_not_read(run_folder, name):
    """A FIFO blocked every listing at its open; /dev/zero was read until memory ran out."""
    import signal

    folder = run_folder()
    (folder / name).unlink()
    os.mkfifo(folder / name)
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail(f"a reader blocked on a FIFO {name}"))
    signal.alarm(20)
    try:
        read_everything(folder)
        (folder / name).unlink()
        (folder / name).symlink_to("/dev/zero")
        read_everything(folder)  # (summary.json is written again, in place of the link)
        zero = folder / "zero"
        zero.symlink_to("/dev/zero")
        assert read_json(zero) is None and Tail(zero).read() == (b"", False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_damaged_last_train_line_leaves_the_last_whole_one_shown(run_folder):
    """The listing showed the run's first step instead (only the first and last train lines are parsed)."""
    folder = run_folder()
    (folder / "summary.json").unlink()
    truth = read_summary(folder)
    (folder / "summary.json").unlink()
    with open(folder / "metrics.jsonl", "a") as fh:
        fh.write('{"event": "train", "time": 1.0, "step": "oops", "epoch": 1, "loss": 1.0}\n')
    again = read_summary(folder)
    assert (again.step, again.loss, again.epoch) == (truth.step, truth.loss, truth.epoch)


def test_a_run_without_its_config_is_found_as_listings_show_it(run_folder):
    """fslab runs listed it as unreadable while fslab show, logs and resume said there was no such run."""
    folder = run_folder()
    (folder / "config.json").unlink()
    assert [s.id for s in list_summaries(folder.parent, limit=None)] == [folder.name]
    assert find_run(folder.parent, folder.name[-4:]).path == folder
    (folder / "status.json").unlink()  # neither file: not a run (or one being created)
    with pytest.raises(UsageError, match=r"^no run "):
        find_run(folder.parent, folder.name[-4:])


def test_wrong_shapes_are_dropped_value_by_value(tmp_path):
    folder = tmp_path / "runs" / FIXTURE.name
    shutil.copytree(FIXTURE, folder)
    status = json.loads((folder / "status.json").read_text())
    (folder / "status.json").write_text(json.dumps({**status, "created": "yesterday", "pid": "12", "error": 3}))
    run = Run(folder)
    assert "created" not in run.status() and "pid" not in run.status() and run.status()["state"] == "completed"
    (folder / "results.json").write_text("[1, 2]")
    assert run.results() is None
    summary = read_summary(folder)
    assert summary.state == "completed" and summary.created is None and summary.test  # from the events


@pytest.mark.parametrize("scores", [[float("inf")] * 40, [1e308] * 40, [1.5] * 40, [-0.25] * 40],
                         ids=["infinity", "1e308", "above-1", "negative"])
def test_episode_scores_that_are_not_fractions_leave_their_evaluation_out(run_folder, scores):
    """Python's JSON reader takes Infinity and 1e308; summed they overflowed the
    comparison's mean (OverflowError, or AttributeError from statistics)."""
    folder = run_folder()
    path = folder / FILES[-1]
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "accuracies": scores}))
    kept = Run(folder).saved_accuracies()
    assert len(kept) == 3 and (record["shots"], record["evaluator"]) not in {(r["shots"], r["evaluator"]) for r in kept}
    rows = compare([Run(folder)])
    assert rows  # the other three evaluations are still compared


def test_an_evaluation_of_no_episodes_never_hides_the_real_one(run_folder):
    """A later epoch's evaluation is preferred; one without episodes is not an evaluation at all."""
    folder = run_folder()
    record = json.loads((folder / FILES[-1]).read_text())
    empty = {**record, "epoch": 99, "episodes": 0, "accuracies": []}
    (folder / "evaluations" / "test-centroid-5way-5shot-5q-0ep-seed0-epoch99.json").write_text(json.dumps(empty))
    assert all(r["episodes"] == 40 for r in Run(folder).saved_accuracies())


def test_numbers_beyond_floats_and_scores_beyond_fractions_are_dropped_value_by_value(run_folder):
    folder = run_folder()
    status = json.loads((folder / "status.json").read_text())
    usage = {"cpu_percent": "NaN", "time": [1], "rss_bytes": 5, "gpu_utilization_percent": float("nan"), "x": 1}
    (folder / "status.json").write_text(json.dumps({**status, "created": float("inf"), "heartbeat": float("-inf"),
                                                    "usage": usage}))
    assert "created" not in Run(folder).status() and "heartbeat" not in Run(folder).status()
    assert Run(folder).status()["usage"] == {"rss_bytes": 5}  # as fslab show --json prints it
    trained = read_summary(folder).test["5-shot"]
    with open(folder / "metrics.jsonl", "a") as metrics:  # a training test event that would replace it
        metrics.write(json.dumps({"event": "eval", "time": 1, "split": "test", "ways": 5, "shots": 5, "queries": 5,
                                  "episodes": 40, "evaluator": "centroid", "accuracy": 1e308, "ci95": -1e308}) + "\n")
    shown = read_summary(folder)
    assert shown.test["5-shot"] == trained and shown.corrupt == 1
    listed = json.dumps(dataclasses.asdict(shown))
    assert "Infinity" not in listed and "NaN" not in listed


def test_an_event_field_of_the_wrong_kind_leaves_the_event_out(run_folder):
    """A non-text metric crashed fslab show; string pair counts crashed fslab plot pairs."""
    folder = run_folder()
    with open(folder / "metrics.jsonl", "a") as metrics:
        metrics.write(json.dumps({"event": "eval", "time": 1, "source": "fslab eval", "split": "test", "ways": 5,
                                  "shots": 1, "queries": 15, "episodes": 30, "metric": 5, "accuracy": 0.5,
                                  "ci95": 0.01}) + "\n")
        metrics.write(json.dumps({"event": "train", "step": 99, "epoch": 2, "loss": 1.0, "positives": "49",
                                  "negatives": 3}) + "\n")
    events = Run(folder).events()
    assert not any(e.get("metric") == 5 or e.get("positives") == "49" for e in events)
    fixture_events = [json.loads(line) for line in (FIXTURE / "metrics.jsonl").read_text().splitlines()]
    assert sum(e["event"] == "train" for e in events) == sum(e["event"] == "train" for e in fixture_events)


def fslab(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "fslab", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_commands_over_a_store_of_broken_runs(tmp_path, builtin_plugins):
    """One run of each kind of damage beside a good one: every command lists,
    shows or compares the good one and says in one line what it cannot read."""
    project = tmp_path / "project"
    runs = project / "runs"
    good = runs / FIXTURE.name
    shutil.copytree(FIXTURE, good)
    damage = {"cfgstr": ("config.json", '"hello"'), "resl": ("results.json", "[1,2]"),
              "halfstatus": ("status.json", '{"state": "compl'), "badevents": ("metrics.jsonl",
              '{"event":"eval","split":"val"}\n{"event":"train","step":1,"epoch":1,"loss":"x"}\n'),
              "noconfig": ("config.json", None),
              # sections that are no tables: fslab show raised AttributeError on them
              "cfgshape": ("config.json", '{"method": "nca", "backbone": "conv4", "train": "x", "seed": "s"}'),
              # an object without a state: fslab runs said "cannot be read: None"
              "nostate": ("status.json", '{"state": 5, "pid": "abc"}')}
    for name, (file, text) in damage.items():
        folder = runs / f"20261123-1900{len(name):02d}-nca-{name}"
        shutil.copytree(FIXTURE, folder)
        if text is None:
            (folder / file).unlink()
        else:
            (folder / file).write_text(text)
    listed = fslab_here("runs", "--json", "--all", cwd=project)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    states = {row["id"].rsplit("-", 1)[-1]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert states["910d"]["state"] == "completed" and states["resl"]["state"] == "completed"
    assert states["halfstatus"]["state"] == "unreadable" and "status.json" in states["halfstatus"]["error"]
    assert states["noconfig"]["state"] == "unreadable" and "config.json missing" in states["noconfig"]["error"]
    assert states["badevents"]["corrupt"] == 2
    assert states["nostate"]["state"] == "unreadable"
    assert states["nostate"]["error"] == states["nostate"]["note"] == 'status.json records no state (a text such ' \
                                                                      'as "completed")'
    for name in damage:
        shown = fslab_here("show", name, cwd=project)
        assert "Traceback" not in shown.stderr and shown.returncode in (0, 1, 2), shown.stderr
        if name == "cfgshape":
            assert shown.returncode == 0 and "method nca, backbone -, dataset -, seed -" in shown.stdout
    for argv in (["runs"], ["compare", "all", "--queries", "5"], ["queue"], ["logs", "halfstatus"]):
        done = fslab_here(*argv, cwd=project)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (argv, done.stderr)


# For root, who reads every folder: the commands' Python is made to refuse one
# folder as the kernel refuses another user's (EACCES on listing it, and on
# stat and open of what is inside), at the calls fslab and pathlib make.
DENY = """
import builtins, errno, os

HIDDEN = os.environ["FSLAB_TEST_DENY"]


def _denied(path, folder_too=False):
    try:
        path = os.fsdecode(os.fspath(path))
    except TypeError:
        return False
    path = os.path.abspath(path)
    return path.startswith(HIDDEN + os.sep) or (folder_too and path == HIDDEN)


def _guard(call, folder_too=False):
    def guarded(path=".", *args, **kwargs):
        if _denied(path, folder_too):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(os.fspath(path)))
        return call(path, *args, **kwargs)
    return guarded


builtins.open = _guard(builtins.open)
os.open, os.stat, os.lstat = _guard(os.open), _guard(os.stat), _guard(os.lstat)
os.scandir, os.listdir = _guard(os.scandir, True), _guard(os.listdir, True)
"""


def run_as_another_user(tmp_path: Path, hidden: Path) -> dict:
    """What the commands need to find ``hidden`` unreadable: mode 0 for a
    user, and for root the refusal above (tests run as root in CI)."""
    if os.geteuid() != 0:
        hidden.chmod(0)
        return {}
    (tmp_path / "deny").mkdir()
    (tmp_path / "deny" / "sitecustomize.py").write_text(DENY)
    return {"PYTHONPATH": str(tmp_path / "deny"), "FSLAB_TEST_DENY": str(hidden.resolve())}


@pytest.mark.slow
def test_a_folder_another_user_cannot_read_is_listed_as_unreadable(tmp_path):
    """Another user's umask 077 on a shared store: the folder is listed as
    unreadable with the reason, and everything else goes on."""
    project = tmp_path / "project"
    shutil.copytree(FIXTURE.parent, project / "runs")
    hidden = project / "runs" / "20261123-181256-nca-f8c6"
    env = run_as_another_user(tmp_path, hidden)
    try:
        listed = fslab("runs", "--json", "--all", cwd=project, env=env)
        assert listed.returncode == 0, listed.stderr
        rows = {row["id"]: row for row in map(json.loads, listed.stdout.splitlines())}
        assert rows[hidden.name]["state"] == "unreadable" and "Permission denied" in rows[hidden.name]["error"]
        assert rows["20261123-181250-nca-910d"]["state"] == "completed"
        for argv in (["runs"], ["show", "181250"], ["compare", "all", "--queries", "5"], ["queue"]):
            done = fslab(*argv, cwd=project, env=env)
            assert done.returncode == 0 and "Traceback" not in done.stderr, (argv, done.stderr)
        shown = fslab("show", hidden.name, cwd=project, env=env)
        assert "unreadable" in shown.stdout and "Traceback" not in shown.stderr, shown.stderr
    finally:
        hidden.chmod(0o755)


@pytest.mark.parametrize("name", ["config.json", "status.json"])
def test_a_file_that_can_no_longer_be_read_takes_what_it_said_out_of_the_summary(run_folder, name):
    """The summary kept the method, backbone, seed (or the times) config.json (status.json) gave while it could
    be read: fslab runs --method nca listed the unreadable run and fslab show named its method, which a fold
    without summary.json (a read-only store, another reader) does not know. Both folds agree now."""
    folder = run_folder()
    assert read_summary(folder).method == "nca"
    (folder / name).write_text('{"method": ')  # half a file
    kept = read_summary(folder)
    (folder / "summary.json").unlink()
    afresh = read_summary(folder, save=False)
    assert kept.to_dict() == afresh.to_dict()
    assert kept.state == "unreadable" and kept.error == f"{name} is cut short or not JSON (line 1, column 12)"
    if name == "config.json":
        assert (kept.method, kept.backbone, kept.seed, kept.dataset) == (None, None, None, None)
    else:
        assert (kept.method, kept.created, kept.started) == ("nca", None, None)


@CHECKS
@given(lines=st.lists(st.binary(max_size=9).map(lambda b: b.replace(b"\n", b"")) | st.just(b"a\rb"), max_size=12),
       ended=st.booleans(), count=st.integers(0, 15), block=st.integers(1, 8))
def test_last_lines_start_agrees_with_splitting_the_whole_file(tmp_path_factory, lines, ended, count, block):
    """fslab logs --tail reads a log backwards a block at a time; any bytes (a line without its
    newline yet, empty lines, blocks that cut a line anywhere) give the offset splitting finds."""
    from fslab.core.files import last_lines_start

    data = b"\n".join(lines) + (b"\n" if ended and lines else b"")
    path = tmp_path_factory.mktemp("tail") / "stdout.log"
    path.write_bytes(data)
    pieces = data.split(b"\n")  # lines end at a newline only (a \r of a progress bar ends none), as for tail -n
    whole = [piece + b"\n" for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
    kept = whole[-count:] if count else []
    assert last_lines_start(path, count, block=block) == len(data) - sum(map(len, kept))


@pytest.mark.parametrize(("content", "why"), [
    (b"", "is empty"),
    (b"  \n", "is empty"),
    (b'{"state": "running", "pid"', "is cut short or not JSON (line 1, column 27)"),
    (b'{\n  "state": tru\n}', "is cut short or not JSON (line 2, column 12)"),
    (b"[1, 2]", "holds a JSON list, not an object"),
    (b'"done"', "holds a JSON string, not an object"),
    (b"null", "holds a JSON null, not an object"),
    (b'{"state": "\xff"}', "is not UTF-8 text"),
    (b'{"step": 123456789012345678901}', "is not JSON fslab reads (integer of 21 digits)"),
    (b'{"state": "completed"}', None),
])
def test_a_status_json_that_holds_no_object_says_why_in_its_note(run_folder, content, why):
    """A status.json cut short as it was written, or one edited by hand, was noted 'is not a JSON object'
    whatever was wrong with it: empty, cut mid-way (where), a list, bytes that are no text."""
    folder = run_folder()
    (folder / "status.json").write_bytes(content)
    assert json_object(folder / "status.json")[1] == why
    if why is not None:
        summary = read_summary(folder, save=False)
        assert (summary.state, summary.error) == ("unreadable", f"status.json {why}")
