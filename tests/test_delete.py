"""fslab delete: ended runs leave the store and their sweep records; live runs are refused."""

import json
import os
import pty
import subprocess
import sys
import time

import pytest

from fslab.core.deletion import TRASH, delete_runs
from fslab.core.errors import FslabError
from fslab.core.runstore import Run, create_run
from fslab.core.sweeps import save_sweep

from .runs_helpers import fslab, fslab_here


def ended(runs, seed, state="completed"):
    run = create_run(runs, "nca", {"method": "nca", "seed": seed})
    run.write_status(state=state)
    return run


@pytest.fixture
def store(project):
    """Three ended runs; the first two are a sweep's."""
    runs = project / "runs"
    a, b, c = ended(runs, 0), ended(runs, 1, "failed"), ended(runs, 2, "killed")
    save_sweep(runs, "sweep-20261128-100000-ab12", method="nca", grid={}, seeds=2, runs=[a.id, b.id])
    return runs, a, b, c


def record(runs):
    path = runs / "sweeps" / "sweep-20261128-100000-ab12.json"
    return json.loads(path.read_text())["runs"] if path.exists() else None


def test_a_deleted_run_leaves_the_store_and_its_sweep_record(project, store):
    runs, a, b, c = store
    result = fslab_here("delete", a.id, c.id, "--yes", cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{a.id}: deleted", f"{c.id}: deleted"]
    assert sorted(p.name for p in runs.iterdir()) == sorted([b.id, "sweeps"])  # nothing hidden left either
    assert record(runs) == [b.id]
    listed = fslab_here("runs", "--all", "--json", cwd=project)
    assert [json.loads(line)["id"] for line in listed.stdout.splitlines()] == [b.id]
    # the sweep's last run: the record goes with it
    assert fslab_here("delete", "sweep-20261128", "-y", cwd=project).stdout == f"{b.id}: deleted\n"
    assert record(runs) is None and sorted(p.name for p in runs.iterdir()) == ["sweeps"]


def test_a_queued_or_running_run_is_refused_and_nothing_is_deleted(project, store):
    runs, a, b, c = store
    c.write_status(state="queued")
    result = fslab_here("delete", a.id, c.id, "--yes", cwd=project)
    assert result.returncode == 2
    assert result.stderr == (f"error: cannot delete run {c.id}: it is queued; stop it first (fslab stop {c.id}), "
                             "then delete it; nothing was deleted\n")
    b.write_status(state="queued")
    result = fslab_here("delete", "all", "--yes", cwd=project)
    assert result.returncode == 2
    assert result.stderr == (f"error: cannot delete 2 queued or running runs ({b.id} (queued), {c.id} (queued)); "
                             f"stop them first (fslab stop {b.id} {c.id}), then delete them; nothing was deleted\n")
    assert all(run.path.is_dir() for run in (a, b, c)) and record(runs) == [a.id, b.id]


def test_a_run_this_user_cannot_write_is_refused_before_anything_is_asked_or_deleted(project, store, monkeypatch):
    """A read-only copy of a store (a tar unpacked as another user): fslab delete asked, then said "could not
    delete run ID: Permission denied (runs/ID)", and the dashboard's d the same once answered y. Both now say
    that this user cannot write there before they ask. (Root writes every folder: os.access refuses here.)"""
    from .test_tui import drive, frozen_app, settle

    runs, a, b, c = store
    writable = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: writable(path, mode, **kw)
                        and os.path.abspath(path) != os.path.abspath(runs))
    def line(folder):
        return (f"cannot delete run {a.id}: this user cannot write {folder} (a read-only copy of a store, or another "
                f"user's); nothing was deleted")

    for args in (["delete", a.id, c.id, "--yes"], ["delete", a.id]):  # asked: refused before the question
        result = fslab_here(*args, cwd=project)
        assert (result.returncode, result.stderr, result.stdout) == (1, f"error: {line('runs')}\n", ""), args
    assert all(run.path.is_dir() for run in (a, b, c)) and record(runs) == [a.id, b.id]
    notes = []

    async def body(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        app.screen.table.cursor = app.screen.table.ids.index(a.id)
        await pilot.press("d")
        await settle(app, pilot)
        assert type(app.screen).__name__ == "RunsScreen" and notes == [line(runs.resolve())]

    drive(frozen_app(runs.resolve()), body)
    assert a.path.is_dir()


def test_without_yes_it_asks_and_where_no_one_can_answer_it_refuses(project, store):
    runs, a, b, c = store
    result = fslab("delete", a.id, cwd=project)  # stdin is not a terminal here: a process of its own
    assert result.returncode == 2
    assert result.stderr == (f"error: fslab delete asks before it deletes 1 run ({a.id}), and no one can answer "
                             "here (stdin is not a terminal); add --yes to delete it\n")
    assert a.path.is_dir()
    for answer, kept in (("n", True), ("y", False)):
        leader, follower = pty.openpty()
        worker = subprocess.Popen([sys.executable, "-m", "fslab", "delete", a.id], cwd=project, stdin=follower,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.close(follower)
        os.write(leader, f"{answer}\n".encode())
        out, err = worker.communicate(timeout=60)
        os.close(leader)
        assert f"Delete 1 run for good ({a.id})? [y/N]" in err
        assert worker.returncode == (1 if kept else 0) and a.path.is_dir() == kept, err
        assert out == ("" if kept else f"{a.id}: deleted\n")
    assert record(runs) == [b.id]


def test_a_folder_gone_already_is_said_and_dropped_from_its_sweep(project, store):
    runs, a, b, c = store
    (runs / f"{TRASH}{c.id}-12345").mkdir()  # what a deletion cut short left behind
    os.rename(a.path, runs / "elsewhere")
    os.rename(runs / "elsewhere", project / "elsewhere")  # deleted by hand, still in the sweep's record
    result = fslab_here("delete", "sweep-20261128", "-y", cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{a.id}: gone already (its folder was deleted)", f"{b.id}: deleted"]
    assert sorted(p.name for p in runs.iterdir()) == sorted([c.id, "sweeps"]) and record(runs) is None


CUT_SHORT = """
import sys
from pathlib import Path

from fslab.core import states
from fslab.core.deletion import _delete
from fslab.core.runstore import Run

states.HOST = sys.argv[2]
_delete(Run(Path(sys.argv[1])), Path(sys.argv[1]).parent, {})  # moved to the trash; its files not removed yet
"""


def moved_to_the_trash_by(run, host):
    """The hidden folder an ``fslab delete`` on ``host`` moved ``run`` to, its files not removed yet: that
    process has ended since (its pid runs no process here)."""
    subprocess.run([sys.executable, "-c", CUT_SHORT, str(run.path), host], check=True)
    (trash,) = run.path.parent.glob(f"{TRASH}{run.id}-*")
    return trash


def test_a_folder_another_nodes_fslab_delete_is_removing_is_left_to_it(project, store):
    """A runs folder shared between a cluster's nodes: each fslab delete removed every hidden `.deleting-*`
    folder, one another node's fslab delete was removing still among them. The trash folder names its
    deleter (`.deleting-ID-PID@HOST`) and is removed only once that deleter is gone, judged as a
    temporary file's writer is: on this host by its pid, another host's once untouched for a day."""
    from fslab.core import files, states

    runs, a, b, c = store
    theirs, mine = moved_to_the_trash_by(b, "node-a"), moved_to_the_trash_by(c, states.HOST)
    assert theirs.name.endswith("@node-a") and mine.name.endswith(f"@{states.HOST}")
    deleting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a live fslab delete here
    try:
        live = runs / f"{TRASH}20261128-100000-nca-f00d-{deleting.pid}@{states.HOST}"
        live.mkdir()
        result = fslab_here("delete", a.id, "-y", cwd=project)
        assert result.returncode == 0, result.stderr
        assert (theirs / "status.json").is_file() and live.is_dir() and not mine.exists()  # a killed one's goes
        then = time.time() - files.OTHER_HOST_GONE_AFTER_S - 60  # node-a lost: its folder untouched for a day
        os.utime(theirs, (then, then))
        run = ended(runs, 3)
        assert fslab_here("delete", run.id, "-y", cwd=project).returncode == 0
        assert sorted(p.name for p in runs.iterdir()) == sorted([live.name, "sweeps"])
    finally:
        deleting.kill()
        deleting.wait()


def test_a_folder_that_cannot_be_moved_stops_the_deletion_and_the_records_keep_the_rest(project, store, monkeypatch):
    runs, a, b, c = store
    real = os.rename

    def refuse(source, target):
        if str(source).endswith(b.id):
            raise PermissionError(13, "Permission denied")
        return real(source, target)

    monkeypatch.setattr(os, "rename", refuse)
    with pytest.raises(FslabError, match=rf"^could not delete run {b.id}: Permission denied \("):
        delete_runs(runs, [a, b, c])
    assert not a.path.exists() and b.path.is_dir() and c.path.is_dir()
    assert record(runs) == [b.id]
    assert Run(b.path).status()["state"] == "failed"


def interrupt_removal_of(run, monkeypatch):
    """A Ctrl-C as the files of ``run`` are removed (the longest part of deleting it); returns the real rmtree."""
    import shutil

    from fslab.core import deletion

    real = shutil.rmtree

    def interrupted(path, *args, **kwargs):
        if run.id in str(path):
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    monkeypatch.setattr(deletion.shutil, "rmtree", interrupted)
    return real


def test_ctrl_c_while_a_runs_files_are_removed_says_it_deleted_and_drops_it_from_its_sweep(project, store,
                                                                                          monkeypatch):
    """Removing a run's files is the longest part of deleting it, so where a Ctrl-C lands: the run, moved out
    of the store already, went unsaid, and its id stayed in its sweep's record (fslab runs --sweep then named
    it a folder gone)."""
    from fslab.core import deletion

    runs, a, b, c = store
    real = interrupt_removal_of(b, monkeypatch)
    said = []
    with pytest.raises(KeyboardInterrupt):
        delete_runs(runs, [a, b, c], lambda run_id, outcome: said.append((run_id, outcome)))
    assert said == [(a.id, "deleted"), (b.id, "deleted")]
    assert not a.path.exists() and not b.path.exists() and c.path.is_dir()
    assert record(runs) is None  # both its runs deleted: the sweep's record goes too
    monkeypatch.setattr(deletion.shutil, "rmtree", real)
    assert delete_runs(runs, [c]) == {c.id: "deleted"}  # the next deletion clears what this one left
    assert sorted(p.name for p in runs.iterdir()) == ["sweeps"]


def test_a_run_whose_lock_is_held_is_not_deleted(project, store):
    """A resume holds the run's worker lock while it starts a worker, its status still 'killed':
    deleting the folder under it then would leave a worker without one."""
    from fslab.core import worklock
    from fslab.core.errors import UsageError

    runs, a, b, c = store
    fd = worklock.take(c.path)
    worklock.name_holder(fd)
    try:
        with pytest.raises(UsageError, match=rf"^cannot delete run {c.id}: pid {os.getpid()} on host .* holds its "
                                             r"lock \(a worker, or a launch starting one"):
            delete_runs(runs, [a, c])
    finally:
        os.close(fd)
    assert not a.path.exists() and c.path.is_dir()
    assert delete_runs(runs, [c]) == {c.id: "deleted"} and not c.path.exists()


def test_the_runs_deleted_before_a_failure_are_still_listed(project, store):
    """fslab delete printed its 'ID: deleted' lines only once every run was deleted: a run it could not
    delete (its lock held: resumed meanwhile) ended it with that run's line alone, and the runs it had
    deleted before went unsaid. Each is now said as it is deleted."""
    from fslab.core import worklock

    runs, a, b, c = store
    fd = worklock.take(c.path)
    worklock.name_holder(fd)
    try:
        result = fslab_here("delete", a.id, c.id, "--yes", cwd=project)
    finally:
        os.close(fd)
    assert (result.returncode, result.stdout) == (2, f"{a.id}: deleted\n")
    assert result.stderr.startswith(f"error: cannot delete run {c.id}: pid {os.getpid()} on host ")
    assert not a.path.exists() and c.path.is_dir() and record(runs) == [b.id]


def test_runs_another_user_made_are_deleted_one_lock_holder_at_a_time(project, store, another_users):
    """In a store a group shares, a run's .worker.lock that another user's worker made (rw-r--r--) could not
    be opened to write: fslab delete (and fslab resume) of that run stopped with `its lock file: Permission
    denied`. It is locked read-only (flock locks it the same): a run whose lock another process holds is
    still refused, named by its status.json (the lock's line is the earlier worker's, long gone, and is
    not written over), and the others are deleted."""
    from fslab.core import worklock

    runs, a, b, c = store
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for run in (a, c):
        (run.path / worklock.LOCK_FILE).write_text(f"{gone.pid} {worklock.HOST}\n")
        another_users(run.path / worklock.LOCK_FILE)
    c.write_status(pid=os.getpid(), host=worklock.HOST)  # as a resume of it, this process, records itself
    fd = worklock.take(c.path)
    assert fd is not None
    worklock.name_holder(fd)  # nothing written: the descriptor is read-only
    try:
        result = fslab_here("delete", a.id, c.id, "--yes", cwd=project)
    finally:
        os.close(fd)
    assert (result.returncode, result.stdout) == (2, f"{a.id}: deleted\n")
    assert result.stderr == (f"error: cannot delete run {c.id}: pid {os.getpid()} on host {worklock.HOST} holds "
                             f"its lock (a worker, or a launch starting one: resumed meanwhile?); stop it first\n")
    assert (c.path / worklock.LOCK_FILE).read_text() == f"{gone.pid} {worklock.HOST}\n"
    assert fslab_here("delete", c.id, "--yes", cwd=project).returncode == 0 and not c.path.exists()


def test_runs_ids_hands_a_selection_to_delete(project, store):
    """fslab runs --ids (-q) prints the ids alone, newest first, so a shell can pass them on."""
    runs, a, b, c = store
    assert fslab_here("runs", "--ids", cwd=project).stdout == f"{c.id}\n{b.id}\n{a.id}\n"
    assert fslab_here("runs", "-q", "--limit", "1", cwd=project).stdout == f"{c.id}\n"
    assert fslab_here("runs", "-q", "--state", "queued", cwd=project).stdout == ""  # none: no line at all
    failed = fslab_here("runs", "-q", "--state", "failed,killed", cwd=project).stdout.split()
    assert failed == [c.id, b.id]
    assert fslab_here("delete", *failed, "--yes", cwd=project).returncode == 0
    assert fslab_here("runs", "-q", cwd=project).stdout == f"{a.id}\n"
    both = fslab_here("runs", "-q", "--json", cwd=project)
    assert (both.returncode, both.stderr) == (2, "error: give --ids or --json, not both: --ids prints only the ids, "
                                                 "--json every field\n")


def test_ctrl_c_at_the_question_deletes_nothing_and_says_so_on_its_own_line(project, store):
    import signal

    from .runs_helpers import as_in_a_terminal, wait_for

    runs, a, b, c = store
    leader, follower = pty.openpty()
    with open(project / "delete.err", "w") as err:
        asking = subprocess.Popen([sys.executable, "-m", "fslab", "delete", a.id], cwd=project, stdin=follower,
                                  stdout=subprocess.PIPE, stderr=err, text=True, preexec_fn=as_in_a_terminal)
    os.close(follower)
    try:
        wait_for(lambda: "[y/N]" in (project / "delete.err").read_text(), timeout=60, what="the question")
        asking.send_signal(signal.SIGINT)
        out, _ = asking.communicate(timeout=60)
    finally:
        os.close(leader)
    assert asking.returncode == 130 and out == "" and a.path.is_dir()
    assert (project / "delete.err").read_text().endswith(f"({a.id})? [y/N] \nnothing deleted\n")


def test_a_path_inside_a_run_is_refused_where_its_folder_deletes_it(project, store):
    """fslab delete runs/<id>/metrics.jsonl (a file, as the shell completes one) deleted the whole run."""
    runs, a, b, c = store
    for inside in (f"runs/{a.id}/config.json", f"runs/{a.id}/checkpoints"):
        result = fslab_here("delete", inside, c.id, "--yes", cwd=project)
        assert (result.returncode, result.stdout) == (2, "")
        assert result.stderr == (f"error: '{inside}' is inside run {a.id}'s folder, and this command takes whole runs: "
                                 f"give the run's id or its folder, runs/{a.id}\n")
        assert a.path.is_dir() and c.path.is_dir()
    shown = fslab_here("show", f"runs/{a.id}/config.json", cwd=project)  # a command that only reads takes it still
    assert shown.returncode == 0 and shown.stdout.startswith(a.id), shown.stderr
    assert fslab_here("delete", f"runs/{a.id}/", "-y", cwd=project).stdout == f"{a.id}: deleted\n"  # the folder, whole


def test_a_sweep_whose_record_cannot_be_read_is_deleted_with_its_runs(project, store):
    """A record cut short (not JSON) could only be removed by hand: every command, fslab delete
    included, said it "cannot be read" and nothing else."""
    runs, a, b, c = store
    for run in (a, b):  # the sweep's runs carry its id in their status, as fslab sweep writes it
        run.write_status(sweep="sweep-20261128-100000-ab12")
    path = runs / "sweeps" / "sweep-20261128-100000-ab12.json"
    path.write_text(path.read_text()[:40])
    said = (f"error: sweep record runs/sweeps/{path.name} cannot be read (it must be JSON listing its runs' ids); "
            f"remove it with its runs: fslab delete {path.stem}, or alone: rm runs/sweeps/{path.name}\n")
    for command in (["compare", "ab12"], ["eval", "ab12"], ["stop", "ab12"], ["sweep", "resume", "ab12"]):
        result = fslab_here(*command, cwd=project)
        assert (result.returncode, result.stderr) == (2, said), command
    assert fslab_here("runs", "-q", cwd=project).stdout.split() == [c.id, b.id, a.id]  # the listing goes on
    result = fslab_here("delete", "ab12", "--yes", cwd=project)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sorted(lines[:2]) == sorted([f"{a.id}: deleted", f"{b.id}: deleted"])
    assert lines[2:] == [f"{path.stem}: damaged sweep record deleted"]
    assert sorted(p.name for p in runs.iterdir()) == sorted([c.id, "sweeps"]) and not path.exists()
    path.write_text('{"runs": 3}')  # JSON of the wrong shape, its runs deleted already: the record alone
    once = fslab_here("delete", path.stem, "ab12", "-y", cwd=project)  # named twice: removed, and said, once
    assert once.stdout == f"{path.stem}: damaged sweep record deleted\n"
    assert not path.exists() and c.path.is_dir()


def test_runs_of_a_sweep_whose_folders_are_gone_are_said_by_fslab_runs_sweep(project, store):
    """A run of a sweep removed by hand (rm -r) left fslab runs --sweep listing the others with no word of
    it, where fslab compare of the same sweep names it."""
    import shutil

    runs, a, b, c = store
    shutil.rmtree(a.path)
    said = (f"1 run left out, each one whose folder is gone, though its sweep's record names it: {a.id}\n")
    for extra in ([], ["-q"], ["--json"]):
        result = fslab_here("runs", "--sweep", "ab12", *extra, cwd=project)
        assert (result.returncode, result.stderr) == (0, said), extra
    assert fslab_here("runs", "--sweep", "ab12", "-q", cwd=project).stdout == f"{b.id}\n"
    assert fslab_here("runs", "-q", cwd=project).stderr == ""  # without --sweep no record is read


def test_a_sweep_whose_runs_are_all_gone_is_said_so_and_named_to_fslab_delete(project, store):
    """Every run of a sweep removed by hand: fslab runs --sweep said 'no run belongs to a sweep' and fslab compare
    'none of these runs has saved test accuracies', of runs that are not there."""
    import shutil

    runs, a, b, c = store
    shutil.rmtree(a.path)
    shutil.rmtree(b.path)
    listed = fslab_here("runs", "--sweep", "ab12", cwd=project)
    assert listed.returncode == 0
    assert listed.stdout == ("no runs match --sweep ab12: the 2 runs its record names are all gone, deleted by hand "
                             f"({', '.join(sorted([a.id, b.id]))}); remove the record with: fslab delete ab12\n")
    assert listed.stderr == ""  # that one line: not another naming the same runs as left out
    assert fslab_here("runs", "--sweep", "ab12", "-q", cwd=project).stderr.startswith("2 runs left out, each one whose")
    for command in (["compare"], ["eval"], ["export", "--to", "tensorboard"], ["plot", "epoch"]):
        result = fslab_here(*command, "ab12", cwd=project)
        assert result.returncode == 2 and result.stdout == "", command
        assert result.stderr.startswith(f"error: no runs to {command[0] if command[0] != 'eval' else 'evaluate'}: "
                                        "the 2 runs the sweep's record names are all gone, deleted by hand ("), command
        assert result.stderr.endswith("); remove the record with: fslab delete ab12\n"), command
    deleted = fslab_here("delete", "ab12", cwd=project)  # no --yes: nothing is there to ask about (it asked, of 2 runs)
    assert deleted.returncode == 0 and record(runs) is None, deleted.stderr
    assert sorted(deleted.stdout.splitlines()) == sorted(f"{run.id}: gone already (its folder was deleted)"
                                                         for run in (a, b))
    assert fslab_here("compare", c.id, cwd=project).stderr.startswith("error: none of these runs")  # a run is as before


def test_the_sweep_records_folder_given_as_a_run_says_what_it_holds(project, store):
    """fslab compare runs/sweeps/ (the shell's completion of the records' folder) said 'no run folder
    runs/sweeps', as if a run of that name were missing."""
    said = ("error: runs/sweeps/ holds the sweeps' records, not a run: give a run's id, or where a sweep is taken "
            "its id or its record's path, runs/sweeps/<id>.json (list them with: fslab runs)\n")
    for command in (["compare", "runs/sweeps/"], ["show", "runs/sweeps"], ["delete", "runs/sweeps/", "--yes"]):
        result = fslab_here(*command, cwd=project)
        assert (result.returncode, result.stdout, result.stderr) == (2, "", said), command
    assert (project / "runs" / "sweeps" / "sweep-20261128-100000-ab12.json").exists()


def test_an_id_with_the_slash_of_a_completed_folder_names_its_run_or_sweep(project, store):
    """Completed in runs/ and pasted in the project (2e05/), an id with a trailing slash was taken as a path:
    "'2e05/' is no run's folder in this project's store", for a run and for a sweep alike."""
    runs, a, b, c = store
    shown = fslab_here("show", f"{c.id[-4:]}/", cwd=project)
    assert shown.returncode == 0 and shown.stdout.startswith(c.id), shown.stderr
    result = fslab_here("delete", "ab12/", f"{c.id}/", "--yes", cwd=project)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == sorted(f"{run.id}: deleted" for run in (a, b, c))


def test_last_sweep_in_a_store_without_sweeps_says_there_is_none_yet(project):
    """fslab runs --sweep last with no sweep said "'last' matches no sweep. Sweeps: (none yet)", as if
    'last' were a sweep id mistyped."""
    said = ("error: no sweeps yet: runs/sweeps/ holds no sweep's record, so 'last' names none; start one with: "
            "fslab sweep METHOD --seeds 3\n")
    for command in (["runs", "--sweep", "last"], ["sweep", "resume", "last"]):
        result = fslab_here(*command, cwd=project)
        assert (result.returncode, result.stderr) == (2, said), command


def test_fslab_runs_sweep_of_a_damaged_record_says_how_to_remove_it(project, store):
    """A record that cannot be read, naming no run that is left, was "--sweep X matches no sweep", its
    file there all the same."""
    runs, a, b, c = store
    path = runs / "sweeps" / "sweep-20261202-030000-dead.json"
    path.write_text('{"id": "sweep-20261202-030000-dead", "runs": ["x"')
    result = fslab_here("runs", "--sweep", "dead", cwd=project)
    assert result.returncode == 2
    assert result.stderr == (f"error: sweep record runs/sweeps/{path.name} cannot be read (it must be JSON listing its "
                             f"runs' ids); remove it with its runs: fslab delete {path.stem}, or alone: "
                             f"rm runs/sweeps/{path.name}\n")


def test_ctrl_c_midway_through_fslab_delete_says_how_many_it_deleted_and_exits_130(project, store, monkeypatch):
    """It ended with exit code 130 and the lines of the runs deleted, but no word that it stopped short: the
    last line on stdout read as if it had deleted all it was asked to."""
    from .runs_helpers import fslab_here

    runs, a, b, c = store
    interrupt_removal_of(b, monkeypatch)
    result = fslab_here("delete", a.id, b.id, c.id, "--yes", cwd=project)
    assert (result.returncode, result.stdout) == (130, f"{a.id}: deleted\n{b.id}: deleted\n")
    assert result.stderr == ("fslab delete interrupted after 2 of 3 runs: those said above are deleted, the others "
                             "are as they were (fslab runs lists them)\n")
    assert c.path.is_dir() and Run(c.path).state() == "killed"
