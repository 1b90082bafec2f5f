"""benchmarks/bench_eval.py compares what it says it compares."""

from __future__ import annotations

import re

from .bench_helpers import load_benchmark


def test_the_new_code_on_the_previous_stream_s_episodes_scores_them_as_before(capsys):
    """The line that shows only the episode stream changed scores the old episodes with the new
    code: episode_scores draws through episode_blocks, and patching sample_episodes alone left it
    on its own episodes (about half of them scored differently)."""
    bench = load_benchmark("bench_eval")
    bench.cached_features(episodes=100, repeats=1)
    printed = capsys.readouterr().out
    (differing,) = re.findall(r"new code on the old episodes: (\d+) of 100 episode accuracies differ", printed)
    assert differing == "0"
