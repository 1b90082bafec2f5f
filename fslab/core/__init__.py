"""The core layer: plugin hooks and registry, configuration, project settings,
the run store and its summaries. Pure Python: nothing here imports torch,
textual or matplotlib, or any other fslab layer."""
