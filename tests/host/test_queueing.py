"""Requests waiting for a slot: priority then arrival order, a timeout while queued (it
never runs) or while running, one too late to run started never, and a queued request
cancelled."""

from __future__ import annotations

import time

import numpy as np

from runtime.errors import RequestTimeoutError
from tests.support.hosts import Blocked, faked, gated_toy, toy_chain, toy_expected, toy_feeds
from tests.support.serving import WAIT, Events, idle, poll

# -- priorities ------------------------------------------------------------------------------


def test_priority_then_fifo():
    host, gate = gated_toy(max_active=1, max_queue=20)
    with host:
        events = Events(host, kinds=("request.",))
        blocked = Blocked(host, gate)
        first_id = events.last_queued()
        low, high = [], []
        for _ in range(3):
            low.append((host.run("toy", toy_feeds(), priority=1), events.last_queued()))
        for _ in range(3):
            high.append((host.run("toy", toy_feeds(), priority=0), events.last_queued()))
        low.append((host.run("toy", toy_feeds(), priority=1), events.last_queued()))
        gate.opened.set()
        blocked.future().result(timeout=WAIT)
        for fut, _ in [*low, *high]:
            fut.result(timeout=WAIT)
        order = [e["request"] for e in events.of("request.started")]
        want = [first_id, *(i for _, i in high), *(i for _, i in low)]
        assert order == want


# -- timeouts and cancellation ---------------------------------------------------------------


def test_timeout_while_queued_never_runs():
    host, gate = gated_toy(max_active=1)
    with host:
        events = Events(host)
        first = Blocked(host, gate)
        late = host.run("toy", toy_feeds(), timeout=0.05)
        late_id = events.last_queued()
        err = late.exception(timeout=5)  # ends while the gate is still shut
        assert isinstance(err, RequestTimeoutError) and "queue" in str(err)
        assert not gate.opened.is_set()
        gate.opened.set()
        first.future().result(timeout=WAIT)
        after = toy_feeds()
        np.testing.assert_allclose(host.run("toy", after).result(timeout=WAIT)["y"],
                                   toy_expected(after))
        assert poll(lambda: idle(host))
        time.sleep(0.05)
        assert not events.ran(late_id)
        assert not any(e.get("request") == late_id for e in events.of("request.started"))
        assert gate.calls == 2


def test_timeout_while_running():
    host, gate = gated_toy(max_active=1)
    with host:
        events = Events(host, kinds=("request.",))
        blocked = Blocked(host, gate, timeout=0.05)
        rid = events.last_queued()
        assert poll(lambda: any(e["request"] == rid for e in events.of("request.failed")), 5)
        opened_at = time.monotonic()
        gate.opened.set()
        err = blocked.future().exception(timeout=WAIT)
        assert isinstance(err, RequestTimeoutError) and "running" in str(err)
        [failed] = [e for e in events.of("request.failed") if e["request"] == rid]
        assert failed.ts < opened_at
        after = toy_feeds()
        np.testing.assert_allclose(host.run("toy", after).result(timeout=WAIT)["y"],
                                   toy_expected(after))
        assert poll(lambda: idle(host))


def test_an_overloaded_network_keeps_answering_within_its_timeout():
    """Twice the requests its device runs, each with a 0.4 s timeout. Were the oldest
    queued request started whatever its time left, each would start just in time to
    expire running: every run wasted, none answered once the queue is full. Started only
    with time to run, about half are answered, and every request still ends once."""
    run_seconds, arrivals, timeout = 0.02, 0.01, 0.4
    with faked("cpu:1", max_active=1, max_queue=1000) as host:
        host.add_network("toy", toy_chain())
        host.devices["cpu0"].fail = lambda call, feeds: time.sleep(run_seconds) or 0
        start, sent = time.monotonic(), []
        while (now := time.monotonic()) - start < 3.0:
            sent.append((now - start, host.run("toy", toy_feeds(), timeout=timeout,
                                               inline=False)))
            time.sleep(arrivals)
        late = [f for at, f in sent if at > 1.5]  # the queue is full by then
        errors = [f.exception(timeout=WAIT) for f in late]
        assert all(e is None or isinstance(e, RequestTimeoutError) for e in errors)
        answered = sum(e is None for e in errors)
        assert answered > 0.5 * len(late) * arrivals / run_seconds, (answered, len(late))
        assert any("left" in str(e) for e in errors)  # refused before it ran
        assert poll(lambda: idle(host))


def test_a_request_with_no_one_behind_it_runs_on_whatever_time_it_has_left():
    """Refusing a queued request short of time spares the runs of those behind it; with
    none behind, it runs, and may still end in time: its network's runs take 0.6 s on
    average, give or take 0.3, and this one has 0.9 s left and runs in 0.3."""
    run_seconds = 0.3
    with faked("cpu:1", max_active=1) as host:
        host.add_network("toy", toy_chain())
        net = host._slots.networks["toy"]  # what its runs took so far, as if measured
        host.devices["cpu0"].fail = lambda call, feeds: time.sleep(run_seconds) or 0
        first = host.run("toy", toy_feeds(), inline=False)
        net.run_seconds, net.run_spread = 2 * run_seconds, run_seconds
        lone = host.run("toy", toy_feeds(), timeout=4 * run_seconds, inline=False)
        assert first.exception(timeout=WAIT) is None
        assert lone.exception(timeout=WAIT) is None
        assert poll(lambda: idle(host))


def test_cancel_queued_request():
    host, gate = gated_toy(max_active=1)
    with host:
        events = Events(host)
        blocked = Blocked(host, gate)
        victim = host.run("toy", toy_feeds())
        victim_id = events.last_queued()
        kept_feeds = toy_feeds()
        kept = host.run("toy", kept_feeds)
        assert victim.cancel()
        assert victim.cancelled()
        assert host.stats().queued == 1
        gate.opened.set()
        blocked.future().result(timeout=WAIT)
        np.testing.assert_allclose(kept.result(timeout=WAIT)["y"], toy_expected(kept_feeds))
        assert poll(lambda: idle(host))
        for _ in range(5):  # accounting recovered: later requests still run
            f = toy_feeds()
            np.testing.assert_allclose(host.run("toy", f).result(timeout=WAIT)["y"],
                                       toy_expected(f))
        assert poll(lambda: idle(host))
        assert not events.ran(victim_id)
        assert not any(e.get("request") == victim_id for e in events.of("request.started"))
        assert gate.calls == 7
