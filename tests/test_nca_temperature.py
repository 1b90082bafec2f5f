"""The NCA loss with a learned temperature: the same loss as ``nca`` at its
current temperature, a gradient for log T that matches the loss's own slope,
and a real run that trains T, logs it and restores it on resume."""

from __future__ import annotations

import json
import math

import pytest
import torch
from fslab_plugins.methods.nca import nca

from .runs_helpers import TINY, events, fslab


def test_it_is_nca_at_its_temperature_with_the_same_gradient(registry, make_class_batch):
    z, labels = make_class_batch(4, 5)
    learned = registry.create("loss", "nca-learned-temperature", temperature=0.7)
    out = learned(z, labels)
    t = float(out.extra["temperature"])  # log 0.7 is kept in float32
    assert t == pytest.approx(0.7, rel=1e-6)
    fixed = nca(z, labels, temperature=t)
    assert torch.allclose(out.loss, fixed.loss, atol=1e-12, rtol=0)
    assert (int(out.positives), int(out.negatives)) == (int(fixed.positives), int(fixed.negatives))
    (grad_learned,) = torch.autograd.grad(out.loss, z)
    (grad_fixed,) = torch.autograd.grad(nca(z, labels, temperature=t).loss, z)
    assert torch.allclose(grad_learned, grad_fixed, atol=1e-12, rtol=0)


def test_the_gradient_of_log_t_is_the_slope_of_the_loss(registry, make_class_batch):
    """d loss / d log T against a central difference of nca in T = e^s."""
    z, labels = make_class_batch(3, 4)
    z = z.detach()
    learned = registry.create("loss", "nca-learned-temperature", temperature=1.3)
    learned(z, labels).loss.backward()
    s, h = float(learned.log_temperature.detach()), 1e-6
    def at(log_t):
        return nca(z, labels, temperature=math.exp(log_t)).loss

    slope = (at(s + h) - at(s - h)) / (2 * h)
    assert float(learned.log_temperature.grad) == pytest.approx(float(slope), rel=1e-6)
    assert [name for name, _ in learned.named_parameters()] == ["log_temperature"]


def test_a_bad_starting_temperature_is_refused_in_one_line(project):
    result = fslab("run", "nca", *TINY, "--set", "loss.name=nca-learned-temperature", "--set",
                   "loss.temperature=0", cwd=project)
    assert result.returncode != 0 and "loss.temperature must be > 0" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (project / "runs").exists()


@pytest.mark.slow
def test_a_run_trains_logs_and_checkpoints_the_temperature(project):
    result = fslab("run", "nca", *TINY, "--epochs", "2", "--set", "loss.name=nca-learned-temperature",
                   "--set", "loss.temperature=2.0", "--set", "train.lr=0.5", cwd=project)
    assert result.returncode == 0, result.stderr
    (run_dir,) = (project / "runs").iterdir()
    logged = [e["temperature"] for e in events(run_dir, "train")]
    assert len(logged) >= 4 and logged[0] == pytest.approx(2.0, rel=0.05)
    assert len(set(logged)) > 1  # trained, not fixed
    checkpoint = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    saved = math.exp(float(checkpoint["loss"]["log_temperature"]))
    # logged before each step, saved after the last one: nearer the last logged value than the first
    assert abs(saved - logged[-1]) < abs(saved - logged[0])
    assert json.loads((run_dir / "config.json").read_text())["loss"] == {
        "name": "nca-learned-temperature", "temperature": 2.0, "pair_fraction": 1.0}
