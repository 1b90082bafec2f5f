"""``fslab export``: a finished run's events replayed into a sink, so runs made
before a sink was chosen can join a tracker.

The sink is the class a live run would have fed (:mod:`fslab.core.sinks`), told
that this is a replay (``SinkRun.replay``) and how the run ended
(``SinkRun.state``); each sink makes an export replace what an earlier export
or the live run wrote for that run, so exporting twice never leaves two copies.
Its parameters are, lowest first: what the run's own configuration gave that
sink, the ``[run.sinks.NAME]`` table of ``fslab.toml``, and the command's
``--set KEY=VALUE``.
"""

from __future__ import annotations

from fslab.core.config import SINKS, check_value, migrate
from fslab.core.errors import ConfigError, UsageError, did_you_mean
from fslab.core.limits import check_rule
from fslab.core.runstore import Run
from fslab.core.sinks import replay
from fslab.core.types import SinkRun

LIVE = ("queued", "running")


def sink_params(registry, sink: str, layers: list[dict]) -> dict:
    """The sink's parameters from ``layers`` (lowest first), checked against
    what it declares, with its defaults for the rest."""
    component = registry.get("sink", sink)
    given: dict = {}
    for layer in layers:
        given.update(layer)
    for key in given:
        if key not in component.params:
            raise UsageError(f"sink '{sink}' has no parameter '{key}'.{did_you_mean(key, component.params)} "
                             f"Allowed: {', '.join(sorted(component.params)) or '(none)'}.")
    params = {key: check_value(f"{SINKS}.{sink}.{key}", given.get(key, default), default)
              for key, default in component.params.items()}
    for param, rule in component.info.get("allowed", {}).items():
        check_rule(f"{SINKS}.{sink}.{param}", params.get(param), rule)
    return params


def export_run(registry, run: Run, sink: str, layers: list[dict]) -> dict:
    """Replay ``run`` into ``sink``; returns what was exported. A run still
    queued or running, or one whose configuration cannot be read, is a UsageError."""
    status = run.status()
    state = run.state(status)
    if state in LIVE:
        raise UsageError(f"{run.id} is {state}: export it once it has ended")
    try:
        config = migrate(run.config())
    except ConfigError as exc:
        raise UsageError(f"{run.id}: its configuration cannot be read ({exc})") from None
    if not config:
        raise UsageError(f"{run.id}: it has no configuration to export")
    own = config.get(SINKS, {}).get(sink, {})
    params = sink_params(registry, sink, [own if isinstance(own, dict) else {}, *layers])
    target = SinkRun(run.id, run.path, config, sweep=status.get("sweep"), replay=True, state=state)
    count = replay(registry, sink, target, params, run.events())
    return {"run": run.id, "sink": sink, "state": state, "events": count}
