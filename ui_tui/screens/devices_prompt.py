"""A small dialog asking for a new device spec; Enter re-partitions, Escape cancels."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class DevicesPrompt(ModalScreen[str | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: str) -> None:
        super().__init__(id="devices-prompt")
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt-box"):
            yield Label("Devices, e.g. cpu:2,sim:4 or cpu:1,sim:2:mem=64MB")
            yield Input(value=self.current, id="devices-input")
            yield Label("Enter re-partitions · Escape cancels", classes="hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
        self.dismiss(value if value and value != self.current else None)

    def action_cancel(self) -> None:
        self.dismiss(None)
