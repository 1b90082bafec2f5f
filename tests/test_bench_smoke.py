"""The benchmarks no other test runs, run end to end at tiny sizes, so that a change to what they
call breaks a test rather than the next measurement."""

from __future__ import annotations

import re
import sys

import pytest

from .bench_helpers import load_benchmark

# The first line of every CPU benchmark: what its figures were measured on.
MACHINE = r"machine: .+, \d+ of \d+ CPUs, load average [\d.]+\n"


def run_main(script: str, argv: list[str], monkeypatch, capsys) -> str:
    bench = load_benchmark(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    bench.main()
    return capsys.readouterr().out


def test_bench_losses_times_each_loss_against_nca_in_the_same_run(monkeypatch, capsys, registry):
    out = run_main("bench_losses", ["--device", "cpu", "--steps", "1", "--image-size", "16", "--batch-size", "16",
                                    "--classes", "2", "--only", "protonet"], monkeypatch, capsys)
    rows = re.findall(r"^\| `([\w-]+)` \| \w+ \| [\d,]+ / [\d,]+ \| ([\d.]+) \| ([\d.]+) \|", out, re.M)
    assert [name for name, _, _ in rows] == ["nca", "protonet"]
    assert rows[0][2] == "1.00"  # the baseline is nca's own step
    nca_ms, protonet_ms = float(rows[0][1]), float(rows[1][1])
    assert float(rows[1][2]) == pytest.approx(protonet_ms / nca_ms, abs=0.02 + 0.1 / nca_ms)


def test_bench_map_prices_each_loss_as_a_share_of_a_step(monkeypatch, capsys):
    out = run_main("bench_map", ["--repeats", "1", "--device", "cpu"], monkeypatch, capsys)
    assert [line.split()[0] for line in out.splitlines()[2:]] == ["nca", "map-ssvm", "map-dlm"]



def test_bench_long_run_times_the_run_screen_s_ui_thread_against_the_old_fold(monkeypatch, capsys):
    out = run_main("bench_long_run", ["--steps", "200", "--repeats", "1"], monkeypatch, capsys)
    names = ["opening the run", "one new step appended", "  the step, follow thread", "compare screen: opening",
             "fslab show: events checked"]
    rows = re.findall(rf"^({'|'.join(names)}) +([\d.]+) ms +([\d.]+) ms +(\d+)x$", out, re.M)
    assert [name for name, *_ in rows] == names
    assert re.match(MACHINE + "one run of 200 logged steps", out)


def test_bench_short_ids_times_the_index_against_the_scan_of_every_end(monkeypatch, capsys):
    out = run_main("bench_short_ids", ["--runs", "300", "--repeats", "1"], monkeypatch, capsys)
    assert re.fullmatch(MACHINE + r"short ids of all 303 runs \(fastest of 1\): old way \(a scan per end\) [\d.]+ s, "
                        r"index [\d.]+ s, old / now [\d.]+x\n", out)


def test_bench_first_run_times_the_follower_s_end_bar_and_the_worker_s_exit_against_the_old_way(monkeypatch, capsys):
    out = run_main("bench_first_run", ["--repeats", "1", "--worker-s", "0", "--follow-s", "1"], monkeypatch, capsys)
    assert re.fullmatch(MACHINE + r"end of the run seen after the worker's exit: \d+ ms the old way, \d+ ms now "
                        r"\(\d+x sooner\)\nfollower's CPU in a terminal: [\d.]+% of a core at 10 redraws a second, "
                        r"[\d.]+% at 2 \([\d.]+x less\)\nworker's exit after its last line: \d+ ms through the "
                        r"interpreter's teardown, \d+ ms with exit_now \([\d.]+x sooner\)\n", out)


def test_bench_plot_times_a_sweep_s_points_against_the_old_lists(monkeypatch, capsys):
    out = run_main("bench_plot", ["--runs", "30", "--repeats", "1"], monkeypatch, capsys)
    assert re.fullmatch(MACHINE + r"30 runs of one sweep, 6 points \(fastest of 1\): fslab plot's read of them "
                        r"[\d.]+ s; "
                        r"keeping a point's scored runs \(10 runs\): old way \(lists\) [\d.]+ ms, sets [\d.]+ ms, "
                        r"old / now \d+x\n", out)


def test_bench_tui_paints_a_store_smaller_than_a_screen(tmp_path):
    """First paint waited for the screen's last line to hold a run, so a store of fewer runs than a
    screenful (``--runs 5``, or bench_store's ``--runs 20``) waited for ever; the wait_for only
    turns such a hang into a failure."""
    import asyncio

    bench = load_benchmark("bench_tui")
    live = bench.make_runs(tmp_path / "runs", 5, 1)
    result = asyncio.run(asyncio.wait_for(bench.measure(tmp_path / "runs", live, ticks=1, total=5), 60))
    assert 0 < result["first_paint"] <= result["all_loaded"] and len(result["ticks"]) == 1


def test_make_runs_lost_runs_are_lost_not_live_as_in_a_lab_s_store(tmp_path):
    """make_runs wrote every status.json as it ran: another host's lost run, its heartbeat months old,
    read as written seconds ago by a host whose clock is months behind, so running for two minutes,
    and the dashboard benchmark checked 1,667 such runs each tick as live ones (89 ms, not 20 ms, a
    tick). Its files now bear the times their run wrote them."""
    from fslab.tui.tailing import StoreWatcher

    live = load_benchmark("make_runs").make_runs(tmp_path / "runs", 12, 1)
    watcher = StoreWatcher(tmp_path / "runs")
    watcher.poll()
    states = {watcher.keepers[name].summary.state for name in watcher.ended}
    assert watcher.live == {live[0].name} and states == {"completed", "failed", "killed", "lost"}


@pytest.mark.parametrize(("layout", "shown", "csv"), [("csv", "csv layout", "3"),
                                                     ("folders", "split folders read by the folder dataset", "0")])
def test_bench_data_checks_counts_each_image_s_stats_and_opens_in_every_phase(layout, shown, csv, monkeypatch, capsys,
                                                                               tmp_path):
    out = run_main("bench_data_checks", ["--scale", "0.005", "--dir", str(tmp_path), "--layout", layout], monkeypatch,
                   capsys)
    assert re.match(MACHINE + rf"miniImageNet, {shown}: 300 JPEGs of 84×84 \(3 a class\) made in [\d.]+ s\nfloor: ",
                    out)
    phases = ["checks before a run, nothing cached", "cache build \\(first run's worker\\)",
              "checks before a run, cache warm", "worker's loads, cache warm"]
    rows = re.findall(rf"^({'|'.join(phases)}) +[\d.]+ s +([\d.]+) +([\d.]+) +(\d+) ", out, re.M)
    assert [name for name, *_ in rows] == [phase.replace("\\", "") for phase in phases]
    # each image stat'ed once a phase, opened only by the header read and the decode; each csv read once
    assert [row[1:] for row in rows] == [("1.00", "1.00", csv), ("1.00", "1.00", csv), ("1.00", "0.00", csv),
                                         ("1.00", "0.00", csv)]
    assert list(tmp_path.iterdir()) == []  # its images deleted
