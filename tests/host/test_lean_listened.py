"""The lean path with someone listening (a dashboard, a server's metrics): an idle device
runs a one-partition request on the caller's thread, and every step of it is published
as the general path publishes it; a busy device sends it down the general path."""

from __future__ import annotations

import threading

import numpy as np

from runtime.devices import parse_devices
from runtime.errors import ExecutionError
from runtime.host import HostManager, lean
from runtime.observe.metrics import Metrics
from tests.support.fakes import FaultyManager, Gate
from tests.support.serving import MLP, WAIT, Events, assert_same, expected, poll

STEPS = ("partition.run.started", "partition.run.finished", "request.queued",
         "request.started", "request.finished")


def _feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((1, 256), np.float32)}


def test_a_listened_request_runs_lean_and_publishes_every_step():
    rng = np.random.default_rng()
    feeds = [_feeds(rng) for _ in range(20)]
    with HostManager(parse_devices("cpu:1"), device_factory=FaultyManager) as host:
        [part] = host.add_network("m", MLP).partitions
        events = Events(host)
        ran_on: list[str] = []
        host.devices[part.device].fail = lambda call, _: ran_on.append(  # type: ignore[attr-defined]
            threading.current_thread().name) or call == 20
        futures = [host.run("m", f) for f in feeds]
        assert all(f.done() for f in futures), "an idle device answers on the caller's thread"
        assert set(ran_on) == {threading.current_thread().name}
        for f, fut in zip(feeds[:-1], futures, strict=False):
            assert_same(fut.result(timeout=0), expected(MLP, f))
        error = futures[-1].exception(timeout=0)
        assert isinstance(error, ExecutionError) and error.device == part.device
        seen = events.all()
    ids = [e["request"] for e in seen if e.kind == "request.queued"]
    assert len(ids) == len(set(ids)) == len(feeds)
    for rid in ids:
        mine = [e for e in seen if e.get("request") == rid]
        end = "request.failed" if rid == ids[-1] else "request.finished"
        assert [e.kind for e in mine] == [*STEPS[:-1], end]
        assert all(e["network"] == "m" for e in mine)
    finished = [e for e in seen if e.kind == "request.finished"]
    runs = {e["request"]: e["run_seconds"] for e in seen if e.kind == "partition.run.finished"}
    for e in finished:
        assert e["latency"] >= runs[e["request"]] > 0 and e["batch_size"] == e["rows"] == 1
    failed = next(e for e in seen if e.kind == "request.failed")
    assert (failed["partition"], failed["device"]) == (part.name, part.device)
    metrics = Metrics()  # what a dashboard folds them into
    metrics.feed(seen)
    snapshot = metrics.snapshot()
    assert (snapshot.requests_finished, snapshot.requests_failed) == (len(feeds) - 1, 1)
    assert snapshot.partitions[f"m/{part.name}"].count == len(feeds)


def test_a_listened_request_to_a_busy_device_takes_the_general_path(monkeypatch):
    monkeypatch.setattr(lean, "LEAN_WAIT", WAIT)  # were it to wait, it would wait long
    rng = np.random.default_rng()
    first, second = _feeds(rng), _feeds(rng)
    with HostManager(parse_devices("cpu:1"), device_factory=FaultyManager) as host:
        host.add_network("m", MLP)
        events = Events(host, kinds=("request.",))
        gate = host.devices["cpu0"].gate = Gate()  # type: ignore[attr-defined]
        held: list = []
        runner = threading.Thread(target=lambda: held.append(host.run("m", first)))
        runner.start()  # runs on its own thread, held at the gate
        assert gate.entered.wait(WAIT)
        queued = host.run("m", second)  # does not wait for the device: it queues there
        assert not queued.done() and host.devices["cpu0"].stats().queue_length == 1
        gate.opened.set()
        runner.join(WAIT)
        assert_same(queued.result(timeout=WAIT), expected(MLP, second))
        assert_same(held[0].result(timeout=0), expected(MLP, first))
        assert poll(lambda: len(events.of("request.finished")) == 2)
    kinds = [e.kind for e in events.all() if e["request"] == events.of("request.queued")[-1][
        "request"]]
    assert kinds[0] == "request.queued"  # published as it queued, before it ran
