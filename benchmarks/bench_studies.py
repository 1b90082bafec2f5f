"""What each built-in study costs on this device, one command: ``python benchmarks/bench_studies.py``.

Every study's runs are resolved as ``fslab study run NAME`` resolves them (paper
scale; the studies of ``plugin_dirs`` in ``fslab.toml`` too), and each run is priced once, as
``fslab study run`` trains it once for every place it serves (places alike in every setting:
:func:`fslab.core.study_plan.distinct_runs`). Runs that train alike (the same backbone, loss,
sampler, batch, image size, precision and compile mode: only the seed and the recorded settings
apart) form one configuration, and each configuration is timed once on random
images of its dataset's shape, through the components a run builds (the
run's own backbone, loss, sampler, augmentation, optimiser and numerics):

* a training step, the median of ``--steps`` after ``--warmup`` (the first,
  compiling, step is reported apart);
* a validation: the validation split and ``eval.center_images`` training
  images embedded in ``eval.precision``, then ``eval.val_episodes`` episodes;
* a checkpoint of the network and optimiser: its copy to host memory, which
  training waits for, and its write to a temporary file, which overlaps the
  next epoch's steps (:class:`fslab.training.checkpoint.CheckpointWriter`);
* the test: the test split embedded, then ``eval.test_episodes`` of each shot
  (and, with ``eval.final_val``, the same on the validation split), at each
  number of classes tested (``eval.ways``, ``eval.extra_ways``), the split
  embedded once for all of them as training does.

A run then costs ``epochs × (steps per epoch × step + checkpoint copy +
the part of its write that outlasts the steps) + validations × validation +
test + compile``, where the steps per epoch are the
run's sampler's over the dataset's standard training split, and validations
are ``eval.val_every``'s. Worker start-up and reading the data are not counted.
The dataset sizes are the standard splits' (README, Datasets); no data is read.

The images are drawn before each part's clock starts (a run holds its data
already), the training images a validation centres with too.

On a machine without a GPU, ``--device cpu --image-size 16 --batch-size 16
--steps 1 --warmup 0 --train-images 64 --eval-images 32`` runs every study's
configurations (11 minutes on a 2-core CPU; a test keeps one study working),
with numbers that mean nothing for a GPU.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from fslab.core.config import run_config, sampler_rows, tested_ways
from fslab.core.keys import dotted
from fslab.core.registry import load_registry
from fslab.core.settings import load_settings
from fslab.core.studies import find_study
from fslab.core.study_plan import distinct_runs, resolve_study, runs_text
from fslab.training import distributed
from fslab.training.augment import augment
from fslab.training.build import (
    build_backbone,
    build_evaluator,
    build_loss,
    host_to_device,
    make_optimizer,
    plugin_kwargs,
    to_input,
)
from fslab.training.checkpoint import host_copy, save_checkpoint
from fslab.training.evaluation import run_episodes
from fslab.training.features import center_count
from fslab.training.numerics import apply_backend_settings, compiled, embed, optimiser_step, resolve_numerics
from fslab.training.outputs import checked_batch
from fslab.training.train import validates_after

sys.path.insert(0, str(Path(__file__).parent))
import options  # noqa: E402

# The standard splits (classes and images per split) and image channels of the papers' datasets.
SPLITS = {
    "miniimagenet": {"channels": 3, "train": (64, 38400), "val": (16, 9600), "test": (20, 12000)},
    "tieredimagenet": {"channels": 3, "train": (351, 448695), "val": (97, 124261), "test": (160, 206209)},
    "cifar-fs": {"channels": 3, "train": (64, 38400), "val": (16, 9600), "test": (20, 12000)},
    "fc100": {"channels": 3, "train": (60, 36000), "val": (20, 12000), "test": (20, 12000)},
    "omniglot": {"channels": 1, "train": (4112, 82240), "val": (688, 13760), "test": (1692, 33840)},
}
# Keys that do not change how long a run takes (besides the seed and the number of epochs, which scale it).
UNTIMED = ("seed", "train.epochs", "dataset.root", "train.log_every", "train.heartbeat", "eval.seed",
           "train.lr", "train.gamma", "train.momentum", "train.weight_decay", "train.milestones", "loss.temperature",
           "eval.center", "eval.normalize", "config_version", "method", "sinks")


def labels_of(classes: int, images: int) -> torch.Tensor:
    """Labels of a split of ``images`` images over ``classes`` classes, as evenly as they go."""
    return torch.arange(images) * classes // images


def timing_key(config: dict) -> str:
    flat = dotted(config)
    return json.dumps({k: v for k, v in flat.items() if k not in UNTIMED and not k.startswith("sinks.")},
                      sort_keys=True)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_of(fn, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def random_images(count: int, channels: int, size: int) -> torch.Tensor:
    return torch.randint(0, 256, (count, channels, size, size), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(count))


def timed_batch(cfg, cap: int) -> int:
    """The batch a configuration is timed at: ``train.batch_size``, or at most
    ``cap`` images (``--batch-size``, 0 for none) where an episode still keeps two
    classes of ``sampler.per_class`` images."""
    if not cap:
        return cfg.train.batch_size
    return min(cfg.train.batch_size, max(cap, 2 * (cfg.sampler.get("per_class") or 1)))


def measure(config: dict, registry, args, device: torch.device) -> dict:
    """The costs of one configuration's parts, in seconds (module docstring)."""
    cfg = run_config(config)
    shape = SPLITS[cfg.dataset["name"]]
    size = args.image_size or cfg.dataset["image_size"]
    channels = shape["channels"]
    classes, train_images = shape["train"]
    if args.train_images:  # fewer classes of 32 images: enough for every built-in sampler's shape
        classes = max(32, min(classes, args.train_images // 32))
        train_images = classes * 32
    labels = labels_of(classes, train_images)
    numerics = resolve_numerics(cfg, device)
    apply_backend_settings(numerics)
    torch.manual_seed(0)
    model = build_backbone(registry, cfg, channels, device, (size, size))
    if numerics.channels_last:
        model = model.to(memory_format=torch.channels_last)
    loss_fn, loss_params = build_loss(registry, cfg, model.out_dim, classes, device)
    trainable = list(model.parameters()) + loss_params
    batch_size = timed_batch(cfg, args.batch_size)
    sampler = registry.create("sampler", cfg.sampler["name"], labels=labels.tolist(), batch_size=batch_size,
                              seed=0, **plugin_kwargs(cfg.sampler))
    optimizer = make_optimizer(trainable, cfg.train)
    scaler = numerics.grad_scaler()
    step = distributed.training_step(compiled(model, numerics), torch.nn.Identity(), loss_fn, distributed.World(),
                                     device, numerics.autocast)
    generator = torch.Generator().manual_seed(0)
    pool = random_images(4 * max(batch_size, 1), channels, size).to(device)  # rotated: not one cached batch
    offset = [0]
    sampler_named, sampler_batch = registry.get("sampler", cfg.sampler["name"]).named, \
        sampler_rows(registry, cfg.sampler, batch_size)  # what a run of this batch size checks its batches against

    def train_step(batch):
        # checked and made host tensors once, as the training loop takes a batch, then moved as it moves them
        batch = checked_batch(batch, sampler_named, sampler_batch, len(labels))
        rows = len(batch.indices)
        x = to_input(pool[(torch.arange(rows, device=device) + offset[0]) % len(pool)])
        offset[0] += rows
        x = numerics.memory_format(augment(x, cfg.train.crop_padding, cfg.train.flip, generator))
        y = host_to_device(labels[batch.indices], device)
        support = None if batch.support is None else host_to_device(batch.support, device)
        optimiser_step(step(x, y, support).loss, optimizer, scaler)

    batches = iter(sampler.batches(0))
    first = seconds_of(lambda: train_step(next(batches)), device)
    for _ in range(args.warmup):
        train_step(next(batches))
    times = [seconds_of(lambda: train_step(next(batches)), device) for _ in range(args.steps)]
    rows = len(next(iter(sampler.batches(1))).indices)
    steps_per_epoch = -(-shape["train"][1] // rows)  # the sampler's batches over the standard training split

    evaluator = build_evaluator(registry, cfg.evaluator, cfg.loss)
    eval_images = args.eval_images or None

    def evaluation(split: str, shots: list[int], episodes: int, centre: bool, ways: list[int]) -> float:
        split_classes, count = shape[split]
        if eval_images:  # fewer classes, each with just the images an episode needs
            need = max(shots) + cfg.eval.queries
            split_classes = max(max(ways), min(split_classes, eval_images // need))
            count = split_classes * need
        images = random_images(count, channels, size)
        split_labels = labels_of(split_classes, count)
        centring = None  # drawn before the clock starts: a run holds its training images already
        if centre and cfg.eval.center:  # the training mean of the network just trained
            picked = center_count(cfg.eval.center_images, train_images)
            centring = random_images(min(picked, eval_images or picked), channels, size)

        def run():
            if centring is not None:
                embed(model, centring, cfg.eval.batch_size, numerics)
            features = embed(model, images, cfg.eval.batch_size, numerics)  # once, for every episode shape
            for ways_ in ways:
                for shots_ in shots:
                    run_episodes(evaluator, split_labels, ways_, shots_, cfg.eval.queries, episodes, 0,
                                 features=features, device=device)

        return seconds_of(run, device)

    validation = evaluation("val", [cfg.eval.val_shots], cfg.eval.val_episodes, True, [cfg.eval.ways])
    tested = tested_ways(cfg.eval.ways, cfg.eval.extra_ways)
    test = evaluation("test", list(cfg.eval.shots), cfg.eval.test_episodes, False, tested)  # the last validation's mean
    if cfg.eval.final_val:  # the validation classes scored as the test (a figure study measured there)
        test += evaluation("val", list(cfg.eval.shots), cfg.eval.test_episodes, False, tested)
    with tempfile.TemporaryDirectory() as folder:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}  # what a checkpoint is made of
        copy = seconds_of(lambda: host_copy(state), device)
        snapshot = host_copy(state)
        write = seconds_of(lambda: save_checkpoint(Path(folder) / "last.pt", snapshot), device)
    return {"step_s": statistics.median(times), "first_step_s": first, "rows": rows,
            "steps_per_epoch": steps_per_epoch, "validation_s": validation, "test_s": test,
            "checkpoint_s": copy, "checkpoint_write_s": write, "val_every": cfg.eval.val_every}


HOW = ("python benchmarks/bench_studies.py, PyTorch {torch}: every configuration's steps, validation, checkpoint "
       "and test timed, worker start and data reading left out")


def cost_block(device: str, gpu_hours: float, day: str) -> str:
    """A study's measured cost as the ``[[cost]]`` table its study file records (README,
    "Reproducing the papers"), for a study every one of whose runs was timed."""
    how = HOW.format(torch=".".join(torch.__version__.split("+")[0].split(".")[:2]))
    return (f"[[cost]]\ndevice = {json.dumps(device)}\ngpu_hours = {gpu_hours:.1f}\ndate = {day}\n"
            f"how = {json.dumps(how)}\n")


def run_seconds(parts: dict, epochs: int) -> float:
    validations = sum(validates_after(e, epochs, parts["val_every"]) for e in range(1, epochs + 1))
    compile_extra = max(0.0, parts["first_step_s"] - parts["step_s"])
    steps = parts["steps_per_epoch"] * parts["step_s"]
    waited = max(0.0, parts["checkpoint_write_s"] - steps)  # a write longer than the next epoch's steps
    return (epochs * (steps + parts["checkpoint_s"] + waited)
            + validations * parts["validation_s"] + parts["test_s"] + compile_extra)


def price_runs(name: str, runs: list, measured: dict, timed) -> tuple[float, list[str], dict]:
    """The device-seconds of study ``name``'s ``runs`` (each one it trains), the datasets of those not
    timed, and the parts of the configurations they use; each configuration is ``timed`` once, kept in
    ``measured`` for the studies after."""
    total, missing, used = 0.0, [], {}
    for planned, config in runs:
        dataset = config["dataset"]["name"]
        if dataset not in SPLITS:
            missing.append(dataset)
            continue
        key = timing_key(config)
        if key not in measured:
            measured[key] = timed(config)
            parts = measured[key]
            print(f"  {name} {planned.sweep} on {dataset}: {parts['rows']:.0f} images a step, "
                  f"{1000 * parts['step_s']:.1f} ms a step ({parts['rows'] / parts['step_s']:,.0f} images/s), "
                  f"{parts['steps_per_epoch']} steps an epoch, validation {parts['validation_s']:.2f} s, "
                  f"checkpoint {parts['checkpoint_s']:.2f} s (written in {parts['checkpoint_write_s']:.2f} s), "
                  f"test {parts['test_s']:.1f} s", flush=True)
        used[key] = measured[key]
        total += run_seconds(measured[key], config["train"]["epochs"]) * config["train"]["processes"]
    return total, missing, used


def main(argv: list[str] | None = None) -> None:
    parser = options.Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("studies", nargs="*", help="study names (default: every registered study)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for every run, as fslab study run --set (e.g. train.compile=default)")
    parser.add_argument("--image-size", type=int, default=0, help="shrink every image to this size (CPU checks)")
    parser.add_argument("--batch-size", type=int, default=0,
                        help="at most this many images a step where the sampler draws train.batch_size; a recipe's "
                             "own batch composition (mAP's, explicit episodes) is kept (CPU checks)")
    parser.add_argument("--train-images", type=int, default=0, help="at most this many training labels (CPU checks)")
    parser.add_argument("--eval-images", type=int, default=0, help="at most this many images a split (CPU checks)")
    parser.add_argument("--json", type=Path, default=None, help="also write one JSON object per study here")
    args = parser.parse_args(argv)
    from fslab.core.assignments import nest, parse_assignment

    options.at_least(parser, args, steps=1, warmup=0, image_size=0, batch_size=0, train_images=0, eval_images=0)
    options.output(parser, args.json)
    device, settings = options.device(parser, args.device), load_settings()
    registry = load_registry(settings.plugin_dirs)  # the studies fslab study run finds
    names = args.studies or registry.names("study")
    with options.usage_errors(parser):  # a study that is not there, a --set that is no setting: before any timing
        extra = tuple(nest(*parse_assignment(text)) for text in args.set)
        studies = {name: resolve_study(find_study(registry, name), "paper", settings=settings, registry=registry,
                                       extra=extra) for name in names}
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {where}; every study at paper scale; worker start-up and data reading not counted")
    measured: dict[str, dict] = {}
    out = []
    for name in names:
        resolved = studies[name]
        runs = [places[0] for places in distinct_runs(resolved).values()]  # each run once, as study run trains it
        total, missing, used = price_runs(name, runs, measured, lambda config: measure(config, registry, args, device))
        line = {"study": name, "runs": len(runs), "places": len(resolved), "gpu_hours": total / 3600,
                "not_timed": sorted(set(missing)), "device": where, "configurations": list(used.values())}
        print(f"{name}: {runs_text(len(runs), len(resolved))}, {total / 3600:.1f} device-hours"
              + (f" (not timed: {', '.join(line['not_timed'])})" if missing else ""), flush=True)
        out.append(line)
        if args.json is not None:  # after each study, so a run cut short keeps the studies it finished
            args.json.write_text("".join(json.dumps(r) + "\n" for r in out))
    if device.type == "cuda":  # what the study files can record, for the studies timed whole
        for line in out:
            if not line["not_timed"] and line["gpu_hours"] >= 0.05:
                print(f"\nfor plugins/studies/{line['study']}.toml:\n"
                      + cost_block(where, line["gpu_hours"], time.strftime("%Y-%m-%d")), end="")


if __name__ == "__main__":
    sys.exit(main())
