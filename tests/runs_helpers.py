"""Helpers for tests that drive the real CLI and real worker processes."""

import json
import signal
import subprocess
import sys
import time
import zipfile

TINY = [
    "--backbone", "conv4", "--set", "backbone.hidden=8",
    "--set", "dataset.classes=24", "--set", "dataset.val_classes=6", "--set", "dataset.test_classes=6",
    "--set", "dataset.images_per_class=20", "--set", "dataset.image_size=16",
    "--batch-size", "32", "--set", "train.log_every=1", "--set", "train.heartbeat=0.2",
    "--set", "eval.val_episodes=20", "--set", "eval.test_episodes=40", "--set", "eval.queries=5",
    "--set", "eval.center_images=64",
]


def with_checkpoint(run) -> None:
    """``run`` with a whole checkpoint, a zip archive, all fslab eval checks of it before it loads torch."""
    run.checkpoint_path.parent.mkdir(exist_ok=True)
    with zipfile.ZipFile(run.checkpoint_path, "w") as archive:
        archive.writestr("checkpoint/data.pkl", b"weights")


# Epochs for a run a test stops, pauses or kills before its end: TINY trains 200 epochs in about
# 13 s on an idle 2-core CPU, so a run of 200 could end before a loaded machine got to stop it.
LONG = "3000"

def fslab(*args, cwd, timeout=300, env=None):
    """Run the real CLI in a subprocess."""
    return subprocess.run([sys.executable, "-m", "fslab", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)


def fslab_here(*args, cwd, env=None):
    """The CLI run in this process, as ``fslab`` would have it (its argv, cwd, environment): its exit
    code, stdout and stderr, as from :func:`fslab`. For a command whose test is not about the process
    itself: it saves each call the interpreter's start and its imports (torch's, TensorBoard's)."""
    import contextlib
    import io
    import os

    from fslab.cli import common, main

    for shared in (common.console, common.err_console):  # made once per process: a COLUMNS set when it was
        shared.width = None  # made (by an earlier call's env) would fix its width; read it at each call, as fslab does
    saved = sys.argv, os.getcwd(), dict(os.environ)
    out, err, code = io.StringIO(), io.StringIO(), 0
    try:
        sys.argv = ["fslab", *args]
        os.chdir(cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            # colours decided for this output, a pipe, as fslab's own process decides them: consoles first made
            # inside a dashboard's test, under Textual's stdout, would print colour codes in every later call
            for shared in (common.console, common.err_console):
                shared._color_system = shared._detect_color_system()
            try:
                main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved[0]
        os.chdir(saved[1])
        os.environ.clear()
        os.environ.update(saved[2])
    return subprocess.CompletedProcess(["fslab", *args], code, out.getvalue(), err.getvalue())


def train_run(project, *args, timeout=600):
    """``fslab run ARGS`` in ``project``, to its end: the run's folder and its test results."""
    result = fslab("run", *args, cwd=project, timeout=timeout)
    assert result.returncode == 0, result.stderr[-2000:]
    folder = max((project / "runs").glob("2*"), key=lambda p: p.stat().st_mtime)
    return folder, json.loads((folder / "results.json").read_text())["test"]


def wait_for(predicate, timeout=120.0, what="condition", interval=0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def events(run_dir, kind=None):
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if kind is None or event.get("event") == kind:
            out.append(event)
    return out


def as_in_a_terminal() -> None:
    """``preexec_fn`` for a process a test sends Ctrl-C (SIGINT): a shell without job
    control starts background commands with SIGINT ignored, and everything they start
    inherits that (Python then never raises KeyboardInterrupt), so a suite run in the
    background would test nothing; this gives the process a terminal's SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def assert_same_test(resumed, twin):
    """A resumed run and its uninterrupted twin scored the same test episodes alike: the same per-episode
    scores in evaluations/, and results.json's mean ± CI of them alike to 1e-6 (a twin saved by fslab 0.1
    took its mean from float32 scores, where fslab now takes it from the six-decimal scores it keeps)."""
    import pytest

    def scores(run_dir):
        return {path.name: json.loads(path.read_text())["accuracies"]
                for path in sorted((run_dir / "evaluations").glob("test-*.json"))}

    assert scores(resumed) == scores(twin) and scores(twin)
    got, want = (json.loads((run_dir / "results.json").read_text())["test"] for run_dir in (resumed, twin))
    assert got.keys() == want.keys()
    for shots, result in want.items():
        assert got[shots] == {key: pytest.approx(value, abs=1e-6) for key, value in result.items()}, shots
