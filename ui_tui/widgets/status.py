"""The bar at the top: network, mode, devices and load; a second line while recording."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.widgets import Static

from app.live import LiveView
from ui_tui.paint import set_text


def status_text(view: LiveView, busy: str | None = None, replay: str | None = None) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(" Prism ", style="bold reverse")
    text.append(f" {view.network.split('#')[0]}", style="bold")
    text.append(f" · {view.mode} · {view.devices_spec}")
    if view.replaying:
        text.append(" · ")
        text.append("replay", style="bold magenta")
        if replay:
            text.append(f" {Path(replay).name}")
    elif view.load == "no load":
        text.append(" · no load", style="dim")
    else:
        text.append(f" · load {view.load} ")
        if view.paused:
            text.append("⏸ paused", style="bold yellow")
        else:
            text.append("▶ running", style="bold green")
    if busy:
        text.append(f" · {busy}…", style="italic")
    if view.recording:  # a second line while recording, so the path is never cut off
        text.append("\n ")
        text.append("● REC", style="bold red")
        text.append(f" events to {view.recording} (e stops)")
    return text


class StatusBar(Static):
    def show(self, view: LiveView, busy: str | None = None, replay: str | None = None) -> None:
        set_text(self, status_text(view, busy, replay))
