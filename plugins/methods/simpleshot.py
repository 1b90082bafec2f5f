"""SimpleShot: cross-entropy pre-training, nearest-centroid evaluation.

Wang, Chao, Weinberger & van der Maaten, "SimpleShot: Revisiting
Nearest-Neighbor Classification for Few-Shot Learning", 2019, arXiv:1911.04623.

No episodes and no metric loss: the backbone is trained as an ordinary
classifier over the training classes (a linear layer and softmax cross-entropy
on i.i.d. mini-batches), the classifier is thrown away, and novel classes are
recognised by the nearest centroid of features that were centred by the mean
training feature and L2-normalised (their "CL2N"), which is fslab's default
evaluation. The NCA paper uses it as the strong non-episodic baseline of its
Tables 3 and 4.

The loss holds the linear classifier, so it is an ``nn.Module`` (in
:mod:`fslab_plugins.methods.classifier`, registered lazily); fslab passes it the
embedding size and the number of training classes.
"""

from __future__ import annotations

from fslab.plugin import hookimpl

PAPER = "Wang, Chao, Weinberger & van der Maaten, SimpleShot, 2019 (arXiv:1911.04623)"


@hookimpl
def register_losses(register):
    register(
        "fslab_plugins.methods.classifier:LinearClassifierLoss",
        name="simpleshot",
        description="Softmax cross-entropy of a linear classifier over the training classes (training only).",
        paper=PAPER,
        params={"bias": True},
        episodic=False,
    )


@hookimpl
def register_methods(register):
    register(
        {"loss": {"name": "simpleshot"}, "sampler": {"name": "iid"}, "evaluator": {"name": "centroid"}},
        name="simpleshot",
        description="Cross-entropy pre-training on i.i.d. batches, CL2N nearest-centroid evaluation.",
        paper="Laenen & Bertinetto, NeurIPS 2021, Tables 3-4 'SimpleShot'; " + PAPER,
    )
