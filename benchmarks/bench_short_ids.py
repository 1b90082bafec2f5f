"""Short ids of every run, one command: ``python benchmarks/bench_short_ids.py``.

Makes 10,000 run folders named as fslab names runs (empty: the short ids read
names only; sweeps of 100 runs made in the same few seconds, and a few names
that are the start of others), then times the short ids of every run, as
``fslab runs --all`` and ``fslab queue`` show them at 80 columns, the old way
(a scan of the joined names for every end tried) against the index the many
ids now use, in this one run on this machine; both give the same ids.

Options: ``--runs N`` (10000), ``--repeats N`` (3: the fastest is shown).
"""

from __future__ import annotations

import math
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import options  # noqa: E402


def make_names(root: Path, runs: int) -> None:
    rng = random.Random(0)
    for index in range(runs):
        second = 1_790_000_000 + 3600 * (index // 100) + (index % 100) // 40  # sweeps: 40 runs a second
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(second))
        while True:  # a new name, as fslab's own mkdir retries
            folder = root / f"{stamp}-{('nca', 'protonet')[index % 2]}-{rng.randrange(65536):04x}"
            if not folder.exists():
                break
        folder.mkdir(parents=True)
    for name in ("run1", "run12", "run123"):  # renamed by hand, each the start of the next
        (root / f"20260101-000000-{name}").mkdir()


def timed(runs_dir: Path, ids: list[str], scan_up_to: int, repeats: int) -> tuple[float, dict]:
    from fslab.core import runstore

    kept, best, short = runstore.SHORT_IDS_SCAN_UP_TO, math.inf, {}
    runstore.SHORT_IDS_SCAN_UP_TO = scan_up_to
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            short = runstore.short_ids(runs_dir, ids)
            best = min(best, time.perf_counter() - t0)
    finally:
        runstore.SHORT_IDS_SCAN_UP_TO = kept
    return best, short


def main() -> None:
    parser = options.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    options.at_least(parser, args, runs=1, repeats=1)
    print(options.machine())
    from fslab.core.runstore import run_names

    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = Path(tmp) / "runs"
        make_names(runs_dir, args.runs)
        ids = list(reversed(run_names(runs_dir)))
        old, old_short = timed(runs_dir, ids, len(ids), args.repeats)  # every end scanned for
        now, now_short = timed(runs_dir, ids, 0, args.repeats)
    assert now_short == old_short, "the index gave other short ids than the scan"
    print(f"short ids of all {len(ids):,} runs (fastest of {args.repeats}): old way (a scan per end) "
          f"{old:.3f} s, index {now:.3f} s, old / now {old / now:.1f}x")


if __name__ == "__main__":
    main()
