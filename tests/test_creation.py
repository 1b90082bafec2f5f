"""The one creation order (fslab.core.creation): ids begin with their host's local time, and a store shared
by hosts in other time zones, or runs made across a DST fall-back hour, are still listed, and ``last`` named,
in the order they were made, by every surface: fslab runs, fslab show last, completion, the dashboard, sweeps."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

from hypothesis import given
from hypothesis import strategies as st


@contextlib.contextmanager
def zone(name: str):
    """This process's local time zone is ``name`` (as TZ=... sets a host's) until the block ends."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()


class Clock:
    """The ``time`` module as runstore and sweeps call it, at a time this test sets (a UNIX time)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def strftime(self, fmt: str, when=None) -> str:
        return time.strftime(fmt, time.localtime(self.now) if when is None else when)


def fslab(*args: str, cwd, tz: str = "Asia/Tokyo") -> subprocess.CompletedProcess:
    """The real CLI, run on a host in yet another time zone (the reader's zone changes nothing)."""
    return subprocess.run([sys.executable, "-m", "fslab", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TZ": tz})


def test_runs_made_in_three_time_zones_are_listed_and_named_in_the_order_they_were_made(project):
    """A laptop in Berlin, a cluster in UTC and a site in New York share one store: each makes a run a
    second after the one before, and the New York one, whose id reads six hours earlier, is the newest."""
    from fslab.cli.common import run_ids
    from fslab.core.runstore import create_run, in_creation_order, run_names
    from fslab.core.summary import list_summaries
    from fslab.tui.model import sort_rows

    runs_dir = project / "runs"
    made = []
    for tz in ("Europe/Berlin", "UTC", "America/New_York"):
        with zone(tz):
            made.append(create_run(runs_dir, "nca", {"method": "nca"}).id)
        time.sleep(0.01)
    assert sorted(made) != made  # the ids' local times are out of the order the runs were made in
    newest_first = made[::-1]
    assert fslab("show", "last", cwd=project).stdout.split()[0] == made[-1]
    assert fslab("runs", "-q", cwd=project).stdout.split() == newest_first
    assert in_creation_order(runs_dir, run_names(runs_dir)) == made
    summaries = list_summaries(runs_dir)
    assert [s.id for s in summaries] == newest_first
    assert [s.id for s in sort_rows(list(reversed(summaries)), "id", True, time.time())] == newest_first
    assert run_ids("") == ["last", *newest_first]  # completion: the dashboard's and fslab runs' order


def test_a_run_made_after_a_dst_fall_back_is_the_newest(project, monkeypatch):
    """Berlin, 25 October 2026: at 03:00 CEST clocks go back to 02:00 CET. A run made at 02:30 CEST and one
    made forty minutes later, at 02:10 CET: the second's id reads earlier, and it is the newest."""
    from fslab.core import runstore

    runs_dir = project / "runs"
    clock = Clock(1792888200.0)  # 2026-10-25 00:30 UTC: 02:30 CEST
    monkeypatch.setattr(runstore, "time", clock)
    with zone("Europe/Berlin"):
        before = runstore.create_run(runs_dir, "nca", {"method": "nca"}).id
        clock.now += 40 * 60  # 01:10 UTC: 02:10 CET
        after = runstore.create_run(runs_dir, "nca", {"method": "nca"}).id
    assert before.startswith("20261025-023000") and after.startswith("20261025-021000")
    assert runstore.find_run(runs_dir, "last").id == after
    assert fslab("runs", "-q", cwd=project).stdout.split() == [after, before]
    assert fslab("show", "last", cwd=project).stdout.split()[0] == after


def test_the_last_sweep_is_the_one_made_last_whatever_its_hosts_time_zone(project):
    from fslab.cli.common import sweep_ids
    from fslab.core.runstore import create_run
    from fslab.core.sweeps import new_sweep_id, save_sweep, sweep_name, sweep_records

    runs_dir = project / "runs"
    made, runs = [], []
    for tz in ("Europe/Berlin", "America/New_York"):
        with zone(tz):
            made.append(new_sweep_id(runs_dir))
            runs.append(create_run(runs_dir, "nca", {"method": "nca"}, sweep=made[-1]).id)
            save_sweep(runs_dir, made[-1], method="nca", grid={}, seeds=1, fail_fast=False, runs=runs[-1:])
        time.sleep(0.01)
    assert sorted(made) != made
    assert sweep_name(runs_dir, "last") == made[-1]
    assert [record["id"] for record in sweep_records(runs_dir)] == made
    assert sweep_ids("") == ["last", *made[::-1]]
    assert fslab("runs", "--sweep", "last", "-q", cwd=project).stdout.split() == runs[-1:]


HOUR = 3600.0
STAMPS = st.integers(min_value=1767225600, max_value=1767225600 + 6 * 24 * 3600)  # a week of 2026


@st.composite
def stores(draw):
    """Run ids stamped in some zone from UTC-12 to UTC+14 (each at its creation time), a few with a time
    outside every zone's (a clock set wrong), none, or of folders named by hand."""
    runs = {}
    for number in range(draw(st.integers(0, 25))):
        made = draw(STAMPS) + draw(st.sampled_from([0.0, 0.25, 0.5]))
        offset = draw(st.integers(-12, 14)) * HOUR
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(made + offset))
        kind = draw(st.sampled_from(["made", "made", "made", "wrong", "none", "hand"]))
        name = f"{stamp}-nca-{number:04x}" if kind != "hand" else f"copy-{number}"
        runs[name] = {"made": made, "wrong": made + draw(st.sampled_from([-3, 3])) * 24 * HOUR,
                      "none": None, "hand": made}[kind]
    return runs


@given(stores())
def test_the_walk_from_the_newest_id_gives_the_order_of_the_key_and_reads_no_more_than_it_must(runs):
    """fslab.core.creation.newest_first, which reads a creation time only where the order needs it, gives
    the order of sorting by creation_key, which the dashboard does; and within every zone's window, the
    runs are in the order they were made."""
    from fslab.core.creation import AHEAD, BEHIND, creation_key, newest_first, stamp_time

    read = []
    walked = list(newest_first(sorted(runs), lambda name: read.append(name) or runs[name]))
    assert walked == sorted(runs, key=lambda name: creation_key(name, runs[name]), reverse=True)
    made = [name for name in walked if name[:1] == "2" and runs[name] is not None
            and -AHEAD <= runs[name] - stamp_time(name[:15]) <= BEHIND]
    assert made == sorted(made, key=lambda name: (runs[name], name), reverse=True)
    stamped = [stamp_time(name[:15]) for name in runs if name[:1] == "2"]
    if stamped:  # the newest alone: only the runs stamped within a day and a bit of the newest stamp are read
        read.clear()
        assert next(newest_first(sorted(runs), lambda name: read.append(name) or runs[name])) == walked[0]
        assert read and all(stamp_time(name[:15]) >= max(stamped) - AHEAD - BEHIND for name in read)


def test_stamps_in_the_order_of_their_text_have_times_in_that_order():
    """A folder named by hand with a stamp past its fields' ranges keeps the order of its text (the walk
    relies on it), and text that is no stamp has none."""
    from fslab.core.creation import stamp_time

    texts = ["20251231-235959", "20260101-000000", "20260101-005959", "20260101-006000", "20260101-009999",
             "20260101-010000", "20260101-235959", "20260101-240000", "20260131-000000", "20260132-000000",
             "20260199-999999", "20260200-000000", "20260201-000000", "20261399-000000", "20270101-000000"]
    times = [stamp_time(text) for text in texts]
    assert times == sorted(times)
    assert stamp_time("20260101-010000") - stamp_time("20260101-000000") == 3600
    assert [stamp_time(text) for text in ("copy-1", "20260101_000000", "2026010-1000000", "２0260101-000000")] \
        == [None] * 4
