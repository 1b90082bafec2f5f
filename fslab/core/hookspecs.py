"""The hooks a plugin implements. Each receives a ``register`` callback.

``register(target, *, name, description, paper="", params=None, **info)``

- ``target``: the function or class that builds the component, or a lazy
  ``"module:attr"`` string imported only when the component is first created
  (keeps ``fslab plugins`` from importing torch). Method recipes pass a dict,
  studies the ``pathlib.Path`` of their TOML file.
- keyword-only parameters of ``target`` (the ones after ``*``) are the plugin's
  parameters; those before ``*`` are filled in by fslab. A lazy target declares
  ``params={name: default}`` explicitly.
- ``info``: extra keywords, listed under each hook that reads them below and
  all in :data:`fslab.plugin.INFO_KEYS` (``check=`` and ``allowed=``, which are
  not one kind's, only there); any other keyword is kept and shown by
  ``fslab plugins --json``.

Plugins import these markers, and everything else they use, from :mod:`fslab.plugin`.
"""

import pluggy

hookspec = pluggy.HookspecMarker("fslab")
hookimpl = pluggy.HookimplMarker("fslab")


@hookspec
def register_losses(register):
    """Register losses: ``loss(z, labels, support=None) -> LossOutput``.
    ``episodic=True``: the loss needs support and query rows (``support``)."""


@hookspec
def register_backbones(register):
    """Register backbones: ``Backbone(in_channels, *, ...)`` with an ``out_dim`` attribute."""


@hookspec
def register_samplers(register):
    """Register training samplers: ``Sampler(labels, batch_size, seed, *, ...)``.
    ``episodic=True``: its batches mark support and query rows (``Batch.support``);
    ``batch=f``: ``f(params, batch_size)`` the rows one batch holds where its own
    parameters fix them (an episode's ways × (shots + queries))."""


@hookspec
def register_evaluators(register):
    """Register few-shot classifiers: ``classify(support, query, *, ...) -> predictions``,
    with the traits of :class:`fslab.plugin.EvaluatorTraits` as attributes where they differ."""


@hookspec
def register_datasets(register):
    """Register datasets: ``Dataset(root, *, ...)`` with ``load(split) -> Split``.
    ``defaults={...}``: configuration for runs on the dataset, under the method recipe;
    ``check_early=True``: the constructor only checks parameters and files, so it is
    built before a run folder is created."""


@hookspec
def register_methods(register):
    """Register method recipes: a dict naming loss, sampler, evaluator and settings."""


@hookspec
def register_studies(register):
    """Register studies: ``register(path, name=..., description=..., paper=...)`` for a study
    TOML file (:func:`fslab.plugin.register_study_files` registers every file of a folder)."""


@hookspec
def register_sinks(register):
    """Register sinks: ``Sink(run, **params)`` (``run`` a :class:`fslab.plugin.SinkRun`)
    with ``write(event)`` and ``close()``; it receives every event of ``metrics.jsonl``,
    after the event is written there, on rank 0 only (:class:`fslab.plugin.Sink`)."""
