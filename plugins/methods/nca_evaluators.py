"""The NCA paper's other test-time classifiers: k-NN, soft assignment, and
fine-tuning the network on each support set.

Laenen & Bertinetto, "On Episodes, Prototypical Networks, and Few-Shot
Learning", NeurIPS 2021, arXiv:2012.09831, Sec. 3.4 (Table 2) and App. A.1
(Table 5).

The paper compares three ways to classify a query once the embedding is
trained: the majority label of its k nearest support points (k = shots), the
nearest class centroid (:func:`fslab_plugins.methods.nca.centroid`, the default and
the best in Table 2), and NCA's own soft assignment — the class whose support
points hold most of the query's softmax over negative squared distances.
App. A.1 adds a slow, stronger option: minimise the NCA loss on the support
set by fine-tuning the whole network before classifying (5-shot only: one
image per class has no positive pair).

A feature-based evaluator receives episodes of already centred and
L2-normalised features, ``support [E, w, n, d]`` and ``query [E, Q, d]``,
and returns each query's way ``long [E, Q]``. The fine-tuning evaluator is
model-aware (``needs_model``): the evaluation core hands it a copy of the
network and one episode's uint8 images, and restores the weights after every
episode (see :mod:`fslab.training.evaluation`). torch is imported inside functions.
"""

from __future__ import annotations

from fslab_plugins.methods.nca import check_temperature

from fslab.plugin import UsageError, at_least, hookimpl, one_of, positive

PAPER = (
    "Laenen & Bertinetto, On Episodes, Prototypical Networks, and Few-Shot Learning, NeurIPS 2021 "
    "(arXiv:2012.09831)"
)


KNN_TIES = ("nearest", "smallest")


def knn(support, query, *, k: int = 0, ties: str = "nearest"):
    """Majority vote of the ``k`` nearest support points in squared Euclidean
    distance (Sec. 3.4); ``k = 0`` means k = shots, the paper's choice.

    Deterministic ties: support points at equal distance are ordered by
    their index (way by way, shot by shot; a stable sort). Among ways with
    equally many votes, ``ties="nearest"`` picks the one whose nearest voter
    ranks first; ``ties="smallest"`` picks the smallest way index. The NCA
    authors' code takes the smallest dataset label among the tied classes
    (``scipy.stats.mode``); fslab draws an episode's ways in random order, so
    the smallest way index is, like their smallest label, a tied class chosen
    without regard to which one is right: the same rule in distribution,
    which is what their k-NN table measured.
    """
    import torch
    from fslab_plugins.methods.nca import squared_distances

    episodes, ways, shots, _ = support.shape
    k = shots if k == 0 else k
    if not 1 <= k <= ways * shots:
        raise UsageError(f"knn: k must be between 1 and the {ways * shots} support points (0 = shots), got {k}")
    check_knn({"k": k, "ties": ties})
    d = squared_distances(query, support.flatten(1, 2))  # [E, Q, w*n]
    # The k nearest by (distance, index). topk orders equal distances
    # arbitrarily, so rows where equal distances reach the k nearest are
    # ranked again exactly, by counting (rare: exact ties need equal features).
    values, nearest = d.topk(min(k + 1, ways * shots), dim=-1, largest=False, sorted=True)
    tied = (values[..., 1:] == values[..., :-1]).any(dim=-1)
    if bool(tied.any()):
        points = torch.arange(ways * shots, device=query.device)
        rows = d[tied]
        before = ((rows[:, None, :] < rows[:, :, None])
                  | ((rows[:, None, :] == rows[:, :, None]) & (points < points[:, None])))
        nearest = nearest.clone()
        nearest[tied] = before.sum(dim=-1).argsort(dim=-1)[:, : nearest.shape[-1]]  # ranks are distinct
    nearest = nearest[..., :k]
    voter_way = torch.div(nearest, shots, rounding_mode="floor")  # [E, Q, k]
    votes = torch.zeros(*query.shape[:2], ways, dtype=torch.long, device=query.device)
    votes.scatter_add_(-1, voter_way, torch.ones_like(voter_way))
    if ties == "smallest":
        return votes.argmax(dim=-1)  # the first of equal maxima: the smallest way index
    ranks = torch.arange(k, device=query.device).expand_as(voter_way)
    first = torch.full_like(votes, k).scatter_reduce(-1, voter_way, ranks, reduce="amin")  # nearest voter; k: none
    return (votes * (k + 1) + (k - first)).argmax(dim=-1)


def soft(support, query, *, temperature: float = 1.0):
    """Soft assignment, "what the original NCA paper used for evaluation"
    (Sec. 3.4): ``p_ij = exp(-d_ij / T) / sum_k exp(-d_ik / T)`` over every
    support point j, with d the squared Euclidean distance; the query takes
    the class k maximising ``sum_{j in S_k} p_ij``. ``temperature`` is the
    NCA loss's (the paper's formula is T = 1). The shared denominator does not
    change the argmax, so classes are compared by a per-class log-sum-exp.
    Ties go to the lower way index.
    """
    from fslab_plugins.methods.nca import squared_distances

    check_soft({"temperature": temperature})
    episodes, ways, shots, _ = support.shape
    logits = -squared_distances(query, support.flatten(1, 2)) / temperature  # [E, Q, w*n]
    return logits.view(episodes, query.shape[1], ways, shots).logsumexp(dim=-1).argmax(dim=-1)


class FineTune:
    """Fine-tune the whole network on each episode's support set by
    minimising the NCA loss over its images (App. A.1, Table 5), then classify
    the queries by the nearest centroid of the fine-tuned embedding.

    The paper's setting: ``epochs`` = 5 passes of Adam (lr 1e-4, weight decay
    5e-4) over the support set; with a 25-image support set a pass is one
    full-batch step. Only for shots >= 2 ("there are not enough positive
    distances in the 1-shot case"). Choices the paper leaves open: batch norm
    stays in eval mode (running statistics fixed, so the network adapts its
    weights, not its statistics, to 25 images), no augmentation, the NCA loss
    on the backbone's output (a training-only projection head is not used),
    and features are centred with the stored training mean of the network
    before fine-tuning (recomputing it per episode would embed the training
    set every time).

    It is slow by nature (a backward pass per step per episode), so it runs
    ``default_episodes`` = 100 episodes unless more are asked for.
    """

    needs_model = True
    default_episodes = 100

    def __init__(self, *, epochs: int = 5, lr: float = 1e-4, weight_decay: float = 5e-4, temperature: float = 1.0):
        check_finetune({"epochs": epochs, "lr": lr, "weight_decay": weight_decay, "temperature": temperature})
        self.epochs, self.lr, self.weight_decay, self.temperature = epochs, lr, weight_decay, temperature

    def adapt(self, model, support_images, *, to_input, device) -> list[float]:
        """Minimise the NCA loss of the support set in place; returns the loss
        before each step."""
        import torch
        from fslab_plugins.methods.nca import nca

        ways, shots = support_images.shape[:2]
        if shots < 2:
            raise UsageError(
                "finetune needs at least 2 shots: the NCA loss of a 1-shot support set has no positive pair "
                "(NCA paper App. A.1); evaluate it with --shots 5"
            )
        x = to_input(support_images.flatten(0, 1).to(device))
        y = torch.arange(ways, device=device).repeat_interleave(shots)
        optimizer = torch.optim.Adam(model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        was_training = model.training
        model.eval()
        losses = []
        try:
            with torch.enable_grad():
                for _ in range(self.epochs):
                    loss = nca(model(x), y, temperature=self.temperature).loss
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    losses.append(float(loss.detach()))
        finally:
            model.train(was_training)
        return losses

    def __call__(self, model, support_images, query_images, *, to_input, device, center=None, normalize=True):
        import torch
        import torch.nn.functional as F
        from fslab_plugins.methods.nca import centroid

        ways, shots = support_images.shape[:2]
        self.adapt(model, support_images, to_input=to_input, device=device)
        model.eval()
        with torch.no_grad():
            z = model(to_input(torch.cat([support_images.flatten(0, 1), query_images]).to(device))).float()
        if center is not None:
            z = z - center.to(z)
        if normalize:
            z = F.normalize(z, dim=1)
        support, query = z[: ways * shots].view(1, ways, shots, -1), z[ways * shots :][None]
        return centroid(support, query)[0]


# -- parameter checks, run by the evaluators and by fslab before a run exists (register(check=...)),
# where they also see the episodes a training run evaluates with.


def evaluated_shots(context) -> list[int]:
    """The shots a training run evaluates with: eval.val_shots after each epoch, eval.shots at the end."""
    return [context.config["eval"]["val_shots"], *context.config["eval"]["shots"]]


def check_knn(params: dict, context=None) -> None:
    k = params["k"]
    if params["ties"] not in KNN_TIES:
        raise UsageError(f"knn: evaluator.ties must be one of {', '.join(KNN_TIES)}, got {params['ties']!r}")
    if k < 0:
        raise UsageError(f"knn: evaluator.k must be 0 (k = shots) or a number of neighbours >= 1, got {k}")
    if context is not None and k > 0:
        points = context.config["eval"]["ways"] * min(evaluated_shots(context))
        if k > points:
            raise UsageError(f"knn: evaluator.k must be between 1 and the {points} support points of the run's "
                             f"smallest episodes (eval.ways × the fewest of eval.shots and eval.val_shots), "
                             f"or 0 (k = shots), got {k}")


def check_soft(params: dict, context=None) -> None:
    check_temperature("soft", params["temperature"], "evaluator.temperature")


def check_finetune(params: dict, context=None) -> None:
    epochs, lr, weight_decay, temperature = (params[k] for k in ("epochs", "lr", "weight_decay", "temperature"))
    if epochs < 1 or not lr > 0 or weight_decay < 0 or not temperature > 0:
        raise UsageError(
            f"finetune: needs evaluator.epochs >= 1, evaluator.lr > 0, evaluator.weight_decay >= 0 and "
            f"evaluator.temperature > 0; got epochs={epochs}, lr={lr}, weight_decay={weight_decay}, "
            f"temperature={temperature}"
        )
    if context is not None and min(evaluated_shots(context)) < 2:
        raise UsageError(f"finetune needs at least 2 shots (the NCA loss of a 1-shot support set has no positive "
                         f"pair); eval.shots and eval.val_shots must all be >= 2, got eval.shots="
                         f"{context.config['eval']['shots']}, eval.val_shots={context.config['eval']['val_shots']}")


@hookimpl
def register_evaluators(register):
    register(knn, name="knn", paper=f"{PAPER}, Sec. 3.4", check=check_knn,
             allowed={"k": at_least(0), "ties": one_of(*KNN_TIES)},
             description="Majority vote of the k nearest support points (k = 0: k = shots); tied votes go to the "
                         "nearer voter (ties=nearest) or the smallest label (ties=smallest, the NCA code's rule).")
    register(soft, name="soft", paper=f"{PAPER}, Sec. 3.4", check=check_soft,
             description="NCA soft assignment: class with the largest sum of softmax(-d²/T) over its support points.")
    register(FineTune, name="finetune", paper=f"{PAPER}, App. A.1 (Table 5)", check=check_finetune,
             allowed={"epochs": at_least(1), "lr": positive(), "weight_decay": at_least(0)},
             description="Fine-tune the whole network on each support set (NCA loss, Adam, 5 epochs), then "
             "nearest centroid. Slow: 100 episodes unless --episodes says otherwise; shots >= 2.")
