"""``python -m fslab``, and the ``fslab`` command: :func:`fslab.cli.main`, imported here so that a
Ctrl-C while the command line loads (its imports take most of a second, more on a loaded machine)
ends the command as one pressed while it works does, exit code 130, not in a traceback."""

import sys


def main() -> None:
    try:
        from fslab.cli import main as command_line
    except KeyboardInterrupt:
        sys.exit(130)
    command_line()


if __name__ == "__main__":
    main()
