"""``tieredimagenet``: tieredImageNet (Ren et al. 2018).

608 ImageNet classes grouped by WordNet into 34 high-level categories, split so
that training classes are semantically distant from the others: 351 training,
97 validation and 160 test classes (448,695 / 124,261 / 206,209 images). The
class lists (ImageNet wnids) ship in ``plugins/datasets/splits/tieredimagenet/``. Two
layouts are read under ROOT; ``source="auto"`` takes the first one present:

- ``pickle``: ``{split}_images_png.pkl`` (a list of PNG-encoded images, each a
  byte string or uint8 array) and ``{split}_labels.pkl`` (a dict with
  ``label_specific``: the class index of each image, and optionally
  ``label_general``, ``label_specific_str``: the class names by index,
  ``label_general_str``). Without ``label_specific_str`` the classes are named
  ``class-000``… and only their number and the image total are checked.
- ``folders``: ``ROOT/{train,val,test}/<wnid>/<image>``, as the ``folder`` dataset.

Images are decoded once, resized to ``image_size`` (84 by default: the
pickles hold 84×84 images), into the uint8 cache of :mod:`image_cache`.
``check_counts`` works as for ``miniimagenet``.
"""

from __future__ import annotations

from fslab_plugins.datasets.folder import scan_tree, tree_plan
from fslab_plugins.datasets.image_cache import (
    CachedDataset,
    check_classes,
    decode_all,
    decode_bytes,
    require,
    shipped_list,
)
from fslab_plugins.datasets.miniimagenet import load_pickle

from fslab.plugin import UsageError, at_least, hookimpl, one_of

TOTALS = {"train": 448_695, "val": 124_261, "test": 206_209}
PICKLE_LAYOUT = "ROOT/{train,val,test}_images_png.pkl with ROOT/{train,val,test}_labels.pkl"
FOLDER_LAYOUT = "ROOT/{train,val,test}/<wnid>/<image files>"
SOURCES = ("auto", "pickle", "folders")


class TieredImageNet(CachedDataset):
    """tieredImageNet from its PNG pickles or from split folders."""

    name = "tieredimagenet"
    channels = 3
    layout = f"{PICKLE_LAYOUT}, or {FOLDER_LAYOUT}"

    def __init__(self, root, *, image_size: int = 84, source: str = "auto", cache_dir: str = "",
                 check_counts: bool = True):
        super().__init__(root, image_size=image_size, cache_dir=cache_dir, check_counts=check_counts)
        if source not in SOURCES:
            raise UsageError(f"tieredimagenet: unknown source '{source}'. Allowed: {', '.join(SOURCES)}.")
        if source == "auto":
            if (self.root / "train_images_png.pkl").exists():
                source = "pickle"
            elif (self.root / "train").is_dir():
                source = "folders"
            else:
                raise UsageError(f"tieredimagenet: found neither {self.root / 'train_images_png.pkl'} nor "
                                 f"{self.root / 'train'}/. Expected layout: {self.layout}.")
        self.source = source
        self._trees: dict[str, tuple] = {}
        for split in ("train", "val", "test"):
            if source == "pickle":
                require(self.root / f"{split}_images_png.pkl", self.name, PICKLE_LAYOUT)
                require(self.root / f"{split}_labels.pkl", self.name, PICKLE_LAYOUT)
            else:
                require(self.root / split, self.name, FOLDER_LAYOUT)

    def plan(self, split):
        expected, list_name = shipped_list("tieredimagenet", split)
        stem = f"tieredimagenet-{split}-{self.image_size}"
        params = {"source": self.source, "image_size": self.image_size, "check_counts": self.check_counts}
        if self.source == "pickle":
            images_path, labels_path = self.root / f"{split}_images_png.pkl", self.root / f"{split}_labels.pkl"
            return stem, {**params, "listed": expected}, [images_path, labels_path], lambda: self._build_from_pickles(
                images_path, labels_path, split, expected, list_name)
        tree, classes = self._folder_classes(split)
        files, build = tree_plan(tree, classes, self.image_size, "RGB", self.root)
        return stem, {**params, "classes": classes}, files, build

    def image_files(self, split):
        """The images of the split folders (the pickles' are read only by the decode)."""
        return [] if self.source == "pickle" else self.planned(split)[2]

    def class_counts(self, split):
        """Counted in the split folders; the pickles say it only once read whole, so not for them."""
        if self.source == "pickle":
            return None
        tree, classes = self._folder_classes(split)
        return [len(tree[c]) for c in classes]

    def _folder_classes(self, split):
        """The split folder's class tree and its classes, checked against the shipped list; listed once (the
        counts, the headers read before a run and the cache's key would each list 779,165 files again)."""
        if split not in self._trees:
            expected, list_name = shipped_list("tieredimagenet", split)
            tree = scan_tree(self.root / split, self.name)
            classes = check_classes(self.name, str(self.root / split), split, {c: len(v) for c, v in tree.items()},
                                    expected, list_name=list_name, per_class=None, total=TOTALS[split],
                                    check_counts=self.check_counts)
            self._trees[split] = tree, classes
        return self._trees[split]

    def _build_from_pickles(self, images_path, labels_path, split, expected, list_name):
        import numpy as np

        meta = load_pickle(labels_path)
        if not isinstance(meta, dict) or "label_specific" not in meta:
            raise UsageError(f"tieredimagenet: {labels_path} must be a dict with 'label_specific'. "
                             f"Expected layout: {PICKLE_LAYOUT}.")
        raw = np.asarray(meta["label_specific"], dtype=np.int64).reshape(-1)
        encoded = load_pickle(images_path)
        if len(encoded) != len(raw):
            raise UsageError(f"tieredimagenet: {images_path} holds {len(encoded):,} images but {labels_path} "
                             f"has {len(raw):,} labels; one of the two files is short")
        ids = sorted(set(raw.tolist()))
        names = meta.get("label_specific_str")
        source = f"{labels_path}"
        if names is not None:
            names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
            if ids and ids[-1] >= len(names):
                raise UsageError(f"tieredimagenet: {labels_path}: label {ids[-1]} has no name in label_specific_str "
                                 f"({len(names)} names)")
            counts = {names[i]: int((raw == i).sum()) for i in ids}
            classes = check_classes(self.name, source, split, counts, expected, list_name=list_name,
                                    per_class=None, total=TOTALS[split], check_counts=self.check_counts)
            new_index = {names.index(c): k for k, c in enumerate(classes)}
        else:
            if self.check_counts and (len(ids) != len(expected) or len(raw) != TOTALS[split]):
                raise UsageError(f"tieredimagenet: {source} is short: expected {len(expected)} classes and "
                                 f"{TOTALS[split]:,} images, found {len(ids)} and {len(raw):,}; re-download it, "
                                 f"or set dataset.check_counts=false")
            classes = [f"class-{i:03d}" for i in ids]
            new_index = {i: k for k, i in enumerate(ids)}
        labels = np.array([new_index[i] for i in raw.tolist()], dtype=np.int64)
        size = self.image_size
        return labels, classes, decode_all(encoded, lambda data: decode_bytes(data, size, "RGB"))


@hookimpl
def register_datasets(register):
    register(
        TieredImageNet,
        name="tieredimagenet",
        description="tieredImageNet, Ren et al. split (351/97/160 classes): *_images_png.pkl + *_labels.pkl, "
                    "or split folders",
        paper="Ren et al. 2018",
        # NCA paper App. A.4: batch 1024, lr ÷10 after 50% and 75% of training.
        check_early=True,  # fslab builds it in the CLI first: a wrong root fails at once
        allowed={"source": one_of(*SOURCES), "image_size": at_least(1)},
        defaults={"train": {"batch_size": 1024, "milestones": [0.5, 0.75], "crop_padding": 8, "flip": True}},
    )
