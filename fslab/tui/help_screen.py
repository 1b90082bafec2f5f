"""``?``: every key of the screen it was opened from, generated from the
bindings that are active there (the screen's, the focused widget's, the
app's), so it cannot drift from what the keys do."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Static

# Keys every Textual app has that are not worth a line here.
SKIPPED_ACTIONS = {"app.focus_next", "app.focus_previous", "focus_next", "focus_previous", "screen.minimize",
                   "page_left", "page_right", "screen.copy_text", "copy_text"}


def what_it_does(binding: Binding) -> str:
    """The binding's tooltip (what the action does), else its short label."""
    text = binding.tooltip or binding.description or binding.action
    return text[:1].upper() + text[1:]


def key_lines(screen: Screen) -> list[tuple[str, str]]:
    """(keys, what they do) for each action active on ``screen``: the screen's
    first, then the focused widget's, then the app's, each in binding order;
    keys bound to the same action share a line (``up, k``)."""
    lines: dict[tuple[int, int, str], tuple[list[str], str]] = {}
    for key, active in screen.active_bindings.items():
        binding = active.binding
        if binding.system or binding.action in SKIPPED_ACTIONS:
            continue
        shown = screen.app.get_key_display(binding) if binding.key == key else key
        rank = 0 if active.node is screen else 2 if active.node is screen.app else 1
        slot = (rank, id(active.node), binding.action)
        entry = lines.setdefault(slot, ([], what_it_does(binding)))
        if shown not in entry[0]:
            entry[0].append(shown)
        if binding.tooltip:  # fslab's words over Textual's for the same action (ctrl+q and q: quit)
            lines[slot] = (entry[0], what_it_does(binding))
    order = sorted(lines, key=lambda k: k[0])  # stable: binding order within a rank
    return [(", ".join(lines[k][0]), lines[k][1]) for k in order]


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,question_mark,q", "app.pop_screen", "close", tooltip="Close this help")]

    def __init__(self, screen: Screen) -> None:
        super().__init__()
        self.lines = key_lines(screen)
        self.title_text = f"keys of the {getattr(screen, 'HELP_NAME', 'current screen')}"

    def compose(self) -> ComposeResult:
        width = max((len(keys) for keys, _ in self.lines), default=4)
        text = Text(self.title_text + "\n\n", style="bold")
        for keys, what in self.lines:
            text.append(keys.ljust(width), style="bold cyan")
            text.append(f"  {what}\n")
        text.append("\nesc or ? closes; ctrl+p opens the command palette", style="dim")
        with VerticalScroll(id="help"):
            yield Static(text, markup=False)
        yield Footer()  # its own keys: the footer of the screen below showed keys that do nothing here (s stop)
