"""Decode a split once into a uint8 file, memory-map it on every later load.

Shared by every on-disk dataset (``miniimagenet``, ``tieredimagenet``,
``cifar-fs``, ``fc100``, ``omniglot``, ``cub``, ``folder``). Decoding JPEG or
PNG files each epoch costs more than a training step on a GPU, so a split is
decoded and resized exactly once into

    ROOT/.fslab-cache/<stem>.<key>.u8       images, uint8 [N, C, H, W], row-major
    ROOT/.fslab-cache/<stem>.<key>.labels   labels, int64 [N]
    ROOT/.fslab-cache/<stem>.json           header: shape, classes, key, files

where ``<stem>`` is e.g. ``miniimagenet-train-84`` and ``<key>`` a hash of
everything the pixels depend on: the dataset's parameters (with the class
list fslab ships where it chooses or numbers the classes), the cache format
version and, for every source file, its path, size and modification time.
Editing, adding or removing a source file, or changing a parameter such as
``image_size``, changes the key and the split is decoded again; the stale files
of that stem are then deleted. Files are written under a temporary name and
renamed, the header last, so a crash never leaves a cache that looks valid.
One process decodes a split at a time (an exclusive ``flock`` on
``.<stem>.lock`` in the cache folder, which names its holder): the runs of a sweep that start together
on a split not cached yet wait for the first to decode it, then map its file,
instead of each decoding it again at once.

Later loads map the file (``np.memmap`` in copy-on-write mode, so the tensor is
writable and the file is never modified) and wrap it with ``torch.from_numpy``:
no copy, and the operating system's page cache is shared by every run.

Where the cache goes: ``cache_dir`` when the dataset is given one; otherwise
``ROOT/.fslab-cache`` when ROOT is writable; otherwise
``$XDG_CACHE_HOME/fslab`` (default ``~/.cache/fslab``), where a valid cache in
a read-only ROOT's ``.fslab-cache`` is read first. Outside ROOT, each root gets
its own sub-folder (a hash of its absolute path).

numpy, torch and PIL are imported inside functions: the registry imports the
dataset modules, and ``fslab plugins`` must stay light.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fslab.plugin import Split, UsageError, one_at_a_time, temporary_path, writer_gone

# 4: folder's EXIF orientation applied, keys of paths in the root; 3: float images scaled (clipped before);
# 2: 16-bit ones (1 clipped them); older caches are rebuilt
FORMAT_VERSION = 4
CACHE_FOLDER = ".fslab-cache"
DECODE_THREADS = max(1, min(4, os.cpu_count() or 1))
CHUNK = 512  # images decoded per block written to the cache file
# images a thread decodes per task: a task an image cost about 40 µs more than its 84×84 JPEG's decode (8,000
# images/s, where 64 a task decode 11,200 on 2 cores)
DECODE_SLICE = 64
HEADER_CHUNK = 256  # image headers a thread reads per task before a run (check_headers)
# .jfif and .jpe: JPEGs as browsers save them (Chrome on Windows); .pbm and .pnm: the netpbm family of .ppm
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".jfif", ".jpe", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm",
                    ".pbm", ".pnm")
# photos in formats fslab does not read (an iPhone's HEIC, AVIF, cameras' raw files): refused, not left out in silence
UNREAD_PHOTOS = (".heic", ".heif", ".avif", ".dng", ".cr2", ".cr3", ".nef", ".arw", ".orf", ".rw2", ".raf")


# -- checking what is on disk ---------------------------------------------------------


def require(path: Path, dataset: str, layout: str) -> Path:
    """``path`` if it exists, otherwise the one-line error naming it and the layout."""
    if not path.exists():
        raise UsageError(f"{dataset}: {path} not found. Expected layout: {layout}. "
                         f"Point --data-root (or [data_roots] {dataset} in fslab.toml) at the folder holding it.")
    return path


def check_classes(dataset: str, source: str, split: str, found: dict[str, int], expected: Sequence[str],
                  *, list_name: str, per_class: int | None, total: int | None, check_counts: bool) -> list[str]:
    """Compare the classes (and image counts) found for a split with the shipped list.

    ``found`` maps each class name seen in ``source`` to its number of images.
    A class outside the list is always an error (the files belong to another
    split). With ``check_counts`` every listed class must be present, with
    ``per_class`` images each and ``total`` in all (when given); without it the
    files may hold any subset of the listed classes (tiny test copies, quick
    experiments). Returns the classes found, in the list's order.
    """
    listed = set(expected)
    extra = [c for c in found if c not in listed]
    if extra:
        raise UsageError(f"{dataset}: {source} has {len(extra)} class(es) that are not in the {split} list "
                         f"{list_name} (e.g. '{extra[0]}'); are these files from another split?")
    present = [c for c in expected if found.get(c)]
    if not present:
        raise UsageError(f"{dataset}: {source} has no images of any {split} class listed in {list_name}")
    if check_counts:
        hint = "re-create or re-download it, or set dataset.check_counts=false to use the files as a subset"
        missing = [c for c in expected if not found.get(c)]
        if missing:
            raise UsageError(f"{dataset}: {source} is short: expected {len(expected)} {split} classes "
                             f"({list_name}), found {len(present)}; missing e.g. '{missing[0]}'; {hint}")
        if per_class is not None:
            wrong = [c for c in expected if found[c] != per_class]
            if wrong:
                raise UsageError(f"{dataset}: {source} is short: expected {per_class} images of class "
                                 f"'{wrong[0]}', found {found[wrong[0]]} ({len(wrong)} class(es) differ); {hint}")
        count = sum(found.values())
        if total is not None and count != total:
            raise UsageError(f"{dataset}: {source} is short: expected {total:,} {split} images, "
                             f"found {count:,}; {hint}")
    return present


def check_listed(indexes: Sequence[tuple[Path | None, Sequence[Path]]], dataset: str,
                 known: dict | None = None) -> None:
    """One line naming the first image an index file lists that is not on disk,
    and how many are missing in all: ``indexes`` holds (index file, files it names); ``known``: the
    files' stats as :func:`stat_all` keeps them, which the cache's key reads again rather than a stat more."""
    known = {} if known is None else known
    missing = [(index, path) for index, files in indexes
               for path, stat in zip(files, stat_all(files, known)) if isinstance(stat, Exception)]
    if len(missing) == 1:
        index, path = missing[0]
        raise UsageError(f"{dataset}: {path}, listed in {index}, does not exist; restore it, or remove its row")
    if missing:
        index, path = missing[0]
        raise UsageError(f"{dataset}: {len(missing):,} image files listed in the index files do not exist, e.g. "
                         f"{path} (listed in {index}); restore them, or remove their rows")


def read_list(path: Path) -> list[str]:
    """A shipped split list: one name per line, blank lines ignored."""
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


SPLITS_DIR = Path(__file__).with_name("splits")


def shipped_list(dataset: str, split: str) -> tuple[list[str], str]:
    """The class list fslab ships for ``dataset``'s ``split`` and a short name for messages."""
    path = SPLITS_DIR / dataset / f"{split}.txt"
    return read_list(path), f"splits/{dataset}/{split}.txt"


def check_split_name(dataset: str, split: str) -> None:
    if split not in ("train", "val", "test"):
        raise UsageError(f"{dataset}: unknown split '{split}'. Allowed: train, val, test.")


def list_images(folder: Path) -> list[Path]:
    """Image files directly in ``folder``, sorted by name (the order is part of the cache);
    hidden files (``._img0.png``, the metadata macOS leaves beside copies) are not images.
    A link to an image that is gone is refused (:func:`refuse_broken_link`), not skipped, and so
    are photos in a format fslab does not read (``UNREAD_PHOTOS``: the class would train without them).
    The folder's listing says which entries are files and which links: a stat only for a link (a
    ``Path.is_file`` and ``is_symlink`` of each took two, and tieredImageNet has 779,165 files)."""
    names, unread = [], []
    with os.scandir(folder) as entries:
        for entry in entries:
            suffix = os.path.splitext(entry.name)[1].lower()
            if entry.name.startswith(".") or suffix not in IMAGE_EXTENSIONS:
                if suffix in UNREAD_PHOTOS and not entry.name.startswith("."):
                    unread.append(entry.name)
                continue
            if entry.is_symlink():
                refuse_broken_link(folder / entry.name)
            if entry.is_file():  # a link: what it leads to
                names.append(entry.name)
    if unread:
        first = min(unread)
        raise UsageError(f"{folder} holds {len(unread)} photo{'s' if len(unread) > 1 else ''} in a format fslab does "
                         f"not read ({', '.join(sorted({os.path.splitext(n)[1].lower() for n in unread}))}), e.g. "
                         f"{first}: convert {'them' if len(unread) > 1 else 'it'} to .jpg or .png, or move "
                         f"{'them' if len(unread) > 1 else 'it'} out of the data root")
    return [folder / name for name in sorted(names)]


def refuse_broken_link(path: Path) -> None:
    """A UsageError for a symbolic link whose target is gone: skipping it would
    train and test on fewer images (or classes) than the folder shows, silently."""
    if path.is_symlink() and not path.exists():
        raise UsageError(f"{path} is a broken link (to {os.readlink(path)}): restore what it points at, "
                         f"or remove the link")


# -- decoding --------------------------------------------------------------------------


def to_array(image, size: int, mode: str, box: tuple[int, int, int, int] | None = None):
    """A PIL image -> uint8 ``[C, size, size]``: convert to ``mode`` ("RGB" or
    "L"), crop to ``box`` (left, top, right, bottom) if given, resize to
    ``size``×``size`` with PIL's bilinear filter (antialiased when shrinking)."""
    import numpy as np
    from PIL import Image

    if image.mode.startswith("I"):  # 16- or 32-bit integer pixels: convert() would clip each at 255
        image = Image.fromarray(_eight_bits(np.asarray(image)), mode="L")
    elif image.mode == "F":  # 32-bit float pixels (a TIFF's): convert() would clip each to 0..255 as it is
        image = Image.fromarray(_float_eight_bits(np.asarray(image)), mode="L")
    image = image.convert(mode)
    if box is not None:
        image = image.crop(box)
    if image.size != (size, size):
        image = image.resize((size, size), Image.Resampling.BILINEAR)
    array = np.asarray(image, dtype=np.uint8)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def _eight_bits(pixels):
    """Integer pixels (a 16-bit PNG's 0..65535, or a 32-bit image's) scaled to 0..255:
    by 257 where they fit 16 bits (65535 -> 255), else by their own maximum."""
    import numpy as np

    pixels = pixels.astype(np.float64)
    top = 65535.0 if pixels.max(initial=0) <= 65535 else float(pixels.max())
    return np.clip(np.rint(pixels * (255.0 / top)), 0, 255).astype(np.uint8)


def _float_eight_bits(pixels):
    """Float pixels scaled to 0..255: from 0..1 where they all lie there, else
    taken as they are where they lie in 0..255; any other range (or a NaN) is a
    ValueError, which :func:`decode_file` names with the file."""
    import numpy as np

    low, high = (float(pixels.min()), float(pixels.max())) if pixels.size else (0.0, 0.0)
    if not (np.isfinite(pixels).all() and 0.0 <= low and high <= 255.0):
        raise ValueError(f"float pixels from {low:g} to {high:g} (0..1 or 0..255 are read)")
    scale = 255.0 if high <= 1.0 else 1.0
    return np.rint(pixels.astype(np.float64) * scale).astype(np.uint8)


def decode_file(path, size: int, mode: str, box=None, root: Path | None = None, exif: bool = False):
    """Open one image file and return ``to_array`` of it; ``exif``: turned as its EXIF orientation says first
    (a phone's portrait photo is stored on its side: :func:`upright`), as ``folder`` reads a researcher's own
    photos (the benchmark datasets are read as stored, as their papers' code read them); ``root``: the data
    root, whose path the error names the file under (:func:`shown_image`)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return to_array(upright(image) if exif else image, size, mode, box)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:  # PIL's UnidentifiedImageError included;
        # ValueError: a damaged PPM header; DecompressionBombError: a header claiming over 179 million pixels
        raise UsageError(f"cannot decode image {shown_image(path, root)}: {exc}; replace or remove the file") from None


def upright(image):
    """``image`` as a viewer shows it: turned or mirrored as its EXIF orientation tag (2 to 8) says, which
    cameras and phones write rather than turn the pixels; ``image`` itself where it has none."""
    from PIL import ImageOps

    orientation = image.getexif().get(0x0112, 1)  # the tag of a JPEG's (or TIFF's, PNG's, WebP's) EXIF block
    return ImageOps.exif_transpose(image) if orientation in range(2, 9) else image


def shown_image(path, root: Path | None) -> str:
    """``train/cat/01.jpg (in the data root /data/pets)``: an image file named by its path in the
    data root, where there is one (the folder tree's own names); else its whole path."""
    if root is None:
        return str(path)
    return f"{os.path.relpath(path, root)} (in the data root {root})"


def check_headers(files: Sequence[Path], root: Path, dataset: str) -> None:
    """One line naming the first of ``files`` whose header PIL cannot read (an empty file, one that
    is no image, one claiming too many pixels), and how many there are: before a run exists, where
    the decode of its first epoch would find it. It reads a few bytes a file (about 45 ms for 1,000
    JPEGs); a file cut short after its header is found only by that decode."""
    if not files:
        return
    from PIL import Image

    def unreadable(paths: Sequence[Path]) -> list[tuple[Path, Exception]]:
        found = []
        for path in paths:
            try:
                with Image.open(path):
                    pass
            except (OSError, ValueError, Image.DecompressionBombError) as exc:
                found.append((path, exc))
        return found

    # a few threads (a network file system's latency overlaps), each given HEADER_CHUNK files at once: a task
    # a file cost more than its header (3.5 s for miniImageNet's 60,000 JPEGs, where one thread reads them in 1.5)
    chunks = [files[start:start + HEADER_CHUNK] for start in range(0, len(files), HEADER_CHUNK)]
    with ThreadPoolExecutor(DECODE_THREADS) as pool:
        bad = [found for part in pool.map(unreadable, chunks) for found in part]
    if bad:
        path, exc = bad[0]
        more = f" ({len(bad):,} files cannot be read)" if len(bad) > 1 else ""
        raise UsageError(f"{dataset}: cannot read image {shown_image(path, root)}: {exc}{more}; replace or "
                         f"remove the file")


def cache_ready(folder: Path | None, stem: str, key: str) -> bool:
    """Whether ``folder`` holds a finished cache of ``stem`` for ``key`` (its header read, nothing
    mapped: no numpy nor torch to import)."""
    try:
        header = json.loads((folder / f"{stem}.json").read_text(encoding="utf-8")) if folder else None
    except (OSError, ValueError):
        return False
    return isinstance(header, dict) and header.get("key") == key and header.get("version") == FORMAT_VERSION


def decode_bytes(data, size: int, mode: str):
    """One PNG/JPEG held in memory (bytes or a uint8 array) -> uint8 ``[C, size, size]``."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(bytes(data))) as image:
            return to_array(image, size, mode)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise UsageError(f"cannot decode an image held in a pickle: {exc}") from None


def decode_all(jobs: Sequence, decode: Callable) -> Iterator:
    """``decode(job)`` for every job, in order, as stacked blocks of up to
    ``CHUNK`` images; a few threads decode at once (PIL releases the GIL while
    it decodes and resizes), ``DECODE_SLICE`` images a task, and the order never depends on which
    finishes first (the first job that fails, in order, is the one whose error is raised)."""
    import numpy as np

    def run(part: Sequence) -> list:
        return [decode(job) for job in part]

    with ThreadPoolExecutor(DECODE_THREADS) as pool:
        for start in range(0, len(jobs), CHUNK):
            block = jobs[start:start + CHUNK]
            parts = [block[first:first + DECODE_SLICE] for first in range(0, len(block), DECODE_SLICE)]
            yield np.stack([image for part in pool.map(run, parts) for image in part])


# -- the cache -------------------------------------------------------------------------


def cache_folder(root: Path, cache_dir: str = "", create: bool = True) -> Path:
    """Where this root's cache files live (see the module docstring). ``create=False``: where they
    would, ``ROOT/.fslab-cache`` made by nobody (the check before a run writes nothing in the root)."""
    root = Path(root).resolve()
    tag = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    if cache_dir:
        return Path(os.path.expanduser(cache_dir)) / tag
    inside = root_cache(root)
    if root_cache_usable(inside, create):
        return inside
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "fslab" / tag


def root_cache_usable(inside: Path, create: bool) -> bool:
    """Whether the root's cache folder ``inside`` can be written (made first where ``create``; where
    not, judged as :func:`unwritable` judges it, writing nothing: ``os.access`` says no on a
    read-only file system, whoever asks)."""
    if not create:
        return unwritable(inside) is None
    try:
        inside.mkdir(exist_ok=True)
    except OSError:  # a read-only root, or a file where the folder would go
        return False
    return os.access(inside, os.W_OK)


def unwritable(folder: Path) -> str | None:
    """Why ``folder`` (made with its parents where not there yet) cannot be written, or None: what
    its nearest part that exists is (a file; a folder ``os.access`` says no to, as a read-only
    file system says to root too). It writes nothing."""
    there = Path(folder)
    while not os.path.lexists(there) and there != there.parent:
        there = there.parent
    if not there.is_dir():
        return f"{there} is not a folder"
    return None if os.access(there, os.W_OK) else f"{there} cannot be written"


def root_cache(root: Path) -> Path:
    """The cache folder inside a data root, ``ROOT/.fslab-cache``."""
    return Path(root).resolve() / CACHE_FOLDER


def source_key(stem: str, params: dict, sources: Sequence[Path], root: Path | None = None,
               known: dict | None = None) -> str:
    """A hash of the cache format, the parameters and every source file's
    path, size and modification time; each path relative to ``root`` where given (the data root: one root
    reached by two names, a link and its target, is one cache, where each name decoded it again in turn,
    deleting the other's files). ``known``: stats already taken (:func:`stat_all`), not taken again."""
    digest = hashlib.sha256(json.dumps({"version": FORMAT_VERSION, "stem": stem, "params": params},
                                       sort_keys=True).encode())
    inside = None if root is None else os.fspath(root) + os.sep
    for path, stat in zip(sources, stat_all(sources, {} if known is None else known)):
        if isinstance(stat, FileNotFoundError):
            raise UsageError(f"{path} is listed in the dataset's index files but does not exist")
        if isinstance(stat, Exception):  # one it cannot be stat'ed for (no permission): the system's word
            raise stat
        # the name's bytes as on disk: a name that is not UTF-8 (latin-1 from an old archive) has no str.encode()
        shown = path if inside is None else relative(os.fspath(path), inside)
        digest.update(b"\n" + os.fsencode(shown) + f"\t{stat.st_size}\t{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def relative(path: str, inside: str) -> str:
    """``os.path.relpath(path, ROOT)``, ``inside`` being ``ROOT`` and a separator: the path's own tail where
    both are written plainly (no ``.``, ``..`` nor doubled separator to resolve) and it lies under ROOT, as
    each file the datasets list does (relpath took 4 µs a file: 3 s of tieredImageNet's 779,165)."""
    tail = path[len(inside):]
    if (path.startswith(inside) and os.path.normpath(inside) + os.sep == inside
            and not any(part in ("", ".", "..") for part in tail.split(os.sep))):
        return tail
    return os.path.relpath(path, inside)


def stat_all(paths: Sequence[Path], known: dict) -> list[os.stat_result | Exception]:
    """The ``os.stat`` of each of ``paths``, or the error it raised (a ``FileNotFoundError`` where the file is
    not there), kept in ``known`` (its name -> either): a path stat'ed once for the checks before a run and the
    cache's key, not once for each."""
    stats = []
    for path in paths:
        name = os.fspath(path)  # a str hashes at once; a Path builds a tuple of its parts first
        stat = known.get(name)
        if stat is None:
            try:
                stat = os.stat(name)
            except (OSError, ValueError) as exc:  # ValueError: a name with a NUL byte, which no file has
                stat = exc
            known[name] = stat
        stats.append(stat)
    return stats


def cached_split(folder: Path, stem: str, params: dict, sources: Sequence[Path],
                 build: Callable[[], tuple], verb: str = "decoding", ready: Path | None = None,
                 root: Path | None = None, key: str | None = None) -> Split:
    """The split cached under ``folder/stem``, decoded by ``build`` first if
    there is no valid cache for these ``sources`` and ``params``. A valid cache
    in ``ready`` is read first (a read-only root's ``.fslab-cache``, made by
    whoever could write there: a lab's shared copy of a dataset).

    ``build()`` returns ``(labels, classes, blocks)``: int64 labels ``[N]``,
    the class names, and an iterable of uint8 image blocks ``[k, C, H, W]``
    whose lengths add up to N. Blocks are written to disk as they come, so a
    split larger than memory can be cached. ``root``: the data root the sources' paths are
    hashed relative to (:func:`source_key`); ``key``: that key, where the caller has it already.
    """
    key = source_key(stem, params, sources, root) if key is None else key
    split = open_cache(ready, stem, key) if ready is not None else None
    if split is None:
        split = open_cache(folder, stem, key)
    if split is None:
        with decoding(folder, stem, verb):
            split = open_cache(folder, stem, key)  # another process may have written it meanwhile
            if split is None:
                write_cache(folder, stem, key, params, build, verb)
                split = open_cache(folder, stem, key)
        if split is None:  # pragma: no cover - written and renamed just above
            raise RuntimeError(f"the cache {folder / stem} could not be read back after writing it")
    return split


@contextlib.contextmanager
def decoding(folder: Path, stem: str, verb: str = "decoding") -> Iterator[None]:
    """Hold the right to write ``folder/stem``'s cache: an exclusive ``flock`` on ``folder/.stem.lock``
    (:func:`one_at_a_time`: the file names its holder's pid and host, and goes when it is let go), waited
    for while another process holds it, saying so once and naming that process (``pid P on host H``,
    ``, another machine`` where H is not this host: a data root nodes share). The kernel releases it
    however its holder ends, so a killed decoder never blocks the next."""
    lock = folder / f".{stem}.lock"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK):  # a read-only file system says so to root too
            raise PermissionError(errno.EACCES, "the folder cannot be written")
    except OSError as exc:  # a read-only root and a read-only (or full) user cache
        raise UsageError(f"cannot write the decode cache of {stem} in {folder}: {exc.strerror or exc}; "
                         f"point it at a writable folder with --set dataset.cache_dir=DIR") from None
    with one_at_a_time(lock, lambda holder: f"fslab: waiting for another process {verb} {stem} into "
                                            f"{folder}{holder} ..."):
        yield


def open_cache(folder: Path, stem: str, key: str) -> Split | None:
    """The memory-mapped split if ``folder/stem.json`` is valid for ``key``, else None."""
    import numpy as np
    import torch

    try:
        header = json.loads((folder / f"{stem}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if header.get("key") != key or header.get("version") != FORMAT_VERSION:
        return None
    shape = tuple(header["shape"])
    images_path, labels_path = folder / header["images"], folder / header["labels"]
    try:
        if images_path.stat().st_size != int(np.prod(shape)) or labels_path.stat().st_size != 8 * shape[0]:
            return None
    except OSError:
        return None
    images = np.memmap(images_path, dtype=np.uint8, mode="c", shape=shape) if shape[0] else np.zeros(shape, np.uint8)
    labels = np.fromfile(labels_path, dtype=np.int64)
    return Split(images=torch.from_numpy(images), labels=torch.from_numpy(labels), classes=list(header["classes"]))


def remove_killed_writes(folder: Path, stem: str) -> None:
    """Remove the temporary files of ``stem`` whose writer is gone (``writer_gone``): a decode killed
    outright (SIGKILL, the out-of-memory killer) leaves its ``.NAME.PID@HOST.tmp`` files, the split's
    images (gigabytes at a benchmark's size), which the decode after it, under new names, never removed.
    A decode on another node sharing the data root is not judged by its pid here; the host-less
    ``NAME.PID.tmp`` files of earlier fslab versions are judged by their pid, as they were."""
    for path in [*folder.glob(f".{stem}.*.tmp"), *folder.glob(f"{stem}.*.tmp")]:
        if writer_gone(path):
            path.unlink(missing_ok=True)


def write_cache(folder: Path, stem: str, key: str, params: dict, build: Callable[[], tuple],
                verb: str = "decoding") -> None:
    """Decode with ``build`` into ``folder`` (temporary names, then renamed;
    the header last), and delete stale files of the same stem."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    remove_killed_writes(folder, stem)
    started = time.perf_counter()
    print(f"fslab: {verb} {stem} once into {folder} ...", file=sys.stderr, flush=True)
    labels, classes, blocks = build()
    labels = np.asarray(labels, dtype=np.int64)
    count = len(labels)
    images_name, labels_name = f"{stem}.{key}.u8", f"{stem}.{key}.labels"
    images_tmp, labels_tmp, header_tmp = (temporary_path(folder / name)
                                          for name in (images_name, labels_name, f"{stem}.json"))
    written, shape = 0, None
    try:
        with open(images_tmp, "wb") as fh:
            for block in blocks:
                block = np.ascontiguousarray(block, dtype=np.uint8)
                if shape is None:
                    shape = (count, *block.shape[1:])
                elif block.shape[1:] != shape[1:]:
                    raise RuntimeError(f"{stem}: image blocks of different shapes {block.shape[1:]} and {shape[1:]}")
                fh.write(block.tobytes())
                written += len(block)
        if written != count:
            raise RuntimeError(f"{stem}: decoded {written} images for {count} labels")
        if shape is None:
            raise UsageError(f"{stem}: there are no images to cache")
        labels.tofile(labels_tmp)
        os.replace(images_tmp, folder / images_name)
        os.replace(labels_tmp, folder / labels_name)
        header = {"version": FORMAT_VERSION, "key": key, "stem": stem, "shape": list(shape), "dtype": "uint8",
                  "layout": "NCHW", "images": images_name, "labels": labels_name, "classes": list(classes),
                  "params": params, "created": time.time()}
        header_tmp.write_text(json.dumps(header), encoding="utf-8")
        os.replace(header_tmp, folder / f"{stem}.json")
    except OSError as exc:  # a full disk (or quota): the line says where fslab was writing, and why
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            images_tmp.unlink(missing_ok=True)  # first, so the free space told is true
            raise no_room(folder, stem, count * int(np.prod(shape[1:])) if shape else None) from exc
        raise
    finally:
        for leftover in (images_tmp, labels_tmp, header_tmp):
            try:
                leftover.unlink()
            except FileNotFoundError:
                pass
    for stale in folder.glob(f"{stem}.*"):
        if stale.name not in (images_name, labels_name, f"{stem}.json") and not stale.name.endswith(".tmp"):
            try:
                stale.unlink()
            except OSError:
                pass
    print(f"fslab: cached {count:,} images of {stem} ({np.prod(shape) / 2**20:.0f} MiB) "
          f"in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)


def no_room(folder: Path, stem: str, needed: int | None) -> OSError:
    """The error for a cache that the disk holding ``folder`` has no room for (``needed`` bytes, where
    known): the bare "No space left on device" named neither the folder nor how to choose another."""
    try:
        free = f"{_bytes(shutil.disk_usage(folder).free)} free there"
    except OSError:
        free = "the disk is full"
    needs = f"it needs {_bytes(needed)}, " if needed else ""
    return OSError(f"no space left for the decode cache of {stem} in {folder} ({needs}{free}); free some space "
                   f"there, or put the cache on another disk with --set dataset.cache_dir=DIR (the synthetic "
                   f"datasets' cache follows $XDG_CACHE_HOME)")


def _bytes(n: int) -> str:
    """``512 bytes``, ``48.0 KiB``, ``2.4 MiB``, ``1.2 GiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} bytes"


class CachedDataset:
    """Base of the on-disk datasets: parameters every one of them has, the
    split memo, and ``load`` through the cache. A subclass sets ``name``,
    ``channels`` and ``layout``, checks its files in ``__init__`` (cheaply:
    fslab constructs the dataset in the CLI, before a worker starts, so a wrong
    root is one line at once) and implements ``plan(split)``."""

    name = ""
    channels = 3
    layout = ""

    def __init__(self, root, *, image_size: int, cache_dir: str = "", check_counts: bool = True):
        if not root:
            raise UsageError(f"{self.name}: no data root; give --data-root or [data_roots] {self.name} in fslab.toml")
        if image_size < 4:
            raise UsageError(f"{self.name}: image_size must be at least 4 pixels, got {image_size}")
        self.root = Path(os.path.expanduser(str(root))).absolute()
        self.image_size = image_size
        self.cache_dir = cache_dir
        self.check_counts = check_counts
        self._splits: dict = {}
        self._plans: dict = {}  # split -> plan(split), made once (planned)
        self._keys: dict[str, str] = {}  # split -> its cache key (key)
        self._stats: dict = {}  # source file -> its os.stat (stat_all), taken once for the checks and the key
        if not self.root.is_dir():
            raise UsageError(f"{self.name}: the data root {self.root} is not a folder. Expected layout: {self.layout}. "
                             f"Give it with --data-root or [data_roots] {self.name} in fslab.toml.")

    def load(self, split: str) -> Split:
        """uint8 images ``[N, C, H, W]`` memory-mapped from the cache, labels, class names."""
        check_split_name(self.name, split)
        if split not in self._splits:
            stem, params, sources, build = self.planned(split)
            folder, ready = self.cache_places()
            self._splits[split] = cached_split(folder, stem, params, sources, build, ready=ready, root=self.root,
                                               key=self.key(split))
        return self._splits[split]

    def cache_places(self, create: bool = True) -> tuple[Path, Path | None]:
        """The folder this root's cache is written to, and the one a ready cache is read from
        first (a read-only root's ``.fslab-cache``, made by one who could write there), or None;
        ``create=False``: without making ``ROOT/.fslab-cache`` (:func:`cache_folder`)."""
        folder = cache_folder(self.root, self.cache_dir, create=create)
        inside = root_cache(self.root)
        return folder, inside if not self.cache_dir and folder != inside else None

    def cached(self, split: str) -> bool:
        """Whether ``split`` is cached for its files as they are now: loading it decodes nothing. It
        writes nothing (fslab asks before a run exists, in the CLI, whose checks leave the root as it is)."""
        stem, key = self.planned(split)[0], self.key(split)
        return any(cache_ready(folder, stem, key) for folder in self.cache_places(create=False))

    def planned(self, split: str) -> tuple[str, dict, Sequence[Path], Callable[[], tuple]]:
        """:meth:`plan`, made once for this dataset: the checks before a run, the cache's key and the load
        each read it (miniImageNet's index files were read and its 60,000 paths made four times over)."""
        if split not in self._plans:
            self._plans[split] = self.plan(split)
        return self._plans[split]

    def key(self, split: str) -> str:
        """The cache key of ``split`` (:func:`source_key`), its files stat'ed once for this dataset: the
        check of the files the index names stat'ed them already."""
        if split not in self._keys:
            stem, params, sources, _ = self.planned(split)
            self._keys[split] = source_key(stem, params, sources, self.root, self._stats)
        return self._keys[split]

    def check_cache_dir(self) -> None:
        """Refuse a ``cache_dir`` that cannot be written (:func:`unwritable`) before the run exists,
        unless every split is cached there already (a read-only shared cache is only read)."""
        if not self.cache_dir:
            return
        folder = cache_folder(self.root, self.cache_dir, create=False)
        why = unwritable(folder)
        if why and not all(self.cached(split) for split in ("train", "val", "test")):
            raise UsageError(f"dataset.cache_dir: cannot write the decode cache of {self.name} in {folder}: "
                             f"{why}; give a folder that can be written with --set dataset.cache_dir=DIR, "
                             f"or leave it out for ROOT/.fslab-cache (else ~/.cache/fslab)")

    def split_sizes(self) -> dict[str, list[int]]:
        """Images per class of each split that :meth:`class_counts` can tell
        without decoding (fslab checks episodes against them before a run),
        once every image an index file lists is found on disk (a stat each)."""
        check_listed([self.listed_files(split) for split in ("train", "val", "test")], self.name, self._stats)
        self.check_cache_dir()
        sizes = {}
        for split in ("train", "val", "test"):
            counts = self.class_counts(split)
            if counts is not None:
                sizes[split] = counts
        # the splits not cached yet: a file that is no image is found before the run exists, not by its decode
        files = {split: self.image_files(split) for split in ("train", "val", "test")}
        check_headers([path for split, paths in files.items() if paths and not self.cached(split) for path in paths],
                      self.root, self.name)
        return sizes

    def class_counts(self, split: str) -> list[int] | None:
        """The number of images of each class of ``split``, read from index
        files or folder listings (never by decoding), or None when that would
        mean reading the images themselves."""
        return None

    def image_files(self, split: str) -> Sequence[Path]:
        """The image files ``split`` decodes, whose headers :meth:`split_sizes` reads where the split is
        not cached yet: those its index file names (:meth:`listed_files`); a dataset that finds its images
        by listing folders gives them itself, one read from pickles none."""
        return self.listed_files(split)[1]

    def listed_files(self, split: str) -> tuple[Path | None, list[Path]]:
        """The index file of ``split`` and the image files it names, for a
        dataset whose images are named by an index (a csv, ``images.txt``)
        rather than found by listing folders; ``(None, [])`` otherwise."""
        return None, []

    def plan(self, split: str) -> tuple[str, dict, Sequence[Path], Callable[[], tuple]]:
        """(cache stem, parameters the pixels depend on, source files, build):
        everything ``cached_split`` needs; checks the split's class list and
        counts before anything is decoded."""
        raise NotImplementedError
