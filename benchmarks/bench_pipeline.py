"""Training data pipeline speed, one command: ``python benchmarks/bench_pipeline.py``.

Writes the same JPEG images (default 64 classes × 50, 84×84, random smooth
colour fields) as a ``ROOT/{train,val,test}/<class>/<image>.jpg`` tree, then
measures images per second delivered to the training device, augmented and
ready for the network, by

1. fslab: the ``folder`` dataset's uint8 cache, memory-mapped, the split moved
   to the device once, then per batch: index 128 rows, ``to_input`` and
   ``augment`` (random crop after 8-pixel padding, flip) from ``fslab.training.augment``
   on the device — what the training loop does;
2. the usual torchvision pipeline: ``ImageFolder`` + PIL decoding +
   ``RandomCrop(84, padding=8)``, ``RandomHorizontalFlip``, ``ToTensor``,
   ``Normalize`` in a ``DataLoader`` (2 workers, batch 128, shuffled,
   persistent workers), batches moved to the device.

Each pipeline runs one warm-up epoch, then ``--epochs`` timed epochs. The
one-off cache build (decoding every JPEG once) is timed and printed separately.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import options  # noqa: E402


def write_images(root: Path, classes: int, per_class: int, size: int) -> int:
    """JPEGs of smooth random colour fields (so they compress like photos, not noise)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    count = 0
    for split, n_classes in (("train", classes), ("val", 2), ("test", 2)):
        for c in range(n_classes):
            folder = root / split / f"class{c:03d}"
            folder.mkdir(parents=True)
            for i in range(per_class if split == "train" else 2):
                coarse = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
                image = Image.fromarray(coarse).resize((size, size), Image.Resampling.BICUBIC)
                image.save(folder / f"{i:04d}.jpg", quality=90)
                count += split == "train"
    return count


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fslab_pipeline(root: Path, size: int, batch: int, epochs: int, device: torch.device) -> tuple[float, float]:
    """(cache build seconds, images/s) for fslab's cached, on-device pipeline."""
    from fslab_plugins.datasets.folder import FolderDataset

    from fslab.training.augment import augment
    from fslab.training.build import to_input

    start = time.perf_counter()
    FolderDataset(root, image_size=size).load("train")  # decodes and writes the cache
    build = time.perf_counter() - start

    split = FolderDataset(root, image_size=size).load("train")  # a later run: memory-mapped
    images = split.images.to(device) if split.images.numel() < 2**31 else split.images
    generator = torch.Generator().manual_seed(0)
    checksum = torch.zeros((), device=device)

    def epoch() -> int:
        nonlocal checksum
        seen = 0
        order = torch.randperm(len(split), generator=generator)
        for first in range(0, len(order) - batch + 1, batch):
            index = order[first:first + batch].to(images.device)
            x = augment(to_input(images[index].to(device, non_blocking=True)), 8, True, generator)
            checksum = checksum + x[:, 0, 0, 0].sum()  # keep the work from being skipped
            seen += len(index)
        return seen

    epoch()  # warm-up
    sync(device)
    start, seen = time.perf_counter(), 0
    for _ in range(epochs):
        seen += epoch()
    sync(device)
    return build, seen / (time.perf_counter() - start)


def torchvision_pipeline(root: Path, size: int, batch: int, epochs: int, device: torch.device, workers: int) -> float:
    from torchvision import datasets, transforms

    transform = transforms.Compose([
        transforms.RandomCrop(size, padding=8), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.5] * 3),
    ])
    data = datasets.ImageFolder(str(root / "train"), transform=transform)
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
                                         persistent_workers=workers > 0, pin_memory=device.type == "cuda")
    checksum = torch.zeros((), device=device)

    def epoch() -> int:
        nonlocal checksum
        seen = 0
        for x, _ in loader:
            x = x.to(device, non_blocking=True)
            checksum = checksum + x[:, 0, 0, 0].sum()
            seen += len(x)
        return seen

    epoch()  # warm-up (starts the workers)
    sync(device)
    start, seen = time.perf_counter(), 0
    for _ in range(epochs):
        seen += epoch()
    sync(device)
    return seen / (time.perf_counter() - start)


def main() -> None:
    parser = options.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=64)
    parser.add_argument("--per-class", type=int, default=50)
    parser.add_argument("--size", type=int, default=84)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per pipeline (after one warm-up)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of the torchvision pipeline")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    options.at_least(parser, args, classes=1, per_class=1, size=1, batch=1, epochs=1, workers=0)
    if args.batch > args.classes * args.per_class:
        parser.error(f"--batch must be at most the {args.classes * args.per_class} training images "
                     f"(--classes × --per-class), got {args.batch}")
    device = options.device(parser, args.device, auto=True)
    if importlib.util.find_spec("torchvision") is None:  # the baseline, measured after fslab's side
        raise SystemExit("bench_pipeline.py compares fslab's pipeline with torchvision's, and torchvision is not "
                         "installed here: pip install torchvision")

    root = Path(tempfile.mkdtemp(prefix="fslab-bench-pipeline-"))
    try:
        count = write_images(root, args.classes, args.per_class, args.size)
        print(f"{count:,} training JPEGs of {args.size}×{args.size} in {root}; device {device}, "
              f"batch {args.batch}, {args.epochs} timed epochs after a warm-up")
        build, fslab_rate = fslab_pipeline(root, args.size, args.batch, args.epochs, device)
        print(f"cache build (decode every JPEG once, write the uint8 file): {build:.2f} s "
              f"({count / build:,.0f} images/s)")
        print(f"fslab (memory-mapped cache, index + to_input + augment on {device.type}): {fslab_rate:,.0f} images/s")
        baseline = torchvision_pipeline(root, args.size, args.batch, args.epochs, device, args.workers)
        print(f"torchvision ImageFolder + PIL + transforms + DataLoader ({args.workers} workers): "
              f"{baseline:,.0f} images/s")
        print(f"ratio fslab / torchvision: {fslab_rate / baseline:.1f}×")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
