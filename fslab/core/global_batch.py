"""A training process's share of the global batch, for layers that draw noise
per row or sum over the batch (DropBlock).

Under ``--gpus N`` every process draws the same global batch and embeds a
contiguous block of its rows. A layer that draws random numbers per row must
draw them for the whole global batch, the same on every process, and keep its
own rows: each row then gets the noise one process would give it, and the
processes' generators stay in step for what is drawn later. The training loop
says which rows are this process's with :func:`sharing`; a layer calls
:func:`rand_rows`, :func:`global_rows` and :func:`sum_rows`, which are plain
``torch.rand_like``, ``rows`` and ``t`` outside a several-process training
forward. The share lives in a context variable, so threads and evaluation
code never see another's.

No torch import here: the tensors passed in bring their own methods, and the
training loop hands over the collective sum it uses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BatchShare:
    """This process's rows of a global batch of ``total`` rows, and the
    in-place sum over the processes (``torch.distributed.all_reduce``)."""

    rows: slice
    total: int
    all_reduce: Callable[[Any], Any]


_share: ContextVar[BatchShare | None] = ContextVar("fslab_batch_share", default=None)


@contextlib.contextmanager
def sharing(share: BatchShare | None) -> Iterator[None]:
    """Within: layers see ``share`` (None: one process embeds the whole batch)."""
    token = _share.set(share)
    try:
        yield
    finally:
        _share.reset(token)


def rand_rows(x):
    """Uniform noise in [0, 1) shaped like the batch ``x``: inside a
    several-process training forward, the global batch's noise (drawn alike on
    every process) at this process's rows, so it equals what one process draws."""
    share = _share.get()
    if share is None:
        return x.new_empty(x.shape).uniform_()
    return x.new_empty((share.total, *x.shape[1:])).uniform_()[share.rows]


def global_rows(rows: int) -> int:
    """The global batch's row count inside a several-process training forward; else ``rows``."""
    share = _share.get()
    return rows if share is None else share.total


def sum_rows(t):
    """A sum a layer took over its rows, summed over the processes inside a
    several-process training forward (no gradient flows through it)."""
    share = _share.get()
    if share is None:
        return t
    t = t.detach().clone()
    share.all_reduce(t)
    return t
