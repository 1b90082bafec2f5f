"""fslab's training step at the papers' sizes, one command: ``python benchmarks/bench_gpu.py``.

Prints, measured in this one run on this one device, for each backbone, loss and
mode (fp32; bf16 with channels-last; bf16 with channels-last and torch.compile;
and, when ``--modes`` names it, torch.compile's ``max-autotune``):
images/s, milliseconds per step, the loss alone (its forward and backward on
fixed float32 embeddings), FLOPs per image (counted by
``torch.utils.flop_counter`` over one forward and backward pass of the eager
model, on at most 128 images), MFU (those FLOPs per second over the device's
dense bf16 peak, taken from its name or ``--peak-tflops``), peak GPU memory,
the first step's seconds (compilation included) and the ratio to fp32. A row
that does not fit in the GPU's memory says so; rows are printed as measured.
A bare PyTorch loop written as a careful user would (bf16 autocast,
channels-last, the NCA loss by hand) runs on the same data as the baseline
fslab's step is compared with. ``--recipe`` also times the whole NCA recipe on
the miniImageNet-sized stand-in with ``fslab run`` end to end (``--recipe-set``
adds settings) and splits its time, from the run's own events, into the
worker's start, the first epoch (compiling included), the other epochs'
training, validations, checkpoints, the test and the finish.

``--profile`` says what bounds each row: a few more steps run under
``torch.profiler``, and the GPU's kernel time (the CPU's operator time on the
CPU) is split into convolutions and matrix products, batch norm, pooling, the
optimiser, copies and layout changes, and the rest (activations, the loss,
other elementwise work). It prints those shares, how busy the device was over
the measured step (kernel time per step over the step's wall time: the rest is
the device waiting for the host), and the FLOPs over the time of the
convolutions and products alone as a share of the peak, so that
MFU = that share × their part of the kernel time × busy.

fslab's step is the one training uses: :func:`fslab.training.distributed.training_step`
with the run's :class:`fslab.training.numerics.Numerics` (autocast around the
network, float32 loss), then SGD with Nesterov momentum and weight decay.

On the CPU (``--device cpu``) it runs at the sizes given; the tests keep it working with a few
small steps, about 20 s on 2 cores: ``python benchmarks/bench_gpu.py --device cpu --backbones conv4
--modes fp32 --batch-size 8 --image-size 16 --steps 1 --warmup 1`` (at the defaults, batch 512 of
84×84 images, one row takes minutes there).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from fslab.core.registry import load_registry
from fslab.core.timing import PARTS, key, time_split
from fslab.training import distributed
from fslab.training.numerics import Numerics, apply_backend_settings, compiled, optimiser_step

sys.path.insert(0, str(Path(__file__).parent))
import options  # noqa: E402

BACKBONES = {"resnet12": {}, "resnet12-nca": {}, "wrn28-10": {}, "conv4": {}}
MODES = {  # precision, channels-last, compile
    "fp32": ("fp32", False, "off"),
    "bf16": ("bf16", True, "off"),
    "bf16+compile": ("bf16", True, "default"),
    "bf16+max-autotune": ("bf16", True, "max-autotune"),  # minutes of autotuning: asked for by --modes only
}
DEFAULT_MODES = ("fp32", "bf16", "bf16+compile")
FLOP_BATCH = 128
# Dense bf16 tensor-core peaks in TFLOP/s, by a part of the device's name (first match wins).
PEAKS = [("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("GH200", 989.0), ("A100", 312.0),
         ("L40S", 362.0), ("L4", 121.0), ("A10", 125.0), ("RTX 4090", 165.0), ("V100", 125.0)]


def peak_tflops(device: torch.device, override: float | None) -> float | None:
    if override is not None:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for part, peak in PEAKS if part in name), None)


def batch_for(batch: int, size: int, device: torch.device, classes: int = 64):
    """A fixed random batch: ``batch`` images of ``classes`` labels in turn."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, size, size, generator=generator).to(device)
    labels = (torch.arange(batch) % classes).to(device)
    return images, labels


def step_flops(model: torch.nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor) -> int:
    """FLOPs of one forward and backward pass (eager, float32), as torch counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        loss_fn(model(x).float(), y).loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def fslab_step(model, loss_fn, numerics: Numerics, device: torch.device):
    """One optimiser step of fslab's training path, as a function of (x, y)."""
    step = distributed.training_step(compiled(model, numerics), torch.nn.Identity(), loss_fn, distributed.World(),
                                     device, numerics.autocast)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scaler = numerics.grad_scaler()

    def run(x, y):
        optimiser_step(step(numerics.memory_format(x), y).loss, optimizer, scaler)

    return run


def bare_step(model, device: torch.device, temperature: float = 1.0):
    """A careful user's loop: bf16 autocast (on CUDA), channels-last, the NCA loss by hand."""
    cuda = device.type == "cuda"
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4)

    def run(x, y):
        if cuda:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            z = model(x)
        z = z.float()
        logits = -torch.cdist(z, z).pow(2) / temperature
        eye = torch.eye(len(y), dtype=torch.bool, device=device)
        logits = logits.masked_fill(eye, float("-inf"))
        same = (y[:, None] == y[None, :]) & ~eye
        loss = -(logits.masked_fill(~same, float("-inf")).logsumexp(1) - logits.logsumexp(1)).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return run


def timed(run, x, y, steps: int, warmup: int, device: torch.device, seconds: float) -> tuple[float, float, int]:
    """Seconds per step after ``warmup`` steps (compilation included in the
    warm-up), the first step's seconds, and how many steps were timed: as many
    as fit in about ``seconds`` (at least 3), at most ``steps``."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    start = time.perf_counter()
    run(x, y)
    sync()
    first = time.perf_counter() - start
    for _ in range(max(0, warmup - 1)):
        run(x, y)
    sync()
    start = time.perf_counter()
    run(x, y)
    sync()
    estimate = time.perf_counter() - start
    count = max(3, min(steps, int(seconds / max(estimate, 1e-6))))
    start = time.perf_counter()
    for _ in range(count):
        run(x, y)
    sync()
    return (time.perf_counter() - start) / count, first, count


def loss_alone(loss_fn, batch: int, dim: int, y: torch.Tensor, device: torch.device, steps: int) -> float:
    """Seconds of the loss's forward and backward on fixed float32 embeddings
    (``batch`` × ``dim``), the part of a step no precision setting changes."""
    generator = torch.Generator().manual_seed(1)
    z = torch.randn(batch, dim, generator=generator).to(device).requires_grad_(True)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def once():
        z.grad = None
        loss_fn(z, y).loss.backward()

    for _ in range(3):
        once()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        once()
    sync()
    return (time.perf_counter() - start) / steps


# Where a step's time goes, by kernel name on CUDA (operator name on the CPU): the first category
# with a fragment of the lower-cased name wins; anything else is "elementwise & other". Triton's
# pointwise and reduction kernels (triton_poi_, triton_red_, triton_per_) are named after the ops
# they fuse, a convolution's epilogue included, and are never matrix products.
CATEGORIES = (
    ("conv & matmul", ("convolution", "conv2d", "convolve", "gemm", "xmma", "cutlass", "wgmma", "matmul",
                       "aten::mm", "aten::addmm", "aten::bmm", "triton_tem")),
    ("batch norm", ("batch_norm", "batchnorm", "bn_fw", "bn_bw", "welford")),
    ("pooling", ("pool",)),
    ("optimiser", ("multi_tensor_apply", "foreach", "sgd", "adam")),
    ("copies & layout", ("copy", "memcpy", "memset", "fill", "nchwtonhwc", "nhwctonchw", "aten::cat")),
)
OTHER = "elementwise & other"


def category(name: str) -> str:
    lowered = name.lower()
    fused = lowered.startswith(("triton_poi", "triton_red", "triton_per"))
    return next((label for label, parts in CATEGORIES if not (fused and label == "conv & matmul")
                 and any(part in lowered for part in parts)), OTHER)


def time_by_category(timings) -> dict[str, float]:
    """Seconds per category (CATEGORIES) of (name, seconds) pairs, every category listed."""
    totals = dict.fromkeys([label for label, _ in CATEGORIES] + [OTHER], 0.0)
    for name, seconds in timings:
        totals[category(name)] += seconds
    return totals


def profile_step(run, x, y, device: torch.device, steps: int = 3) -> dict[str, float]:
    """Seconds per step and category of ``steps`` steps under torch.profiler:
    CUDA kernels' time on a GPU, operators' own (self) time on the CPU."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            run(x, y)
        if cuda:
            torch.cuda.synchronize(device)
    events = prof.key_averages()
    if not cuda:
        return time_by_category((e.key, e.self_cpu_time_total / 1e6 / steps)
                                for e in events if e.device_type == DeviceType.CPU)
    kernels = [(e.key, e.self_device_time_total / 1e6 / steps) for e in events if e.device_type == DeviceType.CUDA]
    if not any(t for _, t in kernels):  # kernels not listed apart: the GPU time of the operators that launched them
        kernels = [(e.key, e.self_device_time_total / 1e6 / steps) for e in events]
    return time_by_category(kernels)


def bound(profile: dict[str, float], seconds: float, flops: float, peak: float | None) -> dict:
    """What a profile says of a step of ``seconds`` and ``flops``: each category's
    share of the kernel time, how busy the device was, and the convolutions'
    and products' own throughput as a share of ``peak`` (TFLOP/s)."""
    kernels = sum(profile.values())
    gemm = profile["conv & matmul"]
    return {"shares": {label: t / kernels for label, t in profile.items()} if kernels else {},
            "busy": min(1.0, kernels / seconds),  # the profiler's own overhead can push it past 1
            "gemm_of_peak": None if peak is None or gemm <= 0 else flops / gemm / (peak * 1e12)}


def bound_line(r: dict) -> str:
    """The printed line under a profiled row."""
    b = r["bound"]
    shares = ", ".join(f"{label} {100 * share:.0f}%" for label, share in
                       sorted(b["shares"].items(), key=lambda item: -item[1]) if share >= 0.005)
    gemm = "" if b["gemm_of_peak"] is None else f"; conv & matmul at {100 * b['gemm_of_peak']:.0f}% of peak"
    unit = "kernel" if r["device"] != "CPU" else "operator"
    return f"    {unit} time: {shares}; busy {100 * b['busy']:.0f}% of the step{gemm}"


def measure(args, registry, backbone: str, loss_name: str, mode: str | None, device: torch.device) -> dict:
    """One row: fslab's step in ``mode``, or the bare loop when ``mode`` is None.
    A step that does not fit in the GPU's memory gives a row that says so."""
    row = {"backbone": backbone, "loss": loss_name if mode else "nca (by hand)", "batch_size": args.batch_size,
           "image_size": args.image_size, "device": device_name(device)}
    bare = "bare bf16+cl" if device.type == "cuda" else "bare fp32"  # autocast and channels-last only on CUDA
    row["mode"] = mode or bare
    try:
        row.update(_measure(args, registry, backbone, loss_name, mode, device))
    except torch.cuda.OutOfMemoryError:
        row["error"] = "out of memory"
    finally:
        torch._dynamo.reset()  # the next row compiles its own model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def _measure(args, registry, backbone: str, loss_name: str, mode: str | None, device: torch.device) -> dict:
    torch.manual_seed(0)
    model = registry.create("backbone", backbone, in_channels=3, **BACKBONES.get(backbone, {})).to(device)
    loss_fn = registry.create("loss", loss_name, context={"out_dim": model.out_dim, "num_classes": 64})
    x, y = batch_for(args.batch_size, args.image_size, device)
    # Counted on at most FLOP_BATCH of the images (an eager float32 step of a large network at batch 512
    # may not fit in memory) and scaled to the batch: the network's FLOPs grow with the batch, and the
    # loss's B² terms are a rounding error beside them (NCA at 512 × 640: 0.3 of 10,000 GFLOP).
    counted = min(args.batch_size, FLOP_BATCH)
    flops = step_flops(model, loss_fn, x[:counted], y[:counted]) * args.batch_size / counted
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if mode is None:
        run = bare_step(model, device)
    else:
        precision, channels_last, compile_mode = MODES[mode]
        numerics = Numerics(device, precision, precision, channels_last and device.type == "cuda", compile_mode,
                            True, False)
        apply_backend_settings(numerics)
        if numerics.channels_last:
            model = model.to(memory_format=torch.channels_last)
        run = fslab_step(model, loss_fn, numerics, device)
    seconds, first, count = timed(run, x, y, args.steps, args.warmup, device, args.seconds)
    peak = peak_tflops(device, args.peak_tflops)
    row = {"images_per_s": args.batch_size / seconds, "ms_per_step": 1000 * seconds, "first_step_s": first,
           "timed_steps": count, "gflop_per_image": flops / args.batch_size / 1e9,
           "mfu": None if peak is None else flops / seconds / (peak * 1e12),
           "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}
    if mode is not None:
        row["loss_ms"] = 1000 * loss_alone(loss_fn, args.batch_size, model.out_dim, y, device, max(3, count))
    if args.profile:
        row["bound"] = bound(profile_step(run, x, y, device), seconds, flops, peak)
    return row


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


HEADER = (f"{'backbone':<14}{'loss':<15}{'mode':<14}{'img/s':>9}{'ms/step':>9}{'loss ms':>9}{'GFLOP/img':>10}"
          f"{'MFU':>7}{'mem GiB':>9}{'1st step s':>11}{'x fp32':>8}")


def row_line(r: dict, fp32: dict) -> str:
    """One printed row; ``fp32`` maps (backbone, loss) to the fp32 row's images/s."""
    if "error" in r:
        return f"{r['backbone']:<14}{r['loss']:<15}{r['mode']:<14}  {r['error']}"
    ratio = fp32.get((r["backbone"], "nca" if r["mode"].startswith("bare") else r["loss"]))
    mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
    memory = "-" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.1f}"
    loss_ms = f"{r['loss_ms']:.2f}" if r.get("loss_ms") is not None else "-"
    versus = "" if ratio is None else f"{r['images_per_s'] / ratio:.2f}x"
    return (f"{r['backbone']:<14}{r['loss']:<15}{r['mode']:<14}{r['images_per_s']:9.0f}{r['ms_per_step']:9.1f}"
            f"{loss_ms:>9}{r['gflop_per_image']:10.2f}{mfu:>7}{memory:>9}{r['first_step_s']:11.1f}{versus:>8}")


def print_rows(rows: list[dict], device: torch.device) -> None:
    print(f"device: {device_name(device)}")
    print(HEADER)
    fp32 = {(r["backbone"], r["loss"]): r["images_per_s"] for r in rows if r["mode"] == "fp32" and "error" not in r}
    for r in rows:
        print(row_line(r, fp32))
        if "bound" in r:
            print(bound_line(r))


RECIPE = ["run", "nca", "--backbone", "resnet12", "--dataset", "synthetic-mini"]


def time_recipe(arguments: list[str]) -> dict:
    """``fslab`` with ``arguments`` (a run) in a fresh folder, end to end: its
    wall time and where the run's time went (:func:`fslab.core.timing.time_split`)."""
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "fslab", *arguments], cwd=folder)
        if done.returncode != 0:  # fslab has said why, in its one line
            raise SystemExit(done.returncode)
        wall = time.perf_counter() - start
        (run,) = (Path(folder) / "runs").iterdir()
        status = json.loads((run / "status.json").read_text())
        events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {"wall_s": wall, "run_s": status["ended"] - status["started"],
            **time_split(events, status["started"], status["ended"])}


def recipe_lines(parts: dict) -> list[str]:
    """The printed breakdown of :func:`time_recipe`."""
    notes = {"first epoch": f" (compiling {parts['compile_s']:.0f} s)" if parts["compile_s"] else "",
             "training": f" ({parts['epochs'] - 1} epochs)", "validation": f" ({parts['validations']})",
             "checkpoints": f" ({parts['epochs']})"}
    lines = [f"  {part:<13}{parts[key(part)]:8.1f} s{notes.get(part, '')}" for part in PARTS]
    return lines + [f"  {'run':<13}{parts['run_s']:8.1f} s (the worker's start to its end); {parts['wall_s']:.1f} s "
                    "with fslab's own start"]


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[torch.device, object]:
    """The device and the registry, once every option is known good (one line and exit 2 if not)."""
    unknown = [mode for mode in args.modes.split(",") if mode not in MODES]
    if unknown:
        parser.error(f"unknown mode {', '.join(unknown)}; the modes are {', '.join(MODES)}")
    options.at_least(parser, args, batch_size=2, image_size=1, steps=1, warmup=0)
    if args.peak_tflops is not None and not 0 < args.peak_tflops < math.inf:
        parser.error(f"--peak-tflops must be a positive number of TFLOP/s, got {args.peak_tflops}")
    if not 0 <= args.seconds < math.inf:  # nan, inf: a traceback after a warm-up
        parser.error(f"--seconds must be a number of seconds, 0 or more, got {args.seconds}")
    device, registry = options.device(parser, args.device), load_registry()
    options.known(parser, registry, "backbone", [name for name in args.backbones.split(",") if name], "--backbones")
    options.known(parser, registry, "loss", args.losses.split(","), "--losses")
    options.output(parser, args.json)
    with options.usage_errors(parser):
        from fslab.core.assignments import parse_assignment

        for text in args.recipe_set:
            parse_assignment(text, "--recipe-set")
    return device, registry


def main(argv: list[str] | None = None) -> None:
    parser = options.Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backbones", default=",".join(BACKBONES), help="'' for none (with --recipe: the recipe only)")
    parser.add_argument("--losses", default="nca,map-ssvm")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"of {', '.join(MODES)}")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--image-size", type=int, default=84)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="time about this long per row (--steps at most)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak, if the name is not known")
    parser.add_argument("--no-bare", action="store_true", help="skip the bare PyTorch loop")
    parser.add_argument("--recipe", action="store_true", help="also time the whole NCA recipe with fslab run")
    parser.add_argument("--recipe-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for the recipe's run, as fslab run --set (e.g. train.compile=default)")
    parser.add_argument("--profile", action="store_true",
                        help="also split each row's step time by kind of kernel (what bounds its MFU)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here, one JSON object a line")
    args = parser.parse_args(argv)
    device, registry = check_options(parser, args)
    rows = []
    if args.json is not None:
        args.json.write_text("")
    for backbone in [name for name in args.backbones.split(",") if name]:
        plan = [(loss_name, mode) for loss_name in args.losses.split(",") for mode in args.modes.split(",")]
        if not args.no_bare:
            plan.append(("nca", None))
        for loss_name, mode in plan:
            rows.append(measure(args, registry, backbone, loss_name, mode, device))
            print(row_line(rows[-1], {}), flush=True)  # as it is measured; the table comes again at the end
            if "bound" in rows[-1]:
                print(bound_line(rows[-1]), flush=True)
            if args.json is not None:
                with args.json.open("a") as out:
                    out.write(json.dumps(rows[-1]) + "\n")
    if rows:
        print_rows(rows, device)
    if args.recipe:
        arguments = [*RECIPE, "--device", args.device, *(part for text in args.recipe_set for part in ("--set", text))]
        print(f"fslab {' '.join(arguments)}:")
        parts = time_recipe(arguments)
        print("\n".join(recipe_lines(parts)))
        if args.json is not None:
            with args.json.open("a") as out:
                out.write(json.dumps({"recipe": arguments, **parts}) + "\n")


if __name__ == "__main__":
    main()
