"""The terminal dashboard, driven through Textual's pilot on a real embedded runtime.

Every test runs the app headless at 80x24 (the smallest size it promises) unless it says
otherwise; async pilots run under `asyncio.run`, so plain pytest is enough.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from rich.console import Console
from rich.text import Text
from textual.pilot import Pilot
from textual.widgets import Input

from app.cli import build_parser, main
from app.dashboard import DashboardModel
from app.dashboard.source import MODES
from app.defaults import SAMPLES
from app.live import LiveRuntime
from app.loadgen import LoadGenerator
from app.replay import Recording
from runtime.bundle.writer import compile_bundle
from runtime.devices import parse_devices
from runtime.partition import replay
from ui_tui import PrismApp
from ui_tui.keys import KeyState, key_enabled
from ui_tui.paint import seconds as seconds_text
from ui_tui.screens.devices_prompt import DevicesPrompt
from ui_tui.screens.stepper import StepperScreen
from ui_tui.widgets.dag import PartitionDag
from ui_tui.widgets.devices import DevicesPanel
from ui_tui.widgets.errors import ErrorsPanel
from ui_tui.widgets.latency import LatencyTable
from ui_tui.widgets.node_graph import NodeGraph
from ui_tui.widgets.queue import QueuePanel
from ui_tui.widgets.schedule import ScheduleTable, schedule_cells
from ui_tui.widgets.status import StatusBar

SIZE = (80, 24)


# -- helpers -------------------------------------------------------------------------------


def dashboard(source, **options) -> PrismApp:
    return PrismApp(DashboardModel(source), **options)


def drive(app: PrismApp, script: Callable[[Pilot], Awaitable[None]],
          size: tuple[int, int] = SIZE) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await script(pilot)

    try:
        asyncio.run(main())
    finally:
        app.model.close()  # a no-op when `q` already closed it


async def wait_until(pilot: Pilot, cond: Callable[[], bool], timeout: float = 10.0,
                     what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def open_stepper(pilot: Pilot) -> StepperScreen:
    """Press `s` and wait for the partition stepper: its screen."""
    await pilot.press("s")
    await wait_until(pilot, lambda: isinstance(pilot.app.screen, StepperScreen),
                     what="the stepper")
    return pilot.app.screen


async def run_for(pilot: Pilot, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await pilot.pause(0.1)


def shown(widget) -> str:
    """The plain text a widget draws."""
    content = getattr(widget, "content", None)
    rendered = content if content is not None else widget.render()
    return rendered.plain if isinstance(rendered, Text) else str(rendered)


def prism_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("prism") and t.is_alive()}


def figures(app: PrismApp) -> dict[str, tuple[str, ...]]:
    return app.screen.query_one(LatencyTable).figures()


def device_runs(app: PrismApp) -> dict[str, int]:
    return {r.name: r.runs for r in app.screen.query_one(DevicesPanel).rows}


async def quit_app(pilot: Pilot) -> None:
    await pilot.press("q")
    await wait_until(pilot, lambda: pilot.app.return_code is not None, what="the app to exit")


@pytest.fixture
def live_threads():
    """Fails a test that leaves a prism thread of its own running."""
    before = prism_threads()
    yield
    deadline = time.monotonic() + 5
    while prism_threads() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    left = prism_threads() - before
    assert not left, f"threads left running: {sorted(t.name for t in left)}"


# -- the live dashboard --------------------------------------------------------------------


def test_default_dashboard_shows_real_changing_figures(live_threads):
    live = LiveRuntime(seed=1)
    seen: dict[str, object] = {}

    async def script(pilot: Pilot) -> None:
        app = pilot.app
        await wait_until(pilot, lambda: any(int(r[2].replace(",", "")) > 0
                                            for r in figures(app).values()),
                         what="runs in the latency table")
        await run_for(pilot, 2.0)
        seen["first"] = (figures(app), device_runs(app), shown(app.screen.query_one(
            DevicesPanel)))
        await run_for(pilot, 1.0)
        seen["second"] = (figures(app), device_runs(app), shown(app.screen.query_one(
            DevicesPanel)))
        seen["status"] = shown(app.screen.query_one(StatusBar))
        seen["dag"] = shown(app.screen.query_one(PartitionDag))
        seen["queue"] = shown(app.screen.query_one(QueuePanel).query_one("#rate"))
        await quit_app(pilot)

    drive(dashboard(live), script)
    (lat1, runs1, dev_text1), (lat2, runs2, dev_text2) = seen["first"], seen["second"]
    plan = live.plan()
    assert set(lat1) == {p.name for p in plan.partitions}
    for name in lat1:
        count1, count2 = (int(t[name][2].replace(",", "")) for t in (lat1, lat2))
        assert 0 < count1 < count2, (name, count1, count2)
        assert all(cell.endswith(("us", "ms", " s")) for cell in lat2[name][3:]), lat2[name]
    assert lat1 != lat2
    assert set(runs1) == {d.name for d in plan.devices}
    assert all(runs2[d] > runs1[d] > 0 for d in runs1), (runs1, runs2)
    assert dev_text1 != dev_text2 and "util" in dev_text2 and "/2.1 GB" in dev_text2
    assert "running" in seen["status"] and "150 req/s" in seen["status"]
    assert all(p.name in seen["dag"] for p in plan.partitions) and "KB" in seen["dag"]
    assert "req/s" in seen["queue"] and "done" in seen["queue"]
    assert live.host is None  # q closed the runtime


def test_footer_load_keys_record_and_quit(tmp_path: Path, live_threads):
    live = LiveRuntime(seed=2)
    seen: dict[str, object] = {}

    async def script(pilot: Pilot) -> None:
        app = pilot.app
        status = app.screen.query_one(StatusBar)
        await pilot.pause(0.3)
        assert not live.paused and "150 req/s" in shown(status)

        await pilot.press("p")
        assert live.paused and app.view.status.load.paused and "paused" in shown(status)
        await run_for(pilot, 0.5)  # the view catches up with what ended before the pause
        done = app.view.totals.finished
        await run_for(pilot, 0.5)
        assert app.view.totals.finished <= done + 10  # only those in flight end

        await pilot.press("plus")
        assert live.state().load.label == "225 req/s" and "225 req/s" in shown(status)
        await pilot.press("minus", "minus")
        assert live.state().load.label == "100 req/s" and "100 req/s" in shown(status)

        await pilot.press("p")
        assert not live.paused and "running" in shown(status)
        await pilot.press("e")
        files = list(tmp_path.glob("prism-*.jsonl"))
        assert len(files) == 1 and live.state().recording == str(files[0])
        assert "REC" in shown(status) and files[0].name in shown(status)
        await run_for(pilot, 0.5)
        await pilot.press("e")
        assert live.state().recording is None and "REC" not in shown(status)
        size = files[0].stat().st_size
        await run_for(pilot, 0.3)
        assert size > 0 and files[0].stat().st_size == size  # stopped: no more writes
        seen["file"] = files[0]

        await open_stepper(pilot)
        await pilot.press("escape")
        assert not isinstance(app.screen, StepperScreen)
        await quit_app(pilot)

    app = dashboard(live, record_dir=tmp_path)
    drive(app, script)
    assert app.return_code == 0
    assert live.host is None and live.load is None
    assert any(line.startswith('{"kind"') for line in seen["file"].read_text().splitlines())


def test_mode_replan_and_devices_keys_repartition(live_threads):
    live = LiveRuntime(seed=3)

    async def script(pilot: Pilot) -> None:
        app = pilot.app
        status = app.screen.query_one(StatusBar)
        dag = app.screen.query_one(PartitionDag)
        await pilot.pause(0.3)
        before = live.plan()
        assert live.mode == "balanced" and len(before.partitions) > 1

        await pilot.press("plus")
        await pilot.press("m")
        await wait_until(pilot, lambda: app.busy is None, what="the re-partition")
        await pilot.pause(0.3)
        assert live.mode == "memory" and "memory" in shown(status)
        assert "225 req/s" in shown(status) and not live.paused  # the load carries on
        assert live.plan() is not before
        assert [p.name for p in live.plan().partitions] != [p.name for p in before.partitions]
        assert set(dag.dag.partitions) == {p.name for p in live.plan().partitions}
        assert set(figures(app)) == {p.name for p in live.plan().partitions}

        await pilot.press("p")  # the rest needs no load (and the pilot waits less for idle)
        assert live.paused
        memory_plan = live.plan()
        await pilot.press("r")
        await wait_until(pilot, lambda: app.busy is None, what="the re-plan")
        assert live.plan() is not memory_plan and live.mode == "memory"

        await pilot.press("d")
        assert isinstance(app.screen, DevicesPrompt)
        field = app.screen.query_one(Input)
        field.value = "cpu:1,sim:2"
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.busy is None and live.devices_spec == "cpu:1,sim:2",
                         what="the new devices")
        await pilot.pause(0.3)
        assert {d.name for d in live.plan().devices} == {"cpu0", "sim0", "sim1"}
        assert set(device_runs(app)) == {"cpu0", "sim0", "sim1"}
        assert "cpu:1,sim:2" in shown(status) and live.paused  # still paused on new devices

        await pilot.press("d")
        app.screen.query_one(Input).value = "tpu:9"
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.busy is None, what="the refused spec")
        assert live.devices_spec == "cpu:1,sim:2"  # a bad spec keeps the old plan serving
        await quit_app(pilot)

    drive(dashboard(live), script)


def test_the_latency_table_shows_estimates_and_t_replans_from_measurements(live_threads):
    """The latency table shows each partition's estimate beside its measured times; `t`
    plans again from the medians the running plan measured."""
    live = LiveRuntime(devices="cpu:2", concurrency=4, seed=4)

    async def script(pilot: Pilot) -> None:
        app = pilot.app
        before = live.plan()
        await wait_until(pilot, lambda: all(int(r[2].replace(",", "")) >= 20
                                            for r in figures(app).values()),
                         timeout=30, what="twenty runs of every partition")
        rows = figures(app)
        estimates = {p.name: seconds_text(p.est_seconds) for p in before.partitions}
        assert {name: cells[3] for name, cells in rows.items()} == estimates
        await pilot.press("t")
        await wait_until(pilot, lambda: app.busy is None, timeout=30, what="the re-plan")
        assert live.plan() is not before and live.plan().costs == "live"
        await quit_app(pilot)

    drive(dashboard(live), script)


def test_errors_panel_shows_request_failures(live_threads):
    live = LiveRuntime(start_load=False)

    async def script(pilot: Pilot) -> None:
        app = pilot.app
        panel = app.screen.query_one("#errors-panel")
        await pilot.pause(0.3)
        assert not panel.display  # no errors, no panel
        live.host.bus.publish("request.failed", network=live.network, request=7,
                              error="boom: out of cheese", partition="p1", device="cpu1")
        await wait_until(pilot, lambda: panel.display, what="the errors panel")
        text = shown(app.screen.query_one(ErrorsPanel))
        assert "request 7: boom: out of cheese (p1 on cpu1)" in text
        assert "1 failed" in shown(app.screen.query_one(QueuePanel).query_one("#rate"))
        await quit_app(pilot)

    drive(dashboard(live), script)


def test_a_bundle_shows_its_schedule_and_origin(tmp_path: Path, live_threads):
    """`prism tui NAME.prism`: the status bar says bundle, and the schedule panel (absent
    for a model) lays out the view's schedule rows; the stepper opens its recorded steps."""
    path = tmp_path / "branchy.prism"
    compile_bundle(SAMPLES / "branchy.onnx", parse_devices("cpu:3"), path)
    live = LiveRuntime(path, start_load=False)
    seen: dict[str, object] = {}

    async def script(pilot: Pilot) -> None:
        app = pilot.app
        panel = app.screen.query_one("#schedule-panel")
        await wait_until(pilot, lambda: panel.display, what="the schedule panel")
        seen["status"] = shown(app.screen.query_one(StatusBar))
        seen["title"] = str(panel.border_title)
        table = app.screen.query_one(ScheduleTable)
        seen["cells"] = [tuple(str(c) for c in table.get_row(k)) for k in table.rows]
        seen["view"] = app.view
        await open_stepper(pilot)
        seen["stepper"] = shown(app.screen.query_one("#stepper-status"))
        await quit_app(pilot)

    drive(dashboard(live), script, size=(120, 40))
    view = seen["view"]
    assert " bundle" in seen["status"] and "branchy.prism" in seen["title"]
    assert seen["cells"] == [tuple(str(c) for c in schedule_cells(r))
                             for r in view.bundle.schedule]
    assert [c[0] for c in seen["cells"]] == [p.name for p in view.plan.partitions]
    assert "(compiled)" in seen["stepper"]


def test_a_model_has_no_schedule_panel(live_threads):
    live = LiveRuntime(start_load=False)

    async def script(pilot: Pilot) -> None:
        await pilot.pause(0.3)
        assert not pilot.app.screen.query_one("#schedule-panel").display
        assert " bundle" not in shown(pilot.app.screen.query_one(StatusBar))
        await quit_app(pilot)

    drive(dashboard(live), script)


def test_large_terminal_draws_boxes(live_threads):
    live = LiveRuntime(start_load=False)

    async def script(pilot: Pilot) -> None:
        dag = pilot.app.screen.query_one(PartitionDag)
        await pilot.pause(0.3)
        text = shown(dag)
        assert "╭" in text or "┏" in text  # boxes once they fit
        assert dag.size.height > 20
        await pilot.press("down")
        second = live.plan().partitions[1]
        assert dag.selected == second.name
        detail = shown(pilot.app.screen.query_one("#detail"))
        assert second.nodes[0] in detail and "weights" in detail
        assert f"Partition {second.name} on {second.device}" in str(
            pilot.app.screen.query_one("#detail-panel").border_title)
        third = f" {live.plan().partitions[2].name} "
        line = next(i for i, ln in enumerate(text.splitlines()) if third in ln)
        await pilot.click(PartitionDag, offset=(4, line + 1))  # inside the third box
        assert dag.selected == live.plan().partitions[2].name
        await quit_app(pilot)

    drive(dashboard(live), script, size=(160, 50))


# -- the stepper ---------------------------------------------------------------------------


def _check_colouring(screen: StepperScreen) -> int:
    """Every node the stepper draws has the colour of its device in replay(steps[:i+1]),
    in the rows and in the drawn text; returns how many drawn nodes are coloured."""
    stepper = screen.stepper
    state = replay(stepper.steps[: stepper.index + 1])
    colors = stepper.colors
    graph = screen.query_one(NodeGraph)
    console = Console()
    coloured = 0
    lines = graph.text.split("\n")
    rows = graph.rows
    assert rows and len(lines) == len(rows)
    for row, line in zip(rows, lines, strict=True):
        if row is None:
            continue
        part = state.assignment.get(row.node)
        expected = colors[state.devices[part]] if part is not None else None
        assert row.color == expected, (stepper.index, row.node)
        assert row.partition == part
        style = line.get_style_at_offset(console, line.plain.index(row.node))
        drawn = style.bgcolor.triplet.hex if style.bgcolor is not None else None
        assert drawn == expected, (stepper.index, row.node, drawn, expected)
        coloured += expected is not None
    return coloured


def test_stepper_steps_forward_and_back_with_the_plans_colours(live_threads):
    live = LiveRuntime(start_load=False)
    checked: list[tuple[int, int]] = []

    async def check(pilot: Pilot, screen: StepperScreen, index: int) -> None:
        await pilot.pause()
        assert screen.stepper.index == index
        checked.append((index, _check_colouring(screen)))
        assert f"step {index + 1}/{len(screen.stepper)}" in shown(
            screen.query_one("#stepper-status"))
        assert shown(screen.query_one("#reason")) == screen.stepper.view().step.reason

    async def script(pilot: Pilot) -> None:
        screen = await open_stepper(pilot)
        steps = screen.stepper.steps
        opens = [i for i, s in enumerate(steps) if s.kind == "open"]
        await check(pilot, screen, 0)
        await pilot.press("right", "n")
        await check(pilot, screen, 2)
        for _ in range(opens[1] // 10):  # page to just before the second partition opens
            await pilot.press("pagedown")
        position = opens[1] // 10 * 10 + 2
        await check(pilot, screen, position)
        forward = opens[1] + 3 - position
        await pilot.press(*["right"] * forward)
        await check(pilot, screen, opens[1] + 3)
        await pilot.press(*["left"] * 5)
        await check(pilot, screen, opens[1] - 2)
        await pilot.press("b")
        await check(pilot, screen, opens[1] - 3)
        await pilot.press("pageup")
        await check(pilot, screen, opens[1] - 13)
        await pilot.press("end")
        await check(pilot, screen, len(steps) - 1)
        final = replay(steps)
        for p in live.plan().partitions:  # the last step is the plan the runtime serves
            assert {final.assignment[n] for n in p.nodes} == {int(p.name[1:])}
            assert final.devices[int(p.name[1:])] == p.device
        await pilot.press("home")
        await check(pilot, screen, 0)
        await quit_app(pilot)

    drive(dashboard(live), script)
    assert checked[0][1] == 0  # nothing placed before the first step
    assert checked[3][1] > 0 and checked[4][1] > 0 and checked[7][1] > 0  # once assigned


def test_stepper_reruns_when_mode_changes(live_threads):
    live = LiveRuntime(start_load=False)

    async def script(pilot: Pilot) -> None:
        app = pilot.app
        screen = await open_stepper(pilot)
        old = screen.stepper
        await pilot.press("end")
        await pilot.press("m")
        await wait_until(pilot, lambda: screen.stepper is not old and app.busy is None,
                         what="the stepper to re-run")
        assert screen.stepper.mode == "memory" == live.mode
        assert screen.stepper.index == 0
        assert "memory" in shown(screen.query_one("#stepper-status"))
        await pilot.press("end")
        _check_colouring(screen)
        await quit_app(pilot)

    drive(dashboard(live), script)


# -- replay --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_replay_shows_the_recorded_plan_and_figures(mode: str, tmp_path: Path, live_threads):
    live = LiveRuntime(mode=mode, start_load=False, seed=4)
    seen: dict[str, object] = {}

    async def record(pilot: Pilot) -> None:
        app = pilot.app
        await pilot.press("e")
        path = live.state().recording
        load = LoadGenerator(live.host, live.network, concurrency=2, requests=40, seed=1)
        load.start()
        await wait_until(pilot, lambda: load.stats.done == 40, what="40 requests")
        load.stop()
        await wait_until(pilot, lambda: app.view.totals.finished == 40,
                         what="the dashboard to see them")
        await pilot.press("e")
        await pilot.pause(0.3)
        seen.update(path=path, figures=figures(app), runs=device_runs(app),
                    rate=shown(app.screen.query_one(QueuePanel).query_one("#rate")),
                    devices=app.view.devices)
        await quit_app(pilot)

    drive(dashboard(live, record_dir=tmp_path), record)
    assert Path(seen["path"]).parent == tmp_path
    plan = live.plan()

    async def watch(pilot: Pilot) -> None:
        app = pilot.app
        await pilot.pause(0.3)
        status = shown(app.screen.query_one(StatusBar))
        assert "replay" in status and f"· {mode} ·" in status
        seen.update(replay_figures=figures(app), replay_runs=device_runs(app),
                    replay_rate=shown(app.screen.query_one(QueuePanel).query_one("#rate")),
                    dag=app.screen.query_one(PartitionDag).dag, replay_devices=app.view.devices)
        await pilot.press("p")  # live-only keys do nothing to a replay
        await pilot.press("m")
        assert app.busy is None and app.view.status.mode == mode
        await quit_app(pilot)

    drive(dashboard(Recording(seen["path"])), watch)  # the recording says which mode
    assert [(p.name, p.device, p.nodes) for p in seen["dag"].plan.partitions] == [
        (p.name, p.device, p.nodes) for p in plan.partitions]
    assert seen["replay_figures"] == seen["figures"]  # counts and percentiles alike
    assert set(seen["figures"]) == {p.name for p in plan.partitions}
    assert all(row[2] == "40" for row in seen["figures"].values())
    assert seen["replay_runs"] == seen["runs"]
    memory = {d.name: (d.used_bytes, d.total_bytes) for d in seen["devices"]}
    assert any(used > 0 for used, _ in memory.values())  # the recording starts with them
    assert {d.name: (d.used_bytes, d.total_bytes) for d in seen["replay_devices"]} == memory
    assert "40 done" in seen["rate"] and "40 done" in seen["replay_rate"]


# -- snapshots (load never started, so every figure is fixed) ------------------------------


def test_snapshot_dashboard(snap_compare):
    live = LiveRuntime(start_load=False, seed=0)
    try:
        assert snap_compare(dashboard(live, close_runtime=False), terminal_size=SIZE,
                            run_before=lambda pilot: pilot.pause(0.3))
    finally:
        live.close()


def test_snapshot_stepper(snap_compare):
    live = LiveRuntime(start_load=False, seed=0)

    async def open_on_the_second_partition(pilot: Pilot) -> None:
        steps = (await open_stepper(pilot)).stepper.steps
        target = [i for i, s in enumerate(steps) if s.kind == "open"][1] + 2
        await pilot.press(*["pagedown"] * (target // 10), *["right"] * (target % 10))
        assert pilot.app.screen.stepper.index == target
        await pilot.pause(0.2)

    try:
        assert snap_compare(dashboard(live, close_runtime=False), terminal_size=SIZE,
                            run_before=open_on_the_second_partition)
    finally:
        live.close()


# -- pieces --------------------------------------------------------------------------------


def test_cli_tui_arguments():
    args = build_parser().parse_args(["tui"])
    assert args.handler == "app.tui_cmd:run" and args.model is None
    assert args.devices is None and args.partition == "balanced" and args.replay is None
    args = build_parser().parse_args(["tui", "m.onnx", "--devices", "cpu:4", "--partition",
                                      "memory", "--concurrency", "3", "--replay", "r.jsonl"])
    assert (args.model, args.devices, args.partition, args.concurrency, args.replay) == (
        "m.onnx", "cpu:4", "memory", 3, "r.jsonl")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tui", "--rate", "5", "--concurrency", "2"])


def test_tui_command_refuses_a_missing_recording(tmp_path: Path, capsys):
    assert main(["tui", "--replay", str(tmp_path / "nope.jsonl")]) == 1
    assert "no such file" in capsys.readouterr().err


@pytest.mark.parametrize(("action", "state", "expected"), [
    ("pause", KeyState(), True),
    ("resume", KeyState(), False),
    ("resume", KeyState(paused=True), True),
    ("pause", KeyState(paused=True), False),
    ("pause", KeyState(has_load=False, paused=True), None),  # shown, greyed: nothing to pause
    ("faster", KeyState(has_load=False), None),
    ("record", KeyState(recording=True), False),
    ("stop_recording", KeyState(recording=True), True),
    ("next_mode", KeyState(replaying=True), False),  # a recording cannot be re-partitioned
    ("stepper", KeyState(replaying=True), True),
    ("faster", KeyState(on_stepper=True), False),
    ("next_mode", KeyState(on_stepper=True), True),  # re-runs the stepper
    ("quit", KeyState(on_stepper=True, replaying=True), True),
])
def test_which_keys_apply(action: str, state: KeyState, expected: bool | None):
    assert key_enabled(action, state) is expected
