"""torchrun as fslab starts a ``--gpus N`` run's ranks.

``python -m fslab.execution.torchrun ARGS`` is ``python -m torch.distributed.run ARGS``
with two differences:

- a stop (``fslab stop``, a SLURM job's SIGTERM), which torchrun passes on to every rank
  before it ends, ends it with exit code 128 + the signal's number quietly. torchrun itself
  raises its ``SignalException`` out of ``main`` for it, so every clean stop left torchrun's
  own traceback at the end of the run's ``stderr.log``, under the ranks' ``fslab: stopped by
  SIGTERM``;
- its log folder, ``--log-dir RUN_DIR/.torchrun`` as :func:`fslab.execution.local.worker_command`
  gives it (:data:`LOG_DIR`), is removed when torchrun ends, however it ends short of SIGKILL.
  torchrun makes a folder per rank there (and, given no ``--log-dir``, makes one with
  ``tempfile.mkdtemp(prefix="torchelastic_")``: ``DefaultLogsSpecs`` in
  ``torch.distributed.elastic.multiprocessing.api``) and never removes it, so every run of several
  processes left a ``torchelastic_*`` folder in the user's ``/tmp``. fslab's ranks write their
  output to the run's own ``stdout.log`` and ``stderr.log``; the folder holds nothing of theirs (one
  a killed torchrun leaves goes with the run's folder, and at the run's next start under torchrun).
"""

from __future__ import annotations

import os
import shutil
import sys

LOG_DIR = ".torchrun"  # torchrun's log folder, in the run's folder: removed when torchrun ends


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    argv = sys.argv[1:] if argv is None else argv
    try:
        torchrun(argv)
    except SignalException as exc:
        return 128 + int(exc.sigval)
    finally:
        if (folder := log_dir(argv)) is not None:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


def log_dir(argv: list[str]) -> str | None:
    """The ``--log-dir`` among torchrun's options in ``argv`` (before the module or script it runs) where it is
    fslab's (named :data:`LOG_DIR`), to be removed when torchrun ends; else None (one given by hand is kept)."""
    for at, arg in enumerate(argv):
        if arg == "-m" or not arg.startswith("-"):
            break
        folder = arg.partition("=")[2] if arg.startswith("--log-dir=") else (
            argv[at + 1] if arg == "--log-dir" and at + 1 < len(argv) else None)
        if folder is not None:
            return folder if os.path.basename(os.path.normpath(folder)) == LOG_DIR else None
    return None


if __name__ == "__main__":
    sys.exit(main())
