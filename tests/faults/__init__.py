"""Fault injection with real processes: what fslab does when its workers are
killed, paused or lost, when two commands race, when a run belongs to another
host, when files are damaged or unreadable, when the disk is full or read-only,
and when the input is bad. ``python -m tests.faults`` runs every scenario and
prints the tally the README records; ``tests/faults/test_faults.py`` runs the
same scenarios under pytest (and so in CI)."""
