"""``omniglot``: Omniglot (Lake et al. 2015) with the Vinyals et al. (2016) split.

1,623 handwritten characters from 50 alphabets, 20 drawings each, read from
torchvision's layout: ``ROOT/images_background/<Alphabet>/characterNN/*.png``
and ``ROOT/images_evaluation/...`` (ROOT may also be the folder holding
``omniglot-py/``). Drawings are converted to grayscale (ink black on white, as
in the files) and resized to ``image_size`` (28 by default).

Split (shipped in ``plugins/datasets/splits/omniglot``): 1,200 characters for training,
of which Snell et al. (2017) hold out 172 for validation, and the remaining
423 for test, i.e. 1,028 / 172 / 423 characters. With ``rotations`` (default)
every character also appears rotated by 90°, 180° and 270° (counter-clockwise,
as ``torch.rot90``), each rotation a class of its own: 4,112 / 688 / 1,692
classes. Classes are numbered character by character in list order, rotation
0, 90, 180, 270 within each; a class is named ``<folder>/<Alphabet>/characterNN/rot090``.
``check_counts`` (default) requires every listed character with 20 drawings;
without it, listed characters that are absent are skipped.
"""

from __future__ import annotations

from fslab_plugins.datasets.image_cache import (
    CachedDataset,
    check_classes,
    decode_all,
    decode_file,
    list_images,
    shipped_list,
)

from fslab.plugin import UsageError, hookimpl

DRAWINGS = 20
LAYOUT = "ROOT/images_background/<Alphabet>/characterNN/*.png and ROOT/images_evaluation/... (torchvision's layout)"


class Omniglot(CachedDataset):
    """Omniglot characters (and their rotations) as classes."""

    name = "omniglot"
    channels = 1
    layout = LAYOUT

    def __init__(self, root, *, image_size: int = 28, rotations: bool = True, cache_dir: str = "",
                 check_counts: bool = True):
        super().__init__(root, image_size=image_size, cache_dir=cache_dir, check_counts=check_counts)
        if not (self.root / "images_background").is_dir() and (self.root / "omniglot-py").is_dir():
            self.root = self.root / "omniglot-py"
        for folder in ("images_background", "images_evaluation"):
            if not (self.root / folder).is_dir():
                raise UsageError(f"omniglot: {self.root / folder} not found. Expected layout: {LAYOUT}. "
                                 f"Point --data-root at the folder holding it.")
        self.rotations = rotations
        self._found: dict[str, tuple] = {}  # split -> _characters(split)

    def class_counts(self, split):
        found, present = self._characters(split)
        return [len(found[c]) for c in present for _ in range(4 if self.rotations else 1)]

    def image_files(self, split):
        return self.planned(split)[2]

    def _characters(self, split):
        """The drawings of each listed character found on disk, and the characters present; each folder
        listed once (the counts and the cache's plan listed the 1,623 folders each)."""
        if split not in self._found:
            self._found[split] = self._list_characters(split)
        return self._found[split]

    def _list_characters(self, split):
        characters, list_name = shipped_list("omniglot", split)
        found = {}
        for character in characters:
            folder = self.root / character
            if folder.is_dir():
                found[character] = list_images(folder)
        present = check_classes(self.name, str(self.root), split, {c: len(v) for c, v in found.items()},
                                characters, list_name=list_name, per_class=DRAWINGS,
                                total=DRAWINGS * len(characters), check_counts=self.check_counts)
        return found, present

    def plan(self, split):
        found, present = self._characters(split)
        files = [path for c in present for path in found[c]]
        turns = range(4) if self.rotations else range(1)
        classes = [f"{c}/rot{90 * k:03d}" for c in present for k in turns]
        labels = [len(turns) * i + k for i, c in enumerate(present) for k in turns for _ in found[c]]
        size, root = self.image_size, self.root

        def build():
            import numpy as np

            base = np.concatenate(list(decode_all(files, lambda path: decode_file(path, size, "L", root=root))))
            counts = np.cumsum([0] + [len(found[c]) for c in present])
            blocks = (np.concatenate([np.rot90(base[counts[i]:counts[i + 1]], k, axes=(2, 3)) for k in turns])
                      for i in range(len(present)))
            return labels, classes, blocks

        stem = f"omniglot-{split}-{self.image_size}{'' if self.rotations else '-norot'}"
        params = {"image_size": self.image_size, "rotations": self.rotations, "characters": present}
        return stem, params, files, build


@hookimpl
def register_datasets(register):
    register(
        Omniglot,
        name="omniglot",
        description="Omniglot, Vinyals split (1,028/172/423 characters, 20 drawings), 28×28, rotations as classes",
        paper="Lake et al. 2015; Vinyals et al. 2016",
        # A mirrored or shifted character is another character: no flip, no crop.
        check_early=True,  # fslab builds it in the CLI first: a wrong root fails at once
        defaults={"train": {"crop_padding": 0, "flip": False}},
    )
