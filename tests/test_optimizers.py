"""fslab's optimizers are torch.optim's, bit for bit, without importing torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from fslab.training.optimizers import EagerAdam, EagerSGD

CASES = [
    (torch.optim.SGD, EagerSGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}),
    (torch.optim.SGD, EagerSGD, {"lr": 0.05}),
    (torch.optim.Adam, EagerAdam, {"lr": 0.01, "weight_decay": 1e-4}),
]


def train(kind, params: dict, steps: int = 6, resume_at: int | None = None, resume_kind=None):
    """A small network trained with ``kind``; at ``resume_at`` its optimizer is
    rebuilt as ``resume_kind`` from the state_dict, as a resume does."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    optimizer = kind(net.parameters(), **params)
    schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, [3], gamma=0.1)
    x = torch.randn(16, 5)
    for step in range(steps):
        if step == resume_at:
            saved, saved_schedule = optimizer.state_dict(), schedule.state_dict()
            optimizer = resume_kind(net.parameters(), **params)
            optimizer.load_state_dict(saved)
            schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, [3], gamma=0.1)
            schedule.load_state_dict(saved_schedule)
        optimizer.zero_grad()
        net(x).pow(2).mean().backward()
        optimizer.step()
        schedule.step()
    return net.state_dict(), optimizer.state_dict()


@pytest.mark.parametrize("torch_kind, ours, params", CASES, ids=["sgd-nesterov", "sgd-plain", "adam"])
def test_the_same_steps_and_state_as_torch_optim(torch_kind, ours, params):
    weights, state = train(ours, params)
    expected_weights, expected_state = train(torch_kind, params)
    assert all(torch.equal(weights[k], expected_weights[k]) for k in expected_weights)
    assert str(state) == str(expected_state)  # the state_dict a checkpoint saves
    # a checkpoint of either resumes into the other (old runs saved torch.optim's)
    for first, then in [(torch_kind, ours), (ours, torch_kind)]:
        resumed, _ = train(first, params, resume_at=3, resume_kind=then)
        assert all(torch.equal(resumed[k], expected_weights[k]) for k in expected_weights)


def test_training_with_them_never_imports_torch_dynamo():
    code = ("import sys\nimport torch\nfrom fslab.training.optimizers import EagerSGD\n"
            "net = torch.nn.Linear(3, 2)\nopt = EagerSGD(net.parameters(), lr=0.1, momentum=0.9)\n"
            "net(torch.randn(4, 3)).sum().backward()\nopt.step()\nopt.zero_grad()\n"
            "opt.load_state_dict(opt.state_dict())\n"
            "print('dynamo' if 'torch._dynamo' in sys.modules else 'no dynamo')\n"
            "torch.optim.SGD(net.parameters(), lr=0.1)\n"
            "print('dynamo' if 'torch._dynamo' in sys.modules else 'no dynamo')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["no", "dynamo", "dynamo"], done.stderr  # torch.optim's own would import it
