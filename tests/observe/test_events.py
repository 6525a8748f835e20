"""The event bus (runtime/observe/events.py): read-only events that pickle, the kinds'
catalogue, publish order across threads, bounded subscribers that drop the oldest and say
how many were lost, kind filters, nothing built without a subscriber, and JSON lines
written, read back and recorded from another thread."""

from __future__ import annotations

import copy
import io
import json
import pickle
import threading
import time

import numpy as np
import pytest

from runtime.observe import events as ev_mod
from runtime.observe.events import (
    EVENT_KINDS,
    Event,
    EventBus,
    EventLogError,
    JsonlRecorder,
    read_jsonl,
    write_jsonl,
)


def test_event_is_read_only_and_pickles():
    src = {"network": "net", "request": 3, "latency": 0.5}
    e = Event("request.finished", 12.5, src)
    src["request"] = 99
    assert e["request"] == 3 and e.get("missing", 7) == 7
    with pytest.raises(TypeError):
        e.fields["request"] = 4  # type: ignore[index]
    assert pickle.loads(pickle.dumps(e)) == e
    assert copy.deepcopy(e) == e
    assert Event("bus.lost", 1.0).fields == {}


def test_catalogue_names():
    assert EVENT_KINDS["partition.run.finished"] == (
        "network", "request", "partition", "device", "queue_wait", "run_seconds")
    assert EVENT_KINDS["bus.lost"] == ("lost",)
    assert EVENT_KINDS["device.worker.replaced"] == ("device", "error")
    assert EVENT_KINDS["cost.measure"] == ("network", "what", "done", "total")
    assert {k for k in EVENT_KINDS if k.startswith("train.")} == {
        "train.started", "train.step.started", "train.stage.finished", "train.step.finished",
        "train.epoch.finished", "train.finished", "train.failed"}


def test_publish_order_across_threads():
    bus, per_thread, threads = EventBus(), 5_000, 8
    sub = bus.subscribe(maxlen=per_thread * threads)
    start = threading.Barrier(threads)

    def work(t: int) -> None:
        start.wait(timeout=5)
        for i in range(per_thread):
            bus.publish("partition.step", thread=t, index=i)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(timeout=10)
    got = sub.drain()
    assert len(got) == per_thread * threads and sub.lost == 0
    for t in range(threads):
        assert [e["index"] for e in got if e["thread"] == t] == list(range(per_thread))
    assert sub.drain() == []


def test_drop_oldest_and_lost_event():
    bus = EventBus()
    sub = bus.subscribe(maxlen=10)
    n = int(np.random.default_rng().integers(11, 500))
    for i in range(n):
        bus.publish("queue.depth", depth=i, active=0)
    got = sub.drain()
    assert got[0].kind == "bus.lost" and got[0]["lost"] == n - 10
    assert got[0].ts <= got[1].ts
    assert [e["depth"] for e in got[1:]] == list(range(n - 10, n))
    assert sub.lost == n - 10
    # counted since the previous drain only; the total keeps growing
    for i in range(13):
        bus.publish("queue.depth", depth=i, active=0)
    got = sub.drain()
    assert got[0]["lost"] == 3 and len(got) == 11 and sub.lost == n - 7
    bus.publish("queue.depth", depth=0, active=0)
    assert [e.kind for e in sub.drain()] == ["queue.depth"]


def test_drain_limit():
    bus = EventBus()
    sub = bus.subscribe(maxlen=5)
    for i in range(8):
        bus.publish("x", i=i)
    first = sub.drain(limit=3)
    assert [e.kind for e in first] == ["bus.lost", "x", "x"] and first[0]["lost"] == 3
    assert [e["i"] for e in first[1:]] == [3, 4]
    assert [e["i"] for e in sub.drain(limit=2)] == [5, 6]
    assert sub.drain(limit=0) == [] and len(sub) == 1
    assert [e["i"] for e in sub.drain()] == [7]


def test_stalled_subscriber_does_not_slow_publishing():
    bus = EventBus()
    sub = bus.subscribe(maxlen=100)
    n = 200_000
    t0 = time.perf_counter()
    for i in range(n):
        bus.publish("partition.run.finished", network="n", request=i, partition="p0",
                    device="cpu:0", queue_wait=0.0, run_seconds=0.001)
    per = (time.perf_counter() - t0) / n
    assert per < 20e-6, f"{per * 1e6:.1f} us per publish"
    assert sub.lost == n - 100 and len(sub) == 100


def test_no_subscriber_builds_nothing(monkeypatch):
    made = []

    class Counting(Event):
        __slots__ = ()

        def __post_init__(self) -> None:
            made.append(self.kind)
            Event.__post_init__(self)

    monkeypatch.setattr(ev_mod, "Event", Counting)
    bus = EventBus()
    assert not bus.active
    for i in range(1000):
        bus.publish("request.queued", network="n", request=i, priority=0, queue_depth=i)
    assert made == []
    sub = bus.subscribe()
    assert bus.active
    bus.publish("request.queued", network="n", request=0, priority=0, queue_depth=0)
    assert made == ["request.queued"]
    sub.close()
    assert not bus.active and bus.subscribers == 0
    bus.publish("request.queued", network="n", request=1, priority=0, queue_depth=0)
    assert made == ["request.queued"]
    assert len(sub.drain()) == 1  # buffered events outlive close()


def test_kind_filters():
    bus = EventBus()
    requests = bus.subscribe(kinds=["request."])
    exact = bus.subscribe(kinds=["queue.depth", "partition.run.finished"])
    everything = bus.subscribe()
    kinds = ["request.queued", "request.finished", "queue.depth", "partition.run.started",
             "partition.run.finished", "requests.other", "request"]
    for k in kinds:
        bus.publish(k, n=1)
    assert [e.kind for e in requests.drain()] == ["request.queued", "request.finished"]
    assert [e.kind for e in exact.drain()] == ["queue.depth", "partition.run.finished"]
    assert [e.kind for e in everything.drain()] == kinds


def test_one_event_shared_by_subscribers():
    bus = EventBus()
    with bus.subscribe() as a, bus.subscribe() as b:
        bus.publish("x", v=1)
        assert a.drain()[0] is b.drain()[0]
    assert bus.subscribers == 0


def test_jsonl_round_trip(tmp_path):
    rng = np.random.default_rng()
    evs = [Event("request.finished", float(t),
                 {"network": "net", "request": i, "latency": float(lat), "batch_size": 2,
                  "tags": ["a", "b"], "nested": {"x": None, "ok": True}})
           for i, (t, lat) in enumerate(zip(np.cumsum(rng.random(50)), rng.random(50),
                                             strict=True))]
    evs.append(Event("partition.planned", 99.0, {"partitions": [
        {"name": "p0", "device": "cpu:0", "nodes": 3, "est_seconds": np.float64(0.25)}]}))
    buf = io.StringIO()
    assert write_jsonl(evs, buf) == len(evs)
    lines = buf.getvalue().splitlines()
    assert len(lines) == len(evs) and list(json.loads(lines[0]))[:2] == ["kind", "ts"]
    path = tmp_path / "run.jsonl"
    path.write_text(buf.getvalue() + "\n")
    back = list(read_jsonl(path))
    assert back == evs
    assert [e.ts for e in back] == [e.ts for e in evs]


def test_field_named_ts_is_refused():
    with pytest.raises(ValueError, match="'ts'"):
        Event("x", 1.0, {"ts": 2}).to_json()


@pytest.mark.parametrize("bad", ["{not json", "[1, 2]", '{"ts": 1.0}', '{"kind": "x"}',
                                 '{"kind": "x", "ts": "soon"}'])
def test_read_jsonl_bad_line_names_file_and_line(tmp_path, bad):
    path = tmp_path / "bad.jsonl"
    path.write_text(Event("x", 1.0, {}).to_json() + "\n\n" + bad + "\n")
    it = read_jsonl(path)
    assert next(it).kind == "x"
    with pytest.raises(EventLogError, match=r"bad\.jsonl:3: ") as err:
        next(it)
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value)


def test_recorder_records_from_another_thread(tmp_path):
    bus, path = EventBus(), tmp_path / "rec.jsonl"
    with JsonlRecorder(bus, path, interval=0.02) as rec:
        def work() -> None:
            for i in range(500):
                bus.publish("request.finished", network="n", request=i, latency=0.001 * i)
        th = threading.Thread(target=work)
        th.start()
        th.join(timeout=5)
        deadline = time.monotonic() + 2
        while rec.written < 500 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rec.written == 500  # written by its own thread, before stop
        bus.publish("request.failed", network="n", request=500, error="boom")
        t0 = time.monotonic()
        assert rec.stop(timeout=1.0)
        assert time.monotonic() - t0 < 1.0
    assert bus.subscribers == 0 and rec.stop()  # idempotent, also via __exit__
    got = list(read_jsonl(path))
    assert [e["request"] for e in got] == list(range(501))
    assert got[-1].kind == "request.failed"


def test_recorder_skips_unserialisable(tmp_path):
    bus = EventBus()
    rec = JsonlRecorder(bus, tmp_path / "r.jsonl", interval=10.0, kinds=["x"])
    bus.publish("x", ok=1)
    bus.publish("x", bad=object())
    bus.publish("y", ignored=1)
    assert rec.stop(timeout=1.0)
    assert rec.skipped == 1 and rec.written == 1
    assert [e.fields for e in read_jsonl(tmp_path / "r.jsonl")] == [{"ok": 1}]
