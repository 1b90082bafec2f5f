"""A training step never makes the host wait for the GPU (CUDA only: skipped without a GPU).

The host must keep queuing work ahead of the GPU; any copy from ordinary host
memory, ``.item()`` or data-dependent shape in the step would empty the queue
once per step. PyTorch's sync debug mode turns every such wait into an error.
"""

from __future__ import annotations

import pytest
import torch

from fslab.training import distributed
from fslab.training.augment import augment
from fslab.training.build import host_to_device, to_input
from fslab.training.numerics import optimiser_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_host_values_reach_the_gpu_without_a_wait():
    device = torch.device("cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        moved = host_to_device([3, 1, 2], device)
        flags = host_to_device(torch.tensor([True, False]), device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert moved.tolist() == [3, 1, 2] and moved.dtype == torch.int64 and flags.tolist() == [True, False]


def test_an_nca_training_step_queues_without_waiting(registry):
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = registry.create("backbone", "conv4", in_channels=3, hidden=16).to(device)
    loss = registry.create("loss", "nca", context={"out_dim": model.out_dim, "num_classes": 8})
    step = distributed.training_step(model, torch.nn.Identity(), loss, distributed.World(), device,
                                     lambda: torch.autocast("cuda", dtype=torch.bfloat16))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8).to(device)
    labels = (torch.arange(64) % 8).to(device)
    generator = torch.Generator().manual_seed(1)

    def one_step(indices):
        index = host_to_device(indices, device)
        x = augment(to_input(images[index]), 4, True, generator).contiguous(memory_format=torch.channels_last)
        out = step(x, labels[index])
        optimiser_step(out.loss, optimizer, None)
        return out

    one_step(list(range(32)))  # cuDNN picks its algorithms on the first step
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for start in (8, 16, 24):
            out = one_step(list(range(start, start + 32)))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    # 32 consecutive images of 8 labels in turn: 8 classes of 4, so 8 × C(4, 2) same-class pairs
    assert torch.isfinite(out.loss).item() and int(out.positives) == 8 * 6
