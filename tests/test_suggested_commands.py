"""Every fslab command a message suggests is accepted when typed as it is printed: tiny real runs (completed,
failed in training, killed before its first checkpoint, queued) driven through the error situations that name
one (scores missing, of a shape, of a precision; a damaged saved evaluation; a parameter of another plugin),
each command printed then run as it is, and none refused again."""

import json
import re
import shlex
import textwrap

import pytest

from fslab.core.runstore import create_run

from .runs_helpers import TINY, fslab, fslab_here, train_run

pytestmark = pytest.mark.slow

# a command as messages print it: up to the end of its clause (; or the line's end), or a parenthesis after it
COMMAND = re.compile(r"fslab [a-z]+(?: (?!\()[^\s;]+)*")
# an option a refusal names to add, at the end of its line
OPTIONS = re.compile(r"(?:: |with )((?:--[a-z-]+ [^\s;]+ ?)+)$")

BOOM = textwrap.dedent("""
    from fslab.plugin import hookimpl

    def boom(z, labels, support=None):
        raise RuntimeError("the loss exploded on purpose.")

    @hookimpl
    def register_losses(register):
        register(boom, name="boom", description="always raises")
""")


def _commands(text: str) -> list[list[str]]:
    """The fslab commands ``text`` names, each as argv, as printed: none holds a placeholder to edit first
    (``fslab eval RUN --shots 20`` where fslab eval would refuse none of the runs, ``fslab stop RUN``)."""
    found = []
    for line in text.splitlines():
        for command in COMMAND.findall(line):
            found.append(shlex.split(command.rstrip(".,)"))[1:])
    return found


@pytest.fixture
def runs(project):
    """Runs of each state, tiny: two completed (the first scored in bf16 too), one failed in training, one
    killed before its first checkpoint, one queued."""
    (project / "local_plugins").mkdir()
    (project / "local_plugins" / "boom.py").write_text(BOOM)
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['local_plugins']\n")
    made = {}
    for name, seed in (("scored", "0"), ("unscored", "1")):
        made[name] = train_run(project, "nca", *TINY, "--epochs", "1", "--seed", seed)[0].name
    bf16 = fslab_here("eval", made["scored"], "--precision", "bf16", "--episodes", "40", cwd=project)
    assert bf16.returncode == 0, bf16.stderr
    before = set((project / "runs").iterdir())
    assert fslab("run", "nca", *TINY, "--seed", "2", "--set", "loss.name=boom", cwd=project).returncode == 1
    (made["failed"],) = [p.name for p in set((project / "runs").iterdir()) - before]
    started = fslab("run", "nca", *TINY, "--epochs", "2", "--seed", "3", "--detach", cwd=project)
    made["killed"] = started.stdout.strip()
    assert fslab("stop", made["killed"], cwd=project).returncode == 0  # as it starts: before its first epoch ends
    assert not (project / "runs" / made["killed"] / "checkpoints" / "last.pt").exists()
    config = json.loads((project / "runs" / made["scored"] / "config.json").read_text())
    made["queued"] = create_run(project / "runs", "nca", {**config, "seed": 4}).id
    return made


def test_every_command_a_message_suggests_is_accepted_when_typed(project, runs):
    """compare and plot --precision named fslab eval ID for a queued run and one killed before its first
    checkpoint, which fslab eval refused; a damaged evaluation's line said 'fslab eval ID (the file's name
    gives ...)'; --set evaluator.k=3 said 'Allowed: (none)'. Each situation's suggestions, run as printed,
    are accepted: an fslab eval scores (exit 0), an fslab run --like starts a run (the failed one's fails in
    training again, exit 1, but is not refused), an option named is taken."""
    ids = list(runs.values())
    completed = [runs["scored"], runs["unscored"]]  # runs fslab eval refuses none of: it named them RUN
    damaged = next((project / "runs" / runs["scored"] / "evaluations").glob("test-*-5shot-*ep-seed*-epoch1.json"))
    saved = json.loads(damaged.read_text())
    damaged.write_text(json.dumps({**saved, "accuracies": [float("nan"), *saved["accuracies"][1:]]}))
    out = str(project / "lr.png")
    situations = [
        ["compare", *completed, "--precision", "fp16"],  # neither scored in fp16: "score each so with"
        ["compare", *completed, "--shots", "2"],  # a shape neither has: "run: fslab eval"
        ["compare", *ids, "--precision", "bf16"],  # scores of a precision some runs lack
        ["plot", "train.lr", *ids, "--precision", "bf16", "--out", out],
        ["compare", runs["unscored"], runs["failed"], runs["killed"], runs["queued"], "--precision", "fp16"],
        ["compare", *ids, "--ways", "3"],  # scores of a shape none has (fslab eval RUN: of 10,000 episodes)
        ["compare", *ids],  # the damaged evaluation
        ["eval", runs["killed"]], ["eval", runs["failed"]], ["resume", runs["killed"]], ["resume", runs["scored"]],
        ["sweep", "resume", runs["killed"]], ["sweep", "resume", runs["unscored"]],  # a run's id, not a sweep's
    ]
    tried: dict[tuple, str] = {}
    for situation in situations:
        said = fslab_here(*situation, cwd=project)
        refusal = said.stderr.strip().splitlines()[-1] if said.stderr.strip() else ""
        for argv in _commands(said.stdout + said.stderr):
            assert "RUN" not in argv and "ID" not in argv, (situation, argv)  # to be typed as printed
            if tuple(argv) in tried:
                continue
            # an fslab eval in this process (its interpreter's start and torch's import spared, ~2 s each);
            # an fslab run --like in its own, which starts a worker as typed
            done = (fslab_here if argv[0] == "eval" else fslab)(*argv, cwd=project)
            tried[tuple(argv)] = refusal
            assert done.returncode != 2 and (not refusal or refusal not in done.stderr), (situation, argv, done.stderr)
            if argv[0] == "eval":
                assert done.returncode == 0, (situation, argv, done.stderr)
    named = {argv[0] for argv in tried}
    assert {"eval", "run"} <= named, tried  # the situations named both: the test read them
    assert any("--precision" in argv for argv in tried) and any("--like" in argv for argv in tried), tried
    assert fslab_here("compare", *ids, cwd=project).stderr.count("damaged") == 0  # its eval scored it again


@pytest.mark.parametrize("refused", [
    ["eval", "RUN", "--set", "evaluator.k=3"],
    ["run", "nca", *TINY, "--epochs", "1", "--set", "evaluator.k=3"],
])
def test_the_option_a_refusal_names_is_taken(project, refused):
    """--set evaluator.k=3 with nca's centroid evaluator said 'Allowed: (none)', naming nothing to give; the
    refusal names the option that chooses knn, whose parameter k is (fslab run's --set evaluator.name=knn,
    fslab eval's --evaluator knn), and the command with it added, as printed, is accepted."""
    run = train_run(project, "nca", *TINY, "--epochs", "1")[0].name if "RUN" in refused else None
    argv = [run if word == "RUN" else word for word in refused]
    said = fslab_here(*argv, cwd=project)
    assert said.returncode == 2 and len(said.stderr.splitlines()) == 1, said.stderr
    (options,) = OPTIONS.findall(said.stderr.strip())
    done = fslab(*argv, *shlex.split(options), cwd=project)
    assert done.returncode == 0, (options, done.stderr)
