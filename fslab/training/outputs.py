"""What a run's loss and sampler give it, checked as the run takes it: a loss's ``LossOutput`` (its
``extra`` counters too) and a sampler's ``Batch``. Each check is a TypeError or ValueError whose line
names the component and its plugin (``named``, as :attr:`fslab.core.registry.Component.named` gives it),
raised at the first step that breaks the contract, not PyTorch's words (which name no plugin) nor a
run that trains on what it should not (an index of -1 reads the last image).

The loss's checks read shapes and types only, so a GPU step does not wait; the sampler's read its
indices on the host, where a sampler draws them.
"""

from __future__ import annotations

import numbers

import torch

from fslab.core.types import Batch

# What a train event writes itself: an extra counter of one of these names would overwrite it.
TRAIN_EVENT_KEYS = ("event", "time", "step", "epoch", "loss", "positives", "negatives", "lr", "images_per_s")


def checked_loss_output(out, named: str):
    """``out`` if it is what a loss returns, a ``LossOutput`` whose ``loss`` is a 0-d tensor with a
    gradient and whose ``extra`` is None or a dict of counters, else a TypeError naming the loss and its
    plugin (rather than PyTorch's message on backward, or the event log's, which name none)."""
    loss = getattr(out, "loss", None)
    if not (hasattr(out, "positives") and hasattr(out, "negatives")):
        shape = f" of shape {list(out.shape)}" if hasattr(out, "shape") else ""
        raise TypeError(f"{named} returned a {type(out).__name__}{shape}, not "
                        f"LossOutput(loss, positives, negatives)")
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        got = f"of shape {list(loss.shape)}" if isinstance(loss, torch.Tensor) else f"of type {type(loss).__name__}"
        raise TypeError(f"{named} returned a loss {got}; LossOutput's loss must be a 0-d tensor: "
                        f"reduce it over the batch (e.g. .mean())")
    if not loss.requires_grad:
        raise TypeError(f"{named} returned a loss with no gradient; compute it from z with differentiable "
                        f"operations (not .detach(), .item(), argmax or a constant)")
    for field in ("positives", "negatives"):
        check_pair_count(getattr(out, field), field, named)
    check_extra(getattr(out, "extra", None), named)
    return out


def check_pair_count(value, field: str, named: str) -> None:
    """LossOutput's ``positives`` or ``negatives``: a whole number at least 0 (an int), or a 0-d integer
    tensor (not read here, so a GPU step does not wait). 1.5 was logged as 1, -3 as -3, and a tensor of
    several values or text failed the run in Python's words, naming no loss."""
    if isinstance(value, torch.Tensor):
        whole = value.dim() == 0 and not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool)
    else:
        whole = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0
    if not whole:
        raise TypeError(f"{named} returned LossOutput {field}={_shown(value)}; it counts the unordered pairs that "
                        f"reach the loss: an int at least 0 or a 0-d integer tensor (e.g. same.sum())")


def check_extra(extra, named: str) -> None:
    """LossOutput's ``extra``: None, or a dict from a counter's name (text that no key of the train event
    has) to a number or a one-value tensor, as each is logged with ``float()``."""
    example = "e.g. {'rows_without_positive': 3}"
    if extra is None:
        return
    if not isinstance(extra, dict):
        raise TypeError(f"{named} returned LossOutput extra={_shown(extra)}, not a dict of counters ({example})")
    for key, value in extra.items():
        if not isinstance(key, str) or key in TRAIN_EVENT_KEYS:
            why = "is not text" if not isinstance(key, str) else "is a key the train event writes itself"
            raise TypeError(f"{named} returned LossOutput extra with the key {key!r}, which {why}; name each "
                            f"counter otherwise (not {', '.join(TRAIN_EVENT_KEYS)})")
        number = isinstance(value, numbers.Real) or (isinstance(value, torch.Tensor) and value.numel() == 1
                                                      and not value.is_complex())
        if not number:
            raise TypeError(f"{named} returned LossOutput extra[{key!r}] = {_shown(value)}; each counter is a "
                            f"number or a 0-d tensor ({example})")


def _shown(value) -> str:
    """A value as a line may show it: a tensor by its shape and dtype, anything else by its repr, cut short."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)} and dtype {value.dtype}"
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else f"{text[:56]} ..."


def batch_count(sampler, named: str) -> int:
    """``len(sampler)``, the batches of an epoch, if it is a whole number at least 1; else a TypeError or
    ValueError naming the sampler and its plugin: 0 trained no step and the run ended completed, and
    2.5 failed in Python's words (an integer is required)."""
    try:
        count = len(sampler)
    except TypeError as error:
        raise TypeError(f"{named} has no len() that fslab can read ({error}); __len__ returns the number of "
                        f"batches per epoch, an int at least 1") from None
    if count < 1:
        raise ValueError(f"{named} has len() {count}, no batch per epoch: the run would train no step; "
                         f"__len__ returns the number of batches per epoch, at least 1 (fewer images than a "
                         f"batch holds?)")
    return count


def checked_batch(batch, named: str, rows: int, images: int) -> Batch:
    """``batch`` as host tensors, its indices and support marks each converted once (here, where they
    are checked: the step moves these to the device as they are), if it is what a sampler yields,
    ``Batch(indices, support)`` with ``rows`` distinct whole indices of the ``images`` of the training
    split (and a support mark per row, where it marks them), else a TypeError or ValueError naming the
    sampler and its plugin: an index out of range failed in PyTorch's words, and a negative one, one
    named twice or a batch of another size trained silently."""
    if not (hasattr(batch, "indices") and hasattr(batch, "support")):
        raise TypeError(f"{named} yielded a {type(batch).__name__}, not Batch(indices, support): "
                        f"batches(epoch) yields fslab.plugin.Batch")
    try:
        indices = torch.as_tensor(batch.indices).cpu()
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"{named} yielded indices that are not a list of whole numbers: {error}") from None
    if indices.dim() == 1 and len(indices) != rows:  # before the dtype: [] is a float tensor
        raise ValueError(f"{named} yielded a batch of {len(indices)} indices, not train.batch_size={rows}; "
                         f"each batch holds train.batch_size rows (a sampler whose parameters fix it says so "
                         f"with register(..., batch=f))")
    if indices.dim() != 1 or indices.dtype.is_floating_point or indices.dtype.is_complex or indices.dtype == torch.bool:
        raise TypeError(f"{named} yielded indices of dtype {indices.dtype} and shape {list(indices.shape)}; "
                        f"Batch.indices is a list of whole numbers, one per row")
    low, high = int(indices.min()), int(indices.max())
    if low < 0 or high >= images:
        raise ValueError(f"{named} yielded the index {low if low < 0 else high}, out of the training split's "
                         f"range 0..{images - 1}; indices number the images of the labels it was built with")
    if len(torch.unique(indices)) != rows:
        raise ValueError(f"{named} yielded a batch that names an image twice; a batch's indices are distinct")
    return Batch(indices, None if batch.support is None else checked_support(batch.support, named, rows))


def checked_support(support, named: str, rows: int) -> torch.Tensor:
    """A batch's support marks as a bool tensor: one True or False per row. Marks of 1 and 0 were taken
    by a loss's ``z[support]`` as row numbers (rows 1 and 0, again and again), and trained on them in
    silence."""
    try:
        marks = torch.as_tensor(support).cpu()
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"{named} yielded support marks that are not a list of True and False: {error}") from None
    if marks.dtype != torch.bool:
        raise TypeError(f"{named} yielded support marks of dtype {marks.dtype}; Batch.support holds True (a "
                        f"support row) or False (a query row) for each row, not numbers, which index rows")
    if marks.shape != (rows,):
        raise ValueError(f"{named} yielded {len(marks) if marks.dim() else 0} support marks for {rows} indices; "
                         f"Batch.support marks each row, or is None")
    return marks
