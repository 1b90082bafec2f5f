"""``folder``: any image tree laid out as ``ROOT/{train,val,test}/<class>/<image>``.

The layout most people convert their data to (and the one torchvision's
``ImageFolder`` reads). Each class is a sub-folder; classes are numbered in
sorted order of their folder names, images are read in sorted order of their
file names (``.jpg .jpeg .jfif .jpe .png .bmp .gif .webp .tif .tiff .ppm .pgm .pbm .pnm``, any case), turned
upright as a photo's EXIF orientation says, converted to RGB (or grayscale with
``grayscale=true``) and resized to
``image_size``×``image_size``. Each split is decoded once into the uint8 cache of
:mod:`image_cache`. There is no standard split to check against: every class
folder found is used, a class folder without images is an error, and so is a
class name found in two splits (few-shot splits hold disjoint classes: a test
class seen in training would inflate every test score). Before a run exists,
the header of every image of a split not cached yet is read (a file that is no
image is one line then, not a failed run); a file cut short after its header
is found by the decode at the run's start. Either is named by its path in the
data root.
"""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path

from fslab_plugins.datasets.image_cache import (
    IMAGE_EXTENSIONS,
    CachedDataset,
    decode_all,
    decode_file,
    list_images,
    refuse_broken_link,
    require,
)

from fslab.plugin import UsageError, hookimpl

LAYOUT = "ROOT/{train,val,test}/<class>/<image files>"
SPLITS = ("train", "val", "test")
# folders of metadata beside the images, never classes: macOS's in a zip archive it made (of ._ files), a Synology
# NAS's thumbnails in every folder it indexes
NOT_CLASSES = ("__MACOSX", "@eaDir")
USES = {"train": "trains on", "val": "validates on after each epoch", "test": "tests on at the end"}
# other names shared trees give their splits (any case): told as the folder to rename, never read as the split
ALIASES = {"train": ("train", "training", "trn"), "val": ("val", "valid", "validation", "dev"),
           "test": ("test", "testing", "tst")}


def refuse_missing_split(root: Path, dataset: str) -> None:
    """A UsageError for the first of train/, val/ and test/ that ``root`` lacks: the folder to give
    instead where ``root`` is one level off, what the split is for where the tree has the others."""
    for split in SPLITS:
        if (root / split).exists():
            continue
        refuse_broken_link(root / split)  # a split folder kept on a disk that is not mounted
        near = layout_near(root)
        if near is not None:
            raise UsageError(f"{dataset}: {root / split} not found, but {near} holds train/, val/ and test/: "
                             f"give --data-root {near} (or [data_roots] {dataset} in fslab.toml)")
        other = named_otherwise(root, split)
        if other is not None:
            raise UsageError(f"{dataset}: {root / split} not found, but {other} is there: the splits are read by "
                             f"the names train/, val/ and test/ only; rename it: mv {shlex.quote(str(other))} "
                             f"{shlex.quote(str(root / split))}")
        present = " and ".join(f"{s}/" for s in SPLITS if (root / s).exists())
        if present:
            raise UsageError(f"{dataset}: {root / split} not found: the tree has {present} but no {split}/, whose "
                             f"classes fslab {USES[split]}; give {split}/ class folders of its own (classes in no "
                             f"other split, as many as eval.ways at least)")
        require(root / split, dataset, LAYOUT)


def named_otherwise(root: Path, split: str) -> Path | None:
    """The one folder of ``root`` named as shared trees name ``split`` (``validation/``, ``Train/``), or None."""
    try:
        found = [p for p in root.iterdir() if p.name.lower() in ALIASES[split] and p.name != split and p.is_dir()]
    except OSError:  # a root this user cannot list: the plain line on the split missing says it
        return None
    return found[0] if len(found) == 1 else None


def layout_near(root: Path) -> Path | None:
    """The folder beside ``root`` that holds train/, val/ and test/, where ``root`` lacks them: its
    parent, when ``root`` is one of its splits, or its one sub-folder that does (an archive unpacked
    into a folder of its own)."""
    def holds(folder: Path) -> bool:
        return all((folder / split).is_dir() for split in SPLITS)

    if root.name in SPLITS and holds(root.parent):
        return root.parent
    try:
        inside = [p for p in root.iterdir() if not p.name.startswith(".") and p.is_dir() and holds(p)]
    except OSError:  # a root this user cannot list: the plain line on the split missing says it
        return None
    return inside[0] if len(inside) == 1 else None


def scan_tree(split_dir: Path, dataset: str) -> dict[str, list[Path]]:
    """Class folder name -> its image files (sorted), for every sub-folder of ``split_dir``."""
    if not split_dir.is_dir():  # a file where the split's folder belongs
        raise UsageError(f"{dataset}: {split_dir} is not a folder. Expected layout: {LAYOUT}.")
    entries = listed(split_dir)
    for path in entries:  # a linked class folder that is gone would leave its class out
        refuse_broken_link(path)
    classes = sorted(p.name for p in entries if p.is_dir())
    if not classes:
        raise UsageError(f"{dataset}: {split_dir} has no class folders. Expected layout: {LAYOUT}.")
    tree = {c: list_images(split_dir / c) for c in classes}
    empty = [c for c, files in tree.items() if not files]
    if empty:
        many = len(empty) > 1
        raise UsageError(f"{dataset}: {split_dir / empty[0]} has no image files ({len(empty)} empty class "
                         f"folder{'s' if many else ''}){unread(split_dir / empty[0])}; remove "
                         f"{'them' if many else 'it'} or add images")
    return tree


def listed(folder: Path) -> list[Path]:
    """What ``folder`` holds but hidden files and folders (``.DS_Store``, ``._x.jpg``) and the metadata
    folders that are never classes (``NOT_CLASSES``)."""
    return [p for p in folder.iterdir() if not p.name.startswith(".") and p.name not in NOT_CLASSES]


def unread(folder: Path) -> str:
    """What a class folder without image files holds that is not read, as ``: it holds 20 .svg files, ...``
    (drawings saved as .svg, a folder of sub-folders), where the bare 'has no image files' of a folder full
    of photos left one to guess why; empty where it holds nothing."""
    entries = listed(folder)
    kinds = Counter(p.suffix.lower() or "extension-less" for p in entries if p.is_file())
    subfolders = sorted(p.name for p in entries if p.is_dir())
    told = []
    if kinds:
        told.append(", ".join(f"{n} {kind} file{'s' if n > 1 else ''}" for kind, n in kinds.most_common(3))
                    + (", ..." if len(kinds) > 3 else "") + f" (the images read are {' '.join(IMAGE_EXTENSIONS)}, "
                    "in any case: convert them to one of these)")
    if subfolders:
        told.append(f"{len(subfolders)} sub-folder{'s' if len(subfolders) > 1 else ''} ({subfolders[0]}/"
                    f"{', ...' if len(subfolders) > 1 else ''}), whose images are not read: a class's images lie "
                    f"directly in its folder")
    return f": it holds {' and '.join(told)}" if told else ""


def refuse_shared_classes(root: Path, trees: dict[str, dict[str, list[Path]]], dataset: str) -> None:
    """A UsageError naming a class folder name that two splits both hold, and how many names are
    shared, or two class folders that are one folder (a link to the other): the same images as two classes.

    Few-shot learning tests on classes never seen in training; with the same class in
    ``train/`` and ``test/`` the test would score recognition of trained classes. ``trees``: each
    split's :func:`scan_tree`, listed once for this check and the class counts."""
    splits: dict[str, list[str]] = {}  # class folder name -> the splits holding it
    folders: dict[Path, Path] = {}  # the folder a class folder is, links followed -> that class folder
    for split in SPLITS:
        for name in trees[split]:
            path = root / split / name
            splits.setdefault(name, []).append(split)
            same = folders.setdefault(path.resolve(), path)
            if same != path:
                raise UsageError(f"{dataset}: {path} and {same} are one folder (a link leads from one to the "
                                 f"other), so its images would be two classes; remove the link")
    shared = sorted(name for name, where in splits.items() if len(where) > 1)
    if shared:
        first, second = splits[shared[0]][:2]
        more = f" ({len(shared)} names are in more than one split)" if len(shared) > 1 else ""
        raise UsageError(f"{dataset}: the class '{shared[0]}' is in both {root / first}/ and {root / second}/{more}; "
                         f"few-shot splits must hold disjoint classes (a test class seen in training inflates "
                         f"its scores): rename the folders, or move each class into one split")


def tree_plan(tree: dict[str, list[Path]], classes: list[str], size: int, mode: str, root: Path, exif: bool = False):
    """Source files, labels and a build function for the classes of ``tree``, in ``classes`` order
    (``root``: the data root, whose path a file that cannot be decoded is named by; ``exif``: each photo
    turned as its EXIF orientation says, :func:`decode_file`)."""
    files = [path for c in classes for path in tree[c]]
    labels = [i for i, c in enumerate(classes) for _ in tree[c]]

    def build():
        return labels, classes, decode_all(files, lambda path: decode_file(path, size, mode, root=root, exif=exif))

    return files, build


class FolderDataset(CachedDataset):
    """Images in class folders, one tree per split."""

    name = "folder"
    layout = LAYOUT

    def __init__(self, root, *, image_size: int = 84, grayscale: bool = False, cache_dir: str = ""):
        super().__init__(root, image_size=image_size, cache_dir=cache_dir, check_counts=False)
        self.grayscale = grayscale
        self.channels = 1 if grayscale else 3
        refuse_missing_split(self.root, self.name)
        self._trees: dict[str, dict[str, list[Path]]] = {}

    def tree(self, split: str) -> dict[str, list[Path]]:
        """``split``'s class folders and their images (:func:`scan_tree`), listed once: the checks
        before a run and the cache's plan would list every image file again (a stat each, slow on
        a network file system)."""
        if split not in self._trees:
            self._trees[split] = scan_tree(self.root / split, self.name)
        return self._trees[split]

    def split_sizes(self):
        # every split's class folders listed first; the images' headers are read by CachedDataset's, last
        refuse_shared_classes(self.root, {split: self.tree(split) for split in SPLITS}, self.name)
        return super().split_sizes()

    def image_files(self, split):
        return self.planned(split)[2]

    def class_counts(self, split):
        return [len(files) for _, files in sorted(self.tree(split).items())]

    def plan(self, split):
        tree = self.tree(split)
        classes = sorted(tree)
        files, build = tree_plan(tree, classes, self.image_size, "L" if self.grayscale else "RGB", self.root,
                                 exif=True)  # a researcher's own photos, as they are shown
        stem = f"folder-{split}-{self.image_size}{'-gray' if self.grayscale else ''}"
        params = {"image_size": self.image_size, "grayscale": self.grayscale, "classes": classes}
        return stem, params, files, build


@hookimpl
def register_datasets(register):
    register(
        FolderDataset,
        name="folder",
        description="Any ROOT/{train,val,test}/<class>/<image> tree (no class in two splits), resized to "
                    "image_size (default 84)",
        paper="",
        check_early=True,  # fslab builds it in the CLI first: a wrong root fails at once
        defaults={"train": {"crop_padding": 8, "flip": True}},
    )
