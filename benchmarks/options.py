"""What every benchmark checks of its options before it measures anything: a wrong one is one
line and exit 2 (argparse's own ``error``), not a traceback, and not minutes into a run on a
lent GPU. The benchmarks import it from their own folder (``benchmarks/`` is not a package)."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
from pathlib import Path
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """argparse's parser whose error is the one line the README promises, ``PROG: error: MESSAGE``,
    and exit 2, without the usage lines argparse prints above it (``--help`` shows them)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def machine() -> str:
    """The line that names what a CPU figure was measured on: the processor, how many CPUs this
    process may use, and the load average as the timings start (a loaded machine's figures are slower)."""
    name = platform.processor()
    try:
        name = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name")), name)
    except OSError:  # no /proc (not Linux): platform's name stands
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"machine: {name or 'an unnamed CPU'}, {usable} of {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.2f}")


def at_least(parser: argparse.ArgumentParser, args: argparse.Namespace, **minimums: float) -> None:
    """Each option named (by its ``dest``) at least its minimum."""
    for name, minimum in minimums.items():
        value = getattr(args, name)
        if value < minimum:
            parser.error(f"--{name.replace('_', '-')} must be at least {minimum}, got {value}")


def device(parser: argparse.ArgumentParser, text: str, *, auto: bool = False):
    """``text`` as a torch device this machine has: the CPU or one of its CUDA GPUs (with
    ``auto``, ``"auto"`` too: CUDA where there is a GPU, else the CPU)."""
    import torch

    if auto and text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        chosen = torch.device(text)
    except RuntimeError:
        chosen = None
    if chosen is None or chosen.type not in ("cpu", "cuda"):
        parser.error(f"--device must be cpu, cuda or cuda:N, got '{text}'")
    if chosen.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            parser.error(f"--device {text}: this machine has no CUDA GPU; use --device cpu")
        if (chosen.index or 0) >= count:
            parser.error(f"--device {text}: this machine has {count} CUDA GPU{'s' * (count > 1)}, "
                         f"cuda:0 to cuda:{count - 1}")
    return chosen


def known(parser: argparse.ArgumentParser, registry, kind: str, names, option: str) -> None:
    """Every one of ``names`` a registered ``kind`` (``option`` says where they were given)."""
    allowed = registry.names(kind)
    unknown = [name for name in names if name not in allowed]
    if unknown:
        parser.error(f"{option}: unknown {kind} {', '.join(unknown)}; registered: {', '.join(allowed)}")


def output(parser: argparse.ArgumentParser, path: Path | None, option: str = "--json") -> None:
    """A file the results can be written to: its folder exists."""
    if path is not None and not path.parent.is_dir():
        parser.error(f"{option} {path}: there is no folder {path.parent}; make it first")


@contextlib.contextmanager
def usage_errors(parser: argparse.ArgumentParser):
    """fslab's own one-line refusal of a value (its UsageError) as the option error it is."""
    from fslab.core.errors import UsageError

    try:
        yield
    except UsageError as error:
        parser.error(str(error))
