"""The training layer: what runs inside a worker process (training loop,
evaluation protocol, checkpoints, several-process training) and ``fslab eval``.
Imports torch; used by the execution layer and by nothing below it."""
