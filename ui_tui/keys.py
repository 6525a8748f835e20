"""Which footer keys apply at a moment: shown and working (True), shown greyed out (None)
or hidden (False). Pure, so the rules read in one place."""

from __future__ import annotations

from dataclasses import dataclass

LIVE_ONLY = frozenset({"pause", "resume", "faster", "slower", "next_mode", "repartition",
                       "replan_measured", "record", "stop_recording", "devices"})
DASHBOARD_ONLY = frozenset({"pause", "resume", "faster", "slower", "record", "stop_recording",
                            "stepper"})


@dataclass(frozen=True)
class KeyState:
    on_stepper: bool = False
    replaying: bool = False
    has_load: bool = True
    paused: bool = False
    recording: bool = False


def key_enabled(action: str, s: KeyState) -> bool | None:
    if action in DASHBOARD_ONLY and s.on_stepper:
        return False  # the stepper has its own keys; these wait for the dashboard
    if action in LIVE_ONLY and s.replaying:
        return False  # a recording cannot be changed
    if action == "pause":
        return not s.paused if s.has_load else None
    if action == "resume":
        return s.has_load and s.paused
    if action in ("faster", "slower"):
        return True if s.has_load else None
    if action == "record":
        return not s.recording
    if action == "stop_recording":
        return s.recording
    return True
