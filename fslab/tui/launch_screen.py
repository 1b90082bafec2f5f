"""The form that starts a new run; its choices come from the plugin registry."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Input, Label, Select, Static

from fslab.core.assignments import assignments_layer, nest
from fslab.core.commands import like_command
from fslab.core.errors import FslabError, UsageError
from fslab.core.rerun import like
from fslab.core.runstore import Run
from fslab.core.text import split_outside
from fslab.execution.data_roots import like_root_gone
from fslab.execution.executor import prepare


class LaunchScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("ctrl+s", "launch", "launch", priority=True),
        Binding("escape", "cancel", "cancel", key_display="esc"),
    ]
    # Under 30 lines (80x24 included) the fields go without blank lines between them, so that an error of a
    # few lines still shows with the buttons below it.
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]

    def __init__(self, registry, like_run: Run | None = None) -> None:
        super().__init__()
        self.registry = registry
        self.like_run = like_run  # "new run from this run": its saved configuration under the form's values
        if like_run is not None:
            refuse_deleted(like_run)  # between the table's last read and N
        self.saved = like_run.config() if like_run is not None else {}
        if not registry.names("method"):  # the form would have no method to offer (and fslab run refuses them all)
            missing = registry.missing_names()
            raise UsageError("no run can start: no plugin loaded registers a method (fslab plugins --kind method "
                             "lists them)" + (f"; the methods may be among {missing}" if missing else ""))
        if like_run is not None:  # refused as fslab run --like refuses it: no readable configuration, or
            like(like_run, [], registry, only_recipe=True)  # a recipe no plugin registers now (the form's
            # fields may replace a plugin: one they leave is named when the form launches)

    def compose(self) -> ComposeResult:
        names = self.registry.names
        methods = names("method")
        saved = "(as saved)" if self.like_run is not None else None  # an empty field keeps the run's value
        with Vertical(id="launch"):
            yield Static(self.title_text(), id="launch-title", markup=False)
            with Grid(id="launch-grid"):
                yield Label("method")
                method = self.saved.get("method") or ("nca" if "nca" in methods else methods[0])
                yield Select([(n, n) for n in methods], value=method, allow_blank=False, compact=True, id="method",
                             disabled=self.like_run is not None)
                yield Label("backbone")
                yield Select([(n, n) for n in names("backbone")], prompt=saved or "(recipe default)", compact=True,
                             id="backbone")
                yield Label("dataset")
                yield Select([(n, n) for n in names("dataset")], prompt=saved or "(default)", compact=True,
                             id="dataset")
                yield Label("data root")
                yield Input(placeholder=self.root_placeholder(), compact=True, id="data-root")
                yield Label("seed")
                yield Input(placeholder=saved or "0", type="integer", valid_empty=True, compact=True, id="seed")
                yield Label("epochs")
                yield Input(placeholder=saved or "(dataset default)", type="integer", valid_empty=True, compact=True,
                            id="epochs")
                yield Label("--set")
                yield Input(placeholder="key=value ... e.g. train.batch_size=32 loss.temperature=0.9", compact=True,
                            id="settings")
            yield Static(id="launch-error")
            with Horizontal(id="launch-buttons"):
                yield Button("Launch (ctrl+s)", variant="primary", id="launch-button")
                yield Button("Cancel (esc)", id="cancel-button")
        yield Footer()

    def root_placeholder(self) -> str:
        return "(as saved)" if self.like_run is not None else "(fslab.toml's [data_roots], else data/DATASET)"

    def on_select_changed(self, event: Select.Changed) -> None:
        """A dataset that reads no files (synthetic) takes no data root: its field is emptied and disabled, where
        a root typed there went unread (fslab run refuses it in one line, and so would the launch)."""
        if event.select.id != "dataset":
            return
        field = self.query_one("#data-root", Input)
        name = self.choice("dataset")
        field.disabled = name is not None and not self.registry.reads_files(name)
        if field.disabled:
            field.value = ""
        field.placeholder = f"({name} reads no files)" if field.disabled else self.root_placeholder()

    def title_text(self) -> str:
        if self.like_run is None:
            return "New run (same as fslab run METHOD --detach)"
        return (f"New run like {self.like_run.id}: every setting as saved, the fields below on top "
                f"(same as {like_command(self.like_run.id)} --detach)")

    def on_mount(self) -> None:
        for field in self.query(Input):
            field.cursor_blink = self.app.cursor_blink
        if self.saved:  # pre-filled from the run; launching layers the fields over its saved configuration
            section = lambda key: self.saved.get(key) if isinstance(self.saved.get(key), dict) else {}
            for widget_id in ("backbone", "dataset"):  # a damaged section is left to the launch to name
                name = section(widget_id).get("name")
                if isinstance(name, str) and name in self.registry.names(widget_id):
                    self.query_one(f"#{widget_id}", Select).value = name
            for widget_id, value in (("seed", self.saved.get("seed")), ("epochs", section("train").get("epochs"))):
                if isinstance(value, int) and not isinstance(value, bool):  # the fields take whole numbers
                    self.query_one(f"#{widget_id}", Input).value = str(value)

    def choice(self, widget_id: str) -> str | None:
        value = self.query_one(f"#{widget_id}", Select).value
        return None if value is Select.NULL else str(value)

    def overrides(self) -> list[dict]:
        """The form's values as configuration layers, like fslab run's options."""
        options = {("backbone", "name"): self.choice("backbone"), ("dataset", "name"): self.choice("dataset"),
                   # as fslab run --data-root gives it: the text, checked by the dataset when the run is prepared
                   ("dataset", "root"): self.query_one("#data-root", Input).value.strip() or None}
        for key, path in (("seed", ("seed",)), ("epochs", ("train", "epochs"))):
            text = self.query_one(f"#{key}", Input).value.strip()
            options[path] = _whole_number(text) if text else None
        layers = [nest(list(path), value) for path, value in options.items() if value is not None]
        settings = _assignments(self.query_one("#settings", Input).value)
        return layers + ([assignments_layer(settings)] if settings else [])

    def action_launch(self) -> None:
        method = self.choice("method")
        try:
            overrides = self.overrides()
            if self.like_run is not None:
                refuse_deleted(self.like_run)  # since the form opened: not 'no readable configuration'
                method, overrides = like(self.like_run, overrides, self.registry)
            # Checked here as the launch checks it (configuration, GPUs, data), so a mistake is shown in
            # the form; the app checks again when it launches.
            try:
                prepare(method, overrides, settings=self.app.settings, registry=self.registry)
            except UsageError as exc:  # the run's saved data root gone: as fslab run --like says it
                gone = self.like_run and like_root_gone(f"run {self.like_run.id}", overrides, exc,
                                                        "the data root field", self.app.settings)
                raise gone or exc from None
        except (FslabError, ValueError) as exc:
            self.query_one("#launch-error", Static).update(Text(str(exc), style="bold red"))
            return
        self.app.launch(method, overrides, self.registry)
        self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in a text field launches, as the form's button does; in a choice it still opens the list."""
        event.stop()
        self.action_launch()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "launch-button":
            self.action_launch()
        else:
            self.action_cancel()


def refuse_deleted(run: Run) -> None:
    """A UsageError for a run to start one like whose folder is gone (fslab delete, say): said so, where
    reading its configuration would say it has none that is readable."""
    if not run.path.is_dir():
        raise UsageError(f"run {run.id} was deleted (its folder is gone), so there is no run to start one like; "
                         f"n starts a new run")


def _assignments(text: str) -> list[str]:
    """The form's --set field as the shell would split it: ``train.milestones=[0.5, 0.75]`` is one
    assignment only quoted on a command line, so a space inside brackets or quotes does not split."""
    return [piece for piece in split_outside(text, str.isspace) if piece]


def _whole_number(text: str) -> int | str:
    """A seed or epochs field's number; text that is none (``-``, ``+``, ``1_``: the field lets them be typed)
    stays text, so the configuration's check refuses it in the line ``--set seed=-`` gets, not int()'s."""
    try:
        return int(text)
    except ValueError:
        return text
