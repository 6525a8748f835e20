"""Closing a host: accepted requests may finish within the bound, what is left fails with
HostClosedError, close returns in time and twice is fine, and a closed host refuses
networks and requests."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from runtime.devices import parse_devices
from runtime.errors import HostClosedError
from runtime.host import HostManager
from tests.support.hosts import Blocked, gated_toy, toy_expected, toy_feeds
from tests.support.serving import MLP, WAIT, poll


def test_close_with_requests_pending():
    host, gate = gated_toy(max_active=1)
    blocked = Blocked(host, gate)
    queued = [host.run("toy", toy_feeds()) for _ in range(4)]
    bound = 0.3
    closer = threading.Thread(target=host.close, args=(bound,), daemon=True)
    start = time.monotonic()
    closer.start()
    try:
        assert poll(lambda: all(f.done() for f in queued), bound + 2.0)
        assert time.monotonic() - start < bound + 1.0
        for fut in queued:
            assert isinstance(fut.exception(timeout=0), HostClosedError)
    finally:
        gate.opened.set()
    closer.join(WAIT)
    assert not closer.is_alive()
    # the running one was accepted too: it ends, with its outputs or HostClosedError
    running = blocked.future()
    assert running.done()
    err = running.exception(timeout=0)
    assert err is None or isinstance(err, HostClosedError), err
    host.close()  # twice is fine


def test_close_lets_accepted_requests_finish():
    host, gate = gated_toy(max_active=1)
    feeds = [toy_feeds() for _ in range(3)]
    blocked = Blocked(host, gate)
    queued = [host.run("toy", f) for f in feeds]
    threading.Timer(0.1, gate.opened.set).start()
    host.close(timeout=WAIT)
    np.testing.assert_allclose(blocked.future().result(timeout=0)["y"],
                               toy_expected(blocked.feeds))
    for f, fut in zip(feeds, queued, strict=True):
        np.testing.assert_allclose(fut.result(timeout=0)["y"], toy_expected(f))


def test_closed_host_refuses_with_host_closed_error():
    host = HostManager(parse_devices("cpu:2"))
    host.add_network("m", MLP)
    host.close()
    with pytest.raises(HostClosedError):
        host.add_network("again", MLP)
    with pytest.raises(HostClosedError):
        host.run("m", {"x": np.zeros((1, 256), np.float32)})
