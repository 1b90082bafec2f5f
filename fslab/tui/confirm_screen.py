"""A yes/no dialog before anything destructive."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Static


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [
        Binding("y", "answer(True)", "yes"),
        # q as no: the app's q (quit) would leave the dashboard from a question that only asked
        Binding("n,escape,q", "answer(False)", "no", key_display="n/esc/q"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(Text(self.question), id="question")
            yield Static("y: yes    n, esc or q: no", id="hint", markup=False)
        yield Footer()

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
