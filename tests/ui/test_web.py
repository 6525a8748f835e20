"""The Streamlit dashboard under streamlit.testing.v1.AppTest: pages, controls, stepper.

One embedded runtime serves the whole module (as one server process would); it is closed
at the end through st.cache_resource, and no runtime thread may outlive it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")

import streamlit as st
from streamlit.testing.v1 import AppTest

from app.cli import main
from app.dashboard.colors import UNASSIGNED
from app.dashboard.source import MODES
from app.defaults import DEFAULT_DEVICES, DEFAULT_MODEL, SAMPLES
from app.sources import ENV_PREFIX
from runtime.bundle.writer import compile_bundle
from runtime.devices import parse_devices
from tests.support.recordings import record_run
from ui_web import live_page
from ui_web.cached import shared_live
from ui_web.shared import SharedLive

SCHEDULE_COLUMNS = ["partition", "device", "reads", "writes", "after"]
APP = Path(__file__).resolve().parents[2] / "ui_web" / "dashboard.py"
TIMEOUT = 30


@pytest.fixture(scope="module")
def shared() -> Iterator[SharedLive]:
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith(ENV_PREFIX)}
    st.cache_resource.clear()
    try:
        yield shared_live()
    finally:
        st.cache_resource.clear()  # on_release closes the runtime
        os.environ.update(saved)
    left = [t.name for t in threading.enumerate() if t.name.startswith("prism-")]
    assert not left, f"runtime threads outlived the dashboard: {left}"


@pytest.fixture
def at(shared: SharedLive) -> AppTest:
    app = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not app.exception, app.exception
    assert shared_live() is shared, "one runtime per process"
    return app


def _apply(at: AppTest, **controls: object) -> AppTest:
    for key, value in controls.items():
        _widget(at, f"ctl_{key}").set_value(value)
    at.form_submit_button[0].click()
    at.run()
    assert not at.exception, at.exception
    return at


def _widget(at: AppTest, key: str):
    for kind in ("radio", "text_input", "selectbox", "number_input"):
        for w in getattr(at.sidebar, kind):
            if w.key == key:
                return w
    raise KeyError(key)


def _dots(at: AppTest) -> list[str]:
    return [e.proto.spec for e in at.get("graphviz_chart")]


def _serving(shared: SharedLive, wait: float = 0.6) -> bool:
    before = shared.view(max_age=0).totals.finished
    time.sleep(wait)
    return shared.view(max_age=0).totals.finished > before


def test_live_page_draws_the_running_plan(at: AppTest, shared: SharedLive) -> None:
    labels = [m.label for m in at.metric]
    assert labels == ["Throughput", "Latency p50", "Latency p95", "Latency p99", "Requests"]
    [dot] = _dots(at)
    plan = shared.view().plan
    assert dot == shared.view().drawing.node_dot  # the view model's drawing, as it is
    for p in plan.partitions:
        assert f'"cluster_{p.name}"' in dot
    assert plan.transfers and "copy " in dot and "style=dashed" in dot
    assert " KB" in dot  # tensor bytes on edges
    devices = at.dataframe[0].value
    assert list(devices["device"]) == [r.name for r in shared.view().devices]
    assert any("partitions on" in m.value for m in at.markdown)


def test_partition_level_toggle(at: AppTest, shared: SharedLive) -> None:
    at.toggle(key="dag_partitions").set_value(True).run()
    assert not at.exception
    [dot] = _dots(at)
    assert dot.startswith('digraph "cnn partitions"')
    assert dot.count("->") == len({(t.src_partition, d) for t in shared.view().plan.transfers
                                   for d in t.dst_partitions})


def test_a_graph_too_big_to_draw_each_refresh_opens_a_box_per_partition(
        shared: SharedLive, monkeypatch) -> None:
    nodes = len(shared.view().drawing.outline.ops)
    monkeypatch.setattr(live_page, "NODE_VIEW_LIMIT", nodes - 1)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    [dot] = _dots(at)
    assert dot.startswith('digraph "cnn partitions"')
    at.toggle(key="dag_partitions").set_value(False).run()  # every node, when asked
    assert _dots(at) == [shared.view().drawing.node_dot]


def test_mode_control_repartitions_in_place(at: AppTest, shared: SharedLive) -> None:
    assert shared.view().status.mode == "balanced" and len(shared.view().plan.partitions) > 1
    _apply(at, mode="memory")
    plan = shared.view().plan
    assert plan.mode == "memory"
    assert len(plan.partitions) == 1  # cnn fits one 2 GB cpu device: fewest partitions
    assert not at.error and any("re-planned" in s.value for s in at.success)
    assert any("memory · 1 partition on" in m.value for m in at.markdown)
    assert _serving(shared)
    _apply(at, mode="balanced")
    assert shared.view().plan.mode == "balanced" and len(shared.view().plan.partitions) > 1


def test_devices_and_model_controls_reprovision(at: AppTest, shared: SharedLive) -> None:
    _apply(at, devices="cpu:3", model="mlp.onnx", load_kind="clients", clients=2)
    view = shared.view(max_age=0)
    assert {d.name for d in view.plan.devices} == {"cpu0", "cpu1", "cpu2"}
    assert view.status.network == "mlp" and view.status.load.label == "2 clients"
    assert _serving(shared)
    _apply(at, devices=DEFAULT_DEVICES, model="cnn.onnx", load_kind="rate", rate=150.0)
    view = shared.view(max_age=0)
    assert view.status.devices == DEFAULT_DEVICES and view.status.model == "cnn"
    assert view.status.load.label == "150 req/s"


def test_bad_upload_shows_error_and_keeps_serving(at: AppTest, shared: SharedLive) -> None:
    before = shared.view().plan
    at.file_uploader[0].set_value(("broken.onnx", b"this is not an onnx model",
                                   "application/octet-stream"))
    _apply(at)
    assert [e.value for e in at.error if "Apply failed" in e.value] == [at.error[0].value]
    assert shared.view().plan is before
    assert _serving(shared)


def test_an_uploaded_bundle_shows_its_origin_and_schedule(at: AppTest, shared: SharedLive,
                                                          tmp_path: Path) -> None:
    """A bundle uploaded and applied loads as compiled: the status line names it and the
    page shows its schedule table on this host's devices; a model again drops both."""
    path = tmp_path / "cnn.prism"
    compile_bundle(SAMPLES / "cnn.onnx", parse_devices(DEFAULT_DEVICES), path, partition="memory")
    at.file_uploader[0].set_value(("cnn.prism", path.read_bytes(), "application/octet-stream"))
    _apply(at)
    view = shared.view(max_age=0)
    assert not at.error and view.status.bundle and view.bundle is not None
    assert view.plan.mode == "memory"  # its own mode, whatever the form said
    assert any("from bundle `cnn.prism`" in m.value for m in at.markdown)
    [frame] = [d.value for d in at.dataframe if list(d.value.columns) == SCHEDULE_COLUMNS]
    assert list(frame["partition"]) == [r.partition for r in view.bundle.schedule]
    assert list(frame["device"]) == [p.device for p in view.plan.partitions]
    assert list(frame["reads"]) == [", ".join(r.reads) for r in view.bundle.schedule]
    assert _serving(shared)
    _apply(at, model="cnn.onnx")
    assert shared.view(max_age=0).bundle is None and shared.view().plan.mode == "balanced"
    assert not [d for d in at.dataframe if list(d.value.columns) == SCHEDULE_COLUMNS]


def test_model_too_big_for_devices_shows_error(at: AppTest, shared: SharedLive) -> None:
    before = shared.view().plan
    at.file_uploader[0].set_value(("mlp.onnx", (SAMPLES / "mlp.onnx").read_bytes(),
                                   "application/octet-stream"))
    _apply(at, devices="cpu:2:mem=200KB")
    assert at.error and "largest device" in at.error[0].value
    assert shared.view().plan is before and shared.view().status.devices == DEFAULT_DEVICES
    assert _serving(shared)
    at.sidebar.button[0].click().run()  # pause is immediate, no Apply needed
    assert shared.view(max_age=0).status.load.paused
    at.sidebar.button[0].click().run()
    assert not shared.view(max_age=0).status.load.paused


def test_stepper_slider_moves_the_assignment(at: AppTest, shared: SharedLive) -> None:
    at.switch_page("views/stepper.py").run()
    assert not at.exception, at.exception
    slider = at.slider(key="step_number")
    count = int(slider.max)
    assert slider.value == count
    final_reason, [final_dot] = at.info[0].value, _dots(at)
    assert final_reason.startswith("planned") and UNASSIGNED.fill not in final_dot

    middle = count // 2 + 10
    at.slider(key="step_number").set_value(middle).run()
    reason, [dot] = at.info[0].value, _dots(at)
    assert reason != final_reason
    assert 0 < dot.count(UNASSIGNED.fill) < len(shared.view().drawing.outline.ops)

    at.button(key="step_prev").click().run()
    assert at.slider(key="step_number").value == middle - 1
    earlier = _dots(at)[0]
    assert earlier.count(UNASSIGNED.fill) >= dot.count(UNASSIGNED.fill)
    assert any(f"Step {middle - 1} of {count}" in m.value for m in at.markdown)

    at.slider(key="step_number").set_value(1).run()
    assert _dots(at)[0].count(UNASSIGNED.fill) == len(shared.view().drawing.outline.ops)


def test_tabs_share_one_runtime(shared: SharedLive) -> None:
    first = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    second = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    _apply(first, mode="memory")
    second.run()
    assert any("memory · 1 partition on" in m.value for m in second.markdown)

    failures: list[BaseException] = []

    def poll() -> None:
        try:
            for _ in range(40):
                shared.view(max_age=0)
        except BaseException as exc:
            failures.append(exc)

    readers = [threading.Thread(target=poll) for _ in range(3)]
    for t in readers:
        t.start()
    _apply(second, mode="balanced")  # re-plans while other tabs poll
    for t in readers:
        t.join(10)
    assert not failures and shared.view().plan.mode == "balanced"


@pytest.mark.parametrize("argv", [["web", "--devices", "gpu:2"], ["web", "missing.onnx"],
                                  ["web", "--bind", "nope=2"], ["tui", "--bind", "nope=2"]])
def test_prism_web_and_tui_reject_bad_arguments(argv: list[str], capsys) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "prism: error:" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("mode", MODES)
def test_replay_draws_the_recorded_plan(mode: str, tmp_path: Path, shared: SharedLive,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / f"{mode}.jsonl"
    plan = record_run(path, mode)
    monkeypatch.setenv(f"{ENV_PREFIX}REPLAY", str(path))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    replayed = shared_live()
    assert replayed is not shared  # a runtime per settings
    view = replayed.view()
    assert view.plan.mode == mode
    assert [(p.name, p.device, p.nodes) for p in view.plan.partitions] == [
        (p.name, p.device, p.nodes) for p in plan.partitions]
    assert _dots(at) == [view.drawing.node_dot]
    n = len(plan.partitions)
    assert any(f"· {mode} · {n} partition{'s' * (n != 1)} on" in m.value
               and f"replay of `{path.name}`" in m.value for m in at.markdown)
    assert at.metric[4].value == "20" and view.totals.finished == 20
    assert "Replaying" in at.sidebar.info[0].value and not at.sidebar.button

    at.switch_page("views/stepper.py").run()
    assert not at.exception, at.exception
    assert at.segmented_control(key="stepper_mode").value == mode
    assert UNASSIGNED.fill not in _dots(at)[0]  # opens on the finished plan


def test_the_web_dashboard_attaches_to_a_running_server(shared: SharedLive,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`prism web --connect URL`: the page shows the server's plan and the requests its
    clients sent, through the same view model."""
    from tests.support.servers import call, serving

    with serving("cpu:2", files=(("cnn", DEFAULT_MODEL),)) as (url, state):
        x = np.random.default_rng().standard_normal((1, 3, 32, 32), np.float32)
        for _ in range(7):
            status, _, body = call(f"{url}/v2/models/cnn/infer", "POST", {"inputs": [
                {"name": "image", "shape": [1, 3, 32, 32], "datatype": "FP32",
                 "data": x.ravel().tolist()}]})
            assert status == 200, body
        monkeypatch.setenv(f"{ENV_PREFIX}CONNECT", url)
        at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
        assert not at.exception, at.exception
        attached = shared_live()
        assert attached is not shared
        plan = state.host.plan("cnn")
        view = attached.view()
        assert [(p.name, p.device) for p in view.plan.partitions] == [
            (p.name, p.device) for p in plan.partitions]
        deadline = time.monotonic() + TIMEOUT
        while attached.view().totals.finished < 7 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert attached.view().totals.finished == 7


# last: it re-plans the module's shared runtime, renaming its network
def test_partition_table_puts_estimates_beside_measurements_and_replans_from_them(
        at: AppTest, shared: SharedLive) -> None:
    deadline = time.monotonic() + 30
    while not all(r.runs >= 20 for r in shared.view(max_age=0).partitions):
        assert time.monotonic() < deadline, "the partitions never ran twenty times"
        time.sleep(0.1)
    at.run()
    table = next(d.value for d in at.dataframe if "est ms" in d.value.columns)
    columns = list(table.columns)
    assert columns.index("est ms") + 1 == columns.index("p50 ms")
    assert columns.index("p50 ms") + 1 == columns.index("est off %")
    before = shared.view().plan
    at.button(key="replan_measured").click().run()
    assert not at.exception and not at.error, at.error
    assert any("re-planned from measured run times" in s.value for s in at.success)
    plan = shared.view().plan
    assert plan is not before and plan.costs == "live"
    assert _serving(shared)
