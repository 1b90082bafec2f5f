"""The order runs (and sweeps) were created in: one key for every listing, the dashboard and ``last``.

An id begins with the local wall-clock time of the host that made it (``YYYYmmdd-HHMMSS``), as people
read it. Ids alone put the runs of a store shared by hosts in different time zones (a laptop in UTC+1
and a cluster in UTC, two sites on one NFS store), or made across a DST fall-back hour, out of the
order they were made in. A run's recorded creation time (``created`` in its status, a sweep's in its
record: a UNIX time) is not. A local time is at most 14 hours ahead of UTC (UTC+14) and 12 behind
(UTC-12), so a run stamped at local time S (read as if it were UTC) was made between S - 14 h and
S + 12 h; that window, an hour wider for a slow disk between the id and the status, holds its
creation time. The key is the creation time held within its stamp's window (a time outside it, from a
clock set wrong, counts as the window's edge), then that time, then the id; a run whose time cannot be
read counts as made at its stamp in this host's time zone. A walk from the newest id down
(:func:`newest_first`) reads a time only once it has reached a stamp within a day of it: a store of
10,000 runs lists its newest without reading the others. Names that begin with no stamp (folders not
made by fslab) come oldest, by name.
"""

from __future__ import annotations

import calendar
import functools
import heapq
import math
import time
from collections.abc import Callable, Iterator

from fslab.core.schemas import NUMBER, is_kind

AHEAD = 14 * 3600  # the most a local time is ahead of UTC (UTC+14: Kiribati)
BEHIND = 13 * 3600  # the most one is behind (UTC-12), and an hour for a slow disk between the id and the status
STAMP = len("20260101-120000")
_FIELDS = ((1, 9999), (1, 12), (1, 31), (0, 23), (0, 59), (0, 59))  # year, month, day, hour, minute, second


@functools.lru_cache(maxsize=1 << 16)  # a pure function of the text: a dashboard's re-sort asks it of every row
def stamp_time(text: str) -> float | None:
    """The local time ``text`` (``YYYYmmdd-HHMMSS``, as ids begin) names, in seconds read as if it were UTC;
    None for text that is no stamp. A field past its range (a folder named by hand ``20260101-009999``)
    counts as the latest it can be, and so do the fields after it (below its range: the earliest), so that
    stamps in the order of their text have times in the same order."""
    digits = text[:8] + text[9:]
    if len(text) != STAMP or text[8] != "-" or not (digits.isascii() and digits.isdigit()):
        return None
    given = [int(text[0:4]), int(text[4:6]), int(text[6:8]), int(text[9:11]), int(text[11:13]), int(text[13:15])]
    fields, bound = [], None
    for at, value in enumerate(given):
        low, high = _FIELDS[at]
        if at == 2:  # the days of that month
            high = calendar.monthrange(fields[0], fields[1])[1]
        if bound is None and not low <= value <= high:
            bound = "high" if value > high else "low"
        fields.append(value if bound is None else high if bound == "high" else low)
    return float(calendar.timegm((*fields, 0, 0, 0)))


def creation_key(name: str, created: float | None, at: int = 0) -> tuple:
    """The sort key of the one creation order, oldest first, from an id (its stamp at ``at``: 0 for a run,
    6 for a sweep, ``sweep-...``) and its recorded creation time (None where it cannot be read)."""
    return _key(name, stamp_time(name[at:at + STAMP]), created)


def _key(name: str, stamp: float | None, created) -> tuple:
    if stamp is None:
        return -math.inf, 0.0, name
    made = _as_time(created)
    if made is None:
        made = _made_here(stamp)
    return min(max(made, stamp - AHEAD), stamp + BEHIND), made, name


def newest_first(names: list[str], created_of: Callable[[str], float | None], at: int = 0) -> Iterator[str]:
    """``names`` (sorted, as folder listings give them) newest first by :func:`creation_key`, walking them
    from the last: ``created_of(name)`` is called once a name is reached, and a name is given once no name
    below it can be newer (every later stamp's window lies under its key), so the newest run of a store
    costs the reads of the runs stamped within about a day of it, whatever the store holds."""
    pending: list[tuple] = []  # a heap: the key negated, the name's place in the walk for the id's order
    unstamped = []
    for place, name in enumerate(reversed(names)):
        stamp = stamp_time(name[at:at + STAMP])
        if stamp is None:
            unstamped.append(name)
            continue
        while pending and -pending[0][0] > stamp + BEHIND:
            yield heapq.heappop(pending)[3]
        key = _key(name, stamp, created_of(name))
        heapq.heappush(pending, (-key[0], -key[1], place, name))
    while pending:
        yield heapq.heappop(pending)[3]
    yield from unstamped


def _as_time(created) -> float | None:
    return float(created) if is_kind(created, NUMBER) else None  # as status.json's schema takes it


def _made_here(stamp: float) -> float:
    """The UNIX time of a local time read as UTC (``stamp``), in this host's time zone."""
    try:
        return time.mktime((*time.gmtime(stamp)[:6], 0, 0, -1))
    except (OverflowError, ValueError, OSError):  # a year the C library cannot take
        return stamp
