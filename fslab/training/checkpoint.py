"""A run's checkpoint: one dict in ``checkpoints/last.pt``, rewritten after every epoch.

Its keys are ``model, head, optimizer, loss, scheduler, epoch, step, config,
best_val, train_mean, rng`` (and ``grad_scaler`` for an fp16 run): every state a resumed run needs to continue
exactly where the interrupted one stopped (the RNG streams included), and what
``fslab eval`` needs (the weights, the training mean used for centring).
Checkpoints written by earlier fslab versions have the same keys.

Training writes them with a :class:`CheckpointWriter`: the epoch's state is
copied to host memory at once, and the file is written in a background thread
while the next epoch trains (on an H100 the write of a ResNet-12 checkpoint,
about 100 MB, took 0.18 s of every epoch).
"""

from __future__ import annotations

import contextlib
import copy
import random
import re
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

from fslab.core.errors import FslabError
from fslab.core.files import archive_damage, written_whole


def rng_state(augment_rng: torch.Generator, device: torch.device) -> dict:
    """Every random stream training draws from: torch's global one (weights,
    samplers, dropout), the augmentation generator, Python's, and CUDA's."""
    return {"torch": torch.get_rng_state(), "augment": augment_rng.get_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else []}


def restore_rng(saved: dict, augment_rng: torch.Generator) -> None:
    torch.set_rng_state(saved["torch"])
    augment_rng.set_state(saved["augment"])
    random.setstate(saved["python"])
    if saved["cuda"]:
        torch.cuda.set_rng_state_all(saved["cuda"])


def training_checkpoint(*, model: nn.Module, head: nn.Module, loss_fn, optimizer: torch.optim.Optimizer,
                        scheduler, epoch: int, step: int, config: dict, best_val: float | None,
                        train_mean: torch.Tensor | None, augment_rng: torch.Generator, device: torch.device,
                        scaler: torch.amp.GradScaler | None = None) -> dict:
    """The checkpoint of a run at the end of ``epoch`` (after ``step`` steps).
    ``loss`` holds the loss's own parameters (a learned classifier), if any;
    ``grad_scaler`` fp16's loss scale, when the run trains in fp16."""
    extra = {} if scaler is None else {"grad_scaler": scaler.state_dict()}
    return {**extra,
        "model": model.state_dict(), "head": head.state_dict(), "optimizer": optimizer.state_dict(),
        "loss": loss_fn.state_dict() if isinstance(loss_fn, nn.Module) else {},
        "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step, "config": config, "best_val": best_val,
        "train_mean": train_mean, "rng": rng_state(augment_rng, device),
    }


def finite_flags(tensors: dict) -> dict[str, bool]:
    """Whether each floating-point tensor of ``tensors`` (name -> tensor) is finite. One device sync."""
    named = [(name, tensor) for name, tensor in tensors.items()
             if isinstance(tensor, torch.Tensor) and tensor.is_floating_point()]
    if not named:
        return {}
    flags = [torch.isfinite(tensor).all() for _, tensor in named]
    finite = torch.stack([flag.to(flags[0].device) for flag in flags]).tolist()  # a plugin's state may be elsewhere
    return {name: ok for (name, _), ok in zip(named, finite, strict=True)}


def finite_names(tensors: dict) -> set[str]:
    """The names of the floating-point tensors of ``tensors`` that are finite now: what
    :func:`nonfinite_entry` watches, so that a buffer infinite by design (an attention mask of -inf)
    is left alone while one that was finite and overflowed (a batch-norm variance) is not."""
    return {name for name, ok in finite_flags(tensors).items() if ok}


def nonfinite_entry(tensors: dict, among: set[str] | None = None) -> str | None:
    """The first floating-point tensor of ``tensors`` (name -> tensor, as a state dict holds them; of
    those named in ``among``, where given) that holds a NaN or an infinity, as
    ``"blocks.5.running_var holds inf"``; None when every one is finite. One device sync."""
    watched = tensors if among is None else {name: tensor for name, tensor in tensors.items() if name in among}
    for name, ok in finite_flags(watched).items():
        if not ok:
            return f"{name} holds {'nan' if torch.isnan(watched[name]).any() else 'inf'}"
    return None


def mismatch_reason(exc: BaseException) -> str:
    """The first line of torch's ``load_state_dict`` error that says what is wrong
    (its first line only names the network), shortened."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = lines[1] if len(lines) > 1 else (lines[0] if lines else type(exc).__name__)
    reason = re.sub(r"torch\.Size\((\[[^\]]*\])\)", r"\1", reason)  # both shapes fit in the line
    return reason if len(reason) <= 160 else reason[:157] + "..."


def restore_training(checkpoint: dict, *, model: nn.Module, head: nn.Module, loss_fn,
                     optimizer: torch.optim.Optimizer, scheduler, augment_rng: torch.Generator,
                     scaler: torch.amp.GradScaler | None = None) -> None:
    """Put every state of :func:`training_checkpoint` back, RNG streams last."""
    if scaler is not None and "grad_scaler" in checkpoint:
        scaler.load_state_dict(checkpoint["grad_scaler"])
    model.load_state_dict(checkpoint["model"])
    head.load_state_dict(checkpoint["head"])
    if isinstance(loss_fn, nn.Module):
        loss_fn.load_state_dict(checkpoint["loss"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    restore_rng(checkpoint["rng"], augment_rng)


def save_checkpoint(path: Path, checkpoint: dict) -> None:
    """Write ``checkpoint`` atomically: a reader (``fslab eval``, a resume after a
    crash) sees the previous complete file or the new one, never half of one.
    A write that fails (a full disk) leaves the previous checkpoint and no
    temporary file, and says so in one line."""
    try:  # anything else (a state that cannot be pickled) leaves no half file either
        with written_whole(path, durable=True) as tmp:  # a checkpoint is what a machine's crash must not take
            torch.save(checkpoint, tmp)
    except (OSError, RuntimeError) as exc:  # torch reports a failed write as a RuntimeError
        kept = "the previous checkpoint is kept" if path.exists() else "the run has no earlier checkpoint"
        raise FslabError(f"cannot write the checkpoint {path}: {write_failure(exc, path)}; {kept}") from exc


def write_failure(exc: BaseException, path: Path) -> str:
    """Why a write of ``path`` failed (a checkpoint, a feature cache). torch's own message for a
    full disk names no cause ("unexpected pos 64 vs 0"), so the free space is looked at."""
    try:
        free = shutil.disk_usage(path.parent).free
        needed = max(path.stat().st_size if path.exists() else 0, 1 << 20)
    except OSError:
        return _first_line(exc)
    if free < needed:
        return f"No space left on device ({free} bytes free)"
    return _first_line(exc)


def host_copy(state):
    """``state`` with every tensor in it copied to host memory: a snapshot that
    later training steps, which change the weights in place, cannot touch.
    Containers keep their type and attributes (a state dict's ``OrderedDict``
    with its ``_metadata``, a schedule's ``Counter`` of milestones), so the
    file is what writing ``state`` itself would have written."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        copied = copy.copy(state)
        for key, value in state.items():
            copied[key] = host_copy(value)
        return copied
    if isinstance(state, list):
        return [host_copy(value) for value in state]
    if isinstance(state, tuple):
        values = [host_copy(value) for value in state]
        return type(state)(*values) if hasattr(state, "_fields") else type(state)(values)  # a named tuple
    return copy.deepcopy(state)


# What stops a training process: fslab stop and Ctrl-C, and a SLURM job's preemption (submitit's handler)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, *([signal.SIGUSR2] if hasattr(signal, "SIGUSR2") else []))


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """SIGTERM, SIGINT and SIGUSR2 (SLURM's notice of a preemption or of the time limit,
    on which a job requeues) that arrive meanwhile are held back and raised again at the
    end, to the handlers the process had. The handlers are swapped, not the signal
    mask: a process-wide signal may be delivered to any thread (the heartbeat's, a
    sink's), and Python then runs its handler in the main thread all the same. Only
    the main thread can swap handlers; elsewhere, and for a signal whose handler was
    not set from Python, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    held = {signum: handler for signum, handler in held.items() if handler is not None}
    for signum in held:
        signal.signal(signum, lambda number, frame: caught.append(number))
    try:
        yield
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)
        for signum in caught:
            signal.raise_signal(signum)


class CheckpointWriter:
    """Writes one run's checkpoints to ``path``, one at a time, each in a
    background thread so training goes on meanwhile.

    :meth:`submit` snapshots the checkpoint (:func:`host_copy`), waits for the
    previous write, announces this one (training logs its ``checkpoint``
    event) and only then starts writing it; :meth:`wait` returns once the last
    one is on disk. Each write is :func:`save_checkpoint`'s atomic one, so the
    file always holds a whole checkpoint, of the epoch announced last or an
    earlier one, never of an epoch the events do not name: a resume goes by the
    file's epoch and cuts the events back to that epoch's event. A failed write
    (a full disk) is raised by the next :meth:`submit` or :meth:`wait`. The
    thread is not a daemon: a process that stops lets its last write finish.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, checkpoint: dict, announce: Callable[[], object] = lambda: None) -> None:
        snapshot = host_copy(checkpoint)
        self.wait()
        # A stop signal waits while the event is logged and the write starts: it lands before the
        # event (the previous file stays, which the events name too) or once the write is under way
        # (which the stopping run lets finish), never between an event and its write. Landing there,
        # it left the first epoch's event without any file, and the run nothing to resume from
        # (a preempted SLURM job's requeue then trained the run again from its first step).
        with stop_signals_held():
            announce()
            self._thread = threading.Thread(target=self._write, args=(snapshot,), name="fslab-checkpoint")
            self._thread.start()

    def wait(self) -> None:
        """Block until the last submitted checkpoint is written; raise its failure."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Wait for the last write without raising its failure: for a run that
        is ending on another error or a stop, whose report that failure must
        not replace (the previous checkpoint is kept either way)."""
        try:
            self.wait()
        except Exception:  # noqa: BLE001 - the run already ends on its own error
            pass

    def _write(self, snapshot: dict) -> None:
        try:
            save_checkpoint(self.path, snapshot)
        except BaseException as exc:  # whatever it is, the training thread raises it, as a write there would
            self._error = exc


# What every checkpoint fslab writes holds (training_checkpoint; fslab 0.1's too): a reader
# checks them first, so a file of another shape is one line, not a KeyError in the middle.
CHECKPOINT_KEYS = ("model", "head", "optimizer", "loss", "scheduler", "epoch", "step", "config", "best_val",
                   "train_mean", "rng")


def load_checkpoint(path: Path, device: torch.device | str) -> dict:
    """A run's checkpoint (:func:`training_checkpoint`) on ``device``, read by
    :func:`read_checkpoint`; one without the keys every checkpoint holds is
    refused in one line, not met as a KeyError halfway through a resume; so is one with bytes
    changed since it was written, which torch would load as weights (:func:`archive_damage`)."""
    if path.exists() and (damage := archive_damage(path)) is not None:
        raise FslabError(f"the checkpoint {path} cannot be loaded: it {damage}")
    state = read_checkpoint(path, device)
    missing = [key for key in CHECKPOINT_KEYS if not isinstance(state, dict) or key not in state]
    if missing or not isinstance(state["epoch"], int) or not isinstance(state["model"], dict):
        raise FslabError(f"the checkpoint {path} is not one fslab wrote: "
                         + (f"it has no {', '.join(missing)}" if missing else "its epoch or model is of another kind"))
    return state


def read_checkpoint(path: Path, device: torch.device | str):
    """What a file written by :func:`save_checkpoint` holds, its tensors on
    ``device`` (:func:`load_saved`)."""
    return load_saved(path, device, what="the checkpoint")


def load_saved(path: Path, device: torch.device | str | None = None, what: str = "the file"):
    """What a file fslab saved with ``torch.save`` holds (a checkpoint, a
    feature cache), its tensors on ``device`` (None: where they were saved).
    ``weights_only``: such a file is data, and loading it must not run code. A
    file that would, or a damaged one, is a FslabError in one line naming
    ``what`` and the path."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except (OSError, RuntimeError, EOFError) as exc:  # unreadable, cut short: torch's first line says which
        raise FslabError(f"{what} {path} cannot be loaded: {_first_line(exc)}") from exc
    except Exception as exc:  # noqa: BLE001 (damaged bytes make the unpickler raise nearly anything)
        # not torch's own text: it advises weights_only=False, which would run what the file says
        why = ("it holds objects other than tensors and plain values, and loading them would run code: "
               "refused" if "Weights only load failed" in str(exc)
               else f"it is damaged, or not a file fslab wrote ({type(exc).__name__})")
        raise FslabError(f"{what} {path} cannot be loaded: {why}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
