"""The declared plugin API (fslab.plugin): what it exports, that built-in
plugins use nothing else from fslab (read from their sources, a second check
beside the import-linter contract), and that built-in components are what its
protocols say fslab calls."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import fslab.plugin as api

PLUGINS = Path(__file__).resolve().parent.parent / "plugins"


def test_the_api_exports_what_it_declares():
    assert re.fullmatch(r"\d+\.\d+", api.API_VERSION)
    assert all(hasattr(api, name) for name in api.__all__)
    assert {"hookimpl", "LossOutput", "Batch", "Split", "UsageError", "EvaluatorTraits",
            "rand_rows", "global_rows", "sum_rows", "Register", "CheckContext", "SplitSizes",
            "SizedDataset", "at_least", "positive", "between", "one_of", "matching", "listing",
            "Sink", "SinkRun", "dotted", "evaluator_label", "own_evaluator", "canonical_evaluator",
            "count", "temporary_path", "writer_gone", "NotInstalled", "run_events",
            "one_at_a_time"} <= set(api.__all__)
    assert api.dotted({"train": {"lr": 0.1, "milestones": [2]}, "eval.ways": 5, "seed": 0, "sinks": {}}) == \
        {"train.lr": 0.1, "train.milestones": [2], "eval.ways": 5, "seed": 0}
    assert set(api.INFO_KEYS) == {"episodic", "defaults", "check_early", "check", "allowed", "batch"}
    # 1.1 added check=, CheckContext, split_sizes() and SplitSizes; 1.2 allowed=, the backbone's image_size, studies;
    # 1.3 sinks (register_sinks, Sink, SinkRun); 1.4 dotted; 1.5 a sampler's batch=; 1.6 evaluator_label and
    # own_evaluator, the labels evaluations are saved under; 1.7 canonical_evaluator, a label in its one spelling;
    # 1.8 fslab.create runs check= with context None; 1.9 events spell every evaluator parameter out;
    # 1.10 listing(..., distinct=True); 1.11 an evaluator's training_loss; 1.12 one_of(1, 5); 1.13 count;
    # 1.14 temporary_path and writer_gone, for a plugin caching files where nodes share them; 1.15 NotInstalled;
    # 1.16 run_events, a run's metrics.jsonl events as fslab reads them; 1.17 one_at_a_time, whose lock names its holder
    # 1.18 a sink's optional reopen(run, **params), to which fslab eval adds its new scores
    # 1.19 a dataset whose constructor names no root reads no files: fslab hands it none, fills in none
    assert api.API_VERSION == "1.19"
    assert [api.count(1, "image"), api.count(4, "image"), api.count(1, "class", "classes"),
            api.count(0, "class", "classes")] == ["1 image", "4 images", "1 class", "0 classes"]
    from fslab.core.limits import check_rule, rule_of

    with pytest.raises(api.ConfigError, match=r"^config key 'p' lists 2 twice; give each value once, got \[2, 3, 2\]$"):
        check_rule("p", [2, 3, 2], rule_of(api.listing(api.at_least(1), distinct=True)))
    check_rule("p", [2, 3, 2], rule_of(api.listing(api.at_least(1))))  # without distinct=True: allowed
    assert api.evaluator_label({"name": "knn", "ties": "nearest", "k": 3}) == "knn[k=3]"  # ties at its default
    assert api.evaluator_label({"name": "knn", "ties": "smallest", "k": 3}) == "knn[k=3,ties=smallest]"
    assert api.own_evaluator({"evaluator": {"name": "soft", "temperature": 2.0}}) == "soft[temperature=2.0]"
    assert api.own_evaluator({"evaluator": {"name": "soft", "temperature": 1.0}}) == "soft"
    assert api.canonical_evaluator("knn[ties=nearest,k=0]") == "knn"
    assert api.own_evaluator({}) == "centroid"


def test_the_plugin_guide_lists_every_api_version_up_to_the_current_one():
    """docs/plugins.md's table of versions stopped at 1.6 while fslab.plugin said 1.9: an author
    reading it could not tell what canonical_evaluator needs, or that create runs check=."""
    guide = (PLUGINS.parent / "docs" / "plugins.md").read_text()
    listed = re.findall(r"^\| (\d+)\.(\d+) \|", guide, flags=re.MULTILINE)
    major, minor = map(int, api.API_VERSION.split("."))
    assert [(int(a), int(b)) for a, b in listed] == [(major, m) for m in range(minor + 1)]


@pytest.mark.parametrize("path", sorted(PLUGINS.rglob("*.py")), ids=lambda p: str(p.relative_to(PLUGINS)))
def test_built_in_plugins_import_fslab_only_through_the_plugin_api(path):
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
    from_fslab = {m for m in imported if m == "fslab" or m.startswith("fslab.")}
    assert from_fslab <= {"fslab.plugin"}, from_fslab


def test_the_global_batch_helpers_outside_a_training_forward(torch_seed):
    import torch

    x = torch.randn(6, 3, 4, 4)
    torch.manual_seed(5)
    noise = api.rand_rows(x)
    torch.manual_seed(5)
    assert torch.equal(noise, torch.rand_like(x))  # one process: exactly torch.rand_like
    assert api.global_rows(6) == 6 and torch.equal(api.sum_rows(x.sum()), x.sum())


def test_the_global_batch_helpers_inside_a_share_draw_for_the_whole_batch(torch_seed):
    """Rows 2..5 of an 8-row global batch get the noise one process draws for
    those rows, and sums go through the collective the training step hands over."""
    import torch

    from fslab.core.global_batch import BatchShare, sharing

    torch.manual_seed(5)
    whole = torch.rand(8, 3, 4, 4)
    summed = []
    with sharing(BatchShare(slice(2, 6), 8, lambda t: summed.append(t.clone()) or t.mul_(2))):
        torch.manual_seed(5)
        part = api.rand_rows(torch.zeros(4, 3, 4, 4))
        total = api.sum_rows(torch.tensor(3.0))
        rows = api.global_rows(4)
    assert torch.equal(part, whole[2:6]) and rows == 8
    assert summed == [torch.tensor(3.0)] and total == 6.0
    assert api.global_rows(4) == 4  # the share ends with the block


def test_built_in_components_are_what_the_protocols_say(registry):
    import torch

    for name in registry.names("backbone"):
        params = {"hidden": 8} if name == "conv4" else {}
        if name in ("wrn28-10",):
            params = {"depth": 10, "widen_factor": 1}
        assert isinstance(registry.create("backbone", name, in_channels=3, **params), api.Backbone), name
    labels = torch.arange(8).repeat_interleave(16).tolist()
    for name in registry.names("sampler"):
        params = {"shots": 2, "per_class": 4} if name == "episodic" else {}
        assert isinstance(registry.create("sampler", name, labels=labels, batch_size=16, seed=0, **params),
                          api.Sampler), name
    for name in registry.names("loss"):
        assert callable(registry.create("loss", name, context={"out_dim": 8, "num_classes": 8})), name
    dataset = registry.create("dataset", "synthetic", root=None, classes=24, val_classes=6, test_classes=6,
                              images_per_class=4, image_size=8)
    assert isinstance(dataset, api.Dataset) and isinstance(dataset.load("val"), api.Split)
    assert isinstance(dataset, api.SizedDataset)
    assert dataset.split_sizes() == {"train": [4] * 12, "val": [4] * 6, "test": [4] * 6}


def _registry_of(module_source: str, tmp_path, monkeypatch):
    """A registry of the built-ins plus one local plugin file."""
    from fslab.core.registry import load_registry

    folder = tmp_path / "local"
    folder.mkdir()
    (folder / "extra.py").write_text(module_source)
    monkeypatch.setenv("FSLAB_STRICT_PLUGINS", "1")
    return load_registry([folder])


ALLOWED_PLUGIN = '''
from fslab.plugin import at_least, hookimpl, one_of

def vote(support, query, *, k: int = 1, distance: str = "euclidean", radius: float | None = None):
    return query[..., 0].long() * 0

@hookimpl
def register_evaluators(register):
    register(vote, name="vote", description="test", allowed={"k": at_least(1),
             "distance": one_of("euclidean", "cosine"), "radius": at_least(0)})
'''


def test_declared_values_are_checked_when_a_configuration_is_resolved(builtin_plugins, tmp_path, monkeypatch):
    from fslab.core.config import resolve
    from fslab.core.errors import ConfigError
    from fslab.core.settings import Settings

    registry = _registry_of(ALLOWED_PLUGIN, tmp_path, monkeypatch)
    assert registry.get("evaluator", "vote").describe()["allowed"] == {
        "k": "at least 1", "distance": "one of euclidean, cosine", "radius": "at least 0"}
    def run_with(**params):
        layers = [{"evaluator": {"name": "vote", **params}}]
        return resolve("nca", registry=registry, settings=Settings(), overrides=layers)

    assert run_with(k=3, distance="cosine")["evaluator"]["radius"] is None  # an unset optional value passes
    with pytest.raises(ConfigError, match=r"'evaluator.k' must be at least 1, got -3"):
        run_with(k=-3)
    with pytest.raises(ConfigError, match=r"'evaluator.distance' must be one of euclidean, cosine, got \"cosin\""):
        run_with(distance="cosin")
    with pytest.raises(ConfigError, match=r"'evaluator.radius' must be at least 0, got \"far\""):
        run_with(radius="far")  # a parameter without a typed default still meets its rule


@pytest.mark.parametrize("rules, message", [
    ('{"kk": at_least(1)}', "names 'kk', which is not one of its parameters"),
    ('{"k": "at least 1"}', r"allowed= for 'k': expected a rule such as at_least.*got 'at least 1'$"),
    ('{"k": "positive"}', r"allowed= for 'k': .*got 'positive' \(the rule is positive\(\), from fslab.plugin\)"),
    ('{"k": "at_least"}', r"got 'at_least' \(the rule is at_least\(\.\.\.\), from fslab.plugin\)"),
    # the rule's function, not called: "got <function at_least at 0x7f...>"
    ('{"k": at_least}', r"got the function at_least itself, not called \(the rule is at_least\(\.\.\.\), from "
                        r"fslab.plugin\)$"),
    ('{"k": at_least(5)}', "the default of 'k' breaks its own rule"),
])
def test_a_wrong_declaration_is_refused_when_the_plugin_registers(builtin_plugins, tmp_path, monkeypatch,
                                                                  rules, message):
    from fslab.core.errors import PluginError

    declared = '''allowed={"k": at_least(1),
             "distance": one_of("euclidean", "cosine"), "radius": at_least(0)}'''
    with pytest.raises(PluginError, match=message):
        _registry_of(ALLOWED_PLUGIN.replace(declared, f"allowed={rules}"), tmp_path, monkeypatch)



RULE_DECLARED = '''allowed={"k": at_least(1),
             "distance": one_of("euclidean", "cosine"), "radius": at_least(0)}'''


@pytest.mark.parametrize("rules, message", [
    ('{"radius": at_least("0")}', r"at_least\(\) takes numbers \(at_least\(1\), between\(0, 1\)\), got '0'$"),
    ('{"k": between(5, 1)}', r"between\(\) takes the lower bound first, got between\(5, 1\)$"),
    ('{"k": between(0, None)}', r"between\(\) takes numbers .*got None$"),
    ('{"distance": one_of(["euclidean", "cosine"])}',
     r"one_of\(\) takes the allowed values themselves, text or numbers \(one_of\('euclidean', 'cosine'\), "
     r"one_of\(1, 5\)\), got one_of\(\['euclidean', 'cosine'\]\)$"),
    ('{"distance": one_of()}', r"got one_of\(\)$"),
    ('{"distance": matching("(euclid", "a distance")}', r"matching\(\) takes a regular expression, got '\(euclid': "),
    ('{"distance": listing("euclidean")}', r"expected a rule such as at_least\(1\).*got 'euclidean'$"),
])
def test_a_rule_built_with_wrong_arguments_fails_the_plugins_loading(builtin_plugins, tmp_path, monkeypatch,
                                                                     rules, message):
    """at_least('0') on an optional parameter loaded, and the first value given to it was a traceback
    from fslab run ('<' not supported between 'int' and 'str'); one_of(['a', 'b']) or one_of(1, 5) failed
    to load with "sequence item 0: expected str instance"; an unclosed regex failed with re's own words."""
    from fslab.core.errors import PluginError

    plugin = ALLOWED_PLUGIN.replace("import at_least, hookimpl, one_of",
                                    "import at_least, between, hookimpl, listing, matching, one_of")
    with pytest.raises(PluginError) as caught:
        _registry_of(plugin.replace(RULE_DECLARED, f"allowed={rules}"), tmp_path, monkeypatch)
    words, _, raised_by = str(caught.value).partition("; raised by ")  # the hook and file that raised it
    assert re.search(message, words) and raised_by.startswith("register_evaluators() of "), str(caught.value)


def test_one_of_takes_numbers_too(builtin_plugins, tmp_path, monkeypatch):
    """one_of(1, 5) failed the plugin's loading (str.join of ints); True is no choice though True == 1."""
    import fslab
    from fslab.core.errors import ConfigError

    rules = 'allowed={"k": one_of(1, 5), "radius": one_of(0.5, 1)}'
    registry = _registry_of(ALLOWED_PLUGIN.replace(RULE_DECLARED, rules), tmp_path, monkeypatch)
    assert registry.get("evaluator", "vote").describe()["allowed"] == {"k": "one of 1, 5", "radius": "one of 0.5, 1"}
    monkeypatch.setattr(fslab, "_registry", registry)
    assert fslab.create("evaluator", "vote", k=5, radius=1).keywords["k"] == 5
    with pytest.raises(ConfigError, match=r"^config key 'evaluator.k' must be one of 1, 5, got 3$"):
        fslab.create("evaluator", "vote", k=3)
    with pytest.raises(ConfigError, match=r"^config key 'evaluator.radius' must be one of 0.5, 1, got true$"):
        fslab.create("evaluator", "vote", radius=True)


def test_a_parameter_without_a_default_fails_the_plugins_loading(builtin_plugins, tmp_path, monkeypatch):
    """def vote(support, query, *, k) registered k with the default None: fslab plugins listed k=null, and
    a run that did not set k called it with None (a loss computing with one failed at its first step)."""
    from fslab.core.errors import PluginError

    plugin = ALLOWED_PLUGIN.replace("k: int = 1,", "k: int,").replace('allowed={"k": at_least(1),', "allowed={")
    with pytest.raises(PluginError) as caught:
        _registry_of(plugin, tmp_path, monkeypatch)
    assert str(caught.value).endswith(
        "TypeError: evaluator 'vote' from plugin 'local:extra': its parameter 'k' has no default; a run sets it "
        "only when told to, and its type is its default's: give it one (*, k=...), None if it is optional")
    # what fslab fills in needs none (a sampler's batch_size and seed), nor does what comes before the *
    (tmp_path / "again").mkdir()
    sampler = '''
from fslab.plugin import hookimpl

class Every:
    def __init__(self, labels, *, batch_size, seed, per_class: int = 2):
        self.labels = labels

@hookimpl
def register_samplers(register):
    register(Every, name="every", description="test")
'''
    assert _registry_of(sampler, tmp_path / "again", monkeypatch).get("sampler", "every").params == {"per_class": 2}


@pytest.mark.parametrize("default, message", [
    # --set evaluator.radius=0.5 was refused as no whole number, and fslab plugins listed radius=1
    ("1", "parameter 'radius' is annotated float but its default 1 is int, and a run takes only values of its "
          "default's type (--set evaluator.radius=0.5 is refused): give it a default of type float, "
          "radius: float = 1.0"),
    # trained with the text "1.0", and refused --set evaluator.radius=0.5 as no text
    ('"1.0"', "parameter 'radius' is annotated float but its default '1.0' is str"),
])
def test_a_default_of_another_type_than_its_annotation_fails_the_plugins_loading(builtin_plugins, tmp_path,
                                                                                 monkeypatch, default, message):
    from fslab.core.errors import PluginError

    plugin = ALLOWED_PLUGIN.replace("radius: float | None = None", f"radius: float = {default}")
    with pytest.raises(PluginError) as caught:
        _registry_of(plugin, tmp_path, monkeypatch)
    line = str(caught.value)
    assert line.startswith("plugin 'local:extra' failed to load: TypeError: evaluator 'vote' from plugin "
                           "'local:extra': parameter 'radius'") and message in line, line


CHECKED_PLUGIN = '''
from fslab.plugin import UsageError, hookimpl

def vote(support, query, *, k: int = 0):
    return query[..., 0].long() * 0

def check(params, context):
    if params["k"] < 1:
        raise UsageError(f"evaluator.k must be at least 1, got {params['k']}")

@hookimpl
def register_evaluators(register):
    register(vote, name="vote", description="test", check=check)
'''


def test_a_default_its_own_check_refuses_fails_the_plugins_loading(builtin_plugins, tmp_path, monkeypatch):
    """Every run that left evaluator.k unset failed with the check's line, as if the user had set k=0."""
    from fslab.core.errors import PluginError

    with pytest.raises(PluginError) as caught:
        _registry_of(CHECKED_PLUGIN, tmp_path, monkeypatch)
    assert str(caught.value) == (
        "plugin 'local:extra' failed to load: TypeError: evaluator 'vote' from plugin 'local:extra': its own check= "
        "refuses its defaults (evaluator.k must be at least 1, got 0); every run that leaves them unset would fail "
        "so: give each parameter a default the check accepts")
    # a check that cannot judge without a run (it reads the context) is left to the run, as fslab.create leaves it
    reading = CHECKED_PLUGIN.replace('if params["k"] < 1:', 'if params["k"] < context.config["eval"]["shots"]:')
    (tmp_path / "again").mkdir()
    assert _registry_of(reading, tmp_path / "again", monkeypatch).get("evaluator", "vote").params == {"k": 0}
    # a package missing here (NotInstalled) is this machine's fact, not the defaults': the plugin loads, and a
    # run given it is refused with the check's line (the built-in sinks failed to load without their packages)
    missing = CHECKED_PLUGIN.replace("UsageError", "NotInstalled").replace(
        'evaluator.k must be at least 1, got {params[\'k\']}', "evaluator 'vote' needs the votes package")
    (tmp_path / "missing").mkdir()
    registry = _registry_of(missing, tmp_path / "missing", monkeypatch)
    assert registry.get("evaluator", "vote").params == {"k": 0}
    with pytest.raises(api.NotInstalled, match=r"^evaluator 'vote' needs the votes package$"):
        registry.get("evaluator", "vote").info["check"]({"k": 0}, None)
    assert issubclass(api.NotInstalled, api.UsageError)


@pytest.mark.parametrize("trait, message", [
    # each was taken as it was: metric 5 refused every prediction as scores of the wrong shape, needs_model "no"
    # called the evaluator with a network, and default_episodes -4 scored no episode
    ("metric = 5", "its trait metric must be a name, 'accuracy' or that of its score per episode ('map'), got 5"),
    ('needs_model = "no"', "its trait needs_model must be True or False, got 'no'"),
    ("episode_shape = 5", "its trait episode_shape must be (shots, queries), two whole numbers at least 1, or None, "
                          "got 5"),
    ("default_episodes = -4", "its trait default_episodes must be a whole number at least 1, got -4"),
])
def test_an_evaluator_trait_of_the_wrong_type_fails_the_plugins_loading(builtin_plugins, tmp_path, monkeypatch,
                                                                        trait, message):
    from fslab.core.errors import PluginError

    plugin = ALLOWED_PLUGIN.replace("@hookimpl", f"vote.{trait}\n\n@hookimpl")
    with pytest.raises(PluginError) as caught:
        _registry_of(plugin, tmp_path, monkeypatch)
    assert str(caught.value) == (f"plugin 'local:extra' failed to load: TypeError: evaluator 'vote' from plugin "
                                 f"'local:extra': {message}")


@pytest.mark.parametrize("call, message", [
    ('register("vote", vote, description="test")', "too many positional arguments"),
    ('register(vote, name="vote")', "missing a required argument: 'description'"),
    ('register(vote, name="vote", description="test", paper="x", params={}, allowed={}, sort="k")', None),
])
def test_a_wrong_call_of_register_names_the_plugin_and_the_right_call(builtin_plugins, tmp_path, monkeypatch,
                                                                      call, message):
    from fslab.core.errors import PluginError

    plugin = ALLOWED_PLUGIN.split("    register(vote")[0] + "    " + call + "\n"
    if message is None:  # any keyword beyond the named ones is the component's own information
        assert _registry_of(plugin, tmp_path, monkeypatch).get("evaluator", "vote").info["sort"] == "k"
        return
    with pytest.raises(PluginError) as caught:
        _registry_of(plugin, tmp_path, monkeypatch)
    assert f"evaluator register() of plugin 'local:extra': {message}; it is called as " \
           f"register(target, name='...', description='...'" in str(caught.value)
    assert "_register_callback" not in str(caught.value)


BACKBONE_PLUGIN = '''
from fslab.plugin import hookimpl

class Flat:
    def __init__(self, in_channels, *, image_size=(1, 1), scale: int = 1):
        self.out_dim = in_channels * image_size[0] * image_size[1] * scale

    def to(self, device):
        return self

@hookimpl
def register_backbones(register):
    register(Flat, name="flat", description="test")
'''


def test_a_backbone_that_names_image_size_is_told_the_images_size(builtin_plugins, tmp_path, monkeypatch):
    from fslab.core.config import resolve, run_config
    from fslab.core.settings import Settings
    from fslab.training.build import build_backbone

    registry = _registry_of(BACKBONE_PLUGIN, tmp_path, monkeypatch)
    assert registry.get("backbone", "flat").params == {"scale": 1}  # fslab fills image_size: not a parameter
    config = resolve("nca", registry=registry, settings=Settings(), overrides=[{"backbone": {"name": "flat"}}])
    assert config["backbone"] == {"name": "flat", "scale": 1}
    assert build_backbone(registry, run_config(config), 3, "cpu", (12, 10)).out_dim == 3 * 12 * 10
    assert registry.accepts("backbone", "flat", "image_size") and not registry.accepts("backbone", "resnet12",
                                                                                         "image_size")
    # fslab.create tells it a size too, given as a run gives it: it was refused, "must be an integer, got (12, 10)"
    import fslab
    from fslab.core.errors import ConfigError

    monkeypatch.setattr(fslab, "_registry", registry)
    assert fslab.create("backbone", "flat", in_channels=3, image_size=(12, 10)).out_dim == 3 * 12 * 10
    for size in (12, (12, 0), (12, 10, 3)):
        with pytest.raises(ConfigError, match=r"^config key 'backbone.image_size' must be the images' \(height, "
                                              r"width\), two whole numbers at least 1, got "):
            fslab.create("backbone", "flat", in_channels=3, image_size=size)
    # a backbone that does not name it is built as before
    conv = build_backbone(registry, run_config(resolve("nca", registry=registry, settings=Settings(), overrides=[
        {"backbone": {"name": "conv4", "hidden": 4}}])), 1, "cpu", (12, 12))
    assert conv.out_dim == 4


def test_the_public_create_takes_an_image_size_of_numpy_numbers(builtin_plugins, tmp_path, monkeypatch):
    """image_size=(np.int64(84), 84), an array's shape in a notebook, was refused as not "two whole
    numbers", though create takes numpy's numbers as Python's; it is passed on as a tuple of ints."""
    import numpy as np

    import fslab
    from fslab.core.errors import ConfigError

    plugin = BACKBONE_PLUGIN.replace("        self.out_dim =",
                                     "        self.image_size = image_size\n        self.out_dim =")
    monkeypatch.setattr(fslab, "_registry", _registry_of(plugin, tmp_path, monkeypatch))
    for size in [(np.int64(12), np.uint16(10)), [12, 10]]:
        net = fslab.create("backbone", "flat", in_channels=3, image_size=size)
        assert net.image_size == (12, 10) and [type(v) for v in net.image_size] == [int, int]
    with pytest.raises(ConfigError, match=r"two whole numbers at least 1, got \(np\.True_, 10\)$"):
        fslab.create("backbone", "flat", in_channels=3, image_size=(np.True_, 10))


def test_a_declared_parameter_its_lazy_target_lacks_is_the_plugins_fault(builtin_plugins, tmp_path, monkeypatch):
    """params={"scale": 1, "depth": 2} for a class without depth: building it said "backbone 'flat' has no
    parameter 'depth'. Did you mean ...", a UsageError as if the user had set depth, which nobody had."""
    import fslab
    from fslab.core.errors import PluginError, UsageError

    plugin = BACKBONE_PLUGIN.replace('register(Flat, name="flat", description="test")',
                                     'register("fslab_local_plugins.extra:Flat", name="flat", description="test", '
                                     'params={"scale": 1, "depth": 2})')
    monkeypatch.setattr(fslab, "_registry", _registry_of(plugin, tmp_path, monkeypatch))
    with pytest.raises(PluginError) as caught:
        fslab.create("backbone", "flat", in_channels=3)
    assert str(caught.value) == (
        "backbone 'flat' from plugin 'local:extra' declares the parameter 'depth' in register(params=...), which "
        "'fslab_local_plugins.extra:Flat' does not take; declare its keyword-only parameters exactly (the contract "
        "tests compare them)")
    # the caller's, as before
    with pytest.raises(UsageError, match=r"^unknown parameter 'backbone.width' for backbone 'flat'\."):
        fslab._registry.create("backbone", "flat", in_channels=3, width=2)
