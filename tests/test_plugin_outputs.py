"""What a run's plugins give it, checked where the run takes it: each wrong output is one line naming the
component and its plugin, where it was PyTorch's error naming none, or trained and scored in silence."""

import re

import pytest
import torch

from fslab.core.types import Batch, LossOutput

NAMED = "loss 'mine' from plugin 'local:mine'"


def _loss(**extra):
    z = torch.randn(4, 3, requires_grad=True)
    return LossOutput(z.pow(2).mean(), 0, 0, extra or None)


@pytest.mark.parametrize("extra, message", [
    # AttributeError: 'list' object has no attribute 'items', naming no loss
    ([1, 2], r"returned LossOutput extra=\[1, 2\], not a dict of counters"),
    # ValueError: could not convert string to float: 'hello'
    ({"note": "hello"}, r"returned LossOutput extra\['note'\] = 'hello'; each counter is a number or a 0-d tensor"),
    # ValueError: only one element tensors can be converted to Python scalars
    ({"per_row": torch.ones(3)},
     r"returned LossOutput extra\['per_row'\] = a tensor of shape \[3\] and dtype torch.float32"),
    # EventLog.write() got multiple values for keyword argument 'loss'
    ({"loss": 1.0}, r"returned LossOutput extra with the key 'loss', which is a key the train event writes itself"),
    ({3: 1.0}, r"returned LossOutput extra with the key 3, which is not text"),
])
def test_a_loss_whose_extra_breaks_the_contract_is_named(extra, message):
    from fslab.training.outputs import checked_loss_output

    out = _loss()._replace(extra=extra)
    with pytest.raises(TypeError, match=rf"^{re.escape(NAMED)} {message}"):
        checked_loss_output(out, NAMED)


def test_a_loss_with_counters_as_the_kit_documents_passes():
    from fslab.training.outputs import checked_loss_output

    for extra in (None, {}, {"rows_without_positive": 3, "kept": torch.tensor(2), "share": 0.5}):
        out = _loss()._replace(extra=extra)
        assert checked_loss_output(out, NAMED) is out


def test_a_wrong_loss_names_its_plugin():
    from fslab.training.outputs import checked_loss_output

    z = torch.randn(4, 3, requires_grad=True)
    with pytest.raises(TypeError, match=rf"^{re.escape(NAMED)} returned a loss of shape \[4\]"):
        checked_loss_output(LossOutput(z.pow(2).sum(dim=1), 0, 0), NAMED)


SAMPLER = "sampler 'mine' from plugin 'local:mine'"


@pytest.mark.parametrize("indices, message", [
    # trained on the last image, in silence
    ([0, 1, 2, -1], r"yielded the index -1, out of the training split's range 0\.\.9"),
    # IndexError: index 12 is out of bounds for dimension 0 with size 10, naming no sampler
    ([0, 1, 2, 12], r"yielded the index 12, out of the training split's range 0\.\.9"),
    ([0, 1, 2], r"yielded a batch of 3 indices, not train.batch_size=4"),  # trained on 3 rows, in silence
    ([], r"yielded a batch of 0 indices, not train.batch_size=4"),
    ([0, 1, 2, 2], r"yielded a batch that names an image twice"),  # in silence
    ([0.0, 1.0, 2.0, 3.0], r"yielded indices of dtype torch.float32 and shape \[4\]"),  # IndexError
    (["a", "b", "c", "d"], r"yielded indices that are not a list of whole numbers"),
])
def test_a_sampler_whose_indices_break_the_contract_is_named(indices, message):
    from fslab.training.outputs import checked_batch

    with pytest.raises((TypeError, ValueError), match=rf"^{re.escape(SAMPLER)} {message}"):
        checked_batch(Batch(indices), SAMPLER, rows=4, images=10)


def test_a_sampler_batch_as_the_contract_says_passes():
    from fslab.training.outputs import checked_batch

    marked = Batch([0, 1, 2, 3], [True, True, False, False])
    for batch in (Batch([9, 0, 4, 5]), Batch(torch.tensor([1, 2, 3, 4])), marked):
        checked = checked_batch(batch, SAMPLER, rows=4, images=10)  # as the host tensors the step moves
        assert checked.indices.tolist() == list(batch.indices) and checked.indices.device.type == "cpu"
        assert (None if checked.support is None else checked.support.tolist()) == batch.support
    with pytest.raises(ValueError, match=r"yielded 3 support marks for 4 indices"):
        checked_batch(Batch([0, 1, 2, 3], [True, False, False]), SAMPLER, rows=4, images=10)
    # marks of 1 and 0 were taken as row numbers by a loss's z[support], and protonet trained on rows 1 and 0
    with pytest.raises(TypeError, match=rf"^{re.escape(SAMPLER)} yielded support marks of dtype torch.int64; "
                                        r"Batch.support holds True \(a support row\) or False"):
        checked_batch(Batch([0, 1, 2, 3], [1, 1, 0, 0]), SAMPLER, rows=4, images=10)


BACKBONE = "backbone 'mine' from plugin 'local:mine'"


@pytest.mark.parametrize("features, message", [
    (torch.zeros(2, 8, 1), r"returned features of shape \[2, 8, 1\] for 2 images, not \[2, out_dim\] with its "
                           r"out_dim=8: pool or flatten it to \[2, 8\]"),
    # no gradient: the run failed at its first step, blaming the loss
    (torch.zeros(2, 8, dtype=torch.long), r"returned features of dtype torch.int64 for 2 images"),
    # a NaN loss at step 1, blamed on the loss and its parameters
    (torch.full((2, 8), float("nan")), r"returned features that are not finite \(NaN or infinite\)"),
    ([[0.0] * 8] * 2, r"returned features a list for 2 images"),
])
def test_a_backbone_whose_features_break_the_contract_is_named(features, message):
    from fslab.training.build import check_features

    with pytest.raises(TypeError, match=rf"^{re.escape(BACKBONE)} {message}"):
        check_features(features, BACKBONE, 8)


def _separated(ways=5, per_class=10, dim=6):
    labels = torch.arange(ways).repeat_interleave(per_class)
    return torch.nn.functional.one_hot(labels, dim).float() * 5 + 0.01 * torch.randn(len(labels), dim), labels


def _offset(support, query):  # a split's labels rather than the episode's ways
    return torch.cdist(query, support.mean(2)).argmin(-1) + support.shape[1]


def _halves(support, query):  # float predictions
    return torch.cdist(query, support.mean(2)).argmin(-1).float() + 0.5


def _nan_score(support, query):
    return torch.full((query.shape[0],), float("nan"))


def _percent(support, query):  # a score in percent
    return torch.full((query.shape[0],), 80.0)


def _on_meta(support, query):  # predictions of no values: CPU ones for CUDA features failed the same way
    return torch.zeros(query.shape[:2], dtype=torch.long, device="meta")


def _meta_score(support, query):
    return torch.zeros(query.shape[0], device="meta")


_nan_score.metric = _percent.metric = _meta_score.metric = "score"


@pytest.mark.parametrize("evaluator, message", [
    # both scored a 0% that no episode earned, in silence
    (_offset, r"returned a predicted way outside 0\.\.4 for a 5-way episode"),
    (_halves, r"returned predictions of dtype torch.float32; it predicts each query's way, a whole number 0\.\.4"),
    # both were saved as the run's result, NaN and 8000%
    (_nan_score, r"returned the score nan for an episode; a score per episode is a finite number in \[0, 1\]"),
    (_percent, r"returned the score 80.0 for an episode"),
    # PyTorch's device mismatch on the comparison with the truth, and its meta copy on the scores', naming no evaluator
    (_on_meta, r"returned predictions on the device meta, which fslab cannot read on cpu \(.*\); return a tensor"),
    (_meta_score, r"returned scores on the device meta, which fslab cannot read on cpu"),
])
def test_an_evaluator_whose_output_breaks_the_contract_is_refused(torch_seed, evaluator, message):
    from fslab.training.evaluation import EvaluatorOutputError, episode_scores

    features, labels = _separated()
    with pytest.raises(EvaluatorOutputError, match=rf"^evaluator {message}"):
        episode_scores(features, labels, evaluator, 5, 1, 3, 4, seed=0)


def test_an_evaluators_predictions_are_read_where_fslab_reads_them():
    from fslab.training.evaluation import EvaluatorOutputError, model_episode_scores, readable

    predictions = torch.tensor([0, 1])
    assert readable(predictions, "cpu", "predictions") is predictions
    assert readable(predictions, "meta", "predictions").device.type == "meta"  # as CPU ones go to CUDA features

    def adapting(model, support, query, **kwargs):
        return torch.zeros(len(query), dtype=torch.long, device="meta")

    adapting.needs_model = True
    images, labels = torch.zeros(20, 1, 4, 4, dtype=torch.uint8), torch.arange(4).repeat_interleave(5)
    with pytest.raises(EvaluatorOutputError, match=r"^evaluator returned predictions on the device meta"):
        model_episode_scores(torch.nn.Flatten(), images, labels, adapting, 4, 1, 2, 2, seed=0,
                             to_input=lambda x: x.float(), device="cpu")


@pytest.mark.parametrize("count, message", [
    (1.5, r"positives=1.5"),  # logged as 1, in silence
    (-3, r"positives=-3"),  # logged as -3
    (torch.ones(2), r"positives=a tensor of shape \[2\] and dtype torch.float32"),  # Python's ValueError
    (torch.tensor(2.0), r"positives=a tensor of shape \[\] and dtype torch.float32"),
    ("many", r"positives='many'"),  # invalid literal for int()
])
def test_a_loss_whose_pair_counts_break_the_contract_is_named(count, message):
    from fslab.training.outputs import checked_loss_output

    with pytest.raises(TypeError, match=rf"^{re.escape(NAMED)} returned LossOutput {message}; it counts the "
                                        rf"unordered pairs that reach the loss"):
        checked_loss_output(_loss()._replace(positives=count), NAMED)
    for fine in (0, 12, torch.tensor(3), torch.tensor(3, dtype=torch.int32)):
        checked_loss_output(_loss()._replace(positives=fine), NAMED)


class _Sized:
    def __init__(self, length):
        self.length = length

    def __len__(self):
        return self.length


def test_a_sampler_of_no_batch_per_epoch_is_named():
    from fslab.training.outputs import batch_count

    assert batch_count(_Sized(3), SAMPLER) == 3
    with pytest.raises(ValueError, match=rf"^{re.escape(SAMPLER)} has len\(\) 0, no batch per epoch"):
        batch_count(_Sized(0), SAMPLER)  # the run trained no step and ended completed
    with pytest.raises(TypeError, match=rf"^{re.escape(SAMPLER)} has no len\(\) that fslab can read"):
        batch_count(_Sized(2.5), SAMPLER)


@pytest.mark.parametrize("labels, classes, message", [
    ([1, 2, 3, 4], 4, r"1\.\.4 for 4 classes"),  # numbered from 1
    ([0, 1, 2, 3], 3, r"0\.\.3 for 3 classes"),  # a classes list one short
    ([-1, 0, 1], 3, r"-1\.\.1 for 3 classes"),
])
def test_a_dataset_whose_labels_do_not_number_its_classes_is_named(labels, classes, message):
    from fslab.training.build import check_label_range

    with pytest.raises(ValueError, match=rf"^dataset 'mine' gave train labels {message} \(Split.classes\)"):
        check_label_range(torch.tensor(labels), classes, "dataset 'mine' gave train labels")
    check_label_range(torch.tensor([0, 1, 2]), 3, "dataset 'mine' gave train labels")
