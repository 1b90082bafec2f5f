"""A study's report: the published table and fslab's, side by side.

Each row is one published cell (and, in a figure study, every other point its
runs evaluate): the published value, fslab's mean ± 95% CI pooled over the
seeds' episodes of the study's split (the test's, or for a study measured on
the validation classes the final network's scores there) (:func:`fslab.reports.compare.pooled`, the one place that
pools), the difference, and a verdict (:func:`verdict`). The runs come from the
study's latest sweep record (``fslab study run`` writes it, with the scale and
each run's place in the study). Pure Python: matplotlib only for the figures.
"""

from __future__ import annotations

import csv
import io
import json
import os
import statistics
from pathlib import Path

from fslab.core.assignments import assignment
from fslab.core.config import tested_ways
from fslab.core.errors import UsageError, unknown_format
from fslab.core.files import atomic_write_text
from fslab.core.runstore import Run
from fslab.core.schemas import NUMBER, is_kind
from fslab.core.states import RESUMABLE
from fslab.core.studies import SCALES, Study
from fslab.core.sweeps import is_run_id, sweep_records
from fslab.core.text import count, percent
from fslab.reports.compare import (
    RunFiles,
    data_of,
    has_results,
    lacking_lines,
    md,
    no_scores_at_all,
    pooled,
    score_in,
    shared_episodes,
    tex,
    unevaluable_runs,
)
from fslab.reports.eval_commands import own_test_episodes, score_command
from fslab.reports.plot import measured_pair_fraction, x_order

FORMATS = ("md", "latex", "csv", "json")
REPRODUCED, NOT_REPRODUCED, PENDING = "reproduced", "not reproduced", "pending"
NOT_PUBLISHED, NOT_COMPARABLE = "not published", "not comparable"


def verdict(published: float | None, published_ci: float | None, measured: dict | None, complete: bool,
            comparable: bool = True) -> str:
    """``reproduced`` when the published value (percent) lies inside fslab's 95%
    CI widened by the published CI (none given: not widened); ``pending`` while a
    run is missing or unfinished; ``not comparable`` for another scale or dataset."""
    if not complete or measured is None:
        return PENDING
    if published is None:
        return NOT_PUBLISHED
    if not comparable:
        return NOT_COMPARABLE
    reach = 100 * measured["ci95"] + (published_ci or 0.0)
    return REPRODUCED if abs(100 * measured["accuracy"] - published) <= reach + 1e-9 else NOT_REPRODUCED


def latest_record(runs_dir: Path, study: Study, scale: str | None = None) -> dict | None:
    """The newest sweep record ``fslab study run`` wrote for ``study`` (at ``scale``);
    one edited or damaged out of the shape it writes is passed over. A study run by the
    path of its file reads only the records of that file, a registered one only those
    of no file: a copy of a registered study keeps its name, not its settings. The file is
    the one recorded by its absolute path or, in a project copied or moved with it, by its
    path inside the project."""
    records = [r for r in sweep_records(runs_dir) if r.get("study") == study.name and study_record(r)
               and _same_file(r, study, runs_dir) and (scale is None or r["scale"] == scale)]
    return max(records, key=lambda r: r["created"], default=None)


def _same_file(record: dict, study: Study, runs_dir: Path) -> bool:
    """Whether a sweep record was written for ``study``'s file (for a registered study: for none)."""
    if record.get("file") == study.file_key():
        return True
    inside = study.project_file(runs_dir)
    return inside is not None and record.get("project_file") == inside


def study_record(record: dict) -> bool:
    """Whether a sweep record has the fields ``fslab study run`` writes, of their kinds:
    its scale, when it was made, each run's places in the study (lists of tables),
    the datasets trained on in place of the study's and the settings changed."""
    places, datasets = record.get("places"), record.get("datasets", {})
    return (record.get("scale") in SCALES and is_kind(record.get("created"), NUMBER)
            and isinstance(places, dict) and all(is_run_id(run_id) and isinstance(where, list)
                                                 and all(isinstance(place, dict) for place in where)
                                                 for run_id, where in places.items())
            and isinstance(datasets, dict) and all(isinstance(v, str) for v in datasets.values())
            and isinstance(record.get("changed", {}), dict) and isinstance(record.get("project", {}), dict))


def study_report(study: Study, runs_dir: Path, scale: str | None = None, precision: str | None = None) -> dict:
    """The report as a JSON-ready dict (``rows`` in the study's order). ``precision`` (fp32, bf16 or fp16;
    None: each run's own) picks whose scores the cells pool, as ``fslab compare --precision`` reads them
    (:class:`RunFiles`); ``unscored`` names the completed runs without ``split`` scores in it, by state."""
    record = latest_record(runs_dir, study, scale)
    places = record["places"] if record else {}
    used_scale = record["scale"] if record else scale
    datasets = record.get("datasets", {}) if record else {}
    changed = record.get("changed", {}) if record else {}
    project = record.get("project", {}) if record else {}
    # runs queued under an earlier edit of the study's sweeps: not what the file asks now (records of an
    # fslab that kept no digest are taken as they are)
    edited = bool(record) and record.get("settings", study.settings_digest()) != study.settings_digest()
    comparable = (used_scale == "paper" and all(k == v for k, v in datasets.items()) and not changed and not project
                  and not edited)
    files = RunFiles(precision)
    rows = []
    for sweep in study.sweeps:
        seeds = study.seeds(used_scale or "paper")[sweep.name]
        for dataset in sweep.datasets:
            for point in study.points(sweep, used_scale or "paper"):
                place = {"sweep": sweep.name, "dataset": dataset, "at": point}
                runs = [Run(Path(runs_dir) / run_id) for run_id, where in places.items() if place in where]
                rows += _point_rows(study, sweep, place, runs, seeds, comparable, files)
    for row in rows:  # places alike in every setting are one run (study_plan.distinct_runs): said, never pooled twice
        row["shared_with"] = shared_with(row, places)
    numbers, notes = shared_notes(rows)  # each such row's mark and the notes under the table, for every format
    for row, number in zip(rows, numbers):
        row["shared_note"] = number
    # runs that ended killed, failed or lost: their cells stay pending, and nothing finishes them unless asked
    states = {run_id: Run(Path(runs_dir) / run_id).state() for run_id in places}
    stopped = {run_id: state for run_id, state in states.items() if state in RESUMABLE}
    # runs deleted since (fslab delete, or by hand): their cells stay pending too, and only fslab study run, which
    # creates them again, finishes them
    missing = [run_id for run_id in places if not (Path(runs_dir) / run_id).is_dir()]
    # completed runs of no scores in the precision asked for: their cells stay pending until fslab eval scores them
    completed = [Run(Path(runs_dir) / run_id) for run_id, state in states.items() if state == "completed"]
    unscored = no_scores_at_all(completed, study.split, files) if precision else {}
    # of the completed runs a cell lacks and those --precision finds without any scores, each fslab eval would
    # refuse (no checkpoint, a damaged one): named with why, not a command it refuses
    cells_lack = [run_id for row in rows for run_id in row["unscored_runs"] if run_id not in unscored]
    lacking = unevaluable_runs([Run(Path(runs_dir) / run_id) for run_id in dict.fromkeys([*unscored, *cells_lack])])
    # the fslab eval that scores each other completed run a cell lacks, of the cell's shape (one already said, the
    # runs --precision finds without any scores, aside)
    to_score = list(dict.fromkeys(lacking_command(Run(Path(runs_dir) / run_id), row, study.split, precision, files)
                                  for row in rows for run_id in row["unscored_runs"]
                                  if run_id not in unscored and run_id not in lacking))
    unscored_commands = {run_id: unscored_command(Run(Path(runs_dir) / run_id), rows, study.split, precision, files)
                         for run_id in unscored if run_id not in lacking}
    return {"study": study.name, "title": study.title, "what": study.what, "paper": study.paper.cite(),
            "split": study.split, "precision": precision, "scale": used_scale, "datasets": datasets,
            "changed": changed, "project": project, "unscored": unscored, "unscored_commands": unscored_commands,
            "unevaluable": lacking,
            "comparable": comparable, "edited": edited, "sweep": record["id"] if record else None,
            "stopped": stopped, "missing": missing, "to_score": to_score, "rows": rows, "shared_notes": notes,
            "damaged": files.damaged([Run(Path(runs_dir) / i) for i in places])}


def lacking_command(run: Run, row: dict, split: str, precision: str | None, files: RunFiles) -> str:
    """The fslab eval that scores a completed run lacking cell ``row``'s scores: of the cell's ways, on the
    episodes its scored runs reach, else the run's own test's (:func:`own_test_episodes`)."""
    return score_command(run.id, row["ways"], split, precision, files.config(run),
                         row["scored_episodes"] or own_test_episodes(run))


def unscored_command(run: Run, rows: list[dict], split: str, precision: str, files: RunFiles) -> str:
    """The fslab eval that scores a run with no scores in ``precision`` at all: its own shape, on the episodes
    of its cells at its own ways (the most their scored runs reach: a cell of fewer reads the first), else
    its own test's, as :func:`score_command` names them (fslab eval's default, 10,000, would outweigh the
    cell's other seeds)."""
    config = files.config(run)
    ways = config.get("eval", {}).get("ways", 5)
    cells = [row["scored_episodes"] for row in rows if run.id in row["run_ids"] and row["ways"] == ways]
    episodes = max((n for n in cells if n), default=None) or own_test_episodes(run)
    return score_command(run.id, ways, split, precision, config, episodes)


def to_score_line(report: dict) -> str | None:
    """The cells whose completed runs lack their scores, and the fslab eval that scores them, as the line under
    the title and stderr say it, or, for a run fslab eval would refuse (its checkpoint gone or damaged:
    ``unevaluable``), its line instead (:func:`lacking_lines`); None where there are none."""
    said = report.get("unscored", {})  # runs --precision finds without any scores: _precision_text names them
    lack = [run_id for row in report["rows"] for run_id in row.get("unscored_runs", []) if run_id not in said]
    refused = {run_id: why for run_id, why in report.get("unevaluable", {}).items() if run_id in lack}
    if not report.get("to_score") and not refused:
        return None
    cells = sum(1 for row in report["rows"] if any(run_id not in said for run_id in row.get("unscored_runs", [])))
    commands = report["to_score"]
    shown = "; ".join(commands[:3]) + ("; ..." if len(commands) > 3 else "")
    one = cells == 1
    why = "".join(f"; {line}" for line in lacking_lines(refused))
    return (f"{count(cells, 'cell')} {'lacks' if one else 'lack'} the scores of {'its' if one else 'their'} completed "
            f"runs (fslab study run reuses a completed run as done), so {'it stays' if one else 'they stay'} pending"
            f"{f' until fslab eval scores them: {shown}' if commands else ''}{why}")


def shared_with(row: dict, places: dict[str, list[dict]]) -> list[dict]:
    """The other places of the study (sweep, dataset, grid point) whose runs a row's are: places alike in
    every setting share one run (at quick scale, two datasets both trained on synthetic; sweeps that differ
    only in what a study ignores, the device or train.processes), so their cells show one measurement."""
    own = {"sweep": row["sweep"], "dataset": row["dataset"], "at": row["at"]}
    others = []
    for run_id in row["run_ids"]:
        others += [place for place in places.get(run_id, []) if place != own and place not in others]
    return others


def _point_rows(study: Study, sweep, place: dict, runs: list[Run], seeds: int, comparable: bool,
                files: RunFiles) -> list[dict]:
    cells = {(c.ways, c.shots): c for c in study.published
             if (c.sweep, c.dataset, c.at) == (place["sweep"], place["dataset"], place["at"])}
    shapes = list(cells)
    completed = [r for r in runs if r.state() == "completed"]
    # the point's episode shapes from the first run whose configuration can be read: the first seed's may be gone
    config = next((found for run in runs if (found := files.config(run))), {})
    if study.kind == "figure" and config:
        evaluated = config.get("eval", {})
        shapes += [(w, s) for w in tested_ways(evaluated["ways"], evaluated.get("extra_ways", []))
                   for s in evaluated["shots"] if (w, s) not in cells]
    rows = []
    if not shapes and study.kind == "figure":
        shapes = [(None, None)]  # a figure's point without runs yet: one pending row
    for ways, shots in shapes:
        cell = cells.get((ways, shots))
        queries = config.get("eval", {}).get("queries", 15)
        # seeds scored on different data (a folder's other root, files changed on disk) are never pooled, as in
        # fslab compare: one mean of them would be a number of no data set
        mixed = bool(shots) and len({d for r in completed if (d := data_of(r, study.split, None, files,
                                                                           ([shots], ways, queries)))}) > 1
        measured = (pooled(completed, study.split, shots, ways, queries, None, files)
                    if completed and shots and not mixed else None)
        # every run done and scored: a completed run whose scores are missing (evaluations/ left behind by a
        # copy) adds none to the pool, and a verdict on the others would read as one on every seed
        scored = measured["runs"] if measured else 0
        complete = len(runs) >= seeds and len(completed) == len(runs) and scored == len(runs)
        published = cell.accuracy if cell else None
        # completed runs without the cell's scores (a copy that left evaluations/ behind): fslab study run reuses
        # them as done, so only fslab eval finishes the cell (to_score)
        lacking = [r.id for r in completed if shots and not mixed
                   and not has_results(r, study.split, [shots], ways, queries, None, files)]
        # the episodes every scored run of the cell reaches: what it read of each (more than the runs' own test drew
        # where fslab eval scored them all on more), and what the fslab eval of each run lacking its scores repeats
        counted = shared_episodes(completed, study.split, shots, ways, queries, None, files) if measured else None
        rows.append({
            "label": sweep.label, "sweep": sweep.name, "dataset": place["dataset"], "at": place["at"],
            "ways": ways, "shots": shots, "published": published, "published_ci95": cell.ci95 if cell else None,
            "measured": measured, "runs": len(runs), "completed": len(completed), "scored": scored, "expected": seeds,
            "run_ids": [r.id for r in runs], "unscored_runs": lacking, "scored_episodes": counted,
            "test_episodes": config.get("eval", {}).get("test_episodes"),
            "difference": (100 * measured["accuracy"] - published) if measured and published is not None else None,
            "mixed_data": mixed,
            "verdict": NOT_COMPARABLE if mixed else verdict(published, cell.ci95 if cell else None, measured,
                                                            complete, comparable),
        })
    return rows


# -- rendering ---------------------------------------------------------------------


def scale_line(report: dict) -> str:
    """Which scale and data produced the report, in one sentence."""
    if report["sweep"] is None:
        at = f" at scale {report['scale']}" if report["scale"] else ""
        return f"No runs yet (fslab study run has not been run for this study{at}): every cell is pending."
    swaps = [f"{k} -> {v}" for k, v in report["datasets"].items() if k != v]
    text = f"Scale: {report['scale']}; sweep {report['sweep']}"
    if swaps:
        text += f"; trained and tested on other data ({', '.join(swaps)})"
    if report.get("changed"):
        text += f"; with {', '.join(assignment(k, v) for k, v in report['changed'].items())} from the command line"
    if report.get("project"):
        text += f"; with {', '.join(assignment(k, v) for k, v in report['project'].items())} from [run] of fslab.toml"
    if report.get("edited"):
        text += ("; its runs were queued before the study file's sweeps were last edited (fslab study run "
                 "queues what the file asks now)")
    if report.get("stopped"):
        states = " or ".join(sorted(set(report["stopped"].values())))
        one = len(report["stopped"]) == 1
        text += (f"; {count(len(report['stopped']), 'run')} ended {states}, so {'its' if one else 'their'} cells stay "
                 f"pending until fslab study run queues {'it' if one else 'them'} again")
    if report.get("missing"):
        one = len(report["missing"]) == 1
        text += (f"; {count(len(report['missing']), 'run')} of the study {'is' if one else 'are'} gone from the store "
                 f"(deleted), so {'its' if one else 'their'} cells stay pending until fslab study run creates "
                 f"{'it' if one else 'them'} again")
    if mixed := sum(1 for row in report["rows"] if row.get("mixed_data")):
        text += (f"; the runs of {count(mixed, 'cell')} were scored on different data (other files or another "
                 f"root), so those cells pool none of them (fslab compare of their runs gives each data its own mean)")
    if line := more_episodes_text(report["rows"]):
        text += f"; {line}"
    if line := cut_episodes_text(report["rows"]):
        text += f"; {line}"
    if shared := sum(1 for row in report["rows"] if row.get("shared_with")):
        text += (f"; {count(shared, 'cell')} {'shows' if shared == 1 else 'show'} runs another place of the study "
                 f"shares (places alike in every setting are one run), so such cells are one measurement shown in "
                 f"each, not independent results")
    if report.get("precision"):
        text += _precision_text(report)
    if line := to_score_line(report):
        text += f"; {line}"
    if report.get("split") == "val":
        text += "; accuracies on the validation classes, as the paper's"
    if not report["comparable"]:
        # a figure prints no numbers: its rows' verdict is "not published", none "not comparable"
        said = " (verdict: not comparable)" if any(row["published"] is not None for row in report["rows"]) else ""
        text += f". These numbers are not comparable to the paper's{said}"
    return text + "."


def more_episodes_text(rows: list[dict]) -> str | None:
    """The cells that read each run on more episodes than its own test drew (its ``eval.test_episodes``): the
    scores ``fslab eval --episodes`` saved beside the run's own where every run of the cell has them (the first
    episodes of the seeded stream are the same whatever the count), as the line under the title says it; None
    where every cell read the runs' own count."""
    more = [row for row in rows if row.get("scored_episodes") and row.get("test_episodes")
            and row["scored_episodes"] > row["test_episodes"]]
    if not more:
        return None
    counts = ", ".join(f"{n:,}" for n in sorted({row["scored_episodes"] for row in more}))
    own = ", ".join(f"{n:,}" for n in sorted({row["test_episodes"] for row in more}))
    one = len(more) == 1
    return (f"{count(len(more), 'cell')} {'reads' if one else 'read'} each run on {counts} episodes, the scores "
            f"fslab eval saved beside the runs' own test of {own} (every run of {'the cell' if one else 'each'} has "
            f"them; fslab runs shows the runs' own)")


def cut_episodes_text(rows: list[dict]) -> str | None:
    """The cells whose scored runs were scored on different episode counts (one on the 10,000 of fslab eval's
    default, another on its own test's 50): each run is read on its first as many as every run of the cell
    reaches (the first episodes of the seeded stream are the same whatever the count), so each weighs as
    much, as the line under the title says it with the runs cut; None where there are none."""
    cut = [row for row in rows if row["measured"] and row["measured"].get("cut")]
    if not cut:
        return None
    runs = [i for row in cut for i in row["measured"]["cut"]]
    counts = ", ".join(f"{n:,}" for n in sorted({row["measured"]["episodes_per_run"] for row in cut}))
    one = len(cut) == 1
    its, each = ("its", "the cell") if one else ("their", "each")
    their = "its" if len(runs) == 1 else "their"
    return (f"the runs of {count(len(cut), 'cell')} were scored on different episode counts, so {its} mean reads "
            f"each on the {counts} every run of {each} reaches, cutting {count(len(runs), 'run')} scored on more "
            f"to {their} first: {', '.join(runs[:5])}{', ...' if len(runs) > 5 else ''}")


def _precision_text(report: dict) -> str:
    """Whose scores a report read with ``--precision``, and its runs without them (``unscored``), with the
    fslab eval that scores them, as the line under the title says it."""
    precision, unscored = report["precision"], report["unscored"]
    text = (f"; scores of the network in {precision} (each run's own where it ran in {precision}, else those "
            f"fslab eval --precision {precision} saved)")
    if unscored:
        one = len(unscored) == 1
        text += (f"; {count(len(unscored), 'run')} without {report['split']} scores of the network in {precision}, "
                 f"so {'its' if one else 'their'} cells stay pending "
                 f"({score_in(list(unscored), precision, report.get('unscored_commands'), report.get('unevaluable'))})")
    return text


def shared_notes(rows: list[dict]) -> tuple[list[int | None], list[str]]:
    """Each row's note number where another place of the study shares its runs (``shared_with``; None
    where none does), and the notes, one per group of places that share runs: every format marks a row
    by its number (md and latex after its runs, ``[1]``, csv and json in ``shared_note``, json's notes in
    ``shared_notes``), where such a cell read ``(2/2 runs)`` as an independent one does. Computed once, by
    :func:`study_report`, which every format renders. A place is named by its sweep's label, and by its name too
    where another sweep has that label (:func:`sweep_labels`): two groups of nca-table3's two ProtoNet (Snell
    setup) sweeps were two notes of the same words."""
    labels = sweep_labels(rows)
    groups: dict[tuple, int] = {}
    numbers, notes = [], []
    for row in rows:
        if not row.get("shared_with"):
            numbers.append(None)
            continue
        places = [{"sweep": row["sweep"], "dataset": row["dataset"], "at": row["at"]}, *row["shared_with"]]
        key = tuple(sorted(json.dumps(place, sort_keys=True) for place in places))
        if key not in groups:
            groups[key] = len(groups) + 1
            named = "; ".join(place_text(place, labels) for place in places)
            notes.append(f"[{groups[key]}] {named}: the same runs (places alike in every setting are one run), "
                         f"one measurement shown in each, not independent results")
        numbers.append(groups[key])
    return numbers, notes


def place_text(place: dict, labels: dict[str, str]) -> str:
    """A place of the study as the table's columns name it: method (its sweep's label), dataset and setting."""
    at = ", ".join(assignment(k, v) for k, v in place["at"].items())
    return ", ".join([labels.get(place["sweep"], place["sweep"]), place["dataset"], *([at] if at else [])])


def _cells(row: dict, pm: str, note: int | None = None) -> list[str]:
    published = "-" if row["published"] is None else f"{row['published']:.2f}" + (
        f"{pm}{row['published_ci95']:.2f}" if row["published_ci95"] is not None else "")
    m = row["measured"]
    measured = "-" if m is None else f"{percent(m['accuracy'])}{pm}{percent(m['ci95'])}"
    if row.get("mixed_data"):  # none pooled: a count of them would read as a mean still to come
        measured += " (runs scored on different data)"
    elif row["completed"] or row["runs"]:  # the runs whose scores are pooled, of those the point needs
        measured += f" ({row.get('scored', row['completed'])}/{max(row['expected'], row['runs'])} runs)"
    if note is not None:  # runs another place shows too: one measurement (shared_notes)
        measured += f" [{note}]"
    difference = "-" if row["difference"] is None else percent(row["difference"] / 100, sign=True)
    at = ", ".join(assignment(k, v) for k, v in row["at"].items()) or "-"
    episodes = f"{row['ways']}-way {row['shots']}-shot" if row["shots"] else "-"
    return [row["label"], row["dataset"], at, episodes, published, measured,
            difference, row["verdict"]]


HEADER = ["method", "dataset", "setting", "episodes", "published", "fslab (mean ± 95% CI)", "difference", "verdict"]
ALIGN = "llllrrrl"  # each column's alignment: the numbers right-aligned, in md as in latex


def render(report: dict, fmt: str) -> str:
    """The report as Markdown, LaTeX, CSV or JSON text."""
    if fmt == "json":
        return json.dumps({**report, "rows": [_json_row(row) for row in report["rows"]]}, indent=2)
    numbers, notes = [row["shared_note"] for row in report["rows"]], report["shared_notes"]  # study_report's
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["method", "dataset", "setting", "ways", "shots", "published_pct", "published_ci95_pct",
                         "accuracy_pct", "ci95_pct", "episodes", "completed_runs", "scored_runs", "expected_runs",
                         "difference_pct", "verdict", "scale", "split", "precision", "shared_note", "shared_with"])
        labels = sweep_labels(report["rows"])  # as the notes name places
        # precision: the one read (--precision); empty: each run's own, as fslab compare's csv says it
        writer.writerows([*_csv_row(row, report["scale"]), report["split"], report["precision"] or "", _blank(note),
                          "; ".join(place_text(place, labels) for place in row["shared_with"])]
                         for row, note in zip(report["rows"], numbers))
        return buffer.getvalue()
    if fmt not in ("md", "latex"):
        raise UsageError(unknown_format(fmt, FORMATS))
    title = f"{report['what']} of {report['paper']}: {report['title']}"
    lines = [_cells(row, " ± ", note) for row, note in zip(report["rows"], numbers)]
    if fmt == "md":
        out = [f"# {report['study']}", "", title, "", scale_line(report), "",
               "| " + " | ".join(HEADER) + " |", "|" + "".join("---:|" if a == "r" else "---|" for a in ALIGN)]
        out += ["| " + " | ".join(md(c) for c in cells) + " |" for cells in lines]
        out += [line for note in notes for line in ("", md(note))]
    else:
        out = [f"% {report['study']}: {title}", f"% {scale_line(report)}",
               f"\\begin{{tabular}}{{{ALIGN}}}", " & ".join(tex(h) for h in HEADER) + " \\\\", "\\hline"]
        out += [" & ".join(tex(c) for c in cells) + " \\\\" for cells in lines]
        out += (["\\hline"] if notes else []) + [f"\\multicolumn{{{len(HEADER)}}}{{l}}{{{tex(note)}}} \\\\"
                                                for note in notes]
        out.append("\\end{tabular}")
    return "\n".join(out) + "\n"


def _json_row(row: dict) -> dict:
    """A report row as ``--format json`` writes it: every accuracy, CI and difference in
    percent (points), each named so (``_pct``), as the papers print them; the report's own
    rows keep fslab's fractions for the measured ones (the figures read those)."""
    out = {k: v for k, v in row.items()
           if k not in ("published", "published_ci95", "measured", "difference", "scored_episodes", "test_episodes")}
    at = list(out).index("shots") + 1
    items = list(out.items())
    m = row["measured"]
    measured = None if m is None else {"accuracy_pct": _pct(m["accuracy"]), "ci95_pct": _pct(m["ci95"]),
                                       **{k: v for k, v in m.items() if k not in ("accuracy", "ci95")}}
    units = {"published_pct": row["published"], "published_ci95_pct": row["published_ci95"], "measured": measured,
             "difference_pct": _points(row["difference"])}
    return dict(items[:at] + list(units.items()) + items[at:])


def _csv_row(row: dict, scale: str | None) -> list:
    m = row["measured"] or {}
    return [row["label"], row["dataset"], json.dumps(row["at"]) if row["at"] else "", row["ways"], row["shots"],
            _blank(row["published"]), _blank(row["published_ci95"]), _blank(_pct(m.get("accuracy"))),
            _blank(_pct(m.get("ci95"))), _blank(m.get("episodes")), row["completed"], row["scored"], row["expected"],
            _blank(_points(row["difference"])), row["verdict"], scale or ""]


def _blank(value) -> str:
    return "" if value is None else str(value)


def _pct(fraction: float | None) -> float | None:
    """A measured accuracy or CI (a fraction) in percent, to 4 decimals."""
    return None if fraction is None else round(100 * fraction, 4)


def _points(difference: float | None) -> float | None:
    """A difference (already in percentage points) to 4 decimals; one that rounds to zero is 0.0, not the
    -0.0 a float's noise gives (56.99999999999999 measured against 57.0 published)."""
    return None if difference is None else round(difference, 4) + 0.0


def figure_data(report: dict, study: Study, runs_dir: Path) -> dict[str, dict]:
    """For a figure study with ``plot.x``: one figure per dataset (a panel per
    episode shape, ways then shots; a line per sweep) in the shape :func:`fslab.reports.plot.draw` takes.
    A sweep without that grid key is placed on a ``loss.pair_fraction`` axis by
    the fraction of pairs its runs' losses used (Fig. 3's ProtoNet points)."""
    if study.plot_x is None:
        return {}
    figures = {}
    for dataset in dict.fromkeys(row["dataset"] for row in report["rows"]):
        placed = [(r, _x_of(r, study.plot_x, runs_dir)) for r in report["rows"]
                  if r["dataset"] == dataset and r["measured"]]
        placed = [(r, x) for r, x in placed if x is not None]
        label = sweep_labels([r for r, _ in placed])
        panels = []
        for ways, shots in sorted({(r["ways"], r["shots"]) for r, _ in placed}):
            series: dict[str, list] = {}  # a line per sweep: two sweeps of one label are two lines
            for r, x in placed:
                if (r["ways"], r["shots"]) == (ways, shots):
                    series.setdefault(r["sweep"], []).append({"x": x, **r["measured"]})
            panels.append({"ways": ways, "shots": shots,
                           "series": [{"label": label[k], "points": sorted(v, key=lambda p: x_order(p["x"]))}
                                      for k, v in series.items()]})
        if panels:
            figures[dataset] = {"x": study.plot_x, "split": study.split, "ways": panels[0]["ways"], "queries": None,
                                "precision": report["precision"], "panels": panels}  # the y axis names it
    return figures


def sweep_labels(rows: list[dict]) -> dict[str, str]:
    """Each sweep's label as a figure's legend and the notes under a table name it: its label, and its name beside
    a label other sweeps share (``ProtoNet (pn-1shot)``), so that they tell its places apart (one label drew both
    sweeps' points as one line)."""
    labels = {r["sweep"]: r["label"] for r in rows}
    shared = {label for label in labels.values() if list(labels.values()).count(label) > 1}
    return {sweep: f"{label} ({sweep})" if label in shared else label for sweep, label in labels.items()}


def _x_of(row: dict, key: str, runs_dir: Path):
    if key in row["at"]:
        return row["at"][key]
    if key == "loss.pair_fraction":
        fractions = [f for run_id in row["run_ids"] if (f := measured_pair_fraction(Run(Path(runs_dir) / run_id)))
                     is not None]
        return statistics.fmean(fractions) if fractions else None
    return None


def figure_title(report: dict, study: Study, dataset: str) -> str:
    """A figure's title: the study's figure, its dataset and scale, and, where
    the runs trained on other data, that data, so a PNG seen alone says so."""
    data = report["datasets"].get(dataset, dataset)
    where = dataset if data == dataset else f"{dataset}, trained and tested on {data}"
    return f"{study.what} ({where}, scale {report['scale']})"


def write_report(report: dict, study: Study, fmt: str, out: Path, runs_dir: Path) -> list[Path]:
    """The report file and, for a figure study, one PNG per dataset, in ``out``."""
    from fslab.reports.plot import draw

    out.mkdir(parents=True, exist_ok=True)
    suffix = {"md": "md", "latex": "tex", "csv": "csv", "json": "json"}[fmt]
    written = [out / f"{study.name}.{suffix}"]
    # written whole, then renamed (a link to it stays a link): a write that fails keeps the report there was
    atomic_write_text(Path(os.path.realpath(written[0])), render(report, fmt))
    for dataset, data in figure_data(report, study, runs_dir).items():
        path = out / f"{study.name}-{dataset}.png"
        draw(data, path, title=figure_title(report, study, dataset))
        written.append(path)
    return written
