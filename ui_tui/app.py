"""PrismApp: the terminal dashboard around one DashboardModel (the view model).

A timer on the UI thread polls the model a few times a second (poll is cheap: it drains
the source's new events into the metrics). Anything slower, re-partitioning or running the
partitioner step by step, runs in a thread worker that posts a message back, so input is
never blocked and no UI code ever runs on a runtime thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.worker import WorkerFailed

from app.dashboard import DashboardModel, DashboardView
from runtime.errors import PrismError
from runtime.partition import Plan
from runtime.units import human_seconds
from ui_tui.keys import KeyState, key_enabled
from ui_tui.messages import Repartitioned, StepperReady
from ui_tui.screens.dashboard import DashboardScreen
from ui_tui.screens.devices_prompt import DevicesPrompt
from ui_tui.screens.stepper import StepperScreen

REFRESH_SECONDS = 0.25


class PrismApp(App[int]):
    CSS_PATH = "prism.tcss"
    TITLE = "Prism"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("p", "pause", "Pause"),
        Binding("p", "resume", "Resume"),
        Binding("plus,equals_sign", "faster", "Faster", key_display="+"),
        Binding("minus", "slower", "Slower", key_display="-"),
        Binding("m", "next_mode", "Mode"),
        Binding("r", "repartition", "Replan"),
        Binding("t", "replan_measured", "Replan measured"),
        Binding("s", "stepper", "Stepper"),
        Binding("e", "record", "Record"),
        Binding("e", "stop_recording", "Stop rec"),
        Binding("d", "devices", "Devices"),
    ]

    def __init__(self, model: DashboardModel, *, record_dir: str | Path | None = None,
                 refresh: float = REFRESH_SECONDS, close_runtime: bool = True) -> None:
        super().__init__()
        self.model = model
        self.record_dir = Path(record_dir) if record_dir is not None else Path()
        self.refresh_seconds = refresh
        self.close_runtime = close_runtime
        self.view: DashboardView | None = None
        self.busy: str | None = None  # what a runtime worker is doing, if anything
        self.quitting = False
        self.swapping = False  # a re-partition is replacing the runtime's plan or host
        self._keys: KeyState | None = None
        self.dashboard = DashboardScreen()

    # -- the loop -------------------------------------------------------------------------

    async def on_mount(self) -> None:
        await self.push_screen(self.dashboard)
        self.tick()
        self.poll_timer = self.set_interval(self.refresh_seconds, self.tick)

    def tick(self) -> None:
        """Poll the runtime and draw. Skipped while a re-partition swaps it underneath."""
        if self.quitting:
            return
        if self.swapping:
            self._show_busy()
            return
        self.view = self.model.poll()
        self.dashboard.show(self.view, self.busy)
        self._refresh_keys()

    def _refresh_keys(self) -> None:
        """Redraw the footer only when which keys apply has changed (a redraw remounts it)."""
        keys = self.key_state()
        if keys != self._keys:
            self._keys = keys
            self.refresh_bindings()

    def _show_busy(self) -> None:
        self.dashboard.show_busy(self.busy)
        if isinstance(self.screen, StepperScreen):
            self.screen.show_busy(self.busy)

    # -- which keys apply ---------------------------------------------------------------

    def key_state(self) -> KeyState:
        status = self.view.status if self.view is not None else self.model.status
        return KeyState(on_stepper=isinstance(self.screen, StepperScreen),
                        replaying=not status.changeable,
                        has_load=status.load.setting is not None, paused=status.load.paused,
                        recording=status.recording is not None)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return key_enabled(action, self.key_state())

    # -- load controls ------------------------------------------------------------------

    def action_pause(self) -> None:
        self._toggle_pause()

    def action_resume(self) -> None:
        self._toggle_pause()

    def _toggle_pause(self) -> None:
        if self._refuse_while_busy():
            return
        self.model.toggle_pause()
        self.tick()

    def action_faster(self) -> None:
        if not self._refuse_while_busy():
            self.model.faster()
            self.tick()

    def action_slower(self) -> None:
        if not self._refuse_while_busy():
            self.model.slower()
            self.tick()

    def action_record(self) -> None:
        if self._refuse_while_busy():
            return
        path = self.record_dir / f"prism-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
        try:
            started = self.model.start_recording(path)
        except (OSError, ValueError, PrismError) as exc:
            self.notify(f"cannot record: {exc}", severity="error")
            return
        self.notify(f"recording events to {started}", title="Record")
        self.tick()

    def action_stop_recording(self) -> None:
        if self._refuse_while_busy():
            return
        path = self.model.stop_recording()
        if path:
            self.notify(f"events saved to {path}", title="Record")
        self.tick()

    def _refuse_while_busy(self) -> bool:
        if self.busy is not None:
            self.notify(f"wait: {self.busy}", severity="warning")
            return True
        return False

    # -- re-partitioning (thread worker) -----------------------------------------------

    def action_next_mode(self) -> None:
        mode = self.model.next_mode()
        self._start_repartition(f"mode {mode}", mode=mode)

    def action_repartition(self) -> None:
        self._start_repartition("re-plan", mode=self.model.status.mode)

    def action_replan_measured(self) -> None:
        """Re-plan on the run times the running plan measured (its partitions' medians)."""
        self._start_repartition("from measured times", replan=self.model.replan_measured)

    def action_devices(self) -> None:
        if self._refuse_while_busy():
            return

        def chosen(spec: str | None) -> None:
            if spec:
                self._start_repartition(f"devices {spec}", devices=spec)

        self.push_screen(DevicesPrompt(self.model.status.devices), chosen)

    def _start_repartition(self, what: str, replan: Callable[[], Plan] | None = None,
                           **change: str) -> None:
        if self._refuse_while_busy():
            return
        self.busy, self.swapping = f"re-partitioning ({what})", True
        self._show_busy()
        self._repartition(what, replan or partial(self.model.repartition, **change))

    @work(thread=True, group="runtime", exit_on_error=False)
    def _repartition(self, what: str, replan: Callable[[], Plan]) -> None:
        try:
            plan = replan()
        except Exception as exc:  # shown to the user; the old plan keeps serving
            self.post_message(Repartitioned(what, None, str(exc) or type(exc).__name__))
        else:
            self.post_message(Repartitioned(what, plan))

    def on_repartitioned(self, message: Repartitioned) -> None:
        self.busy, self.swapping = None, False
        if message.error is not None:
            self.notify(message.error, title=f"Re-partition ({message.what}) failed",
                        severity="error", timeout=8)
        else:
            plan = message.plan
            n = len(plan.partitions)
            self.notify(f"{n} partition{'s' if n != 1 else ''}, bottleneck "
                        f"{human_seconds(plan.bottleneck_seconds)}",
                        title=f"Re-partitioned ({plan.mode}, {plan.costs} costs)")
        self.tick()
        if isinstance(self.screen, StepperScreen):
            self._start_stepper("re-running the partitioner")

    # -- stepper (thread worker) -------------------------------------------------------

    def action_stepper(self) -> None:
        if not self._refuse_while_busy():
            self._start_stepper("running the partitioner")

    def _start_stepper(self, what: str) -> None:
        self.busy = what
        self._show_busy()
        self._build_stepper()

    @work(thread=True, group="runtime", exit_on_error=False)
    def _build_stepper(self) -> None:
        try:
            self.post_message(StepperReady(self.model.stepper()))
        except Exception as exc:
            self.post_message(StepperReady(None, str(exc) or type(exc).__name__))

    def on_stepper_ready(self, message: StepperReady) -> None:
        self.busy = None
        self._show_busy()
        if message.stepper is None:
            self.notify(message.error or "failed", title="Stepper", severity="error")
        elif isinstance(self.screen, StepperScreen):
            self.screen.set_stepper(message.stepper)
        else:
            self.push_screen(StepperScreen(message.stepper))
        self._refresh_keys()

    # -- quitting ----------------------------------------------------------------------

    async def action_quit(self) -> None:
        """Wait for a re-partition in flight, stop load, recording and the host, then exit."""
        if self.quitting:
            return
        self.quitting = True
        self.poll_timer.stop()
        self.busy = "stopping"
        self._show_busy()
        await self.workers.wait_for_complete([w for w in self.workers if w.group == "runtime"])
        if self.close_runtime:
            try:
                await self.run_worker(self.model.close, thread=True, group="close",
                                      exit_on_error=False).wait()
            except WorkerFailed as exc:
                self.log.error(f"closing the runtime failed: {exc}")
        self.exit(0)
