"""torchrun as fslab starts a ``--gpus N`` run's ranks.

``python -m fslab.execution.torchrun ARGS`` is ``python -m torch.distributed.run ARGS``
with one difference: a stop (``fslab stop``, a SLURM job's SIGTERM), which torchrun
passes on to every rank before it ends, ends it with exit code 128 + the signal's number
quietly. torchrun itself raises its ``SignalException`` out of ``main`` for it, so every
clean stop left torchrun's own traceback at the end of the run's ``stderr.log``, under
the ranks' ``fslab: stopped by SIGTERM``.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except SignalException as exc:
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
