"""``cifar-fs`` and ``fc100``: few-shot splits of CIFAR-100, read from torchvision's files.

Both read ``cifar-100-python/`` as torchvision downloads it (ROOT may be that
folder or its parent): the pickles ``train`` and ``test`` (``data`` N×3072
uint8 in channel-major order, ``fine_labels``, ``coarse_labels``) and ``meta``
(``fine_label_names``, ``coarse_label_names``). A few-shot class takes all 600
images of a CIFAR-100 class, its 500 training and then its 100 test images.

- ``cifar-fs`` (Bertinetto et al. 2019): 64 / 16 / 20 fine classes, the lists of
  the paper's released splits (``plugins/datasets/splits/cifar-fs``).
- ``fc100`` (Oreshkin et al. 2018): split by superclass so that training and
  test classes share no superclass: 12 / 4 / 4 superclasses, i.e. 60 / 20 / 20
  fine classes (``plugins/datasets/splits/fc100`` lists the superclasses).

Classes are numbered in alphabetical order of their names. Images are 32×32;
``image_size`` resizes them (the NCA paper trains CIFAR-FS at 84×84: set
``dataset.image_size=84``). ``check_counts`` works as for ``miniimagenet``.
"""

from __future__ import annotations

from fslab_plugins.datasets.image_cache import CachedDataset, check_classes, shipped_list
from fslab_plugins.datasets.miniimagenet import load_pickle, resized_blocks

from fslab.plugin import UsageError, hookimpl

PER_CLASS = 600
LAYOUT = "ROOT/cifar-100-python/{train,test,meta} (the CIFAR-100 python version, as torchvision downloads it)"


class CifarFewShot(CachedDataset):
    """A few-shot split of CIFAR-100 defined by fine-class or superclass lists."""

    name = ""
    channels = 3
    layout = LAYOUT
    by_superclass = False  # the shipped lists name superclasses (FC100), not fine classes

    def __init__(self, root, *, image_size: int = 32, cache_dir: str = "", check_counts: bool = True):
        super().__init__(root, image_size=image_size, cache_dir=cache_dir, check_counts=check_counts)
        if (self.root / "cifar-100-python").is_dir():
            self.folder = self.root / "cifar-100-python"
        elif (self.root / "meta").exists() and (self.root / "train").exists():
            self.folder = self.root
        else:
            raise UsageError(f"{self.name}: {self.root / 'cifar-100-python'} not found. Expected layout: {LAYOUT}. "
                             f"Point --data-root at the folder holding it.")
        for part in ("train", "test", "meta"):
            if not (self.folder / part).is_file():
                raise UsageError(f"{self.name}: {self.folder / part} not found. Expected layout: {LAYOUT}.")

    def plan(self, split):
        sources = [self.folder / part for part in ("train", "test", "meta")]
        stem = f"{self.name}-{split}-{self.image_size}"
        # the shipped list chooses the split's classes from the files: a corrected list decodes again
        params = {"image_size": self.image_size, "check_counts": self.check_counts,
                  "listed": shipped_list(self.name, split)[0]}
        return stem, params, sources, lambda: self._build(split)

    def class_counts(self, split):
        """With ``check_counts`` every listed class is there with its 600 images (5 fine classes per
        FC100 superclass); the worker checks it as it reads the files, which are not read here."""
        if not self.check_counts:
            return None
        listed = shipped_list(self.name, split)[0]
        return [PER_CLASS] * (len(listed) * (5 if self.by_superclass else 1))

    def _build(self, split):
        import numpy as np

        meta = load_pickle(self.folder / "meta")
        fine_names = [str(n) for n in meta["fine_label_names"]]
        coarse_names = [str(n) for n in meta["coarse_label_names"]]
        parts = [load_pickle(self.folder / part) for part in ("train", "test")]
        images = np.concatenate([np.asarray(p["data"], dtype=np.uint8).reshape(-1, 3, 32, 32) for p in parts])
        fine = np.concatenate([np.asarray(p["fine_labels"], dtype=np.int64) for p in parts])
        coarse = np.concatenate([np.asarray(p["coarse_labels"], dtype=np.int64) for p in parts])
        listed, list_name = shipped_list(self.name, split)
        source = str(self.folder)
        if self.by_superclass:
            wanted = check_classes(self.name, source, split, _counts(coarse, coarse_names, set(listed)), listed,
                                   list_name=list_name, per_class=PER_CLASS * 5, total=None,
                                   check_counts=self.check_counts)
            chosen = {coarse_names.index(s) for s in wanted}
            classes = sorted({fine_names[f] for f, c in zip(fine.tolist(), coarse.tolist()) if c in chosen})
        else:
            classes = check_classes(self.name, source, split, _counts(fine, fine_names, set(listed)), listed,
                                    list_name=list_name, per_class=PER_CLASS, total=None,
                                    check_counts=self.check_counts)
            classes = sorted(classes)
        # Rows of each class in file order: its training images, then its test images.
        order = np.concatenate([np.flatnonzero(fine == fine_names.index(c)) for c in classes])
        labels = np.repeat(np.arange(len(classes)), [int((fine == fine_names.index(c)).sum()) for c in classes])
        return labels, classes, resized_blocks(images.transpose(0, 2, 3, 1), order, self.image_size)


def _counts(labels, names, keep) -> dict[str, int]:
    """Images per class name, for the classes in ``keep`` (the file holds every split's classes)."""
    import numpy as np

    counts = np.bincount(labels, minlength=len(names))
    return {names[i]: int(n) for i, n in enumerate(counts) if n and names[i] in keep}


class CifarFS(CifarFewShot):
    """CIFAR-FS: Bertinetto et al. (2019) fine-class split, 64/16/20."""

    name = "cifar-fs"


class FC100(CifarFewShot):
    """FC100: Oreshkin et al. (2018) superclass split, 12/4/4 superclasses."""

    name = "fc100"
    by_superclass = True


@hookimpl
def register_datasets(register):
    register(
        CifarFS,
        name="cifar-fs",
        description="CIFAR-FS from cifar-100-python/: Bertinetto et al. split, 64/16/20 classes × 600, 32×32",
        paper="Bertinetto et al. 2019",
        # NCA paper (Sec. 4.1): flip and crop; 240 epochs for its final CIFAR-FS table.
        check_early=True,  # fslab builds it in the CLI first: a wrong root fails at once
        defaults={"train": {"epochs": 240, "crop_padding": 4, "flip": True}},
    )
    register(
        FC100,
        name="fc100",
        description="FC100 from cifar-100-python/: Oreshkin et al. superclass split, 60/20/20 classes × 600, 32×32",
        paper="Oreshkin et al. 2018",
        check_early=True,  # fslab builds it in the CLI first: a wrong root fails at once
        defaults={"train": {"crop_padding": 4, "flip": True}},
    )
