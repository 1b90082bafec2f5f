"""The fslab command lines that messages suggest, each spelt in one place."""

from __future__ import annotations


def like_command(run_id: str) -> str:
    """The command that starts a run with ``run_id``'s settings again (``fslab run --like``): what a run that
    cannot go on, or a plugin it needs that is gone, is told to do."""
    return f"fslab run --like {run_id}"


def resume_there_command(run_id: str, root: str = "DIR") -> str:
    """The command that resumes a run on the data it started on where that lies elsewhere now (``fslab resume
    --data-root``): what a resume refused for a data root gone or changed is told, beside the way back."""
    return f"fslab resume {run_id} --data-root {root}"
