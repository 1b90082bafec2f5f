"""fslab core benchmarks, one command: ``python benchmarks/run.py``.

Prints, measured in this one run on this machine:

1. CLI start-up: wall time of ``fslab --help``, ``fslab runs``, ``fslab plugins`` (also
   without its listing cache) and one shell completion (TAB) against a bare ``python -c pass``
   (the interpreter's own start-up), after one warm-up call (bytecode compiled, listing cached);
   and a worker's start-up: seconds from a tiny run's worker starting to its first step (its
   ``start`` event: torch, the plugins, the data and the network) against ``python -c "import
   torch"``, what any PyTorch script pays.
2. Training throughput: images/s of a real ``fslab run`` (worker process, run
   store, logging) against a bare PyTorch loop with the same backbone, batch,
   loss, optimiser and data, over as many steps after as many warm-up steps as the
   run's (one epoch: ``--steps`` or more, where its episodes need more images),
   as the ratio fslab / bare (1.00 = no overhead).

Options: ``--backbone resnet12|conv4`` (default resnet12), ``--steps N`` (default 12, at least 4),
``--batch-size B`` (default 128), ``--repeats N`` (start-up runs, default 5), ``--startup-only``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fslab.core.states import LIVE, run_state

sys.path.insert(0, str(Path(__file__).parent))
from options import Parser, machine  # noqa: E402

# The synthetic dataset has 120 training classes (default split 120/40/40).
TRAIN_CLASSES = 120


def wall_time(argv: list[str], cwd: Path, repeats: int = 5, env: dict | None = None) -> float:
    """Median seconds for a command to start and exit."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, check=True, capture_output=True, env=env)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# What the shell runs on TAB after `fslab run --backbone r` (bash completion).
COMPLETION = {"_FSLAB_COMPLETE": "complete_bash", "COMP_WORDS": "fslab run --backbone r", "COMP_CWORD": "3"}


def warm_up(project: Path) -> None:
    """What a second invocation finds: fslab's and the plugins' bytecode compiled
    (also where PYTHONDONTWRITEBYTECODE keeps Python from writing it) and the
    plugin listing cached (fslab.core.listing)."""
    import fslab_plugins

    import fslab

    for package in (fslab, fslab_plugins):
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(package.__file__).parent)],
                       check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "fslab", "plugins"], cwd=project, check=True, capture_output=True)


def startup(project: Path, repeats: int = 5) -> None:
    warm_up(project)
    python = [sys.executable, "-c", "pass"]
    base = wall_time(python, project, repeats)
    print(f"{'command':<24}{'seconds':>9}{'vs python -c pass':>20}")
    print(f"{'python -c pass':<24}{base:9.3f}{1.0:19.2f}x")
    for args in (["--help"], ["runs"], ["plugins"]):
        seconds = wall_time([sys.executable, "-m", "fslab", *args], project, repeats)
        print(f"{'fslab ' + args[0]:<24}{seconds:9.3f}{seconds / base:19.2f}x")
    uncached = wall_time([sys.executable, "-m", "fslab", "plugins"], project, repeats,
                         env={**os.environ, "FSLAB_NO_CACHE": "1"})
    print(f"{'  (without the cache)':<24}{uncached:9.3f}{uncached / base:19.2f}x")
    complete = [sys.executable, "-c", "import sys; sys.argv = ['fslab']; from fslab.cli import main; main()"]
    seconds = wall_time(complete, project, repeats, env={**os.environ, **COMPLETION})
    print(f"{'TAB: --backbone r':<24}{seconds:9.3f}{seconds / base:19.2f}x")


# Validation and test episodes need shots (5 at most) + queries (1 here) images of each class.
EVAL_IMAGES = 5 + 1


def finished_run(project: Path, args: list[str]) -> tuple[Path, list[dict]]:
    """Start ``fslab run ARGS --detach``, wait for it to end; its folder and its events."""
    started = subprocess.run([sys.executable, "-m", "fslab", *args, "--detach"], cwd=project, capture_output=True,
                             text=True)
    if started.returncode != 0:
        raise SystemExit(f"fslab run failed: {started.stderr.strip()}")
    run_dir = project / "runs" / started.stdout.strip()
    while (state := run_state(status := json.loads((run_dir / "status.json").read_text()))) in LIVE:
        time.sleep(0.2)
    if state != "completed":
        raise SystemExit(f"fslab run {run_dir.name} {state}: {status.get('error') or 'see its log'}")
    return run_dir, [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def worker_startup(project: Path, repeats: int) -> None:
    """Median seconds from a tiny run's worker starting (``started`` in its status) to its ``start`` event."""
    tiny = ["run", "nca", "--backbone", "conv4", "--epochs", "1", "--batch-size", "32", "--device", "cpu",
            "--set", f"dataset.images_per_class={EVAL_IMAGES}", "--set", "dataset.image_size=16",
            "--set", "eval.queries=1", "--set", "eval.val_episodes=2", "--set", "eval.test_episodes=2"]
    seconds = []
    for _ in range(repeats):
        run_dir, events = finished_run(project, tiny)
        started = json.loads((run_dir / "status.json").read_text())["started"]
        seconds.append(next(e["time"] for e in events if e["event"] == "start") - started)
    base = wall_time([sys.executable, "-c", "import torch"], project, repeats)
    worker = statistics.median(seconds)
    print(f"{'python -c import torch':<24}{base:9.3f}")
    print(f"{'worker to first step':<24}{worker:9.3f}{worker / base:19.2f}x import torch")


def fslab_images_per_s(project: Path, backbone: str, steps: int, batch: int) -> tuple[float, int, int]:
    """Run a real ``fslab run`` of one epoch of ``steps`` batches (more where the
    episodes need more images a class); the images of its logged intervals over
    their seconds, skipping the first (warm-up) interval, with the steps timed and
    the steps of that first interval, for the bare loop to do the same work."""
    per_class = max(-(-steps * batch // TRAIN_CLASSES), EVAL_IMAGES)
    args = ["run", "nca", "--backbone", backbone, "--epochs", "1", "--batch-size", str(batch),
            "--set", f"dataset.images_per_class={per_class}", "--set", "train.log_every=2",
            "--set", "train.crop_padding=0", "--set", "train.flip=false", "--set", "eval.queries=1",
            "--set", "eval.val_episodes=10", "--set", "eval.test_episodes=10", "--set", "eval.center_images=16",
            "--device", "cpu"]
    _, events = finished_run(project, args)
    train = [e for e in events if e["event"] == "train"]
    return logged_images_per_s(train, batch), train[-1]["step"] - train[0]["step"], train[0]["step"]


def logged_images_per_s(train: list[dict], batch: int) -> float:
    """All the images of the ``train`` events' intervals but the first over all their seconds,
    as the bare loop's rate is counted (an average of the intervals' rates would overstate it)."""
    images = [batch * (e["step"] - before["step"]) for before, e in zip(train, train[1:])]
    return sum(images) / sum(n / e["images_per_s"] for n, e in zip(images, train[1:]))


def bare_images_per_s(backbone: str, steps: int, batch: int, warmup: int = 1) -> float:
    """The same work written as a plain PyTorch loop, no fslab training code: ``warmup``
    steps untimed, then ``steps`` timed."""
    import torch
    from fslab_plugins.methods.nca import nca

    import fslab

    torch.manual_seed(0)
    data = fslab.create("dataset", "synthetic", root=None).load("train")
    model = fslab.create("backbone", backbone, in_channels=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    order = torch.randperm(len(data))
    model.train()
    timed = 0.0
    for step in range(warmup + steps):
        index = order[(step * batch) % (len(data) - batch):][:batch]
        start = time.perf_counter()
        x = data.images[index].float() / 127.5 - 1.0
        loss = nca(model(x), data.labels[index]).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()
        if step >= warmup:
            timed += time.perf_counter() - start
    return steps * batch / timed


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="resnet12", help="backbone of the timed training (default resnet12)")
    parser.add_argument("--steps", type=int, default=12,
                        help="batches of the run's one epoch, at least 4 (default 12; more where its episodes need "
                             "more images a class)")
    parser.add_argument("--batch-size", type=int, default=128, help="images a step, at least 2 (default 128)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each start-up command (the median is shown)")
    parser.add_argument("--startup-only", action="store_true", help="measure the start-up only, not training")
    options = parser.parse_args(argv)
    for name, least, why in (("steps", 4, " (two logged intervals: the first warms up)"),
                             ("batch_size", 2, " (NCA needs pairs)"), ("repeats", 1, "")):
        if (value := getattr(options, name)) < least:
            parser.error(f"--{name.replace('_', '-')} must be at least {least}{why}, got {value}")
    import fslab

    if options.backbone not in fslab.available("backbone"):
        parser.error(f"unknown backbone '{options.backbone}'; the backbones are "
                     f"{', '.join(fslab.available('backbone'))}")
    with tempfile.TemporaryDirectory() as folder:
        project = Path(folder)
        print(machine())
        print(f"## CLI start-up (median of {options.repeats})")
        startup(project, options.repeats)
        worker_startup(project, options.repeats)
        if options.startup_only:
            return
        print(f"\n## Training throughput: {options.backbone}, batch {options.batch_size}, NCA loss, SGD, CPU")
        # the run first: the bare loop then times as many steps after as many warm-up steps
        run, timed, warmup = fslab_images_per_s(project, options.backbone, options.steps, options.batch_size)
        bare = bare_images_per_s(options.backbone, timed, options.batch_size, warmup)
        print(f"each timed over {timed} steps after {warmup} warm-up steps")
        print(f"{'bare PyTorch loop':<20}{bare:9.1f} images/s")
        print(f"{'fslab run':<20}{run:9.1f} images/s")
        print(f"{'ratio fslab / bare':<20}{run / bare:9.3f}  (overhead {100 * (1 - run / bare):+.1f}%)")


if __name__ == "__main__":
    main()
