"""eval.val_every: validation after every N-th epoch and after the last, without changing what
the run learns; fslab eval computes the training mean a checkpoint of an unvalidated epoch lacks."""

from __future__ import annotations

import json

import pytest
import torch

from .runs_helpers import TINY, events, fslab_here, train_run

RUN = [*TINY, "--epochs", "3", "--device", "cpu"]


def run(project, *extra):
    return train_run(project, "nca", *RUN, *extra)


def evaluate(project, folder) -> list[float]:
    result = fslab_here("eval", folder.name, "--episodes", "40", "--json", cwd=project)
    assert result.returncode == 0, result.stderr[-2000:]
    return [json.loads(line)["accuracy"] for line in result.stdout.splitlines()]


@pytest.mark.slow
def test_validating_every_second_epoch_skips_the_others_and_trains_the_same_network(project):
    every, every_results = run(project)
    second, second_results = run(project, "--set", "eval.val_every=2")
    assert [e["epoch"] for e in events(every, "eval") if e["split"] == "val"] == [1, 2, 3]
    assert [e["epoch"] for e in events(second, "eval") if e["split"] == "val"] == [2, 3]  # the last always
    assert [e["epoch"] for e in events(second, "checkpoint")] == [1, 2, 3]  # a checkpoint after every epoch
    # validation draws from its own generators and leaves batch norm alone: the same losses and test
    assert [e["loss"] for e in events(second, "train")] == [e["loss"] for e in events(every, "train")]
    assert second_results == every_results

    # A checkpoint of an epoch that was not validated holds no training mean; fslab eval computes
    # it as training does, so it scores exactly as with the mean training kept.
    path = second / "checkpoints" / "last.pt"
    kept = evaluate(project, second)
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["train_mean"] is not None
    checkpoint["train_mean"] = None
    torch.save(checkpoint, path)
    assert evaluate(project, second) == kept
