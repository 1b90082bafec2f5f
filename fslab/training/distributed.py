"""Data-parallel training over several processes (``fslab run ... --gpus N``).

The launcher starts torchrun (``python -m fslab.execution.torchrun --standalone
--nproc-per-node N -m fslab.execution.worker RUN_DIR``); torchrun gives each process its
``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``. Every rank then draws the *same*
global batch from the same seeded sampler, embeds only its own contiguous
slice of rows, and :func:`gather_with_grad` puts all embeddings back together
in global order. Every rank computes the loss over the whole global batch, so
batch-wide losses (NCA, mAP, supervised contrastive, the prototypical family)
see every pair, and pair counts are global.

Gradients. :func:`gather_with_grad` and :func:`all_reduce_with_grad` follow
the rule of ``torch.distributed.nn``: their backward sums the gradients every
rank computed for a tensor and hands the sum to the rank that owns it. All N
ranks compute the same loss L, so a rank's own embeddings receive N·∂L/∂z;
DistributedDataParallel then averages the parameter gradients over the N
ranks, which leaves exactly the single-process gradient of L on the full
batch. Parameters the loss itself holds (a classifier) are used by each rank's
copy of the loss alone, so each rank gets ∂L/∂φ and the average is again ∂L/∂φ.
No loss scaling is needed.

Batch norm. With N > 1 its statistics must come from the global batch too: on
CUDA the layers become ``torch.nn.SyncBatchNorm``; SyncBatchNorm refuses CPU
tensors (torch 2.14: "SyncBatchNorm expected input tensor to be on GPU"), so
on the CPU (gloo, for testing) they become :class:`GlobalBatchNorm`, which
sums per-channel moments over the ranks itself. Both give the full batch's
statistics, equal to one process up to float rounding.

Random numbers. Every rank seeds its generators alike. A layer that draws
noise per row (DropBlock) calls ``rand_rows`` of the plugin API
(:mod:`fslab.core.global_batch`): during a training forward it draws the
noise for the whole global batch, the same on every rank, and keeps this
rank's rows, so each row gets the noise one process would give it and the
ranks' generators stay in step for what is drawn later (NCA's pair dropping,
the triplet sampler). Sums and counts that a layer takes over the batch go
through ``sum_rows`` and ``global_rows``. :class:`GlobalBatchLoss` tells them
this rank's share.
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from fslab.core.errors import plugin_call
from fslab.core.global_batch import BatchShare, sharing

# Rank 0 evaluates alone while the others wait at a barrier; a test evaluation
# of many episodes must not trip the collective timeout.
TIMEOUT = datetime.timedelta(hours=6)


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    local_rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        """Rank 0: the only process that writes the run store."""
        return self.rank == 0

    @classmethod
    def from_env(cls) -> World:
        """Rank and size as torchrun sets them (one process when unset)."""
        env = os.environ
        return cls(int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0)), int(env.get("WORLD_SIZE", 1)))

    def counts(self, total: int) -> list[int]:
        """Rows of a global batch of ``total`` each rank embeds: contiguous
        blocks, the first ``total % size`` ranks taking one row more."""
        if total < self.size:
            raise RuntimeError(
                f"a batch of {total} rows cannot be split over {self.size} processes; "
                f"use a batch of at least {self.size} rows or fewer processes"
            )
        base, extra = divmod(total, self.size)
        return [base + (1 if r < extra else 0) for r in range(self.size)]

    def rows(self, total: int) -> slice:
        """This rank's contiguous slice of a global batch of ``total`` rows."""
        counts = self.counts(total)
        start = sum(counts[: self.rank])
        return slice(start, start + counts[self.rank])

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()


def start(device_name: str, world: World | None = None) -> tuple[World, torch.device]:
    """Join the process group torchrun prepared (``MASTER_ADDR``/``MASTER_PORT``
    from the environment); returns the world and this rank's device:
    ``cuda:LOCAL_RANK`` with NCCL, or the CPU with gloo when ``device_name``
    is ``cpu``. Training calls it only when there are several processes."""
    world = world or World.from_env()
    if device_name == "cpu":
        device, backend = torch.device("cpu"), "gloo"
    elif device_name in ("auto", "cuda"):
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world.size))
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if available < local_size:
            raise RuntimeError(
                f"{local_size} training processes need {local_size} GPUs but {available} are visible; "
                f"use fewer processes (--gpus {available}) or --device cpu for gloo processes on the CPU"
            )
        device, backend = torch.device("cuda", world.local_rank), "nccl"
        torch.cuda.set_device(device)
    else:
        raise RuntimeError(
            f"device '{device_name}' names one device; several processes use cuda:0..N-1 "
            f"(device auto or cuda) or the CPU (device cpu)"
        )
    options = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, rank=world.rank, world_size=world.size, timeout=TIMEOUT, **options)
    return world, device


def stop() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class _GatherRows(torch.autograd.Function):
    """All ranks' rows in rank order; backward sums the gradient over ranks
    and returns each rank the rows it owns."""

    @staticmethod
    def forward(ctx, local, counts, rank):
        ctx.start, ctx.rows = sum(counts[:rank]), counts[rank]
        most = max(counts)
        padded = local.contiguous()
        if local.shape[0] < most:  # all_gather needs equal shapes: pad, then trim
            padded = torch.cat([padded, padded.new_zeros((most - local.shape[0], *local.shape[1:]))])
        parts = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(parts, padded)
        return torch.cat([part[:n] for part, n in zip(parts, counts)])

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad[ctx.start : ctx.start + ctx.rows], None, None


def gather_with_grad(local: torch.Tensor, world: World, total: int | None = None) -> torch.Tensor:
    """Concatenate every rank's ``local`` rows (rank 0 first) into the global
    batch; gradients reaching any rank's copy flow back to the rank that owns
    the rows. Ranks may hold different numbers of rows: given the global
    ``total``, each holds its :meth:`World.rows`; otherwise the sizes are
    exchanged first."""
    if world.size == 1:
        return local
    if total is not None:
        counts = world.counts(total)
    else:
        size = torch.tensor([local.shape[0]], device=local.device)
        sizes = [torch.zeros_like(size) for _ in range(world.size)]
        dist.all_gather(sizes, size)
        counts = [int(s) for s in sizes]
    if counts[world.rank] != local.shape[0]:
        raise RuntimeError(f"rank {world.rank} holds {local.shape[0]} rows, expected {counts[world.rank]}")
    return _GatherRows.apply(local, counts, world.rank)


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor):
        out = tensor.contiguous().clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad


def all_reduce_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of ``tensor`` over the ranks, differentiable (backward sums too)."""
    return _AllReduceSum.apply(tensor)


class GlobalBatchNorm(nn.modules.batchnorm._BatchNorm):
    """Batch norm whose training statistics are those of the global batch:
    per-channel sums and sums of squares (in float64) are summed over the
    ranks. For gloo on the CPU, where ``torch.nn.SyncBatchNorm`` does not run.
    Same parameters and buffers as ``BatchNorm2d``, so checkpoints load into
    either. In eval mode it is plain batch norm with the running statistics."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:  # evaluation runs on rank 0 alone: no collective here
            return super().forward(x)
        channels = x.shape[1]
        dims = [0, *range(2, x.dim())]
        wide = x.double()
        local = torch.cat([wide.sum(dims), (wide * wide).sum(dims),
                           wide.new_tensor([x.numel() // channels])])
        total = all_reduce_with_grad(local) if dist.is_initialized() else local
        count = total[-1]
        mean = total[:channels] / count
        var = (total[channels : 2 * channels] / count - mean * mean).clamp(min=0.0)
        shape = (1, channels) + (1,) * (x.dim() - 2)
        y = ((wide - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)).to(x.dtype)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                factor = (1.0 / float(self.num_batches_tracked)) if self.momentum is None else self.momentum
                unbiased = var * (count / (count - 1).clamp(min=1))
                self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)
        return y


def to_global_batch_norm(module: nn.Module) -> nn.Module:
    """``module`` with every batch-norm layer replaced by :class:`GlobalBatchNorm`
    (sharing its parameters and buffers)."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, GlobalBatchNorm):
        new = GlobalBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                              module.track_running_stats)
        if module.affine:
            new.weight, new.bias = module.weight, module.bias
        if module.track_running_stats:
            new.running_mean, new.running_var = module.running_mean, module.running_var
            new.num_batches_tracked = module.num_batches_tracked
        new.train(module.training)
        return new
    for name, child in module.named_children():
        module.add_module(name, to_global_batch_norm(child))
    return module


def synchronise_batch_norm(model: nn.Module, world: World, device: torch.device) -> nn.Module:
    """Batch norm over the global batch when there are several ranks:
    SyncBatchNorm on CUDA, :class:`GlobalBatchNorm` elsewhere."""
    if world.size == 1:
        return model
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return to_global_batch_norm(model)


class GlobalBatchLoss(nn.Module):
    """One training forward: embed this rank's rows, gather the global batch,
    apply the loss to all of it. ``labels`` and ``support`` are the global
    batch's (every rank drew the same batch). With one process this is just
    ``loss(head(backbone(x)), labels, support)``. ``failed`` names the loss and its plugin
    (``loss 'boom' from plugin 'local:boom' failed``), ``backbone_failed`` the backbone and its:
    what either raises then fails the run in one line that says whose code it was (torch's
    out-of-memory error, the system's, and torch.compile's own errors go on)."""

    def __init__(self, backbone: nn.Module, head: nn.Module, loss, world: World,
                 autocast: Callable[[], AbstractContextManager] = nullcontext, failed: str = "",
                 backbone_failed: str = ""):
        super().__init__()
        self.backbone, self.head, self.world = backbone, head, world
        self.loss = loss  # a loss module's parameters train (and synchronise) with the network's
        self.autocast = autocast
        self.failed, self.backbone_failed = failed, backbone_failed

    def embed(self, x):
        """This rank's rows through the backbone, blamed on it (and its plugin) where it raises."""
        if not self.backbone_failed:
            return self.backbone(x)
        return plugin_call(lambda: self.backbone(x), self.backbone_failed, passes=torch_own_errors())

    def forward(self, x, labels, support=None):
        total = labels.shape[0]
        share = BatchShare(self.world.rows(total), total, dist.all_reduce) if self.world.size > 1 else None
        with sharing(share), self.autocast():  # layers that draw noise per row draw it for the global batch
            local = self.head(self.embed(x))
        # The loss computes in float32, whatever the network's precision (fslab.training.numerics);
        # the embeddings are gathered in that precision too.
        z = gather_with_grad(local.float(), self.world, total=labels.shape[0])
        if not self.failed:
            return self.loss(z, labels, support)
        return plugin_call(lambda: self.loss(z, labels, support), self.failed, passes=(torch.OutOfMemoryError,))


def torch_own_errors() -> tuple[type[BaseException], ...]:
    """What torch raises of its own as a backbone runs: out of memory, and where torch.compile is at
    work (``torch._dynamo`` imported), its compiler's failures, which are no plugin's doing."""
    dynamo = sys.modules.get("torch._dynamo.exc")
    return (torch.OutOfMemoryError, *([dynamo.TorchDynamoException] if dynamo is not None else []))


def training_step(backbone: nn.Module, head: nn.Module, loss, world: World, device: torch.device,
                  autocast: Callable[[], AbstractContextManager] = nullcontext, failed: str = "",
                  backbone_failed: str = "") -> nn.Module:
    """The module a training step calls: :class:`GlobalBatchLoss`, wrapped in
    DistributedDataParallel when there are several ranks (its parameters are
    averaged over the ranks after each backward pass)."""
    step = GlobalBatchLoss(backbone, head, loss, world, autocast, failed, backbone_failed)
    if world.size == 1:
        return step
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(step, device_ids=ids, output_device=device.index if ids else None)
