"""Temporary files on a store that several hosts write: a runs folder or a data root shared
between a cluster's nodes. Each temporary names its writer's pid and host
(``files.temporary_path``), and one function (``files.writer_gone``) says whether that writer is
gone, so a node never removes the file a live writer on another node is writing. Two hosts are
simulated by setting the hostname (``states.HOST``) in a writer process and in this one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from fslab.core import files, states

WRITER = """
import sys
from pathlib import Path

from fslab.core import files, states

states.HOST = sys.argv[2]
path = files.temporary_path(Path(sys.argv[1]))
path.write_text("half")
print(path)
"""


def left_by_a_killed_writer(target: Path, host: str) -> Path:
    """The temporary file of ``target`` that a process on ``host`` began and never renamed: the
    process has ended since, so its pid runs no process here."""
    done = subprocess.run([sys.executable, "-c", WRITER, str(target), host], capture_output=True, text=True,
                          check=True)
    return Path(done.stdout.strip())


def a_day_untouched(path: Path) -> None:
    then = time.time() - files.OTHER_HOST_GONE_AFTER_S - 60
    os.utime(path, (then, then))


def test_a_temporary_names_its_writer_pid_and_host(tmp_path, monkeypatch):
    """`.NAME.PID.tmp` told two nodes' files apart by nothing but a pid, which means nothing on the other
    node: the name holds the writer's host too, hidden, and every write-then-rename uses it."""
    monkeypatch.setattr(states, "HOST", "node-a.cluster.example")
    target = tmp_path / "status.json"
    assert files.temporary_path(target) == tmp_path / f".status.json.{os.getpid()}@node-a.cluster.example.tmp"
    with files.written_whole(target) as tmp:
        assert tmp == files.temporary_path(target)
        tmp.write_text("{}")
        assert not files.writer_gone(tmp)  # this process is writing it
    files.atomic_write_json(tmp_path / "results.json", {"test": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "status.json"]


def test_a_killed_writer_on_this_host_is_gone_and_a_live_one_is_not(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    killed = left_by_a_killed_writer(tmp_path / "checkpoints" / "last.pt", states.HOST)
    writing = files.temporary_path(tmp_path / "results.json")  # this process's, alive
    writing.write_text("{")
    assert killed.name.startswith(".last.pt.") and killed.name.endswith(f"@{states.HOST}.tmp")
    assert files.writer_gone(killed) and not files.writer_gone(writing)
    files.remove_orphaned_temporaries(tmp_path)
    assert not killed.exists() and writing.exists()


def test_another_hosts_writer_is_not_judged_by_a_pid_of_this_host(tmp_path, monkeypatch):
    """Node B's worker, starting on a runs folder node A's process was writing into, removed A's
    `.status.json.PID.tmp` because no process PID ran on B. Another host's file is left until it has
    been untouched for OTHER_HOST_GONE_AFTER_S (its node lost), whatever its pid is here; on its own
    host the same file is judged by its pid."""
    writing = left_by_a_killed_writer(tmp_path / "status.json", "node-a")  # its pid: no process here
    mine_alive_here = tmp_path / f".results.json.{os.getpid()}@node-a.tmp"  # a pid that runs here, by chance
    mine_alive_here.write_text("{")
    monkeypatch.setattr(states, "HOST", "node-b")
    assert not files.writer_gone(writing) and not files.writer_gone(mine_alive_here)
    files.remove_orphaned_temporaries(tmp_path)
    assert writing.exists() and mine_alive_here.exists()
    a_day_untouched(mine_alive_here)
    assert files.writer_gone(mine_alive_here)  # node-a's, untouched for a day: gone with its node
    files.remove_orphaned_temporaries(tmp_path)
    assert writing.exists() and not mine_alive_here.exists()
    monkeypatch.setattr(states, "HOST", "node-a")  # on node-a itself, its writer's pid runs no process
    assert files.writer_gone(writing)


def test_host_less_temporaries_of_earlier_versions_are_judged_by_their_pid_as_before(tmp_path):
    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    killed = tmp_path / f".status.json.{gone}.tmp"
    writing = tmp_path / f".results.json.{os.getpid()}.tmp"
    cache_part = tmp_path / f"folder-train-6.0123abcd.u8.{gone}.tmp"  # the image cache's, not hidden
    for path in (killed, writing, cache_part):
        path.write_text("half")
    assert [files.writer_gone(p) for p in (killed, writing, cache_part)] == [True, False, True]
    others = [tmp_path / ".notes.tmp", tmp_path / ".x.abc@node-a.tmp", tmp_path / f".x.{gone}"]  # no temporary's
    assert not any(files.writer_gone(p) for p in others)
    files.remove_orphaned_temporaries(tmp_path)
    assert [p.exists() for p in (killed, writing, cache_part)] == [False, True, True]  # hidden ones only here


def test_a_host_without_a_name_still_sweeps_its_killed_writers_files(tmp_path, monkeypatch):
    """A machine whose hostname is empty wrote `.NAME.PID@.tmp`, which writer_gone took for no temporary
    file at all: its killed writers' files stayed for good."""
    monkeypatch.setattr(states, "HOST", "")
    killed = left_by_a_killed_writer(tmp_path / "status.json", "")
    assert killed.name.endswith("@.tmp") and files.writer_gone(killed)
    files.remove_orphaned_temporaries(tmp_path)
    assert not killed.exists()


def test_a_temporary_name_stays_within_a_file_names_255_bytes(tmp_path, monkeypatch):
    """`.NAME.PID@HOST.tmp` of a long NAME (an evaluation named by a plugin's parameters) on a node whose
    full hostname is long (up to 64 bytes) passed the 255 bytes a file name may have: the write failed with
    "File name too long". The NAME is cut to fit, with a hash of the whole; the pid and host stay whole, so
    writer_gone still judges the file, and two long names that begin alike keep two temporaries."""
    host = "gpu-node-042." + "x" * 40 + ".example"  # 61 bytes
    monkeypatch.setattr(states, "HOST", host)
    targets = [tmp_path / ("é" * 110 + f"-{n}.json") for n in (1, 2)]  # 227 bytes each: fits, as a final name
    temporaries = [files.temporary_path(target) for target in targets]
    assert all(len(os.fsencode(t.name)) <= 255 for t in temporaries)
    assert temporaries[0] != temporaries[1] and temporaries[0] == files.temporary_path(targets[0])
    assert all(t.name.startswith(".éé") and t.name.endswith(f".{os.getpid()}@{host}.tmp") for t in temporaries)
    files.atomic_write_json(targets[0], {"test": 1})
    assert [p.name for p in tmp_path.iterdir()] == [targets[0].name]
    killed = left_by_a_killed_writer(targets[1], host)
    assert killed.parent == tmp_path and len(os.fsencode(killed.name)) <= 255
    assert files.temporary_writer(killed)[1] == host and files.writer_gone(killed)
    files.remove_orphaned_temporaries(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [targets[0].name]


def test_a_temporary_and_a_deletion_name_their_writer_with_one_tag(tmp_path, monkeypatch):
    """`.NAME.PID@HOST.tmp` and fslab delete's `.deleting-ID-PID@HOST` each wrote and parsed the writer's
    PID@HOST with a pattern of their own: one tag now (files.writer_tag), read back by one parser
    (files.parse_writer_tag), so both names are judged alike, a dotted, hyphenated or empty host included."""
    from fslab.core import deletion
    from fslab.core.runstore import Run

    run_id = "20261128-100000-nca-f00d"
    for host in ("node-a.cluster-1.example", ""):
        monkeypatch.setattr(states, "HOST", host)
        tag = files.writer_tag()
        assert tag == f"{os.getpid()}@{host}"
        temporary = files.temporary_path(tmp_path / "status.json")
        trash = deletion._trash(Run(tmp_path / run_id), tmp_path)
        assert temporary.name == f".status.json.{tag}.tmp" and trash.name == f"{deletion.TRASH}{run_id}-{tag}"
        assert files.parse_writer_tag(temporary.name[1:-4], ".") == ("status.json", os.getpid(), host)
        assert files.parse_writer_tag(trash.name[len(deletion.TRASH):], "-") == (run_id, os.getpid(), host)
        assert files.temporary_writer(temporary) == (os.getpid(), host)
        assert not files.writer_gone(temporary) and not deletion.deleter_gone(trash)  # this process, alive
    assert files.parse_writer_tag("status.json.12@a@b", ".") is None and files.parse_writer_tag("x-y@h", "-") is None
