"""The ``fslab`` command line: one module per group of commands.

- :mod:`fslab.cli.launch`: run, resume, stop, sweep, queue (through :mod:`fslab.execution.executor`);
- :mod:`fslab.cli.runs`: runs, show, logs, delete (through :mod:`fslab.core.summary`);
- :mod:`fslab.cli.reports`: eval, compare, plot;
- :mod:`fslab.cli.plugins`: plugins, and tui (the dashboard);
- :mod:`fslab.cli.new`: new plugin (a plugin package from the templates of :mod:`fslab.kit`);
- :mod:`fslab.cli.studies`: study list, show, run, report (a paper's table or figure);
- :mod:`fslab.cli.export`: export (finished runs replayed into a sink).

A new command goes in the module of its group (or a new one), registers on
:data:`fslab.cli.common.app`, and is named in :data:`COMMANDS`. Heavy modules
(torch) are imported inside the commands that need them, never here.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import os
import sys
from typing import Annotated

import typer

from fslab.cli import common
from fslab.core.errors import FslabError
from fslab.core.text import clip, printable

# Each top-level command (or group of commands) and the module that registers it, in the order
# `fslab --help` lists them. `fslab runs` imports and builds only fslab.cli.runs's command:
# building every command's options is ~0.1 s of each call. `fslab --help`, shell completion
# and a mistyped command (typer suggests the nearest name) get them all.
COMMANDS = {
    "run": "launch", "resume": "launch", "stop": "launch", "sweep": "launch", "queue": "launch",
    "runs": "runs", "show": "runs", "logs": "runs", "delete": "runs",
    "eval": "reports", "compare": "reports", "plot": "reports",
    "plugins": "plugins", "tui": "plugins",
    "new": "new",
    "study": "studies",
    "export": "export",
}


def __getattr__(name: str):
    """``fslab.cli.app``: the whole command line, every command registered."""
    if name == "app":
        return _load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _load(command: str | None = None) -> typer.Typer:
    """The app with every command, or with only ``command`` (one of :data:`COMMANDS`)."""
    if command is None:
        for module in dict.fromkeys(COMMANDS.values()):
            importlib.import_module(f"fslab.cli.{module}")
        return common.app
    importlib.import_module(f"fslab.cli.{COMMANDS[command]}")
    only = copy.copy(common.app)  # the shared app keeps every command, for another caller
    only.registered_commands = [c for c in common.app.registered_commands if _name(c) == command]
    only.registered_groups = [g for g in common.app.registered_groups if g.name == command]
    return only


def _name(command) -> str:
    return command.name or command.callback.__name__.lower().replace("_", "-")


@common.app.callback()
def root(
    version: Annotated[bool, typer.Option("--version", callback=common.version_callback, is_eager=True,
                                          help="Show the version.")] = False,
) -> None:
    """fslab: few-shot learning runs from the command line."""


def main() -> None:
    """Console entry point: an FslabError is one line on stderr and an exit
    code; so is a command line typer cannot parse (``--epochs abc``), and a
    file the system refused (a full disk, a read-only store, another user's
    folder), naming the file. A Ctrl-C exits 130, as typer ends a command it
    interrupts, also while the command's module loads (not in a traceback)."""
    try:
        _main()
    except KeyboardInterrupt:
        sys.exit(130)


def _main() -> None:
    if len(sys.argv) == 1 or {"-h", "--help"} & set(sys.argv[1:]):
        from fslab.cli.typer_compat import help_without_markdown, reflow_help_paragraphs

        help_without_markdown()
        reflow_help_paragraphs()
    for stream in (sys.stdout, sys.stderr):  # a terminal that cannot show é or 日本 (a path's): written out, \xe9
        if hasattr(stream, "reconfigure") and (stream.encoding or "").lower().replace("-", "") != "utf8":
            stream.reconfigure(errors="backslashreplace")
    argv = sys.argv[1:]
    completing = any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ)
    cli = _load(argv[0] if argv and argv[0] in COMMANDS and not completing else None)
    try:
        code = _command(cli)
    finally:  # the plugins' load failures a command that printed nothing has not said yet
        with contextlib.suppress(OSError, ValueError, SystemExit):  # a stderr whose reader went away
            common.say_load_failures()
    sys.exit(code if isinstance(code, int) else 0)


def _command(cli):
    """Run the command; its end as :func:`main` says it."""
    click = _click_exceptions()
    try:
        return cli(standalone_mode=False)  # parse errors come back here instead of typer's box
    except SystemExit as exc:
        if cut_short(exc):  # typer and rich exit 1, silently, on a reader that went away (| head)
            end_cut_short()
        raise
    except BrokenPipeError:  # one written by fslab's own code, outside their reach
        end_cut_short()
    except click.NoArgsIsHelpError as exc:  # `fslab` or `fslab study` alone: the help, as typer shows it
        from typer.rich_utils import rich_format_error

        from fslab.cli.typer_compat import reflow_help_paragraphs

        reflow_help_paragraphs()
        rich_format_error(exc)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        fail(parse_error_line(exc, sys.argv[1:]), exc.exit_code)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(1)
    except FslabError as exc:
        fail(str(exc), exc.exit_code)
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        fail(f"{exc.strerror or exc}{where}", 1)


# The exit code of a command whose reader stopped reading (``fslab runs | head -1``): 128 + SIGPIPE,
# what ``git log | head -1`` and ``cat`` end with, there killed by the signal.
CUT_SHORT = 141


def cut_short(exc: BaseException) -> bool:
    """Whether ``exc`` (an exit of typer's or rich's) came of a write to a pipe whose reader is gone."""
    seen = exc.__context__
    while seen is not None:
        if isinstance(seen, BrokenPipeError):
            return True
        seen = seen.__context__
    return False


def end_cut_short(note: str | None = None) -> None:
    """End quietly, as a Unix tool whose reader went away: exit code :data:`CUT_SHORT`, and no line but
    ``note`` (what goes on without this command: a followed run's worker) on stderr, where stderr can
    still be written (it may be the same pipe: then not a word). stdout, and a stderr that failed, then
    point at /dev/null, so the flush of what is left in their buffers as Python exits cannot fail again
    ("Exception ignored ... BrokenPipeError")."""
    if note is not None:
        try:
            print(note, file=sys.stderr, flush=True)
        except (OSError, ValueError):
            _to_devnull(sys.stderr)
    _to_devnull(sys.stdout)
    sys.exit(CUT_SHORT)


def _to_devnull(stream) -> None:
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    except (OSError, ValueError):  # no descriptor: a stream replaced in-process (a test's)
        pass


def fail(message: str, code: int) -> None:
    """One line on stderr, with nothing in it that could drive the terminal, and the exit code. A line
    that names several runs, holders and the command to run again can be long: only a value pasted
    in by mistake (thousands of characters) is clipped."""
    common.say_load_failures(message)  # but one the line says: a component of a plugin that failed to load
    print(f"error: {clip(printable(message), 1000)}", file=sys.stderr)
    sys.exit(code)


def _click_exceptions():
    """The exception classes typer raises: those of the click it vendors
    (typer._click) in recent versions, click's own before."""
    try:
        from typer._click import exceptions
    except ImportError:  # pragma: no cover - an older typer
        from click import exceptions
    return exceptions


def parse_error_line(exc, argv: list[str]) -> str:
    """typer's message on one line, with the value it refused (its message
    does not always say it) and where the help is."""
    message = " ".join(exc.format_message().split())
    param = getattr(exc, "param", None)
    if no_ids := _no_runs_given(exc, param):
        return no_ids
    if kind_first := _new_kind_first(argv):
        return kind_first
    if isinstance(exc, typer.BadParameter) and getattr(param, "param_type_name", "") == "option":
        given = [arg.partition("=")[2] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else None)
                 for i, arg in enumerate(argv) if arg.partition("=")[0] in param.opts]
        if given and given[-1] is not None:
            message = f"{message.rstrip('.')}, got {given[-1]!r}"
    ctx = getattr(exc, "ctx", None)
    return f"{message} (see {ctx.command_path} --help)" if ctx is not None else message


def _new_kind_first(argv: list[str]) -> str | None:
    """``fslab new loss margin`` (the kind where the command is): the command that writes it, where typer
    said only "No such command 'loss'"."""
    from fslab.core.registry import KINDS

    if len(argv) < 2 or argv[0] != "new" or argv[1] not in KINDS:
        return None
    name = next((arg for arg in argv[2:] if not arg.startswith("-")), "NAME")
    return (f"fslab new takes the kind as an option: fslab new plugin {name} --kind {argv[1]} writes a plugin "
            f"package with a {argv[1]} (see fslab new plugin --help)")


def _no_runs_given(exc, param) -> str | None:
    """For a command that takes runs (RUN, RUN|SWEEP) given none, the line that says so: typer's
    "Missing argument" named no reason, and the usual one is a ``$(fslab runs ... -q)`` that listed
    no run, which passes no id at all."""
    metavar = getattr(param, "metavar", None) or ""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ != "MissingParameter" or ctx is None or "RUN" not in metavar.split("|"):
        return None
    names, at = [], ctx
    while at.parent is not None:  # the command's words, whatever ran fslab (python -m fslab)
        names.insert(0, at.info_name)
        at = at.parent
    sweeps = "SWEEP" in metavar
    if getattr(param, "nargs", 1) != 1:
        kinds = ["run ids", "unique parts of them", "'last'", "runs' folders", *["sweep ids"] * sweeps,
                 *["'all'"] * (names[-1] != "stop")]  # stop takes no 'all': every live run is one too many
        takes = f"{metavar}... ({', '.join(kinds[:-1])} or {kinds[-1]})"
    else:
        takes = f"{metavar} (a run id, a unique part of one, 'last' or a run's folder{', or a sweep id' * sweeps})"
    return (f"no run named: fslab {' '.join(names)} takes {takes}, and a $(fslab runs ... -q) that listed no run "
            f"passes none; nothing was done (list the runs with: fslab runs)")
