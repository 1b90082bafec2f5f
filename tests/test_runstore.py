"""The run store: ids, atomic files, torn lines, lost runs, lookups."""

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time

import pytest

from fslab.core.config import CONFIG_VERSION
from fslab.core.errors import FslabError, RunNotFound
from fslab.core.files import atomic_write_json, read_events
from fslab.core.runstore import create_run, find_run, list_runs
from fslab.core.states import LOST_AFTER_S
from fslab.core.summary import read_summary


def _create(args):
    runs_dir, barrier_time = args
    while time.time() < barrier_time:  # start every process at the same instant
        pass
    return create_run(runs_dir, "nca", {"method": "nca"}).id


def test_simultaneous_creates_never_share_a_folder(tmp_path):
    start = time.time() + 0.5
    with multiprocessing.get_context("fork").Pool(8) as pool:
        ids = pool.map(_create, [(tmp_path, start)] * 32)
    assert len(set(ids)) == 32
    assert sorted(r.id for r in list_runs(tmp_path)) == sorted(ids)
    for run_id in ids:
        stamp, method = run_id.split("-")[:2], run_id.split("-")[2]
        assert method == "nca" and len(stamp[0]) == 8


def test_create_writes_config_and_queued_status(tmp_path):
    config = {"method": "protonet", "seed": 3, "config_version": CONFIG_VERSION}
    run = create_run(tmp_path, "protonet", config)
    assert run.config() == config
    status = run.status()
    assert status["state"] == "queued" and status["host"] == socket.gethostname()
    assert (run.path / "checkpoints").is_dir()


def test_a_method_with_a_long_name_makes_a_run_id_that_fits_every_name_built_from_it(tmp_path, monkeypatch):
    """A run id holds its method's name, which a plugin may make of any length: a 300-character one made a
    folder name past the 255 bytes a file name may have, and creating the run failed ("File name too long").
    The id holds the name's first bytes with a hash of the whole, room left for the names built from an id
    (fslab delete's `.deleting-ID-PID@HOST`, with a host's full name)."""
    from fslab.core import states
    from fslab.core.deletion import delete_runs

    monkeypatch.setattr(states, "HOST", "gpu-node-042." + "x" * 40 + ".example")
    names = ["m" * 300, "m" * 299 + "n", "nca"]
    runs = [create_run(tmp_path, name, {"method": name}) for name in names]
    assert len({run.id for run in runs}) == 3 and all(len(run.id) <= 90 for run in runs)
    assert "-nca-" in runs[2].id and runs[0].id.split("-")[2].startswith("m" * 40)
    assert sorted(run.config()["method"] for run in list_runs(tmp_path)) == sorted(names)
    for run in runs:
        run.write_status(state="completed")
    assert delete_runs(tmp_path, runs) == {run.id: "deleted" for run in runs} and list_runs(tmp_path) == []


def test_two_writers_of_a_status_never_lose_each_others_fields(tmp_path, monkeypatch):
    """A SLURM submitter records its job id while the job records running, each reading status.json, adding its
    fields and writing it back: one that wrote between the other's read and write was undone (the job id lost,
    and with it fslab stop's way to cancel the job). Each writer now holds .status.lock from read to rename."""
    import threading

    from fslab.core import runstore

    run = create_run(tmp_path, "nca", {"method": "nca"})
    first_read, second_wrote = threading.Event(), threading.Event()
    write = runstore.atomic_write_json

    def first_pauses(path, data):
        if threading.current_thread().name == "first":
            first_read.set()
            second_wrote.wait(timeout=1.0)  # unlocked, the second writes meanwhile; locked, it waits for this one
        write(path, data)

    def second():
        run.write_status(slurm_job_id="77")
        second_wrote.set()

    monkeypatch.setattr(runstore, "atomic_write_json", first_pauses)
    threads = [threading.Thread(target=run.write_status, kwargs={"state": "running", "pid": 4242}, name="first"),
               threading.Thread(target=second, name="second")]
    threads[0].start()
    assert first_read.wait(timeout=30)
    threads[1].start()
    for thread in threads:
        thread.join(timeout=30)
    status = run.status()
    assert (status["state"], status["pid"], status.get("slurm_job_id")) == ("running", 4242, "77"), status


def test_a_stop_writes_killed_only_over_a_status_that_has_not_ended(tmp_path):
    """fslab stop read the status, saw no end, then wrote killed: a worker or a SLURM job recording its own end
    in between was overwritten. The test (states.unended) is now made on the status read under the status
    lock, and where it fails nothing is written."""
    from fslab.core.states import unended

    run = create_run(tmp_path, "nca", {"method": "nca"})
    run.write_status(state="running", pid=4242)
    assert run.write_status(unended, state="killed", error="stopped")["state"] == "killed"
    run.write_status(state="completed", error=None, exit_code=0)
    before = (run.path / "status.json").read_bytes()
    kept = run.write_status(unended, state="killed", error="job 7 cancelled", pid=None)
    assert (kept["state"], kept["error"], kept["pid"]) == ("completed", None, 4242)
    assert (run.path / "status.json").read_bytes() == before


def test_atomic_write_leaves_no_temporary_files(tmp_path):
    path = tmp_path / "status.json"
    for i in range(5):
        atomic_write_json(path, {"i": i})
    assert json.loads(path.read_text()) == {"i": 4}
    assert os.listdir(tmp_path) == ["status.json"]


def test_torn_last_line_waits_and_corrupt_lines_are_counted(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\nnot json\n[1, 2]\n{"step": 2}\n{"step": 3, "lo')
    events, offset, corrupt = read_events(path, 0)
    assert [e["step"] for e in events] == [1, 2] and corrupt == 2
    with open(path, "ab") as fh:
        fh.write(b'ss": 0.5}\n')
    events, offset2, corrupt = read_events(path, offset)
    assert events == [{"step": 3, "loss": 0.5}] and corrupt == 0
    assert offset2 == path.stat().st_size
    assert read_events(path, offset2) == ([], offset2, 0)


def test_a_dead_pid_makes_a_running_run_lost(tmp_path):
    run = create_run(tmp_path, "nca", {})
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    now = time.time()
    run.write_status(state="running", pid=child.pid, heartbeat=now)
    assert run.state() == "lost"
    run.write_status(pid=os.getpid())
    assert run.state() == "running"


def test_a_stale_heartbeat_makes_a_run_lost(tmp_path):
    run = create_run(tmp_path, "nca", {})
    now = time.time()
    run.write_status(state="running", pid=os.getpid(), host="another-host", heartbeat=now)
    assert run.state(now=now + LOST_AFTER_S - 1) == "running"
    assert run.state(now=now + LOST_AFTER_S + 1) == "lost"
    run.write_status(state="completed")
    assert run.state(now=now + 10 * LOST_AFTER_S) == "completed"


def test_find_run_by_id_prefix_substring_and_last(tmp_path):
    a = create_run(tmp_path, "nca", {})
    b = create_run(tmp_path, "protonet", {})
    assert find_run(tmp_path, a.id) == a
    assert find_run(tmp_path, "protonet") == b
    assert find_run(tmp_path, "last") == b
    with pytest.raises(RunNotFound, match="matches 2 runs"):
        find_run(tmp_path, a.id[:8])
    with pytest.raises(RunNotFound, match="no run 'zzz'.*fslab runs"):
        find_run(tmp_path, "zzz")


def test_an_id_that_names_no_run_suggests_the_closest_ids(tmp_path):
    """A mistyped id was 'no run ... List them with: fslab runs', naming none of the runs it was meant for."""
    store = tmp_path / "runs"
    for name in ("20261202-024548-nca-2e05", "20261202-024557-nca-0b03", "20261202-024608-protonet-a5f0"):
        (store / name).mkdir(parents=True)
        (store / name / "config.json").write_text("{}")
    for ref, meant in [("2e06", "'20261202-024548-nca-2e05'"),  # a table's short id, one character off
                       ("20261202-024548-nca-2e5", "'20261202-024548-nca-2e05'"),  # a whole id, one left out
                       ("a5f1", "'20261202-024608-protonet-a5f0'"),
                       ("20261202-024558", "'20261202-024548-nca-2e05' or '20261202-024557-nca-0b03'")]:
        with pytest.raises(RunNotFound) as caught:
            find_run(store, ref)
        assert str(caught.value) == f"no run '{ref}' in {store}. Did you mean {meant}? List them with: fslab runs"
    for ref in ("LAST", "Last", " last"):  # 'last' as a shell or a caps lock gives it
        with pytest.raises(RunNotFound, match=rf"^no run '{ref}' in .*\. Did you mean 'last' \(the newest run\)\?"):
            find_run(store, ref)
    with pytest.raises(RunNotFound, match=r"^no run 'zzzz' in .*\. List them with: fslab runs$"):
        find_run(store, "zzzz")  # nothing close: no guess
    with pytest.raises(RunNotFound, match=r"the path\)\. Did you mean '20261202-024548-nca-2e05'\? List"):
        find_run(store, str(store / "20261202-024548-nca-2e06"))  # a folder's path, as completed, then mistyped


def test_find_run_by_the_path_of_its_folder_inside_the_store_only(tmp_path, monkeypatch):
    """A path, as the shell completes one (runs/<id>/), named no run: 'no run 'runs/...' in runs'.
    A path inside the store names the run whose folder holds it, whole; one elsewhere is one line."""
    monkeypatch.chdir(tmp_path)
    store = tmp_path / "runs"
    a, b = create_run(store, "nca", {}), create_run(store, "protonet", {})
    for ref in (f"runs/{a.id}", f"./runs/{a.id}/", str(store / a.id), f"runs/{a.id}/config.json",
                f"runs/../runs/{a.id}"):
        assert find_run(store, ref).id == a.id, ref
    assert find_run(store, f"runs/{b.id}").id == b.id
    with pytest.raises(RunNotFound, match=rf"^no run folder {store}/2026 \(a path names a run's folder whole"):
        find_run(store, "runs/2026")  # a prefix of both ids: a path is not a part of an id
    other = create_run(tmp_path / "elsewhere" / "runs", "nca", {})
    for ref in (other.path, other.path / "checkpoints" / "last.pt"):
        with pytest.raises(RunNotFound, match=rf"^'{ref}' belongs to a run of another store \({other.path.parent}/\)"):
            find_run(store, str(ref))
    (tmp_path / "elsewhere" / "config.json").write_text("{}")  # a project's own config.json: no run's
    with pytest.raises(RunNotFound, match=r"is no run's folder in this project's store"):
        find_run(store, str(tmp_path / "elsewhere"))
    with pytest.raises(RunNotFound, match=r"^'runs/' is no run's folder in this project's store"):
        find_run(store, "runs/")
    monkeypatch.chdir(a.path)  # fslab show . in a run's folder: a run of the store seen from there
    with pytest.raises(RunNotFound, match=rf"^'\.' belongs to a run of another store \({store}/\)"):
        find_run(a.path / "runs", ".")
    with pytest.raises(RunNotFound, match=rf"^'{tmp_path}/nowhere/x' is no run's folder"):
        find_run(store, str(tmp_path / "nowhere" / "x"))


def test_summary_takes_the_last_step_and_the_best_validation_from_a_long_file(tmp_path):
    run = create_run(tmp_path, "nca", {"method": "nca", "evaluator": {"name": "centroid"}})
    val = {"event": "eval", "split": "val", "ways": 5, "shots": 5, "queries": 15, "episodes": 100,
           "evaluator": "centroid", "epoch": 1}
    with open(run.metrics_path, "w") as fh:
        fh.write(json.dumps({**val, "accuracy": 0.5, "ci95": 0.01}) + "\n")
        for step in range(3000):
            fh.write(json.dumps({"event": "train", "step": step, "epoch": 1, "loss": 1.0 / (step + 1),
                                 "pad": "x" * 40}) + "\n")
        fh.write(json.dumps({**val, "epoch": 2, "accuracy": 0.4, "ci95": 0.02}) + "\n")
    summary = read_summary(run.path)
    assert summary.step == 2999 and summary.loss == 1 / 3000
    # the first evaluation, far from the end
    assert summary.best_val == {"accuracy": 0.5, "ci95": 0.01, "episodes": 100, "epoch": 1}
    assert read_summary(create_run(tmp_path, "nca", {}).path).step is None


def test_newest_first_reads_the_runs_of_a_day_only_when_the_listing_reaches_it(tmp_path, monkeypatch):
    """fslab runs lists the newest 50: ordering a store by creation time must not read the status of every
    run, only of those stamped within a day (the widest spread of time zones) of the runs the listing reaches;
    a second's runs (a sweep's) follow their creation times."""
    import itertools

    from fslab.core import runstore

    days = ("20260101-00000", "20260103-00000")  # two days apart: no time zone puts them the other way round
    names = [f"{day}{second}-nca-{suffix}" for day in days for second in (0, 1) for suffix in ("aaaa", "bbbb")]
    base = {days[0]: 1767225600.0, days[1]: 1767398400.0}  # each day's midnight, in UTC
    created = {name: base[name[:14]] + int(name[14]) + 0.1 * (name[-4:] == "aaaa") for name in names}
    for name in names:  # made against the suffixes' order within each second
        (tmp_path / name).mkdir()
        runstore.Run(tmp_path / name).write_status(state="completed", created=created[name])
    read = []
    real = runstore._created
    monkeypatch.setattr(runstore, "_created", lambda run: read.append(run.id) or real(run))
    first = list(itertools.islice(runstore.newest_first(tmp_path, sorted(names)), 2))
    assert first == ["20260103-000001-nca-aaaa", "20260103-000001-nca-bbbb"]  # created last: listed first
    assert sorted(read) == [n for n in names if n.startswith(days[1])]
    assert list(runstore.newest_first(tmp_path, sorted(names))) == list(
        reversed(runstore.in_creation_order(tmp_path, sorted(names))))


def test_an_event_is_kept_exactly_when_each_field_of_its_kind_has_a_kind_it_allows():
    """schemas.event, written as loops (a run of 200,000 steps checks a million values for fslab show),
    against the rule spelt out: every field its kind needs, of an allowed kind, and each optional
    field it has of an allowed kind; every field missing or given a value of each JSON kind in turn."""
    import itertools

    from fslab.core.schemas import EVENT_OPTIONS, EVENTS, SCORE, event, is_kind

    values = [None, True, 0, 3, -2, 0.5, 1.5, float("nan"), float("inf"), "x", [], {}, {"1-shot": {}}]
    allowed = lambda value, kinds: any(is_kind(value, kind) for kind in kinds)
    cases = 0
    for kind, needed in EVENTS.items():
        good = {"event": kind, "step": 1, "epoch": 1, "loss": 1.0, "split": "val", "ways": 5, "shots": 1,
                "queries": 15, "episodes": 10, "accuracy": 0.5, "ci95": 0.01, "epochs": 3,
                "results": {"1-shot": {"accuracy": 0.5, "ci95": 0.01}}}
        fields = [*needed, *EVENT_OPTIONS.get(kind, {})]
        for field, value in itertools.product(fields, [*values, "missing"]):
            record = {k: v for k, v in good.items() if k != field or value != "missing"}
            if value != "missing":
                record[field] = value
            expected = (all(k in record and allowed(record[k], kinds) for k, kinds in needed.items())
                        and all(k not in record or allowed(record[k], kinds)
                                for k, kinds in EVENT_OPTIONS.get(kind, {}).items())
                        and (kind != "end" or all(isinstance(s, dict) and all(k in s and allowed(s[k], ks)
                                                                              for k, ks in SCORE.items())
                                                  for s in record["results"].values())))
            assert (event(record) is record) == expected, (kind, field, value)
            cases += 1
    assert cases > 150 and event({"event": "note", "time": "any"}) is not None and event({"event": 3}) is None


def test_short_ids_of_many_runs_are_those_the_scan_of_every_end_gives(tmp_path, monkeypatch):
    """short_ids counted each end by scanning all the names joined, for each id: 4 s for fslab runs --all
    over 10,000 runs. Many ids now count in an index of the names' pieces; the ids must not change,
    on names made to trip it: ends repeated inside other names, pieces that overlap themselves, names
    that start others, names shorter than a short id, runs made in the same second."""
    from fslab.core import runstore
    from fslab.core.runstore import matching_names, run_names, short_ids

    runs = tmp_path / "runs"
    rng = __import__("random").Random(5)
    names = [f"20260101-1000{i % 3:02d}-nca-{rng.randrange(4096):03x}{rng.choice('0a')}" for i in range(400)]
    names += ["20260101-100000-run1", "20260101-100000-run12", "20260101-100000-run123", "aaaa", "aaaaa",
              "xaaaaaaa", "ab", "0000-nca-0000", "20260101-100001-nca-2026", "nca-2026", "x-1000"]
    for name in set(names):
        (runs / name).mkdir(parents=True)
    every = run_names(runs)
    ids = list(reversed(every))
    monkeypatch.setattr(runstore, "SHORT_IDS_SCAN_UP_TO", len(ids))
    scanned = short_ids(runs, ids)
    monkeypatch.setattr(runstore, "SHORT_IDS_SCAN_UP_TO", 0)
    indexed = short_ids(runs, ids)
    assert indexed == scanned
    assert sum(short != run_id for run_id, short in indexed.items()) > 300  # most are shortened
    assert all(matching_names(short, every) == [run_id] for run_id, short in indexed.items())


def test_a_run_in_a_runs_folder_that_is_a_file_says_it_is_a_file(tmp_path):
    # the file made after the command's check (the dashboard's launch): not "File exists"
    (tmp_path / "runs").write_text("x")
    with pytest.raises(FslabError, match=r"^cannot create the runs folder .*runs: it is a file; move or rename it$"):
        create_run(tmp_path / "runs", "nca", {})
    assert (tmp_path / "runs").read_text() == "x"


def test_a_write_the_disk_refuses_names_the_file_it_was_for(tmp_path):
    """A write-then-rename the disk refused (full, or past the file-size limit) raised `No space left on
    device` naming no file, so fslab eval's scores on a full disk ended in that line alone. RLIMIT_FSIZE
    refuses the write as a full disk does; the temporary file goes, the file before stays."""
    target = tmp_path / "scores.json"
    target.write_text("{}\n")
    code = ("import resource, sys; from pathlib import Path; from fslab.core.files import atomic_write_json\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))\n"
            "try:\n    atomic_write_json(Path(sys.argv[1]), {'accuracies': [0.5] * 100})\n"
            "except OSError as exc:\n    print(exc.strerror, exc.filename, sep='|')\n")
    done = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, timeout=60)
    assert done.stdout == f"File too large|{target}\n", done.stderr
    assert target.read_text() == "{}\n" and sorted(p.name for p in tmp_path.iterdir()) == ["scores.json"]
