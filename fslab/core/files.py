"""Plain-file primitives of the run store.

Writers replace a file whole (write a temporary file, then rename it) or append
one complete line at a time; readers therefore see an old file or a new one,
never half of one, and never trust a last line without its newline (it may
still be being written). :class:`Tail` is the one reader of appended bytes:
the worker's progress bar, ``fslab logs --follow``, the run summaries and the
dashboard all read new lines through it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fslab.core import states

# What the system answers when the store refuses a write (a read-only store, another user's, a full
# disk): the user's to fix outside fslab, exit 1, unlike something standing where fslab's file goes.
REFUSED = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC)


# The mode fslab's os.open calls make files with, as open() makes them: the umask decides who else may
# write them (a lab's group umask 002 shares a store's lock and claim files as it shares every other file).
NEW_FILE_MODE = 0o666
NAME_MAX = 255  # the bytes a file name may have (Linux's and macOS's file systems)


def fitting_name(name: str, room: int = NAME_MAX) -> str:
    """``name`` as it is where it fits in ``room`` bytes; otherwise its beginning, cut to fit, then ``~``
    and 12 hex digits of a hash of the whole name, so two long names that begin alike stay apart, and
    one name is always cut the same way."""
    encoded = os.fsencode(name)
    if len(encoded) <= room:
        return name
    kept, size = [], 0
    for char in name:  # whole characters only: a cut inside one would leave bytes of no character
        size += len(os.fsencode(char))
        if size > room - 13:
            break
        kept.append(char)
    return "".join(kept) + "~" + hashlib.sha256(encoded).hexdigest()[:12]


def temporary_path(path: Path) -> Path:
    """Where this process writes ``path`` before renaming it into place:
    ``.NAME.PID@HOST.tmp`` beside it, hidden, naming the writer's pid and host, which
    :func:`writer_gone` reads (a runs folder or a data root may be shared between nodes).
    A name that would pass :data:`NAME_MAX` bytes (a long ``path`` name, a host's full name of up
    to 64 bytes) has its NAME cut to fit (:func:`fitting_name`); the pid and host stay whole."""
    writer = f".{writer_tag()}.tmp"
    return path.with_name("." + fitting_name(path.name, NAME_MAX - 1 - len(os.fsencode(writer))) + writer)


def writer_tag() -> str:
    """``PID@HOST``: this process and its host, as the hidden names it leaves while it works end with (a
    :func:`temporary_path`'s, a run folder :mod:`fslab.core.deletion` is removing), and
    :func:`parse_writer_tag` reads back for :func:`process_gone` to judge."""
    return f"{os.getpid()}@{states.HOST}"


def parse_writer_tag(text: str, separator: str) -> tuple[str, int, str] | None:
    """(what comes before, pid, host) of ``text`` where it ends with ``separator`` and a
    :func:`writer_tag` (a host may have no name, and never holds ``@`` or ``/``); None otherwise."""
    found = re.fullmatch(rf"(?P<head>.+){re.escape(separator)}(?P<pid>\d+)@(?P<host>[^@/]*)", text)
    return None if found is None else (found["head"], int(found["pid"]), found["host"])


# A temporary file of another host is not this one's to judge by its pid; left untouched this long (a
# writer writes to it as it goes, and a whole checkpoint or decode takes minutes), its writer is taken
# for gone with its node. Long, so a job a cluster suspended for hours keeps its half-written file.
OTHER_HOST_GONE_AFTER_S = 24 * 3600.0

_HOSTLESS = re.compile(r"\.?(?P<name>.+)\.(?P<pid>\d+)\.tmp")  # what fslab wrote before the host was named


def writer_gone(path: Path) -> bool:
    """Whether the writer of the temporary file ``path`` (a :func:`temporary_path`) is gone, so the file
    will never be renamed into place and may be removed (:func:`process_gone`'s rule). A name without a
    host (``.NAME.PID.tmp``, as earlier fslab versions wrote) is judged by its pid here, as it was then; a
    name that is no temporary file's never is gone."""
    writer = temporary_writer(path)
    return writer is not None and process_gone(*writer, path)


def temporary_writer(path: Path) -> tuple[int, str | None] | None:
    """The pid and host a :func:`temporary_path` names (host None for the host-less names of earlier
    versions); None for a name that is no temporary file's."""
    name = Path(path).name
    if name.startswith(".") and name.endswith(".tmp") and (tagged := parse_writer_tag(name[1:-4], ".")):
        return tagged[1], tagged[2]
    found = _HOSTLESS.fullmatch(name)
    return None if found is None else (int(found["pid"]), None)


def process_gone(pid: int, host: str | None, path: Path) -> bool:
    """Whether process ``pid`` of ``host`` (None: this host, as a record of an earlier version), which
    writes or removes ``path``, is gone. One of this host: when its pid no longer runs here. One of
    another host: only once ``path`` is untouched for :data:`OTHER_HOST_GONE_AFTER_S`, so a node never
    takes a live process on another node for gone (a runs folder or a data root may be shared). Untouched
    as the filesystem's own clock tells (:func:`filesystem_now`), which stamped the file: a clock of this
    host set a day ahead never takes a file being written for a day old."""
    if host is None or host == states.HOST:
        return not states.pid_alive(pid)
    try:
        touched = os.stat(path).st_mtime
    except OSError:
        return False
    now = filesystem_now(os.path.dirname(path))
    return (time.time() if now is None else now) - touched > OTHER_HOST_GONE_AFTER_S


# How often :func:`filesystem_now` makes a file again to read the filesystem's clock: in between, this
# host's steady clock carries it forward (it never jumps, whatever is done to the time of day).
CLOCK_PROBE_EVERY_S = 60.0
_FS_CLOCKS: dict[str, tuple[float | None, float]] = {}  # folder -> (its clock at the probe, _steady() then)


def _steady() -> float:
    """Seconds on a clock that never jumps and, where the system has one (Linux's ``CLOCK_BOOTTIME``),
    goes on while the machine is suspended, as the filesystem's clock does; elsewhere :func:`time.monotonic`."""
    boot = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boot) if boot is not None else time.monotonic()


def filesystem_now(folder: str | Path) -> float | None:
    """The present on the clock that stamps the files of ``folder`` (a file server's, for a store shared over
    NFS; this host's, for a local disk), as the time of day: the modification time of a file made there
    (hidden, named as a :func:`temporary_path`, removed at once), carried forward by this host's steady
    clock (:func:`_steady`) and read again every :data:`CLOCK_PROBE_EVERY_S`. Files of other hosts are
    compared with it, never with this host's clock, which may be minutes off theirs or jump. None where no
    file can be made there (a read-only store, another user's folder): the caller then has only this host's
    clock."""
    key, moment = os.fspath(folder), _steady()
    seen = _FS_CLOCKS.get(key)
    if seen is None or moment - seen[1] > CLOCK_PROBE_EVERY_S:
        seen = _FS_CLOCKS[key] = (_stamp_of_new_file(Path(key)), moment)
    return None if seen[0] is None else seen[0] + (moment - seen[1])


def _stamp_of_new_file(folder: Path) -> float | None:
    probe = temporary_path(folder / "clock")
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, NEW_FILE_MODE)
    except OSError:
        return None
    try:
        with open(fd, "wb") as fh:
            fh.write(b"\n")  # a write stamps the file with the server's time, as the writes of other hosts' files
        return os.stat(probe).st_mtime
    except OSError:
        return None
    finally:
        _discard(probe)


def remove_orphaned_temporaries(folder: Path) -> None:
    """Remove, anywhere under ``folder``, the :func:`temporary_path` files whose
    writer is gone (:func:`writer_gone`): a writer killed in mid-write (SIGKILL, a lost
    node) leaves its file behind. A live process's is left alone, as is another
    host's that is still recent."""
    for path in folder.rglob(".*.tmp"):
        if writer_gone(path):
            path.unlink(missing_ok=True)


def naming(exc: OSError, path: str | Path, *, stand_in: str | Path | None = None) -> OSError:
    """``exc``, or the same error naming ``path`` where it names no file (a write, flush or fsync the
    disk refused: ``No space left on device``, ``File too large``) or names ``stand_in`` (the temporary
    file written for ``path``), so the line fslab prints says which file could not be written."""
    named = os.fspath(exc.filename) if exc.filename is not None else None
    if exc.errno is None or named not in (None, stand_in and os.fspath(stand_in)):
        return exc
    return OSError(exc.errno, exc.strerror, os.fspath(path))


def atomic_write_text(path: Path, text: str, *, durable: bool = True) -> None:
    """Write-then-rename, so readers see the old file or the new one, never half.
    ``durable`` also flushes the data to disk before the rename (a crash then
    leaves the old file or the new one, never an empty one); caches that are
    rebuilt when lost skip it."""
    tmp = temporary_path(path)
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        _discard(tmp)
        raise naming(exc, path, stand_in=tmp) from None
    except BaseException:
        _discard(tmp)
        raise


# What archive_damage found, by file identity (device, inode, size, time of last change): one
# ``fslab eval`` asks three times (the CLI's check before torch loads, the evaluation's, the load
# itself) and the answer for a file not written since stands. Only for a file last changed more
# than RECENT ago: the time of a change is kept in steps of a few milliseconds, so a file
# rewritten in place just after a check could keep its identity.
_ARCHIVE_CHECKED: dict[tuple[int, int, int, int], str | None] = {}
RECENT_NS = 2_000_000_000


def archive_damage(path: Path) -> str | None:
    """Why ``path``, a zip archive (torch's format for a checkpoint), is not the file that was
    written, as a phrase that follows the path ("is not a complete checkpoint file"); None when it
    is whole. Its directory, at its end, tells a file cut short; each part's CRC-32, checked by
    reading the whole file once per process while the file is not replaced or written, tells
    bytes changed since (a disk's or a copy's fault), which ``torch.load`` does not check: it
    would load weights with those bytes in them."""
    try:
        st = os.stat(path)
    except OSError:
        return "is not a complete checkpoint file"
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if identity in _ARCHIVE_CHECKED:
        return _ARCHIVE_CHECKED[identity]
    damage = _archive_damage(path)
    if time.time_ns() - st.st_mtime_ns > RECENT_NS:
        _ARCHIVE_CHECKED[identity] = damage
    return damage


def _archive_damage(path: Path) -> str | None:
    import zipfile
    import zlib

    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, zlib.error):
        return "is not a complete checkpoint file"
    if bad is None:
        return None
    return f"has bytes changed since it was written: its part {bad.split('/', 1)[-1]} fails its checksum"


@contextlib.contextmanager
def written_whole(path: Path, *, durable: bool = False) -> Iterator[Path]:
    """For a file another library writes (``torch.save``, ``savefig``): the temporary path to write,
    renamed into ``path`` when the block ends, removed when it raises, so readers see the old file or
    the new one, never half. ``durable`` flushes the file to disk before the rename, as
    :func:`atomic_write_text` does: a machine that goes down (power, a hard reset) right after the
    rename then still has the old file or the whole new one, never an empty or zero-filled one."""
    tmp = temporary_path(path)
    try:
        yield tmp
        if durable:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        _discard(tmp)
        raise


def _discard(tmp: Path) -> None:
    """Remove a temporary file that was not renamed, if it is there; where the
    folder refuses (read-only), the error that brought us here is the one to tell."""
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass


def overwrite(path: Path, text: str) -> None:
    """Rewrite an existing file in place: the last resort on a full disk, where
    the new file of a write-then-rename cannot be made but the file's own
    blocks can be written again (a small file keeps its block)."""
    with open(path, "r+", encoding="utf-8") as fh:
        fh.write(text)
        fh.truncate()
        fh.flush()
        os.fsync(fh.fileno())


def atomic_write_json(path: Path, obj: Any, *, durable: bool = True) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n", durable=durable)


def loads(text: str | bytes) -> Any:
    """``json.loads`` for a file anyone may have edited: a whole number beyond
    64 bits (no run writes one; readers would overflow converting it) or
    nesting deeper than Python's recursion allows is a ValueError, as any other
    text that is not JSON is."""
    try:  # each whole number goes through _int64 (floats, most of an evaluation file, do not)
        return json.loads(text, parse_int=_int64)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _int64(text: str) -> int:
    if len(text) < 19:  # most of them: no 18-digit number is near the limits
        return int(text)
    if len(text) > 20:  # int() of a huge digit string is itself slow, and refused beyond 4,300 digits
        raise ValueError(f"integer of {len(text)} digits")
    value = int(text)
    if not -(2**63) <= value < 2**64:
        raise ValueError(f"integer beyond 64 bits: {value}")
    return value


def open_regular(path: str | Path, mode: str = "rb", encoding: str | None = None):
    """``path`` opened for reading if it is a regular file (a symbolic link to
    one included); anything else is an OSError. A FIFO put in a run folder
    would block a reader forever and a device such as /dev/zero never ends,
    so neither is read: opening does not wait (O_NONBLOCK), and the kind is
    checked on what was opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IsADirectoryError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, encoding=encoding)
    except BaseException:
        os.close(fd)
        raise


def read_json(path: str | Path) -> dict | None:
    """The JSON object in ``path``; None if it is missing, unreadable, not JSON,
    or JSON of another shape (a list, a string)."""
    return json_object(path)[0]


def json_object(path: str | Path) -> tuple[dict | None, str | None]:
    """(the JSON object in ``path``, None), or (None, why it holds none, as a run's note says it after
    its name: ``is empty``, ``is cut short or not JSON (line 1, column 9)``, ``holds a JSON list, not
    an object``, ``cannot be read: ...``)."""
    try:
        with open_regular(path, "r", encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return None, "missing"
    except UnicodeDecodeError:
        return None, "is not UTF-8 text"
    except (OSError, ValueError) as exc:  # ValueError: a path with a NUL in it
        return None, f"cannot be read: {getattr(exc, 'strerror', None) or exc}"
    try:
        value = loads(text)
    except json.JSONDecodeError as exc:
        return None, ("is empty" if not text.strip() else f"is cut short or not JSON (line {exc.lineno}, "
                                                          f"column {exc.colno})")
    except ValueError as exc:  # a number beyond 64 bits, nesting too deep
        return None, f"is not JSON fslab reads ({exc})"
    if not isinstance(value, dict):
        return None, f"holds a JSON {_JSON_TYPES.get(type(value), type(value).__name__)}, not an object"
    return value, None


_JSON_TYPES = {list: "list", str: "string", int: "number", float: "number", bool: "true or false",
               type(None): "null"}


def parse_lines(chunk: bytes) -> tuple[list[dict], int]:
    """The JSON objects in complete lines of JSONL, and how many non-blank
    lines were not JSON objects."""
    events, corrupt = [], 0
    for line in chunk.splitlines():
        if not line.strip():
            continue
        try:
            event = loads(line)
        except ValueError:
            corrupt += 1
            continue
        if isinstance(event, dict):
            events.append(event)
        else:
            corrupt += 1
    return events, corrupt


class Tail:
    """Follows one append-only file by byte offset.

    :meth:`read` returns the complete lines appended since the last read. A
    file that was replaced (another inode), cut back (smaller than what was
    read) or rewritten in place (the bytes just before the offset are not those
    read there) is read again from the top, and the read says so: ``fslab
    resume`` rewrites ``metrics.jsonl`` back to its last checkpoint, and a copy
    from elsewhere may overwrite the file. ``mtime`` is the file's modification
    time when it ended at ``offset`` (a write under way may show its new time
    before its bytes: a caller that takes a new time for a rewrite only reads
    the file again)."""

    def __init__(self, path: str | Path, offset: int = 0, inode: int | None = None, mark: bytes | None = None,
                 mtime: int | None = None) -> None:
        self.path, self.offset, self.inode = path, offset, inode
        # the last MARK bytes before ``offset`` and the modification time when the file ended there
        # (None: not known, as for a Tail started at an offset given without them)
        self.mark, self.mtime = (b"" if mark is None and offset == 0 else mark), mtime

    def read(self, *, partial: bool = False) -> tuple[bytes, bool]:
        """(new bytes, whether the file was rewritten since the last read).
        Only whole lines, unless ``partial``: then everything there is."""
        try:
            with open_regular(self.path) as fh:
                st = os.fstat(fh.fileno())
                reset = self._rewritten(fh, st)
                if reset:
                    self.offset, self.mark = 0, b""
                self.inode = st.st_ino
                fh.seek(self.offset)
                chunk = fh.read()
                end = len(chunk) if partial else chunk.rfind(b"\n") + 1
                after = os.fstat(fh.fileno())
        except OSError:
            return b"", False
        self.offset += end
        if self.mark is not None:
            self.mark = (self.mark + chunk[:end])[-MARK:]
        self.mtime = after.st_mtime_ns if after.st_size == self.offset else None
        return chunk[:end], reset

    def _rewritten(self, fh, st: os.stat_result) -> bool:
        if self.inode is None:
            return False
        if st.st_ino != self.inode or st.st_size < self.offset:
            return True
        if self.mark and self.offset >= len(self.mark):
            fh.seek(self.offset - len(self.mark))
            return fh.read(len(self.mark)) != self.mark
        return False

    def events(self) -> tuple[list[dict], int, bool]:
        """(events, corrupt lines, rewritten) appended to a JSONL file."""
        chunk, reset = self.read()
        events, corrupt = parse_lines(chunk)
        return events, corrupt, reset


MARK = 32  # bytes before a Tail's offset it checks again at each read


def last_lines_start(path: str | Path, count: int, block: int = 1 << 16) -> int:
    """The byte offset where the last ``count`` lines of ``path`` begin (a
    last line without its newline yet counts as one), read backwards a block
    at a time, so a log of gigabytes costs what its end does; 0 if it holds
    fewer lines, or cannot be read."""
    try:
        with open_regular(path) as fh:
            end = os.fstat(fh.fileno()).st_size
            if count <= 0:
                return end
            position, wanted = end, count  # the lines begin after the count-th newline from the end
            while position > 0:
                size = min(block, position)
                position -= size
                fh.seek(position)
                chunk = fh.read(size)
                if position + size == end and chunk.endswith(b"\n"):
                    chunk = chunk[:-1]  # the newline that ends the last line begins none
                found = chunk.count(b"\n")
                if found >= wanted:
                    at = len(chunk)
                    for _ in range(wanted):
                        at = chunk.rfind(b"\n", 0, at)
                    return position + at + 1
                wanted -= found
    except OSError:
        pass
    return 0


def read_appended(path: Path, offset: int) -> tuple[bytes, int]:
    """Complete lines appended to ``path`` since ``offset`` and the offset after them."""
    tail = Tail(path, offset)
    chunk, _ = tail.read()
    return chunk, tail.offset


def read_events(path: Path, offset: int = 0) -> tuple[list[dict], int, int]:
    """Events appended to a JSONL file since byte ``offset``: (events,
    new_offset, corrupt_lines). A torn last line is left for the next call."""
    chunk, end = read_appended(path, offset)
    events, corrupt = parse_lines(chunk)
    return events, end, corrupt
