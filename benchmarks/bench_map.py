"""What the mAP losses cost next to a training step.

Times, in one run and on the same device, (a) the mAP-SSVM and mAP-DLM losses
(forward with loss-augmented inference, and backward) on a batch of 128
64-d embeddings from 16 classes × 8 images, as the mAP paper trains, and (b) one
Conv4 training step (forward, NCA loss, backward, SGD update) on a batch of 128
16×16 grayscale images, then prints their ratio. The NCA loss alone is timed
too, as the cheapest loss over the same pairs.

    python benchmarks/bench_map.py [--repeats 50] [--threads N] [--device cpu]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from fslab_plugins.backbones.networks import Conv4
from fslab_plugins.methods.map import map_dlm, map_ssvm
from fslab_plugins.methods.nca import nca

sys.path.insert(0, str(Path(__file__).parent))
import options  # noqa: E402


def timed(fn, repeats: int, device: torch.device) -> float:
    """Median seconds per call, after a few warm-up calls."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = options.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    options.at_least(parser, args, repeats=1, threads=0)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = options.device(parser, args.device)
    torch.manual_seed(0)

    labels = torch.arange(16, device=device).repeat_interleave(8)
    z = torch.randn(128, 64, device=device, requires_grad=True)

    def loss_step(loss):
        def run():
            z.grad = None
            loss(z, labels).loss.backward()
        return run

    network = Conv4(1).to(device)
    optimizer = torch.optim.SGD(network.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(128, 1, 16, 16, device=device)

    def conv4_step():
        out = nca(network(images), labels)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()

    step = timed(conv4_step, args.repeats, device)
    print(f"device {device}, torch threads {torch.get_num_threads()}, median of {args.repeats}")
    print(f"{'Conv4 training step, batch 128, 16x16':44s} {step * 1e3:8.2f} ms")
    for name, loss in (("nca", nca), ("map-ssvm", map_ssvm), ("map-dlm", map_dlm)):
        cost = timed(loss_step(loss), args.repeats, device)
        print(f"{name + ' loss, 128 x 64-d, 16 classes x 8':44s} {cost * 1e3:8.2f} ms   {cost / step:6.1%} of a step")


if __name__ == "__main__":
    main()
