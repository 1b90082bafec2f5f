"""SGD and Adam exactly as ``torch.optim`` has them, without importing ``torch._dynamo``.

``torch.optim`` wraps an optimizer's methods so that ``torch.compile`` never
traces into them: ``add_param_group``, ``zero_grad``, ``state_dict`` and
``load_state_dict`` are disabled for dynamo, and ``step`` breaks the graph
around itself. Each wrapper imports ``torch._dynamo`` on its first call, and
that import is about 2.3 s of every run's start on a 2-core CPU, more than a
third of a short run (and of the test suite's CPU time). fslab calls the
optimizer only outside compiled code (``train.compile`` compiles the backbone
and the loss, never the step), where the wrappers do nothing but that import.

So these subclasses call the functions the wrappers wrap: the same arithmetic
and the same ``state_dict``, bit for bit, as ``tests/test_optimizers.py``
checks against ``torch.optim`` itself. ``step`` runs under ``torch.no_grad()``,
as the wrapper does for an optimizer that is not ``differentiable`` (fslab's
never are). Where a torch version has no such wrapper, ``inspect.unwrap``
returns the method itself and nothing changes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch.optim import SGD, Adam, Optimizer

_ADD_PARAM_GROUP = inspect.unwrap(Optimizer.add_param_group)
_ZERO_GRAD = inspect.unwrap(Optimizer.zero_grad)
_STATE_DICT = inspect.unwrap(Optimizer.state_dict)
_LOAD_STATE_DICT = inspect.unwrap(Optimizer.load_state_dict)


class _Unwrapped:
    """The methods every optimizer shares, called without their dynamo wrappers;
    ``_step`` is the subclass's own unwrapped ``step``."""

    _step: Callable

    def add_param_group(self, param_group: dict) -> None:
        _ADD_PARAM_GROUP(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _ZERO_GRAD(self, set_to_none)

    def state_dict(self) -> dict:
        return _STATE_DICT(self)

    def load_state_dict(self, state_dict: dict) -> None:
        _LOAD_STATE_DICT(self, state_dict)

    def step(self, closure=None):
        with torch.no_grad():
            return self._step(closure)


class EagerSGD(_Unwrapped, SGD):
    """``torch.optim.SGD`` for code that is never compiled."""

    _step = inspect.unwrap(SGD.step)


class EagerAdam(_Unwrapped, Adam):
    """``torch.optim.Adam`` for code that is never compiled."""

    _step = inspect.unwrap(Adam.step)
