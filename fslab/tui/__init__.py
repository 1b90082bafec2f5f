"""``fslab tui``: a live, keyboard-first dashboard over the run store.

Screens (one per module): the runs table (``runs_screen``), a run's detail
(``detail_screen``), the comparison of marked runs (``compare_screen``), the
launch form (``launch_screen``), a confirmation dialog (``confirm_screen``) and
every key of the screen it opens over (``help_screen``, on ``?``). The application
(``app``) owns the store watcher and the actions; ``web`` serves it to a browser.
Reading the run store is incremental and happens in worker threads
(``tailing``); what is shown is computed in ``model`` and drawn by
``runs_table`` and ``charts``. Nothing here imports torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def make_app(runs_dir: str | Path, *, settings=None, clock: Callable[[], float] = time.time,
             tick: float = 1.0, cursor_blink: bool = True):
    """The dashboard over ``runs_dir``, as the CLI and the tests build it.

    ``settings`` (fslab.toml) are used by the launch form, resume and launch;
    if not given, fslab.toml is read each time one needs them (as fslab run
    reads it), so an edit made while the dashboard is open counts; ``clock``
    gives "now" for elapsed times, ETAs and lost detection (tests freeze it);
    ``tick`` is the seconds between two reads of the run store."""
    from fslab.tui.app import FslabApp

    return FslabApp(Path(runs_dir), settings=settings, clock=clock, tick=tick, cursor_blink=cursor_blink)
