"""The dashboards' view model (app.dashboard): every field of a DashboardView and a StepView,
tested here once for both UIs, on a real plan of a sample model.

`Scripted` is a RuntimeSource whose events, clock and device counts a test sets, so each
figure is checked against numbers worked out by hand. The sources that ship (LiveRuntime,
Recording) are checked through the same model below.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.dashboard import (
    DashboardModel,
    LoadSetting,
    LoadState,
    Status,
    Stepper,
)
from app.dashboard.colors import NO_COLOR, PALETTE, UNASSIGNED
from app.dashboard.model import MIN_RUNS, DashboardView
from app.dashboard.source import MODES, PartitionSteps
from app.defaults import DEFAULT_DEVICES, DEFAULT_RATE, LOAD_SHARE, SAMPLES
from app.live import LiveRuntime
from app.replay import Recording
from app.sources import ENV_PREFIX, SourceSettings
from runtime.bundle.reader import read_bundle
from runtime.bundle.writer import compile_bundle
from runtime.devices import parse_devices
from runtime.devices.device import DeviceStats
from runtime.errors import InvalidInputError, PrismError
from runtime.graph import load_graph
from runtime.observe.events import Event
from runtime.partition import Plan, Step, partition, replay
from runtime.partition.dot import Outline
from runtime.partition.planning import COSTS_ENV
from runtime.user_cache import CACHE_ENV
from tests.support.dags import end_token_ids, end_token_model, even_rows_model
from tests.support.recordings import record_run

MODEL = SAMPLES / "cnn.onnx"
NOW = 1000.0


class Scripted:
    """A RuntimeSource with events, clock and device counts set by the test."""

    def __init__(self, mode: str = "balanced", devices: str = DEFAULT_DEVICES) -> None:
        self.graph = load_graph(MODEL, name="cnn")
        self.devices = devices
        self.network = "cnn"
        self.current: Plan = partition(self.graph, parse_devices(devices), mode)
        self.events: list[Event] = []
        self.clock = NOW
        self.counters: dict[str, DeviceStats] = {}

    def publish(self, kind: str, ago: float, **fields: object) -> None:
        self.events.append(Event(kind, self.clock - ago, fields))

    def drain(self) -> list[Event]:
        out, self.events = self.events, []
        return out

    def now(self) -> float:
        return self.clock

    def state(self) -> Status:
        return Status(str(MODEL), self.network, self.current.mode, self.devices)

    def plan(self) -> Plan:
        return self.current

    def outline(self) -> Outline:
        return Outline.of(self.graph)

    def device_stats(self) -> dict[str, DeviceStats]:
        return dict(self.counters)

    def partition_steps(self, mode: str) -> PartitionSteps:
        return PartitionSteps.run(self.graph, self.devices, mode, "cnn")

    def bundle(self) -> None:
        return None


@pytest.fixture
def source() -> Scripted:
    return Scripted()


# -- plan, colours, drawing ----------------------------------------------------------------


def test_colours_follow_the_plans_devices_in_order(source: Scripted) -> None:
    view = DashboardModel(source).poll()
    names = [d.name for d in source.current.devices]
    assert view.colors == {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    assert view.drawing.colors == view.colors
    for p in source.current.partitions:
        assert view.drawing.color(p.name) == view.colors[p.device]


def test_drawing_levels_and_edges_follow_the_graph(source: Scripted) -> None:
    model = DashboardModel(source)
    drawing = model.poll().drawing
    graph, plan = source.graph, source.current
    assert drawing.plan is plan
    home = {n: p.name for p in plan.partitions for n in p.nodes}
    crossing: dict[tuple[str, str], set[str]] = {}
    for src, dst, data in graph.dag.edges(data=True):
        if home[src] != home[dst]:
            crossing.setdefault((home[src], home[dst]), set()).update(data["tensors"])
    assert {(e.src, e.dst): (e.bytes, e.tensors) for e in drawing.edges} == {
        k: (sum(graph.tensor_bytes(t) for t in ts), len(ts)) for k, ts in crossing.items()}
    level = {name: i for i, row in enumerate(drawing.levels) for name in row}
    assert sorted(level) == sorted(p.name for p in plan.partitions)  # each exactly once
    for p in plan.partitions:
        into = [level[a] for a, b in crossing if b == p.name]
        assert level[p.name] == max(into, default=-1) + 1
    assert drawing.order == [n for row in drawing.levels for n in row]
    assert model.poll().drawing is drawing  # made once per plan
    source.current = partition(graph, parse_devices(source.devices), "memory")
    assert model.poll().drawing.plan is source.current


# -- rows ----------------------------------------------------------------------------------


def test_device_rows_prefer_the_devices_own_counts(source: Scripted) -> None:
    plan = source.current
    cpu0, cpu1, sim0, sim1 = (d.name for d in plan.devices)
    source.counters = {cpu0: DeviceStats(cpu0, "cpu", runs=7, busy_seconds=0.0, queue_length=2,
                                             used_bytes=123, total_bytes=456)}
    source.publish("queue.depth", 60, depth=0, active=0)  # the window starts a minute ago
    source.publish("partition.run.finished", 0, network="cnn", request=1, partition="p0",
                   device=cpu0, queue_wait=0.0, run_seconds=6.0)
    source.publish("partition.run.finished", 0, network="cnn", request=1, partition="p9",
                   device="npu9", queue_wait=0.0, run_seconds=3.0)
    view = DashboardModel(source).poll()
    rows = {r.name: r for r in view.devices}
    assert list(rows)[:1] == [cpu0] and set(rows) == {cpu0, "npu9"}  # counters name devices
    assert (rows[cpu0].used_bytes, rows[cpu0].total_bytes, rows[cpu0].queue_length,
            rows[cpu0].runs, rows[cpu0].backend) == (123, 456, 2, 7, "cpu")
    assert rows[cpu0].utilisation == pytest.approx(6 / 60)  # busy 6 s of the 60 s window
    assert rows[cpu0].memory_share == pytest.approx(123 / 456)
    assert (rows["npu9"].color, rows["npu9"].backend, rows["npu9"].runs) == (NO_COLOR, "?", 1)

    source.counters = {}  # a recording: the events, else the plan
    source.publish("device.memory", 1, device=cpu1, used_bytes=11, total_bytes=99)
    view = DashboardModel(source).poll()
    rows = {r.name: r for r in view.devices}
    assert list(rows) == [cpu0, cpu1, sim0, sim1]
    assert (rows[cpu1].used_bytes, rows[cpu1].total_bytes) == (11, 99)
    planned = plan.device_memory()
    assert (rows[sim1].used_bytes, rows[sim1].total_bytes) == (
        planned[sim1], plan.device(sim1).memory_bytes)
    assert rows[sim1].backend == "sim" and rows[sim1].color == view.colors[sim1]


def test_partition_rows_measure_the_running_network_only(source: Scripted) -> None:
    plan = source.current
    first, second = plan.partitions[0], plan.partitions[1]
    runs = {first.name: [0.001, 0.003], second.name: [0.010]}
    for name, times in runs.items():
        for i, t in enumerate(times):
            source.publish("partition.run.finished", 1, network="cnn", request=i,
                           partition=name, device=plan.partition(name).device,
                           queue_wait=0.002, run_seconds=t)
    source.publish("partition.run.finished", 1, network="cnn#old", request=9,
                   partition=first.name, device=first.device, queue_wait=0, run_seconds=9.0)
    rows = DashboardModel(source).poll().partitions
    assert [r.name for r in rows] == [p.name for p in plan.partitions]
    by = {r.name: r for r in rows}
    assert (by[first.name].runs, by[first.name].p50, by[first.name].last) == (
        2, pytest.approx(0.002), 0.003)
    assert by[first.name].mean_wait == pytest.approx(0.002)
    assert by[second.name].slowest and not by[first.name].slowest
    for p in plan.partitions:
        assert (by[p.name].nodes, by[p.name].est_seconds, by[p.name].device) == (
            len(p.nodes), p.est_seconds, p.device)
    for r in rows[2:]:
        assert (r.runs, r.p50, r.slowest) == (0, 0.0, False)


def test_a_replicated_partitions_row_is_its_plans_own_device(source: Scripted) -> None:
    """A replica runs the same partition on another device: the row keeps the plan's
    device and that device's figures, whichever device ran last."""
    first = source.current.partitions[0]
    for i, (device, seconds) in enumerate([(first.device, 0.002), ("twin", 0.5),
                                           (first.device, 0.004), ("twin", 0.7)]):
        source.publish("partition.run.finished", 1, network="cnn", request=i,
                       partition=first.name, device=device, queue_wait=0, run_seconds=seconds)
    row = DashboardModel(source).poll().partitions[0]
    assert (row.name, row.device, row.runs, row.p50) == (
        first.name, first.device, 2, pytest.approx(0.003))


# -- series and totals ---------------------------------------------------------------------


def test_queue_series_is_a_fixed_minute_of_one_second_bins(source: Scripted) -> None:
    for ago, depth in ((90, 9), (30.2, 3), (30.1, 5), (0.5, 2)):
        source.publish("queue.depth", ago, depth=depth, active=0)
    view = DashboardModel(source).poll()
    series = view.queue.values
    assert len(series) == 60 and view.queue.seconds_ago == tuple(range(-59, 1))
    assert series[29] == 5 and series[28] == 0 and series[30] == 5  # held until next
    assert series[-1] == 2 and view.queue.peak == 5  # 90 s ago is out of the window
    assert view.totals.queue_now == 2


def test_throughput_latency_totals_and_errors(source: Scripted) -> None:
    rng = random.Random(7)
    recent = [rng.uniform(0.001, 0.05) for _ in range(3)]
    source.publish("queue.depth", 59.5, depth=0, active=0)  # the window starts a minute ago
    source.publish("request.finished", 10.2, network="cnn", request=0, latency=0.5)
    for i, latency in enumerate(recent):
        source.publish("request.finished", 0.5, network="cnn", request=i + 1, latency=latency)
    source.publish("request.failed", 0.4, network="cnn", request=9, error="boom",
                   partition="p1", device="cpu1")
    view = DashboardModel(source).poll()
    assert len(view.throughput.values) == 60
    assert view.throughput.values[-1] == 3 and view.throughput.values[-11] == 1
    assert sum(view.throughput.values) == 4
    assert view.latency.values[-1] == pytest.approx(sorted(recent)[1])  # the median
    assert view.latency.values[-11] == 0.5 and view.latency.values[-2] == 0.5  # held
    assert view.latency.values[0] == 0.0
    t = view.totals
    assert (t.finished, t.failed, t.latency.count) == (4, 1, 4)
    assert t.latency.p50 == pytest.approx(statistics.median([0.5, *recent]))
    assert t.throughput > 0
    assert view.errors == ("cnn request 9: boom (p1 on cpu1)",)


def test_figures_start_afresh_when_the_network_changes(source: Scripted) -> None:
    model = DashboardModel(source)
    source.publish("request.finished", 1, network="cnn", request=0, latency=0.1)
    assert model.poll().totals.finished == 1
    source.network = "cnn#2"
    view = model.poll()
    assert view.totals.finished == 0 and view.latency.peak == 0
    assert view.status.network == "cnn#2"


# -- the stepper ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_step_views_colour_focus_and_count(mode: str, source: Scripted) -> None:
    stepper = DashboardModel(source).stepper(mode)
    steps, outline = stepper.steps, stepper.outline
    assert stepper.mode == mode and stepper.index == 0 and len(stepper) == len(steps)
    colors = {d.name: PALETTE[i] for i, d in enumerate(stepper.run.plan.devices)}
    kinds = set()
    for i in range(len(steps)):
        view = stepper.go(i)
        step, state = steps[i], replay(steps[: i + 1])
        kinds.add(step.kind)
        order = state.order or tuple(outline.ops)
        assert (view.index, view.count, view.step, view.order) == (i, len(steps), step, order)
        assert view.node_colors == {n: colors[state.devices[p]]
                                    for n, p in state.assignment.items()}
        assert view.unassigned == len(outline.ops) - len(state.assignment)
        assert [(e.partition, e.device, e.nodes) for e in view.legend] == [
            (p, d, sum(1 for q in state.assignment.values() if q == p))
            for p, d in sorted(state.devices.items())]
        if step.kind == "open":
            assert view.focus == tuple(n for n in order if n not in state.assignment)[:1]
        elif step.kind == "close":
            members = [n for n in order if state.assignment.get(n) == step.partition]
            assert view.focus == (members[-1],)
        elif step.nodes and step.kind != "order":
            assert view.focus == step.nodes
        else:
            assert view.focus == order[:1]
        assert view.neighbours == {m for n in view.focus for m in (
            *source.graph.dag.predecessors(n), *source.graph.dag.successors(n))} - set(view.focus)
    assert {"open", "assign"} <= kinds
    assert stepper.end().index == len(steps) - 1


def test_step_drawing_shows_the_focus_or_every_node(source: Scripted) -> None:
    stepper = DashboardModel(source).stepper()
    opens = [i for i, s in enumerate(stepper.steps) if s.kind == "open"]
    view = stepper.go(opens[1] + 3)
    whole, near = stepper.dot(), stepper.dot(focus_only=True)
    drawn = {n for n in stepper.outline.ops if f"{json.dumps(n)} [" in near}
    assert drawn == {*view.focus, *view.neighbours} and drawn < set(stepper.outline.ops)
    assert all(f"{json.dumps(n)} [" in whole for n in stepper.outline.ops)
    assert whole.count(f'fillcolor="{UNASSIGNED.fill}"') == view.unassigned


# -- controls and the sources that ship ----------------------------------------------------


def test_controls_change_the_embedded_runtime() -> None:
    model = DashboardModel(LiveRuntime(start_load=False, seed=3))
    try:
        status = model.poll().status
        assert status.load.setting is None and status.load.label == "no load"
        assert status.changeable and status.model == "cnn"
        model.toggle_pause()  # no load yet: starts it
        assert model.poll().status.load == LoadState(LoadSetting(rate=150.0), paused=False)
        model.faster()
        assert model.poll().status.load.label == "225 req/s"
        model.slower()
        model.toggle_pause()
        assert model.poll().status.load == LoadState(LoadSetting(rate=150.0), paused=True)
        model.set_load(LoadSetting(clients=3))  # closed loop: a new generator, still paused
        assert model.poll().status.load == LoadState(LoadSetting(clients=3), paused=True)
        assert model.change(MODEL, DEFAULT_DEVICES, "balanced", LoadSetting(clients=4)) == \
            "nothing to re-plan"
        assert model.poll().status.load.label == "4 clients"
        assert model.next_mode() == "memory"
        message = model.change(MODEL, DEFAULT_DEVICES, "memory", LoadSetting(clients=4))
        view = model.poll()
        assert message == f"re-planned cnn.onnx: 1 partition (memory) on {DEFAULT_DEVICES}"
        assert view.status.mode == view.plan.mode == "memory" and view.status.network != "cnn"
        assert view.status.load == LoadState(LoadSetting(clients=4), paused=True)
        with pytest.raises(PrismError, match="dashboard mode"):
            model.repartition(mode="user")
        assert model.poll().status.mode == "memory"
    finally:
        model.close()


def test_a_network_slower_than_the_default_load_gets_a_load_it_can_answer(tmp_path: Path
                                                                          ) -> None:
    """A model of the user's own that answers fewer requests than DEFAULT_RATE runs under
    LOAD_SHARE of what its plan answers, not under a load that fills its queue with
    failures; a rate the user sets is theirs."""
    rng = np.random.default_rng()
    weights = [numpy_helper.from_array(rng.standard_normal((512, 512)).astype(np.float32),
                                       f"w{i}") for i in range(4)]
    nodes = [helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"h{i + 1}"]) for i in range(4)]
    graph = helper.make_graph(nodes, "heavy", [helper.make_tensor_value_info(
        "h0", TensorProto.FLOAT, ["n", 512])], [helper.make_tensor_value_info(
            "h4", TensorProto.FLOAT, ["n", 512])], weights)
    path = tmp_path / "heavy.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    live = LiveRuntime(path, "sim:1:flops=100M", start_load=False)
    try:
        live.toggle_pause()  # starts the load
        fits = LOAD_SHARE / live.plan().bottleneck_seconds
        assert fits < DEFAULT_RATE and live.load.rate == pytest.approx(fits, rel=0.01)
        live.set_load(LoadSetting(rate=DEFAULT_RATE))
        assert live.load.rate == DEFAULT_RATE
    finally:
        live.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_recording_replays_the_plan_it_ran(mode: str, tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    plan = record_run(path, mode, devices="cpu:3")
    model = DashboardModel(Recording(path))  # neither mode nor devices given
    view = model.poll()
    assert view.plan.mode == view.status.mode == mode
    assert view.status.devices == "cpu:3" and view.status.replay == str(path)
    assert [(p.name, p.device, p.nodes) for p in view.plan.partitions] == [
        (p.name, p.device, p.nodes) for p in plan.partitions]
    assert view.totals.finished == 20 and sum(r.runs for r in view.partitions) >= 20
    assert all(d.used_bytes > 0 for d in view.devices if d.name in
               {p.device for p in plan.partitions})  # the recording opens with memory
    assert not view.status.changeable and view.status.load.label == "no load"
    assert model.poll().totals.finished == 20  # each event is counted once
    for control in (model.toggle_pause, model.faster,
                    lambda: model.repartition(mode="memory"),
                    lambda: model.start_recording(tmp_path / "again.jsonl")):
        with pytest.raises(PrismError, match="a replay cannot"):
            control()
    assert model.stepper().run.plan.mode == mode


def test_a_network_from_a_bundle_shows_its_origin_schedule_and_recorded_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bundle: `status.bundle`, `bundle` (file, versions, the schedule on the host's
    devices in table order, each row in its device's colour); the stepper opens the steps
    recorded when it was compiled (nothing partitioned again); a recording of it replays
    its plan on the devices it ran on, with its schedule; a mode it was not compiled in is
    refused."""
    path = tmp_path / "cnn.prism"
    compiled = compile_bundle(MODEL, parse_devices("cpu:3"), path, partition="memory",
                              name="cnn")
    schedule = compiled.manifest["schedule"]
    model = DashboardModel(LiveRuntime(path, devices="cpu:4", start_load=False, seed=1))
    try:
        view = model.poll()
        assert view.status.bundle and view.status.mode == "memory" == view.plan.mode
        assert view.bundle is not None and view.bundle.name == "cnn.prism"
        assert "onnxruntime" in view.bundle.made_with
        rows = view.bundle.schedule
        assert [(r.partition, r.reads, r.writes, r.after) for r in rows] == [
            (r["partition"], tuple(r["reads"]), tuple(r["writes"]), tuple(r["after"]))
            for r in schedule]
        assert [r.device for r in rows] == [p.device for p in view.plan.partitions]
        assert all(r.color == view.colors[r.device] for r in rows)
        with monkeypatch.context() as m:  # the stepper must not partition again
            m.setattr("app.dashboard.source.plan_network", _no_partitioning)
            steps = model.stepper().run
        assert list(steps.steps) == _recorded_steps(path)
        assert steps.plan.partitions == compiled.plan.partitions
        with pytest.raises(PrismError, match="recompile"):
            model.repartition(mode="balanced")
        recording = tmp_path / "run.jsonl"
        model.start_recording(recording)
        model.toggle_pause()
        deadline = time.monotonic() + 30
        while model.poll().totals.finished < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        model.stop_recording()
    finally:
        model.close()
    replay = DashboardModel(Recording(recording)).poll()
    assert replay.totals.finished >= 3
    assert replay.status.bundle and replay.bundle.schedule == tuple(
        replace(r, color=replay.colors[r.device]) for r in rows)
    assert [(p.name, p.device) for p in replay.plan.partitions] == [
        (p.name, p.device) for p in view.plan.partitions]
    assert DashboardModel(Scripted()).poll().bundle is None


def _no_partitioning(*args, **kwargs):
    raise AssertionError("partitioned again")


def _recorded_steps(path: Path) -> list:
    with read_bundle(path) as bundle:
        return [Step(**{**s, "nodes": tuple(s["nodes"])}) for s in bundle.json("steps.json")]


def test_a_recording_of_a_user_map_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "user.jsonl"
    path.write_text(Event("network.loaded", 1.0, {"network": "cnn", "mode": "user"}).to_json())
    with pytest.raises(PrismError, match="'user' mode"):
        Recording(path)


def test_source_settings_travel_through_the_environment(tmp_path: Path) -> None:
    recording = tmp_path / "r.jsonl"
    recording.write_text("")
    settings = SourceSettings("m.onnx", "cpu:4", "memory", rate=12.5, seed=3,
                              replay=str(recording))
    env = settings.to_env({"PATH": "/bin", f"{ENV_PREFIX}CONCURRENCY": "9"})
    assert env["PATH"] == "/bin" and f"{ENV_PREFIX}CONCURRENCY" not in env
    assert SourceSettings.from_env(env) == settings
    assert SourceSettings.from_env({}) == SourceSettings()
    with pytest.raises(PrismError, match="--replay: no such file"):
        SourceSettings(replay=str(tmp_path / "missing.jsonl"))


def test_a_bundle_remapped_through_the_environment_runs_where_it_was_sent(
        tmp_path: Path) -> None:
    """`prism tui|web NAME.prism --remap OLD=NEW`: the settings carry the remap through
    `prism web`'s environment, and the schedule shows each partition on its new device."""
    path = tmp_path / "transformer.prism"
    compiled = compile_bundle(SAMPLES / "transformer.onnx", parse_devices("cpu:2"), path)
    moved = {"cpu0": "cpu3", "cpu1": "cpu0"}
    settings = SourceSettings(str(path), "cpu:4", seed=1,
                              remap=",".join(f"{a}={b}" for a, b in moved.items()))
    settings = SourceSettings.from_env(settings.to_env({}))
    assert settings.remaps == moved
    model = DashboardModel(settings.open())
    try:
        view = model.poll()
        assert view.bundle is not None
        assert [(r.partition, r.device) for r in view.bundle.schedule] == [
            (r["partition"], moved[r["device"]]) for r in compiled.manifest["schedule"]]
        assert [p.device for p in view.plan.partitions] == [r.device for r in view.bundle.schedule]
    finally:
        model.close()
    with pytest.raises(PrismError, match="applies to bundles"):
        SourceSettings(str(MODEL), "cpu:4", remap="cpu0=cpu3")


def _answered_through_env(settings: SourceSettings) -> DashboardView:
    """The view once the settings, carried through `prism web`'s environment, opened and
    under their load, have answered 5 requests and failed none."""
    model = DashboardModel(SourceSettings.from_env(settings.to_env({})).open())
    try:
        deadline = time.monotonic() + 30
        while model.poll().totals.finished < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        view = model.poll()
        assert view.totals.finished >= 5 and view.totals.failed == 0 and not view.errors
        return view
    finally:
        model.close()


def test_the_live_load_sends_the_inputs_given_and_a_model_is_measured_on_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`prism tui|web MODEL --inputs FILE.npz`: a model taking only some values (ids
    holding an end token) failed every request of the dashboards' made-up load, and was
    planned on the roofline; the errors now end saying how to give inputs, where most
    requests fail (made-up ids hold the end token now and then). The settings
    carry the file through `prism web`'s environment; a file that does not fit is refused
    in one line naming it."""
    monkeypatch.setenv(COSTS_ENV, "measured")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    path, data, bad = tmp_path / "ends.onnx", tmp_path / "ids.npz", tmp_path / "floats.npz"
    onnx.save(end_token_model(), path)
    ids = end_token_ids(np.random.default_rng())
    np.savez(data, ids=ids)
    np.savez(bad, ids=ids.astype(np.float32))
    made_up = DashboardModel(LiveRuntime(str(path), "cpu:2", concurrency=2))
    try:
        deadline = time.monotonic() + 30
        while made_up.poll().totals.failed < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        view = made_up.poll()
        assert view.totals.failed >= 5 and view.plan is not None and view.plan.costs == "model"
        assert view.errors[-1] == ("most requests failed (on made-up inputs: ids [1, 1]; "
                                   "give yours with --inputs FILE.npz, or sizes with --bind "
                                   "DIM=N)")
    finally:
        made_up.close()
    view = _answered_through_env(SourceSettings(str(path), "cpu:2", concurrency=2,
                                                inputs=str(data)))
    assert view.plan is not None and view.plan.costs == "measured"
    with pytest.raises(InvalidInputError, match=f"^{bad}: input 'ids' of ends: expected"):
        LiveRuntime(str(path), "cpu:2", inputs=str(bad), start_load=False)
    with pytest.raises(PrismError, match="--inputs is for a runtime run here"):
        SourceSettings(connect="http://127.0.0.1:9", inputs=str(data))


def test_the_live_load_makes_up_inputs_at_the_sizes_bound(tmp_path: Path) -> None:
    """`prism tui|web MODEL --bind DIM=N`: a model taking only some sizes (an even number
    of rows) failed every made-up request at 1 row, and the dashboards took no --bind as
    `prism run` does. The settings carry it through `prism web`'s environment; a DIM the
    model's inputs lack is refused in one line naming theirs."""
    path = tmp_path / "pairs.onnx"
    onnx.save(even_rows_model(), path)
    rows = 2 * int(np.random.default_rng().integers(1, 5))
    _answered_through_env(SourceSettings(str(path), "cpu:2", concurrency=2,
                                         bind=f"rows={rows}"))
    with pytest.raises(PrismError, match=r"^--bind cols: the inputs of .* have no dimension "
                                         r"named 'cols'; their symbolic dimensions are rows$"):
        SourceSettings(str(path), "cpu:2", bind="cols=2")
    with pytest.raises(PrismError, match="--bind is for a runtime run here"):
        SourceSettings(replay=str(path), bind="rows=2")


def test_stepper_walks_within_its_steps(source: Scripted) -> None:
    stepper = Stepper(source.partition_steps("balanced"))
    assert stepper.go(-5).index == 0 and stepper.go(10**6).index == len(stepper) - 1
    assert stepper.view() is stepper.view()  # one StepView per step


def test_estimates_sit_beside_measured_times_and_a_live_run_feeds_the_next_plan() -> None:
    """Each partition row carries the plan's estimate and the measured median (and how
    far apart they are); re-planning from measurements loads a plan made from those
    medians, beside the old one, and moves the load to it."""
    model = DashboardModel(LiveRuntime(devices="cpu:2", start_load=False, seed=5))
    try:
        with pytest.raises(PrismError, match="nothing measured"):
            model.replan_measured()  # nothing has run yet
        before = model.poll().plan
        assert len(before.partitions) == 2
        model.set_load(LoadSetting(clients=4))
        model.toggle_pause()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = model.poll().partitions
            if all(r.runs >= MIN_RUNS for r in rows):
                break
            time.sleep(0.1)
        rows = model.poll().partitions
        assert all(r.runs >= MIN_RUNS and r.off_by is not None for r in rows)
        for r in rows:
            assert r.off_by == pytest.approx(r.est_seconds / r.p50 - 1)
        measured = model.measured_times()
        assert set(measured) == {p.name for p in before.partitions}
        plan = model.replan_measured()
        view = model.poll()
        assert plan.costs == "live" and view.plan is plan
        assert view.status.network != "cnn" and not view.status.load.paused
        assert model.source.networks() == [view.status.network]  # the old one went
    finally:
        model.close()


def test_a_recording_cannot_be_replanned_from_measurements(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    record_run(path, "balanced", devices="cpu:2")
    with pytest.raises(PrismError, match="re-plan from measurements"):
        Recording(path).replan_measured({"p0": 1e-3})


def test_the_runs_a_first_measured_load_times_its_plan_by_are_not_the_loads(
        monkeypatch, tmp_path: Path) -> None:
    """Measured costs, nothing cached: each load sends a burst through its plan (60 runs a
    partition); the partition rows and the devices' utilisation count the live load only."""
    monkeypatch.setenv("PRISM_COSTS", "measured")
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    live = LiveRuntime(devices="cpu:2", start_load=False, seed=2)
    model = DashboardModel(live)
    try:
        for load in range(2):
            if load:
                for f in (tmp_path / "costs").glob("*.json"):
                    f.unlink()  # the next plan is measured afresh
                model.source.repartition(mode="balanced")
            assert list((tmp_path / "costs").glob("*.json"))  # it did measure
            view = model.poll()
            assert view.partitions and all(r.runs == 0 for r in view.partitions), load
            assert all(r.utilisation == 0 for r in view.devices), load
        model.set_load(LoadSetting(clients=2))
        model.toggle_pause()
        deadline = time.monotonic() + 60
        while not all(r.runs for r in model.poll().partitions) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(r.runs for r in model.poll().partitions)
    finally:
        model.close()
