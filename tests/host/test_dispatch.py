"""The dispatcher (runtime/host/dispatch.py): admission (`refused`: at the queue's limit,
while a network is removed, once the host closes), the registry (a name added once,
found or not), retiring a network (refused while busy, or waited for) and ending a
request (`finish`: once, its slot given back once).

The first tests drive a Dispatcher directly, over networks loaded onto a fake device;
the rest go through the host."""

from __future__ import annotations

import concurrent.futures as cf
import math
import threading
import time

import numpy as np
import pytest

from runtime.devices import parse_devices
from runtime.errors import (
    ExecutionError,
    HostClosedError,
    NetworkBusyError,
    NetworkExistsError,
    NetworkNotFoundError,
    QueueFullError,
)
from runtime.executor.requests import Request
from runtime.host import HostManager
from runtime.host.dispatch import Dispatcher
from runtime.host.serving import ServedNetwork
from runtime.observe.events import EventBus
from runtime.provision.from_model import load_network
from runtime.provision.network import LoadedNetwork, unload_network
from tests.support.fakes import FakeDevice, Gate
from tests.support.hosts import TOY_MAP, Blocked, gated_toy, toy_chain, toy_expected, toy_feeds
from tests.support.serving import (
    MLP,
    TRANSFORMER,
    WAIT,
    Events,
    assert_same,
    expected,
    idle,
    mlp_feeds,
    poll,
)


class Slots:
    """A Dispatcher of `max_active` slots, with networks (MLP, no lean path, no timeout)
    served on one fake cpu device; `close` stops it and unloads what it loaded."""

    def __init__(self, max_active: int = 1):
        self.bus = EventBus()
        self.dispatcher = Dispatcher(self.bus, max_active)
        self.device = FakeDevice(parse_devices("cpu:1")[0], self.bus)
        self.loaded: list[LoadedNetwork] = []

    def serve(self, name: str) -> ServedNetwork:
        self.dispatcher.reserve(name)
        loaded = load_network(name, MLP, {self.device.name: self.device}, self.bus)
        self.loaded.append(loaded)
        net = ServedNetwork(loaded, math.inf, self.dispatcher.batcher, lambda net: None)
        self.dispatcher.register(net)
        return net

    def submit(self, net: ServedNetwork, feeds: dict, limit: int = 10) -> cf.Future:
        """A request to `net`, admitted as the host admits one (never run inline)."""
        request = Request(net.name, net.check_feeds(feeds), 0, None, time.monotonic())
        return self.dispatcher.submit(net, request, limit, inline=False)

    def hold(self, net: ServedNetwork, feeds: dict) -> tuple[cf.Future, Gate]:
        """A request to `net` held running on the device, at the gate returned."""
        gate = self.device.gate = Gate()
        future = self.submit(net, feeds)
        assert gate.entered.wait(5), "the request never reached the device"
        return future, gate

    def close(self) -> None:
        self.dispatcher.stop(WAIT)
        for loaded in self.loaded:
            unload_network(loaded, self.bus)
        self.device.close()


@pytest.fixture
def slots():
    made = Slots()
    yield made
    made.close()


# -- the dispatcher, directly ----------------------------------------------------------------


def test_refused_says_why_a_network_takes_no_request_now_or_none(slots):
    """None while the network serves and the queue has room; QueueFullError at the limit;
    NetworkNotFoundError while the network is being removed (whatever the queue); once
    the host closes, HostClosedError for every network, even one being removed."""
    rng = np.random.default_rng()
    net, other = slots.serve("m"), slots.serve("n")
    dispatcher = slots.dispatcher
    limit = int(rng.integers(1, 1000))
    assert dispatcher.refused(net) is None
    assert dispatcher.refused(net, limit - 1, limit) is None
    assert dispatcher.refused(net, int(rng.integers(0, 10**9))) is None  # no limit given
    for waiting in (limit, limit + int(rng.integers(1, 1000))):
        full = dispatcher.refused(net, waiting, limit)
        assert isinstance(full, QueueFullError) and f"({limit} waiting)" in str(full)
    net.accepted.append(None)  # a request accepted and not ended: retire waits for it
    with cf.ThreadPoolExecutor(1) as pool:
        retired = pool.submit(dispatcher.retire, "m", True, WAIT)
        assert poll(lambda: net.removing)
        for args in ((), (limit, limit)):
            gone = dispatcher.refused(net, *args)
            assert isinstance(gone, NetworkNotFoundError), gone
            assert "'m' is being removed" in str(gone)
        assert dispatcher.refused(other) is None  # the other network still serves
        net.accepted.pop()
        dispatcher.wake()
        assert retired.result(timeout=WAIT) is net
    assert list(dispatcher.networks) == ["n"]
    assert dispatcher.stop(WAIT)
    for served, args in ((other, ()), (other, (limit, limit)), (net, ())):
        assert isinstance(dispatcher.refused(served, *args), HostClosedError)
    assert not dispatcher.stop(WAIT)  # stopped already


def test_retire_without_waiting_refuses_a_busy_network_and_leaves_it_serving(slots):
    """A network with a request running: retire(wait=False) raises NetworkBusyError
    naming it and its requests, and the network goes on serving (found, admitting, new
    requests answered); once idle it retires, and is then not loaded."""
    rng = np.random.default_rng()
    net = slots.serve("m")
    dispatcher = slots.dispatcher
    held_feeds = mlp_feeds(rng, 2)
    held, gate = slots.hold(net, held_feeds)
    assert net.in_flight == 1
    with pytest.raises(NetworkBusyError, match="m has 1 requests outstanding"):
        dispatcher.retire("m", wait=False, timeout=WAIT)
    assert not net.removing and dispatcher.network("m") is net
    assert dispatcher.refused(net) is None
    later_feeds = mlp_feeds(rng, 3)
    later = slots.submit(net, later_feeds)  # queued behind the held one: one slot
    assert not later.done() and dispatcher.stats().queued == 1 and net.in_flight == 2
    gate.opened.set()
    assert_same(held.result(timeout=WAIT), expected(MLP, held_feeds))
    assert_same(later.result(timeout=WAIT), expected(MLP, later_feeds))
    assert poll(lambda: net.in_flight == 0)
    assert dispatcher.retire("m", wait=False, timeout=WAIT) is net
    assert dispatcher.networks == {}
    with pytest.raises(NetworkNotFoundError, match="'m' is not loaded"):
        dispatcher.network("m")


def test_finish_ends_a_request_once_and_gives_its_slot_back_once(slots):
    """A running request ended from outside (as a timeout would) fails once; its slot goes
    to the queued request; ending it again, or its late answer, changes nothing."""
    rng = np.random.default_rng()
    net = slots.serve("m")
    dispatcher = slots.dispatcher
    first, gate = slots.hold(net, mlp_feeds(rng, 1))
    [running] = net.running
    queued_feeds = mlp_feeds(rng, 2)
    queued = slots.submit(net, queued_feeds)
    assert (dispatcher.slots_used, dispatcher.stats().queued) == (1, 1)
    dispatcher.finish(running, None, ExecutionError("ended from outside"))
    assert isinstance(first.exception(timeout=WAIT), ExecutionError)
    assert (dispatcher.slots_used, dispatcher.stats().queued) == (1, 0)  # the queued one's
    dispatcher.finish(running, None, ExecutionError("again"))
    assert "outside" in str(first.exception(timeout=0))
    assert dispatcher.slots_used == 1 and net.in_flight == 1
    gate.opened.set()  # the first run lands late, and is dropped; the second runs
    assert_same(queued.result(timeout=WAIT), expected(MLP, queued_feeds))
    assert poll(lambda: dispatcher.slots_used == 0 and net.in_flight == 0)
    assert dispatcher.stats().slots_used == 0 and dispatcher.stats().queued == 0
    assert net.running == set()


# -- admission and the registry, through the host --------------------------------------------


def test_queue_full():
    host, gate = gated_toy(max_active=1, max_queue=2)
    with host:
        first = Blocked(host, gate)
        feeds = [toy_feeds() for _ in range(2)]
        queued = [host.run("toy", f) for f in feeds]
        assert not any(f.done() for f in queued)
        with pytest.raises(QueueFullError, match="full"):
            host.run("toy", toy_feeds())
        gate.opened.set()
        np.testing.assert_allclose(first.future().result(timeout=WAIT)["y"],
                                   toy_expected(first.feeds))
        for f, fut in zip(feeds, queued, strict=True):
            np.testing.assert_allclose(fut.result(timeout=WAIT)["y"], toy_expected(f))
        assert poll(lambda: idle(host))
        host.run("toy", toy_feeds()).result(timeout=WAIT)  # room again


def test_network_not_found_and_exists():
    with HostManager(parse_devices("cpu:2")) as host:
        for call in (lambda: host.run("nope", {}), lambda: host.plan("nope"),
                     lambda: host.graph("nope"), lambda: host.remove_network("nope")):
            with pytest.raises(NetworkNotFoundError, match="nope"):
                call()
        host.add_network("m", MLP)
        used = {n: m.used_bytes for n, m in host.devices.items()}
        with pytest.raises(NetworkExistsError, match="m"):
            host.add_network("m", MLP)
        with pytest.raises(NetworkExistsError):
            host.add_network("m", TRANSFORMER)
        assert {n: m.used_bytes for n, m in host.devices.items()} == used
        assert host.networks() == ["m"]
        feeds = {"x": np.ones((2, 256), np.float32)}
        assert_same(host.run("m", feeds).result(timeout=WAIT), expected(MLP, feeds))


# -- retiring a network, through the host ----------------------------------------------------


def test_remove_while_busy():
    host, gate = gated_toy(max_active=1)
    with host:
        events = Events(host, kinds=("provision.evicted",))
        blocked = Blocked(host, gate)
        with pytest.raises(NetworkBusyError):
            host.remove_network("toy", wait=False)
        with pytest.raises(NetworkBusyError):  # a short wait gives up and leaves it loaded
            host.remove_network("toy", wait=True, timeout=0.05)
        assert host.networks() == ["toy"]
        remover = threading.Thread(target=host.remove_network, args=("toy",),
                                   kwargs={"wait": True, "timeout": WAIT})
        remover.start()
        time.sleep(0.1)
        assert remover.is_alive()
        assert sum(m.used_bytes for m in host.devices.values()) > 0
        with pytest.raises(NetworkNotFoundError):  # no new requests while it is removed
            host.run("toy", toy_feeds())
        gate.opened.set()
        remover.join(WAIT)
        assert not remover.is_alive()
        np.testing.assert_allclose(blocked.future().result(timeout=WAIT)["y"],
                                   toy_expected(blocked.feeds))
        assert host.networks() == []
        assert {n: m.used_bytes for n, m in host.devices.items()} == {"cpu0": 0, "cpu1": 0}
        assert {n: m.keys for n, m in host.devices.items()} == {"cpu0": (), "cpu1": ()}
        assert len(events.of("provision.evicted")) == 2
        host.add_network("toy", toy_chain(), partition=TOY_MAP)  # the name is free again
        f = toy_feeds()
        np.testing.assert_allclose(host.run("toy", f).result(timeout=WAIT)["y"],
                                   toy_expected(f))
