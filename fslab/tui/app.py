"""The ``fslab tui`` application: owns the run-store watcher and the actions."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from fslab.core.runstore import Run
from fslab.core.states import LIVE, UNREADABLE
from fslab.core.summary import RunSummary
from fslab.tui.messages import ResumeChecked, RunDeleted, RunLaunched, RunResumed, RunStopped, StoreUpdated
from fslab.tui.tailing import StoreWatcher


class FslabApp(App):
    """Every run in ``runs_dir``, live. Reading happens in a worker thread;
    the UI thread only applies what the worker posts."""

    CSS_PATH = "fslab.tcss"
    TITLE = "fslab"
    BINDINGS = [
        Binding("q", "quit", "quit", tooltip="Quit the dashboard (runs go on)"),
        Binding("question_mark", "help", "help", key_display="?", tooltip="Show every key of this screen"),
    ]

    def __init__(self, runs_dir: Path, *, settings=None, clock: Callable[[], float] = time.time,
                 tick: float = 1.0, cursor_blink: bool = True) -> None:
        super().__init__()
        self.runs_dir = Path(runs_dir)
        self._settings = settings
        self.clock = clock
        self.tick = tick
        self.cursor_blink = cursor_blink
        self.watcher = StoreWatcher(self.runs_dir, clock)
        self.rows: dict[str, RunSummary] = {}
        self.problems: dict[str, str] = {}  # queued runs that will not start unless a person acts: fslab queue's line
        self.skipped: list[str] = []
        self.last_poll_s = 0.0
        self.processes: list = []  # workers this dashboard launched, reaped as they end
        self.stopping: set[str] = set()  # runs a stop was confirmed for, until a tick reads them ended
        self.checking: dict[str, Screen] = {}  # runs r was pressed on, until fslab resume's checks of them answer:
        # the screen it was pressed on, where its dialog opens only if that is still showing the run
        self._poll_lock = threading.Lock()
        self.parent_pid = os.getppid()  # in a browser tab: fslab tui --web, which started this dashboard
        self.sub_title = str(self.runs_dir)

    # -- settings and plugins, loaded only when an action needs them -----------
    @property
    def settings(self):
        """The settings given, else fslab.toml as it is now: read again for each action, so that an edit
        made while the dashboard is open counts, as it does for fslab run; with the dashboard's runs folder."""
        import dataclasses

        from fslab.core.settings import load_settings

        return dataclasses.replace(self._settings or load_settings(), runs_dir=self.runs_dir)

    def registry(self):
        import fslab

        failures: list[str] = []
        registry = fslab.get_registry(self.settings, report=failures.append)
        for line in failures:
            self.notify(line, title="plugin failed to load", severity="warning", markup=False)
        return registry

    # -- life cycle --------------------------------------------------------------
    def get_default_screen(self) -> Screen:
        from fslab.tui.runs_screen import RunsScreen

        return RunsScreen()

    def on_mount(self) -> None:
        self.poll_store()
        self.set_interval(self.tick, self.poll_store)
        if self.is_web:
            self.set_interval(1.0, self.quit_if_orphaned)

    def quit_if_orphaned(self) -> None:
        """In a browser tab: quit once the server that started this dashboard is
        gone (killed, say by the out-of-memory killer) instead of polling the store
        forever with nobody watching."""
        if os.getppid() != self.parent_pid:
            self.exit()

    @work(thread=True, group="store", exit_on_error=False)
    def poll_store(self) -> None:
        """One tick: read what is new in the run store (skipped if the last
        tick is still reading, so two threads never share the watcher)."""
        if not self._poll_lock.acquire(blocking=False):
            return
        try:
            post = lambda changes: self.post_message(StoreUpdated(changes))
            changes = self.watcher.poll(on_batch=post if not self.rows else None)
        finally:
            self._poll_lock.release()
        self.post_message(StoreUpdated(changes))

    def on_store_updated(self, message: StoreUpdated) -> None:
        changes = message.changes
        for row in changes.rows:
            self.rows[row.id] = row
        for run_id in changes.removed:
            self.rows.pop(run_id, None)
            self.problems.pop(run_id, None)
        for run_id, problem in changes.problems.items():
            if problem is None:
                self.problems.pop(run_id, None)
            else:
                self.problems[run_id] = problem
        self.skipped = sorted(self.watcher.skipped)
        self.last_poll_s = changes.seconds
        removed = list(changes.removed)
        if len(removed) <= 3:
            for run_id in removed:
                self.notify(f"run {run_id} was deleted", markup=False)
        else:  # one note for a folder emptied at once, not a screen of them
            self.notify(f"{len(removed)} runs were deleted ({', '.join(removed[:3])}, ...)", markup=False)
        self.processes = [p for p in self.processes if p.poll() is None]
        # an unreadable row never reads ended: its stop is let go when it answers (on_run_stopped)
        self.stopping = {i for i in self.stopping if i in self.rows and self.rows[i].state in (*LIVE, UNREADABLE)}
        for screen in self.screen_stack:
            apply = getattr(screen, "apply_store_changes", None)
            if apply is not None:
                apply(changes)

    # -- actions shared by the screens ------------------------------------------
    def request_stop(self, run_id: str) -> None:
        """Stop a queued or running run, after a confirmation."""
        from fslab.tui.confirm_screen import ConfirmScreen

        row = self.rows.get(run_id)
        if row is None:  # its screen open after a tick read it deleted
            self.notify(f"run {run_id} was deleted (its folder is gone); nothing to stop", markup=False)
            return
        state = row.state
        if state == UNREADABLE:  # a newer fslab's state, in which its worker may live: fslab stop's words
            from fslab.execution.executor import not_stoppable_here

            run = Run(self.runs_dir / run_id)
            if why := not_stoppable_here(run.status()):
                self.notify(f"{run_id} {why}", markup=False)
                return
            state = run.state()  # its config.json unreadable: stopped as its status.json says, as fslab stop does
        if state not in LIVE:
            self.notify(f"{run_id} is {state}; only queued or running runs can be stopped", markup=False)
            return
        if run_id in self.stopping:  # stopped already, or on its way: the table says so at the next tick
            self.notify(f"{run_id} is being stopped already", markup=False)
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.stopping.add(run_id)
                self.notify(f"stopping {run_id} ...", markup=False)
                self.stop_in_background(run_id)

        self.push_screen(ConfirmScreen(f"Stop run {run_id}? It ends 'killed' and keeps its last checkpoint, "
                                       "if it wrote one."), confirmed)

    @work(thread=True, group="actions", exit_on_error=False)
    def stop_in_background(self, run_id: str) -> None:
        from fslab.core.errors import FslabError
        from fslab.execution import executor

        try:
            state = executor.stop(Run(self.runs_dir / run_id))
        except FslabError as exc:  # its own line (it ended meanwhile), as fslab stop prints it
            self.post_message(RunStopped(run_id, None, str(exc)))
            return
        except Exception as exc:  # a failed stop is reported, the dashboard goes on
            self.post_message(RunStopped(run_id, None, f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(RunStopped(run_id, state))

    def on_run_stopped(self, message: RunStopped) -> None:
        row = self.rows.get(message.run_id)
        if message.error or message.state in LIVE or (row is not None and row.state == UNREADABLE):
            self.stopping.discard(message.run_id)  # not stopped: s may try again; or stopped, which s reads itself
        if message.error:
            self.notify(f"could not stop {message.run_id}: {message.error}", severity="error", markup=False)
        else:
            from fslab.core.rerun import after_stop

            self.notify(f"{message.run_id}: {message.state}; {after_stop(Run(self.runs_dir / message.run_id))}",
                        markup=False)
        self.watcher.refresh_now(message.run_id)
        self.poll_store()

    def request_resume(self, run_id: str) -> None:
        """Continue a killed, lost or failed run from its last checkpoint, or start a queued run
        nobody holds (as ``fslab resume --detach``), after a confirmation. fslab resume's checks run
        in a worker thread (they read the whole checkpoint: a UI thread held for seconds by one of
        gigabytes); their refusal comes as a notification, else the dialog."""
        if run_id not in self.rows:  # its screen open after a tick read it deleted
            self.notify(f"run {run_id} was deleted (its folder is gone); nothing to resume", markup=False)
            return
        if run_id in self.checking:  # r pressed again before the check answered: one check, one dialog
            self.notify(f"checking whether {run_id} can resume (its checkpoint is read whole) ...", markup=False)
            return
        self.checking[run_id] = self.screen
        self.check_resume_in_background(run_id)

    @work(thread=True, group="checks", exit_on_error=False)
    def check_resume_in_background(self, run_id: str) -> None:
        """What fslab resume refuses (running, completed, no checkpoint yet, one damaged, a folder this user
        cannot write: a read-only copy of a store), in its words, before the dialog asks."""
        from fslab.core.commands import like_command
        from fslab.core.errors import FslabError, UsageError
        from fslab.execution.checks import check_resumable
        from fslab.execution.executor import check_resume_writes, checked_again, job_options, scheduler_takes
        from fslab.execution.handover import LiveWorker

        run = Run(self.runs_dir / run_id)
        try:
            waiting = run.free() and run.waits()  # queued, nobody holds it: fslab resume starts it, as executor.resume
            if not waiting:
                check_resumable(run, observed=True)
            elif (line := scheduler_takes(run)) is not None:  # a sweep's, which the scheduler running starts
                raise UsageError(line)
            check_resume_writes(run)
            settings = self.settings  # as fslab resume RUN checks it, where it last ran: its data, GPUs, plugins
            where = "slurm" if run.status().get("executor") == "slurm" else "local"
            checked_again(run, settings, self.registry(), job_options(settings, where))
        except FslabError as refused:
            again = ("; s stops it here" if isinstance(refused, LiveWorker) else
                     "; N starts a new run like it here" if like_command(run_id) in str(refused) else "")
            self.post_message(ResumeChecked(run_id, refusal=f"{refused}{again}"))
            return
        except Exception as exc:  # the check itself failed (a file it cannot read): said, the dashboard goes on
            self.post_message(ResumeChecked(run_id, refusal=f"cannot check whether {run_id} can resume: "
                                                            f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(ResumeChecked(run_id, waiting=waiting))

    def on_resume_checked(self, message: ResumeChecked) -> None:
        from fslab.tui.confirm_screen import ConfirmScreen

        run_id = message.run_id
        screen = self.checking.pop(run_id, None)
        if message.refusal is not None:
            self.notify(message.refusal, markup=False)
            return
        if screen is not self.screen or not screen.shows(run_id):  # left meanwhile: no dialog over another screen
            moved = "its screen was left" if screen is not self.screen else "the cursor left it"
            self.notify(f"{run_id} can {'start' if message.waiting else 'resume'}; not asked, as {moved} while it "
                        f"was checked: r on it asks again", markup=False)
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.resume_in_background(run_id)

        question = (f"Start queued run {run_id} here? Nothing holds it to start it." if message.waiting else
                    f"Resume run {run_id} from its last checkpoint? Its metrics after that checkpoint are cut back.")
        self.push_screen(ConfirmScreen(question), confirmed)

    @work(thread=True, group="actions", exit_on_error=False)
    def resume_in_background(self, run_id: str) -> None:
        """Resume as ``fslab resume RUN --detach`` does: the same checks, and a
        run that was a SLURM job is submitted again with ``[slurm]`` of fslab.toml."""
        import fslab
        from fslab.execution import executor

        try:
            # Off the UI thread: a plugin that fails to load is told by the launch form, not here.
            registry = fslab.get_registry(self.settings, report=lambda line: None)
            run = Run(self.runs_dir / run_id)
            holder = run.stale_claim() if run.claimed() else None  # as fslab resume says it
            started = executor.resume(run, settings=self.settings, registry=registry)
        except Exception as exc:  # FslabError: not resumable (e.g. no checkpoint); OSError: cannot start
            self.post_message(RunResumed(run_id, str(exc)))
            return
        self.post_message(RunResumed(run_id, process=started.process, queued=started.queued,
                                     held_by=holder.describe() if holder is not None else None))

    def on_run_resumed(self, message: RunResumed) -> None:
        if message.error:
            self.notify(message.error, title="not resumed", severity="error", markup=False)
            return
        if message.process is not None:  # a local worker (a SLURM job needs no reaping)
            self.processes.append(message.process)
        self.notify(message.queued or f"resuming {message.run_id}" if message.held_by is None else
                    f"run {message.run_id} was queued, held by {message.held_by}, which is gone (killed before it "
                    f"started the run); started here", markup=False)
        self.watcher.refresh_now(message.run_id)
        self.poll_store()

    def request_delete(self, run_id: str) -> None:
        """Delete an ended run for good, as ``fslab delete RUN`` does, after a confirmation."""
        from fslab.core.deletion import unwritable
        from fslab.tui.confirm_screen import ConfirmScreen

        row = self.rows.get(run_id)
        if row is None:  # read deleted at a tick since the key was pressed
            self.notify(f"run {run_id} was deleted (its folder is gone)", markup=False)
            return
        if row.state in LIVE:
            self.notify(f"{run_id} is {row.state}; s stops it first, then d deletes it", markup=False)
            return
        if (line := unwritable(Run(self.runs_dir / run_id))) is not None:  # a read-only store: before it asks
            self.notify(line, markup=False)
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.delete_in_background(run_id)

        self.push_screen(ConfirmScreen(f"Delete run {run_id} for good? Its folder goes: checkpoints, logs and "
                                       "scores."), confirmed)

    @work(thread=True, group="actions", exit_on_error=False)
    def delete_in_background(self, run_id: str) -> None:
        from fslab.core.deletion import delete_runs

        try:
            delete_runs(self.runs_dir, [Run(self.runs_dir / run_id)])
        except Exception as exc:  # FslabError: started meanwhile, or a folder it may not move
            self.post_message(RunDeleted(run_id, str(exc)))
            return
        self.post_message(RunDeleted(run_id))

    def on_run_deleted(self, message: RunDeleted) -> None:
        if message.error:
            self.notify(message.error, title="not deleted", severity="error", markup=False)
        self.poll_store()  # the watcher says the run was deleted, as for one deleted elsewhere

    def request_launch(self, like: str | None = None) -> None:
        """The new-run form; ``like``: pre-filled from that run (``fslab run --like``)."""
        from fslab.core.errors import FslabError
        from fslab.tui.launch_screen import LaunchScreen

        try:
            registry = self.registry()
        except FslabError as exc:  # fslab.toml, read again, is broken now: its line, as fslab run says it
            self.notify(str(exc), title="no new run", severity="error", markup=False)
            return
        except Exception as exc:
            self.notify(f"cannot load plugins: {exc}", severity="error", markup=False)
            return
        try:
            form = LaunchScreen(registry, Run(self.runs_dir / like) if like else None)
        except FslabError as exc:  # its configuration is from a newer fslab, or damaged: as fslab run --like says
            # it; or no plugin registers a method
            self.notify(str(exc), title="no run like it" if like else "no new run", severity="error", markup=False)
            return
        self.push_screen(form)

    @work(thread=True, group="actions", exit_on_error=False)
    def launch(self, method: str, overrides: list[dict], registry) -> None:
        """Start a run exactly as ``fslab run --detach`` does (in a worker thread:
        resolving the configuration and starting a process take a moment)."""
        from fslab.execution import executor

        try:
            started = executor.launch(method, overrides, settings=self.settings, registry=registry)
        except Exception as exc:  # FslabError: bad configuration; OSError: cannot start
            self.post_message(RunLaunched(None, str(exc)))
            return
        self.post_message(RunLaunched(started.run.id, process=started.process))

    def on_run_launched(self, message: RunLaunched) -> None:
        if message.error:
            self.notify(message.error, title="run not started", severity="error", markup=False)
            return
        self.processes.append(message.process)
        self.notify(f"started {message.run_id}", markup=False)
        self.poll_store()

    def action_help(self) -> None:
        from fslab.tui.help_screen import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))

    # -- command palette: every binding of the screen and the app, once -----------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The screen's and the app's bindings, titled by their label and
        described by what they do (with the key), then Textual's own commands
        but for those an fslab binding already gives (Quit)."""
        from fslab.tui.help_screen import what_it_does

        titles = set()
        for namespace, bindings in ((screen, screen.BINDINGS), (self, self.BINDINGS)):
            for binding in bindings:
                binding = binding if isinstance(binding, Binding) else Binding(*binding)
                if binding.action.startswith("app.") or not binding.description:
                    continue
                title = binding.description[:1].upper() + binding.description[1:]
                if title in titles:
                    continue
                titles.add(title)
                key = binding.key_display or binding.key
                yield SystemCommand(title, f"{what_it_does(binding)} ({key})",
                                    partial(self.run_action, binding.action, namespace))
        for command in super().get_system_commands(screen):
            if command.title not in titles:
                yield command
