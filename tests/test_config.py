"""Configuration layering, --set parsing and the errors users see."""

import dataclasses
import functools
import os
import re

import hypothesis
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fslab
from fslab.core.assignments import assignment, nest, parse_assignment
from fslab.core.config import CONFIG_VERSION, DEFAULTS, EvalConfig, RunConfig, TrainConfig, merge, resolve, run_config
from fslab.core.errors import ConfigError, UsageError
from fslab.core.registry import load_registry
from fslab.core.settings import Settings, load_settings


@pytest.fixture
def registry(builtin_plugins):
    return load_registry()


def settings_from(tmp_path, text):
    path = tmp_path / "fslab.toml"
    path.write_text(text)
    return load_settings(path)


def cli(*assignments):
    return [nest(*parse_assignment(a)) for a in assignments]


def test_precedence_builtin_dataset_method_toml_cli(registry, tmp_path):
    dataset_defaults = registry.get("dataset", "synthetic").info["defaults"]
    config = resolve("protonet", registry=registry, settings=Settings())
    assert config["train"]["weight_decay"] == DEFAULTS["train"]["weight_decay"]  # built-in
    assert config["sampler"]["name"] == "episodic"  # method recipe
    assert config["train"]["epochs"] == dataset_defaults["train"]["epochs"]  # dataset over built-in
    assert config["train"]["lr"] == dataset_defaults["train"]["lr"] != DEFAULTS["train"]["lr"]

    # What a recipe states beats the dataset's defaults: the episode shape, the optimiser.
    assert registry.create("method", "protonet-best")["train"]["batch_size"] == 512
    assert dataset_defaults["train"]["batch_size"] == 128
    config = resolve("protonet-best", registry=registry, settings=Settings())
    assert config["train"]["batch_size"] == 512
    assert config["train"]["epochs"] == dataset_defaults["train"]["epochs"]  # left unsaid by the recipe
    config = resolve("map-ssvm", registry=registry, settings=Settings())
    assert (config["train"]["optimizer"], config["train"]["lr"], config["train"]["batch_size"]) == ("adam", 0.001, 128)

    settings = settings_from(tmp_path, "[run.train]\nepochs = 3\nlr = 0.05\nbatch_size = 64\n")
    config = resolve("protonet", registry=registry, settings=settings)
    assert (config["train"]["epochs"], config["train"]["lr"]) == (3, 0.05)  # toml over dataset
    config = resolve("protonet-best", registry=registry, settings=settings)
    assert config["train"]["batch_size"] == 64  # toml over method

    config = resolve("protonet", registry=registry, settings=settings, overrides=cli("train.epochs=2"))
    assert (config["train"]["epochs"], config["train"]["lr"]) == (2, 0.05)  # cli over toml
    assert config["method"] == "protonet"
    config = resolve("protonet-best", registry=registry, settings=Settings(), overrides=cli("train.batch_size=256"))
    assert config["train"]["batch_size"] == 256  # cli over method


def test_nca_recipe_trains_with_the_dataset_defaults_exactly(registry):
    """The README's published `fslab run nca` numbers: the recipe states no
    training or evaluation key, so those sections are the built-in defaults
    with the dataset's on top, whatever the layer order between the two."""
    assert set(registry.create("method", "nca")) == {"loss", "sampler", "evaluator"}
    dataset_defaults = registry.get("dataset", "synthetic").info["defaults"]
    config = resolve("nca", registry=registry, settings=Settings(), overrides=cli("backbone.name=resnet12"))
    for section in ("train", "eval"):
        assert config[section] == {**DEFAULTS[section], **dataset_defaults[section]}
    assert config["train"]["optimizer"] == "sgd" and config["eval"]["feature_stages"] == 1


def test_optimizer_and_feature_stages_are_checked(registry):
    with pytest.raises(ConfigError,
                       match=r"'train.optimizer' must be one of sgd, adam, got \"adm\"\. Did you mean 'adam'\?"):
        resolve("nca", registry=registry, settings=Settings(), overrides=cli("train.optimizer=adm"))
    with pytest.raises(ConfigError, match=r"'eval.feature_stages' must be at least 1"):
        resolve("nca", registry=registry, settings=Settings(), overrides=cli("eval.feature_stages=0"))
    config = resolve("nca", registry=registry, settings=Settings(),
                     overrides=cli("train.optimizer=adam", "eval.feature_stages=3"))
    assert (config["train"]["optimizer"], config["eval"]["feature_stages"]) == ("adam", 3)


def test_make_optimizer_builds_what_the_config_names():
    import torch

    from fslab.training.build import make_optimizer
    from fslab.training.optimizers import EagerAdam, EagerSGD

    params = [torch.nn.Parameter(torch.zeros(2))]
    train = dataclasses.replace(TrainConfig(), lr=0.01, weight_decay=1e-4)
    sgd = make_optimizer(params, train)
    assert type(sgd) is EagerSGD and isinstance(sgd, torch.optim.SGD)  # torch's, without torch._dynamo
    assert sgd.defaults["nesterov"] is True and sgd.defaults["momentum"] == 0.9 and sgd.defaults["lr"] == 0.01
    adam = make_optimizer(params, dataclasses.replace(train, optimizer="adam"))
    assert type(adam) is EagerAdam and isinstance(adam, torch.optim.Adam)
    assert (adam.defaults["lr"], adam.defaults["weight_decay"], adam.defaults["betas"]) == (0.01, 1e-4, (0.9, 0.999))


def test_make_scheduler_multiplies_the_rate_by_gamma_after_each_milestone():
    import torch

    from fslab.training.build import make_optimizer, make_scheduler

    train = dataclasses.replace(TrainConfig(), epochs=4, lr=1.0, gamma=0.5, milestones=(0.5, 0.75, 0.01))
    optimizer = make_optimizer([torch.nn.Parameter(torch.zeros(1))], train)
    scheduler = make_scheduler(optimizer, train, steps_per_epoch=10)  # 40 steps: milestones at 20, 30 and 1
    rates = []
    for _ in range(40):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == [1.0] + [0.5] * 19 + [0.25] * 10 + [0.125] * 10


def test_plugin_params_are_filled_and_validated(registry):
    config = resolve("nca", registry=registry, settings=Settings(), overrides=cli("loss.temperature=0.9"))
    assert config["loss"] == {"name": "nca", **registry.get("loss", "nca").params, "temperature": 0.9}
    assert config["backbone"]["name"] == "resnet12" and config["backbone"]["widths"] == [64, 160, 320, 640]
    with pytest.raises(ConfigError,
                       match=r"unknown parameter 'loss.temprature' for loss 'nca'\. Did you mean 'temperature'\?"):
        resolve("nca", registry=registry, settings=Settings(), overrides=cli("loss.temprature=0.9"))


@pytest.mark.parametrize("given, said, fix", [
    ("evaluator.k=3", "for evaluator 'centroid', which takes no parameters. Evaluator 'knn' has it: "
                      "--set evaluator.name=knn", "evaluator.name=knn"),
    ("loss.margin=0.5", "for loss 'nca'. Allowed: pair_fraction, temperature. Loss 'lpn' has it (so does 'triplet'): "
                        "--set loss.name=lpn", "loss.name=lpn"),
    ("sampler.ways=5", "for sampler 'iid'. Allowed: drop_last. Sampler 'episodic' has it (so does 'fixed'): "
                       "--set sampler.name=episodic", "sampler.name=episodic"),
    ("backbone.hidden=8", "for backbone 'resnet12'. Allowed: drop_rate, dropblock_size, widths. Backbone 'conv4' has "
                          "it: --set backbone.name=conv4", "backbone.name=conv4"),
    ("dataset.grayscale=true", "for dataset 'synthetic'. Allowed: channels, classes, colour, image_size, "
                               "images_per_class, seed, test_classes, val_classes. Dataset 'folder' has it: "
                               "--dataset folder", None),
])
def test_a_parameter_of_another_plugin_of_the_section_is_named_with_that_plugin(registry, given, said, fix):
    """--set evaluator.k=3 with nca's centroid evaluator said 'Allowed: (none)', no word of knn, whose parameter
    k is: a parameter another plugin of the section declares is said with it, and the option that chooses it,
    which then takes it (what else that plugin needs is its own line: lpn trains on episodes, episodic needs a
    shape; a dataset's folder, a root)."""
    with pytest.raises(ConfigError) as caught:
        resolve("nca", registry=registry, settings=Settings(), overrides=cli(given))
    assert str(caught.value) == f"unknown parameter '{given.partition('=')[0]}' {said}"
    if fix:
        try:
            resolve("nca", registry=registry, settings=Settings(), overrides=cli(given, fix))
        except UsageError as exc:  # ConfigError too
            assert "unknown parameter" not in str(exc)


def test_changing_a_plugin_drops_the_params_given_to_the_old_one(registry):
    recipe_sampler = registry.create("method", "protonet")["sampler"]
    assert "ways" in recipe_sampler
    config = resolve("protonet", registry=registry, settings=Settings(),
                     overrides=cli("loss.name=nca", "sampler.name=iid"))
    assert config["sampler"] == {"name": "iid", **registry.get("sampler", "iid").params}


def test_set_values_are_toml_with_string_fallback():
    assert parse_assignment("train.milestones=[0.5, 0.75]") == (["train", "milestones"], [0.5, 0.75])
    assert parse_assignment("loss.name=nca") == (["loss", "name"], "nca")
    assert parse_assignment("train.flip=false") == (["train", "flip"], False)
    with pytest.raises(ConfigError, match="--set expects key=value"):
        parse_assignment("train.lr")
    # a value opened as a list, table or quoted string but left unfinished is a mistake, not a word
    for raw, why in [("[0.5,", "Invalid value"), ('"nca', "Unterminated string"), ("{a = 1", "")]:
        with pytest.raises(ConfigError, match=rf"^--set train.milestones: '{re.escape(raw)}' is not a TOML value "
                                              rf"\({why}"):
            parse_assignment(f"train.milestones={raw}")


def test_a_value_toml_reads_as_a_date_is_text_in_set_and_refused_in_a_file(registry, tmp_path):
    """No setting takes a date or a time, and a run's config.json cannot hold one: --set
    dataset.root=2026-01-01 (a folder named by its day) was a traceback after the run's folder was
    made, and so was root = 2026-01-01 in [run] of fslab.toml."""
    import json

    assert parse_assignment("dataset.root=2026-01-01") == (["dataset", "root"], "2026-01-01")
    assert parse_assignment("loss.name=12:30:00") == (["loss", "name"], "12:30:00")
    assert parse_assignment("a.b=1979-05-27T07:32:00Z") == (["a", "b"], "1979-05-27T07:32:00Z")
    config = resolve("nca", registry=registry, settings=Settings(),
                     overrides=cli("dataset.name=cub", "dataset.root=2026-01-01"))
    assert config["dataset"]["root"] == os.path.abspath("2026-01-01")
    json.dumps(config)  # as config.json is written
    with pytest.raises(ConfigError, match=r"^config key 'train.lr' must be a number, got \"2026-01-01\"$"):
        resolve("nca", registry=registry, settings=Settings(), overrides=cli("train.lr=2026-01-01"))
    settings = settings_from(tmp_path, "[run.dataset]\nroot = 2026-01-01\n")
    with pytest.raises(ConfigError) as error:
        resolve("nca", registry=registry, settings=settings)
    assert str(error.value) == f'{settings.path}: [run]: dataset.root = 2026-01-01 is a TOML date or time, which ' \
                               f'no setting takes; quote it to give the text: "2026-01-01"'


def test_a_data_root_toml_reads_as_a_number_is_refused_not_saved_relative(registry, tmp_path):
    """--set dataset.root=2024 (a folder named by its year) saved the number 2024 as the root, neither
    text nor absolute, so a resume or a worker elsewhere read another folder; true read a folder True."""
    for value, shown in [("2024", "2024"), ("true", "true"), ("1e3", "1000.0"), ("[1]", "[1]")]:
        with pytest.raises(ConfigError) as error:
            resolve("nca", registry=registry, settings=Settings(), overrides=cli(f"dataset.root={value}"))
        assert str(error.value) == f"config key 'dataset.root' must be a folder's path (text), got {shown}; a " \
                                   f"name TOML reads as another value is given quoted, or with --data-root"
    config = resolve("nca", registry=registry, settings=Settings(),
                     overrides=cli("dataset.name=cub", 'dataset.root="2024"'))
    assert config["dataset"]["root"] == os.path.abspath("2024")


def test_a_setting_is_written_as_set_reads_it():
    assert assignment("eval.center", False) == "eval.center=false"
    assert assignment("loss.name", "nca") == "loss.name=nca"
    assert assignment("backbone.widths", [8, 16]) == "backbone.widths=[8, 16]"
    assert assignment("train.lr", 1e-05) == "train.lr=1e-05"
    # strings TOML would read as something else are quoted: a number, a boolean, a date, nothing
    assert [assignment("k", v) for v in ("1", "true", "1979-05-27", "")] == \
        ['k="1"', 'k="true"', 'k="1979-05-27"', 'k=""']
    assert assignment("k", '"x"') == 'k="\\"x\\""'  # TOML would read the string x: quoted, escaped
    assert assignment("k", "[x") == 'k="[x"'  # --set refuses an unfinished list: quoted
    assert assignment("loss.distance", None) == "loss.distance=null"  # a JSON null: no --set gives it


_TOML_VALUES = st.recursive(
    st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)


@hypothesis.settings(max_examples=300, derandomize=True, deadline=None)
@given(_TOML_VALUES)
def test_every_value_written_as_a_setting_reads_back_the_same(value):
    """assignment() is parse_assignment()'s inverse, so a label pasted after --set gives the run's value."""
    assert parse_assignment(assignment("a.b", value)) == (["a", "b"], value)


_PATHS = st.sampled_from(["runs", "", "~", "..", "a\x00b", "\x00", "é/日本"]) | st.text(max_size=6)
_SETTINGS_FILES = st.fixed_dictionaries({}, optional={
    "project": st.dictionaries(st.sampled_from(["runs_dir", "plugin_dirs", "runs_dri"]),
                               _PATHS | st.lists(_PATHS, max_size=2) | _TOML_VALUES, max_size=2),
    "data_roots": st.dictionaries(st.sampled_from(["synthetic", "x"]), _PATHS | _TOML_VALUES, max_size=2),
    "scheduler": st.dictionaries(st.sampled_from(["gpus", "runs_per_gpu", "cpu_slots"]),
                                 st.integers(-2**70, 2**70) | st.lists(st.integers(-2**70, 2**70), max_size=2)
                                 | st.floats() | _TOML_VALUES, max_size=2),
    "sinks": st.dictionaries(st.just("close_wait_s"), st.floats() | st.integers(-2**70, 2**70), max_size=1),
    "slurm": st.dictionaries(st.sampled_from(["mem_gb", "timeout_min", "setup", "sbatch"]), _TOML_VALUES, max_size=2),
}) | st.dictionaries(st.text(min_size=1, max_size=5), _TOML_VALUES, max_size=2)


@functools.cache
def _click_command(app):
    """The click command typer builds for ``app``, built once."""
    from typer.main import get_command

    return get_command(app)


@hypothesis.settings(max_examples=40, derandomize=True, deadline=None, database=None,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.example({"project": {"runs_dir": "a\x00b"}})
@hypothesis.example({"project": {"plugin_dirs": ["\x00"]}})
@hypothesis.example({"data_roots": {"synthetic": "a\x00b"}})
@hypothesis.example({"project": {"runs_dir": "x" * 300}})  # longer than a file name may be: "File name too long"
@given(_SETTINGS_FILES)
def test_any_settings_file_is_read_or_refused_in_one_line(builtin_plugins, tmp_path, monkeypatch, document):
    """fslab runs and fslab plugins in a folder whose fslab.toml is any TOML document: read, or one
    ConfigError (exit code 2). A runs_dir or plugin folder with a NUL ("\\u0000") was a traceback
    ending in "ValueError: embedded null byte", and a runs_dir too long for the file system exit code 1.
    The click command typer builds from the app (0.18 s, most of each invocation) is built once for the
    88 invocations: it is made from the commands' signatures alone, never from fslab.toml."""
    import typer.testing
    from typer.testing import CliRunner

    from fslab.cli import app
    from fslab.core.assignments import toml_value
    from fslab.core.errors import FslabError

    monkeypatch.setattr(typer.testing, "_get_command", _click_command)

    folder = tmp_path / f"p{len(os.listdir(tmp_path))}"
    folder.mkdir()
    (folder / "fslab.toml").write_text("".join(f"{toml_value(k, bare=False)} = {toml_value(v, bare=False)}\n"
                                               for k, v in document.items()), encoding="utf-8")
    monkeypatch.chdir(folder)
    monkeypatch.delenv("FSLAB_CONFIG", raising=False)
    for argv in (["runs"], ["plugins", "--kind", "loss"]):
        result = CliRunner().invoke(app, argv)
        error = result.exception
        assert error is None or isinstance(error, SystemExit) or (isinstance(error, FslabError) and
                                                                  error.exit_code == 2), (argv, repr(error))


def test_a_key_given_without_its_section_suggests_the_section(registry, tmp_path):
    """lr and batch_size, as --lr and a --grid alias name them, in a sweep file's [grid] (which takes no
    alias) or a --set, were refused with no suggestion: the closest top-level key is no help there."""
    for key, meant in [("lr", "'train.lr'"), ("ways", "'eval.ways'"),
                       ("batch_size", "'train.batch_size' or 'eval.batch_size'")]:
        with pytest.raises(ConfigError) as error:
            resolve("nca", registry=registry, settings=Settings(), overrides=cli(f"{key}=3"))
        assert str(error.value).startswith(f"unknown config key '{key}'. Did you mean {meant}? Allowed: method, ")
    with pytest.raises(ConfigError, match=r"^unknown config key 'name'\. Allowed: "):  # a plugin section's: no guess
        resolve("nca", registry=registry, settings=Settings(), overrides=cli("name=x"))


def test_unknown_key_suggests_the_closest(registry):
    with pytest.raises(ConfigError, match=r"unknown config key 'train.epoch'\. Did you mean 'epochs'\?"):
        resolve("nca", registry=registry, settings=Settings(), overrides=cli("train.epoch=3"))
    with pytest.raises(ConfigError, match=r"unknown config key 'trian'\. Did you mean 'train'\?"):
        resolve("nca", registry=registry, settings=Settings(), overrides=cli("trian.epochs=3"))


def test_wrong_type_names_key_and_expected_type(registry):
    with pytest.raises(ConfigError, match=r"config key 'train.epochs' must be an integer, got \"ten\""):
        resolve("nca", registry=registry, settings=Settings(), overrides=cli("train.epochs=ten"))
    with pytest.raises(ConfigError, match=r"'train.flip' must be true or false"):
        resolve("nca", registry=registry, settings=Settings(), overrides=cli("train.flip=1"))
    config = resolve("nca", registry=registry, settings=Settings(), overrides=cli("train.lr=1"))
    assert config["train"]["lr"] == 1.0 and isinstance(config["train"]["lr"], float)
    # a list key whose default is empty still types its values (from the field's tuple[int, ...])
    for value in ("[2.5]", "[3.0]", '["3"]'):
        with pytest.raises(ConfigError, match=r"^config key 'eval.extra_ways\[0\]' must be an integer, got "):
            resolve("nca", registry=registry, settings=Settings(), overrides=cli(f"eval.extra_ways={value}"))
    config = resolve("nca", registry=registry, settings=Settings(), overrides=cli("eval.extra_ways=[20]"))
    assert config["eval"]["extra_ways"] == [20]


def test_a_batch_the_sampler_fixes_is_saved_and_a_different_one_given_is_refused(registry, tmp_path):
    """An explicit episode shape (or a fixed composition) decides the batch; train.batch_size
    used to keep the default (or the user's value), which nothing read."""
    def batch(method, *sets, settings=None):
        return resolve(method, registry=registry, settings=settings or Settings(),
                       overrides=cli(*sets))["train"]["batch_size"]

    assert batch("protonet") == 20 * (5 + 15)  # Snell's 20-way 5-shot episodes, 15 queries
    assert batch("map-ssvm") == 8 * 16 and batch("triplet") == 20 * 20
    assert batch("map-ssvm", "sampler.ways=16", "train.batch_size=256") == 256  # agreeing: fine
    assert batch("nca", "train.batch_size=32") == 32  # iid: the batch size is the setting
    # the NCA paper's parameterisation divides the batch size given: it is used, so it stays
    assert batch("protonet", "sampler.ways=0", "sampler.queries=0", "sampler.per_class=8",
                 "train.batch_size=256") == 256
    with pytest.raises(ConfigError) as error:
        batch("map-ssvm", "train.batch_size=256")
    assert str(error.value) == "config key 'train.batch_size' is 256, but sampler 'fixed' draws batches of 128 " \
                               "rows from its own parameters (ways=8, per_class=16); change those instead, or " \
                               "leave train.batch_size out"
    # a [run] default is for every method: replaced, not refused
    assert batch("protonet", settings=settings_from(tmp_path, "[run.train]\nbatch_size = 64\n")) == 400


@pytest.mark.parametrize("text, start, key", [
    ('[run.loss]\nname = "ncaa"\n', "Unknown loss 'ncaa'. Did you mean 'nca'?", "loss.name"),
    ('[run.dataset]\nname = "cifarfs"\n', "Unknown dataset 'cifarfs'. Did you mean 'cifar-fs'?", "dataset.name"),
    ('[run]\nsinks = ["nope"]\n', "Unknown sink 'nope'.", "sinks"),
])
def test_an_unknown_plugin_chosen_in_run_names_the_file(registry, tmp_path, text, start, key):
    settings = settings_from(tmp_path, text)
    with pytest.raises(UsageError) as error:
        resolve("nca", registry=registry, settings=settings)
    assert str(error.value).startswith(start)
    assert str(error.value).endswith(f" (set by {key} in [run] of {settings.path})")


def test_an_unknown_plugin_of_another_kind_is_not_blamed_on_run(registry, tmp_path):
    """[run] chose loss 'nca'; --set evaluator.name=nca is the mistake, and the message's 'nca' is no
    reason to point at fslab.toml (matching the message's text did)."""
    settings = settings_from(tmp_path, '[run.loss]\nname = "nca"\n')
    with pytest.raises(UsageError) as error:
        resolve("nca", registry=registry, settings=settings, overrides=cli("evaluator.name=nca"))
    assert str(error.value).startswith("Unknown evaluator 'nca'.") and "[run]" not in str(error.value)


def test_a_misspelt_data_root_name_is_pointed_out(registry, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no data/miniimagenet to fall back to
    settings = settings_from(tmp_path, '[data_roots]\nminimagenet = "/data/mini"\ncub = "/data/cub"\n')
    with pytest.raises(ConfigError) as error:
        resolve("nca", registry=registry, settings=settings, overrides=cli("dataset.name=miniimagenet"))
    assert str(error.value) == f"{settings.path}: [data_roots] has no root for dataset 'miniimagenet', but one " \
                               f"for 'minimagenet', which is no dataset's name: rename it to miniimagenet (or give " \
                               f"--data-root)"
    config = resolve("nca", registry=registry, settings=settings, overrides=cli("dataset.name=miniimagenet",
                                                                                  "dataset.root=/data/m"))
    assert config["dataset"]["root"] == "/data/m"  # a root given: nothing to point out


def test_whole_numbers_stay_within_what_a_run_can_count(registry):
    with pytest.raises(ConfigError, match=r"^config key 'train.epochs' must be a whole number from 1 to 1,000,000, "
                                          r"got 1000001$"):
        resolve("nca", registry=registry, settings=Settings(), overrides=cli("train.epochs=1000001"))
    with pytest.raises(ConfigError, match=r"^config key 'train.log_every' must be a whole number below 2\*\*63, "
                                          r"got 99999999999999999999$"):
        resolve("nca", registry=registry, settings=Settings(), overrides=[{"train": {"log_every": 10**20 - 1}}])


def test_the_method_is_the_commands_argument_not_a_setting(registry, tmp_path):
    """Set anywhere else, the method was silently replaced by the argument."""
    with pytest.raises(ConfigError) as error:
        resolve("nca", registry=registry, settings=Settings(), overrides=cli("method=protonet"))
    assert str(error.value) == "'method' is not a setting; name the method as the command's argument " \
                               "instead (fslab run protonet)"
    settings = settings_from(tmp_path, '[run]\nmethod = "protonet"\n')
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(settings.path))}: \[run\]: 'method' is not a setting"):
        resolve("nca", registry=registry, settings=settings)


def test_unknown_method_or_plugin_suggests(registry):
    with pytest.raises(UsageError, match=r"Unknown method 'ncaa'\. Did you mean 'nca'\?"):
        resolve("ncaa", registry=registry, settings=Settings())
    with pytest.raises(UsageError, match=r"Unknown backbone 'resnet21'\. Did you mean 'resnet12'\?"):
        resolve("nca", registry=registry, settings=Settings(), overrides=cli("backbone.name=resnet21"))


def test_episodic_loss_needs_an_episodic_sampler(registry):
    with pytest.raises(ConfigError, match=r"loss 'protonet' needs episodes .* sampler 'iid'.*episodic"):
        resolve("protonet", registry=registry, settings=Settings(), overrides=cli("sampler.name=iid"))


def test_an_episodic_loss_on_plain_batches_names_the_recipes_that_train_it(registry):
    # following only "--set sampler.name=episodic" leaves the sampler without a shape: a recipe has one
    with pytest.raises(ConfigError) as error:
        resolve("nca", registry=registry, settings=Settings(), overrides=cli("loss.name=protonet"))
    assert str(error.value).endswith("or a recipe that trains it on episodes: fslab run protonet "
                                     "(or protonet-best, protonet-snell, protonet-snell-1shot).")
    with pytest.raises(ConfigError, match=r"on episodes: fslab run lpn\.$"):
        resolve("lpn", registry=registry, settings=Settings(), overrides=cli("sampler.name=fixed"))


def test_toml_syntax_error_names_file_line_and_column(tmp_path):
    path = tmp_path / "fslab.toml"
    path.write_text("[project]\nruns_dir = 'r'\nplugin_dirs = [\n\n[run\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    message = str(info.value)
    assert str(path) in message and "line 5" in message and "column" in message


def test_settings_unknown_section_and_key(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown section \[projet\]\. Did you mean 'project'\?"):
        settings_from(tmp_path, "[projet]\nruns_dir='x'\n")
    with pytest.raises(ConfigError, match=r"unknown key 'project.run_dir'\. Did you mean 'runs_dir'\?"):
        settings_from(tmp_path, "[project]\nrun_dir='x'\n")
    with pytest.raises(ConfigError, match=r"'project.plugin_dirs' must be a list"):
        settings_from(tmp_path, "[project]\nplugin_dirs='x'\n")


def test_settings_mistakes_that_went_unnoticed_are_one_line(tmp_path, monkeypatch):
    path = tmp_path / "fslab.toml"
    path.write_bytes(b"[project]\n# caf\xe9\n")  # a Latin-1 comment
    with pytest.raises(ConfigError) as error:
        load_settings(path)
    assert str(error.value) == f"{path}:2: not UTF-8 text (byte 15, 0xe9); TOML files are UTF-8: save it in " \
                               f"that encoding"
    with pytest.raises(ConfigError, match=r"'runs_dir' is a key of \[project\]; put it under a \[project\] line$"):
        settings_from(tmp_path, 'runs_dir = "x"\n')
    (tmp_path / "afile").write_text("")  # `fslab runs` said "no runs yet" and `fslab run` failed to create it
    with pytest.raises(ConfigError, match=r"'project.runs_dir' names .*afile, which is a file, not a folder"):
        settings_from(tmp_path, '[project]\nruns_dir = "afile"\n')
    path.write_text('[project]\nruns_dir = "elsewhere"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FSLAB_CONFIG", "")  # set but empty: the file in the working directory
    assert load_settings().runs_dir.resolve() == (tmp_path / "elsewhere").resolve()


def test_a_command_in_a_project_s_subfolder_that_finds_no_runs_names_the_project_above(tmp_path):
    """fslab in a subfolder of a project reads the subfolder's runs/: it said "no runs yet; start one with:
    fslab run nca", which would start a second store there. It now names the fslab.toml above and FSLAB_CONFIG."""
    import subprocess
    import sys

    (tmp_path / "fslab.toml").write_text("[project]\n")
    sub = tmp_path / "notebooks" / "figures"
    sub.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "FSLAB_CONFIG"}

    def fslab_(*args, cwd, **extra):
        return subprocess.run([sys.executable, "-m", "fslab", *args], cwd=cwd, capture_output=True, text=True,
                              env={**env, **extra}, timeout=120)

    hint = ("; a project's fslab.toml is above this folder (../../fslab.toml), but fslab reads the fslab.toml and "
            "runs/ of the folder it runs in: run it in ../.., or here with FSLAB_CONFIG=../../fslab.toml")
    listed = fslab_("runs", cwd=sub)
    assert listed.returncode == 0 and listed.stdout.strip() == "no runs yet; start one with: fslab run nca" + hint
    shown = fslab_("show", "last", cwd=sub)
    assert shown.returncode == 2 and shown.stderr.strip() == \
        "error: no runs yet: runs/ holds none; start one with: fslab run nca" + hint
    assert fslab_("runs", cwd=tmp_path).stdout.strip() == "no runs yet; start one with: fslab run nca"
    told = fslab_("runs", cwd=sub, FSLAB_CONFIG="../../fslab.toml")
    assert told.stdout.strip() == "no runs yet; start one with: fslab run nca"
    assert not (sub / "runs").exists()


def test_every_command_that_finds_nothing_in_a_project_s_subfolder_names_the_project_above(tmp_path):
    """A store copied to another machine, read from a subfolder of its project (notebooks/): fslab runs named
    the fslab.toml above, but fslab show ID and logs ID said only "no run 'ID' in runs. List them with: fslab
    runs", compare and plot of a sweep "no sweeps yet ... start one with: fslab sweep", fslab queue "no runs
    queued or running" and fslab study report "No runs yet" with every cell pending, as if the study had never
    run. Each now names the project above, and nothing is made in the subfolder."""
    from .runs_helpers import fslab_here

    (tmp_path / "fslab.toml").write_text("[project]\n")
    sub = tmp_path / "notebooks"
    sub.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "FSLAB_CONFIG"}
    hint = ("; a project's fslab.toml is above this folder (../fslab.toml), but fslab reads the fslab.toml and "
            "runs/ of the folder it runs in: run it in .., or here with FSLAB_CONFIG=../fslab.toml")
    for args in (["show", "2e05"], ["logs", "2e05"]):
        done = fslab_here(*args, cwd=sub, env=env)
        assert done.returncode == 2 and done.stderr.strip() == f"error: no run '2e05' in runs, which holds none{hint}"
    for args in (["compare", "sweep-1"], ["plot", "batch-size", "sweep-1"]):
        done = fslab_here(*args, cwd=sub, env=env)
        assert done.returncode == 2 and done.stderr.strip().endswith("fslab sweep METHOD --seeds 3" + hint), args
    queue = fslab_here("queue", cwd=sub, env=env)
    assert queue.returncode == 0 and queue.stdout.splitlines()[0] == "no runs queued or running" + hint
    report = fslab_here("study", "report", "nca-supcon", cwd=sub, env=env)
    assert report.returncode == 0 and report.stderr.strip() == f"note: runs/ holds no run of study nca-supcon{hint}"
    assert "every cell is pending" in report.stdout
    here = fslab_here("show", "2e05", cwd=tmp_path, env=env)  # in the project itself: as before
    assert here.stderr.strip() == "error: no run '2e05' in runs. List them with: fslab runs"
    assert fslab_here("queue", cwd=tmp_path, env=env).stdout.splitlines()[0] == "no runs queued or running"
    assert fslab_here("study", "report", "nca-supcon", cwd=tmp_path, env=env).stderr == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["fslab.toml", "notebooks"]


def test_a_runs_folder_that_links_to_nothing_is_one_line_not_an_empty_store(tmp_path):
    """runs/ a link to a larger disk that is not mounted: listings said "no runs yet; start one with: fslab
    run nca", and fslab run "cannot create the runs folder runs: File exists"."""
    import subprocess
    import sys

    (tmp_path / "runs").symlink_to(tmp_path / "big disk" / "runs")
    env = {k: v for k, v in os.environ.items() if k != "FSLAB_CONFIG"}
    line = (f"error: runs is a link to {tmp_path / 'big disk' / 'runs'}, which does not exist (a disk not mounted?); "
            f"mount or restore it, or remove the link")
    for args in (["runs"], ["show", "last"], ["run", "nca", "--detach"], ["compare", "all"], ["queue"]):
        done = subprocess.run([sys.executable, "-m", "fslab", *args], cwd=tmp_path, capture_output=True, text=True,
                              env=env, timeout=120)
        assert done.returncode == 2 and done.stderr.strip() == line and done.stdout == "", (args, done.stderr)
    assert not (tmp_path / "big disk").exists()
    listed = subprocess.run([sys.executable, "-m", "fslab", "plugins", "--kind", "sink", "--json"], cwd=tmp_path,
                            capture_output=True, text=True, env=env, timeout=120)
    assert listed.returncode == 0 and listed.stdout  # the plugins need no run store


def test_a_file_named_runs_is_one_line_not_an_empty_store(tmp_path):
    """A file ``runs`` where the runs folder goes: fslab runs and the dashboard said "no runs yet", and
    fslab run then failed (exit 1) with "cannot create the runs folder runs: File exists"."""
    import subprocess
    import sys

    (tmp_path / "runs").write_text("notes\n")
    env = {k: v for k, v in os.environ.items() if k != "FSLAB_CONFIG"}
    line = ("error: runs is a file, not a folder, where fslab keeps its runs; move or rename the file, or name "
            "another folder in fslab.toml ([project] runs_dir)")
    for args in (["runs"], ["tui"], ["show", "last"], ["run", "nca", "--detach"], ["compare", "all"]):
        done = subprocess.run([sys.executable, "-m", "fslab", *args], cwd=tmp_path, capture_output=True, text=True,
                              env=env, timeout=120)
        assert done.returncode == 2 and done.stderr.strip() == line and done.stdout == "", (args, done.stderr)
    assert (tmp_path / "runs").read_text() == "notes\n"


def test_a_settings_file_that_links_to_nothing_is_one_line_not_the_defaults(tmp_path, monkeypatch):
    # a dangling fslab.toml link was read as no file at all: runs went to ./runs, [run] was dropped, silently
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FSLAB_CONFIG", raising=False)
    (tmp_path / "fslab.toml").symlink_to(tmp_path / "shared" / "fslab.toml")
    with pytest.raises(ConfigError, match=rf"^fslab\.toml is a link to {re.escape(str(tmp_path))}/shared/fslab\.toml, "
                                          r"which does not exist; restore that file or remove the link$"):
        load_settings()
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "fslab.toml").write_text("[scheduler]\ncpu_slots = 3\n")
    assert load_settings().scheduler.cpu_slots == 3


def test_a_settings_file_named_that_does_not_exist_is_one_line_not_the_defaults(tmp_path, monkeypatch):
    """load_settings(".../fslab.toml") with a mistyped path gave the built-in settings in silence: a notebook
    read ./runs and no plugin folders instead of the project's. A folder with no fslab.toml, where no file
    is named, still gets the built-in settings."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FSLAB_CONFIG", raising=False)
    missing = tmp_path / "project" / "fslab.toml"
    for named in (missing, str(missing)):
        with pytest.raises(ConfigError, match=rf"^the settings file {re.escape(str(missing))} does not exist; give "
                                              r"the path of an fslab\.toml, or load_settings\(\) for this folder's"):
            load_settings(named)
    assert load_settings() == Settings()
    missing.parent.mkdir()
    missing.write_text("[scheduler]\ncpu_slots = 4\n")
    assert load_settings(missing).scheduler.cpu_slots == 4


@pytest.mark.parametrize("where", ["[run.dataset]\nroot", "[run.dataset]\ncache_dir", "--set dataset.root"])
def test_a_dataset_path_with_a_nul_is_refused_before_a_run_exists(registry, tmp_path, where):
    """dataset.root = "x\\u0000" was saved in a run's config.json, and the run trained on (a dataset
    that reads its root would fail there): a path with a NUL names no file."""
    key = where.rsplit("\n", 1)[-1].removeprefix("--set dataset.")
    settings = settings_from(tmp_path, "" if where.startswith("--") else f'{where} = "x\\u0000"\n')
    overrides = cli('dataset.root="x\\u0000"') if where.startswith("--") else []
    with pytest.raises(ConfigError, match=rf"^config key 'dataset\.{key}' must be a path without NUL characters "
                                          rf"\(\\u0000\), got \".*x\\u0000\""):
        resolve("nca", registry=registry, settings=settings, overrides=overrides)


def test_a_plugin_folder_that_is_missing_is_a_load_failure_not_silence(tmp_path):
    registry = load_registry([tmp_path / "my_plugin"])
    assert [(f.plugin, f.error) for f in registry.failures] == [
        ("local:my_plugin", f"NotADirectoryError: {tmp_path / 'my_plugin'} is not a folder "
                            f"(plugin_dirs in fslab.toml names it)")]


def test_settings_paths_resolve_against_the_file(tmp_path):
    settings = settings_from(tmp_path, "[project]\nruns_dir='store'\nplugin_dirs=['p']\n[data_roots]\nsynthetic='d'\n")
    assert settings.runs_dir == tmp_path / "store"
    assert settings.plugin_dirs == (tmp_path / "p",)
    assert settings.data_roots == {"synthetic": str(tmp_path / "d")}
    # [run]'s dataset.root too: it was taken from the folder fslab ran in (FSLAB_CONFIG=../fslab.toml
    # from a subfolder read sub/mydata), where the others were taken from the file's
    settings = settings_from(tmp_path, "[run.dataset]\nname='folder'\nroot='mydata'\n")
    assert settings.run["dataset"] == {"name": "folder", "root": str(tmp_path / "mydata")}
    home = settings_from(tmp_path, "[run.dataset]\nroot='~/x'\n").run["dataset"]["root"]
    assert home == os.path.expanduser("~/x")  # an absolute (or ~) root stays where it points



def test_a_toml_file_that_starts_with_a_byte_order_mark_is_read(tmp_path):
    """It was 'fslab.toml:1:1: TOML syntax error: Invalid statement', in a file that looks right in any editor."""
    from fslab.core.settings import read_toml

    (tmp_path / "fslab.toml").write_bytes(b"\xef\xbb\xbf[scheduler]\r\ncpu_slots = 2\r\n")
    assert load_settings(tmp_path / "fslab.toml").scheduler.cpu_slots == 2
    (tmp_path / "s.toml").write_text('\ufeffmethod = "nca"\n', encoding="utf-8")
    assert read_toml(tmp_path / "s.toml") == {"method": "nca"}


def test_settings_paths_starting_with_a_tilde_are_in_the_home_folder(tmp_path, monkeypatch):
    """[data_roots] expanded ~ but runs_dir and plugin_dirs made a folder named '~' beside the file."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    settings = settings_from(tmp_path, "[project]\nruns_dir='~/store'\nplugin_dirs=['~/p']\n"
                                       "[data_roots]\nsynthetic='~/d'\n")
    assert settings.runs_dir == tmp_path / "home" / "store"
    assert settings.plugin_dirs == (tmp_path / "home" / "p",)
    assert settings.data_roots == {"synthetic": str(tmp_path / "home" / "d")}


def test_merge_does_not_modify_its_inputs():
    base = {"train": {"epochs": 1}, "loss": {"name": "nca", "temperature": 1.0}}
    layer = {"loss": {"name": "protonet"}, "train": {"lr": 0.1}}
    merged = merge(base, layer)
    assert merged == {"train": {"epochs": 1, "lr": 0.1}, "loss": {"name": "protonet"}}
    assert base["loss"] == {"name": "nca", "temperature": 1.0}


def test_check_value_types():
    from fslab.core.values import check_value

    assert check_value("k", 3, 1.0) == 3.0
    assert check_value("k", 5, [1, 5]) == [5]
    assert check_value("k", [0.5, 1], [0.7]) == [0.5, 1.0]
    assert check_value("k", True, False) is True
    for value, default in [(True, 1), (1, True), ("a", 1), (["a"], [1]), (1.5, 2), ({"a": 1}, [1])]:
        with pytest.raises(ConfigError, match="config key 'k"):
            check_value("k", value, default)


def test_scheduler_settings_are_checked(tmp_path):
    from fslab.core.settings import SchedulerSettings

    assert (settings_from(tmp_path, "[scheduler]\ngpus = [0, 2]\n").scheduler
            == SchedulerSettings(gpus=(0, 2), runs_per_gpu=1, cpu_slots=1))
    gpus = r"'scheduler.gpus' must be \"auto\" or a list of distinct GPU indices \(0, 1, \.\.\.\), got "
    for value in ('"all"', "[-1]", "[0, 0]"):  # [0, 0] made two slots of one lock name
        with pytest.raises(ConfigError, match=gpus + re.escape(value)):
            settings_from(tmp_path, f"[scheduler]\ngpus = {value}\n")
    for value in (0, 5_000_000):  # millions of slots: fslab queue looked at each lock file
        with pytest.raises(ConfigError, match=rf"'scheduler.cpu_slots' must be a whole number from 1 to 1024, "
                                              rf"got {value}$"):
            settings_from(tmp_path, f"[scheduler]\ncpu_slots = {value}\n")
    with pytest.raises(ConfigError, match=r"unknown key 'scheduler.cpu_slot'\. Did you mean 'cpu_slots'\?"):
        settings_from(tmp_path, "[scheduler]\ncpu_slot = 2\n")


def test_sinks_close_wait_is_a_setting_and_checked(tmp_path):
    from fslab.core.settings import SinksSettings
    from fslab.core.sinks import CLOSE_WAIT

    # 5 s lost a loaded machine's events of sinks still importing their tracker: the default is 30 s
    assert settings_from(tmp_path, "[project]\n").sinks == SinksSettings(close_wait_s=CLOSE_WAIT) and CLOSE_WAIT == 30
    assert settings_from(tmp_path, "[sinks]\nclose_wait_s = 120\n").sinks.close_wait_s == 120
    assert settings_from(tmp_path, "[sinks]\nclose_wait_s = 0.5\n").sinks.close_wait_s == 0.5
    assert settings_from(tmp_path, "[sinks]\nclose_wait_s = 0\n").sinks.close_wait_s == 0
    for value in ("-1", '"x"', "3601", "true", "inf", "nan", "[5]"):  # each quoted as the file writes it
        with pytest.raises(ConfigError) as error:
            settings_from(tmp_path, f"[sinks]\nclose_wait_s = {value}\n")
        assert str(error.value).endswith(f"'sinks.close_wait_s' must be a number of seconds from 0 to 3600, "
                                         f"got {value}")
        assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match=r"unknown key 'sinks.close_wait'\. Did you mean 'close_wait_s'\?"):
        settings_from(tmp_path, "[sinks]\nclose_wait = 10\n")
    with pytest.raises(ConfigError, match=r"'close_wait_s' is a key of \[sinks\]; put it under a \[sinks\] line$"):
        settings_from(tmp_path, "close_wait_s = 10\n")


def test_defaults_are_the_dataclass_defaults():
    """One source of truth: every field of the typed sections, in order, with
    its default in the saved form (tuples as lists), and nothing else."""
    for name, kind in (("train", TrainConfig), ("eval", EvalConfig)):
        fields = dataclasses.fields(kind)
        assert list(DEFAULTS[name]) == [f.name for f in fields]
        for f in fields:
            default = list(f.default) if isinstance(f.default, tuple) else f.default
            assert DEFAULTS[name][f.name] == default and type(DEFAULTS[name][f.name]) is type(default), f.name
    top = RunConfig()
    assert list(DEFAULTS) == [f.name for f in dataclasses.fields(RunConfig) if f.name != "config_version"]
    for key in ("method", "seed", "device", "dataset", "backbone", "loss", "sampler", "evaluator"):
        assert DEFAULTS[key] == getattr(top, key)
    assert (DEFAULTS["train"]["lr"], DEFAULTS["train"]["milestones"], DEFAULTS["eval"]["shots"]) == (0.1, [0.7], [1, 5])


@pytest.mark.parametrize("section, kind", [("train", TrainConfig), ("eval", EvalConfig)])
def test_every_dataclass_field_is_a_type_checked_set_key(registry, section, kind):
    wrong = {bool: 1, int: "many", float: "fast", str: 3, tuple: "x"}
    for f in dataclasses.fields(kind):
        default = DEFAULTS[section][f.name]
        config = resolve("nca", registry=registry, settings=Settings(), overrides=[{section: {f.name: default}}])
        assert config[section][f.name] == default
        bad = [{section: {f.name: wrong[type(f.default)]}}]
        with pytest.raises(ConfigError, match=rf"config key '{section}\.{f.name}(\[0\])?' must be"):
            resolve("nca", registry=registry, settings=Settings(), overrides=bad)


def test_resolve_stamps_the_version_and_config_version_is_not_a_setting(registry):
    assert resolve("nca", registry=registry, settings=Settings())["config_version"] == CONFIG_VERSION == 5
    with pytest.raises(ConfigError, match=r"unknown config key 'config_version'"):
        resolve("nca", registry=registry, settings=Settings(), overrides=[{"config_version": 3}])


@pytest.mark.parametrize("settings", [[], ["train.optimizer=adam", "eval.feature_stages=2", "eval.shots=5",
                                           "train.milestones=[0.5, 0.75]", "train.lr=1", "train.projection_dim=16"]])
def test_run_config_reads_every_resolved_configuration(registry, settings):
    """run_config rejects nothing resolve() accepts, and its view holds the same values."""
    for method in registry.names("method"):
        config = resolve(method, registry=registry, settings=Settings(), overrides=cli(*settings))
        typed = run_config(config)
        assert typed.as_dict() == config, method
        assert typed.train.lr == config["train"]["lr"] and typed.eval.shots == tuple(config["eval"]["shots"])
        assert typed.loss == config["loss"] and typed.config_version == CONFIG_VERSION
        with pytest.raises(dataclasses.FrozenInstanceError):
            typed.train.lr = 0.5


def test_run_config_names_a_missing_unknown_or_mistyped_key(registry):
    config = resolve("nca", registry=registry, settings=Settings())
    del config["eval"]["queries"]
    with pytest.raises(ConfigError, match=r"the configuration has no 'eval.queries'"):
        run_config(config)
    config = resolve("nca", registry=registry, settings=Settings())
    config["train"]["epoch"] = 3
    with pytest.raises(ConfigError, match=r"unknown config key 'train.epoch'\. Did you mean 'epochs'\?"):
        run_config(config)
    config = resolve("nca", registry=registry, settings=Settings())
    config["train"]["flip"] = "yes"
    with pytest.raises(ConfigError, match=r"config key 'train.flip' must be true or false"):
        run_config(config)


# -- recipes per dataset --------------------------------------------------------------------------


def test_the_map_recipes_take_the_papers_batches_per_dataset(registry):
    """mAP paper Sec. 5: |B| = 128 from N = 8 classes on miniImageNet (the base) and N = 16 on
    Omniglot, where the learning rate is not decayed; an option still wins over the recipe."""
    def resolved(dataset, *overrides):
        return resolve("map-dlm", registry=registry, settings=Settings(),
                       overrides=[{"dataset": {"name": dataset}}, *overrides])

    for dataset in ("miniimagenet", "synthetic"):
        config = resolved(dataset)
        assert (config["sampler"]["ways"], config["sampler"]["per_class"]) == (8, 16)
        assert len(config["train"]["milestones"]) == 10 and config["train"]["gamma"] == 0.75
    omniglot = resolved("omniglot")
    sampler = omniglot["sampler"]
    assert (sampler["ways"], sampler["per_class"], omniglot["train"]["milestones"]) == (16, 8, [])
    assert omniglot["loss"]["update"] == "positive"
    assert resolved("omniglot", {"sampler": {"ways": 4, "per_class": 32}})["sampler"]["ways"] == 4
    assert "per_dataset" not in omniglot


RECIPE_PLUGIN = '''
from fslab.plugin import hookimpl


@hookimpl
def register_methods(register):
    register({"loss": {"name": "nca"}, "per_dataset": PER_DATASET}, name="mine", description="a recipe")
'''


@pytest.mark.parametrize("per_dataset, message", [
    ({"synthetic": {"train": {"epoch": 3}}}, "method 'mine', per_dataset.synthetic: unknown config key 'train.epoch'"),
    ({"synthetic": {"dataset": {"name": "folder"}}}, "a per-dataset layer cannot choose the dataset"),
    ({"synthetic": 3}, "per_dataset must map dataset names to configuration layers"),
    # read as the user's own --set loss=..., naming no method
    ({"synthetic": {"loss": {"name": "ncaa"}}}, "method 'mine', per_dataset.synthetic: Unknown loss 'ncaa'. Did you"),
    ({"synthetic": {"loss": {"name": "nca", "temp": 2}}}, "method 'mine', per_dataset.synthetic: unknown parameter "
                                                          "'loss.temp' for loss 'nca'"),
    ({"omniglot": {"loss": {"name": "ncaa"}}}, None),  # a layer for another dataset than the run's: not its concern
])
def test_a_bad_per_dataset_layer_names_the_recipe(tmp_path, per_dataset, message):
    (tmp_path / "mine.py").write_text(RECIPE_PLUGIN.replace("PER_DATASET", repr(per_dataset)))
    registry = load_registry([tmp_path])
    if message is None:
        assert resolve("mine", registry=registry, settings=Settings(), overrides=[])["loss"]["name"] == "nca"
        return
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve("mine", registry=registry, settings=Settings(), overrides=[])


@pytest.mark.parametrize("loss, message", [
    # both read as the user's own --set, naming no method: Unknown loss 'ncaa', unknown parameter 'loss.temp'
    ({"name": "ncaa"}, "method 'mine' (its recipe): Unknown loss 'ncaa'. Did you mean 'nca'?"),
    ({"name": "nca", "temp": 2.0}, "method 'mine' (its recipe): unknown parameter 'loss.temp' for loss 'nca'. "
                                   "Allowed: pair_fraction, temperature."),
    ({"name": "nca", "temperature": "hot"}, "method 'mine' (its recipe): config key 'loss.temperature' must be"),
])
def test_a_recipe_naming_a_component_or_parameter_there_is_not_is_named(tmp_path, loss, message):
    (tmp_path / "mine.py").write_text(RECIPE_PLUGIN.replace('{"name": "nca"}', repr(loss)).replace("PER_DATASET", "{}"))
    registry = load_registry([tmp_path])
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        resolve("mine", registry=registry, settings=Settings(), overrides=[])


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "[1.0, inf]", "{ a = nan }"])
def test_an_untyped_plugin_parameter_is_refused_when_not_finite(registry, value):
    # loss.margin defaults to null (measured at initialisation), so its value had no type to check,
    # and --set loss.margin=inf created a run although no number may be NaN or infinite
    with pytest.raises(ConfigError, match=r"^config key 'loss\.margin' must be a finite number, got "):
        resolve("triplet", registry=registry, settings=Settings(), overrides=cli(f"loss.margin={value}"))
    with pytest.raises(ConfigError, match=r"'loss\.margin' must be a finite number"):
        fslab.create("loss", "triplet", margin=float("inf"))
    assert resolve("triplet", registry=registry, settings=Settings(),
                   overrides=cli("loss.margin=0.5"))["loss"]["margin"] == 0.5


@pytest.mark.parametrize("method, assigned, expect", [
    # a whole number too large for a float was a traceback (OverflowError) instead of one line
    ("nca", f"loss.temperature={10**400}", r"'loss\.temperature' must be a finite number \(below 1\.8e308\), "
                                           r"got a whole number of 401 digits"),
    ("nca", f"train.lr=-{10**400}", r"'train\.lr' must be a finite number \(below 1\.8e308\), got a whole number"),
    ("nca", f"train.milestones=[0.5, {10**309}]", r"'train\.milestones\[1\]' must be a finite number"),
    # an untyped parameter holds no whole number from 2**63 on either
    ("triplet", f"loss.margin={2**63}",
     r"'loss\.margin' must hold whole numbers below 2\*\*63, got 9223372036854775808"),
], ids=["temperature", "lr", "milestones", "margin"])
def test_a_number_beyond_range_is_one_line(registry, method, assigned, expect):
    with pytest.raises(ConfigError, match=expect):
        resolve(method, registry=registry, settings=Settings(), overrides=cli(assigned))
    with pytest.raises(ConfigError, match=r"'loss\.temperature' must be a finite number"):
        fslab.create("loss", "nca", temperature=10**400)


def test_a_list_written_without_brackets_is_refused_with_the_brackets_suggested(registry):
    # --shots takes 1,5 and so --set eval.shots=1,5 is natural; the line said only "must be a list, got '1,5'"
    with pytest.raises(ConfigError, match=r"^config key 'eval\.shots' must be a list, got \"1,5\"; a list is written "
                                          r"in brackets: \[1,5\]$"):
        resolve("nca", registry=registry, settings=Settings(), overrides=cli("eval.shots=1,5"))
    with pytest.raises(ConfigError, match=r"'backbone\.widths' must be a list, got \"8, 16, 32, 64\"; "
                                          r".*\[8, 16, 32, 64\]$"):
        resolve("nca", registry=registry, settings=Settings(),
                overrides=cli("backbone.name=resnet12", "backbone.widths=8, 16, 32, 64"))
    with pytest.raises(ConfigError, match=r"must be a list, got \"a,b\"$"):  # no list either way: nothing to suggest
        resolve("nca", registry=registry, settings=Settings(), overrides=cli("eval.shots=a,b"))


def test_a_quoted_dotted_key_in_run_says_to_drop_the_quotes(tmp_path, registry):
    # as in a sweep file's [set], "train.lr" = 0.5 is natural in [run]; TOML reads one key named
    # 'train.lr', and the line said "unknown config key 'train.lr'. Did you mean 'train'?"
    settings = settings_from(tmp_path, '[run]\n"train.lr" = 0.5\n')
    with pytest.raises(ConfigError, match=r"^.*fslab\.toml: \[run\]: 'train\.lr' is one key with a dot in its name "
                                          r"\(quoted, in TOML\), not lr in train; write it without the quotes "
                                          r"\(train\.lr = \.\.\.\)$"):
        resolve("nca", registry=registry, settings=settings)
    settings = settings_from(tmp_path, '[run]\ntrain.lr = 0.5\n')  # unquoted: a key of [run.train]
    assert resolve("nca", registry=registry, settings=settings)["train"]["lr"] == 0.5


def test_a_root_run_gives_with_its_dataset_stays_with_that_dataset(tmp_path, registry):
    # [run.dataset] name = "folder" with its root, then --dataset synthetic: the synthetic run was saved with
    # the folder's root (a miniimagenet root was read as CUB's), though an option that changes a plugin drops
    # what lower layers gave the one it replaces
    settings = settings_from(tmp_path, '[run.dataset]\nname = "folder"\nroot = "/data/my-images"\n')
    config = resolve("nca", registry=registry, settings=settings, overrides=cli("dataset.name=synthetic"))
    assert config["dataset"]["root"] == ""  # synthetic reads no files: no data/synthetic is filled in for it
    config = resolve("nca", registry=registry, settings=settings,
                     overrides=cli("dataset.name=cub", "dataset.root=/data/birds"))
    assert config["dataset"]["root"] == "/data/birds"  # a root given with the option stays
    settings = settings_from(tmp_path, '[run.dataset]\nroot = "/data/any"\n')  # a root without a name: for any
    config = resolve("nca", registry=registry, settings=settings, overrides=cli("dataset.name=cub"))
    assert config["dataset"]["root"] == "/data/any"


READING = "one of: cifar-fs, cub, fc100, folder, miniimagenet, omniglot, tieredimagenet"


def test_a_root_given_for_a_dataset_that_reads_no_files_is_refused(tmp_path, registry):
    # fslab run nca --data-root ~/data/mini, --dataset forgotten: the run trained on the generated glyphs,
    # saved the root it never read, and nothing said so
    settings = settings_from(tmp_path, "")
    for layers in ([nest(["dataset", "root"], "/data/mini")],  # --data-root alone: synthetic by default
                   [nest(["dataset", "name"], "synthetic"), nest(["dataset", "root"], "/data/mini")],
                   [{"dataset": {"name": "synthetic"}}, *cli("dataset.root=/data/mini")]):  # --like RUN --set
        with pytest.raises(ConfigError, match=rf"^dataset\.root /data/mini: dataset 'synthetic' is generated and "
                                              rf"reads no files, so nothing in that folder would be used; name the "
                                              rf"dataset stored there with --dataset \({READING}\)$"):
            resolve("nca", registry=registry, settings=settings, overrides=layers)
    settings = settings_from(tmp_path, '[run.dataset]\nroot = "/data/mini"\n')  # [run] names no dataset
    with pytest.raises(ConfigError, match=r"reads no files.*\(set by dataset\.root in \[run\] of .*fslab\.toml\)$"):
        resolve("nca", registry=registry, settings=settings)


def test_a_root_below_the_choice_of_a_dataset_that_reads_no_files_is_dropped(tmp_path, registry):
    settings = settings_from(tmp_path, "")
    # --like RUN of a synthetic run an earlier fslab saved with data/synthetic filled in; a sweep's --data-root
    # under a grid point choosing synthetic (the root is for the grid's other datasets)
    for layers in ([{"dataset": {"name": "synthetic", "root": str(tmp_path / "data" / "synthetic")}}],
                   [nest(["dataset", "root"], "/data/mini"), nest(["dataset", "name"], "synthetic")]):
        config = resolve("nca", registry=registry, settings=settings, overrides=layers)
        assert config["dataset"]["name"] == "synthetic" and config["dataset"]["root"] == ""


def test_a_relative_cache_dir_is_saved_absolute_and_taken_from_the_file(tmp_path, registry, monkeypatch):
    # dataset.cache_dir was kept as given: a relative one followed the folder each command ran in, so a
    # resume or a SLURM job started elsewhere decoded the split again into another cache, and [run]'s was
    # not taken from fslab.toml's folder as its dataset.root is
    monkeypatch.chdir(tmp_path)
    config = resolve("nca", registry=registry, settings=settings_from(tmp_path, ""),
                     overrides=cli("dataset.name=folder", "dataset.root=imgs", "dataset.cache_dir=~/c"))
    assert config["dataset"]["cache_dir"] == os.path.expanduser("~/c")
    config = resolve("nca", registry=registry, settings=settings_from(tmp_path, ""),
                     overrides=cli("dataset.name=folder", "dataset.root=imgs", "dataset.cache_dir=cache"))
    assert config["dataset"]["cache_dir"] == str(tmp_path / "cache")
    project = tmp_path / "project"
    project.mkdir()
    settings = settings_from(project, '[run.dataset]\nname = "folder"\nroot = "imgs"\ncache_dir = "cache"\n')
    assert settings.run["dataset"]["cache_dir"] == str(project / "cache")
    config = resolve("nca", registry=registry, settings=settings)
    assert config["dataset"]["cache_dir"] == str(project / "cache")
    assert resolve("nca", registry=registry, settings=settings_from(tmp_path, ""),
                   overrides=cli("dataset.name=folder", "dataset.root=imgs"))["dataset"]["cache_dir"] == ""


def test_one_commands_set_values_are_one_layer_whatever_their_order(registry, tmp_path, monkeypatch):
    # --set evaluator.k=3 --set evaluator.name=knn: each --set was a layer of its own, so the name's layer
    # dropped the k given before it (as a layer that changes a plugin drops what lower layers gave the old
    # one), and the run tested with knn's default k, saying nothing; in the other order k was kept
    from fslab.cli.common import overrides
    from fslab.core.assignments import assignments_layer

    assert assignments_layer(["evaluator.k=3", "evaluator.name=knn", "train.lr=0.1", "train.lr=0.2"]) == {
        "evaluator": {"k": 3, "name": "knn"}, "train": {"lr": 0.2}}
    settings = settings_from(tmp_path, "")
    for order in (["evaluator.k=3", "evaluator.name=knn"], ["evaluator.name=knn", "evaluator.k=3"]):
        layers = overrides(None, None, None, None, None, None, None, None, order)
        assert resolve("nca", registry=registry, settings=settings, overrides=layers)["evaluator"] == {
            "name": "knn", "k": 3, "ties": "nearest"}
    # a sweep file's [set] stays a layer below the command's: a name the command gives replaces its plugin
    layers = overrides(None, None, None, None, None, None, None, None, ["evaluator.name=centroid"],
                       file_set=["evaluator.name=knn", "evaluator.k=3"])
    assert resolve("nca", registry=registry, settings=settings, overrides=layers)["evaluator"]["name"] == "centroid"


def test_eval_shots_naming_a_number_twice_is_refused(registry):
    # --set eval.shots=[5,5] trained and tested the same 5-shot episodes twice, and results.json kept one
    with pytest.raises(ConfigError, match=r"^config key 'eval\.shots' lists 5 twice; give each value once, "
                                          r"got \[5, 1, 5\]$"):
        resolve("nca", registry=registry, settings=Settings(), overrides=cli("eval.shots=[5,1,5]"))
    assert resolve("nca", registry=registry, settings=Settings(),
                   overrides=cli("eval.shots=[5,1]"))["eval"]["shots"] == [5, 1]


toml_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6)


@hypothesis.example("None")  # a text, read back as one
@given(toml_values.filter(lambda v: v is not None))
def test_a_value_is_quoted_back_as_toml_reads_it(value):
    """Messages said the Python spelling of a setting's value (got True, got 'maybe', got {'a': 1}),
    which is no way to write it in a file or after --set; they now say TOML's, which reads back
    as the same value."""
    import tomllib

    from fslab.core.assignments import shown

    text = shown(value)
    if _holds_none(value):  # a null in a list or table: no TOML value, said as null
        assert "null" in text
        return
    assert tomllib.loads(f"v = {text}")["v"] == value


def _holds_none(value) -> bool:
    """Whether a None lies anywhere in ``value`` (the text 'None' is no null: it was taken for one)."""
    if isinstance(value, dict):
        return any(_holds_none(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_none(v) for v in value)
    return value is None


def test_a_bad_setting_is_quoted_in_toml_and_cut_to_its_width(registry):
    import datetime

    from fslab.core.assignments import shown

    for text, said in (("train.epochs=true", "got true"), ("train.deterministic=maybe", 'got "maybe"'),
                       ("train.lr={a=1}", "got {a = 1}"), ("eval.shots=[1,1]", "lists 1 twice; give each value "
                                                                                "once, got [1, 1]")):
        with pytest.raises(ConfigError) as error:
            resolve("nca", registry=registry, settings=Settings(), overrides=cli(text))
        assert str(error.value).endswith(said), str(error.value)
    assert shown("x" * 300, 200) == '"' + "x" * 198 + "…" and shown("x" * 300) == '"' + "x" * 300 + '"'
    assert shown(datetime.date(2026, 11, 26)) == "2026-11-26" and shown(object).startswith("<class")


def test_a_key_given_in_another_section_names_where_it_is(registry):
    """--set train.seed=3 listed train's keys and no suggestion (seed is a key of its own), and so did
    eval.lr (train.lr) and train.shots (eval.shots): the line names where the key lives."""
    for text, meant in (("train.seed=3", "'seed' or 'eval.seed'"), ("eval.lr=0.1", "'train.lr'"),
                        ("train.shots=5", "'eval.shots'"), ("train.device=cpu", "'device'"),
                        ("train.lrr=0.1", "'lr'"),  # a near spelling in its own section comes first
                        ("batch-size=64", "'train.batch_size' or 'eval.batch_size'")):  # as --batch-size spells it
        with pytest.raises(ConfigError) as error:
            resolve("nca", registry=registry, settings=Settings(), overrides=cli(text))
        key = text.partition("=")[0]
        assert str(error.value).startswith(f"unknown config key '{key}'. Did you mean {meant}? Allowed: "), error.value


def test_null_as_fslab_plugins_writes_an_unset_default_is_refused_saying_to_leave_the_key_out(registry):
    """fslab plugins writes a parameter unset by default as margin=null, "as --set takes it"; --set
    loss.margin=null was refused as "must be > 0, got "null"", not saying that TOML has no null and
    that leaving the key out keeps it unset."""
    with pytest.raises(ConfigError) as error:
        resolve("lpn", registry=registry, settings=Settings(), overrides=cli("loss.margin=null"))
    assert str(error.value) == ("config key 'loss.margin' must be > 0, got \"null\". null is no TOML value (fslab "
                                "plugins writes an unset default so): leave the key out to keep the default")
    assert resolve("lpn", registry=registry, settings=Settings(), overrides=[])["loss"]["margin"] is None


def test_load_settings_takes_a_path_as_text_too(tmp_path):
    """load_settings("…/fslab.toml"), as a notebook writes it, failed with AttributeError ('str' object
    has no attribute 'exists'); a Path worked."""
    from fslab.core.settings import load_settings

    (tmp_path / "fslab.toml").write_text("[project]\nruns_dir = 'elsewhere'\n")
    as_text, as_path = load_settings(str(tmp_path / "fslab.toml")), load_settings(tmp_path / "fslab.toml")
    assert as_text.runs_dir == as_path.runs_dir == tmp_path / "elsewhere"
