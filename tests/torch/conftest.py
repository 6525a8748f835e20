"""What the torch tests share: one host of two cpu devices watched by one subscription,
and fresh inputs; after them, no runtime thread is left.

Importing torch and building the exporter's registry take seconds, and each block's first
call exports it: tests share compiled modules through module-scoped fixtures.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from runtime.devices import parse_devices
from runtime.host import HostManager
from runtime.observe.events import Subscription
from runtime.torch.hosts import close_shared

SETTLE_SECONDS = 10


@pytest.fixture(scope="package", autouse=True)
def nothing_left_running() -> Iterator[None]:
    """The compiled graphs dropped, the shared hosts closed: their devices' threads and the
    janitor that unloads dropped graphs' networks end (later tests look for leftovers)."""
    yield
    torch._dynamo.reset()
    gc.collect()
    close_shared()
    deadline = time.monotonic() + SETTLE_SECONDS
    while (left := [t.name for t in threading.enumerate() if t.name.startswith("prism-")]) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"runtime threads outlived the torch tests: {left}"


@pytest.fixture(scope="package")
def host() -> Iterator[HostManager]:
    with HostManager(parse_devices("cpu:2")) as shared:
        yield shared


@pytest.fixture(autouse=True)
def empty_dynamo_cache() -> None:
    """Dynamo compiles one function's code (nn.Sequential.forward, say) at most
    `recompile_limit` times, then runs it eagerly: each test starts with an empty cache
    (the graphs dropped take their networks off the host as they are collected)."""
    torch._dynamo.reset()
    gc.collect()


@pytest.fixture(scope="package")
def events(host: HostManager) -> Iterator[Subscription]:
    with host.bus.subscribe(maxlen=200_000) as subscription:
        yield subscription
