"""Seconds per training step for every registered loss, as a ratio to NCA.

Every loss is timed in the same run, on the same device, with the same
backbone (Conv4 with 64 filters unless ``--backbone`` names another) and the
same batch of random images (by default 128 of 3×32×32: 8 classes × 16
images, of which the first 5 of each class are the support rows that episodic
losses need: 8 ways, 5 shots, 11 queries; NCA paper's n=5, a=16). Non-episodic
losses get the same rows without the support mask. ``--precision bf16`` runs
the backbone as a run with ``train.precision = "bf16"`` does (autocast, and
channels-last on CUDA; the loss in float32), so that a loss's share of a step
can be read at the papers' sizes: ``--backbone resnet12 --batch-size 512
--classes 32 --image-size 84 --precision bf16``.

The losses are timed in rounds (each loss once per round, a rotating order),
so load from other processes is shared out. For each loss it reports the
median seconds of

* a training step: backbone forward, loss, backward, SGD update (with the
  loss's own parameters, if any, in the optimiser), and
* the loss alone: loss forward and backward on fixed embeddings,

with the step's ratio to the ``nca`` step and the loss's share of its step,
plus the positive and negative pairs the loss reports for the batch.

    python benchmarks/bench_losses.py [--steps 20] [--device auto] [--threads N] [--only nca,protonet]
                                      [--backbone conv4] [--batch-size 128] [--classes 8] [--precision fp32]
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from pathlib import Path

import torch

from fslab.core.registry import load_registry
from fslab.core.settings import load_settings
from fslab.training.numerics import Numerics, apply_backend_settings

sys.path.insert(0, str(Path(__file__).parent))
import options  # noqa: E402

SHOTS, TRAIN_CLASSES = 5, 64


def prepare(registry, name: str, base_model, x, labels, support, device, numerics) -> dict:
    """The two timed callables of one loss, on its own copy of the backbone."""
    component = registry.get("loss", name)
    episodic = bool(component.info.get("episodic"))
    rows = support if episodic else None
    model = copy.deepcopy(base_model)
    loss_fn = registry.create("loss", name, context={"out_dim": model.out_dim, "num_classes": TRAIN_CLASSES})
    params = list(model.parameters())
    if isinstance(loss_fn, torch.nn.Module):
        loss_fn.to(device)
        params += list(loss_fn.parameters())
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4)

    def embed(images):
        with numerics.autocast():
            return model(images).float()  # the loss computes in float32 (fslab.training.numerics)

    def step():
        out = loss_fn(embed(x), labels, rows)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()

    with torch.no_grad():
        z = embed(x).detach()
    z.requires_grad_(True)

    def loss_alone():
        z.grad = None
        optimizer.zero_grad(set_to_none=True)  # the loss's own parameters, if any
        loss_fn(z, labels, rows).loss.backward()

    out = loss_fn(z, labels, rows)
    return {"name": name, "episodic": episodic, "positives": int(out.positives), "negatives": int(out.negatives),
            "fns": {"step": step, "loss": loss_alone}, "samples": {"step": [], "loss": []}}


def seconds(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def measure(entries: list[dict], steps: int, device: torch.device) -> None:
    """Three warm-up calls each, then ``steps`` rounds in which every loss is
    timed once (a step, then the loss alone): load from other processes falls
    on all losses alike instead of on whichever ran during it."""
    for entry in entries:
        for _ in range(3):
            entry["fns"]["step"]()
            entry["fns"]["loss"]()
    for round_ in range(steps):
        order = entries[round_ % len(entries):] + entries[: round_ % len(entries)]
        for entry in order:
            for kind in ("step", "loss"):
                entry["samples"][kind].append(seconds(entry["fns"][kind], device))
    for entry in entries:
        for kind in ("step", "loss"):
            entry[kind] = statistics.median(entry["samples"][kind])


def main() -> None:
    parser = options.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per loss (after 3 warm-up steps)")
    parser.add_argument("--batch-size", type=int, default=128, help="a multiple of --classes")
    parser.add_argument("--classes", type=int, default=8, help="classes in the batch, as many images of each")
    parser.add_argument("--backbone", default="conv4")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                        help="the backbone's precision, as train.precision (on CUDA with channels-last)")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--only", default="", help="comma-separated losses (nca is always timed)")
    args = parser.parse_args()
    if args.classes < 2 or args.batch_size % args.classes or args.batch_size // args.classes <= SHOTS:
        parser.error(f"--batch-size must be a multiple of --classes ({args.classes}, at least 2) "
                     f"with more than {SHOTS} images per class")
    options.at_least(parser, args, steps=1, image_size=1, threads=0)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = options.device(parser, args.device, auto=True)

    registry = load_registry(load_settings().plugin_dirs)
    options.known(parser, registry, "backbone", [args.backbone], "--backbone")
    names = registry.names("loss")
    if args.only:
        wanted = {n.strip() for n in args.only.split(",") if n.strip()}
        unknown = sorted(wanted - set(names))
        if unknown:
            parser.error(f"unknown loss {', '.join(unknown)}; registered: {', '.join(names)}")
        names = [n for n in names if n in wanted | {"nca"}]
    names = ["nca"] + [n for n in names if n != "nca"]  # the baseline first

    torch.manual_seed(0)
    per_class = args.batch_size // args.classes
    cuda = device.type == "cuda"
    numerics = Numerics(device, args.precision, args.precision, cuda, "off", True, False)
    apply_backend_settings(numerics)
    x = numerics.memory_format(torch.rand(args.batch_size, 3, args.image_size, args.image_size, device=device) * 2 - 1)
    labels = torch.arange(args.classes, device=device).repeat_interleave(per_class)
    support = (torch.arange(args.batch_size, device=device) % per_class) < SHOTS
    base_model = registry.create("backbone", args.backbone, in_channels=3).to(device).train()
    if numerics.channels_last:
        base_model = base_model.to(memory_format=torch.channels_last)

    rows = [prepare(registry, name, base_model, x, labels, support, device, numerics) for name in names]
    measure(rows, args.steps, device)
    baseline = rows[0]["step"]

    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"\n{args.backbone} in {args.precision}, batch {args.batch_size} of 3×{args.image_size}×{args.image_size} "
          f"({args.classes} classes × {per_class}; episodic: {SHOTS} shots + {per_class - SHOTS} queries), "
          f"{where}, median of {args.steps} steps\n")
    print("| loss | episodic | pairs +/− | step (ms) | × nca step | loss alone (ms) | loss share of step |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| `{r['name']}` | {'yes' if r['episodic'] else 'no'} | {r['positives']:,} / {r['negatives']:,} | "
              f"{r['step'] * 1e3:.1f} | {r['step'] / baseline:.2f} | {r['loss'] * 1e3:.2f} | "
              f"{100 * r['loss'] / r['step']:.1f}% |")


if __name__ == "__main__":
    main()
