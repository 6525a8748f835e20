"""What the torch tests share: one host of two cpu devices watched by one subscription,
and fresh inputs.

Importing torch and building the exporter's registry take seconds, and each block's first
call exports it: tests share compiled modules through module-scoped fixtures.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch

from runtime.devices import parse_devices
from runtime.host import HostManager
from runtime.observe.events import Subscription


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
def events(host: HostManager) -> Iterator[Subscription]:
    with host.bus.subscribe(maxlen=200_000) as subscription:
        yield subscription
