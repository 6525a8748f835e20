"""Dashboards attached to a running server: the event stream, the queries, and two view
models on one runtime seeing the same requests."""

from __future__ import annotations

import time

import numpy as np
import pytest

from app.dashboard import DashboardModel
from app.remote import RemoteSource
from app.server.state import ServerSettings
from app.sources import SourceSettings
from runtime.errors import PrismError
from runtime.observe.events import Event
from tests.support.dags import SAMPLES_DIR
from tests.support.servers import call, serving

MLP = SAMPLES_DIR / "mlp.onnx"
WAIT = 30.0


def infer(url: str, rng: np.random.Generator, n: int) -> None:
    for _ in range(n):
        x = rng.standard_normal((1, 256), np.float32)
        status, _, body = call(f"{url}/v2/models/mlp/infer", "POST", {"inputs": [
            {"name": "x", "shape": [1, 256], "datatype": "FP32", "data": x.ravel().tolist()}]})
        assert status == 200, body


def until(predicate, timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stream(url: str, after: int | None = None, window: float = 0.5) -> list[tuple[int, Event]]:
    query = f"?window={window}" + ("" if after is None else f"&after={after}")
    status, headers, body = call(f"{url}/v2/prism/events{query}")
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    out = []
    for block in body.decode().split("\n\n"):
        if block.strip():
            number, data = block.split("\n")
            out.append((int(number.removeprefix("id: ")), Event.from_json(
                data.removeprefix("data: "))))
    return out


def test_the_event_stream_numbers_every_event_and_resumes_after_any():
    rng = np.random.default_rng()
    with serving("cpu:2", files=(("mlp", MLP),)) as (url, _):
        infer(url, rng, 5)
        first = stream(url)
        numbers = [n for n, _ in first]
        assert numbers == list(range(1, len(numbers) + 1))
        kinds = [e.kind for _, e in first]
        assert "network.loaded" in kinds and kinds.count("request.finished") == 5
        infer(url, rng, 3)
        rest = stream(url, after=numbers[-1])
        assert rest[0][0] == numbers[-1] + 1
        assert [e.kind for _, e in rest].count("request.finished") == 3
        again = stream(url, after=numbers[2])  # resuming anywhere gives the same events
        assert [(n, e.kind) for n, e in again] == [(n, e.kind) for n, e in (first + rest)[3:]]
        assert call(f"{url}/v2/prism/events?after=x")[0] == 400


def test_a_client_behind_the_kept_events_is_told_how_many_it_lost(monkeypatch):
    monkeypatch.setattr("app.server.event_log.KEEP", 20)
    with serving("cpu:1", files=(("mlp", MLP),)) as (url, _):
        infer(url, np.random.default_rng(), 10)  # some 40 events: only 20 kept
        events = stream(url, after=0)
        assert events[0][1].kind == "bus.lost"
        lost = events[0][1]["lost"]
        assert lost > 0 and events[1][0] == lost + 1 and len(events) == 21


def test_two_dashboards_attached_to_one_server_see_the_same_requests():
    rng = np.random.default_rng()
    with serving("cpu:2", files=(("mlp", MLP),),
                 settings=ServerSettings(devices="cpu:2")) as (url, state):
        views = [DashboardModel(SourceSettings(connect=url).open()) for _ in range(2)]
        try:
            plan = state.host.plan("mlp")
            for model in views:
                view = model.poll()
                assert view.status.network == "mlp" and view.plan.mode == plan.mode
                assert [p.device for p in view.plan.partitions] == [
                    p.device for p in plan.partitions]
            n = int(rng.integers(5, 15))
            infer(url, rng, n)
            assert until(lambda: all(m.poll().totals.finished == n for m in views))
            devices = views[0].poll().devices
            assert {d.name for d in devices} == set(state.host.devices)
            steps = views[1].stepper().run
            assert steps.plan.partitions and steps.steps
            with pytest.raises(PrismError, match="clients"):
                views[0].toggle_pause()
        finally:
            for model in views:
                model.close()


def test_connect_errors_are_one_line():
    with pytest.raises(PrismError, match="cannot reach a Prism server"):
        RemoteSource("http://127.0.0.1:9")
    with pytest.raises(PrismError, match="--connect takes"):
        RemoteSource("ftp://somewhere")
    with pytest.raises(PrismError, match="MODEL, --devices"):
        SourceSettings(model="m.onnx", connect="http://127.0.0.1:9")
