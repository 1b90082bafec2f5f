"""What ``fslab run`` itself costs around its worker, one command: ``python benchmarks/bench_first_run.py``.

``fslab run`` follows its worker (``fslab.cli.follow.follow``) while the worker trains on every
core. Two things of the follower's are timed against the way it was, in this one run on this
machine:

1. the end: a stand-in worker (a Python process that sleeps ``--worker-s`` seconds, then appends
   its last events and exits) is followed at fslab's poll (0.25 s), and the time from its exit to
   ``follow`` returning is its end's delay. The old follower slept a whole poll between reads (a
   stand-in whose ``wait`` sleeps its timeout, as ``time.sleep(poll)`` did) and once more after a
   read that still found events; the new one waits on the worker and ends at the read after its exit;
2. the bar, in a terminal: the CPU the follower (its thread that redraws the bar included) takes
   a second while a worker trains, with rich's 10 redraws a second against fslab's
   ``REDRAWS_PER_S``; on a 2-core CPU that CPU is taken from the worker;
3. the worker's exit: a process that imports what a worker imports, builds the first command's
   ResNet-12 and trains it one step, then ends as workers ended (the interpreter's exit, which
   tears down every module) or as they end now (``fslab.execution.worker.exit_now``): the time
   from its last line to its exit.

Options: ``--repeats N`` (5: the median is shown), ``--worker-s S`` (0.3), ``--follow-s S``
(5: how long the bar is followed each time).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import options  # noqa: E402

EVENTS = [{"event": "start", "time": 0.0, "epochs": 5, "steps_per_epoch": 28, "total_steps": 140}] + [
    {"event": "train", "time": float(step), "step": step, "epoch": 1 + (step - 1) // 28, "loss": 4.0 - step / 100,
     "positives": 70, "negatives": 7000, "lr": 0.025, "images_per_s": 300.0} for step in range(10, 141, 10)]
LAST = [{"event": "eval", "time": 150.0, "split": "test", "ways": 5, "shots": 1, "queries": 15, "episodes": 2000,
         "accuracy": 65.07, "ci95": 0.46}, {"event": "end", "time": 151.0}]


class WholePolls:
    """The old follower's wait: the worker's ``poll`` as it is, a whole poll's sleep in place of ``wait``."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process

    def poll(self):
        return self.process.poll()

    def wait(self, timeout: float):
        time.sleep(timeout)
        raise subprocess.TimeoutExpired(self.process.args, timeout)


def lines(events: list[dict]) -> str:
    return "".join(json.dumps(event) + "\n" for event in events)


def end_delay(root: Path, worker_s: float, old: bool) -> float:
    """Seconds from the stand-in worker's exit to ``follow`` returning."""
    from rich.console import Console

    from fslab.cli.follow import follow
    from fslab.core.runstore import create_run

    run = create_run(root, "nca", {"method": "nca"})
    run.metrics_path.write_text(lines(EVENTS))
    code = (f"import sys, time\ntime.sleep({worker_s})\nopen(sys.argv[1], 'a').write(sys.argv[2])\n"
            f"print(time.time(), flush=True)\n")
    process = subprocess.Popen([sys.executable, "-c", code, str(run.metrics_path), lines(LAST)],
                               stdout=subprocess.PIPE, text=True)
    with open(os.devnull, "w") as sink:
        follow(run, Console(file=sink, width=200), WholePolls(process) if old else process, poll=0.25)
    returned = time.time()
    exited = float(process.stdout.read())
    process.wait()
    process.stdout.close()
    if old:  # the old loop read once more after a read that found events, a poll later
        time.sleep(0.25)
        returned = time.time()
    return returned - exited


def bar_cpu(root: Path, seconds: float, redraws: int) -> float:
    """The follower's CPU seconds per second, in a terminal, with ``redraws`` redraws a second."""
    from rich.console import Console

    from fslab.cli import follow as following
    from fslab.core.runstore import create_run

    run = create_run(root, "nca", {"method": "nca"})
    run.metrics_path.write_text(lines(EVENTS[:5]))
    process = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    kept, following.REDRAWS_PER_S = following.REDRAWS_PER_S, redraws
    try:
        with open(os.devnull, "w") as sink:
            cpu = time.process_time()
            following.follow(run, Console(file=sink, width=200, force_terminal=True), process, poll=0.25)
            cpu = time.process_time() - cpu
    finally:
        following.REDRAWS_PER_S = kept
    return cpu / seconds


EXIT = """import sys, time
import torch
from fslab.execution.worker import exit_now, import_train
train = import_train()  # as a worker imports it: torch's objects frozen out of the collector's sight
from plugins.backbones.networks import ResNet12
net = ResNet12(1)
net(torch.zeros(8, 1, 16, 16)).sum().backward()
print(time.time(), flush=True)
exit_now(0) if sys.argv[1] == "now" else sys.exit(0)
"""


def exit_s(how: str) -> float:
    """Seconds from a worker-sized process's last line to its exit, ended ``how``."""
    root = Path(__file__).resolve().parent.parent
    process = subprocess.Popen([sys.executable, "-c", EXIT, how], stdout=subprocess.PIPE, text=True, cwd=root)
    last = float(process.stdout.readline())
    process.wait()
    ended = time.time()
    process.stdout.close()
    return ended - last


def main() -> None:
    parser = options.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker-s", type=float, default=0.3)
    parser.add_argument("--follow-s", type=float, default=5.0)
    args = parser.parse_args()
    options.at_least(parser, args, repeats=1, worker_s=0.0, follow_s=1.0)
    from fslab.cli.follow import REDRAWS_PER_S

    print(options.machine())
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        delays = {old: statistics.median(end_delay(root, args.worker_s, old) for _ in range(args.repeats))
                  for old in (True, False)}
        print(f"end of the run seen after the worker's exit: {delays[True] * 1000:.0f} ms the old way, "
              f"{delays[False] * 1000:.0f} ms now ({delays[True] / max(delays[False], 1e-6):.0f}x sooner)")
        cpu = {redraws: statistics.median(bar_cpu(root, args.follow_s, redraws) for _ in range(args.repeats))
               for redraws in (10, REDRAWS_PER_S)}
        now = cpu[REDRAWS_PER_S]
        print(f"follower's CPU in a terminal: {cpu[10] * 100:.2f}% of a core at 10 redraws a second, "
              f"{now * 100:.2f}% at {REDRAWS_PER_S} ({cpu[10] / max(now, 1e-9):.1f}x less)")
    exits = {how: statistics.median(exit_s(how) for _ in range(args.repeats)) for how in ("interpreter", "now")}
    old, new = exits["interpreter"], exits["now"]
    print(f"worker's exit after its last line: {old * 1000:.0f} ms through the interpreter's teardown, "
          f"{new * 1000:.0f} ms with exit_now ({old / max(new, 1e-6):.1f}x sooner)")


if __name__ == "__main__":
    main()
