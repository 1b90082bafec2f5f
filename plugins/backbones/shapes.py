"""The built-in backbones' parameter checks, without torch.

The networks (:mod:`fslab_plugins.backbones.networks`) are registered lazily
so that listing plugins imports no torch; their checks live here so fslab can
run them before a run exists (``register(..., check=...)``), and the
constructors call the same functions. With a configuration, a check also
refuses ``eval.feature_stages`` beyond the network's stages.
"""

from __future__ import annotations

from fslab.plugin import UsageError


def check_stages(name: str, stages: int, context) -> None:
    """``eval.feature_stages`` must name stages the network has (``stages`` of them)."""
    wanted = context.config["eval"]["feature_stages"] if context is not None else 1
    if not 1 <= wanted <= stages:
        raise UsageError(f"{name}: eval.feature_stages must be between 1 and {stages} (its stages), got {wanted}")


def check_conv4(params: dict, context=None) -> None:
    if params["hidden"] < 1:
        raise UsageError(f"conv4: backbone.hidden must be a positive number of filters, got {params['hidden']}")
    if params.get("head", "average") not in ("average", "flatten"):
        raise UsageError(f"conv4: backbone.head must be average or flatten, got {params['head']!r}")
    size = None if context is None else context.config["dataset"].get("image_size")
    if params.get("head") == "flatten" and isinstance(size, int) and size < 16:
        raise UsageError(f"conv4: backbone.head=flatten needs images of at least 16×16 (four 2×2 poolings), "
                         f"got dataset.image_size={size}; use backbone.head=average")
    check_stages("conv4", 4, context)


def _four_positive(name: str, key: str, values, what: str) -> None:
    if len(values) != 4 or min(values) < 1:
        raise UsageError(f"{name}: backbone.{key} must be four positive {what}, got {list(values)}")


def check_resnet12(params: dict, context=None) -> None:
    _four_positive("resnet12", "widths", params["widths"], "channel counts")
    if not 0.0 <= params["drop_rate"] < 1.0:
        raise UsageError(f"resnet12: backbone.drop_rate must be in [0, 1), got {params['drop_rate']}")
    if params["dropblock_size"] < 1:
        raise UsageError(f"resnet12: backbone.dropblock_size must be >= 1, got {params['dropblock_size']}")
    check_stages("resnet12", 4, context)


def check_resnet12_nca(params: dict, context=None) -> None:
    _four_positive("resnet12-nca", "widths", params["widths"], "channel counts")
    _four_positive("resnet12-nca", "layers", params["layers"], "block counts")
    check_stages("resnet12-nca", 4, context)


def check_wrn(params: dict, context=None) -> None:
    depth, widen_factor, dropout = params["depth"], params["widen_factor"], params["dropout"]
    if depth < 10 or (depth - 4) % 6:
        raise UsageError(f"wrn: backbone.depth must be 6n + 4 with n >= 1 (10, 16, 22, 28, ...), got {depth}")
    if widen_factor < 1:
        raise UsageError(f"wrn: backbone.widen_factor must be a positive integer, got {widen_factor}")
    if not 0.0 <= dropout < 1.0:
        raise UsageError(f"wrn: backbone.dropout must be in [0, 1), got {dropout}")
    check_stages("wrn", 3, context)
