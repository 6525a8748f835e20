"""The bar at the top: model, mode, devices and load; a second line while recording."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.widgets import Static

from app.dashboard import Status
from ui_tui.paint import set_text


def status_text(status: Status, busy: str | None = None) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(" Prism ", style="bold reverse")
    text.append(f" {status.model}", style="bold")
    if status.bundle:
        text.append(" bundle", style="bold cyan")
    text.append(f" · {status.mode} · {status.devices}")
    if status.replay is not None:
        text.append(" · ")
        text.append("replay", style="bold magenta")
        text.append(f" {Path(status.replay).name}")
    elif status.training:
        text.append(" · ")
        text.append("training", style="bold cyan")
    elif status.load.setting is None:
        text.append(" · no load", style="dim")
    else:
        text.append(f" · load {status.load.label} ")
        if status.load.paused:
            text.append("⏸ paused", style="bold yellow")
        else:
            text.append("▶ running", style="bold green")
    if busy:
        text.append(f" · {busy}…", style="italic")
    if status.recording:  # a second line while recording, so the path is never cut off
        text.append("\n ")
        text.append("● REC", style="bold red")
        text.append(f" events to {status.recording} (e stops)")
    return text


class StatusBar(Static):
    def show(self, status: Status, busy: str | None = None) -> None:
        set_text(self, status_text(status, busy))
