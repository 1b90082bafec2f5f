"""Every evaluator against a slow explicit-loop reference written from its
paper, the model-aware core (fine-tuning), and ``fslab eval --evaluator``
end to end on one tiny trained run."""

from __future__ import annotations

import functools
import json
import math
import os
import shutil

import hypothesis
import pytest
import torch
from fslab_plugins.methods.map import RetrievalMAP, ap_classify
from fslab_plugins.methods.nca import centroid
from fslab_plugins.methods.nca_evaluators import FineTune, knn, soft
from fslab_plugins.methods.sen import sen_nearest
from hypothesis import given
from hypothesis import strategies as st

from fslab.core.errors import UsageError
from fslab.training import evaluation

from .conftest import BUILTIN_PLUGINS
from .runs_helpers import TINY, fslab


def random_episodes(episodes=6, ways=4, shots=3, queries=5, dim=6, seed=0, spread=1.0):
    """float64 support [E, w, n, d] and query [E, w*q, d] with class structure."""
    g = torch.Generator().manual_seed(seed)
    means = spread * torch.randn(episodes, ways, 1, dim, generator=g, dtype=torch.float64)
    support = means + torch.randn(episodes, ways, shots, dim, generator=g, dtype=torch.float64)
    query = (means + torch.randn(episodes, ways, queries, dim, generator=g, dtype=torch.float64)).flatten(1, 2)
    return support, query


def sq(a, b):
    return sum((float(x) - float(y)) ** 2 for x, y in zip(a, b))


def cosine(a, b):
    dot = sum(float(x) * float(y) for x, y in zip(a, b))
    return dot / math.sqrt(sum(float(x) ** 2 for x in a) * sum(float(y) ** 2 for y in b))


# -- k-NN ---------------------------------------------------------------------


def knn_reference(support, query, k, ties="nearest"):
    """Majority label of the k nearest support points; equal votes go to the
    way whose nearest voter comes first (distance, then support index), or with
    ``ties="smallest"`` to the smallest of them, as scipy.stats.mode counts."""
    episodes, ways, shots, _ = support.shape
    out = []
    for e in range(episodes):
        points = [(w, support[e, w, s]) for w in range(ways) for s in range(shots)]
        row = []
        for q in query[e]:
            ranked = sorted(range(len(points)), key=lambda j: (sq(q, points[j][1]), j))[:k]
            votes = [0] * ways
            first = [k] * ways
            for rank, j in enumerate(ranked):
                way = points[j][0]
                votes[way] += 1
                first[way] = min(first[way], rank)
            if ties == "smallest":
                row.append(votes.index(max(votes)))
            else:
                row.append(max(range(ways), key=lambda w: (votes[w], -first[w])))
        out.append(row)
    return torch.tensor(out)


@pytest.mark.parametrize("k", [0, 1, 2, 3, 7])
def test_knn_matches_brute_force(k):
    support, query = random_episodes(seed=k)
    expected = knn_reference(support, query, k or support.shape[2])
    assert torch.equal(knn(support, query, k=k), expected)


def test_knn_ties_are_broken_by_the_nearest_voter():
    # 2 ways × 2 shots on a line; the query at 0 has neighbours at 1 (way 1), 2 (way 0),
    # 3 (way 0), 4 (way 1): with k = 2 both ways get a vote and way 1's voter is nearer.
    support = torch.tensor([[[[2.0], [3.0]], [[1.0], [4.0]]]])
    query = torch.tensor([[[0.0]]])
    assert knn(support, query, k=2).tolist() == [[1]]
    assert knn(support, query, k=3).tolist() == [[0]]  # two votes for way 0
    # equal distances: the lower support index (way 0) ranks first
    support = torch.tensor([[[[1.0]], [[-1.0]]]])
    assert knn(support, query, k=1).tolist() == [[0]]


def test_knn_ties_smallest_takes_the_smallest_tied_way():
    # 3 ways × 2 shots on a line, k = 3: the query at 0 sees way 2 at 1, way 1 at 2 and way 0 at 3.
    support = torch.tensor([[[[3.0], [9.0]], [[2.0], [8.0]], [[1.0], [7.0]]]])
    query = torch.tensor([[[0.0]]])
    assert knn(support, query, k=3).tolist() == [[2]]  # one vote each: the nearest voter's way
    assert knn(support, query, k=3, ties="smallest").tolist() == [[0]]  # one vote each: the smallest way
    assert knn(support, query, k=4, ties="smallest").tolist() == [[2]]  # way 2 has 2 votes (1 and 7)
    assert knn(support, query, k=1, ties="smallest").tolist() == [[2]]  # no tie: the nearest point


def test_knn_ties_smallest_matches_a_mode_reference():
    """The smallest of the most frequent ways among the k nearest, as scipy.stats.mode counts."""
    support, query = random_episodes(episodes=8, ways=5, shots=4, seed=11, spread=0.2)
    for k in (2, 4, 6):
        expected = knn_reference(support, query, k, ties="smallest")
        assert torch.equal(knn(support, query, k=k, ties="smallest"), expected)


def test_knn_refuses_an_unknown_tie_rule():
    support, query = random_episodes(ways=2, shots=2)
    with pytest.raises(UsageError, match="evaluator.ties must be one of nearest, smallest, got 'random'"):
        knn(support, query, k=1, ties="random")


@pytest.mark.parametrize("k", [1, 2, 4])
def test_knn_with_duplicated_support_points_matches_brute_force(k):
    # exact distance ties between ways, in some rows of a batch only
    support, query = random_episodes(episodes=8, seed=30 + k, spread=0.3)
    support[::2, 2, 1] = support[::2, 0, 0]
    support[::2, 1, 2] = support[::2, 3, 0]
    query[::2, :4] = support[::2, 0, 0][:, None] * 0.5
    assert torch.equal(knn(support, query, k=k), knn_reference(support, query, k))


def test_knn_rejects_a_k_larger_than_the_support_set():
    support, query = random_episodes(ways=2, shots=2)
    with pytest.raises(UsageError, match="k must be between 1 and the 4 support points"):
        knn(support, query, k=5)


# -- soft assignment ------------------------------------------------------------


def soft_reference(support, query, temperature):
    """NCA paper Sec. 3.4: p_ij = exp(-d_ij) / sum_k exp(-d_ik); argmax_k sum_{j in S_k} p_ij."""
    episodes, ways, shots, _ = support.shape
    out = []
    for e in range(episodes):
        row = []
        for q in query[e]:
            weights = [[math.exp(-sq(q, support[e, w, s]) / temperature) for s in range(shots)] for w in range(ways)]
            total = sum(map(sum, weights))
            likelihood = [sum(ws) / total for ws in weights]
            row.append(max(range(ways), key=lambda w: likelihood[w]))
        out.append(row)
    return torch.tensor(out)


@pytest.mark.parametrize("temperature", [1.0, 0.3, 4.0])
def test_soft_assignment_matches_the_formula(temperature):
    support, query = random_episodes(seed=3, spread=0.6)
    predicted = soft(support, query, temperature=temperature)
    assert torch.equal(predicted, soft_reference(support, query, temperature))


def test_soft_assignment_differs_from_centroid_and_knn_somewhere():
    # The three rules are different rules: on enough random queries they disagree.
    support, query = random_episodes(episodes=40, seed=5, spread=0.4)
    s, c, k = soft(support, query), centroid(support, query), knn(support, query)
    assert not torch.equal(s, c) and not torch.equal(s, k)


# -- mAP paper: AP classification and retrieval mAP ----------------------------


def average_precision(relevance):
    """AP of a ranking given as 0/1 relevances, best first (mAP paper Sec. 3.1)."""
    hits, total = 0, 0.0
    for position, relevant in enumerate(relevance, start=1):
        if relevant:
            hits += 1
            total += hits / position
    return total / hits


def ap_reference(support, query):
    episodes, ways, shots, _ = support.shape
    out = []
    for e in range(episodes):
        points = [(w, support[e, w, s]) for w in range(ways) for s in range(shots)]
        row = []
        for q in query[e]:
            ranked = sorted(range(len(points)), key=lambda j: (-cosine(q, points[j][1]), j))
            aps = [average_precision([points[j][0] == way for j in ranked]) for way in range(ways)]
            row.append(max(range(ways), key=lambda w: (aps[w], -w)))
        out.append(row)
    return torch.tensor(out)


@pytest.mark.parametrize("shots", [1, 2, 5])
def test_ap_classification_matches_the_definition(shots):
    support, query = random_episodes(shots=shots, seed=10 + shots, spread=0.7)
    assert torch.equal(ap_classify(support, query), ap_reference(support, query))


def test_one_shot_ap_classification_is_the_most_similar_support_point():
    support, query = random_episodes(shots=1, seed=4)
    unit_s = torch.nn.functional.normalize(support[:, :, 0], dim=-1)
    unit_q = torch.nn.functional.normalize(query, dim=-1)
    assert torch.equal(ap_classify(support, query), (unit_q @ unit_s.transpose(1, 2)).argmax(-1))


def retrieval_reference(pool):
    """pool [w, m, d]: every image ranks the other w*m - 1 by cosine similarity."""
    ways, per_class, _ = pool.shape
    items = [(w, pool[w, i]) for w in range(ways) for i in range(per_class)]
    aps = []
    for a, (way, x) in enumerate(items):
        others = sorted((b for b in range(len(items)) if b != a), key=lambda b: (-cosine(x, items[b][1]), b))
        aps.append(average_precision([items[b][0] == way for b in others]))
    return sum(aps) / len(aps)


def test_retrieval_map_matches_a_loop():
    evaluator = RetrievalMAP(images_per_class=4)
    assert evaluator.episode_shape == (1, 3) and evaluator.metric == "map"
    support, query = random_episodes(episodes=3, ways=3, shots=1, queries=3, seed=8, spread=0.8)
    scores = evaluator(support, query)
    pools = torch.cat([support, query.view(3, 3, 3, -1)], dim=2)
    expected = torch.tensor([retrieval_reference(p) for p in pools], dtype=scores.dtype)
    assert scores.shape == (3,) and torch.allclose(scores, expected)
    assert 0.3 < float(scores.mean()) < 1.0


def test_retrieval_map_on_hand_computed_cases():
    evaluator = RetrievalMAP(images_per_class=2)

    def score(pool):  # [w, m, d] -> the episode's mAP, pool drawn as 1 "shot" + the rest
        return evaluator(pool[None, :, :1], pool[None, :, 1:].flatten(1, 2)).item()

    # classes on orthogonal axes: every query retrieves its classmate first
    assert score(torch.tensor([[[1.0, 0.0], [1.0, 0.1]], [[0.0, 1.0], [0.1, 1.0]]])) == pytest.approx(1.0)
    # unit vectors at 0° and 105° (class 0), 90° and 200° (class 1): by angle, the
    # classmate comes 2nd, 3rd, 3rd and 2nd for the four queries: mAP = (1/2 + 1/3 + 1/3 + 1/2) / 4
    angles = torch.tensor([[0.0, 105.0], [90.0, 200.0]]).deg2rad()
    assert score(torch.stack([angles.cos(), angles.sin()], dim=-1)) == pytest.approx(5 / 12)
    with pytest.raises(UsageError, match="images_per_class must be >= 2"):
        RetrievalMAP(images_per_class=1)


def test_retrieval_map_through_the_core_uses_ten_images_per_class():
    labels = torch.arange(8).repeat_interleave(12)
    g = torch.Generator().manual_seed(0)
    features = torch.randn(len(labels), 5, generator=g) + 2.0 * torch.randn(8, 5, generator=g)[labels]
    evaluator = RetrievalMAP()
    assert evaluation.episode_shapes(evaluator, [1, 5], 15) == [(1, 9)]
    scores = evaluation.episode_scores(features, labels, evaluator, 5, 1, 9, 30, seed=0)
    assert scores.shape == (30,) and bool(((scores > 0) & (scores <= 1)).all())
    support, query = evaluation.sample_episodes(labels, 5, 1, 9, 30, seed=0)
    unit = torch.nn.functional.normalize(features, dim=1)
    pools = unit[torch.cat([support, query], dim=2)]  # [E, w, 10, d]
    expected = torch.tensor([retrieval_reference(p) for p in pools[:4]], dtype=torch.float64)
    assert torch.allclose(scores[:4].double(), expected, atol=1e-5)


# -- SEN -----------------------------------------------------------------------


@pytest.mark.parametrize("eps_pos", [1.0, 3.0])
def test_sen_evaluator_is_the_nearest_prototype_in_sen_dissimilarity(eps_pos):
    support, query = random_episodes(seed=21, spread=0.5)
    episodes, ways = support.shape[:2]
    expected = []
    for e in range(episodes):
        prototypes = [support[e, w].mean(0) for w in range(ways)]
        row = []
        for q in query[e]:
            d = [math.sqrt(sq(q, c) + eps_pos * (float(q.norm()) - float(c.norm())) ** 2) for c in prototypes]
            row.append(d.index(min(d)))
        expected.append(row)
    assert torch.equal(sen_nearest(support, query, eps_pos=eps_pos), torch.tensor(expected))


def test_the_sen_recipe_tests_with_the_sen_evaluator(registry):
    assert registry.create("method", "sen")["evaluator"] == {"name": "sen"}
    assert registry.create("method", "ring")["evaluator"] == {"name": "centroid"}


# -- fine-tuning (model-aware) ---------------------------------------------------


def tiny_network():
    from fslab_plugins.backbones.networks import Conv4

    torch.manual_seed(0)
    return Conv4(1, hidden=8)


def to_input(images):
    return images.float().div(127.5).sub(1.0)


def test_fine_tuning_lowers_the_nca_loss_on_the_support_set():
    from fslab_plugins.methods.nca import nca

    model = tiny_network()
    g = torch.Generator().manual_seed(1)
    support_images = torch.randint(0, 256, (3, 5, 1, 12, 12), generator=g, dtype=torch.uint8)
    labels = torch.arange(3).repeat_interleave(5)
    x = to_input(support_images.flatten(0, 1))

    def loss():
        model.eval()
        with torch.no_grad():
            return float(nca(model(x), labels).loss)

    before = loss()
    losses = FineTune(epochs=10, lr=1e-2).adapt(model, support_images, to_input=to_input, device="cpu")
    assert len(losses) == 10 and losses[0] == pytest.approx(before, rel=1e-5)
    assert loss() < 0.9 * before


def test_model_aware_core_restores_the_weights_after_every_episode():
    model = tiny_network()
    original = {k: v.clone() for k, v in model.state_dict().items()}
    seen = []

    class Recording(FineTune):
        def __call__(self, model, support_images, query_images, **kwargs):
            seen.append(all(torch.equal(v, original[k]) for k, v in model.state_dict().items()))
            return super().__call__(model, support_images, query_images, **kwargs)

    labels = torch.arange(4).repeat_interleave(8)
    images = torch.randint(0, 256, (len(labels), 1, 12, 12), generator=torch.Generator().manual_seed(2),
                           dtype=torch.uint8)
    evaluator = Recording(epochs=2, lr=1e-2)
    scores = evaluation.run_episodes(evaluator, labels, 3, 2, 3, 4, seed=0, model=model, images=images,
                                     to_input=to_input, device="cpu", center=torch.zeros(8))
    assert scores.shape == (4,) and bool(((scores >= 0) & (scores <= 1)).all())
    assert seen == [True] * 4  # every episode started from the original weights
    assert all(torch.equal(v, original[k]) for k, v in model.state_dict().items())  # caller's network untouched
    assert model.training  # and its mode too


def test_model_aware_accuracy_is_centroid_accuracy_when_nothing_is_learned():
    # lr = 0 leaves the network as it is: fine-tuning then scores exactly like
    # the cached-feature path on the same episodes (same stream, same centring).
    model = tiny_network()
    labels = torch.arange(5).repeat_interleave(9)
    images = torch.randint(0, 256, (len(labels), 1, 12, 12), generator=torch.Generator().manual_seed(3),
                           dtype=torch.uint8)
    center = torch.randn(8) * 0.1
    tuned = evaluation.run_episodes(FineTune(epochs=1, lr=1e-12, weight_decay=0.0), labels, 3, 2, 4, 6, seed=1,
                                    model=model, images=images, to_input=to_input, device="cpu", center=center)
    features = evaluation.extract_features(model, images, 16, "cpu", to_input)
    cached = evaluation.episode_scores(features, labels, centroid, 3, 2, 4, 6, seed=1, center=center)
    assert torch.equal(tuned, cached)


def test_fine_tuning_refuses_one_shot():
    model = tiny_network()
    with pytest.raises(UsageError, match="at least 2 shots"):
        FineTune().adapt(model, torch.zeros(3, 1, 1, 12, 12, dtype=torch.uint8), to_input=to_input, device="cpu")


def test_feature_path_refuses_a_model_aware_evaluator():
    with pytest.raises(UsageError, match="adapts the network"):
        evaluation.episode_scores(torch.randn(40, 4), torch.arange(4).repeat_interleave(10), FineTune(), 2, 2, 2, 3, 0)


# -- fslab eval --evaluator, end to end -------------------------------------------


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """One tiny finished run shared by the end-to-end tests."""
    folder = tmp_path_factory.mktemp("evaluators") / "project"
    folder.mkdir()
    env = {**os.environ, "FSLAB_PLUGINS": BUILTIN_PLUGINS}
    env.pop("FSLAB_CONFIG", None)
    result = fslab("run", "nca", *TINY, "--epochs", "1", cwd=folder, env=env)
    assert result.returncode == 0, result.stderr
    return folder, next((folder / "runs").iterdir()).name, env


@pytest.mark.slow
def test_fslab_eval_with_every_feature_evaluator(trained_run, builtin_plugins, monkeypatch):
    from typer.testing import CliRunner

    from fslab.cli import app

    folder, run_id, env = trained_run
    monkeypatch.chdir(folder)
    runner = CliRunner()

    def evaluate(*args):  # the real command, in this process (no interpreter start per call)
        result = runner.invoke(app, ["eval", run_id, "--episodes", "30", "--queries", "5", "--json", *args])
        assert result.exit_code == 0, result.output
        return [json.loads(line) for line in result.stdout.splitlines()]

    for name in ("knn", "soft", "ap", "sen"):
        results = evaluate("--evaluator", name)
        assert ([(r["shots"], r["evaluator"], r["metric"]) for r in results]
                == [(1, name, "accuracy"), (5, name, "accuracy")])
        assert all(0.2 < r["accuracy"] <= 1.0 for r in results)
    k3 = evaluate("--evaluator", "knn", "--shots", "5", "--set", "evaluator.k=3")
    assert k3[0]["evaluator"] == "knn[k=3]"
    text = runner.invoke(app, ["eval", run_id, "--evaluator", "knn", "--set", "evaluator.k=3", "--shots", "5",
                               "--queries", "5", "--episodes", "30"]).stdout
    assert "(knn[k=3], checkpoint" in text  # the label is not eaten as console markup
    # at 1 shot, k-NN, AP classification and the centroid are the same rule
    one_shot = {name: evaluate("--evaluator", name, "--shots", "1")[0]["accuracy"]
                for name in ("centroid", "knn", "ap")}
    assert len(set(one_shot.values())) == 1

    (retrieval,) = evaluate("--evaluator", "retrieval-map")
    assert (retrieval["shots"], retrieval["queries"]) == (1, 9)
    assert retrieval["metric"] == "map" and "accuracy" not in retrieval and 0 < retrieval["map"] <= 1
    saved = sorted(p.name for p in (folder / "runs" / run_id / "evaluations").iterdir())
    # a record spells every parameter out, defaults included: it reads the same if a default changes
    assert any(n.startswith("test-knn[k=3,ties=nearest]-5way-5shot-5q-30ep") for n in saved)
    assert any(n.startswith("test-retrieval-map[images_per_class=10]-5way-1shot-9q-30ep") for n in saved)

    # bad parameters are usage errors (fslab's main turns them into one line and exit code 2)
    # (each checked as `fslab run --set` checks it: the same lines)
    for argv, message in [
        (["--evaluator", "knn", "--set", "evaluator.kk=3"],
         "unknown parameter 'evaluator.kk' for evaluator 'knn'. Did you mean 'k'? Allowed: k, ties."),
        (["--set", "eval.center=false"], "evaluator parameters"),
        (["--evaluator", "knn", "--set", "evaluator.k=2.5"], "config key 'evaluator.k' must be an integer, got 2.5"),
        (["--evaluator", "knn", "--set", "evaluator.k=-1"], "config key 'evaluator.k' must be at least 0, got -1"),
        (["--evaluator", "knn", "--set", "evaluator.ties=nearst"], "Did you mean 'nearest'?"),
        (["--device", "tpu"], "--device must be auto, cpu, cuda (a GPU) or cuda:N, got \"tpu\""),
    ]:
        bad = runner.invoke(app, ["eval", run_id, *argv])
        assert isinstance(bad.exception, UsageError) and message in str(bad.exception), (argv, bad.exception)
    # a CUDA device this machine lacks: a usage error, as for `fslab run`, not torch's RuntimeError
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    bad = runner.invoke(app, ["eval", run_id, "--device", "cuda"])
    assert isinstance(bad.exception, UsageError) and "device 'cuda' needs a CUDA GPU" in str(bad.exception)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")

    # and once as a real subprocess, in text: the score is labelled mAP
    text = fslab("eval", run_id, "--evaluator", "retrieval-map", "--episodes", "30", cwd=folder, env=env)
    assert text.returncode == 0 and "retrieval-map" in text.stdout and "mAP " in text.stdout


@pytest.mark.slow
def test_an_evaluator_value_the_episodes_refuse_is_found_before_the_split_is_embedded(trained_run, builtin_plugins,
                                                                                       monkeypatch):
    # knn's k above a 1-shot episode's support points was refused only once the test split had been
    # embedded and cached, which can take minutes at a paper's size; now no feature is computed first
    from typer.testing import CliRunner

    from fslab.cli import app

    folder, run_id, _ = trained_run
    monkeypatch.chdir(folder)
    features = folder / "runs" / run_id / "features"
    shutil.rmtree(features, ignore_errors=True)
    bad = CliRunner().invoke(app, ["eval", run_id, "--evaluator", "knn", "--set", "evaluator.k=10", "--shots", "5,1",
                                   "--episodes", "5"])
    assert isinstance(bad.exception, UsageError)
    assert str(bad.exception) == "knn: k must be between 1 and the 5 support points (0 = shots), got 10"
    assert not features.exists()


def test_check_refused_finds_what_the_evaluator_refuses_for_a_shape_and_nothing_else():
    from fslab.training.evaluation import check_refused

    check_refused(knn, 5, [1, 5], 15)  # k = 0: k = shots, fine at any shots
    check_refused(functools.partial(knn, k=4), 3, [5], 2)
    with pytest.raises(UsageError, match=r"^knn: k must be between 1 and the 3 support points"):
        check_refused(functools.partial(knn, k=4), 3, [5, 1], 2)

    def fussy(support, query):  # blank features break it, real ones need not: left to the real episodes
        raise ZeroDivisionError("blank")

    check_refused(fussy, 5, [1], 15)


def test_check_refused_finds_a_shape_a_model_aware_evaluator_refuses_before_any_episode():
    # fslab eval --evaluator finetune --shots 5,1 fine-tuned every 5-shot episode (minutes) and only then
    # refused the 1-shot support set; a blank episode finds it first, and adapts nothing
    from fslab.training.evaluation import check_refused

    class Counting(FineTune):
        adapted = 0

        def adapt(self, model, support_images, *, to_input, device):
            if support_images.shape[1] >= 2:
                Counting.adapted += 1
            return super().adapt(model, support_images, to_input=to_input, device=device)

    check_refused(Counting(), 5, [5], 15)  # a blank network has no weights to adapt: left to the real episodes
    with pytest.raises(UsageError, match=r"^finetune needs at least 2 shots"):
        check_refused(Counting(), 5, [5, 1], 15)
    assert Counting.adapted == 2  # called, and failed at once on a network without weights

@pytest.mark.slow
def test_fslab_eval_fine_tunes_on_few_episodes(trained_run, builtin_plugins, monkeypatch):
    from typer.testing import CliRunner

    from fslab.cli import app

    folder, run_id, _ = trained_run
    monkeypatch.chdir(folder)
    runner = CliRunner()
    result = runner.invoke(app, ["eval", run_id, "--evaluator", "finetune", "--shots", "5", "--queries", "5",
                                 "--set", "evaluator.epochs=2", "--json"])
    assert result.exit_code == 0, result.output
    (out,) = [json.loads(line) for line in result.stdout.splitlines()]
    # no --episodes: the evaluator's own small default
    assert out["evaluator"] == "finetune[epochs=2]" and out["episodes"] == 100 and 0 <= out["accuracy"] <= 1
    one_shot = runner.invoke(app, ["eval", run_id, "--evaluator", "finetune", "--shots", "1", "--episodes", "2"])
    assert isinstance(one_shot.exception, UsageError) and "at least 2 shots" in str(one_shot.exception)


# -- fslab compare keeps evaluators and episode streams apart --------------------


def test_a_recorded_label_keeps_its_meaning_when_a_default_changes(monkeypatch):
    """Records spell every parameter out; a record written as 'knn' (defaults left out) would read as
    whatever a later version's defaults are, so a knn of ties=nearest would pool with ties=smallest."""
    from fslab.core import events

    record = events.recorded_evaluator({"name": "knn", "k": 0, "ties": "nearest"})
    assert record == "knn[k=0,ties=nearest]" and events.canonical_evaluator(record) == "knn"
    monkeypatch.setattr(events, "_evaluator_defaults", lambda name: {"k": 0, "ties": "smallest"})  # a new default
    assert events.canonical_evaluator(record) == "knn[ties=nearest]"  # still says what scored it
    assert events.evaluator_label({"name": "knn", "k": 0, "ties": "smallest"}) == "knn"


_FLOAT_PARAMS = [("soft", "temperature", 1.0), ("finetune", "lr", 1e-4), ("finetune", "temperature", 1.0)]


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.example(("soft", "temperature", 1.0), 2)  # soft[temperature=2] found no run scored at 2.0
@given(st.sampled_from(_FLOAT_PARAMS),
       st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False))
def test_a_label_typed_as_set_takes_the_value_names_what_that_set_records(param, value):
    """--evaluator NAME[KEY=TEXT] (fslab runs, compare) names the evaluations that --evaluator NAME --set
    evaluator.KEY=TEXT records, for any TEXT --set writes a number as; and a label fslab writes reads back
    as itself, its parameters as they were."""
    from fslab.core.assignments import parse_assignment, toml_value
    from fslab.core.events import canonical_evaluator, evaluator_label, label_params, recorded_evaluator
    from fslab.core.values import check_value

    name, key, default = param
    text = toml_value(value)
    section = {"name": name, key: check_value(key, parse_assignment(f"{key}={text}")[1], default)}
    label = evaluator_label(section)
    assert canonical_evaluator(f"{name}[{key}={text}]") == label
    assert canonical_evaluator(label) == label
    assert label_params(recorded_evaluator(section)) == [(key, str(section[key]))]


def test_fslab_runs_finds_scores_at_a_float_given_as_a_whole_number(tmp_path):
    """fslab runs --evaluator 'soft[temperature=2]' showed '-' for a run scored by --evaluator soft --set
    evaluator.temperature=2 (recorded soft[temperature=2.0]), and named the command that had scored it."""
    from .runs_helpers import fslab_here

    fixture = os.path.join(os.path.dirname(__file__), "fixtures", "runs-0.1", "20261123-181250-nca-910d")
    folder = tmp_path / "runs" / os.path.basename(fixture)
    shutil.copytree(fixture, folder)
    metrics = folder / "metrics.jsonl"
    metrics.write_text(metrics.read_text().replace("knn[k=3]", "soft[temperature=2.0]"))
    result = fslab_here("runs", "--evaluator", "soft[temperature=2]", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["test"]["5-shot"]["accuracy"] == 0.42000000085681677


def test_compare_uses_each_runs_own_evaluator_and_pairs_one_stream_only(tmp_path):
    from fslab.core.events import evaluator_label
    from fslab.core.runstore import create_run
    from fslab.reports.compare import compare

    assert evaluator_label({"name": "knn"}) == "knn"
    assert evaluator_label({"name": "knn", "k": 3}) == "knn[k=3]"

    def make(seed, lr, saved):
        run = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": seed, "train": {"lr": lr},
                                                    "evaluator": {"name": "centroid"}})
        for evaluator, stream, accuracies in saved:
            record = {"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": len(accuracies),
                      "evaluator": evaluator, "seed": 0, "epoch": 1, "accuracy": 0.0, "ci95": 0.0}
            run.save_accuracies({**record, **({"stream": stream} if stream else {})}, accuracies)
        return run

    a = make(0, 0.1, [("centroid", 2, [0.5, 0.7]), ("knn", 2, [0.1, 0.1])])
    b = make(0, 0.2, [("centroid", 2, [0.6, 0.9]), ("knn", 2, [0.3, 0.2])])
    report = compare([a, b], shots=[5])
    assert [row["results"]["5-shot"]["accuracy"] for row in report["groups"]] == pytest.approx([0.6, 0.75])
    assert report["paired"][0]["difference"] == pytest.approx(0.15)
    knn_report = compare([a, b], shots=[5], evaluator="knn")
    assert [row["results"]["5-shot"]["accuracy"] for row in knn_report["groups"]] == pytest.approx([0.1, 0.25])
    # an evaluation from the old episode stream (no "stream": stream 1) is pooled but never paired
    c = make(0, 0.3, [("centroid", None, [0.9, 0.9])])
    report = compare([a, c], shots=[5])
    assert report["groups"][1]["results"]["5-shot"]["accuracy"] == pytest.approx(0.9) and report["paired"] == []


def test_one_epoch_step_shot_or_query_is_said_in_the_singular():
    from fslab.core.events import describe_event
    from fslab.training.evaluation import check_classes

    start = {"event": "start", "device": "cpu", "epochs": 1, "steps_per_epoch": 1, "train_images": 240}
    assert describe_event(start) == "training on cpu: 1 epoch of 1 step, 240 training images"
    assert describe_event({**start, "epochs": 5, "steps_per_epoch": 28}) == \
        "training on cpu: 5 epochs of 28 steps, 240 training images"
    with pytest.raises(UsageError) as refused:
        check_classes([c for c in range(6) for _ in range(4)], 5, 1, 100)
    assert str(refused.value) == ("5-way episodes with 1 shot and 100 queries need 5 classes with at least 101 "
                                  "images; this split has 0 such classes (of 6): at 5 ways, shots + queries can "
                                  "be at most 4")


def test_episodes_a_split_cannot_give_are_refused_with_what_it_can_give():
    # fslab eval --shots 20 said "this split has 0 such classes (of 6)" and nothing of what would fit
    from fslab.training.evaluation import check_classes

    labels = [c for c, size in enumerate([20, 20, 20, 20, 20, 12]) for _ in range(size)]
    with pytest.raises(UsageError, match=r"such classes \(of 6\): at 5 ways, shots \+ queries can be at most 20$"):
        check_classes(labels, 5, 20, 5)
    with pytest.raises(UsageError, match=r"\(of 6\): at 6 ways, shots \+ queries can be at most 12; "
                                         r"at these shots and queries, at most 5 ways$"):
        check_classes(labels, 6, 10, 5)
    with pytest.raises(UsageError, match=r"has 6 such classes \(of 6\): at these shots and queries, at most 6 ways$"):
        check_classes(labels, 7, 1, 5)
    with pytest.raises(UsageError, match=r"has 0 such classes \(of 6\): at most 6 ways, with shots \+ queries at "
                                         r"most 12$"):
        check_classes(labels, 7, 20, 5)
    with pytest.raises(UsageError, match=r"has 0 such classes \(of 1\)$"):  # nothing makes an episode: nothing said
        check_classes([0, 0, 0], 2, 1, 5)
    check_classes(labels, 5, 15, 5)  # 5 classes of 20: fits


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.example(5, 10**23, 5)  # OverflowError: a need beyond 64 bits compared with torch's counts
@given(st.integers(2, 2**70), st.integers(1, 2**70), st.integers(1, 2**70))
def test_episodes_of_any_shape_are_taken_or_refused_in_one_line(ways, shots, queries):
    from fslab.training.evaluation import check_classes

    sizes = [20, 20, 20, 20, 20, 12]
    try:
        check_classes([c for c, size in enumerate(sizes) for _ in range(size)], ways, shots, queries)
    except UsageError as error:
        assert "\n" not in str(error) and sum(size >= shots + queries for size in sizes) < ways
    else:
        assert sum(size >= shots + queries for size in sizes) >= ways


def test_a_compile_event_is_one_readable_line():
    """stdout.log (fslab logs) printed a compiled run's compile event as a Python dict."""
    from fslab.core.events import describe_event

    assert describe_event({"event": "compile", "time": 1.0, "step": 1, "mode": "default", "seconds": 18.23}) == \
        "step 1 compiled the training forward (train.compile=default): 18.2 s, left out of img/s"


def test_results_json_says_when_a_final_score_is_an_map():
    """fslab run printed a retrieval-map run's final mAP as an accuracy ('test 5-way 1-shot: 40.64 ± 1.23%'):
    results.json, which it prints, did not say what the number was."""
    from fslab.core.events import accuracy_text
    from fslab.training.train import scores_by_shots

    scores = scores_by_shots([{"shots": 1, "metric": "map", "accuracy": 0.4064, "ci95": 0.0123},
                              {"shots": 5, "metric": "accuracy", "accuracy": 0.7, "ci95": 0.01}])
    assert scores == {"1-shot": {"accuracy": 0.4064, "ci95": 0.0123, "metric": "map"},
                      "5-shot": {"accuracy": 0.7, "ci95": 0.01}}
    assert [accuracy_text(v) for v in scores.values()] == ["mAP 40.64 ± 1.23%", "70.00 ± 1.00%"]


def test_one_evaluator_spelt_three_ways_is_one_label_in_runs_and_compare(tmp_path, monkeypatch):
    """A run trained with knn logged its scores as knn[k=0,ties=nearest] (every parameter spelt
    out), while fslab eval --evaluator knn saved them as knn: fslab runs --evaluator knn showed no
    test and fslab compare --evaluator knn left the older run out."""
    from typer.testing import CliRunner

    from fslab.cli import app
    from fslab.core.eventlog import EventLog
    from fslab.core.runstore import create_run

    def make(seed, lr, label, accuracies):
        config = {"method": "nca", "seed": seed, "train": {"lr": lr, "epochs": 1}, "eval": {"ways": 5},
                  "evaluator": {"name": "knn", "k": 0, "ties": "nearest"}}
        run = create_run(tmp_path / "runs", "nca", config)
        record = {"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": len(accuracies),
                  "evaluator": label, "seed": 0, "epoch": 1, "stream": 2,
                  "accuracy": sum(accuracies) / len(accuracies), "ci95": 0.01}
        run.save_accuracies(record, accuracies)
        EventLog(run, echo=False).write("eval", **record)
        return run

    old = make(0, 0.1, "knn[k=0,ties=nearest]", [0.5, 0.7])  # as fslab spelt it before
    new = make(1, 0.1, "knn", [0.6, 0.9])
    other = make(2, 0.1, "knn[k=3]", [0.2, 0.2])  # another evaluator: never pooled with knn
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for asked in ("knn", "knn[k=0]", "knn[ties=nearest,k=0]"):
        listed = runner.invoke(app, ["runs", "--json", "--evaluator", asked])
        assert listed.exit_code == 0, listed.output
        tests = {json.loads(line)["id"]: json.loads(line)["test"] for line in listed.stdout.splitlines()}
        assert tests[old.id]["5-shot"]["accuracy"] == pytest.approx(0.6)
        assert tests[new.id]["5-shot"]["accuracy"] == pytest.approx(0.75)
        assert tests[other.id] == {}
        compared = runner.invoke(app, ["compare", old.id, new.id, other.id, "--shots", "5", "--queries", "15",
                                       "--evaluator", asked, "--json"])
        assert compared.exit_code == 0, compared.output
        (group,) = [json.loads(line) for line in compared.stdout.splitlines()]
        assert group["evaluator"] == "knn"
        assert group["results"]["5-shot"]["accuracy"] == pytest.approx((0.5 + 0.7 + 0.6 + 0.9) / 4)  # both runs
    # a misspelt evaluator is refused (fslab runs listed every test as "-"), in either command
    for argv in (["runs", "--evaluator", "knnn"], ["compare", "all", "--evaluator", "knnn[k=3]"]):
        refused = runner.invoke(app, argv)  # fslab's main makes a UsageError one error: line, exit code 2
        assert isinstance(refused.exception, UsageError) and refused.stdout == ""
        assert str(refused.exception) == "Unknown evaluator 'knnn'. Did you mean 'knn'? Allowed: ap, centroid, " \
                                         "finetune, knn, retrieval-map, sen, soft."
    assert runner.invoke(app, ["runs", "--evaluator", "soft"]).exit_code == 0  # known, only not run yet
    # the run's own evaluator is knn however its config and events spell it: the training's own test
    from fslab.core.summary import read_summary
    summary = read_summary(old.path, save=False)
    assert (summary.evaluator, summary.test_by_evaluator) == ("knn", {})
    assert summary.test["5-shot"]["accuracy"] == pytest.approx(0.6)


def test_runs_by_an_evaluator_they_have_only_other_parameters_of_names_those(tmp_path, monkeypatch):
    """fslab runs --evaluator knn, where the runs were scored by knn[k=3], listed every test as '-' and said
    nothing (fslab compare names knn[k=3]); it now says on stderr which labels they have."""
    from typer.testing import CliRunner

    from fslab.cli import app
    from fslab.core.eventlog import EventLog
    from fslab.core.runstore import create_run

    for seed, label in ((0, "knn[k=3]"), (1, "knn[k=5]"), (2, "soft")):
        run = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": seed, "train": {"epochs": 1}})
        record = {"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 2, "evaluator": label,
                  "seed": 0, "epoch": 1, "stream": 2, "accuracy": 0.5, "ci95": 0.01}
        run.save_accuracies(record, [0.4, 0.6])
        EventLog(run, echo=False).write("eval", **record)
    monkeypatch.chdir(tmp_path)
    listed = CliRunner().invoke(app, ["runs", "--evaluator", "knn"])
    assert listed.exit_code == 0, listed.output
    assert listed.stderr == ("no run listed has test scores by knn; they have them by knn[k=3], knn[k=5] "
                             "(--evaluator 'knn[k=3]')\n")
    assert CliRunner().invoke(app, ["runs", "--evaluator", "knn[k=3]"]).stderr == ""
    assert CliRunner().invoke(app, ["runs", "--evaluator", "centroid"]).stderr == ""  # none by another centroid


@pytest.mark.slow
def test_results_json_and_fslab_run_give_the_episodes_a_finetune_test_drew(tmp_path, builtin_plugins):
    """A finetune run's test in training draws at most finetune's 100 episodes, whatever eval.test_episodes
    asks; results.json recorded eval.test_episodes (150) as its episodes, and fslab run printed
    'test 5-way 5-shot: ... (150 episodes)' beside the 100 fslab show and the saved scores name."""
    done = fslab("run", "nca", *TINY, "--epochs", "1", "--set", "eval.test_episodes=150", "--set", "eval.shots=[5]",
                 "--set", "eval.val_shots=5", "--set", "eval.val_episodes=2", "--set", "evaluator.name=finetune",
                 "--set", "evaluator.epochs=1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    (folder,) = (tmp_path / "runs").glob("2*")
    results = json.loads((folder / "results.json").read_text())
    (saved,) = (json.loads(p.read_text()) for p in (folder / "evaluations").glob("test-*.json"))
    assert results["episodes"] == saved["episodes"] == 100
    assert done.stdout.rstrip().splitlines()[-1].endswith("(100 episodes)")
