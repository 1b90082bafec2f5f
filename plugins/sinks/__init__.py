"""Sinks: where a run's events are also sent (``fslab run --sink NAME``,
``[run] sinks`` in fslab.toml, ``fslab export``). Each module here is one
tracker, registered lazily so that listing plugins imports none of them."""
