"""Where a run's time went (fslab.core.timing): every interval charged to the
event that closes it, the parts adding up to the run's working time."""

from __future__ import annotations

import json

import pytest

from fslab.core.timing import PARTS, key, time_line, time_split

from .runs_helpers import TINY, fslab_here


def rounded(split: dict) -> dict:
    return {key(part): round(split[key(part)], 9) for part in PARTS}


EVENTS = [{"event": "start", "time": 10.0},
          {"event": "compile", "time": 14.0, "seconds": 3.5},
          {"event": "train", "time": 15.0, "epoch": 1}, {"event": "train", "time": 16.0, "epoch": 1},
          {"event": "eval", "time": 16.5, "split": "val", "epoch": 1},
          {"event": "checkpoint", "time": 16.6, "epoch": 1},
          {"event": "train", "time": 18.6, "epoch": 2},  # epoch 2 is not validated
          {"event": "checkpoint", "time": 18.8, "epoch": 2},
          {"event": "train", "time": 20.8, "epoch": 3}, {"event": "eval", "time": 21.3, "split": "val", "epoch": 3},
          {"event": "checkpoint", "time": 21.4, "epoch": 3},
          {"event": "eval", "time": 22.4, "split": "test"}, {"event": "eval", "time": 22.9, "split": "test"},
          {"event": "end", "time": 23.0}]


def test_each_interval_goes_to_the_event_that_closes_it():
    split = time_split(EVENTS, started=7.0, ended=23.25)
    assert rounded(split) == {"start_s": 3.0, "first_epoch_s": 6.0, "training_s": 4.0, "validation_s": 1.0,
                              "checkpoints_s": 0.4, "test_s": 1.6, "finish_s": 0.25}
    assert (split["validations"], split["epochs"], split["compile_s"], split["resumes"]) == (2, 3, 3.5, 0)
    assert split["total_s"] == pytest.approx(23.25 - 7.0)  # the parts are the whole run
    # training took 10 s (6 + 4), 3.5 s of it compiling: validation's 1 s is 15% of the 6.5 s left
    assert time_line(split) == ("time: start 3.0 s, first epoch 6.0 s, training 4.0 s, validation 1.0 s, "
                                "checkpoints 0.4 s, test 1.6 s, finish 0.2 s; 16.2 s in all; "
                                "validation 15% of the training time (compiling left out)")
    uncompiled = time_split([e for e in EVENTS if e["event"] != "compile"], started=7.0, ended=23.25)
    assert time_line(uncompiled).endswith("; validation 10% of the training time")


def test_a_resumed_run_counts_its_working_time_not_the_time_it_was_stopped():
    # stopped after epoch 1's checkpoint (at 16.6), resumed at 100: its events were cut back to that checkpoint
    events = [*EVENTS[:6], {"event": "start", "time": 103.0}, {"event": "resume", "time": 103.5},
              {"event": "train", "time": 105.5, "epoch": 2}, {"event": "checkpoint", "time": 105.7, "epoch": 2},
              {"event": "eval", "time": 106.7, "split": "test"}, {"event": "end", "time": 106.8}]
    split = time_split(events, started=7.0, ended=107.0, resumed=100.0)
    # start: 3 s, then 3 s of the resumed worker's start and 0.5 s restoring its checkpoint
    assert rounded(split) == {"start_s": 6.5, "first_epoch_s": 6.0, "training_s": 2.0, "validation_s": 0.5,
                              "checkpoints_s": 0.3, "test_s": 1.1, "finish_s": 0.2}
    assert split["resumes"] == 1 and split["total_s"] == pytest.approx(107.0 - 7.0 - (100.0 - 16.6))
    assert "(resumed 1×; stopped time not counted)" in time_line(split)


def test_damaged_lines_and_later_evaluations_are_left_out():
    events = [*EVENTS[:-1], {"event": "end", "time": 23.0},
              {"event": "eval", "time": 500.0, "split": "test"},  # fslab eval, long after the end
              {"event": "train", "time": "soon", "epoch": 4}, {"event": "compile", "time": 14.5, "seconds": "x"}]
    split = time_split(events, started=7.0, ended=23.25)
    assert split["total_s"] == pytest.approx(16.25) and split["compile_s"] == 3.5
    assert split["epochs"] == 3 and time_split([], 1.0, 2.0)["total_s"] == 0.0


def test_the_final_validation_scoring_is_the_test_s_and_fslab_eval_s_work_is_not_the_run_s():
    # eval.final_val: the final network scored on the validation classes (no epoch) after the test;
    # an fslab eval of a checkpoint while the run trains names its source, and its time is another process's
    events = [*EVENTS[:8], {"event": "eval", "time": 19.9, "split": "val", "epoch": 2, "source": "fslab eval"},
              *EVENTS[8:-1], {"event": "eval", "time": 23.6, "split": "val"}, {"event": "end", "time": 23.7}]
    split = time_split(events, started=7.0, ended=24.0)
    assert rounded(split) == {"start_s": 3.0, "first_epoch_s": 6.0, "training_s": 4.0, "validation_s": 1.0,
                              "checkpoints_s": 0.4, "test_s": 2.3, "finish_s": 0.3}
    assert split["validations"] == 2


@pytest.mark.slow
def test_fslab_show_splits_a_real_run_s_time(project):
    done = fslab_here("run", "nca", *TINY, "--device", "cpu", "--epochs", "2", "--set", "eval.test_episodes=20",
                      "--set", "eval.val_episodes=10", cwd=project)  # its worker a real process, on tiny data
    assert done.returncode == 0, done.stderr
    shown = fslab_here("show", "last", "--json", cwd=project)
    record = json.loads(shown.stdout)
    status, split = record["status"], record["time"]
    assert split["total_s"] == pytest.approx(status["ended"] - status["started"])
    assert (split["epochs"], split["validations"], split["resumes"]) == (2, 2, 0)
    assert min(split["start_s"], split["first_epoch_s"], split["training_s"], split["validation_s"],
               split["test_s"]) > 0
    text = fslab_here("show", "last", cwd=project).stdout
    assert "time: start " in text and "% of the training time" in text


def test_an_interval_that_runs_backwards_counts_as_none():
    events = [{"event": "start", "time": 10.0}, {"event": "train", "time": 12.0, "epoch": 1},
              {"event": "train", "time": 11.0, "epoch": 2},  # the clock was set back by 1 s
              {"event": "train", "time": 13.0, "epoch": 2}]
    split = time_split(events, started=9.0)
    # the second train event closes nothing; the third counts from the first one's 12.0
    assert (split["start_s"], split["first_epoch_s"], split["training_s"]) == (1.0, 2.0, 1.0)
    assert split["total_s"] == 4.0


def test_the_fold_fed_a_few_events_at_a_time_gives_the_split_of_all_of_them():
    """The dashboard's run screen adds a live run's new events to one TimeSplit each tick; at each
    point its split must be time_split's of every event so far (resumes, a clock set back, damaged
    lines and fslab eval's work included)."""
    from fslab.core.timing import TimeSplit

    events = [*EVENTS[:6], {"event": "train", "time": 12.0, "epoch": 2},  # the clock set back
              {"event": "eval", "time": 16.7, "split": "val", "epoch": 1, "source": "fslab eval"},
              {"event": "train", "time": "soon", "epoch": 2}, {"event": "start", "time": 103.0},
              {"event": "resume", "time": 103.5}, {"event": "train", "time": 105.5, "epoch": 2},
              {"event": "checkpoint", "time": 105.7, "epoch": 2}, {"event": "eval", "time": 106.7, "split": "test"},
              {"event": "end", "time": 106.8}, {"event": "eval", "time": 500.0, "split": "test"}]
    for times in ((7.0, 107.0, 100.0), (None, None, None), (7.0, None, 100.0)):
        fold, fed = TimeSplit(*times), 0
        for size in (1, 3, 2, 1, 4, 5):
            fold.add(events[fed:fed + size])
            fed += size
            assert fold.result() == time_split(events[:fed], *times)
            assert fold.result() == fold.result()  # reading it changes nothing
        assert fed == len(events)
