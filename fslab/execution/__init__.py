"""The execution layer: starting, stopping and resuming runs as processes,
locally (worker subprocesses, sweeps and their scheduler) or as SLURM jobs;
a study's runs queued as one sweep, and a finished run's events replayed into a sink."""
