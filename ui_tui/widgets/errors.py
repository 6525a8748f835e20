"""The most recent request errors, newest first."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ui_tui.paint import set_text


def errors_text(errors: tuple[str, ...]) -> Text:
    if not errors:
        return Text("no errors", style="dim")
    return Text("\n").join(Text(f"• {e}", style="red") for e in reversed(errors))


class ErrorsPanel(Static):
    def show(self, errors: tuple[str, ...]) -> None:
        set_text(self, errors_text(errors))
