"""How a run's steps compute: precision, memory format, compilation, TF32 and
determinism (``train.precision``, ``train.channels_last``, ``train.compile``,
``train.tf32``, ``train.deterministic``, ``eval.precision``).

Where float32 is kept, and why:

- the backbone (and the training-only head) run under autocast in the run's
  precision; their output is cast to float32 *before* the global batch is
  gathered and before the loss (:class:`fslab.training.distributed.GlobalBatchLoss`).
  Every loss therefore computes its distance matrices, log-sum-exps, the mAP
  dynamic programme and its pair counts in float32: the NCA loss subtracts
  squared norms of similar size, and a bf16 softmax over 512 rows loses the
  small positive terms that carry the gradient;
- evaluation embeds in ``eval.precision`` and casts the features to float32
  before centring, normalisation and the episodes
  (:func:`fslab.training.evaluation.extract_features`): the centroids of a
  5-shot episode differ by less than bf16's resolution on normalised features;
- fp16 scales the loss (a gradient scaler, saved in the checkpoint) so small
  gradients do not underflow; bf16 has float32's range and needs none.

On the CPU ``auto`` is float32 in the default memory format, so CPU results
are those of earlier versions. Bitwise determinism for a seed holds on one
machine for a given precision with ``train.deterministic``; without it CUDA
autotunes its convolution algorithms (``cudnn.benchmark``), which may change
the floating-point order from run to run; ``train.compile`` fuses kernels and
so changes that order against an uncompiled run (compiled runs repeat each
other with ``train.deterministic``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from fslab.core.config import RunConfig
from fslab.training.build import to_input
from fslab.training.evaluation import extract_features

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Numerics:
    """The resolved settings of one run on one device."""

    device: torch.device
    precision: str  # fp32, bf16 or fp16 (auto resolved)
    eval_precision: str
    channels_last: bool
    compile: str  # off, default or max-autotune
    tf32: bool  # TF32 for fp32 matrix products (CUDA only)
    deterministic: bool

    def autocast(self, precision: str | None = None) -> contextlib.AbstractContextManager:
        """Autocast in ``precision`` (the training one by default); nothing for fp32."""
        dtype = DTYPES[precision or self.precision]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def memory_format(self, x: torch.Tensor) -> torch.Tensor:
        """An image batch in the run's memory format."""
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """fp16's loss scaling; None for fp32 and bf16."""
        return torch.amp.GradScaler(self.device.type) if self.precision == "fp16" else None

    def describe(self) -> dict:
        """What the ``start`` event records."""
        return {"precision": self.precision, "eval_precision": self.eval_precision,
                "channels_last": self.channels_last, "compile": self.compile,
                "tf32": self.tf32 and self.device.type == "cuda", "deterministic": self.deterministic}


def resolve_numerics(cfg: RunConfig, device: torch.device) -> Numerics:
    """``auto`` made concrete for ``device``: bf16 on a CUDA GPU that supports
    it (fp16 on one that does not), fp32 on the CPU; channels-last on CUDA."""
    cuda = device.type == "cuda"
    precision = cfg.train.precision
    if precision == "auto":
        precision = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if cuda else "fp32"
    eval_precision = precision if cfg.eval.precision == "auto" else cfg.eval.precision
    channels_last = cfg.train.channels_last == "on" or (cfg.train.channels_last == "auto" and cuda)
    return Numerics(device, precision, eval_precision, channels_last, cfg.train.compile, cfg.train.tf32,
                    cfg.train.deterministic)


def apply_backend_settings(numerics: Numerics) -> None:
    """Set the process-wide switches the run asks for, before the first kernel runs (either way:
    a process that evaluates one run after another gets each run's own)."""
    if numerics.deterministic:
        # cuBLAS needs a fixed workspace for deterministic matrix products; read when CUDA starts.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # torch.use_deterministic_algorithms imports torch._inductor and torch._dynamo (1-2 s of a worker's
    # start on a CPU); a run that compiles nothing and leaves the switch at PyTorch's default, off, skips it.
    if numerics.deterministic or numerics.compile != "off" or torch.are_deterministic_algorithms_enabled():
        torch.use_deterministic_algorithms(numerics.deterministic)
    if numerics.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = numerics.tf32
        torch.backends.cudnn.deterministic = numerics.deterministic
        torch.backends.cudnn.benchmark = not numerics.deterministic


def compiled(module: torch.nn.Module, numerics: Numerics) -> torch.nn.Module:
    """``module`` compiled as ``train.compile`` asks (or itself). The compiled
    wrapper shares the parameters, so the optimiser, the checkpoints and the
    evaluation keep using the original module."""
    if numerics.compile == "off":
        return module
    return torch.compile(module, mode=numerics.compile, dynamic=False)


def optimiser_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer,
                   scaler: torch.amp.GradScaler | None) -> None:
    """Backward and one optimiser step; with fp16 through the gradient scaler."""
    optimizer.zero_grad(set_to_none=True)
    if scaler is None:
        loss.backward()
        optimizer.step()
        return
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()


def embed(network: torch.nn.Module, images: torch.Tensor, batch_size: int, numerics: Numerics) -> torch.Tensor:
    """float32 features of uint8 ``images``, embedded in ``eval.precision`` and
    the run's memory format (training's evaluations and ``fslab eval`` alike)."""
    return extract_features(network, images, batch_size, numerics.device,
                            lambda batch: numerics.memory_format(to_input(batch)),
                            autocast=lambda: numerics.autocast(numerics.eval_precision))
