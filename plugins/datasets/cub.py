"""``cub``: Caltech-UCSD Birds-200-2011 (Wah et al. 2011), 100 / 50 / 50 classes.

Reads the ``CUB_200_2011`` folder as distributed (ROOT may be that folder or
its parent): ``images.txt`` (``<id> <class folder>/<file>.jpg``),
``classes.txt`` (``<class id> <name>``), ``image_class_labels.txt``
(``<id> <class id>``), ``bounding_box.txt`` (``<id> <x> <y> <width> <height>``)
and ``images/``. 11,788 images of 200 species.

Split: the rule of Chen et al. (2019, "A Closer Look at Few-shot
Classification"), which most few-shot papers on CUB use: with the 200 class
folders in sorted order, class i is for training if i is even, validation if
i % 4 == 1, test if i % 4 == 3. The resulting lists (the same as torchmeta
ships) are in ``plugins/datasets/splits/cub``.

With ``bbox=true`` each image is first cropped to its bounding box
(``(x, y, x + width, y + height)`` truncated to whole pixels). Images are
converted to RGB and resized to ``image_size`` (84 by default).
``check_counts`` (default) requires the four index files to have 11,788 rows
and every listed class to be present; without it any subset of the classes
(and rows) is accepted.
"""

from __future__ import annotations

import math
from pathlib import Path

from fslab_plugins.datasets.image_cache import CachedDataset, check_classes, decode_all, decode_file, shipped_list

from fslab.plugin import UsageError, hookimpl

IMAGES = 11_788
INDEX_FILES = ("images.txt", "classes.txt", "image_class_labels.txt", "bounding_box.txt")
LAYOUT = "ROOT/CUB_200_2011/{images.txt,classes.txt,image_class_labels.txt,bounding_box.txt,images/}"


class CUB(CachedDataset):
    """CUB-200-2011 birds, optionally cropped to their bounding boxes."""

    name = "cub"
    channels = 3
    layout = LAYOUT

    def __init__(self, root, *, image_size: int = 84, bbox: bool = False, cache_dir: str = "",
                 check_counts: bool = True):
        super().__init__(root, image_size=image_size, cache_dir=cache_dir, check_counts=check_counts)
        self.folder = self.root / "CUB_200_2011" if (self.root / "CUB_200_2011").is_dir() else self.root
        if self.folder == self.root and not (self.root / "images.txt").exists():  # neither the parent nor the folder
            raise UsageError(f"cub: found neither {self.root / 'CUB_200_2011'}/ nor {self.root / 'images.txt'}. "
                             f"Expected layout: {LAYOUT}. Point --data-root at the folder holding CUB_200_2011.")
        for name in (*INDEX_FILES, "images"):
            if not (self.folder / name).exists():
                raise UsageError(f"cub: {self.folder / name} not found. Expected layout: {LAYOUT}. "
                                 f"Point --data-root at the folder holding CUB_200_2011.")
        self.bbox = bbox
        self._tables: dict | None = None  # the index files, read once (_members)
        self._members_of: dict[str, tuple] = {}  # split -> _members(split)

    def class_counts(self, split):
        _, classes, in_split = self._members(split)
        return [len(in_split[c]) for c in classes]

    def listed_files(self, split):
        """images.txt and the image files it names for the split: the cache's sources after the index files."""
        return self.folder / "images.txt", list(self.planned(split)[2][len(INDEX_FILES):])

    def plan(self, split):
        tables, classes, in_split = self._members(split)
        ids = [i for c in classes for i in in_split[c]]
        boxes = [box_of(tables["bounding_box.txt"], i, self.folder) for i in ids] if self.bbox else [None] * len(ids)
        files = image_files(tables, classes, in_split, self.folder)
        labels = [k for k, c in enumerate(classes) for _ in in_split[c]]
        size, root = self.image_size, self.root

        def build():
            jobs = list(zip(files, boxes))
            return labels, classes, decode_all(jobs, lambda job: decode_file(job[0], size, "RGB", crop_box(job),
                                                                               root=root))

        stem = f"cub-{split}-{self.image_size}{'-bbox' if self.bbox else ''}"
        params = {"image_size": self.image_size, "bbox": self.bbox, "classes": classes}
        sources = [self.folder / name for name in INDEX_FILES] + files
        return stem, params, sources, build

    def _members(self, split):
        """The index tables, the split's classes (checked against the shipped list) and their image ids;
        the four tables read once for the three splits (the counts, the files listed and the cache's plan
        of each split read them again)."""
        if split not in self._members_of:
            if self._tables is None:
                self._tables = {name: read_table(self.folder / name) for name in INDEX_FILES}
            self._members_of[split] = self._split_members(split, self._tables)
        return self._members_of[split]

    def _split_members(self, split, tables):
        listed, list_name = shipped_list("cub", split)
        if self.check_counts:
            for name in ("images.txt", "image_class_labels.txt", "bounding_box.txt"):
                if len(tables[name]) != IMAGES:
                    raise UsageError(f"cub: {self.folder / name} is short: expected {IMAGES:,} rows, found "
                                     f"{len(tables[name]):,}; re-download it, or set dataset.check_counts=false")
        class_names = {cid: fields[0] for cid, fields in tables["classes.txt"].items()}
        paths = {i: fields[0] for i, fields in tables["images.txt"].items()}
        labels_of = {i: class_names.get(fields[0], "?") for i, fields in tables["image_class_labels.txt"].items()}
        members: dict[str, list[str]] = {}
        for image_id in paths:  # images.txt order
            name = labels_of.get(image_id)
            if name is None:
                raise UsageError(f"cub: image {image_id} of images.txt has no row in image_class_labels.txt")
            members.setdefault(name, []).append(image_id)
        in_split = {c: ids for c, ids in members.items() if c in set(listed)}  # the other splits' classes are skipped
        classes = check_classes(self.name, str(self.folder / "images.txt"), split,
                                {c: len(v) for c, v in in_split.items()}, listed, list_name=list_name,
                                per_class=None, total=None, check_counts=self.check_counts)
        return tables, classes, in_split


def read_table(path: Path) -> dict[str, list[str]]:
    """A CUB index file: first field (an id) -> the other fields, in file order."""
    rows = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 2:
            raise UsageError(f"cub: {path} line {number} has no value after the id: {line!r}")
        rows[fields[0]] = fields[1:]
    return rows


def image_files(tables: dict, classes: list[str], in_split: dict[str, list[str]], folder: Path) -> list[Path]:
    """The image files of ``classes`` (their ids in ``in_split``), as images.txt names them."""
    paths = {i: fields[0] for i, fields in tables["images.txt"].items()}
    return [folder / "images" / paths[i] for c in classes for i in in_split[c]]


def box_of(table: dict, image_id: str, folder: Path) -> tuple[float, float, float, float]:
    try:
        x, y, w, h = (float(v) for v in table[image_id][:4])
    except (KeyError, ValueError):
        raise UsageError(f"cub: {folder / 'bounding_box.txt'} has no valid box for image {image_id}") from None
    finite = all(math.isfinite(v) for v in (x, y, w, h))
    if not finite or int(x + w) <= int(x) or int(y + h) <= int(y):  # no whole pixel in it: crop_box's truncation
        raise UsageError(f"cub: {folder / 'bounding_box.txt'} has no valid box for image {image_id}: "
                         f"width {w:g} and height {h:g} at ({x:g}, {y:g}) hold no whole pixel; fix its row")
    return x, y, w, h


def crop_box(job):
    """(left, top, right, bottom) in whole pixels for PIL's ``crop``, or None."""
    _, box = job
    if box is None:
        return None
    x, y, w, h = box
    return int(x), int(y), int(x + w), int(y + h)


@hookimpl
def register_datasets(register):
    register(
        CUB,
        name="cub",
        description="CUB-200-2011 birds, Chen et al. 2019 split (100/50/50 classes), bounding-box crops optional",
        paper="Wah et al. 2011; split of Chen et al. 2019",
        check_early=True,  # fslab builds it in the CLI first: a wrong root fails at once
        defaults={"train": {"crop_padding": 8, "flip": True}},
    )
