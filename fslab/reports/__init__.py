"""The reports layer: comparisons of finished runs and figures, read from the run store."""
