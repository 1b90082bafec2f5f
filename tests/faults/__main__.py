"""``python -m tests.faults``: every fault and bad input, in fresh temporary
projects, then the tally the README records."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from tests.faults.lab import DataLost, Lab, Skipped, Unhandled
from tests.faults.scenarios import BAD_INPUTS, FAULTS, bad_input


def main() -> int:
    tried = handled = lost = 0
    skipped = []
    print("## Faults")
    for name, scenario in FAULTS.items():
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as folder:
            try:
                said = scenario(Lab(Path(folder) / "project"))
            except Skipped as why:
                skipped.append(f"{name} ({why})")
                print(f"  skipped   {name}: {why}")
                continue
            except DataLost as why:
                tried, lost, verdict, said = tried + 1, lost + 1, "LOST", str(why)
            except (Unhandled, Exception) as why:  # anything else is a failure of fslab too
                tried, verdict, said = tried + 1, "UNHANDLED", f"{type(why).__name__}: {why}"
            else:
                tried, handled, verdict = tried + 1, handled + 1, "handled"
        print(f"  {verdict:<9} {name}: {said} ({time.perf_counter() - started:.0f} s)")
    rejected = 0
    print("## Bad inputs")
    for name, (argv, files) in BAD_INPUTS.items():
        with tempfile.TemporaryDirectory() as folder:
            try:
                said = bad_input(Lab(Path(folder) / "project"), argv, files)
            except (Unhandled, Exception) as why:
                print(f"  ACCEPTED  {name}: {why}")
                continue
        rejected += 1
        print(f"  rejected  {name}: {said[:110]}")
    print(f"\nfaults: {tried} tried, {handled} handled, {lost} lost; bad inputs: {len(BAD_INPUTS)} tried, "
          f"{rejected} rejected in one line before any folder was made"
          + (f"; skipped here: {'; '.join(skipped)}" if skipped else ""))
    return 0 if handled == tried and rejected == len(BAD_INPUTS) else 1


if __name__ == "__main__":
    sys.exit(main())
