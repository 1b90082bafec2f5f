"""A plugin's parameter defaults, checked as it registers (and by its contract test): each of the
type its annotation names, and all of them accepted by the plugin's own ``check=``.

A run takes values of a parameter's default's type only, so ``margin: float = 1`` refused
``--set loss.margin=0.5``, and ``margin: float = "1.0"`` trained with the text "1.0"; a default its
own check refuses failed every run that left it unset with the check's line, as if the user had set
the value. Both are the plugin's mistakes, told when it loads rather than in the middle of a run.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from fslab.core.errors import NotInstalled, UsageError

SIMPLE_TYPES = {t.__name__: t for t in (bool, int, float, str)}


def annotated_types(target: Any) -> dict[str, type | None]:
    """The keyword-only parameters whose annotation names one simple type (``float``, ``int | None``,
    ``Optional[bool]``, or the same as text under ``from __future__ import annotations``): that type."""
    func = target.__init__ if inspect.isclass(target) else target
    found: dict[str, type | None] = {}
    for p in inspect.signature(func).parameters.values():
        if p.kind is not inspect.Parameter.KEYWORD_ONLY or p.annotation is inspect.Parameter.empty:
            continue
        text = p.annotation.__name__ if isinstance(p.annotation, type) else str(p.annotation)
        words = set(re.findall(r"[A-Za-z_]\w*", text)) - {"None", "Optional", "typing", "Union"}
        found[p.name] = SIMPLE_TYPES.get(words.pop()) if len(words) == 1 else None
    return found


def mistyped_default(target: Any, params: dict, key: str) -> str | None:
    """Where a default of ``params`` is not of the type its parameter's annotation in ``target`` names,
    what is wrong and the fix, in words (``parameter 'margin' is annotated float but its default 1 is
    int, ...``); ``key`` is the section a user sets it under (``loss``, ``sinks.mlflow``). None if all fit."""
    for param, annotated in annotated_types(target).items():
        default = params.get(param)
        if default is not None and annotated is not None and type(default) is not annotated:
            return (f"parameter '{param}' is annotated {annotated.__name__} but its default {default!r} is "
                    f"{type(default).__name__}, and a run takes only values of its default's type "
                    f"(--set {key}.{param}={_example(annotated)} is refused): give it a default of type "
                    f"{annotated.__name__}, {param}: {annotated.__name__} = {_converted(default, annotated)!r}")
    return None


def refused_defaults(check: Any, params: dict) -> str | None:
    """What the plugin's own ``check=`` says of its defaults, as ``fslab.create`` calls it (context None),
    or None where it accepts them. Another exception than UsageError is left to the run, as
    ``fslab.create`` leaves it: a check may need a run's context for more than its defaults. So is
    :class:`NotInstalled` (a package missing here: this machine's fact, not the defaults')."""
    try:
        check(dict(params), None)
    except NotInstalled:
        return None
    except UsageError as error:
        return str(error)
    except Exception:
        return None
    return None


def _example(annotated: type) -> str:
    return {bool: "true", int: "3", float: "0.5", str: "text"}[annotated]


def _converted(default: Any, annotated: type) -> Any:
    try:
        return annotated(default)
    except (TypeError, ValueError):
        return default
