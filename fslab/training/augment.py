"""Training-time augmentation on the device: random crop after zero padding
and random horizontal flip, drawn from the run's own seeded generator.

Under ``--gpus N`` each rank augments only its rows of the global batch, yet
draws the random numbers for the whole batch, so every row is augmented as one
process would augment it and the ranks' generators stay in step. The numbers
are drawn on the host, so a run augments alike on the CPU and on a GPU, and
reach the GPU without a wait (:func:`fslab.training.build.host_to_device`).
"""

from __future__ import annotations

import torch

from fslab.training.build import host_to_device


def augment(x: torch.Tensor, padding: int, flip: bool, generator: torch.Generator,
            part: slice | None = None, total: int | None = None) -> torch.Tensor:
    """Random crop after zero padding and random horizontal flip, on tensors.

    ``x`` may be the rows ``part`` of a batch of ``total`` rows (one rank's share):
    the random offsets and flips are drawn for the whole batch and this
    slice's are applied, so each row is augmented as in a single process.
    The crop is two ``gather`` calls (rows, then columns); a flip only reverses
    the columns gathered."""
    b, c, h, w = x.shape
    total = b if total is None else total
    part = slice(0, b) if part is None else part
    if padding <= 0 and not flip:
        return x
    cols = torch.arange(w, device=x.device).expand(b, w)
    if padding > 0:  # drawn first: offsets down, offsets across, then the flips
        dy = host_to_device(torch.randint(0, 2 * padding + 1, (total, 1), generator=generator)[part], x.device)
        dx = host_to_device(torch.randint(0, 2 * padding + 1, (total, 1), generator=generator)[part], x.device)
        x = torch.nn.functional.pad(x, (padding,) * 4)
        rows = dy + torch.arange(h, device=x.device)  # [b, h]
        x = x.gather(2, rows[:, None, :, None].expand(b, c, h, x.shape[3]))
        cols = dx + cols
    if flip:
        mirror = host_to_device(torch.rand(total, generator=generator)[part] < 0.5, x.device)[:, None]
        cols = torch.where(mirror, cols.flip(1), cols)
    return x.gather(3, cols[:, None, None, :].expand(b, c, h, w))
