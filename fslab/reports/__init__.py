"""The reports layer: comparisons of finished runs, figures and study reports, read from the run store (with the
``fslab eval`` each names for a run it lacks scores of)."""
