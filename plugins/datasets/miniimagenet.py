"""``miniimagenet``: miniImageNet (Vinyals et al. 2016) with the Ravi & Larochelle (2017) split.

100 ImageNet classes, 600 images each: 64 training, 16 validation and 20 test
classes (38,400 / 9,600 / 12,000 images). The class lists ship with fslab in
``plugins/datasets/splits/miniimagenet/{train,val,test}.txt`` (ImageNet wnids). Two
layouts are read under ROOT; ``source="auto"`` takes the first one present:

- ``csv``: ``images/`` plus ``train.csv``, ``val.csv``, ``test.csv``, each with
  a header and one ``filename,label`` row per image (``n0153282900000005.jpg,n01532829``);
  images are read from ``images/<filename>`` and resized to ``image_size``.
- ``pickle``: ``mini-imagenet-cache-{train,val,test}.pkl``, each a dict with
  ``image_data`` (uint8 N×84×84×3) and ``class_dict`` (wnid -> list of row indices).

Either way a split is decoded once into the uint8 cache of :mod:`image_cache`.
With ``check_counts`` (default) a split must hold exactly its listed classes,
600 images each; ``check_counts=false`` accepts any subset of the listed
classes (tiny copies for tests, quick experiments).
"""

from __future__ import annotations

from pathlib import Path

from fslab_plugins.datasets import image_cache
from fslab_plugins.datasets.image_cache import (
    CachedDataset,
    check_classes,
    decode_all,
    decode_file,
    require,
    shipped_list,
)

from fslab.plugin import UsageError, at_least, hookimpl, one_of

PER_CLASS = 600
CSV_LAYOUT = "ROOT/images/*.jpg with ROOT/{train,val,test}.csv ('filename,label' rows)"
PICKLE_LAYOUT = "ROOT/mini-imagenet-cache-{train,val,test}.pkl (dicts with image_data and class_dict)"
SOURCES = ("auto", "csv", "pickle")


class MiniImageNet(CachedDataset):
    """miniImageNet from its csv + images layout or its pickled arrays."""

    name = "miniimagenet"
    channels = 3
    layout = f"{CSV_LAYOUT}, or {PICKLE_LAYOUT}"

    def __init__(self, root, *, image_size: int = 84, source: str = "auto", cache_dir: str = "",
                 check_counts: bool = True):
        super().__init__(root, image_size=image_size, cache_dir=cache_dir, check_counts=check_counts)
        if source not in SOURCES:
            raise UsageError(f"miniimagenet: unknown source '{source}'. Allowed: {', '.join(SOURCES)}.")
        if source == "auto":
            source = "pickle" if (self.root / "mini-imagenet-cache-train.pkl").exists() and not (
                self.root / "train.csv").exists() else "csv"
            if source == "csv" and not (self.root / "train.csv").exists():
                raise UsageError(f"miniimagenet: found neither {self.root / 'train.csv'} nor "
                                 f"{self.root / 'mini-imagenet-cache-train.pkl'}. Expected layout: {self.layout}.")
        self.source = source
        self._csv: dict[str, tuple] = {}  # split -> _csv_classes(split)
        if source == "csv":
            require(self.root / "images", self.name, CSV_LAYOUT)
            for split in ("train", "val", "test"):
                require(self.root / f"{split}.csv", self.name, CSV_LAYOUT)
        else:
            for split in ("train", "val", "test"):
                require(self.root / f"mini-imagenet-cache-{split}.pkl", self.name, PICKLE_LAYOUT)

    def plan(self, split):
        expected, list_name = shipped_list("miniimagenet", split)
        stem = f"miniimagenet-{split}-{self.image_size}"
        params = {"source": self.source, "image_size": self.image_size, "check_counts": self.check_counts}
        if self.source == "pickle":
            path = self.root / f"mini-imagenet-cache-{split}.pkl"
            return stem, {**params, "listed": expected}, [path], lambda: self._build_from_pickle(  # it orders them
                path, split, expected, list_name)

        csv_path, found, classes = self._csv_classes(split)
        files = self._images(found, classes)
        labels = [i for i, c in enumerate(classes) for _ in found[c]]
        size, root = self.image_size, self.root

        def build():
            return labels, classes, decode_all(files, lambda path: decode_file(path, size, "RGB", root=root))

        return stem, {**params, "classes": classes}, [csv_path, *files], build

    def listed_files(self, split):
        """The csv file and the images it names (the pickles name none)."""
        if self.source != "csv":
            return None, []
        csv_path, *files = self.planned(split)[2]  # the paths the cache's key is made of, made once
        return csv_path, files

    def _images(self, found: dict[str, list[str]], classes: list[str]) -> list[Path]:
        """The image files the csv names for ``classes``, in class order."""
        images = self.root / "images"
        return [images / name for c in classes for name in found[c]]

    def class_counts(self, split):
        """Counted in the csv file; a pickle holds exactly its listed classes × 600 when
        ``check_counts`` is on (the worker checks it as it reads the file), and is not read here."""
        if self.source == "csv":
            _, found, classes = self._csv_classes(split)
            return [len(found[c]) for c in classes]
        if self.check_counts:
            return [PER_CLASS] * len(shipped_list("miniimagenet", split)[0])
        return None

    def _csv_classes(self, split: str) -> tuple[Path, dict[str, list[str]], list[str]]:
        """The split's csv file, its file names by class, and its classes checked against the shipped list;
        read once (the counts, the files listed and the cache's plan each read it again)."""
        if split not in self._csv:
            self._csv[split] = self._read_csv_classes(split)
        return self._csv[split]

    def _read_csv_classes(self, split: str) -> tuple[Path, dict[str, list[str]], list[str]]:
        expected, list_name = shipped_list("miniimagenet", split)
        csv_path = self.root / f"{split}.csv"
        found: dict[str, list[str]] = {}
        for filename, label in read_csv(csv_path):
            found.setdefault(label, []).append(filename)
        classes = check_classes(self.name, str(csv_path), split, {c: len(v) for c, v in found.items()}, expected,
                                list_name=list_name, per_class=PER_CLASS, total=PER_CLASS * len(expected),
                                check_counts=self.check_counts)
        return csv_path, found, classes

    def _build_from_pickle(self, path: Path, split: str, expected: list[str], list_name: str):
        import numpy as np

        data = load_pickle(path)
        if not isinstance(data, dict) or "image_data" not in data or "class_dict" not in data:
            raise UsageError(f"miniimagenet: {path} is not a miniImageNet cache (a dict with image_data and "
                             f"class_dict). Expected layout: {PICKLE_LAYOUT}.")
        images, class_dict = np.asarray(data["image_data"]), data["class_dict"]
        if images.ndim != 4 or images.shape[3] != 3:
            raise UsageError(f"miniimagenet: {path}: image_data must be N×H×W×3, got shape {images.shape}")
        found = {str(c): len(rows) for c, rows in class_dict.items()}
        classes = check_classes(self.name, str(path), split, found, expected, list_name=list_name,
                                per_class=PER_CLASS, total=PER_CLASS * len(expected), check_counts=self.check_counts)
        if self.check_counts and len(images) != PER_CLASS * len(expected):
            raise UsageError(f"miniimagenet: {path} is short: expected {PER_CLASS * len(expected):,} rows of "
                             f"image_data, found {len(images):,}; re-download it, or set dataset.check_counts=false")
        order = np.concatenate([np.asarray(class_dict[c], dtype=np.int64) for c in classes])
        labels = np.repeat(np.arange(len(classes)), [len(class_dict[c]) for c in classes])
        return labels, classes, resized_blocks(images, order, self.image_size)


def read_csv(path: Path) -> list[tuple[str, str]]:
    """``(filename, label)`` rows of a Ravi-style csv; the header line is skipped."""
    import csv

    with open(path, newline="", encoding="utf-8-sig") as fh:  # -sig: a byte-order mark (Excel's) is not text
        rows = [row for row in csv.reader(fh) if row]
    if rows and rows[0][:2] == ["filename", "label"]:
        rows = rows[1:]
    bad = [row for row in rows if len(row) != 2]
    if bad:
        raise UsageError(f"miniimagenet: {path}: every row must be 'filename,label', got {','.join(bad[0])!r}")
    return [(name.strip(), label.strip()) for name, label in rows]


def load_pickle(path: Path):
    """A pickle written by Python 3, or by Python 2 (latin-1 strings); a file that is
    not one (cut short by a download, overwritten) is one line naming it."""
    import pickle

    with open(path, "rb") as fh:
        try:
            try:
                return pickle.load(fh)
            except UnicodeDecodeError:
                fh.seek(0)
                return pickle.load(fh, encoding="latin1")
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - unpickling damaged bytes raises almost any exception
            raise UsageError(f"{path} cannot be read as a pickle ({type(exc).__name__}: {exc}); "
                             f"it may be truncated or damaged: re-create or re-download it") from None


def resized_blocks(images, order, size: int):
    """Blocks of ``images[order]`` (N×H×W×C uint8) as ``[k, C, size, size]``;
    resized with PIL's bilinear filter only when ``size`` differs."""
    import numpy as np
    from PIL import Image

    for start in range(0, len(order), image_cache.CHUNK):
        block = images[order[start:start + image_cache.CHUNK]]
        if block.shape[1:3] != (size, size):
            block = np.stack([np.asarray(Image.fromarray(img).resize((size, size), Image.Resampling.BILINEAR))
                              for img in block])
        yield block.transpose(0, 3, 1, 2)


@hookimpl
def register_datasets(register):
    register(
        MiniImageNet,
        name="miniimagenet",
        description="miniImageNet, Ravi & Larochelle split (64/16/20 classes × 600): images/ + csv files, "
                    "or mini-imagenet-cache-*.pkl",
        paper="Vinyals et al. 2016; Ravi & Larochelle 2017",
        # NCA paper recipe (Sec. 4.1): 84×84 images, flip and random crop, the
        # core defaults otherwise (120 epochs, batch 512, lr ÷10 at 70%).
        check_early=True,  # fslab builds it in the CLI first: a wrong root fails at once
        allowed={"source": one_of(*SOURCES), "image_size": at_least(1)},
        defaults={"train": {"crop_padding": 8, "flip": True}},
    )
