"""Figures in the style of the NCA paper: accuracy against one setting, one
line per configuration, one panel per number of shots, 95% CI error bars.

- ``batch-size`` (Fig. 2): x is ``train.batch_size``; each line is one
  configuration (a loss, an episode shape ...), so NCA and ProtoNets trained on
  batches of equal size can be compared point by point.
- ``pairs`` (Fig. 3): x is the fraction of a batch's pairs the loss uses. For
  a loss with ``pair_fraction`` (NCA) it is that setting; for any other loss
  (ProtoNets) it is measured as the paper places its ProtoNet points: the pairs
  the loss used per batch (mean of the logged positives + negatives) over the
  B(B−1)/2 pairs an NCA loss sees in a batch of the same size.
- any other configuration key (``train.lr``, ``sampler.shots`` ...).

Every point pools the per-episode accuracies of the runs that differ only by
seed, exactly as ``fslab compare`` does (:func:`fslab.reports.compare.pooled`), and the
numbers drawn are returned as plain data (``fslab plot --json`` prints them).
matplotlib is imported only when a figure is drawn, with the Agg backend.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import textwrap
from pathlib import Path

from fslab.core.assignments import toml_value
from fslab.core.errors import UsageError
from fslab.core.files import written_whole
from fslab.core.runstore import Run
from fslab.core.text import count, queries_text
from fslab.core.values import is_number
from fslab.reports.compare import (
    Group,
    RunFiles,
    has_results,
    key_hint,
    metrics_name,
    no_results,
    no_scores_at_all,
    one_run_per_seed,
    other_shapes,
    pooled,
    run_settings,
    score_in,
    scored_shape,
    settings_label,
    shapes_text,
    shared_episodes,
    split_by_data,
    unevaluable_runs,
)
from fslab.reports.eval_commands import fewest_test_episodes, read_on_command

PRESETS = {"batch-size": "train.batch_size", "pairs": "loss.pair_fraction"}
AXIS_LABELS = {"train.batch_size": "batch size", "loss.pair_fraction": "fraction of pairs used"}
PANEL_SIZE = (500, 420)  # pixels of one panel when no --size is given
LINE_STYLES = ("-", "--", ":", "-.")  # after the 10 colours drawn solid, the lines again in these


def measured_pair_fraction(run: Run, config: dict | None = None) -> float | None:
    """Mean pairs used per logged batch over the B(B−1)/2 pairs of the batch
    (None where neither is known); ``config``: the run's, if already read."""
    if config is None:
        config = RunFiles().config(run)
    sampler = config.get("sampler", {})
    if sampler.get("ways", 0) > 0 and "shots" in sampler:
        # an explicit episode shape fixes the batch; runs saved before train.batch_size said so
        # kept the batch size they were given, which their sampler ignored
        batch = sampler["ways"] * (sampler.get("shots", 0) + sampler.get("queries", 0))
    else:
        batch = config.get("train", {}).get("batch_size", 0)
    used = [e["positives"] + e["negatives"] for e in run.events_of("train")
            if e.get("positives") is not None and e.get("negatives") is not None]
    if batch < 2 or not used:
        return None
    return statistics.fmean(used) / (batch * (batch - 1) / 2)


def x_value(run: Run, flat: dict, key: str, config: dict) -> tuple[object, bool]:
    """The run's value on the x axis, and whether it was measured (not configured).
    A list or table value is a category, written as ``--set`` takes it (``[0.5, 0.75]``)."""
    if key in flat:
        value = json.loads(flat[key])
        return (toml_value(value) if isinstance(value, (list, dict)) else value), False
    if key == "loss.pair_fraction":
        measured = measured_pair_fraction(run, config)
        if measured is not None:
            return measured, True
        raise UsageError(f"run {run.id} has no loss.pair_fraction and no logged pair counts to measure it from; "
                         f"leave it out or let it train first")
    raise UsageError(f"run {run.id} has no configuration key '{key}'. {key_hint(key, flat, run.id, tuple(PRESETS))}")


def series_data(runs: list[Run], x: str, *, series: list[str] | None = None, split: str = "test",
                shots: list[int] = (1, 5), ways: int | None = 5, queries: int | None = 15,
                precision: str | None = None) -> dict:
    """What a figure shows, as data: for each number of shots, each line's
    points (x, pooled accuracy, ci95, episodes, run ids), x ascending; and
    ``left_out``: each run that gives no point, with why (its configuration
    cannot be read, it has no x, it repeats another run's settings and seed, or
    it has no saved scores of these episodes: still running, failed, or scored
    otherwise, where the why names the episode shapes it was scored at with the
    ``--ways``/``--queries`` that read them, as the error does when no run has
    these scores).

    ``x`` is a preset name or a configuration key; lines are the runs' settings
    except the seed and x, or only the ``series`` keys when given; ``ways`` or
    ``queries`` None: the runs' own shape, as ``compare`` reads it; ``precision`` (fp32, bf16 or fp16; None:
    each run's own): the scores of the network run in it, as ``compare`` reads them (:class:`RunFiles`)."""
    key = PRESETS.get(x, x)
    if series and key in series:  # each line was one point, at its own x
        raise UsageError(f"--series names {key}, the x axis: each line would be one point; name the settings "
                         f"that tell lines apart (e.g. --series loss.name), or leave --series out")
    if not runs:
        raise UsageError("no runs to plot; name run ids, sweep ids or 'all' (list them with: fslab runs)")
    files = RunFiles(precision)
    asked = (ways, queries)
    ways, queries = scored_shape(runs, split, shots, ways, queries, None, files)
    lines, left_out = _lines(runs, key, series, files)
    lines = _by_data(lines, split, files, (list(shots), ways, queries))

    def scored(run: Run) -> bool:
        return has_results(run, split, shots, ways, queries, files=files)

    network = f" of the network in {precision}" if precision else ""
    what = f"{split} accuracies{network} for {ways}-way {','.join(map(str, shots))}-shot, {queries_text(queries)}"

    def scoring(drawn: list[Run]):  # the fslab eval of a run left out, on the episodes each panel reads ``drawn`` on
        episodes = [shared_episodes(drawn, split, n, ways, queries, files=files) for n in shots]
        return lambda run: read_on_command(run, files.config(run), split=split, shots=list(shots), ways=ways,
                                           queries=queries, precision=precision, episodes=episodes)

    dropped, shapes, unscored = _keep_scored(lines, files, scored, lambda run: other_shapes(
        run, split, shots, ways, queries, None, files), what, scoring)
    left_out += dropped
    # labelled by what differs among the lines drawn: a line whose runs are all left out tells nothing apart
    drawn = [line for line in lines.values() if any(point["runs"] for point in line["points"].values())]
    varying = sorted({k for line in drawn for k in line["settings"]
                      if len({json.dumps(o["settings"].get(k)) for o in drawn}) > 1})
    shown = varying or series or ["method"]
    panels = [{"shots": n, "series": _series(lines, shown, split, n, ways, queries, files)} for n in shots]
    data_split = list(dict.fromkeys(settings_label(line["settings"], shown) or "all" for line in lines.values()
                                    if line.get("data")))
    if not any(panel["series"] for panel in panels):
        raise UsageError(no_results(split, ways, ",".join(map(str, shots)), queries,
                                    shapes={shape for found in shapes.values() for shape in found}, asked=asked,
                                    unscored=no_scores_at_all(unscored, split, files),
                                    precision=precision,
                                    runs=runs, episodes=fewest_test_episodes(runs, files.config)))
    data = {"x": key, "split": split, "ways": ways, "queries": queries, "precision": precision, "panels": panels,
            "left_out": left_out,
            # runs scored on more than the count every run of their panel reaches, read on their first so many
            "cut": sorted({i for panel in panels for s in panel["series"] for p in s["points"]
                           for i in p.get("cut", [])}),
            "data_split": data_split, "damaged": files.damaged(runs)}
    return {**data, "y": y_label(data)}


def _keep_scored(lines: dict, files: RunFiles, scored, others, what: str,
                 scoring) -> tuple[list[dict], dict, list[Run]]:
    """Each point's runs narrowed to one run per seed and settings (:func:`one_run_per_seed`) that has the
    scores drawn (``scored``). Returns the runs left out, each with why; of each run without these scores,
    the episode shapes it has them at (``others``); and the runs without them at any shape. With a precision,
    the why of a run without its scores names the fslab eval that scores it (``scoring(runs drawn)(run)``)."""
    left_out: list[dict] = []
    shapes: dict[str, list[tuple[int, int]]] = {}  # of each run without these scores: those it has
    unscored: list[Run] = []  # the runs with no scores of any shape (the error names those never scored)
    to_score: list[tuple[dict, Run, str]] = []  # said once every point's runs drawn are known (their episodes)
    for line in lines.values():
        for point in line["points"].values():
            runs_kept, repeats = one_run_per_seed(point["runs"], files, scored)
            left_out += [{"run": r.id, "why": "it repeats the settings and seed of another run"} for r in repeats]
            without = [r for r in runs_kept if not scored(r)]  # running, failed, or never scored this way
            for r in without:
                shapes[r.id], state = others(r), r.state()
                if not shapes[r.id]:
                    unscored.append(r)
                have = f"; it has them for {shapes_text(shapes[r.id])}" if shapes[r.id] else ""
                damaged = files.damaged([r]).get(r.id)  # not "evaluate it": its scores may be these
                after = (f"; {count(len(damaged), 'saved evaluation')} of it cannot be read: {', '.join(damaged)}"
                         if damaged else "")
                left_out.append({"run": r.id, "why": f"it is {state} and has no saved {what}{have}"})
                if files.precision and not shapes[r.id]:
                    to_score.append((left_out[-1], r, after))
                else:
                    left_out[-1]["why"] += after
            # sets: a point of a 1,000-run sweep compared each run with each, a second and more
            dropped = set(without)
            runs_kept = [r for r in runs_kept if r not in dropped]
            kept = set(runs_kept)
            point["x"] = [v for v, r in zip(point["x"], point["runs"]) if r in kept]
            point["runs"] = runs_kept
    if to_score:
        command = scoring([r for line in lines.values() for point in line["points"].values() for r in point["runs"]])
        for entry, r, after in to_score:
            lacking = unevaluable_runs([r])  # no checkpoint for fslab eval to score: why, not a command it refuses
            commands = {} if lacking else {r.id: command(r)}
            entry["why"] += f"; {score_in([r.id], files.precision, commands, lacking)}{after}"
    return left_out, shapes, unscored


def _lines(runs: list[Run], key: str, series: list[str] | None, files: RunFiles) -> tuple[dict, list[dict]]:
    """The runs as lines (their settings but the seed and x, or the ``series`` keys) of
    points (the runs at one x), and the runs that give no point, with why."""
    lines: dict[tuple, dict] = {}
    left_out: list[dict] = []
    no_x: list[UsageError] = []
    for run in {run.path: run for run in runs}.values():  # a run named twice is one point
        config = files.config(run)
        if not config:
            left_out.append({"run": run.id, "why": "its configuration cannot be read" if run.path.is_dir() else
                             "its folder is gone, though its sweep's record names it"})
            continue
        flat = files.flat(run)
        try:
            value, measured = x_value(run, flat, key, config)
        except UsageError as exc:
            no_x.append(exc)
            left_out.append({"run": run.id, "why": str(exc)})
            continue
        settings = run_settings(run, flat, series, "--series", leave_out=(key,))
        line = lines.setdefault(tuple(sorted(settings.items())), {"settings": settings, "points": {}})
        # a measured x is one point per configuration (all its settings but the seed, whatever --series
        # leaves out of the line: ProtoNets of two batch sizes were one point between them), at the mean over its seeds
        at = json.dumps(sorted(run_settings(run, flat, None, "", leave_out=(key,)).items())) if measured else None
        point = line["points"].setdefault(f"measured {at}" if measured else json.dumps(value), {"x": [], "runs": []})
        point["x"].append(value)
        point["runs"].append(run)
    if not lines and len(no_x) > 1:  # not one run has it: the first one's line, said of them all
        raise UsageError(f"none of the {len(no_x)} runs gives '{key}' a value; {no_x[0]}")
    if not lines:
        raise no_x[0] if no_x else UsageError("none of these runs has a configuration that can be read")
    return lines, left_out


def _by_data(lines: dict, split: str, files: RunFiles, shape: tuple) -> dict:
    """Each line whose runs were scored on different data split into one line per data, as
    compare splits a group (:func:`fslab.reports.compare.split_by_data`), its part named in
    ``data`` (``dataset.root=/x``); the data of the scores of ``shape`` (shots, ways, queries)."""
    out = {}
    for key, line in lines.items():
        runs = [r for point in line["points"].values() for r in point["runs"]]
        parts, split_labels = split_by_data([Group(line["settings"], runs, "")], split, None, files, shape)
        for part in parts:
            kept = {id(r) for r in part.runs}
            points = {at: {"x": [v for v, r in zip(p["x"], p["runs"]) if id(r) in kept],
                           "runs": [r for r in p["runs"] if id(r) in kept]} for at, p in line["points"].items()}
            tag = part.label.removeprefix(", ") if split_labels else None  # the part's data, as compare names it
            out[(*key, ("data", tag))] = {**line, "points": {at: p for at, p in points.items() if p["runs"]},
                                          **({"data": tag} if tag else {})}
    return out


def _series(lines: dict, shown: list[str], split: str, shots: int, ways: int, queries: int,
            files: RunFiles) -> list[dict]:
    """One panel's lines: each labelled by the ``shown`` settings, its points pooled as compare pools,
    every run read on its first N episodes, N the most every run of the panel reaches (:func:`shared_episodes`)."""
    everyone = [r for line in lines.values() for point in line["points"].values() for r in point["runs"]]
    episodes = shared_episodes(everyone, split, shots, ways, queries, files=files)
    drawn = []
    for line in lines.values():
        points = []
        for point in line["points"].values():
            result = pooled(point["runs"], split, shots, ways, queries, files=files, episodes=episodes)
            if result is None:
                continue
            xs = point["x"]
            numbers = all(isinstance(v, (int, float)) for v in xs) and len(set(xs)) > 1
            where = statistics.fmean(xs) if numbers else xs[0]
            points.append({"x": where, **result, "run_ids": [r.id for r in point["runs"]]})
        if points:
            label = settings_label(line["settings"], shown) or "all"
            if line.get("data"):  # one of the lines a configuration was split into by its data
                label += f", {line['data']}"
            drawn.append({"label": label, "points": sorted(points, key=lambda p: x_order(p["x"]))})
    return drawn


_NUMBER = re.compile(r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def x_order(value) -> tuple:
    """Where a point lies along the x axis: a number by its value; a category by its text with the numbers in
    it read as numbers, so that milestones [5] come before [10, 20] and [30] before [100] (as text: [100] first)."""
    if is_number(value):
        return (0, ((0, value, ""),))
    pieces = _NUMBER.split(_category(value))  # text, number, text, ...: numbers at the odd places
    return (1, tuple((0, float(p), "") if i % 2 else (1, 0.0, p) for i, p in enumerate(pieces)))


def cut_line(data: dict) -> str | None:
    """The runs a figure read on fewer episodes than they were scored on (the most every run of the panel
    reaches, their first so many), as fslab plot says them on stderr; None where none was cut."""
    if not (cut := data.get("cut")):
        return None
    one = len(cut) == 1
    return (f"{count(len(cut), 'run')} scored on more episodes than every run of {'its' if one else 'their'} panel "
            f"reaches, so read on {'its' if one else 'their'} first as many, as fslab compare reads "
            f"{'it' if one else 'them'}: {', '.join(cut[:5])}{', ...' if len(cut) > 5 else ''}")


def y_label(data: dict) -> str:
    """The y axis's name: accuracy, or the mAP that runs tested with a retrieval evaluator pool; the precision
    of the network whose scores are drawn, where one was asked for (``--precision``)."""
    metrics = {p.get("metric", "accuracy") for panel in data["panels"] for s in panel["series"] for p in s["points"]}
    network = f", network in {data['precision']}" if data.get("precision") else ""
    return f"{metrics_name(metrics)} (%){network}, mean ± 95% CI"


def png_path(out: Path | None, x: str) -> Path:
    """Where the figure goes: ``out``, which must name a ``.png`` file (the figure is a PNG
    whatever the name says, so ``fig.pdf`` would be a PNG by another name), or ``X.png``."""
    if out is None:
        return Path(f"{x}.png")
    if out.suffix.lower() != ".png" or out.is_dir():
        instead = shlex.quote(str(out / f"{x}.png" if out.is_dir() else out.with_suffix(".png")))
        raise UsageError(f"--out {out}: fslab plot writes a PNG image; name a .png file, e.g. --out {instead}")
    return out


def parse_size(text: str) -> tuple[int, int]:
    """``"1000x420"`` -> (1000, 420) pixels."""
    width, sep, height = text.lower().partition("x")
    try:
        size = (int(width), int(height))
    except ValueError:
        size = (0, 0)
    if not sep or min(size) < 100 or max(size) > 10000:
        raise UsageError(f"--size takes WIDTHxHEIGHT in pixels, each 100 to 10000 (e.g. 1000x420), got '{text}'")
    return size


def _category(value) -> str:
    """A value's tick on a category axis, as ``--set`` writes it: ``false``, ``null``, ``[0.5, 0.75]``, ``conv4``."""
    return toml_value(value) if value is None or isinstance(value, bool) else str(value)


def literal(text: str) -> str:
    """``text`` as matplotlib draws it letter for letter: two ``$`` in a title, a legend's setting or a category
    (``--title 'cost $5 to $10'``) were read as math, drawn ``cost 5to10`` or, where the math did not parse
    (``$\\foo$``), a traceback; a ``\\$`` is drawn as ``$`` outside math."""
    return text.replace("$", r"\$")


def x_axis(ax, key: str, xs: list, numeric: bool) -> None:
    """The x axis's scale and ticks for the setting ``key`` at values ``xs``
    (the categories, in order, where they are not all numbers): batch sizes on a log-2 axis,
    other positive numbers that span two decades or more on a log-10 one."""
    from matplotlib.ticker import MaxNLocator

    if numeric and key == "train.batch_size" and all(v > 0 for v in xs):
        ax.set_xscale("log", base=2)  # batch sizes double from point to point
        ax.set_xticks(xs, [str(v) for v in xs])
        ax.minorticks_off()
    elif not numeric:
        ax.set_xticks(range(len(xs)), [literal(x) for x in xs])
    elif min(xs) > 0 and max(xs) >= 100 * min(xs):
        # a sweep over decades (learning rates 1e-4 ... 1e-1): on a linear axis all but the largest bunched at 0
        ax.set_xscale("log")
    elif all(isinstance(v, int) and not isinstance(v, bool) for v in xs):
        # whole-number settings (seeds, epochs, shots, ways) are ticked at whole numbers, never at 1.25
        if len(set(xs)) == 1:  # one value: the range around it holds no other whole number to tick
            ax.set_xticks(xs[:1])
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def line_look(index: int) -> tuple[str, str]:
    """The colour and line style of a figure's ``index``-th line: matplotlib's 10 colours drawn solid, then
    dashed, dotted and dash-dotted, a pair of its own for each of the first 40 lines (the 11th was the 1st)."""
    style, colour = divmod(index, 10)
    return f"C{colour}", LINE_STYLES[style % len(LINE_STYLES)]


def _collapses(fig) -> bool:
    """Whether laying ``fig`` out leaves its panels no room (matplotlib only warns, and draws them as slivers)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.draw_without_rendering()
    return any("collapsed to zero" in str(w.message) for w in caught)


def draw(data: dict, out: Path, size: tuple[int, int] | None = None, title: str | None = None) -> tuple[int, int]:
    """Write the figure as a PNG of exactly ``size`` pixels (default: 500×420 per panel)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = data["panels"]
    width, height = size or (PANEL_SIZE[0] * len(panels), PANEL_SIZE[1])
    dpi = 100
    fig, axes = plt.subplots(1, len(panels), figsize=(width / dpi, height / dpi), dpi=dpi, squeeze=False,
                             layout="constrained")
    # one look per line (colour and line style: line_look) in every panel, and one legend under the panels
    labels = list(dict.fromkeys(s["label"] for panel in panels for s in panel["series"]))
    handles = {}
    numeric = all(is_number(p["x"]) for panel in panels for s in panel["series"] for p in s["points"])
    xs_all = sorted({p["x"] for panel in panels for s in panel["series"] for p in s["points"]}, key=x_order)
    categories = list(dict.fromkeys(_category(x) for x in xs_all))  # in the order of the lines' points
    for ax, panel in zip(axes[0], panels):
        for line in panel["series"]:
            xs = [p["x"] if numeric else categories.index(_category(p["x"])) for p in line["points"]]
            colour, style = line_look(labels.index(line["label"]))
            handles[line["label"]] = ax.errorbar(
                xs, [100 * p["accuracy"] for p in line["points"]], yerr=[100 * p["ci95"] for p in line["points"]],
                marker="o", markersize=4, capsize=3, linewidth=1.2, color=colour, linestyle=style)
        x_axis(ax, data["x"], xs_all if numeric else categories, numeric)
        ax.set_title(f"{panel.get('ways', data['ways'])}-way {panel['shots']}-shot ({data['split']})")
        ax.set_xlabel(literal(AXIS_LABELS.get(data["x"], data["x"])))
        ax.set_ylabel(y_label(data))
        ax.grid(True, alpha=0.3)
    wrap = max(20, width // 7)  # characters of small text that fit across the figure
    fig.legend([handles[label] for label in labels], [literal(textwrap.fill(label, wrap)) for label in labels],
               loc="outside lower center", fontsize="small", frameon=False)
    if title:
        fig.suptitle(literal(title))
    if size is not None and _collapses(fig):
        plt.close(fig)
        room = f"{max(width, PANEL_SIZE[0] * len(panels))}x{max(height, PANEL_SIZE[1])}"
        raise UsageError(f"--size {width}x{height} leaves no room for {count(len(panels), 'panel')} and the legend "
                         f"of {count(len(labels), 'line')} (matplotlib collapses the panels to nothing); "
                         f"give more pixels, e.g. --size {room}")
    out.parent.mkdir(parents=True, exist_ok=True)
    target = Path(os.path.realpath(out))  # a link to the figure stays a link
    try:  # written whole, then renamed: a viewer or a LaTeX build never reads half a figure, and a write
        with written_whole(target) as tmp:  # that fails (a full disk, Ctrl-C) keeps the one that was there
            fig.savefig(tmp, dpi=dpi, format="png")
    finally:
        plt.close(fig)
    return width, height
