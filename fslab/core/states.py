"""A run's state, told from its ``status.json``.

The worker writes ``queued``, ``running`` and one end state; ``lost`` is what a
reader concludes when a queued or running run's process is gone or its
heartbeat stopped. Every surface (listings, the dashboard, resume and stop)
asks :func:`run_state`, so they never disagree about a run.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

STATES = ("queued", "running", "completed", "failed", "killed", "lost")
ENDED = ("completed", "failed", "killed")
LIVE = ("queued", "running")
# What a listing shows for a run whose configuration or status cannot be read
# (another user's folder, a damaged file); never written to a status.
UNREADABLE = "unreadable"
# A live run rewrites its heartbeat every few seconds; this long without one is lost.
LOST_AFTER_S = 120.0
HOST = socket.gethostname()


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs here and is not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def run_state(status: dict, now: float | None = None) -> str:
    """The state of a run whose status is ``status``: its recorded end state,
    or ``queued``/``running`` while its process lives and beats, else ``lost``."""
    state = status.get("state", "lost")
    if state in ENDED:
        return state
    now = time.time() if now is None else now
    pid = status.get("pid")
    if state == "queued" and not pid:
        return state  # waiting for a scheduler slot, however long that takes
    if isinstance(pid, int) and pid > 0 and status.get("host") == HOST and not pid_alive(pid):
        return "lost"
    last_sign = _number(status.get("heartbeat")) or _number(status.get("created"))
    if now - last_sign > LOST_AFTER_S:
        return "lost"
    return state if state in STATES else "lost"
