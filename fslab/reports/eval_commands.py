"""The ``fslab eval`` a report names for a run it could not read: of the shape the report reads, on the
episode count the rest of it is read on, so that the scores it saves make the run comparable (fslab eval's
own default, the protocol's 10,000, would outweigh runs tested on 50, and fewer would cut every other run
to them). ``fslab compare --precision``, ``fslab plot --precision`` and ``fslab study report`` call it."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable

from fslab.core.errors import UsageError
from fslab.core.events import label_params
from fslab.core.rerun import check_evaluable
from fslab.core.runstore import Run, evaluation_named
from fslab.core.summary import read_summary

EVAL_SHOTS = (1, 5)  # what fslab eval scores without --shots


def score_command(run_id: str, ways: int, split: str, precision: str | None, config: dict,
                  episodes: int | None = None, *, shots: Iterable[int] = EVAL_SHOTS,
                  queries: int | None = None, evaluator: str | None = None) -> str:
    """The ``fslab eval`` that scores a completed run's network as a report reads it: the run's own
    shape, evaluator and episodes' seed, ``--ways`` where the report reads other ways than the run's own
    (a study's cell of ``eval.extra_ways``), ``--shots`` where it reads shots fslab eval's 1,5 lack,
    ``--queries`` other than the run's own, ``--split val`` for a study measured on the validation classes,
    ``--evaluator`` with its parameters where the report reads another's scores than the run's own
    (:func:`evaluator_flags`), and ``--episodes`` of the report's count: ``episodes``, the count its scored
    runs reach, else the run's ``eval.test_episodes`` (fslab eval's default, the protocol's 10,000, would pool
    10,000 episodes of one seed with 50 of another at quick scale, one seed outweighing the rest)."""
    own = config.get("eval", {})
    count = episodes or configured_episodes(config)
    shots = list(shots)
    flags = [*(["--split", split] if split != "test" else []),
             *(["--ways", str(ways)] if ways != own.get("ways", 5) else []),
             *(["--shots", ",".join(map(str, shots))] if not set(shots) <= set(EVAL_SHOTS) else []),
             *(["--queries", str(queries)] if queries is not None and queries != own.get("queries", 15) else []),
             *(["--episodes", str(count)] if count else []),
             *(["--precision", precision] if precision else []),
             *evaluator_flags(evaluator)]
    return " ".join(["fslab eval", run_id, *flags])


def evaluator_flags(evaluator: str | None) -> list[str]:
    """How fslab eval is told to score by ``evaluator``, a label as reports read it: ``knn[k=3]`` is
    ``--evaluator knn --set evaluator.k=3``; none for None (the run's own)."""
    if not evaluator:
        return []
    params = label_params(evaluator)
    toml = {"True": "true", "False": "false"}  # a label writes a bool as Python does, --set as TOML
    return [f"--evaluator {evaluator.partition('[')[0]}",
            *(["--set evaluator.KEY=VALUE for each parameter in its label"] if params is None else
              ["--set " + shlex.quote(f"evaluator.{key}={toml.get(value, value)}") for key, value in params])]


def read_on_command(run: Run, config: dict, *, split: str, shots: list[int], ways: int, queries: int,
                    precision: str | None, episodes: Iterable[int | None], evaluator: str | None = None) -> str:
    """The ``fslab eval`` that scores a run a comparison left out (``fslab compare --precision``, ``fslab plot
    --precision``) as the rest is read: its ``split``, ``shots``, ``ways`` and ``queries``, on the most of
    ``episodes``, the count each of its shots is read on (a run scored on fewer would cut the others to
    them), else on the episodes the run's own test drew (:func:`own_test_episodes`); by ``evaluator`` where the
    comparison reads its scores (``--evaluator``)."""
    most = max((n for n in episodes if n), default=None)
    return score_command(run.id, ways, split, precision, config, most or own_test_episodes(run), shots=shots,
                         queries=queries, evaluator=evaluator)


def own_test_episodes(run: Run) -> int | None:
    """The episodes the run's own test drew, as its log recorded them: a slow model-aware evaluator's test
    in training runs at most its ``default_episodes`` (finetune: 100) whatever ``eval.test_episodes`` asks,
    so the count the configuration says (10,000 at paper scale) would ask fslab eval for 100 times as many
    fine-tuned episodes; None where no test was logged (:func:`score_command` then takes the configuration's)."""
    counts = {value["episodes"] for value in read_summary(run.path, save=False).test.values()
              if isinstance(value.get("episodes"), int)}
    return min(counts, default=None)


def configured_episodes(config: dict) -> int | None:
    """The episodes a run's configuration tests on, its ``eval.test_episodes``; None where it sets none or a
    damaged configuration's is no whole number."""
    section = config.get("eval")
    count = section.get("test_episodes") if isinstance(section, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None


def fewest_test_episodes(runs: Iterable[Run], config_of: Callable[[Run], dict]) -> int | None:
    """The one ``--episodes`` of the ``fslab eval RUN`` a report names where no run has the scores asked for
    (compare's and plot's error): the fewest of the episodes each run's own test drew (:func:`own_test_episodes`),
    else of its ``eval.test_episodes`` (``config_of(run)``), the count every run reaches, as reports read them
    (fslab eval's default, the protocol's 10,000, would score runs tested on 50 on 200 times as many); None
    where no run says one."""
    counts = [own_test_episodes(run) or configured_episodes(config_of(run)) for run in runs]
    return min((n for n in counts if n), default=None)


def unevaluable(run: Run) -> str | None:
    """Why ``fslab eval`` refuses to score ``run``, as its line says it (:func:`check_evaluable`, the test it
    makes before torch loads: no checkpoint yet, none ever written, or a damaged one); None where it scores it.
    A report names its fslab eval only for a run it scores, and for the others this instead."""
    try:
        check_evaluable(run)
    except UsageError as exc:
        return str(exc)
    return None


def for_scorable(command: str, run_ids: list[str], refused: Iterable[str] = ()) -> str:
    """``command``, an ``fslab eval RUN ...`` a report names for ``run_ids``, with the ids of the runs fslab eval
    scores in place of ``RUN``, every one (fslab eval takes several, so the line runs as printed, as the
    commands fslab prints do, where ``RUN`` was one to edit first): all of ``run_ids`` but those it refuses
    (``refused``, :func:`unevaluable`); unchanged where it would refuse every one, or none is named."""
    refused = set(refused)
    scorable = [i for i in dict.fromkeys(run_ids) if i not in refused]
    if not scorable:
        return command
    return command.replace(" RUN", " " + " ".join(scorable), 1)


def rescore_commands(run_id: str, names: list[str]) -> list[str]:
    """The ``fslab eval`` that scores again the episodes of each of a run's saved evaluations ``names`` (damaged
    files of ``evaluations/``), read from the file's name (:func:`evaluation_named`): its split, ways, shots,
    queries, episode count, evaluator (``--evaluator`` with its parameters, :func:`evaluator_flags`) and the
    precision of its network where another than the run's; --ways, --queries and --evaluator always, whose default
    is the run's own, which may have changed since. Files alike but for their shots are one (``--shots 1,5``); a
    name not read back (cut to fit) is ``fslab eval ID`` with what to read from it."""
    alike: dict[tuple, list[int]] = {}
    unread = False
    for name in names:
        if (named := evaluation_named(name)) is None:
            unread = True
            continue
        shape = tuple(named[key] for key in ("split", "ways", "queries", "episodes", "precision", "evaluator"))
        alike.setdefault(shape, []).append(named["shots"])
    commands = []
    for (split, ways, queries, episodes, precision, evaluator), shots in alike.items():
        shots = sorted(set(shots))
        commands.append(" ".join([
            "fslab eval", run_id, *(["--split", split] if split != "test" else []), "--ways", str(ways),
            *(["--shots", ",".join(map(str, shots))] if shots != list(EVAL_SHOTS) else []), "--queries", str(queries),
            "--episodes", str(episodes), *(["--precision", precision] if precision else []),
            *evaluator_flags(evaluator)]))
    if unread:
        commands.append(f"fslab eval {run_id} (of the split, shots, queries and episodes its file's name gives)")
    return commands
