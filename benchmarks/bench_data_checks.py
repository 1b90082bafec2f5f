"""What fslab reads of a papers-sized dataset before and at a run's start, one command:
``python benchmarks/bench_data_checks.py``.

Makes miniImageNet in its csv layout (``images/`` and ``{train,val,test}.csv``, the 100 classes of
the shipped lists, 600 JPEGs of 84×84 each: 60,000 files) in a temporary folder, or with ``--layout
folders`` as split folders (``{train,val,test}/<wnid>/``) read by the ``folder`` dataset (the listing
tieredImageNet's split folders are read by too), then times, each with a dataset built afresh as the
CLI and a worker build theirs:

1. the checks before a run exists on a root with nothing cached (``split_sizes()``: the index files,
   every listed file found, the headers of the splits not cached yet read);
2. the cache build, a first run's worker loading the three splits (every image decoded once);
3. the checks before a second run, the cache warm;
4. that run's worker loading the three splits from the warm cache.

For each it counts what it asks of the file system per image file (``os.stat`` and ``os.lstat``,
files opened; a folder listing's own stats, where the file system tells no file type, are not seen)
and how often an index file is opened, by wrapping those functions in this process, and
prints the seconds against a floor measured in the same run on the same files: one ``os.stat`` of
every image (what the cache's key needs of each), and that plus one header read with PIL (what a
split not cached yet needs) for the first checks.

Options: ``--scale F`` (1: the share of the 600 images a class to make; below 1 the counts are not
checked, ``check_counts=false``), ``--layout csv|folders`` (csv), ``--dir DIR`` (where the temporary
folder goes: the system's temporary folder by default; 60,000 JPEGs take about 150 MB; it is deleted at
the end).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import options  # noqa: E402

PER_CLASS = 600
SPLITS = ("train", "val", "test")
SIZE = 84
LAYOUTS = {"csv": "csv layout", "folders": "split folders read by the folder dataset"}


def make_root(root: Path, per_class: int, layout: str) -> list[Path]:
    """miniImageNet under ``root`` with ``per_class`` JPEGs of each shipped class, in its csv layout or as
    split folders (``ROOT/{train,val,test}/<wnid>/``); its image files. A few distinct JPEGs are written
    again and again: every one is decoded as any other."""
    import numpy as np
    from fslab_plugins.datasets.image_cache import shipped_list
    from PIL import Image

    rng = np.random.default_rng(0)
    variants = []
    for _ in range(16):
        smooth = np.linspace(0, 255, SIZE)[None, :, None] * rng.random(3) + rng.integers(0, 40, (SIZE, SIZE, 3))
        out = io.BytesIO()
        Image.fromarray(np.clip(smooth, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
        variants.append(out.getvalue())
    files = []
    for split in SPLITS:
        rows = ["filename,label"]
        for wnid in shipped_list("miniimagenet", split)[0]:
            folder = root / "images" if layout == "csv" else root / split / wnid
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                name = f"{wnid}{i + 1:08d}.jpg"
                (folder / name).write_bytes(variants[len(files) % len(variants)])
                rows.append(f"{name},{wnid}")
                files.append(folder / name)
        if layout == "csv":
            (root / f"{split}.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return files


class Calls:
    """Counts of ``os.stat``/``os.lstat`` and of files opened, on the image files and on the index
    files, while it is entered (the functions wrapped in this process; threads counted too)."""

    def __init__(self, root: Path) -> None:
        self.root = str(root) + os.sep
        self.counts: Counter = Counter()
        self.lock = threading.Lock()

    def note(self, kind: str, path) -> None:
        try:
            text = os.fsdecode(path)
        except TypeError:  # a file descriptor, an open file
            return
        where = ("image" if text.startswith(self.root) and text.endswith(".jpg") else
                 "index" if text.endswith(".csv") else None)
        if where:
            with self.lock:
                self.counts[f"{where} {kind}"] += 1

    @contextlib.contextmanager
    def counting(self):
        self.counts.clear()
        kept = os.stat, os.lstat, builtins.open, io.open

        def wrap(function, kind):
            def counted(path, *args, **kwargs):
                self.note(kind, path)
                return function(path, *args, **kwargs)
            return counted

        os.stat, os.lstat = wrap(kept[0], "stat"), wrap(kept[1], "stat")
        builtins.open = io.open = wrap(kept[2], "open")
        try:
            yield self.counts
        finally:
            os.stat, os.lstat, builtins.open, io.open = kept


def timed(calls: Calls, what) -> tuple[float, Counter]:
    with calls.counting() as counts:
        start = time.perf_counter()
        what()
        return time.perf_counter() - start, Counter(counts)


def floors(files: list[Path]) -> tuple[float, float]:
    """Seconds for one ``os.stat`` of every image, and for one PIL header read of every image."""
    from PIL import Image

    start = time.perf_counter()
    for path in files:
        os.stat(path)
    stat_s = time.perf_counter() - start
    start = time.perf_counter()
    for path in files:
        with Image.open(path):
            pass
    return stat_s, time.perf_counter() - start


def row(name: str, seconds: float, counts: Counter, images: int, floor: float | None) -> str:
    """One phase: seconds, stats and opens per image, csv files opened, and the seconds against ``floor``
    (images/s where it has none: the cache build)."""
    stats, opens = (counts[f"image {kind}"] / images for kind in ("stat", "open"))
    against = f"{images / seconds:,.0f} images/s" if floor is None else f"{seconds / max(floor, 1e-9):7.1f}x"
    return f"{name:<36} {seconds:7.2f} s {stats:5.2f} {opens:5.2f} {counts['index open']:4d} {against}"


def main() -> None:
    parser = options.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--layout", choices=("csv", "folders"), default="csv")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    if not 0 < args.scale <= 1:
        parser.error(f"--scale must be above 0 and at most 1, got {args.scale}")
    if args.dir is not None and not args.dir.is_dir():
        parser.error(f"--dir {args.dir}: there is no such folder; make it first")
    per_class = max(1, round(PER_CLASS * args.scale))
    from fslab_plugins.datasets.folder import FolderDataset
    from fslab_plugins.datasets.miniimagenet import MiniImageNet

    print(options.machine())
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="fslab-bench-data-") as folder:
        root = Path(folder) / "miniimagenet"
        start = time.perf_counter()
        files = make_root(root, per_class, args.layout)
        images = len(files)
        print(f"miniImageNet, {LAYOUTS[args.layout]}: {images:,} JPEGs of {SIZE}×{SIZE} ({per_class} a class) "
              f"made in {time.perf_counter() - start:.1f} s")
        stat_s, header_s = floors(files)
        print(f"floor: one os.stat of every image {stat_s:.2f} s, one header read of every image {header_s:.2f} s")

        def dataset():
            if args.layout == "folders":
                return FolderDataset(root, image_size=SIZE)
            return MiniImageNet(root, source="csv", check_counts=per_class == PER_CLASS)

        import torch  # noqa: F401 - as a worker has it before it loads a split: its import is not timed

        calls = Calls(root)
        phases = [("checks before a run, nothing cached", lambda: dataset().split_sizes(), stat_s + header_s),
                  ("cache build (first run's worker)", lambda: [dataset().load(s) for s in SPLITS], None),
                  ("checks before a run, cache warm", lambda: dataset().split_sizes(), stat_s),
                  ("worker's loads, cache warm", lambda: [dataset().load(s) for s in SPLITS], stat_s)]
        print(f"{'':<36} {'seconds':>9} {'stats':>5} {'opens':>5} {'csv':>4} {'/ floor':>8}   "
              f"(stats and opens an image, csv files opened)", flush=True)
        for name, what, floor in phases:
            seconds, counts = timed(calls, what)
            print(row(name, seconds, counts, images, floor), flush=True)


if __name__ == "__main__":
    main()
