"""The training layer: what runs inside a worker process (training loop,
evaluation protocol, checkpoints, several-process training) and ``fslab eval``.
Imports torch; used by the execution layer, by the CLI for that command and by
the plugin contract checks (:mod:`fslab.testing`), by nothing below it."""
