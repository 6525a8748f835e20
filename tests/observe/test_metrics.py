"""Metrics from the event stream (runtime/observe/metrics.py), checked against streams made
here with known figures: latency, queue wait and batch percentiles, throughput and its
series, per partition and per device figures, utilisation, queue depth, errors and lost
events, a partition run on several devices, and a replayed recording giving the same snapshot."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

from runtime.observe.events import Event, read_jsonl, write_jsonl
from runtime.observe.metrics import Metrics, MetricsSnapshot, Percentiles

T0 = 1000.0
GAP = 0.2  # between request arrivals: no two requests' runs overlap (latency <= 100 ms)


def stream(n: int = 100, rng: np.random.Generator | None = None) -> dict:
    """n requests on net: p0 on cpu:0 then p1 on cpu:1, latencies a permutation of 1..n ms."""
    rng = rng or np.random.default_rng()
    lat = (rng.permutation(n) + 1) / 1000
    wait = rng.random(n) * 0.0009  # < the shortest latency, so each request's runs are > 0
    batch = rng.integers(1, 5, n)
    evs: list[Event] = []
    runs: dict[str, list[tuple[float, float]]] = {"cpu:0": [], "cpu:1": []}
    finished = []
    for i in range(n):
        q = T0 + i * GAP
        s = q + float(wait[i])
        a = b = float(lat[i] - wait[i]) / 2  # p0 then p1 fill the rest of the latency
        f = q + float(lat[i])
        evs += [
            Event("request.queued", q, {"network": "net", "request": i, "priority": 0,
                                        "queue_depth": i % 7}),
            Event("queue.depth", q, {"depth": i % 7, "active": 1}),
            Event("request.started", s, {"network": "net", "request": i,
                                         "queue_wait": float(wait[i]),
                                         "batch_size": int(batch[i])}),
            Event("partition.run.started", s, {"network": "net", "request": i,
                                               "partition": "p0", "device": "cpu:0"}),
            Event("partition.run.finished", s + a, {"network": "net", "request": i,
                                                    "partition": "p0", "device": "cpu:0",
                                                    "queue_wait": 0.001, "run_seconds": a}),
            Event("partition.run.started", s + a, {"network": "net", "request": i,
                                                   "partition": "p1", "device": "cpu:1"}),
            Event("partition.run.finished", f, {"network": "net", "request": i,
                                                "partition": "p1", "device": "cpu:1",
                                                "queue_wait": 0.002, "run_seconds": b}),
            Event("request.finished", f, {"network": "net", "request": i,
                                          "latency": float(lat[i]),
                                          "queue_wait": float(wait[i]), "run_seconds": a + b,
                                          "batch_size": int(batch[i])}),
        ]
        runs["cpu:0"].append((s, s + a))
        runs["cpu:1"].append((s + a, f))
        finished.append(f)
    evs.append(Event("device.memory", T0 + 1, {"device": "cpu:0", "used_bytes": 10,
                                              "total_bytes": 100}))
    evs.append(Event("device.memory", T0 + 2, {"device": "cpu:0", "used_bytes": 70,
                                              "total_bytes": 100}))
    evs.sort(key=lambda e: e.ts)  # stable: a request's events keep their order
    return {"events": evs, "lat": lat, "wait": wait, "batch": batch, "runs": runs,
            "finished": np.array(finished), "now": evs[-1].ts}


def pct(values) -> tuple[float, float, float]:
    p50, p95, p99 = np.percentile(np.asarray(values, float), [50, 95, 99])
    return float(p50), float(p95), float(p99)


def test_empty():
    snap = Metrics().snapshot(now=5.0)
    assert snap == MetricsSnapshot(5.0)
    assert snap.latency == Percentiles() and not snap.partitions


def test_latency_queue_wait_batch_percentiles():
    s = stream()
    m = Metrics()
    m.feed(s["events"])
    snap = m.snapshot(now=s["now"])
    assert snap.requests_finished == 100 and snap.requests_failed == 0
    lat = snap.latency
    assert (lat.p50, lat.p95, lat.p99) == pct(np.arange(1, 101) / 1000)
    assert (lat.p50, lat.p95, lat.p99) == pytest.approx((0.0505, 0.09505, 0.09901))
    assert lat.count == 100 and lat.last == s["lat"][-1]
    assert lat.mean == pytest.approx(0.0505)
    # started and finished both carry queue_wait and batch_size: counted once per request
    assert snap.queue_wait.count == 100 and snap.batch_sizes.count == 100
    assert (snap.queue_wait.p50, snap.queue_wait.p95, snap.queue_wait.p99) == pct(s["wait"])
    assert snap.batch_sizes.mean == pytest.approx(s["batch"].mean())
    assert (snap.batch_sizes.p50, snap.batch_sizes.p95) == pct(s["batch"])[:2]


def test_batch_from_finished_when_started_missing():
    s = stream(20)
    m = Metrics()
    m.feed(e for e in s["events"] if e.kind != "request.started")
    snap = m.snapshot(now=s["now"])
    assert snap.batch_sizes.count == 20 and snap.queue_wait.count == 20
    assert snap.batch_sizes.mean == pytest.approx(s["batch"].mean())


def test_reservoir_keeps_most_recent():
    s = stream()
    m = Metrics(samples=16)
    m.feed(s["events"])
    lat = m.snapshot(now=s["now"]).latency
    assert lat.count == 100
    assert (lat.p50, lat.p95, lat.p99) == pct(s["lat"][-16:])
    assert lat.mean == pytest.approx(s["lat"][-16:].mean())


@pytest.mark.parametrize("at", [3.0, 19.5])
def test_throughput(at):
    s = stream()
    m = Metrics()
    now = T0 + at
    m.feed(e for e in s["events"] if e.ts <= now)
    f = s["finished"]
    span = min(5.0, now - T0)
    expect = np.count_nonzero((f > now - 5) & (f <= now)) / span
    assert m.snapshot(now=now).throughput == pytest.approx(expect)
    assert expect == pytest.approx(5.0, abs=0.4)  # one request per GAP


def test_throughput_series():
    s = stream()
    m = Metrics(window_seconds=8)
    m.feed(s["events"])
    now = s["now"]
    series = m.snapshot(now=now).throughput_series
    assert len(series) == 8
    for k, (end, rate) in enumerate(reversed(series)):
        assert end == pytest.approx(now - k)
        f = s["finished"]
        assert rate == np.count_nonzero((f > now - k - 1) & (f <= now - k))
    short = Metrics()
    short.feed(e for e in s["events"] if e.ts <= T0 + 2.5)
    assert len(short.snapshot(now=T0 + 2.5).throughput_series) == 3
    assert sum(r for _, r in short.snapshot(now=T0 + 2.5).throughput_series) == 13


def test_partitions_and_devices():
    s = stream()
    m = Metrics()
    m.feed(s["events"])
    snap = m.snapshot(now=s["now"])
    assert set(snap.partitions) == {"net/p0", "net/p1"}
    run = (s["lat"] - s["wait"]) / 2
    for name, dev, wait in (("p0", "cpu:0", 0.001), ("p1", "cpu:1", 0.002)):
        p = snap.partitions[f"net/{name}"]
        assert (p.network, p.partition, p.device, p.count) == ("net", name, dev, 100)
        assert (p.p50, p.p95, p.p99) == pct(run)
        assert p.last == run[-1] and p.mean_queue_wait == pytest.approx(wait)
        d = snap.devices[dev]
        assert d.runs == 100 and d.busy_seconds == pytest.approx(run.sum())
        assert d.queue_length == 0
        assert d.utilisation == pytest.approx(run.sum() / (s["now"] - T0))
    assert (snap.devices["cpu:0"].used_bytes, snap.devices["cpu:0"].total_bytes) == (70, 100)
    assert snap.devices["cpu:1"].total_bytes == 0


def test_utilisation_windowed_and_clamped():
    s = stream()
    m = Metrics(window_seconds=10)
    m.feed(s["events"])
    now = s["now"]
    lo = now - 10
    for dev, runs in s["runs"].items():
        busy = sum(max(0.0, min(b, now) - max(a, lo)) for a, b in runs)
        assert m.snapshot(now=now).devices[dev].utilisation == pytest.approx(busy / 10)
    # two runs of 1 s each at once on a device over a 1 s span: clamped to 1
    over = Metrics()
    over.feed([Event("partition.run.finished", 1.0, {"network": "n", "request": r,
                                                     "partition": "p", "device": "gpu",
                                                     "run_seconds": 1.0}) for r in (0, 1)])
    over.feed([Event("x", 0.0)])
    assert over.snapshot(now=1.0).devices["gpu"].utilisation == 1.0


def test_outstanding_runs_queue_length_and_in_flight_busy():
    m = Metrics()
    started = [Event("partition.run.started", 10.0 + i, {"network": "n", "request": i,
                                                         "partition": "p0", "device": "cpu"})
               for i in range(3)]
    m.feed(started)
    snap = m.snapshot(now=14.0)
    assert snap.devices["cpu"].queue_length == 3
    assert snap.devices["cpu"].utilisation == 1.0  # 4 + 3 + 2 busy s over 4 s, clamped
    m.feed([Event("partition.run.finished", 14.0, {"network": "n", "request": 0,
                                                   "partition": "p0", "device": "cpu",
                                                   "run_seconds": 1.0}),
            Event("request.failed", 14.5, {"network": "n", "request": 1, "error": "boom",
                                           "partition": "p0", "device": "cpu"})])
    snap = m.snapshot(now=14.5)
    assert snap.devices["cpu"].queue_length == 1 and snap.devices["cpu"].runs == 1
    assert snap.devices["cpu"].utilisation == pytest.approx((1.0 + 2.5) / 4.5)


def test_queue_depth_window():
    s = stream()
    m = Metrics(window_seconds=5)
    m.feed(s["events"])
    now = s["now"]
    expect = [(e.ts, e["depth"]) for e in s["events"]
              if e.kind == "queue.depth" and e.ts >= now - 5]
    assert m.snapshot(now=now).queue_depth == expect
    assert 20 <= len(expect) <= 26


def test_errors_and_lost():
    m = Metrics()
    fails = [Event("request.failed", float(i), {"network": "net", "request": i,
                                                "error": f"bad {i}", "partition": "p1",
                                                "device": "cpu:1"}) for i in range(25)]
    fails.append(Event("request.failed", 30.0, {"network": "net", "request": 99,
                                                "error": "queue full", "partition": None,
                                                "device": None}))
    m.feed([*fails, Event("bus.lost", 31.0, {"lost": 3}), Event("bus.lost", 32.0,
                                                                 {"lost": 4})])
    snap = m.snapshot(now=32.0)
    assert snap.requests_failed == 26 and snap.lost_events == 7
    assert len(snap.errors) == 20
    assert snap.errors[0] == "net request 6: bad 6 (p1 on cpu:1)"
    assert snap.errors[-1] == "net request 99: queue full"


def test_a_partition_run_on_several_devices_has_figures_for_each():
    """Replicas of a plan run one partition on several devices: each device's runs are
    its own row (a merged one named whichever device ran last)."""
    rng = np.random.default_rng()
    runs = [(str(rng.choice(["cpu0", "cpu2"])), float(rng.random())) for _ in range(50)]
    m = Metrics()
    m.feed([Event("partition.run.finished", 1.0 + i, {"network": "n", "request": i,
                                                      "partition": "p0", "device": device,
                                                      "run_seconds": seconds})
            for i, (device, seconds) in enumerate([*runs, ("cpu0", 0.5), ("cpu2", 0.5)])])
    m.feed([Event("partition.run.finished", 60.0, {"network": "n", "request": 0,
                                                   "partition": "p1", "device": "cpu1",
                                                   "run_seconds": 0.1})])
    snap = m.snapshot(now=61.0)
    assert set(snap.partitions) == {"n/p0@cpu0", "n/p0@cpu2", "n/p1"}
    for device in ("cpu0", "cpu2"):
        mine = [s for d, s in [*runs, (device, 0.5)] if d == device]
        p = snap.partitions[f"n/p0@{device}"]
        assert (p.partition, p.device, p.count) == ("p0", device, len(mine))
        assert p.p50 == pytest.approx(float(np.median(mine)))


def test_replay_gives_identical_snapshot(tmp_path):
    s = stream(rng=np.random.default_rng())
    lost = Event("bus.lost", s["now"], {"lost": 2})
    evs = [*s["events"], lost]
    live = Metrics(window_seconds=7)
    live.feed(evs)
    buf = io.StringIO()
    write_jsonl(evs, buf)
    path = tmp_path / "run.jsonl"
    path.write_text(buf.getvalue())
    replayed = Metrics(window_seconds=7)
    replayed.feed(read_jsonl(path))
    chunked = Metrics(window_seconds=7)
    for i in range(0, len(evs), 37):  # as drained in pieces by a UI
        chunked.feed(evs[i:i + 37])
    now = evs[-1].ts
    a, b, c = (x.snapshot(now=now) for x in (live, replayed, chunked))
    assert a == b == c
    assert a.requests_finished == 100 and a.lost_events == 2
    assert not any(math.isnan(v) for v in (a.throughput, a.latency.p99))
