"""The on-disk dataset plugins on tiny fake copies of every layout.

Each test writes a few small images (PIL, pickle) in the layout a researcher
has, loads the splits through the registry and compares every pixel and label
with an expectation computed directly with PIL/numpy from what was written.
The uint8 cache is checked for creation, reuse without decoding (PIL is made
unusable), reading from the file itself, and invalidation.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fslab_plugins.datasets import image_cache
from PIL import Image

from fslab.core.errors import UsageError
from fslab.core.runstore import list_runs

from .runs_helpers import fslab, fslab_here

SPLITS = Path(image_cache.__file__).with_name("splits")
BILINEAR = Image.Resampling.BILINEAR


def listed(dataset, split):
    return (SPLITS / dataset / f"{split}.txt").read_text().split()


def rng(seed=0):
    return np.random.default_rng(seed)


def random_image(r, h, w, channels=3):
    shape = (h, w, channels) if channels > 1 else (h, w)
    return r.integers(0, 256, shape, dtype=np.uint8)


def write_png(path: Path, array) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, format="PNG")
    return path


def expected_pixels(source, size, mode="RGB", box=None):
    """What a cached image must hold: PIL's own decode, crop and bilinear resize, as CHW."""
    image = source if isinstance(source, Image.Image) else Image.open(source)
    image = image.convert(mode)
    if box is not None:
        image = image.crop(box)
    if image.size != (size, size):
        image = image.resize((size, size), BILINEAR)
    array = np.asarray(image)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def create(registry, name, root, **params):
    return registry.create("dataset", name, root=str(root), **params)


def assert_split(split, images, labels, classes):
    assert split.images.dtype == torch.uint8 and split.labels.dtype == torch.int64
    assert split.classes == classes
    assert split.labels.tolist() == labels
    np.testing.assert_array_equal(split.images.numpy(), np.stack(images))


# -- folder -------------------------------------------------------------------------------


def make_folder_tree(root: Path, classes=3, per_class=3, seed=0, size=(10, 12)) -> dict:
    """ROOT/{train,val,test}/<split>-class<c>/<image>.png with random pixels (no class in two splits);
    returns split -> [(class, path)]."""
    r = rng(seed)
    written = {}
    for split in ("train", "val", "test"):
        written[split] = []
        for c in range(classes):
            for i in range(per_class):
                path = write_png(root / split / f"{split}-class{c}" / f"{i:02d}.png", random_image(r, *size))
                written[split].append((f"{split}-class{c}", path))
    return written


def test_folder_reads_every_split_with_labels_in_sorted_class_order(registry, tmp_path):
    written = make_folder_tree(tmp_path / "data")
    (tmp_path / "data" / "train" / "train-class0" / "notes.txt").write_text("not an image")
    dataset = create(registry, "folder", tmp_path / "data", image_size=8)
    assert dataset.channels == 3
    for split, items in written.items():
        s = dataset.load(split)
        assert_split(s, [expected_pixels(p, 8) for _, p in items], [int(c[-1]) for c, _ in items],
                     [f"{split}-class{c}" for c in range(3)])
    (tmp_path / "data" / "val" / "val-class1" / "99.png").write_bytes(b"not a png")
    with pytest.raises(UsageError, match="cannot decode image .*99.png"):
        create(registry, "folder", tmp_path / "data", image_size=6).load("val")
    (tmp_path / "data" / "val" / "val-class1" / "99.png").unlink()
    gray = create(registry, "folder", tmp_path / "data", image_size=5, grayscale=True)
    assert gray.channels == 1
    s = gray.load("val")
    assert_split(s, [expected_pixels(p, 5, "L") for _, p in written["val"]], [int(c[-1]) for c, _ in written["val"]],
                 ["val-class0", "val-class1", "val-class2"])


def test_a_folder_tree_is_listed_once_for_the_checks_before_a_run_and_the_splits_it_loads(registry, tmp_path,
                                                                                            monkeypatch):
    """split_sizes (the checks before a run) listed every class folder's images, then listed the split folders
    again for the check that no class is in two splits, and load() listed the images once more for the cache:
    a stat per image file each time, slow on a network file system."""
    from fslab_plugins.datasets import folder

    written = make_folder_tree(tmp_path / "data")
    listed_images = []
    list_images = folder.list_images
    monkeypatch.setattr(folder, "list_images", lambda path: listed_images.append(path.name) or list_images(path))
    dataset = create(registry, "folder", tmp_path / "data", image_size=8)
    assert dataset.split_sizes() == {split: [3, 3, 3] for split in written}
    for split, items in written.items():
        assert_split(dataset.load(split), [expected_pixels(p, 8) for _, p in items], [int(c[-1]) for c, _ in items],
                     [f"{split}-class{c}" for c in range(3)])
    assert sorted(listed_images) == sorted(f"{split}-class{c}" for split in written for c in range(3))
    (tmp_path / "data" / "test" / "train-class1").mkdir()  # a class of two splits: still refused, from the listing
    (tmp_path / "data" / "test" / "train-class1" / "a.png").write_bytes((tmp_path / "data" / "test" / "test-class0" /
                                                                          "00.png").read_bytes())
    with pytest.raises(UsageError, match=r"the class 'train-class1' is in both .*/train/ and .*/test/"):
        create(registry, "folder", tmp_path / "data", image_size=8).split_sizes()


def _read_while_loading(registry, monkeypatch, root, name, module, function, sizes) -> list[str]:
    """The names of the paths ``module.function`` (a listing, a table's read) is called on while dataset ``name``
    at ``root`` gives its counts (``sizes`` each split's) and loads its three splits."""
    calls = []
    original = getattr(module, function)
    monkeypatch.setattr(module, function, lambda path: calls.append(path.name) or original(path))
    dataset = create(registry, name, root, image_size=8, check_counts=False)
    assert dataset.split_sizes() == {split: sizes for split in ("train", "val", "test")}
    for split in ("train", "val", "test"):
        dataset.load(split)
    return calls


def test_tieredimagenet_split_folders_are_listed_once(registry, tmp_path, monkeypatch):
    """Its class folders were listed for the counts, again for the headers read before a run, again for
    the cache's key and at each load: 779,165 files, a stat each time, slow on a network file system."""
    from fslab_plugins.datasets import folder

    fake_tiered_folders(tmp_path)
    listed_images = _read_while_loading(registry, monkeypatch, tmp_path, "tieredimagenet", folder, "list_images",
                                        [2, 2])
    assert sorted(listed_images) == sorted(wnid for split in ("train", "val", "test")
                                           for wnid in listed("tieredimagenet", split)[:2])


def test_omniglot_character_folders_are_listed_once(registry, tmp_path, monkeypatch):
    """Its character folders were listed for the counts and again for the cache's plan (and a third time
    for the headers read before a run, before plans were kept)."""
    from fslab_plugins.datasets import omniglot

    fake_omniglot(tmp_path)
    listed_images = _read_while_loading(registry, monkeypatch, tmp_path, "omniglot", omniglot, "list_images",
                                        [2] * 8)  # 2 characters × 4 turns
    assert sorted(listed_images) == sorted(Path(c).name for split in ("train", "val", "test")
                                           for c in listed("omniglot", split)[:2])


def test_cub_index_files_are_read_once_for_the_checks_before_a_run_and_the_splits_it_loads(registry, tmp_path,
                                                                                               monkeypatch):
    """Its four index files were read for the counts, the files listed (twice: for the check that they are
    there and for the headers read) and the cache's plan of each split: 48 reads before a run."""
    from fslab_plugins.datasets import cub

    fake_cub(tmp_path)
    read = _read_while_loading(registry, monkeypatch, tmp_path, "cub", cub, "read_table", [2, 2])
    assert sorted(read) == sorted(cub.INDEX_FILES)


def test_cache_is_written_once_then_memory_mapped_and_invalidated(registry, tmp_path, monkeypatch):
    root = tmp_path / "data"
    written = make_folder_tree(root, classes=2, per_class=2)
    original = int(create(registry, "folder", root, image_size=6).load("train").images[0, 0, 0, 0])
    cache = root / ".fslab-cache"
    header = json.loads((cache / "folder-train-6.json").read_text())
    assert header["shape"] == [4, 3, 6, 6] and header["classes"] == ["train-class0", "train-class1"]
    data_file = cache / header["images"]
    assert data_file.stat().st_size == 4 * 3 * 6 * 6

    # Reused: no image is opened, and the pixels come from the cache file itself.
    def no_decoding(*args, **kwargs):
        raise AssertionError("an image was decoded although the cache is valid")

    monkeypatch.setattr(Image, "open", no_decoding)
    raw = bytearray(data_file.read_bytes())
    raw[0] = (raw[0] + 1) % 256
    data_file.write_bytes(bytes(raw))
    again = create(registry, "folder", root, image_size=6).load("train")
    assert int(again.images[0, 0, 0, 0]) == raw[0] != original
    again.images[0, 0, 0, 0] = 0  # copy-on-write: a writable tensor that never writes to the file
    assert data_file.read_bytes()[0] == raw[0]
    monkeypatch.undo()

    # A parameter change is another cache file; a changed source rebuilds and drops the stale file.
    create(registry, "folder", root, image_size=4).load("train")
    assert (cache / "folder-train-4.json").exists()
    source = written["train"][0][1]
    write_png(source, random_image(rng(7), 10, 12))
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 10**9))
    rebuilt = create(registry, "folder", root, image_size=6).load("train")
    np.testing.assert_array_equal(rebuilt.images[0].numpy(), expected_pixels(source, 6))
    assert not data_file.exists()
    assert len(list(cache.glob("folder-train-6.*.u8"))) == 1


def test_a_root_reached_through_a_link_and_by_its_own_name_is_one_cache(registry, tmp_path, monkeypatch):
    """/data linked to /mnt/nfs/data, runs given either name: the key hashed each file's whole path, so each name
    decoded the split again, deleting the other's files, and the next run by the other name decoded it again."""
    written = make_folder_tree(tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    by_link = create(registry, "folder", tmp_path / "link", image_size=8)
    by_link.load("train")
    monkeypatch.setattr(image_cache, "write_cache", lambda *args, **kwargs: pytest.fail("decoded again"))
    by_name = create(registry, "folder", tmp_path / "real", image_size=8)
    assert by_name.cached("train")
    split = by_name.load("train")
    assert_split(split, [expected_pixels(p, 8) for _, p in written["train"]], [0, 0, 0, 1, 1, 1, 2, 2, 2],
                 ["train-class0", "train-class1", "train-class2"])


def test_a_decode_removes_what_a_decode_killed_outright_left(registry, tmp_path):
    """A decode killed as it wrote the cache (SIGKILL, the out-of-memory killer) left its STEM.KEY.u8.PID.tmp,
    a split's images, in .fslab-cache/ for good: the decode after it wrote under its own pid and removed only
    stale files that were not temporary. A file of a writer still alive is left."""
    import subprocess
    import sys

    root = tmp_path / "data"
    make_folder_tree(root, classes=2, per_class=2)
    cache = root / ".fslab-cache"
    cache.mkdir()
    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    killed = [cache / f"folder-train-6.0123abcd.{part}.{gone}.tmp" for part in ("u8", "labels")]
    for path in killed:
        path.write_bytes(b"\0" * 1000)
    writing = cache / f"folder-train-6.0123abcd.u8.{os.getppid()}.tmp"
    writing.write_bytes(b"\0" * 1000)
    other = cache / f"folder-val-6.0123abcd.u8.{gone}.tmp"  # another split's: its own decode's to remove
    other.write_bytes(b"\0" * 1000)
    assert len(create(registry, "folder", root, image_size=6).load("train").labels) == 4
    assert [p.exists() for p in (*killed, writing, other)] == [False, False, True, True]


def test_a_decode_on_a_data_root_nodes_share_leaves_another_nodes_decode_its_files(tmp_path, monkeypatch):
    """A data root shared between a cluster's nodes: a decode removed the half-written images of another
    node's decode of the split, still under way there, because its pid ran no process on this node. The
    decode writes under names that tell its host (temporary_path) and removes only what writer_gone says is
    gone: this node's killed decode's, and another node's untouched for a day; not another node's newer."""
    import subprocess

    from fslab.core import files, states

    monkeypatch.setattr(states, "HOST", "node-a")
    cache = tmp_path / ".fslab-cache"
    cache.mkdir()
    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    writing = cache / f".split.0123abcd.u8.{gone}@node-b.tmp"  # node-b's decode, its pid no process here
    lost = cache / f".split.0123abcd.labels.{gone}@node-b.tmp"  # node-b's, untouched for a day: its node lost
    killed = cache / f".split.0123abcd.u8.{gone}@node-a.tmp"  # this node's, its decode killed
    for path in (writing, lost, killed):
        path.write_bytes(b"\0" * 1000)
    then = time.time() - files.OTHER_HOST_GONE_AFTER_S - 60
    os.utime(lost, (then, then))
    seen = []

    def build():
        def blocks():
            seen.extend(p.name for p in cache.iterdir())  # the images' file is open by now
            yield np.arange(2 * 16, dtype=np.uint8).reshape(2, 1, 4, 4)

        return [0, 1], ["a", "b"], blocks()

    image_cache.write_cache(cache, "split", "fedcba98", {}, build)
    assert f".split.fedcba98.u8.{os.getpid()}@node-a.tmp" in seen
    assert [p.exists() for p in (writing, lost, killed)] == [True, False, False]
    assert image_cache.open_cache(cache, "split", "fedcba98").labels.tolist() == [0, 1]


CONCURRENT_LOADER = """
import os, sys, time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch  # imported before the start, so both ask for the split within milliseconds of each other
from fslab_plugins.datasets.image_cache import cached_split

folder, me = Path(sys.argv[1]), sys.argv[2]
(folder.parent / f"ready-{me}").touch()
while not (folder.parent / "go").exists():
    time.sleep(0.01)


def waiting_at_the_lock():
    # whether the other process waits for this split's lock: Linux lists a blocked flock in
    # /proc/locks ('-> FLOCK ...' on the lock file's device:inode); elsewhere, after a second
    try:
        locks = Path("/proc/locks").read_text().splitlines()
    except OSError:
        time.sleep(1)
        return True
    st = (folder / ".toy-train-4.lock").stat()
    file = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(line.split()[1:2] == ["->"] and file in line.split() for line in locks)


def build():
    with open(folder.parent / "builds", "a") as fh:
        fh.write(me + "\\n")
    deadline = time.time() + 60
    while len(list(folder.parent.glob("asked-*"))) < 2 and time.time() < deadline:
        time.sleep(0.01)
    while not waiting_at_the_lock() and time.time() < deadline:  # the other has asked: it is at the lock now
        time.sleep(0.01)
    images = np.arange(6 * 3 * 4 * 4, dtype=np.uint8).reshape(6, 3, 4, 4)
    return np.repeat(np.arange(3), 2), ["a", "b", "c"], [images[:4], images[4:]]


(folder.parent / f"asked-{me}").touch()
split = cached_split(folder, "toy-train-4", {"size": 4}, [], build)
print(int(split.images.sum()), split.labels.tolist())
"""


def test_processes_asking_at_once_for_a_split_not_cached_yet_decode_it_once(tmp_path):
    """The runs of a sweep start together: one decodes, the other waits for its cache and maps it."""
    import subprocess
    import time

    folder = tmp_path / "cache"
    loaders = [subprocess.Popen([sys.executable, "-c", CONCURRENT_LOADER, str(folder), str(i)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for i in range(2)]
    deadline = time.time() + 120
    while len(list(tmp_path.glob("ready-*"))) < 2 and time.time() < deadline:
        time.sleep(0.05)
    (tmp_path / "go").touch()
    outputs = [loader.communicate(timeout=120) for loader in loaders]
    assert all(loader.returncode == 0 for loader in loaders), [err for _, err in outputs]
    expected = f"{int(np.arange(6 * 3 * 4 * 4, dtype=np.uint8).sum(dtype=np.int64))} [0, 0, 1, 1, 2, 2]"
    assert [out.strip() for out, _ in outputs] == [expected] * 2
    assert len((tmp_path / "builds").read_text().split()) == 1  # without the lock: one build each
    assert sum("waiting for another process decoding toy-train-4" in err for _, err in outputs) == 1


def test_a_decode_waiting_for_another_names_the_decoder_and_its_host(tmp_path, capsys):
    """The line said `waiting for another process decoding ...` and no more: the lock file recorded nothing,
    so on a data root the nodes of a cluster share, no one could tell which process (on which node) to wait
    for or look at. The lock now names its holder, and the waiting line names it; it goes when let go."""
    import fcntl
    import threading

    from fslab.core.states import HOST

    folder = tmp_path / "cache"
    folder.mkdir()
    lock = folder / ".toy-train-4.lock"
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, b"4242 node-b\n")  # as a decoder on another node writes it
    held = []

    def decode():
        with image_cache.decoding(folder, "toy-train-4"):
            held.append(lock.read_text())

    waiter = threading.Thread(target=decode)
    waiter.start()
    said, deadline = "", time.time() + 60
    while "waiting" not in said and time.time() < deadline:
        time.sleep(0.01)
        said += capsys.readouterr().err
    os.close(fd)  # the other decoder is done
    waiter.join(timeout=60)
    assert said == (f"fslab: waiting for another process decoding toy-train-4 into {folder} "
                    f"(pid 4242 on host node-b, another machine) ...\n")
    assert held == [f"{os.getpid()} {HOST}\n"] and not lock.exists()


def test_a_read_only_lock_file_an_earlier_fslab_left_still_makes_decoders_wait(tmp_path, monkeypatch, capsys):
    """Earlier versions kept the lock file: one another user's fslab left, which this user cannot open to
    write, was not locked at all and two decoders wrote the same cache at once. ``flock`` locks a read-only
    descriptor too: the second waits, and its line says the holder is not recorded (the file's line is the
    earlier fslab's, of a process long gone) rather than naming that process."""
    import subprocess
    import threading

    folder = tmp_path / "cache"
    folder.mkdir()
    lock = folder / ".toy-train-4.lock"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    lock.write_text(f"{gone.pid}\n")  # an earlier fslab's line: a pid alone
    lock.chmod(0o444)
    real_open = os.open

    def as_another_users(path, flags, *args, **kwargs):  # root may write a 0o444 file: deny as to a user
        if (str(path) == str(lock) and flags & (os.O_WRONLY | os.O_RDWR) and lock.exists()
                and not lock.stat().st_mode & 0o200):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", as_another_users)
    events, first_in, let_go = [], threading.Event(), threading.Event()

    def decode(me):
        with image_cache.decoding(folder, "toy-train-4"):
            events.append(f"in {me}")
            if me == 1:
                first_in.set()
                let_go.wait(timeout=20)
            events.append(f"out {me}")

    first = threading.Thread(target=decode, args=(1,))
    first.start()
    assert first_in.wait(timeout=20)
    second = threading.Thread(target=decode, args=(2,))
    second.start()
    said, deadline = "", time.time() + 10
    while "waiting" not in said and time.time() < deadline:
        time.sleep(0.01)
        said += capsys.readouterr().err
    let_go.set()
    first.join(timeout=20)
    second.join(timeout=20)
    assert events == ["in 1", "out 1", "in 2", "out 2"]
    assert said == (f"fslab: waiting for another process decoding toy-train-4 into {folder} (its holder is "
                    f"not recorded: {lock} cannot be written by this user) ...\n")


def test_cache_goes_to_cache_dir_or_the_user_cache_when_root_is_not_writable(registry, tmp_path, monkeypatch):
    root = tmp_path / "data"
    written = make_folder_tree(root, classes=2, per_class=2)
    create(registry, "folder", root, image_size=6, cache_dir=str(tmp_path / "mine")).load("test")
    assert list((tmp_path / "mine").glob("*/folder-test-6.json")) and not (root / ".fslab-cache").exists()
    (root / ".fslab-cache").write_text("a file where the cache folder would go: not usable")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    s = create(registry, "folder", root, image_size=6).load("test")
    assert list((tmp_path / "xdg" / "fslab").glob("*/folder-test-6.json"))
    np.testing.assert_array_equal(s.images[0].numpy(), expected_pixels(written["test"][0][1], 6))


def test_a_cache_dir_that_cannot_be_written_is_refused_before_the_run_exists(registry, tmp_path, monkeypatch):
    """The run folder was made and the run failed in its worker (exit code 1) at its first decode."""
    make_folder_tree(tmp_path / "tree", classes=6, per_class=6)
    (tmp_path / "afile").write_text("a file: no folder can be made under it, even by root")
    small = ["--set", "dataset.image_size=8", "--set", "eval.ways=2", "--set", "eval.shots=1",
             "--set", "eval.val_shots=1", "--set", "eval.queries=2", "--batch-size", "8", "--epochs", "1",
             "--set", "eval.val_episodes=2", "--set", "eval.test_episodes=2",
             "--backbone", "conv4", "--set", "backbone.hidden=8"]
    result = fslab_here("run", "nca", "--dataset", "folder", "--data-root", "tree", "--set",
                        "dataset.cache_dir=afile/cache", *small, cwd=tmp_path)
    assert result.returncode == 2 and not (tmp_path / "runs").exists(), result.stderr
    assert re.fullmatch(rf"error: dataset\.cache_dir: cannot write the decode cache of folder in "
                        rf"{tmp_path / 'afile' / 'cache'}/\w+: {tmp_path / 'afile'} is not a folder; give a "
                        rf"folder that can be written with --set dataset\.cache_dir=DIR, or leave it out .*\n",
                        result.stderr), result.stderr
    # a run that trained with a cache folder that can no longer be written (a file in its place now): its
    # resume is refused the same way, and told that fslab resume takes no --set
    trained = fslab_here("run", "nca", "--dataset", "folder", "--data-root", "tree", "--set",
                         "dataset.cache_dir=cache", *small, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    (run,) = list_runs(tmp_path / "runs")
    run.write_status(state="failed")
    shutil.rmtree(tmp_path / "cache")
    (tmp_path / "cache").write_text("a file where the cache folder was")
    resumed = fslab_here("resume", run.id, cwd=tmp_path)
    assert resumed.returncode == 2 and resumed.stderr.count("\n") == 1, resumed.stderr
    assert resumed.stderr.startswith("error: dataset.cache_dir: cannot write the decode cache of folder"), \
        resumed.stderr
    assert resumed.stderr.endswith(f"(fslab resume takes no --set: put right what the run's own settings need "
                                   f"and resume it, or start it anew with other settings: fslab run --like {run.id} "
                                   f"--set ...)\n"), resumed.stderr
    shared = tmp_path / "shared"  # a read-only cache_dir that holds every split already is only read
    create(registry, "folder", tmp_path / "tree", image_size=6, cache_dir=str(shared)).split_sizes()
    for split in ("train", "val", "test"):
        create(registry, "folder", tmp_path / "tree", image_size=6, cache_dir=str(shared)).load(split)
    writable = os.access
    monkeypatch.setattr(image_cache.os, "access", lambda path, mode: (
        False if mode == os.W_OK and str(path).startswith(str(shared)) else writable(path, mode)))
    create(registry, "folder", tmp_path / "tree", image_size=6, cache_dir=str(shared)).split_sizes()
    with pytest.raises(UsageError, match=f"^dataset.cache_dir: .*: {shared}/\\w+ cannot be written; give "):
        create(registry, "folder", tmp_path / "tree", image_size=8, cache_dir=str(shared)).split_sizes()


def test_a_read_only_root_with_a_ready_cache_is_read_from_it(registry, tmp_path, monkeypatch):
    # a lab's shared, read-only copy of a dataset whose .fslab-cache its owner made: each user decoded it
    # again into ~/.cache, minutes and gigabytes at miniImageNet's size
    root = tmp_path / "data"
    written = make_folder_tree(root, classes=2, per_class=2)
    create(registry, "folder", root, image_size=6).load("test")
    assert list((root / ".fslab-cache").glob("folder-test-6.json"))
    writable = os.access
    monkeypatch.setattr(image_cache.os, "access", lambda path, mode: (
        False if mode == os.W_OK and str(path).startswith(str(root)) else writable(path, mode)))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    s = create(registry, "folder", root, image_size=6).load("test")
    np.testing.assert_array_equal(s.images[0].numpy(), expected_pixels(written["test"][0][1], 6))
    assert not (tmp_path / "xdg").exists()  # nothing decoded, nothing written
    s = create(registry, "folder", root, image_size=8).load("test")  # no ready cache of this size: the user's
    assert list((tmp_path / "xdg" / "fslab").glob("*/folder-test-8.json")) and s.images.shape[-1] == 8
def test_folder_reads_file_and_class_names_that_are_not_utf8(registry, tmp_path):
    """A name in latin-1 bytes (as old zip and tar archives unpack): the cache key hashed its
    path with str.encode(), which cannot encode the byte, and the run failed with UnicodeEncodeError."""
    root = tmp_path / "data"
    written = make_folder_tree(root, classes=2, per_class=2)
    odd = os.fsencode(root / "train" / "train-class1") + b"/caf\xe9.png"
    Image.fromarray(random_image(rng(3), 10, 12)).save(odd, format="PNG")
    os.rename(os.fsencode(root / "val" / "val-class0"), os.fsencode(root / "val") + b"/cl\xe9ss0")
    dataset = create(registry, "folder", root, image_size=8)
    train = dataset.load("train")
    assert train.labels.tolist() == [0, 0, 1, 1, 1]
    np.testing.assert_array_equal(train.images[4].numpy(), expected_pixels(Image.open(odd), 8))
    assert dataset.load("val").classes == [os.fsdecode(b"cl\xe9ss0"), "val-class1"]
    utf8 = image_cache.source_key("s", {}, [written["test"][0][1]])  # a UTF-8 name keeps the key it had
    stat = os.stat(written["test"][0][1])
    digest = hashlib.sha256(json.dumps({"version": image_cache.FORMAT_VERSION, "stem": "s", "params": {}},
                                       sort_keys=True).encode())
    digest.update(f"\n{written['test'][0][1]}\t{stat.st_size}\t{stat.st_mtime_ns}".encode())
    assert utf8 == digest.hexdigest()[:16]


def png_claiming(width: int, height: int) -> bytes:
    """A PNG file whose header claims ``width``×``height`` pixels (its data is a few bytes)."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("name, data", [
    ("huge.png", png_claiming(20_000, 20_000)),  # PIL's DecompressionBombError
    ("bad.ppm", b"P6\n8 8\n2\xd35\n" + bytes(192)),  # ValueError from PIL's PPM header parser
], ids=["decompression-bomb", "damaged-ppm-header"])
def test_an_image_pil_refuses_other_than_by_oserror_is_one_line_naming_it(registry, tmp_path, name, data):
    """These escaped decode_file as a traceback that named no file (DecompressionBombError: Image size ...)."""
    root = tmp_path / "data"
    make_folder_tree(root, classes=2, per_class=2)
    (root / "test" / "test-class1" / name).write_bytes(data)
    shown = re.escape(f"test/test-class1/{name} (in the data root {root})")
    with pytest.raises(UsageError, match=f"^cannot decode image {shown}: .*; replace"):
        create(registry, "folder", root, image_size=8).load("test")
    with pytest.raises(UsageError, match="^cannot decode an image held in a pickle: "):
        image_cache.decode_bytes(data, 8, "RGB")


def test_a_disk_too_full_for_the_cache_names_the_folder_the_room_needed_and_cache_dir(registry, tmp_path, monkeypatch):
    """A full disk under ROOT/.fslab-cache failed the run with "dataset 'folder' failed to load its train
    split: OSError: [Errno 28] No space left on device", as if the plugin were at fault, naming no folder."""
    import errno

    from fslab.training.build import load_split

    root = tmp_path / "data"
    make_folder_tree(root, classes=2, per_class=2)

    class Full(io.BytesIO):
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(image_cache, "open", lambda path, mode: Full(), raising=False)
    monkeypatch.setattr("shutil.disk_usage", lambda path: SimpleNamespace(free=40 * 2**10))
    with pytest.raises(OSError) as full:
        load_split(create(registry, "folder", root, image_size=64), "train", "folder")
    assert str(full.value) == (
        f"no space left for the decode cache of folder-train-64 in {root / '.fslab-cache'} (it needs 48.0 KiB, "
        f"40.0 KiB free there); free some space there, or put the cache on another disk with --set "
        f"dataset.cache_dir=DIR (the synthetic datasets' cache follows $XDG_CACHE_HOME)")
    assert list((root / ".fslab-cache").iterdir()) == []  # nothing half written (and the lock let go)


def test_a_cache_neither_root_nor_user_cache_can_hold_suggests_cache_dir(registry, tmp_path, monkeypatch):
    """It was a bare "OSError: [Errno 30] Read-only file system: '~/.cache/fslab'" that did not
    say why fslab wrote there, nor how to choose another folder."""
    root = tmp_path / "data"
    make_folder_tree(root, classes=2, per_class=2)
    (root / ".fslab-cache").write_text("not a folder: the root's cache cannot go here")
    (tmp_path / "xdg").write_text("not a folder either")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    expected = (rf"^cannot write the decode cache of folder-test-6 in {tmp_path / 'xdg'}/fslab/\w+: .*; "
                r"point it at a writable folder with --set dataset.cache_dir=DIR$")
    with pytest.raises(UsageError, match=expected):
        create(registry, "folder", root, image_size=6).load("test")
    mine = create(registry, "folder", root, image_size=6, cache_dir=str(tmp_path / "c"))
    assert mine.load("test").labels.tolist() == [0, 0, 1, 1]


# -- miniImageNet ---------------------------------------------------------------------------


def make_mini_csv(root: Path, per_class=3, classes_per_split=(3, 2, 2)) -> dict:
    r = rng(1)
    written = {}
    for split, count in zip(("train", "val", "test"), classes_per_split):
        rows, written[split] = ["filename,label"], []
        for wnid in listed("miniimagenet", split)[:count]:
            for i in range(per_class):
                name = f"{wnid}{i:08d}.jpg"
                path = root / "images" / name
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(random_image(r, 12, 9)).save(path, format="JPEG", quality=90)
                rows.append(f"{name},{wnid}")
                written[split].append((wnid, path))
        (root / f"{split}.csv").write_text("\n".join(rows) + "\n")
    return written


def test_folder_scales_16_bit_images_and_reads_ppm_but_no_hidden_file(registry, tmp_path):
    """A 16-bit grayscale PNG (a microscope's, a scanner's) is scaled to 8 bits, not clipped
    to white; .ppm files count as images; ._name.png files macOS leaves are not images."""
    from PIL import Image

    levels = {"dark": 2000, "mid": 30000, "bright": 60000}
    for split in ("train", "val", "test"):
        for name, level in levels.items():
            folder = tmp_path / "data" / split / name
            folder.mkdir(parents=True)
            Image.fromarray(np.full((6, 6), level, dtype=np.uint16)).save(folder / "a.png")
            (folder / "._a.png").write_bytes(b"AppleDouble metadata")
    Image.fromarray(np.full((6, 6, 3), 40, dtype=np.uint8)).save(tmp_path / "data" / "train" / "dark" / "b.ppm")
    split = create(registry, "folder", tmp_path / "data", image_size=6, grayscale=True).load("train")
    means = [float(img.float().mean()) for img in split.images]
    assert split.classes == ["bright", "dark", "mid"] and split.labels.tolist() == [0, 1, 1, 2]
    assert means == [round(60000 / 257), round(2000 / 257), 40.0, round(30000 / 257)]  # a.png, then b.ppm


def test_a_photo_stored_on_its_side_is_read_upright_as_its_exif_orientation_says(registry, tmp_path):
    """A phone's portrait photo is stored landscape with an EXIF orientation tag (6: turn 90° clockwise),
    which every viewer applies: fslab cached it on its side, as a class of portraits and landscapes
    mixed. The folder tree's JPEGs are read as they are shown; one without the tag as it is stored."""
    make_folder_tree(tmp_path / "data", classes=2, per_class=1)
    pixels = random_image(rng(3), 8, 16)  # wide as stored, tall as shown
    for name, orientation in (("side.jpg", 6), ("plain.jpg", 1)):
        image = Image.fromarray(pixels)
        exif = image.getexif()
        exif[0x0112] = orientation
        image.save(tmp_path / "data" / "train" / "train-class0" / name, quality=95, exif=exif)
    split = create(registry, "folder", tmp_path / "data", image_size=8).load("train")
    folder = tmp_path / "data" / "train" / "train-class0"
    with Image.open(folder / "side.jpg") as side, Image.open(folder / "plain.jpg") as plain:
        upright = expected_pixels(side.transpose(Image.Transpose.ROTATE_270), 8)
        as_stored = expected_pixels(plain, 8)
    np.testing.assert_array_equal(split.images[2].numpy(), upright)  # 00.png, plain.jpg, side.jpg
    np.testing.assert_array_equal(split.images[1].numpy(), as_stored)
    assert not np.array_equal(upright, expected_pixels(Image.open(folder / "side.jpg"), 8))


def test_a_benchmark_datasets_photo_is_read_as_stored_whatever_its_exif_orientation(registry, tmp_path):
    """ImageNet's JPEGs (miniImageNet's, tieredImageNet's) hold a few EXIF orientation tags that the papers'
    code (PIL's open and convert) never applied: fslab reads them as stored, as the published numbers were made."""
    fake_tiered_folders(tmp_path)
    first = sorted(tmp_path.glob("train/*/*.JPEG"))[0]
    image = Image.fromarray(random_image(rng(3), 8, 16))
    exif = image.getexif()
    exif[0x0112] = 6
    image.save(first, format="JPEG", quality=95, exif=exif)
    split = create(registry, "tieredimagenet", tmp_path, image_size=8, check_counts=False).load("train")
    with Image.open(first) as stored:
        np.testing.assert_array_equal(split.images[0].numpy(), expected_pixels(stored, 8))


def test_folder_reads_jpegs_saved_as_jfif_or_jpe_and_netpbm_bitmaps(registry, tmp_path):
    """A browser saves a JPEG as .jfif (Chrome on Windows) or .jpe; scanners write .pbm and .pnm: such files
    were left out of their class in silence, a class of them all was refused as holding no image files."""
    r = rng(4)
    for split in ("train", "val", "test"):
        for c, suffix in enumerate((".jfif", ".JPE", ".pbm", ".pnm")):
            folder = tmp_path / "data" / split / f"{split}{c}"
            folder.mkdir(parents=True)
            image = Image.fromarray(random_image(r, 6, 6))
            if suffix == ".pbm":
                image = image.convert("1")
            image.save(folder / f"a{suffix}", format="PPM" if suffix in (".pbm", ".pnm") else "JPEG")
    dataset = create(registry, "folder", tmp_path / "data", image_size=6)
    assert dataset.split_sizes()["train"] == [1, 1, 1, 1]
    split = dataset.load("train")
    for k, name in enumerate(("train0/a.jfif", "train1/a.JPE", "train2/a.pbm", "train3/a.pnm")):
        np.testing.assert_array_equal(split.images[k].numpy(), expected_pixels(tmp_path / "data/train" / name, 6))


def test_miniimagenet_csv_layout(registry, tmp_path):
    written = make_mini_csv(tmp_path)
    train = tmp_path / "train.csv"  # saved by Excel or pandas' utf-8-sig: a byte-order mark first
    train.write_bytes(b"\xef\xbb\xbf" + train.read_bytes())
    dataset = create(registry, "miniimagenet", tmp_path, image_size=7, check_counts=False)
    for split, items in written.items():
        classes = list(dict.fromkeys(w for w, _ in items))
        assert_split(dataset.load(split), [expected_pixels(p, 7) for _, p in items],
                     [classes.index(w) for w, _ in items], classes)


class FileCalls:
    """``os.stat`` calls (``lstat`` too: pathlib's goes through it) and files opened of the .jpg and .png
    files under ``root``, and its csv files opened, counted while the test runs (the threads that read
    headers and decode included)."""

    def __init__(self, root: Path, monkeypatch) -> None:
        import builtins

        self.root, self.counts = str(root) + os.sep, {}
        stat, opened = os.stat, builtins.open

        def count(kind, path):
            name = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else ""
            csv = kind == "open" and name.endswith(".csv")
            image = name.startswith(self.root) and name.endswith((".jpg", ".png"))
            where = "image" if image else "csv" if csv else None
            if where:
                self.counts[f"{where} {kind}"] = self.counts.get(f"{where} {kind}", 0) + 1

        monkeypatch.setattr(os, "stat", lambda path, *a, **k: count("stat", path) or stat(path, *a, **k))
        monkeypatch.setattr(builtins, "open", lambda path, *a, **k: count("open", path) or opened(path, *a, **k))

    def taken(self) -> dict:
        counts, self.counts = self.counts, {}
        return counts


def test_miniimagenet_s_images_are_stat_ed_once_before_a_run_and_a_warm_cache_opens_none(registry, tmp_path,
                                                                                          monkeypatch):
    """The checks before a run found every image its csv lists with a stat, then the cache's key stat'ed
    each again, and the csv files were read four times each (the check of the listed files, the counts, the
    headers read, the key): for miniImageNet's 60,000 JPEGs 2.8 s on a warm cache, where one stat of each
    takes 0.2 s. Now each image is stat'ed once, its header read only where its split is not cached yet."""
    written = make_mini_csv(tmp_path)
    images = sum(len(items) for items in written.values())
    calls = FileCalls(tmp_path, monkeypatch)
    assert create(registry, "miniimagenet", tmp_path, check_counts=False).split_sizes() == {
        "train": [3, 3, 3], "val": [3, 3], "test": [3, 3]}
    assert calls.taken() == {"image stat": images, "image open": images, "csv open": 3}  # the headers read
    worker = create(registry, "miniimagenet", tmp_path, image_size=7, check_counts=False)
    for split in written:
        worker.load(split)
    assert calls.taken() == {"image stat": images, "image open": images, "csv open": 3}  # the decode
    assert create(registry, "miniimagenet", tmp_path, image_size=7, check_counts=False).split_sizes()
    assert calls.taken() == {"image stat": images, "csv open": 3}  # the cache's key settles it: no header read
    os.remove(written["val"][1][1])  # a listed image gone: the line as before, found by the same one stat
    with pytest.raises(UsageError, match=r"miniimagenet: .*/images/\w+\.jpg, listed in .*/val\.csv, does not exist"):
        create(registry, "miniimagenet", tmp_path, image_size=7, check_counts=False).split_sizes()
    assert calls.taken()["image stat"] == images


def test_a_folder_tree_s_images_are_stat_ed_once_before_a_run_its_listing_telling_files_from_links(registry, tmp_path,
                                                                                                    monkeypatch):
    """The listing of each class folder asked every image whether it was a link (an lstat) and a file (a
    stat), then the cache's key stat'ed it again: three a file, for tieredImageNet's 779,165 each time.
    The listing tells files and links apart by itself; a link still costs its stats, and one that is gone
    is still refused."""
    written = make_folder_tree(tmp_path / "data")
    images = sum(len(items) for items in written.values())
    calls = FileCalls(tmp_path / "data", monkeypatch)
    assert create(registry, "folder", tmp_path / "data", image_size=8).split_sizes() == {
        split: [3, 3, 3] for split in written}
    assert calls.taken() == {"image stat": images, "image open": images}  # the key's, the headers read
    for split in written:
        create(registry, "folder", tmp_path / "data", image_size=8).load(split)
    assert calls.taken() == {"image stat": images, "image open": images}  # the key's, the decode
    assert create(registry, "folder", tmp_path / "data", image_size=8).split_sizes()
    assert calls.taken() == {"image stat": images}  # a warm cache: no header read
    linked = written["train"][0][1].parent / "zz.png"
    os.symlink(written["train"][1][1], linked)  # a link to an image: read as the image it leads to
    assert create(registry, "folder", tmp_path / "data", image_size=8).split_sizes()["train"] == [4, 3, 3]
    calls.taken()
    os.remove(written["train"][1][1])
    with pytest.raises(UsageError, match=rf"^{linked} is a broken link"):
        create(registry, "folder", tmp_path / "data", image_size=8).split_sizes()


def test_a_split_is_decoded_a_slice_of_images_a_thread_task_in_order(monkeypatch):
    """Each image was a task of its own to the decoding threads, about 40 µs more an image than an 84×84
    JPEG's decode: 8,000 images/s on 2 cores, 11,200 with 64 images a task."""
    from concurrent.futures import ThreadPoolExecutor

    tasks = []

    class Counted(ThreadPoolExecutor):
        def map(self, fn, *iterables, **kwargs):
            items = list(iterables[0])
            tasks.append(len(items))
            return super().map(fn, items, **kwargs)

    monkeypatch.setattr(image_cache, "ThreadPoolExecutor", Counted)
    blocks = list(image_cache.decode_all(list(range(600)), lambda job: np.full((1, 2, 2), job % 256, np.uint8)))
    assert [len(block) for block in blocks] == [512, 88]
    assert np.concatenate(blocks)[:, 0, 0, 0].tolist() == [job % 256 for job in range(600)]
    assert tasks == [8, 2]  # 64 images a task

    def decode(job):
        if job in (70, 130):
            time.sleep(0.05 if job == 70 else 0)  # the later one fails first: the first in order is named
            raise UsageError(f"cannot decode image {job}")
        return np.zeros((1, 2, 2), np.uint8)

    with pytest.raises(UsageError, match="cannot decode image 70$"):
        list(image_cache.decode_all(list(range(200)), decode))


def test_a_source_s_name_in_the_cache_key_is_its_path_relative_to_the_root_as_relpath_says(tmp_path):
    """The key takes the tail of a path written plainly under the root, where relpath took 4 µs a file
    (3 s of tieredImageNet's); any other path is left to relpath, and the keys are those of earlier
    versions, so the caches they made stay valid."""
    paths = ["/r/images/a.jpg", "/r/images/../a.jpg", "/r/./images/a.jpg", "/r//images/a.jpg", "/rx/a.jpg",
             "/r/images/..", "/r/images/.", "/r/a/../../b/c.jpg", "/r/", "relative/a.jpg"]
    for root in ["/r/", "/q/../r/", "//", "/"]:
        for path in paths:
            assert image_cache.relative(path, root) == os.path.relpath(path, root), (path, root)
    image = tmp_path / "k" / "a.jpg"
    image.parent.mkdir()
    image.write_bytes(b"x")
    os.utime(image, ns=(1_700_000_000 * 10**9, 1_700_000_000 * 10**9))
    assert image_cache.source_key("s", {"a": 1}, [image], tmp_path) == "9e599dee437e46a5"  # the key it had


def test_miniimagenet_pickle_layout_orders_rows_by_class(registry, tmp_path):
    r = rng(2)
    expected = {}
    for split in ("train", "val", "test"):
        wnids = listed("miniimagenet", split)[:2]
        data = r.integers(0, 256, (6, 10, 10, 3), dtype=np.uint8)
        class_dict = {wnids[1]: [0, 2, 4], wnids[0]: [5, 1, 3]}  # interleaved, second class first
        with open(tmp_path / f"mini-imagenet-cache-{split}.pkl", "wb") as fh:
            pickle.dump({"image_data": data, "class_dict": class_dict}, fh)
        expected[split] = (data, wnids, [5, 1, 3, 0, 2, 4])
    dataset = create(registry, "miniimagenet", tmp_path, image_size=10, check_counts=False)
    assert dataset.source == "pickle"
    for split, (data, wnids, order) in expected.items():
        assert_split(dataset.load(split), [data[i].transpose(2, 0, 1) for i in order], [0, 0, 0, 1, 1, 1], wnids)
    smaller = create(registry, "miniimagenet", tmp_path, image_size=4, check_counts=False).load("val")
    data, _, order = expected["val"]
    np.testing.assert_array_equal(smaller.images.numpy(),
                                  np.stack([expected_pixels(Image.fromarray(data[i]), 4) for i in order]))


def test_a_short_split_file_is_one_line_naming_file_expected_and_found(registry, tmp_path):
    make_mini_csv(tmp_path, per_class=1)
    with pytest.raises(UsageError) as missing:
        create(registry, "miniimagenet", tmp_path).load("train")
    message = str(missing.value)
    assert "train.csv is short" in message and "expected 64 train classes" in message and "found 3" in message
    assert "check_counts=false" in message and "\n" not in message

    # Every class present but one row missing: 38,399 rows instead of 38,400.
    wnids = listed("miniimagenet", "train")
    rows = ["filename,label"] + [f"{w}{i:08d}.jpg,{w}" for w in wnids for i in range(600)]
    (tmp_path / "train.csv").write_text("\n".join(rows[:-1]) + "\n")
    with pytest.raises(UsageError) as short:
        create(registry, "miniimagenet", tmp_path).load("train")
    assert f"expected 600 images of class '{wnids[-1]}', found 599" in str(short.value)

    # A class of another split is named, whatever check_counts says.
    (tmp_path / "val.csv").write_text(f"filename,label\nx.jpg,{wnids[0]}\n")
    with pytest.raises(UsageError, match=f"not in the val list .*'{wnids[0]}'"):
        create(registry, "miniimagenet", tmp_path, check_counts=False).load("val")


# -- tieredImageNet -------------------------------------------------------------------------


def png_bytes(array) -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return np.frombuffer(buffer.getvalue(), dtype=np.uint8)


def test_tieredimagenet_pickles_keep_file_order_and_renumber_classes(registry, tmp_path):
    r = rng(3)
    expected = {}
    for split in ("train", "val", "test"):
        names = listed("tieredimagenet", split)
        arrays = [random_image(r, 9, 9) for _ in range(5)]
        raw = np.array([4, 2, 4, 2, 4])  # label ids as in the file: classes 2 and 4 of the list
        with open(tmp_path / f"{split}_images_png.pkl", "wb") as fh:
            pickle.dump([png_bytes(a) for a in arrays], fh)
        with open(tmp_path / f"{split}_labels.pkl", "wb") as fh:
            pickle.dump({"label_specific": raw, "label_general": np.zeros(5, np.int64),
                         "label_specific_str": names}, fh)
        expected[split] = (arrays, [names[2], names[4]], [1, 0, 1, 0, 1])
    dataset = create(registry, "tieredimagenet", tmp_path, image_size=9, check_counts=False)
    for split, (arrays, classes, labels) in expected.items():
        assert_split(dataset.load(split), [a.transpose(2, 0, 1) for a in arrays], labels, classes)
    with pytest.raises(UsageError, match=r"expected 351 train classes .*found 2"):
        create(registry, "tieredimagenet", tmp_path, image_size=9).load("train")


def test_tieredimagenet_split_folders(registry, tmp_path):
    r = rng(4)
    items = {}
    for split in ("train", "val", "test"):
        items[split] = []
        for wnid in listed("tieredimagenet", split)[:2]:
            for i in range(2):
                items[split].append((wnid, write_png(tmp_path / split / wnid / f"{wnid}_{i}.JPEG",
                                                     random_image(r, 8, 8))))
    dataset = create(registry, "tieredimagenet", tmp_path, image_size=8, check_counts=False)
    assert dataset.source == "folders"
    for split, written in items.items():
        classes = [w for w in listed("tieredimagenet", split) if w in {c for c, _ in written}]
        assert_split(dataset.load(split), [expected_pixels(p, 8) for _, p in written],
                     [classes.index(c) for c, _ in written], classes)


# -- CIFAR-FS and FC100 -----------------------------------------------------------------------


def make_cifar(root: Path, per_class_train=2, per_class_test=1):
    """cifar-100-python/ with real class names, a made-up superclass mapping
    (superclass k holds 5 fine classes) and random 32×32 images."""
    fine_names = sorted(sum((listed("cifar-fs", s) for s in ("train", "val", "test")), []))
    coarse_names = sorted(sum((listed("fc100", s) for s in ("train", "val", "test")), []))
    coarse_of = {f: i % 20 for i, f in enumerate(fine_names)}
    r = rng(5)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    parts = {}
    for part, count in (("train", per_class_train), ("test", per_class_test)):
        fine = [f for f in range(100) for _ in range(count)]
        order = r.permutation(len(fine))
        fine = [fine[i] for i in order]
        data = r.integers(0, 256, (len(fine), 3072), dtype=np.uint8)
        parts[part] = (data, fine)
        with open(folder / part, "wb") as fh:
            pickle.dump({"data": data, "fine_labels": fine, "coarse_labels": [coarse_of[fine_names[f]] for f in fine],
                         "filenames": [f"img{i}.png" for i in range(len(fine))]}, fh)
    with open(folder / "meta", "wb") as fh:
        pickle.dump({"fine_label_names": fine_names, "coarse_label_names": coarse_names}, fh)
    return fine_names, coarse_names, coarse_of, parts


def cifar_expected(classes, fine_names, parts, size):
    images, labels = [], []
    for k, c in enumerate(classes):
        for part in ("train", "test"):
            data, fine = parts[part]
            for row, f in zip(data, fine):
                if fine_names[f] == c:
                    hwc = row.reshape(3, 32, 32).transpose(1, 2, 0)
                    images.append(hwc.transpose(2, 0, 1) if size == 32 else expected_pixels(Image.fromarray(hwc), size))
                    labels.append(k)
    return images, labels


@pytest.mark.parametrize("name, damage", [
    ("cifar-fs", "cut"), ("fc100", "text"), ("miniimagenet", "cut"), ("tieredimagenet", "text")])
def test_a_truncated_or_damaged_pickle_is_one_line_naming_it(registry, tmp_path, name, damage):
    """A download cut short raised a bare 'UnpicklingError: pickle data was truncated' (or
    ValueError, EOFError) in the worker, naming no file."""
    if name in ("cifar-fs", "fc100"):
        make_cifar(tmp_path)
        path = tmp_path / "cifar-100-python" / "train"
    else:
        path = tmp_path / ("mini-imagenet-cache-val.pkl" if name == "miniimagenet" else "val_labels.pkl")
        whole = {"image_data": np.zeros((2, 4, 4, 3), np.uint8), "class_dict": {}, "label_specific": [0, 0]}
        for split in ("train", "val", "test"):
            for stem in ((f"mini-imagenet-cache-{split}",) if name == "miniimagenet"
                         else (f"{split}_images_png", f"{split}_labels")):
                (tmp_path / f"{stem}.pkl").write_bytes(pickle.dumps(whole))
    path.write_bytes(path.read_bytes()[:40] if damage == "cut" else b"garbage\n")
    with pytest.raises(UsageError) as damaged:
        create(registry, name, tmp_path, check_counts=False).load("val")
    assert str(damaged.value).startswith(f"{path} cannot be read as a pickle (")
    assert str(damaged.value).endswith("); it may be truncated or damaged: re-create or re-download it")


def test_cifar_fs_and_fc100(registry, tmp_path):
    fine_names, coarse_names, coarse_of, parts = make_cifar(tmp_path)
    cifar_fs = create(registry, "cifar-fs", tmp_path, check_counts=False)
    for split in ("train", "val", "test"):
        classes = sorted(listed("cifar-fs", split))
        assert_split(cifar_fs.load(split), *cifar_expected(classes, fine_names, parts, 32), classes)
    fc100 = create(registry, "fc100", tmp_path / "cifar-100-python", image_size=12, check_counts=False)
    for split in ("train", "val", "test"):
        supers = {coarse_names.index(s) for s in listed("fc100", split)}
        classes = sorted(f for f in fine_names if coarse_of[f] in supers)
        assert len(classes) == 5 * len(supers)
        assert_split(fc100.load(split), *cifar_expected(classes, fine_names, parts, 12), classes)
    with pytest.raises(UsageError, match="expected 600 images of class 'apple', found 3"):
        create(registry, "cifar-fs", tmp_path).load("train")


def test_a_corrected_shipped_class_list_decodes_the_split_again(registry, tmp_path, monkeypatch):
    """CIFAR's classes are chosen from its files by the list fslab ships: the cache key held neither
    the list nor anything it changes, so an fslab whose list was corrected kept the old classes."""
    import fslab_plugins.datasets.cifar as cifar

    make_cifar(tmp_path)
    full = sorted(listed("cifar-fs", "val"))
    assert create(registry, "cifar-fs", tmp_path, check_counts=False).load("val").classes == full
    shipped = cifar.shipped_list
    monkeypatch.setattr(cifar, "shipped_list", lambda name, split: (shipped(name, split)[0][1:], "the new list"))
    assert create(registry, "cifar-fs", tmp_path, check_counts=False).load("val").classes == sorted(
        listed("cifar-fs", "val")[1:])


def test_a_reordered_shipped_class_list_numbers_a_pickles_classes_again(registry, tmp_path, monkeypatch):
    """A miniImageNet pickle's classes are numbered in the shipped list's order: the cache kept the old numbers."""
    import fslab_plugins.datasets.miniimagenet as mini

    names = listed("miniimagenet", "val")[:2]
    whole = {"image_data": rng(1).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8),
             "class_dict": {names[0]: [0], names[1]: [1]}}
    for split in ("train", "val", "test"):
        (tmp_path / f"mini-imagenet-cache-{split}.pkl").write_bytes(pickle.dumps(whole))
    assert create(registry, "miniimagenet", tmp_path, check_counts=False).load("val").classes == names
    shipped = mini.shipped_list
    monkeypatch.setattr(mini, "shipped_list", lambda name, split: (shipped(name, split)[0][::-1], "the new list"))
    assert create(registry, "miniimagenet", tmp_path, check_counts=False).load("val").classes == names[::-1]


# -- Omniglot --------------------------------------------------------------------------------


def test_omniglot_rotations_are_classes_and_equal_rot90_of_the_drawing(registry, tmp_path):
    r = rng(6)
    (tmp_path / "omniglot-py" / "images_evaluation").mkdir(parents=True)
    characters = listed("omniglot", "val")[:2]
    drawings = {c: [write_png(tmp_path / "omniglot-py" / c / f"{k:04d}_{i:02d}.png",
                              (r.random((11, 11)) < 0.3).astype(np.uint8) * 255) for i in range(3)]
                for k, c in enumerate(characters)}
    dataset = create(registry, "omniglot", tmp_path, image_size=7, check_counts=False)
    assert dataset.channels == 1
    s = dataset.load("val")
    assert s.classes == [f"{c}/rot{d:03d}" for c in characters for d in (0, 90, 180, 270)]
    images, labels = [], []
    for i, c in enumerate(characters):
        base = [torch.from_numpy(expected_pixels(p, 7, "L").copy()) for p in drawings[c]]
        for k in range(4):
            images += [torch.rot90(b, k, dims=(1, 2)).numpy() for b in base]
            labels += [4 * i + k] * len(base)
    assert_split(s, images, labels, s.classes)
    plain = create(registry, "omniglot", tmp_path, image_size=7, rotations=False, check_counts=False).load("val")
    assert plain.classes == [f"{c}/rot000" for c in characters] and len(plain) == 6
    with pytest.raises(UsageError, match=r"expected 172 val classes .*found 2"):
        create(registry, "omniglot", tmp_path, image_size=7).load("val")


# -- CUB ---------------------------------------------------------------------------------------


def test_cub_with_and_without_bounding_box_crops(registry, tmp_path):
    folder = tmp_path / "CUB_200_2011"
    names = sorted(sum((listed("cub", s) for s in ("train", "val", "test")), []))
    (folder / "images").mkdir(parents=True)
    (folder / "classes.txt").write_text("".join(f"{i} {n}\n" for i, n in enumerate(names, 1)))
    r = rng(8)
    rows, labels_rows, boxes, items = [], [], [], []
    image_id = 0
    for split in ("train", "val", "test"):
        for name in listed("cub", split)[:2]:
            for i in range(2):
                image_id += 1
                array = random_image(r, 20, 16)
                path = write_png(folder / "images" / name / f"{name}_{i}.jpg", array)
                box = (float(r.integers(0, 6)) + 0.5, float(r.integers(0, 8)), 9.0, 10.7)
                rows.append(f"{image_id} {name}/{path.name}")
                labels_rows.append(f"{image_id} {names.index(name) + 1}")
                boxes.append(f"{image_id} {' '.join(map(str, box))}")
                items.append((split, name, array, box))
    for file, lines in (("images.txt", rows), ("image_class_labels.txt", labels_rows), ("bounding_box.txt", boxes)):
        (folder / file).write_text("\n".join(lines) + "\n")
    for bbox in (False, True):
        dataset = create(registry, "cub", tmp_path, image_size=6, bbox=bbox, check_counts=False)
        for split in ("train", "val", "test"):
            mine = [it for it in items if it[0] == split]
            classes = listed("cub", split)[:2]
            expected = []
            for _, _, array, (x, y, w, h) in mine:
                if bbox:  # a manual crop, whole pixels
                    array = np.ascontiguousarray(array[int(y):int(y + h), int(x):int(x + w)])
                expected.append(expected_pixels(Image.fromarray(array), 6))
            assert_split(dataset.load(split), expected, [classes.index(n) for _, n, _, _ in mine], classes)
    assert (tmp_path / ".fslab-cache" / "cub-train-6-bbox.json").exists()
    with pytest.raises(UsageError, match="images.txt is short: expected 11,788 rows, found 12"):
        create(registry, "cub", tmp_path, image_size=6).load("train")


# -- the contract every registered dataset keeps ------------------------------------------------


@pytest.mark.parametrize("row", ["1.0 1.0 0.0 8.0", "5.0 1.0 -3.0 8.0", "1.2 1.0 0.5 8.0", "1.0 1.0 8.0 nan"])
def test_cub_a_bounding_box_without_a_whole_pixel_is_one_line_naming_its_row(registry, tmp_path, row):
    """A zero width was cropped to nothing and cached as a black image, silently; a negative
    one raised PIL's bare "Coordinate 'right' is less than 'left'" naming no file."""
    fake_cub(tmp_path)
    boxes = tmp_path / "CUB_200_2011" / "bounding_box.txt"
    lines = boxes.read_text().splitlines()
    boxes.write_text("\n".join([f"1 {row}", *lines[1:]]) + "\n")
    dataset = create(registry, "cub", tmp_path, image_size=6, bbox=True, check_counts=False)
    with pytest.raises(UsageError, match=f"^cub: {boxes} has no valid box for image 1: width .* hold no whole pixel"):
        dataset.load("train")
    assert create(registry, "cub", tmp_path, image_size=6, check_counts=False).load("train").images.shape[0] == 4


def fake_tiered_folders(root: Path):
    r = rng(4)
    for split in ("train", "val", "test"):
        for wnid in listed("tieredimagenet", split)[:2]:
            for i in range(2):
                write_png(root / split / wnid / f"{wnid}_{i}.JPEG", random_image(r, 8, 8))


def fake_omniglot(root: Path):
    r = rng(6)
    for folder in ("images_background", "images_evaluation"):
        (root / "omniglot-py" / folder).mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "test"):
        for k, character in enumerate(listed("omniglot", split)[:2]):
            for i in range(2):
                write_png(root / "omniglot-py" / character / f"{k:04d}_{i:02d}.png",
                          (r.random((11, 11)) < 0.3).astype(np.uint8) * 255)


def fake_cub(root: Path):
    folder = root / "CUB_200_2011"
    names = sorted(sum((listed("cub", s) for s in ("train", "val", "test")), []))
    (folder / "images").mkdir(parents=True)
    (folder / "classes.txt").write_text("".join(f"{i} {n}\n" for i, n in enumerate(names, 1)))
    r, rows, labels_rows, boxes = rng(8), [], [], []
    for split in ("train", "val", "test"):
        for name in listed("cub", split)[:2]:
            for i in range(2):
                path = write_png(folder / "images" / name / f"{name}_{i}.jpg", random_image(r, 12, 12))
                rows.append(f"{len(rows) + 1} {name}/{path.name}")
                labels_rows.append(f"{len(rows)} {names.index(name) + 1}")
                boxes.append(f"{len(rows)} 1.0 1.0 8.0 8.0")
    for file, lines in (("images.txt", rows), ("image_class_labels.txt", labels_rows), ("bounding_box.txt", boxes)):
        (folder / file).write_text("\n".join(lines) + "\n")


# A tiny copy of each registered dataset's layout; a new dataset plugin needs an entry here.
FAKES = {
    "synthetic": (lambda root: None, {"classes": 12, "val_classes": 3, "test_classes": 3, "images_per_class": 4}),
    "synthetic-mini": (lambda root: None, {"classes": 12, "val_classes": 3, "test_classes": 3, "images_per_class": 4,
                                           "image_size": 12}),
    "folder": (lambda root: [write_png(root / split / f"{split}-class{c}" / f"{i}.png", random_image(rng(c), 9, 9))
                             for split in ("train", "val", "test") for c in range(2) for i in range(2)], {}),
    "miniimagenet": (lambda root: make_mini_csv(root, per_class=2, classes_per_split=(2, 2, 2)), {}),
    "tieredimagenet": (fake_tiered_folders, {}),
    "cifar-fs": (lambda root: make_cifar(root, per_class_train=1, per_class_test=1), {}),
    "fc100": (lambda root: make_cifar(root, per_class_train=1, per_class_test=1), {}),
    "omniglot": (fake_omniglot, {}),
    "cub": (fake_cub, {}),
}


def test_every_registered_dataset_has_a_fake_layout_here(registry):
    assert sorted(registry.names("dataset")) == sorted(FAKES)


@pytest.mark.parametrize("name", sorted(FAKES))
def test_splits_share_no_class_and_sizes_are_told_without_decoding(registry, tmp_path, name):
    """Beyond the contract every dataset keeps (tests/test_contracts.py, fslab.testing's
    check_dataset on the same fake layouts): no class shared by two splits, and
    split_sizes() told from parameters, index files or listings, never by decoding."""
    build, params = FAKES[name]
    build(tmp_path)
    if name != "synthetic":
        params = {**params, "image_size": 8}
    if "check_counts" in registry.get("dataset", name).params:
        params = {**params, "check_counts": False}
    dataset = create(registry, name, tmp_path, **params)
    told = split_sizes_without_decoding(dataset)
    seen = {split: set(dataset.load(split).classes) for split in ("train", "val", "test")}
    assert not (seen["train"] & seen["val"] or seen["train"] & seen["test"] or seen["val"] & seen["test"])
    # Counted from parameters, index files or listings; CIFAR's pickles would have to be read (check_counts off here)
    assert set(told) == (set() if name in ("cifar-fs", "fc100") else {"train", "val", "test"})


def split_sizes_without_decoding(dataset) -> dict:
    """``dataset.split_sizes()``, failing if it decodes an image's pixels or reads a pickle on the
    way, or, but for the datasets of image files, opens an image at all: they read the header of each
    image of a split not cached yet, so that a file that is no image is refused before a run exists."""
    from PIL import ImageFile

    def refuse(*args, **kwargs):
        raise AssertionError("split_sizes() must not decode images or read pickles")

    with pytest.MonkeyPatch.context() as patch:
        if getattr(dataset, "name", "") not in ("folder", "miniimagenet", "tieredimagenet", "omniglot", "cub"):
            patch.setattr(Image, "open", refuse)
        patch.setattr(Image.Image, "load", refuse)
        patch.setattr(ImageFile.ImageFile, "load", refuse)
        patch.setattr(pickle, "load", refuse)
        return dataset.split_sizes()


def test_split_sizes_of_the_standard_files_follow_their_lists_with_check_counts(registry, tmp_path):
    """Where only reading the images would count them, the standard counts are told when
    check_counts promises them (the worker checks that promise as it reads the files)."""
    make_cifar(tmp_path)
    cifar = split_sizes_without_decoding(create(registry, "cifar-fs", tmp_path))
    fc100 = split_sizes_without_decoding(create(registry, "fc100", tmp_path))
    assert cifar == {split: [600] * n for split, n in (("train", 64), ("val", 16), ("test", 20))}
    assert fc100 == {split: [600] * n for split, n in (("train", 60), ("val", 20), ("test", 20))}
    for split in ("train", "val", "test"):
        (tmp_path / f"mini-imagenet-cache-{split}.pkl").write_bytes(b"never read here")
    mini = split_sizes_without_decoding(create(registry, "miniimagenet", tmp_path, source="pickle"))
    assert mini == {split: [600] * n for split, n in (("train", 64), ("val", 16), ("test", 20))}
    assert split_sizes_without_decoding(create(registry, "miniimagenet", tmp_path, source="pickle",
                                               check_counts=False)) == {}


def test_split_sizes_find_an_empty_class_folder(registry, tmp_path):
    make_folder_tree(tmp_path, classes=2, per_class=2)
    (tmp_path / "val" / "empty").mkdir()
    with pytest.raises(UsageError, match=r"empty has no image files \(1 empty class folder\); remove it or add"):
        create(registry, "folder", tmp_path).split_sizes()
    (tmp_path / "val" / "empty2").mkdir()
    with pytest.raises(UsageError, match=r"\(2 empty class folders\); remove them or add images$"):
        create(registry, "folder", tmp_path).split_sizes()


def test_a_class_folder_of_files_fslab_does_not_read_says_what_it_holds(registry, tmp_path):
    """A class of drawings saved as .svg, or one whose images lie in sub-folders, was told 'has no image
    files; remove it or add images', a folder full of pictures. The line says what it holds and why it is not read."""
    make_folder_tree(tmp_path, classes=2, per_class=2)
    drawn = tmp_path / "train" / "drawn"
    drawn.mkdir()
    for i in range(3):
        (drawn / f"shape_{i}.SVG").write_text("<svg/>")
    (drawn / "notes.txt").write_text("drawn in May")
    with pytest.raises(UsageError) as refused:
        create(registry, "folder", tmp_path).split_sizes()
    assert str(refused.value) == (
        f"folder: {drawn} has no image files (1 empty class folder): it holds 3 .svg files, 1 .txt file (the "
        f"images read are {' '.join(image_cache.IMAGE_EXTENSIONS)}, in any case: convert them to one of these); "
        f"remove it or add images")
    shutil.rmtree(drawn)
    for year in ("2019", "2020"):
        write_png(tmp_path / "val" / "years" / year / "a.png", random_image(rng(), 4, 4))
    with pytest.raises(UsageError) as refused:
        create(registry, "folder", tmp_path).split_sizes()
    assert str(refused.value) == (
        f"folder: {tmp_path / 'val' / 'years'} has no image files (1 empty class folder): it holds 2 sub-folders "
        f"(2019/, ...), whose images are not read: a class's images lie directly in its folder; remove it or "
        f"add images")


def test_photos_in_a_format_fslab_does_not_read_are_refused_not_left_out(registry, tmp_path):
    """An iPhone's .HEIC photos (or a camera's raw files) beside the JPEGs of a class were left out in silence:
    the class trained on a part of its photos. They are refused before a run, counted, with what to do."""
    make_folder_tree(tmp_path, classes=2, per_class=2)
    cat = tmp_path / "train" / "train-class1"
    for name in ("IMG_0002.HEIC", "IMG_0001.HEIC", "DSC_0003.NEF"):
        (cat / name).write_bytes(b"ftypheic")
    with pytest.raises(UsageError) as refused:
        create(registry, "folder", tmp_path).split_sizes()
    assert str(refused.value) == (f"{cat} holds 3 photos in a format fslab does not read (.heic, .nef), e.g. "
                                  f"DSC_0003.NEF: convert them to .jpg or .png, or move them out of the data root")
    for name in ("IMG_0002.HEIC", "IMG_0001.HEIC", "DSC_0003.NEF"):
        (cat / name).unlink()
    (cat / "._IMG_0004.HEIC").write_bytes(b"AppleDouble")  # hidden: no photo
    assert create(registry, "folder", tmp_path).split_sizes()["train"] == [2, 2]


def test_metadata_folders_a_zip_or_a_nas_adds_are_no_classes(registry, tmp_path):
    """A split unpacked from a zip archive made on macOS holds __MACOSX/ (its ._ files), one on a Synology NAS
    @eaDir/ (thumbnails): each was a class, refused as holding no image files, or trained as one."""
    make_folder_tree(tmp_path, classes=2, per_class=2)
    (tmp_path / "train" / "__MACOSX" / "train-class0").mkdir(parents=True)
    (tmp_path / "train" / "__MACOSX" / "train-class0" / "._00.png").write_bytes(b"AppleDouble")
    write_png(tmp_path / "val" / "@eaDir" / "SYNOFILE_THUMB_M.jpg", random_image(rng(), 4, 4))
    dataset = create(registry, "folder", tmp_path, image_size=8)
    assert dataset.split_sizes() == {"train": [2, 2], "val": [2, 2], "test": [2, 2]}
    assert dataset.load("val").classes == ["val-class0", "val-class1"]


def test_split_sizes_refuse_a_class_name_found_in_two_splits(registry, tmp_path):
    # every class folder of each split was used: a class in train/ and test/ was tested as if unseen
    make_folder_tree(tmp_path, classes=3, per_class=2)
    for split in ("val", "test"):
        for c in (0, 2):
            os.rename(tmp_path / split / f"{split}-class{c}", tmp_path / split / f"train-class{c}")
    with pytest.raises(UsageError) as shared:
        create(registry, "folder", tmp_path).split_sizes()
    assert str(shared.value) == (
        f"folder: the class 'train-class0' is in both {tmp_path / 'train'}/ and {tmp_path / 'val'}/ (2 names are "
        f"in more than one split); few-shot splits must hold disjoint classes (a test class seen in training "
        f"inflates its scores): rename the folders, or move each class into one split")
    (tmp_path / "val" / ".train-class1").mkdir()  # hidden: no class of val's
    for split in ("val", "test"):
        for c in (0, 2):
            os.rename(tmp_path / split / f"train-class{c}", tmp_path / split / f"{split}-class{c}")
    sizes = create(registry, "folder", tmp_path).split_sizes()
    assert sizes == {split: [2, 2, 2] for split in ("train", "val", "test")}


def test_split_sizes_refuse_two_class_folders_that_are_one_through_a_link(registry, tmp_path):
    # a link to another class folder made its images two classes, in one split or in two (train and test)
    make_folder_tree(tmp_path, classes=3, per_class=2)
    for link in (tmp_path / "test" / "test-class9", tmp_path / "train" / "train-class9"):
        os.symlink(tmp_path / "train" / "train-class1", link)
        with pytest.raises(UsageError) as one:
            create(registry, "folder", tmp_path).split_sizes()
        assert str(one.value) == (f"folder: {link} and {tmp_path / 'train' / 'train-class1'} are one folder (a link "
                                  f"leads from one to the other), so its images would be two classes; remove the link")
        link.unlink()
    os.rename(tmp_path / "val" / "val-class0", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", tmp_path / "val" / "val-class0")  # a class folder kept on another disk
    assert create(registry, "folder", tmp_path).split_sizes()["val"] == [2, 2, 2]


def test_float_images_are_scaled_from_0_1_or_read_as_0_255_and_others_named(registry, tmp_path):
    # a float TIFF's pixels were clipped by PIL's convert: 0..1 data came out almost black (0 or 1)
    levels = {"unit": (np.float32(0.5), 128), "byte": (np.float32(200.4), 200)}
    for split in ("train", "val", "test"):
        for name, (level, _) in levels.items():
            folder = tmp_path / "data" / split / name
            folder.mkdir(parents=True)
            Image.fromarray(np.full((6, 6), level, dtype=np.float32), mode="F").save(folder / "a.tif")
    split = create(registry, "folder", tmp_path / "data", image_size=6, grayscale=True).load("train")
    assert split.classes == ["byte", "unit"]
    assert [int(img.unique()) for img in split.images] == [200, 128]
    bad = tmp_path / "data" / "val" / "unit" / "a.tif"
    Image.fromarray(np.full((6, 6), -3.0, dtype=np.float32), mode="F").save(bad)
    shown = re.escape(f"val/unit/a.tif (in the data root {tmp_path / 'data'})")
    with pytest.raises(UsageError, match=rf"^cannot decode image {shown}: float pixels from -3 to -3 "
                                         r"\(0\.\.1 or 0\.\.255 are read\); replace or remove the file$"):
        create(registry, "folder", tmp_path / "data", image_size=6, grayscale=True).load("val")


def test_a_broken_link_to_an_image_or_a_class_folder_is_one_line_naming_it(registry, tmp_path):
    # a link whose target was moved away was skipped: the run trained on fewer images, or classes, than
    # the folder shows, and said nothing; a good link still counts
    make_folder_tree(tmp_path, classes=2, per_class=2)
    train = tmp_path / "train"
    first = sorted((train / sorted(os.listdir(train))[0]).iterdir())[0]
    os.symlink(first, train / sorted(os.listdir(train))[1] / "linked.png")
    assert create(registry, "folder", tmp_path).split_sizes()["train"] == [2, 3]
    os.symlink(tmp_path / "moved" / "img.png", first.parent / "z.png")
    with pytest.raises(UsageError, match=rf"^{first.parent / 'z.png'} is a broken link \(to .*moved/img.png\): "
                                         r"restore what it points at, or remove the link$"):
        create(registry, "folder", tmp_path).split_sizes()
    os.remove(first.parent / "z.png")
    os.symlink(tmp_path / "elsewhere" / "cls", train / "zz")
    with pytest.raises(UsageError, match=r"zz is a broken link \(to .*elsewhere/cls\)"):
        create(registry, "folder", tmp_path).load("train")


# -- missing files --------------------------------------------------------------------------------


@pytest.mark.parametrize("name, needed", [
    ("miniimagenet", "train.csv"), ("tieredimagenet", "train_images_png.pkl"), ("cifar-fs", "cifar-100-python"),
    ("fc100", "cifar-100-python"), ("omniglot", "images_background"), ("cub", "images.txt"), ("folder", "train"),
])
def test_a_missing_layout_is_one_line_naming_the_file_and_the_layout(registry, tmp_path, name, needed):
    with pytest.raises(UsageError) as empty:
        create(registry, name, tmp_path)
    message = str(empty.value)
    assert needed in message and "Expected layout" in message and "\n" not in message
    with pytest.raises(UsageError, match="is not a folder"):
        create(registry, name, tmp_path / "nowhere")


def test_a_folder_root_given_one_level_off_names_the_folder_that_holds_the_splits(registry, tmp_path):
    # --data-root DATA/train, or an archive unpacked into DATA/mine/: "DATA/train/train not found", and no hint
    make_folder_tree(tmp_path / "data" / "mine", classes=2, per_class=1)
    for given, meant in ((tmp_path / "data" / "mine" / "val", tmp_path / "data" / "mine"),
                         (tmp_path / "data", tmp_path / "data" / "mine")):
        with pytest.raises(UsageError) as off:
            create(registry, "folder", given)
        assert str(off.value) == (f"folder: {given / 'train'} not found, but {meant} holds train/, val/ and test/: "
                                  f"give --data-root {meant} (or [data_roots] folder in fslab.toml)")
    make_folder_tree(tmp_path / "data" / "other", classes=2, per_class=1)  # two candidates: no guess
    with pytest.raises(UsageError, match=r"data/train not found\. Expected layout: "):
        create(registry, "folder", tmp_path / "data")


def test_a_folder_tree_without_one_split_says_what_that_split_is_for(registry, tmp_path):
    # a tree of train/ and test/ (no validation split, as many are shared) was told to point --data-root
    # "at the folder holding" val/, which no folder does
    make_folder_tree(tmp_path, classes=2, per_class=1)
    shutil.rmtree(tmp_path / "val")
    with pytest.raises(UsageError) as missing:
        create(registry, "folder", tmp_path)
    assert str(missing.value) == (f"folder: {tmp_path / 'val'} not found: the tree has train/ and test/ but no val/, "
                                  f"whose classes fslab validates on after each epoch; give val/ class folders of its "
                                  f"own (classes in no other split, as many as eval.ways at least)")
    shutil.rmtree(tmp_path / "train")
    with pytest.raises(UsageError, match=r"/train not found: the tree has test/ but no train/, whose classes fslab "
                                         r"trains on; give train/ class folders"):
        create(registry, "folder", tmp_path)
    os.symlink(tmp_path / "unmounted" / "train", tmp_path / "train")  # not "no train/": a link to what is gone
    with pytest.raises(UsageError, match=rf"^{tmp_path / 'train'} is a broken link \(to .*unmounted/train\)"):
        create(registry, "folder", tmp_path)


def test_a_folder_split_named_as_other_trees_name_it_is_told_to_rename(registry, tmp_path):
    """A tree of train/, validation/ and test/ (or Train/, valid/) was told it had no val/ and to give val/
    class folders of its own, as if it had no validation classes: the line names the folder to rename."""
    make_folder_tree(tmp_path / "my data", classes=2, per_class=1)
    (tmp_path / "my data" / "val").rename(tmp_path / "my data" / "validation")
    with pytest.raises(UsageError) as misnamed:
        create(registry, "folder", tmp_path / "my data")
    root = tmp_path / "my data"
    assert str(misnamed.value) == (
        f"folder: {root / 'val'} not found, but {root / 'validation'} is there: the splits are read by the names "
        f"train/, val/ and test/ only; rename it: mv '{root / 'validation'}' '{root / 'val'}'")
    (tmp_path / "my data" / "validation").rename(tmp_path / "my data" / "val")
    (tmp_path / "my data" / "train").rename(tmp_path / "my data" / "Train")
    with pytest.raises(UsageError, match=r"/train not found, but .*/Train is there: .*rename it: mv "):
        create(registry, "folder", tmp_path / "my data")


@pytest.mark.parametrize("name", ["folder", "tieredimagenet"])
def test_a_file_where_a_split_folder_belongs_is_one_line_naming_it(registry, tmp_path, name):
    """It was 'Not a directory: ROOT/val' and exit code 1, as if the system had failed."""
    for split in ("train", "test"):
        for c in (listed("tieredimagenet", split)[:2] if name == "tieredimagenet" else ["a", "b"]):
            write_png(tmp_path / split / c / "0.png", random_image(rng(), 6, 6))
    (tmp_path / "val").write_text("not a folder")
    params = {"check_counts": False} if name == "tieredimagenet" else {}
    with pytest.raises(UsageError) as wrong:
        create(registry, name, tmp_path, **params).split_sizes()
    assert str(wrong.value) == (f"{name}: {tmp_path / 'val'} is not a folder. "
                                f"Expected layout: ROOT/{{train,val,test}}/<class>/<image files>.")


def test_cub_in_a_folder_without_it_names_both_places_it_looked(registry, tmp_path):
    with pytest.raises(UsageError) as empty:
        create(registry, "cub", tmp_path)
    assert str(empty.value).startswith(f"cub: found neither {tmp_path / 'CUB_200_2011'}/ nor "
                                       f"{tmp_path / 'images.txt'}. Expected layout: ROOT/CUB_200_2011/")


def test_the_cli_refuses_a_missing_data_root_before_creating_a_run(tmp_path):
    result = fslab("run", "nca", "--dataset", "miniimagenet", "--data-root", str(tmp_path / "nonexistent"),
                   "--epochs", "1", cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "miniimagenet" in lines[0] and "nonexistent" in lines[0]
    assert "Traceback" not in result.stderr and not list(tmp_path.glob("runs/*/config.json"))


def test_the_cli_refuses_images_an_index_lists_but_the_disk_lacks_before_creating_a_run(tmp_path):
    written = make_mini_csv(tmp_path / "mini")
    written["train"][1][1].unlink()
    written["test"][0][1].unlink()
    result = fslab("run", "nca", "--dataset", "miniimagenet", "--data-root", str(tmp_path / "mini"), "--epochs", "1",
                   "--device", "cpu", "--set", "dataset.check_counts=false", "--set", "eval.ways=2",
                   "--set", "eval.shots=1", "--set", "eval.val_shots=1", "--set", "eval.queries=1",
                   "--batch-size", "4", "--backbone", "conv4", "--set", "backbone.hidden=8",
                   "--set", "dataset.image_size=16", cwd=tmp_path, timeout=60)  # the whole layout trains with these
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: miniimagenet: 2 image files listed in the index files do not exist, e.g. {written['train'][1][1]} "
        f"(listed in {tmp_path / 'mini' / 'train.csv'}); restore them, or remove their rows"]
    assert not (tmp_path / "runs").exists()


def test_split_sizes_name_the_one_image_images_txt_lists_but_the_disk_lacks(registry, tmp_path):
    fake_cub(tmp_path)
    folder = tmp_path / "CUB_200_2011"
    create(registry, "cub", tmp_path, check_counts=False).split_sizes()  # every listed image is there
    gone = folder / "images" / (folder / "images.txt").read_text().splitlines()[-1].split()[1]
    gone.unlink()
    with pytest.raises(UsageError) as missing:
        create(registry, "cub", tmp_path, check_counts=False).split_sizes()
    assert str(missing.value) == (f"cub: {gone}, listed in {folder / 'images.txt'}, does not exist; "
                                  f"restore it, or remove its row")


# A training image of each dataset of image files, as its fake layout above writes it (folder's: its own test).
NOT_IMAGES = {
    "miniimagenet": "images/*.jpg",
    "tieredimagenet": "train/*/*.JPEG",
    "omniglot": "omniglot-py/images_background/*/*/*.png",
    "cub": "CUB_200_2011/images/*/*.jpg",
}


@pytest.mark.parametrize("name", sorted(NOT_IMAGES))
def test_an_image_of_any_dataset_that_is_no_image_is_refused_by_split_sizes(registry, tmp_path, name):
    """A page saved as .jpg in miniImageNet's images/, tieredImageNet's split folders, Omniglot's or
    CUB's: only folder read the headers before a run, so the others made the run, which failed at its
    start decoding the file. Each is now one line naming it by its path in the data root, as folder's,
    and a split already cached is not read again."""
    FAKES[name][0](tmp_path)
    first = sorted(tmp_path.glob(NOT_IMAGES[name]))[0]
    create(registry, name, tmp_path, check_counts=False).split_sizes()  # every image is one
    first.write_text("<html>a page, saved as an image</html>")
    with pytest.raises(UsageError) as refused:
        create(registry, name, tmp_path, check_counts=False).split_sizes()
    root = tmp_path / "omniglot-py" if name == "omniglot" else tmp_path
    assert str(refused.value).startswith(f"{name}: cannot read image {first.relative_to(root)} (in the data root "
                                         f"{root}): cannot identify image file")
    assert str(refused.value).endswith("; replace or remove the file")


@pytest.mark.parametrize("name", sorted(NOT_IMAGES))
def test_an_image_cut_short_after_its_header_is_named_by_its_path_in_the_data_root(registry, tmp_path, name):
    """Found only by the decode, at the run's start: folder and tieredimagenet named it by its path in the data
    root, as the check of headers before a run names all of these, but miniimagenet, omniglot and cub by its
    whole path."""
    FAKES[name][0](tmp_path)
    first = sorted(tmp_path.glob(NOT_IMAGES[name]))[0]
    first.write_bytes(first.read_bytes()[:-40])  # its header whole, its pixels cut short
    with pytest.raises(UsageError) as refused:
        create(registry, name, tmp_path, check_counts=False, image_size=8).load("train")
    root = tmp_path / "omniglot-py" if name == "omniglot" else tmp_path
    assert str(refused.value).startswith(f"cannot decode image {first.relative_to(root)} (in the data root {root}): ")


def test_the_cli_refuses_a_miniimagenet_image_that_is_no_image_before_creating_a_run(tmp_path):
    written = make_mini_csv(tmp_path / "mini")
    written["val"][0][1].write_bytes(b"")  # an empty file where a download stopped
    result = fslab("run", "nca", "--dataset", "miniimagenet", "--data-root", str(tmp_path / "mini"), "--epochs", "1",
                   "--device", "cpu", "--set", "dataset.check_counts=false", "--set", "eval.ways=2",
                   "--set", "eval.shots=1", "--set", "eval.val_shots=1", "--set", "eval.queries=1",
                   "--batch-size", "4", "--backbone", "conv4", "--set", "backbone.hidden=8",
                   "--set", "dataset.image_size=16", cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: miniimagenet: cannot read image images/{written['val'][0][1].name} (in the data root "
        f"{tmp_path / 'mini'}): cannot identify image file '{written['val'][0][1]}'; replace or remove the file"]
    assert not (tmp_path / "runs").exists()


def test_data_roots_in_fslab_toml_are_used_and_checked_before_a_run_exists(registry, tmp_path, monkeypatch):
    from fslab.core.config import resolve
    from fslab.core.settings import load_settings
    from fslab.execution.checks import check_dataset

    make_folder_tree(tmp_path / "tree", classes=2, per_class=1)
    (tmp_path / "fslab.toml").write_text('[data_roots]\nfolder = "tree"\ncub = "no-such-folder"\n')
    monkeypatch.chdir(tmp_path)
    settings = load_settings()
    config = resolve("nca", registry=registry, settings=settings, overrides=[{"dataset": {"name": "folder"}}])
    assert config["dataset"]["root"] == str(tmp_path / "tree")
    check_dataset(config, registry)  # the tree is complete: no error
    cub = resolve("nca", registry=registry, settings=settings, overrides=[{"dataset": {"name": "cub"}}])
    with pytest.raises(UsageError, match="no-such-folder is not a folder"):
        check_dataset(cub, registry)


def test_dataset_defaults_resolve_into_a_run_configuration(registry):
    from fslab.core.config import resolve
    from fslab.core.settings import Settings

    for name in ("miniimagenet", "tieredimagenet", "cifar-fs", "fc100", "omniglot", "cub", "folder"):
        config = resolve("nca", registry=registry, settings=Settings(), overrides=[{"dataset": {"name": name}}])
        assert os.path.isabs(config["dataset"]["root"]) and "cache_dir" in config["dataset"]
    tiered = resolve("nca", registry=registry, settings=Settings(), overrides=[{"dataset": {"name": "tieredimagenet"}}])
    assert tiered["train"]["batch_size"] == 1024 and tiered["train"]["milestones"] == [0.5, 0.75]


def test_listing_dataset_plugins_imports_no_torch_numpy_or_pil():
    code = ("import sys; from fslab.core.registry import load_registry; load_registry(strict=True); "
            "print([m for m in ('torch', 'numpy', 'PIL') if m in sys.modules])")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_a_run_on_a_folder_tree_ends_with_results(builtin_plugins, tmp_path):
    """The run trains in a worker process; the five fslab eval after it run in this process (fslab_here:
    no interpreter and torch started for each), as their caches and lines do not depend on one."""
    make_folder_tree(tmp_path / "tree", classes=6, per_class=12, size=(20, 20))
    result = fslab("run", "nca", "--dataset", "folder", "--data-root", str(tmp_path / "tree"), "--backbone", "conv4",
                   "--epochs", "1", "--device", "cpu", "--set", "backbone.hidden=8", "--set", "dataset.image_size=16",
                   "--batch-size", "24", "--set", "train.log_every=1", "--set", "eval.val_episodes=10",
                   "--set", "eval.test_episodes=20", "--set", "eval.queries=5", "--set", "eval.center_images=32",
                   cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    (run_dir,) = (tmp_path / "runs").glob("*-nca-*")
    results = json.loads((run_dir / "results.json").read_text())
    assert results["dataset"] == "folder" and set(results["test"]) == {"1-shot", "5-shot"}
    assert (tmp_path / "tree" / ".fslab-cache" / "folder-train-16.json").exists()
    # fslab eval's feature cache follows the data: images replaced on disk are embedded again
    args = ["eval", run_dir.name, "--shots", "1", "--queries", "5", "--episodes", "20", "--json"]
    outs = [fslab_here(*args, cwd=tmp_path) for _ in range(2)]
    first, again = (json.loads(out.stdout) for out in outs)
    assert (first["features_cached"], again["features_cached"]) == (False, True)
    assert again["accuracy"] == first["accuracy"] and not any("note:" in out.stderr for out in outs)
    for image in sorted((tmp_path / "tree" / "test").glob("test-class0/*.png"))[:6]:
        write_png(image, random_image(rng(9), 20, 20))  # a class's look replaced, its files kept
    told = fslab_here(*args, cwd=tmp_path)
    changed = json.loads(told.stdout)
    assert changed["features_cached"] is False
    # scored with no word that the images were not those of the run's own test (nor of its earlier fslab eval)
    assert [line for line in told.stderr.splitlines() if not line.startswith("fslab: ")] == [  # but the decode's
        f"note: the test images of run {run_dir.name} are not those its test scores were drawn on (files of its "
        f"data root added, removed or replaced since, --data-root naming other ones, or an fslab that decodes them "
        f"otherwise, as a photo's EXIF orientation): these scores, of the images as they are now, are kept beside "
        f"its own, which fslab runs still shows; fslab compare and plot pool runs only on the same images"]
    # data moved since the run trained: --data-root says where it lies now (the same images: still cached)
    (tmp_path / "tree").rename(tmp_path / "moved")
    lost = fslab_here(*args, cwd=tmp_path)  # the dataset's own line pointed at [data_roots], which eval does not read
    assert lost.returncode == 2 and lost.stderr.strip().splitlines() == [
        f"error: run {run_dir.name} was trained on {tmp_path / 'tree'}, which is not a folder now; "
        f"if the data moved, give where it lies with --data-root DIR"]
    # a project copied elsewhere with its data: the folder its fslab.toml gives the dataset is named
    (tmp_path / "fslab.toml").write_text('[data_roots]\nfolder = "moved"\n')
    named = fslab_here(*args, cwd=tmp_path)
    assert named.returncode == 2 and named.stderr.strip().splitlines() == [
        f"error: run {run_dir.name} was trained on {tmp_path / 'tree'}, which is not a folder now; if the data moved, "
        f"give where it lies with --data-root {tmp_path / 'moved'} (this project's folder for dataset 'folder', "
        f"from [data_roots] of fslab.toml)"]
    moved = fslab_here(*args, "--data-root", str(tmp_path / "moved"), cwd=tmp_path)
    assert moved.returncode == 0 and "note:" not in moved.stderr, moved.stderr  # the images it was told of
    assert json.loads(moved.stdout)["features_cached"] is True
    assert json.loads(moved.stdout)["accuracy"] == changed["accuracy"]


def _tiny_folder_run(tmp_path, batch: int = 6, queries: int = 1):
    """``fslab run nca`` for one epoch on the folder tree at ``tmp_path/tree`` (2-way 1-shot episodes of
    ``queries`` queries), in ``tmp_path``: the run the resume tests below change the data under."""
    return fslab("run", "nca", "--dataset", "folder", "--data-root", str(tmp_path / "tree"), "--backbone", "conv4",
                 "--epochs", "1", "--device", "cpu", "--set", "backbone.hidden=8", "--set", "dataset.image_size=8",
                 "--batch-size", str(batch), "--set", "eval.ways=2", "--set", f"eval.queries={queries}",
                 "--set", "eval.shots=[1]", "--set", "eval.val_shots=1", "--set", "eval.val_episodes=2",
                 "--set", "eval.test_episodes=2", cwd=tmp_path, timeout=300)


@pytest.mark.slow
def test_resuming_a_run_whose_data_root_is_gone_says_where_it_reads_its_data(tmp_path):
    """The dataset's line said to give --data-root or [data_roots] of fslab.toml: fslab resume had
    no --data-root and a resumed run reads neither; its line names fslab resume's --data-root."""
    from fslab.core.runstore import Run

    make_folder_tree(tmp_path / "tree", classes=3, per_class=4, size=(8, 8))
    started = _tiny_folder_run(tmp_path)
    assert started.returncode == 0, started.stderr
    (run_dir,) = (tmp_path / "runs").glob("*-nca-*")
    Run(run_dir).write_status(state="killed")  # as if stopped after its checkpoint
    (tmp_path / "tree").rename(tmp_path / "moved")
    refused = fslab("resume", run_dir.name, cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"error: run {run_dir.name} was trained on {tmp_path / 'tree'}, which is not a folder now; a resumed run "
        f"reads its data there: if the data moved, give where it lies with fslab resume {run_dir.name} --data-root DIR"]


@pytest.mark.slow
def test_resuming_a_run_whose_splits_went_one_folder_down_names_the_resume_that_moves_it(tmp_path):
    """The run's root still there, its splits moved into a folder of it: the dataset's line said to give
    --data-root DIR or [data_roots] of fslab.toml, neither of which a resume took; it names fslab resume
    --data-root, which, given that folder, resumes the run on the data it started on."""
    from fslab.core.runstore import Run

    make_folder_tree(tmp_path / "tree", classes=3, per_class=4, size=(8, 8))
    started = _tiny_folder_run(tmp_path)
    assert started.returncode == 0, started.stderr
    (run_dir,) = (tmp_path / "runs").glob("*-nca-*")
    Run(run_dir).write_status(state="killed")  # as if stopped after its checkpoint
    (tmp_path / "tree" / "inner").mkdir()
    for split in ("train", "val", "test"):
        (tmp_path / "tree" / split).rename(tmp_path / "tree" / "inner" / split)
    refused = fslab("resume", run_dir.name, cwd=tmp_path)
    (line,) = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and line.endswith(
        f"give --data-root {tmp_path / 'tree' / 'inner'} (or [data_roots] folder in fslab.toml) (a resume reads no "
        f"[data_roots]: where the data the run started on lies elsewhere now, resume it there: fslab "
        f"resume {run_dir.name} --data-root {tmp_path / 'tree' / 'inner'})"), line
    moved = fslab("resume", run_dir.name, "--data-root", str(tmp_path / "tree" / "inner"), cwd=tmp_path)
    assert moved.returncode == 0 and Run(run_dir).state() == "completed", moved.stderr


@pytest.mark.slow
def test_resume_data_root_moves_a_run_onto_the_data_it_started_on_and_refuses_other_data(tmp_path):
    """fslab resume took no --data-root: a run whose data moved (a new disk, a store rsynced to a machine whose
    data lies elsewhere) resumed only through a link at its old root. --data-root DIR moves it there for good,
    where DIR holds the data it started on (config.json's root, which fslab show and a later resume read; the
    root it leaves kept in a data_root event, which the resume's cut of metrics.jsonl keeps); other data is
    refused in one line, nothing written."""
    from fslab.core.runstore import Run

    make_folder_tree(tmp_path / "tree", classes=3, per_class=4, size=(8, 8))
    started = _tiny_folder_run(tmp_path)
    assert started.returncode == 0, started.stderr
    (run_dir,) = (tmp_path / "runs").glob("*-nca-*")
    Run(run_dir).write_status(state="killed")  # as if stopped after its checkpoint
    shutil.copytree(tmp_path / "tree", tmp_path / "other")
    shutil.rmtree(tmp_path / "other" / "train" / "train-class2")  # not the images it started on
    (tmp_path / "tree").rename(tmp_path / "moved")
    files = lambda: {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != ".worker.lock"}
    before = files()
    other = fslab("resume", run_dir.name, "--data-root", "other", cwd=tmp_path)
    assert other.returncode == 2 and other.stderr.strip().splitlines()[-1] == (
        f"error: --data-root {tmp_path / 'other'} does not hold the data run {run_dir.name} started on (train: 8 "
        f"images in 2 classes now, 12 in 3 then); resume it on the same files, or start anew on these: fslab run "
        f"--like {run_dir.name} --data-root {tmp_path / 'other'}; nothing was changed")
    assert files() == before  # the lock's holder line aside, as any resume refused
    shutil.copytree(tmp_path / "moved", tmp_path / "few")
    for folder in (tmp_path / "few" / "val").iterdir():  # too few images for its episodes: other data, not
        for image in sorted(folder.iterdir())[1:]:  # the run's files "removed or moved since", --data-root to give
            image.unlink()
    few = fslab("resume", run_dir.name, "--data-root", "few", cwd=tmp_path)
    assert few.returncode == 2 and few.stderr.strip().splitlines()[-1].startswith(
        f"error: --data-root {tmp_path / 'few'} does not hold the data run {run_dir.name} started on (val: 3 images "
        f"in 3 classes now, 12 in 3 then)"), few.stderr
    assert files() == before
    moved = fslab("resume", run_dir.name, "--data-root", "moved", cwd=tmp_path)
    assert moved.returncode == 0 and "note:" not in moved.stdout, moved.stderr
    assert Run(run_dir).config()["dataset"]["root"] == str(tmp_path / "moved")
    assert Run(run_dir).state() == "completed"
    (event,) = Run(run_dir).events_of("data_root")
    assert (event["root"], event["was"]) == (str(tmp_path / "moved"), str(tmp_path / "tree"))
    logged = fslab("logs", run_dir.name, cwd=tmp_path).stdout.splitlines()  # the move, then the resume it made
    line = f"data root moved to {tmp_path / 'moved'} from {tmp_path / 'tree'} (fslab resume --data-root)"
    assert line in logged and logged.index(line) < logged.index("resumed from the checkpoint of epoch 1 (step 2)")
    shown = fslab("show", run_dir.name, cwd=tmp_path, env={**os.environ, "COLUMNS": "1000"})
    assert f"dataset.root={tmp_path / 'moved'}," in shown.stdout and "not on this machine" not in shown.stdout


@pytest.mark.slow
def test_resuming_a_run_whose_training_images_changed_says_so(tmp_path):
    """A class folder added to train/ after the run stopped: fslab resume trained on the new split (140 images
    of 7 classes where it started on 120 of 6) and said nothing; a run on two sets of images passed for one."""
    from fslab.core.runstore import Run

    make_folder_tree(tmp_path / "tree", classes=3, per_class=4, size=(8, 8))
    started = _tiny_folder_run(tmp_path)
    assert started.returncode == 0 and "note:" not in started.stdout + started.stderr, started.stderr
    (run_dir,) = (tmp_path / "runs").glob("*-nca-*")
    Run(run_dir).write_status(state="killed")  # as if stopped after its checkpoint
    shutil.copytree(tmp_path / "tree" / "train" / "train-class0", tmp_path / "tree" / "train" / "new")
    (tmp_path / "tree" / "val" / "val-class1" / "00.png").unlink()
    resumed = fslab("resume", run_dir.name, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    note = (f"note: the data differs from that run {run_dir.name} started on (train: 16 images in 4 classes now, "
            f"12 in 3 then; val: 11 images in 3 classes now, 12 in 3 then: files of its data root added, removed or "
            f"moved since); it goes on with the data as it is now; to train on one set of images, put them back "
            f"as they were, or start anew with fslab run --like {run_dir.name}")
    assert note in resumed.stdout.splitlines(), resumed.stdout
    assert note in fslab("logs", run_dir.name, cwd=tmp_path).stdout.splitlines()


@pytest.mark.slow
def test_resuming_a_run_whose_data_no_longer_gives_its_episodes_says_the_data_changed(tmp_path):
    """Images removed from a test class since the run started: fslab resume was refused with the line of a new
    run, 'config key eval.queries is too large here ... must be at most 3', a setting resume cannot take."""
    from fslab.core.runstore import Run

    make_folder_tree(tmp_path / "tree", classes=2, per_class=4, size=(8, 8))
    started = _tiny_folder_run(tmp_path, batch=4, queries=2)
    assert started.returncode == 0, started.stderr
    (run_dir,) = (tmp_path / "runs").glob("*-nca-*")
    Run(run_dir).write_status(state="killed")  # as if stopped after its checkpoint
    for image in sorted((tmp_path / "tree" / "test" / "test-class1").iterdir())[:2]:
        image.unlink()
    refused = fslab("resume", run_dir.name, cwd=tmp_path)
    (line,) = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and line.startswith("error: config key 'eval.queries' is too large here, got 2")
    assert line.endswith(f"(the run's settings passed this check when it was created: files of its data root were "
                         f"removed or moved since; fslab resume takes no --set: put them back and resume it, or "
                         f"where they lie elsewhere now resume it there: fslab resume {run_dir.name} --data-root DIR, "
                         f"or start it anew with settings the data allows: fslab run --like {run_dir.name} --set ...)")
    assert Run(run_dir).state() == "killed"


def test_resuming_a_sweep_whose_data_root_is_gone_says_where_its_runs_read_their_data(project, registry):
    """fslab sweep resume said to give --data-root or [data_roots] of fslab.toml, which it reads neither of."""
    from fslab.core.settings import load_settings
    from fslab.execution.sweep import create_sweep

    make_folder_tree(project / "tree", classes=3, per_class=4, size=(8, 8))
    base = [{"dataset": {"name": "folder", "root": str(project / "tree"), "image_size": 8}, "device": "cpu",
             "eval": {"ways": 2, "queries": 1, "shots": [1], "val_shots": 1}, "train": {"batch_size": 6}}]
    sweep_id, runs = create_sweep("nca", {"train.lr": [0.1, 0.2]}, 1, base=base, settings=load_settings(),
                                  registry=registry)
    for run in runs:
        run.write_status(state="failed")  # never started: nothing trains here
    (project / "tree").rename(project / "moved")
    refused = fslab("sweep", "resume", sweep_id, cwd=project)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [  # the sweep's own --data-root
        f"error: run {runs[0].id} was trained on {project / 'tree'}, which is not a folder now; a resumed run "
        f"reads its data there: if the data moved, give where it lies with fslab sweep resume {sweep_id} "
        f"--data-root DIR"]
    assert all(run.state() == "failed" for run in runs)  # none queued again


def _sweep_started_on(project, registry, seeds: int = 2, **train):
    """A sweep of ``seeds`` failed nca runs on the folder tree at ``project/tree``, each with the start event
    that records the data it started on (its splits' outlines), as a worker writes it."""
    from fslab.core.settings import load_settings
    from fslab.execution.sweep import create_sweep
    from fslab.training.record import outlines_at

    make_folder_tree(project / "tree", classes=3, per_class=4, size=(8, 8))
    base = [{"dataset": {"name": "folder", "root": str(project / "tree"), "image_size": 8}, "device": "cpu",
             "backbone": {"name": "conv4", "hidden": 8}, "train": {"batch_size": 6, **train},
             "eval": {"ways": 2, "queries": 1, "shots": [1], "val_shots": 1, "val_episodes": 2, "test_episodes": 2}}]
    sweep_id, runs = create_sweep("nca", {}, seeds, base=base, settings=load_settings(), registry=registry)
    data = outlines_at(runs[0].config(), registry, ["train", "val", "test"])
    for run in runs:
        run.metrics_path.write_text(json.dumps({"event": "start", "time": 1.0, "epochs": 1, "data": data}) + "\n")
        run.write_status(state="failed")
    return sweep_id, runs


def test_sweep_resume_data_root_moves_no_run_where_one_s_data_differs(project, registry):
    """fslab sweep resume took no --data-root (refused: takes only --executor and --slurm): a sweep whose data
    moved was resumed run by run. It moves every run it queues again, or none: one run whose data at DIR is not
    that it started on is fslab resume --data-root's line, and no run is moved or queued again."""
    sweep_id, runs = _sweep_started_on(project, registry)
    recorded = json.loads(runs[1].metrics_path.read_text())
    recorded["data"]["train"] = {**recorded["data"]["train"], "images": 9, "labels": "0" * 16}  # other files then
    runs[1].metrics_path.write_text(json.dumps(recorded) + "\n")
    (project / "tree").rename(project / "moved")
    before = {run.id: (run.path / "config.json").read_bytes() for run in runs}
    refused = fslab("sweep", "resume", sweep_id, "--data-root", "moved", cwd=project)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"error: --data-root {project / 'moved'} does not hold the data run {runs[1].id} started on (train: 12 "
        f"images in 3 classes now, 9 in 3 then); resume it on the same files, or start anew on these: fslab run "
        f"--like {runs[1].id} --data-root {project / 'moved'}; nothing was changed"], refused.stderr
    assert {run.id: (run.path / "config.json").read_bytes() for run in runs} == before  # the first not moved either
    assert all(run.state() == "failed" and not run.events_of("data_root") for run in runs)
    missing = fslab("sweep", "resume", sweep_id, "--data-root", "nowhere", cwd=project)
    assert (missing.returncode, missing.stderr) == (2, "error: --data-root nowhere is not a folder\n")


def test_sweep_resume_data_root_where_the_dataset_finds_no_splits_says_a_resume_reads_no_data_roots(
        project, registry):
    """--data-root DIR that the dataset cannot load (the tree one folder down) was the dataset's line alone,
    pointing at [data_roots] of fslab.toml, which a resume never reads: since DIR's data is compared with the
    run's first start before its settings are checked, the resume's words (a resume reads no [data_roots], the
    command that resumes it elsewhere) were lost. They are said again, as for the run's own root."""
    sweep_id, runs = _sweep_started_on(project, registry)
    (project / "down").mkdir()
    (project / "tree").rename(project / "down" / "tree")
    refused = fslab("sweep", "resume", sweep_id, "--data-root", "down", cwd=project)
    (line,) = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and line.startswith(f"error: folder: {project / 'down' / 'train'} not found")
    assert line.endswith(f"(a resume reads no [data_roots]: where the data the run started on lies elsewhere now, "
                         f"resume it there: fslab sweep resume {sweep_id} --data-root "
                         f"{project / 'down' / 'tree'})"), line
    assert all(run.state() == "failed" and run.config()["dataset"]["root"] == str(project / "tree") for run in runs)


def test_sweep_resume_of_runs_whose_data_changed_names_its_own_data_root(project, registry):
    """A sweep's runs whose split no longer gives their episodes (images removed since) were told to resume
    each on its own (fslab resume RUN --data-root DIR); fslab sweep resume names its own --data-root."""
    sweep_id, runs = _sweep_started_on(project, registry)
    for name in ("test-class1", "test-class2"):  # one class left with 2 images: no 2-way episode of 1 + 1
        for image in sorted((project / "tree" / "test" / name).iterdir())[:3]:
            image.unlink()
    refused = fslab("sweep", "resume", sweep_id, cwd=project)
    (line,) = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and (f"put them back and resume it, or where they lie elsewhere now resume it "
                                        f"there: fslab sweep resume {sweep_id} --data-root DIR, or start it anew"
                                        ) in line, line
    assert all(run.state() == "failed" for run in runs)


def test_sweep_resume_data_root_moves_no_run_that_a_resume_started_meanwhile(project, registry, monkeypatch):
    """fslab sweep resume --data-root saved each run's new root once all were checked, outside the runs' launch
    locks: a run that fslab resume started meanwhile (its worker training on the root it read) had its config.json
    rewritten under it, and a data_root event. Each run is moved as it is queued again, under its lock."""
    from fslab.core.settings import load_settings
    from fslab.core.worklock import take
    from fslab.execution import executor

    sweep_id, runs = _sweep_started_on(project, registry)
    (project / "tree").rename(project / "moved")
    checked, held = executor.checked_again, []

    def then_started(run, *args, **kwargs):
        config = checked(run, *args, **kwargs)
        if run.id == runs[1].id:  # every run checked: the first is started by a resume meanwhile, its worker live
            held.append(take(runs[0].path))
            runs[0].write_status(state="running", pid=os.getpid(), heartbeat=time.time())
        return config

    monkeypatch.setattr(executor, "checked_again", then_started)
    monkeypatch.setattr(executor, "_start_queued", lambda runs_dir, queued, slurm: queued)  # no scheduler here
    before = (runs[0].path / "config.json").read_bytes()
    try:
        _, started, _, _, _ = executor.resume_sweep(sweep_id, settings=load_settings(), registry=registry,
                                                    data_root=str(project / "moved"))
    finally:
        os.close(held[0])
    assert [run.id for run in started] == [runs[1].id]
    assert (runs[0].path / "config.json").read_bytes() == before and not runs[0].events_of("data_root")
    assert runs[1].config()["dataset"]["root"] == str(project / "moved") and runs[1].events_of("data_root")


def test_sweep_resume_data_root_moves_the_runs_still_waiting_that_never_started(project, registry):
    """fslab sweep resume --data-root DIR moved only the runs it queued again: one still queued, never started,
    kept the gone root and failed when it started (here: submitted to SLURM with it). It is moved too, as
    fslab resume --data-root moves a queued run (a run that never started reads any data)."""
    from .test_slurm import COUNTING_SBATCH, FAKE_SCANCEL

    sweep_id, runs = _sweep_started_on(project, registry)
    runs[1].metrics_path.unlink()
    runs[1].write_status(state="queued")  # never started
    bin_dir = project / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", COUNTING_SBATCH), ("scancel", FAKE_SCANCEL), ("srun", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text.format(folder=project))
        (bin_dir / name).chmod(0o755)
    (project / "tree").rename(project / "moved")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    resumed = fslab("sweep", "resume", sweep_id, "--data-root", "moved", "--executor", "slurm", cwd=project, env=env)
    assert resumed.returncode == 0, resumed.stderr
    for run in runs:  # both submitted, on the data where it lies now
        assert run.status()["slurm_job_id"] and run.config()["dataset"]["root"] == str(project / "moved"), run.id
        (event,) = run.events_of("data_root")
        assert (event["root"], event["was"]) == (str(project / "moved"), str(project / "tree"))


@pytest.mark.slow
def test_sweep_resume_data_root_moves_each_run_it_queues_again(project, registry):
    """Its data moved, a sweep is resumed with one command: each run queued again saves DIR as its root (and a
    data_root event), as fslab resume --data-root moves one, and trains there to its end."""
    from .runs_helpers import wait_for

    sweep_id, runs = _sweep_started_on(project, registry, epochs=1)
    (project / "tree").rename(project / "moved")
    resumed = fslab("sweep", "resume", sweep_id, "--data-root", "moved", cwd=project)
    assert resumed.returncode == 0 and resumed.stdout == f"{sweep_id}: 2 runs queued again\n", resumed.stderr
    for run in runs:
        assert run.config()["dataset"]["root"] == str(project / "moved")
        (event,) = run.events_of("data_root")
        assert (event["root"], event["was"]) == (str(project / "moved"), str(project / "tree"))
    wait_for(lambda: all(run.state() == "completed" for run in runs), timeout=240, what="the sweep's runs to end")


def test_the_folder_a_gone_data_root_s_line_names_is_quoted_as_the_shell_reads_it(project, registry):
    """A folder with spaces or quotes (a project in "my project/") was pasted into the command the line
    gives as it is, which the shell splits: it is quoted as the shell reads it."""
    import shlex

    from fslab.core.settings import load_settings
    from fslab.execution.sweep import create_sweep

    tree = project / "my 'data' é"
    make_folder_tree(tree, classes=3, per_class=4, size=(8, 8))
    base = [{"dataset": {"name": "folder", "root": str(project / "gone"), "image_size": 8}, "device": "cpu",
             "eval": {"ways": 2, "queries": 1, "shots": [1], "val_shots": 1}, "train": {"batch_size": 6}}]
    make_folder_tree(project / "gone", classes=3, per_class=4, size=(8, 8))
    sweep_id, runs = create_sweep("nca", {"train.lr": [0.1]}, 1, base=base, settings=load_settings(),
                                  registry=registry)
    runs[0].write_status(state="failed")
    shutil.rmtree(project / "gone")
    (project / "fslab.toml").write_text(f"[data_roots]\nfolder = {json.dumps(str(tree))}\n")
    refused = fslab("sweep", "resume", sweep_id, cwd=project)
    (line,) = refused.stderr.strip().splitlines()
    command = line.split("give where it lies with ", 1)[1].split(" (this project's folder", 1)[0]
    assert refused.returncode == 2 and shlex.split(command) == ["fslab", "sweep", "resume", sweep_id, "--data-root",
                                                                str(tree)], line


def test_a_store_copied_with_its_data_names_this_project_s_folder_for_the_data_where_the_saved_root_is_gone(
        project, registry, tmp_path):
    """A project trained on one machine and copied to another, its data inside it ([data_roots] folder = "tree"):
    each run saved the first machine's absolute root. fslab resume and sweep resume said "ln -s NEW_PLACE
    /first/machine/tree", a link ln cannot make where that machine's folders are not here. Each now names this
    project's folder for the dataset in the fslab resume --data-root it says to give (fslab eval's --data-root:
    test_a_run_on_a_folder_tree_ends_with_results)."""
    import shlex

    from fslab.core.settings import load_settings
    from fslab.execution.sweep import create_sweep

    from .runs_helpers import fslab_here, with_checkpoint

    make_folder_tree(project / "tree", classes=3, per_class=4, size=(8, 8))
    (project / "fslab.toml").write_text('[data_roots]\nfolder = "tree"\n')
    base = [{"dataset": {"name": "folder", "image_size": 8}, "device": "cpu",
             "eval": {"ways": 2, "queries": 1, "shots": [1], "val_shots": 1}, "train": {"batch_size": 6}}]
    sweep_id, runs = create_sweep("nca", {"train.lr": [0.1]}, 1, base=base, settings=load_settings(),
                                  registry=registry)
    first = tmp_path / "first machine" / "lab" / "tree"  # where the runs were made: no folder of it is here
    config = runs[0].config()
    assert config["dataset"]["root"] == str(project / "tree")
    config["dataset"]["root"] = str(first)
    (runs[0].path / "config.json").write_text(json.dumps(config))
    runs[0].write_status(state="killed")
    with_checkpoint(runs[0])
    here = f"{project / 'tree'} (this project's folder for dataset 'folder', from [data_roots] of fslab.toml)"
    for args, move in ((["resume", runs[0].id], f"resume {runs[0].id}"), (["sweep", "resume", sweep_id],
                                                                         f"sweep resume {sweep_id}")):
        refused = fslab_here(*args, cwd=project)
        assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
            f"error: run {runs[0].id} was trained on {first}, which is not a folder now; a resumed run reads its "
            f"data there: if the data moved, give where it lies with fslab {move} --data-root {here}"
        ], args
    # its start recorded nothing of its data (an earlier fslab's): --data-root cannot tell the data is the same
    saved = (runs[0].path / "config.json").read_bytes()
    refused = fslab_here("resume", runs[0].id, "--data-root", "tree", cwd=project)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"error: run {runs[0].id} recorded nothing of the data it started on (an earlier fslab started it), so "
        f"--data-root cannot tell that {project / 'tree'} holds the same; link it where the run reads it (mkdir -p "
        f"{shlex.quote(str(first.parent))} && ln -s {project / 'tree'} {shlex.quote(str(first))}) and resume it, or "
        f"start anew there: fslab run --like {runs[0].id} --data-root {project / 'tree'}"]
    assert (runs[0].path / "config.json").read_bytes() == saved
    assert not (tmp_path / "first machine").exists()


def folder_run(project: Path, root: Path) -> Path:
    """A tiny run of nca on the folder tree at ``root``, seed 0: its folder."""
    result = fslab("run", "nca", "--dataset", "folder", "--data-root", str(root), "--backbone", "conv4", "--epochs",
                   "1", "--device", "cpu", "--seed", "0", "--set", "backbone.hidden=8", "--set", "dataset.image_size=8",
                   "--batch-size", "24", "--set", "eval.val_episodes=5", "--set", "eval.test_episodes=10",
                   "--set", "eval.queries=5", "--set", "eval.center_images=16", "--set", "eval.shots=[5]",
                   cwd=project, timeout=300)
    assert result.returncode == 0, result.stderr
    return max((project / "runs").glob("*-nca-*"), key=lambda p: p.stat().st_mtime)


@pytest.mark.slow
def test_compare_pairs_folder_runs_only_on_the_same_images(project):
    """Two folder datasets at two roots share every setting but the root, which pairing
    ignores (a named dataset is the same data wherever it lies): runs on a copy of the
    images pair, runs on other images are neither paired nor pooled. The runs train in worker processes;
    fslab compare and fslab eval run in this process (fslab_here)."""
    import shutil

    make_folder_tree(project / "a", classes=6, per_class=12, size=(12, 12), seed=0)
    shutil.copytree(project / "a", project / "copy")
    make_folder_tree(project / "b", classes=6, per_class=12, size=(12, 12), seed=1)
    runs = [folder_run(project, project / name) for name in ("a", "copy", "b")]
    args = ["--shots", "5", "--queries", "5", "--format", "json"]
    by_root = fslab_here("compare", *(r.name for r in runs), "--group-by", "dataset.root", *args, cwd=project)
    assert by_root.returncode == 0, by_root.stderr
    paired = json.loads(by_root.stdout)["paired"]
    assert [p["group"] for p in paired] == [f"dataset.root={project / 'copy'}"]
    assert paired[0]["difference"] == 0 and paired[0]["episodes"] == 10  # the same network on the same episodes
    saved = [json.loads(next((run / "evaluations").glob("test-*.json")).read_text())["data"] for run in runs]
    assert saved[0] == saved[1] != saved[2]  # the fingerprint of the test split, saved by the training
    # by every setting but the seed: one group of the three before, its seeds the same seed on other data
    pooled = fslab_here("compare", *(r.name for r in runs), *args, cwd=project)
    assert pooled.returncode == 0, pooled.stderr
    report = json.loads(pooled.stdout)
    assert [len(g["runs"]) for g in report["groups"]] == [1, 1] and report["data_split"] == ["method=nca"]
    assert report["repeated"] == [runs[0].name] and "1 group split by the data" in pooled.stderr
    # fslab eval saves the fingerprint too: of the data it scored, wherever that lies now
    again = fslab_here("eval", runs[2].name, "--shots", "5", "--queries", "5", "--episodes", "12",
                       "--data-root", str(project / "a"), cwd=project)
    assert again.returncode == 0, again.stderr
    assert json.loads(next((runs[2] / "evaluations").glob("*12ep*.json")).read_text())["data"] == saved[0]
