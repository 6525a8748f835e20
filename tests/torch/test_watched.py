"""The blocks' networks are the host's like any other: a dashboard attached to a server
exposing that host (`prism tui --connect`, `prism web --connect`, through
`app.remote.RemoteSource`) lists them with their plans and sees their partitions run."""

from __future__ import annotations

import time

import torch
from torch import nn

from app.remote import RemoteSource
from tests.support.servers import WAIT, serving
from tests.support.torch_modules import fresh, fresh_weights, relative_error


def test_a_dashboard_attached_to_the_host_sees_the_blocks_run():
    fresh_weights()
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 4)).eval()
    with serving("cpu:2") as (url, state):
        fast = torch.compile(model, backend="prism", options={"host": state.host})
        x = fresh(3, 8)
        with torch.no_grad():
            assert relative_error(fast(x), model(x)) < 1e-4
        (network,) = state.host.networks()
        source = RemoteSource(url)
        try:
            assert source.networks() == [network]
            assert {p.device for p in source.plan().partitions} <= {"cpu0", "cpu1"}
            with torch.no_grad():
                fast(fresh(3, 8))
            seen: set[str] = set()
            deadline = time.monotonic() + WAIT
            while "partition.run.finished" not in seen and time.monotonic() < deadline:
                seen |= {e.kind for e in source.drain() if e.get("network") == network}
                time.sleep(0.05)
            assert {"network.loaded", "partition.run.finished"} <= seen, seen
        finally:
            source.close()
