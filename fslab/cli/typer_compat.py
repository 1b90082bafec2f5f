"""Adjustments to the typer fslab runs on, each a no-op on a typer without
the internals it changes (so an older or newer typer still works, as it would
without them):

- help that reads as the README does: flags without a ``<bool>`` label and
  arguments without ``<str>``, ``RUN`` rather than ``{RUN}`` in usage lines;
- plain conversion of fslab's parameter types (str, int, float, bool, Path
  and list[str], with or without None): recent typer converts every value through
  a pydantic TypeAdapter, and importing pydantic for that alone costs about a
  third of a command's start-up (0.1 s and more on a 2-core machine). Any other
  type goes through typer as before;
- help paragraphs reflowed to the terminal (:func:`reflow_help_paragraphs`);
- help without Markdown or tracebacks: typer's help module imports
  rich.markdown (and markdown-it, ~35 ms) to render help written in Markdown,
  which fslab's (Rich markup) never is, and rich.traceback (with pygments and
  rich.pretty, ~30 ms) to draw exceptions, which fslab reports in one line;
  :func:`help_without_markdown` gives it stand-ins that import the real classes
  only if they are ever used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    words = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
    return words[str(value).strip().lower()]  # KeyError: not a boolean


PLAIN = {str: (str, "a string"), int: (int, "a valid integer"), float: (float, "a valid number"),
         Path: (Path, "a path"), bool: (_boolean, "true or false")}


def plain_help_labels(core) -> None:
    if hasattr(core.TyperOption, "display_type_rich"):
        typed = core.TyperOption.display_type_rich
        core.TyperOption.display_type_rich = lambda self, ctx: None if self.is_flag else typed(self, ctx)
    if hasattr(core.TyperArgument, "display_type_rich"):  # fslab's arguments are names: RUN, not RUN <str>
        core.TyperArgument.display_type_rich = lambda self, ctx: None
    if hasattr(core.TyperArgument, "_usage_display_name"):
        usage = core.TyperArgument._usage_display_name
        core.TyperArgument._usage_display_name = (
            lambda self: usage(self).replace("{", "").replace("}", "") if self.required else usage(self))


def is_plain(descriptor) -> bool:
    """Whether fslab converts values of this parameter itself."""
    info, annotation = descriptor.parameter_info, descriptor.annotation
    if getattr(info, "parser", None) is not None or getattr(descriptor, "file_annotation", None) is not None:
        return False
    if any(getattr(info, key, None) for key in ("min", "max", "exists", "resolve_path")):
        return False
    if get_origin(annotation) is list:
        return get_args(annotation) == (str,)
    return annotation in PLAIN


def plain_coercion(core, coercion) -> None:
    if not (hasattr(core, "build_runtime_param") and hasattr(coercion, "RuntimeParam")):
        return
    from typer import BadParameter

    @dataclass(frozen=True)
    class PlainValue(coercion.RuntimeParam):
        def _coerce_value(self, value: Any, param, ctx) -> Any:
            if get_origin(self.annotation) is list:
                return [str(item) for item in value]
            convert, what = PLAIN[self.annotation]
            try:
                return convert(value)
            except (TypeError, ValueError, KeyError):
                raise BadParameter(f"Input should be {what}", ctx=ctx, param=param) from None

    full = core.build_runtime_param

    def build_runtime_param(descriptor):
        if is_plain(descriptor):
            return PlainValue(parameter_info=descriptor.parameter_info, annotation=descriptor.annotation)
        return full(descriptor)

    core.build_runtime_param = build_runtime_param


def help_without_markdown() -> None:
    """Import typer's help module with stand-ins for ``rich.markdown`` and
    ``rich.traceback``; the real modules stay importable by everyone else."""
    import importlib
    import sys
    import types

    wanted = {"rich.markdown": "Markdown", "rich.traceback": "Traceback"}
    modules = {module: name for module, name in wanted.items() if module not in sys.modules}  # those not yet loaded
    if "typer.rich_utils" in sys.modules or not modules:
        return

    def stand_in(module: str, name: str) -> types.ModuleType:
        def real() -> type:
            return getattr(importlib.import_module(module), name)

        class Forward(type):  # the real class's own attributes too (Traceback.from_exception)
            def __getattr__(cls, attribute: str):
                return getattr(real(), attribute)

        placeholder = types.ModuleType(module)
        # the real thing, built should typer ever use it
        setattr(placeholder, name, Forward(name, (), {"__new__": lambda cls, *a, **k: real()(*a, **k)}))
        return placeholder

    placeholders = {module: stand_in(module, name) for module, name in modules.items()}
    sys.modules.update(placeholders)
    try:
        import typer.rich_utils  # noqa: F401
    except ImportError:  # pragma: no cover - a typer without it
        pass
    finally:
        for module, placeholder in placeholders.items():
            if sys.modules.get(module) is placeholder:
                del sys.modules[module]


def reflow_help_paragraphs() -> None:
    """Every paragraph of a command's help reflowed to the terminal's width, as
    typer already does with the first (and click with all): typer keeps the
    line breaks of the others, so a docstring wrapped at the source's 120
    columns came out ragged at 80. A paragraph that starts with ``\\b``
    (click's mark) keeps its lines. Call it before help is printed."""
    try:
        from typer import rich_utils
    except ImportError:  # pragma: no cover - a typer without it
        return
    join = getattr(rich_utils, "_fix_linebreaks", None)
    if join is None or getattr(join, "reflows", False):
        return

    def reflowed(paragraphs: list[str], markup_mode: Any) -> str:
        return join([p[1:].lstrip("\n") if p.startswith("\b") else " ".join(p.split()) for p in paragraphs],
                    markup_mode)

    reflowed.reflows = True
    rich_utils._fix_linebreaks = reflowed


def adjust_typer() -> None:
    try:
        from typer import _coercion, core
    except ImportError:  # pragma: no cover - a typer without these modules
        return
    plain_help_labels(core)
    plain_coercion(core, _coercion)
