"""The training augmentation against a row-by-row reference: pad, crop at the
drawn offsets, mirror when drawn, in the order the generator is consumed."""

from __future__ import annotations

import pytest
import torch

from fslab.training.augment import augment


def reference(x, padding, flip, seed):
    generator = torch.Generator().manual_seed(seed)
    b, _, h, w = x.shape
    if padding > 0:
        dy = torch.randint(0, 2 * padding + 1, (b, 1), generator=generator)[:, 0].tolist()
        dx = torch.randint(0, 2 * padding + 1, (b, 1), generator=generator)[:, 0].tolist()
    else:
        dy = dx = [0] * b
    mirror = (torch.rand(b, generator=generator) < 0.5).tolist() if flip else [False] * b
    padded = torch.nn.functional.pad(x, (padding,) * 4)
    rows = []
    for i in range(b):
        crop = padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w]
        rows.append(crop.flip(2) if mirror[i] else crop)
    return torch.stack(rows)


@pytest.mark.parametrize("padding, flip", [(0, False), (0, True), (3, False), (2, True)])
def test_augment_equals_the_row_by_row_reference(padding, flip):
    x = torch.rand(9, 3, 7, 5, generator=torch.Generator().manual_seed(0))
    out = augment(x, padding, flip, torch.Generator().manual_seed(4))
    assert out.shape == x.shape
    assert torch.equal(out, reference(x, padding, flip, 4))
    if padding or flip:  # something actually moved
        assert not torch.equal(out, x)
