"""The one flock helper behind the worker lock, the scheduler's slots and the
study queue's lock: a real second process holds the lock, and dies holding it."""

import errno
import fcntl
import os
import signal
import subprocess
import sys
import time

import pytest

from fslab.core import flocks
from fslab.core.flocks import take_lock, write_holder

HOLD = ("import sys, time\nfrom fslab.core.flocks import take_lock\n"
        "fd = take_lock(sys.argv[1], holder=sys.argv[2])\n"
        "print('held' if fd is not None else 'refused', flush=True)\ntime.sleep(120)\n")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def holder_process(tmp_path):
    """A process holding ``tmp_path/x.lock``, started and its line read."""
    path = tmp_path / "x.lock"
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(path), "123 somehost study-a"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        yield path, process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_a_held_lock_is_refused_then_taken_once_its_holder_dies(holder_process):
    path, process = holder_process
    assert path.read_text() == "123 somehost study-a\n"  # the holder's line, nothing else
    before = open_fds()
    started = time.monotonic()
    assert take_lock(path, wait=0.3) is None
    assert time.monotonic() - started >= 0.3  # retried for the whole wait
    assert take_lock(path) is None  # no wait: one try
    assert open_fds() == before  # a refusal leaves no descriptor open
    process.send_signal(signal.SIGKILL)  # dies without unlocking: the kernel frees it
    process.wait()
    fd = take_lock(path, wait=5, holder="456 here")
    assert fd is not None
    try:
        assert path.read_text() == "456 here\n"  # the shorter line replaced the longer one whole
        with open(path) as other:  # another descriptor of the same file is refused while held
            with pytest.raises(BlockingIOError):
                fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_a_waiter_takes_the_lock_its_holder_releases_within_the_wait(holder_process):
    path, process = holder_process
    killer = subprocess.Popen(["sh", "-c", f"sleep 0.3; kill -9 {process.pid}"])
    try:
        fd = take_lock(path, wait=10)
        assert fd is not None and process.wait(timeout=10) == -signal.SIGKILL
        os.close(fd)
    finally:
        killer.wait()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_reopen_takes_only_the_file_still_at_the_path(tmp_path):
    """A holder that removes its lock file when done: a waiter holding the old,
    removed file would hold nothing, so it opens the new one."""
    path = tmp_path / "q.lock"
    old = take_lock(path, holder="1 a old")
    stale = os.open(path, os.O_RDWR)  # a waiter that opened it before its removal
    os.unlink(path)
    os.close(old)  # released: the stale descriptor can lock the removed file
    opened = [stale]
    fd = take_lock(path, wait=5, reopen=True, opener=lambda: opened.pop() if opened else flocks.open_lock(path))
    assert fd is not None and not opened
    assert os.fstat(fd).st_nlink == 1 and path.exists()  # the file at the path, not the removed one
    before = open_fds()
    assert take_lock(path, wait=0.05, reopen=True) is None  # held by fd, and reopened each try
    assert open_fds() == before  # each refused try closed what it opened
    os.close(fd)


def test_an_opener_may_say_try_again(tmp_path):
    path, tries = tmp_path / "late.lock", []

    def opener():
        tries.append(1)
        return flocks.open_lock(path) if len(tries) >= 3 else None

    fd = take_lock(path, wait=5, poll=0.001, reopen=True, opener=opener)
    assert fd is not None and len(tries) == 3
    os.close(fd)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_a_filesystem_without_flock_raises_and_closes(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(flocks.fcntl, "flock", no_flock)
    before = open_fds()
    with pytest.raises(OSError) as raised:
        take_lock(tmp_path / "n.lock", wait=1)
    assert raised.value.errno == errno.ENOLCK and open_fds() == before


def test_write_holder_replaces_the_line(tmp_path):
    fd = take_lock(tmp_path / "w.lock")
    try:
        write_holder(fd, "99999 a-long-host-name")
        write_holder(fd, "7 h")
        assert (tmp_path / "w.lock").read_text() == "7 h\n"
    finally:
        os.close(fd)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_a_status_update_waits_for_its_lock_and_goes_on_without_one_held_too_long(holder_process):
    """briefly_held (status.json's lock) waited for ever on a holder paused (SIGSTOP) mid-update: every stop
    or end state of the run then hung. It waits its bound, then goes on unlocked, leaving no descriptor open;
    a holder that lets go within the bound is waited for."""
    from fslab.core.flocks import briefly_held

    path, process = holder_process
    before = open_fds()
    started = time.monotonic()
    with briefly_held(path, wait=0.3) as held:
        assert held is False and time.monotonic() - started >= 0.3
    assert open_fds() == before
    killer = subprocess.Popen(["sh", "-c", f"sleep 0.3; kill -9 {process.pid}"])
    try:
        with briefly_held(path, wait=30) as held:
            assert held is True and process.wait(timeout=10) == -signal.SIGKILL
    finally:
        killer.wait()
    assert open_fds() == before


def _held_by_a_thread_for(path, seconds: float) -> tuple:
    """A thread holding ``path`` exclusively through a read-only descriptor of its own for ``seconds``, as
    another user's process holds it; returns (the thread, its events: when it let go)."""
    import threading

    events, locked = [], threading.Event()

    def hold():
        fd = os.open(path, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        locked.set()
        time.sleep(seconds)
        events.append("let go")
        os.close(fd)

    thread = threading.Thread(target=hold)
    thread.start()
    assert locked.wait(timeout=10)
    return thread, events


def test_a_status_update_waits_for_a_lock_file_this_user_cannot_write(tmp_path, another_users):
    """A run's .status.lock another user made (a store a group shares) was not locked at all: briefly_held
    yielded False at once and two status updates read and rewrote status.json together, one losing the
    other's fields. It is locked read-only (flock locks it the same): the update waits for the holder."""
    from fslab.core.flocks import briefly_held

    path = tmp_path / ".status.lock"
    path.write_text("")
    another_users(path)
    holder, events = _held_by_a_thread_for(path, 0.3)
    with briefly_held(path, wait=30) as held:
        events.append("updating")
    holder.join(timeout=10)
    assert held is True and events == ["let go", "updating"]


def test_a_scheduler_is_seen_alive_though_its_presence_file_is_another_users(tmp_path, another_users):
    """A scheduler whose runs/.slots/schedulers.lock another user made held no lock on it (hold_shared gave
    None), so fslab queue and the next sweep saw no scheduler and started a second one. It holds it
    read-only: is_held sees it, and an exclusive lock is refused while it lives."""
    from fslab.core.flocks import hold_shared, is_held

    path = tmp_path / "schedulers.lock"
    path.write_text("")
    another_users(path)
    fd = hold_shared(path)
    assert fd is not None and is_held(path) is True
    os.close(fd)
    assert is_held(path) is False


WAITER = ("import sys\nfrom pathlib import Path\nfrom fslab.core.flocks import one_at_a_time\n"
          "with one_at_a_time(Path(sys.argv[1]), lambda holder: f'waiting for the export{holder}'):\n"
          "    print(Path(sys.argv[1]).read_text(), end='', flush=True)\n")


def test_a_waiter_names_the_holder_s_host_and_says_when_it_is_another_machine(tmp_path):
    """The second of two exports (or embeddings) at once said `waiting for the export (pid 4242)`: on a
    runs folder shared between machines that pid may be no process here, or another one. The lock file
    names its holder's host too, and the waiting line names it, saying when it is another machine;
    a file of earlier versions (a pid alone) is still named by its pid."""
    from fslab.core.states import HOST

    path = tmp_path / ".export-csv.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path), "4242 node-b"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        waiter = subprocess.Popen([sys.executable, "-c", WAITER, str(path)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        assert waiter.stderr.readline() == "waiting for the export (pid 4242 on host node-b, another machine)\n"
        holder.kill()
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0 and out == f"{waiter.pid} {HOST}\n", err  # its own line, while it held it
        assert not path.exists()
    finally:
        holder.kill()
        holder.wait()
    me = os.getpid()  # a process of this host that lives (a gone one is no holder: it is said not recorded)
    for line, said in ((f"{me} {HOST}\n", f"pid {me} on host {HOST}"), (f"{me}\n", f"pid {me}"), ("", ""),
                       ("x y\n", "")):
        path.write_text(line)
        assert flocks.held_by(path) == said


READ_ONLY_HOLD = ("import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDONLY)\n"
                  "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(120)\n")


def test_a_waiter_names_no_earlier_holder_of_a_lock_file_held_read_only(tmp_path):
    """A holder that locks the file read-only (another user's fslab, in a store a group shares) writes no
    line, so the line is an earlier holder's: where this user could write the file, the waiting line named
    that pid, long gone, or a process that now has it, as the holder. It names only a process the kernel
    lists holding the lock; any other is said not recorded."""
    from fslab.core.states import HOST

    path = tmp_path / ".export-csv.lock"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    path.write_text(f"{gone.pid} {HOST}\n")  # the earlier holder's line, which it wrote while it held the lock
    holder = subprocess.Popen([sys.executable, "-c", READ_ONLY_HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert flocks.held_by(path) == (f"its holder is not recorded: {path} names pid {gone.pid} on host {HOST}, "
                                        f"an earlier holder, which does not hold it")
        path.write_text(f"{os.getpid()} {HOST}\n")  # a live process, not the holder (its pid used again, say)
        waiter = subprocess.Popen([sys.executable, "-c", WAITER, str(path)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        assert waiter.stderr.readline() == (f"waiting for the export (its holder is not recorded: {path} names "
                                            f"pid {os.getpid()} on host {HOST}, an earlier holder, which does not "
                                            f"hold it)\n")
        holder.kill()
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0 and out == f"{waiter.pid} {HOST}\n", err
    finally:
        holder.kill()
        holder.wait()


def test_lock_and_claim_files_are_made_as_the_umask_says_as_every_other_file_of_a_store(tmp_path):
    """Lock and claim files were made 0o644 whatever the umask: under a lab's group umask (002) every
    other file of a shared store was group-writable, those not, and another user of the group could not
    lock or claim them. They are made as open() makes a file."""
    import stat

    from fslab.core.runstore import Run
    from fslab.core.sweeps import new_sweep_id

    old = os.umask(0o002)
    try:
        (tmp_path / "plain").write_text("")
        os.close(flocks.open_lock(tmp_path / "a.lock"))
        run = Run(tmp_path / "runs" / "20261203-000000-nca-ab12")
        run.path.mkdir(parents=True)
        assert run.claim()
        new_sweep_id(tmp_path / "runs")
    finally:
        os.umask(old)
    made = [tmp_path / "a.lock", run.path / ".claimed", *(tmp_path / "runs" / "sweeps").iterdir()]
    assert [stat.S_IMODE(p.stat().st_mode) for p in made] == [0o664] * len(made)
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o664
