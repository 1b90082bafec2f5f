"""The hooks a plugin implements. Each receives a ``register`` callback.

``register(target, *, name, description, paper="", params=None, **info)``

- ``target``: the function or class that builds the component, or a lazy
  ``"module:attr"`` string imported only when the component is first created
  (keeps ``fslab plugins`` from importing torch). Method recipes pass a dict.
- keyword-only parameters of ``target`` (the ones after ``*``) are the plugin's
  parameters; those before ``*`` are filled in by fslab. A lazy target declares
  ``params={name: default}`` explicitly.
"""

import pluggy

hookspec = pluggy.HookspecMarker("fslab")
hookimpl = pluggy.HookimplMarker("fslab")


@hookspec
def register_losses(register):
    """Register losses: ``loss(z, labels, support=None) -> LossOutput``."""


@hookspec
def register_backbones(register):
    """Register backbones: ``Backbone(in_channels, *, ...)`` with an ``out_dim`` attribute."""


@hookspec
def register_samplers(register):
    """Register training samplers: ``Sampler(labels, batch_size, seed, *, ...)``."""


@hookspec
def register_evaluators(register):
    """Register few-shot classifiers: ``classify(support, query, *, ...) -> predictions``."""


@hookspec
def register_datasets(register):
    """Register datasets: ``Dataset(root, *, ...)`` with ``load(split) -> Split``."""


@hookspec
def register_methods(register):
    """Register method recipes: a dict naming loss, sampler, evaluator and settings."""
