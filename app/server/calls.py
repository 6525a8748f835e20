"""The one place the server waits for the host, and the rule for what runs off the loop.

`run` awaits a request without blocking the event loop: the server's run thread calls
the host for it (`run_thread.py`), or, that thread busy, the host's future resolves on a
device thread and `answer_of` hands the answer back to the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import numpy as np
from starlette.concurrency import run_in_threadpool

from app.server.run_thread import RunThread
from runtime.executor.futures import answer_of

T = TypeVar("T")
OFFLOAD_BYTES = 256 << 10  # decoding, checking or encoding more than this leaves the loop
STRING_COST = 64  # a byte of binary BYTES data decodes as slowly as this many of numbers


async def run(runs: RunThread, network: str, feeds: Mapping[str, np.ndarray], priority: int,
              timeout: float | None, *, large: bool = False, rows: int = 1
              ) -> dict[str, np.ndarray]:
    """One request's outputs. `large`: its feeds are checked (in `host.run`) off the loop;
    `rows`: the inferences it counts as (`host.run`)."""
    answer = runs.submit(network, feeds, priority, timeout, rows)
    if answer is not None:
        return await answer
    host = runs.host
    if large:
        future = await run_in_threadpool(host.run, network, feeds, priority, timeout,
                                         inline=False, rows=rows)
    else:
        future = host.run(network, feeds, priority, timeout, inline=False, rows=rows)
    return await answer_of(future)


def decode_size(body: bytes, binary: bool) -> int:
    """What decoding `body` costs, in bytes of numbers: binary BYTES elements are decoded
    one by one (~0.2 us each), so a body that holds them weighs STRING_COST times more."""
    size = len(body)
    if binary and OFFLOAD_BYTES // STRING_COST < size <= OFFLOAD_BYTES \
            and body.find(b'"BYTES"') >= 0:
        return size * STRING_COST
    return size


async def maybe_offload(size: int, call: Callable[..., T], *args: object) -> T:
    """`call(*args)` on a worker thread when it handles over OFFLOAD_BYTES, else right here
    (a thread hand-off costs more than decoding a small tensor)."""
    if size > OFFLOAD_BYTES:
        return await run_in_threadpool(call, *args)
    return call(*args)
