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


async def run(runs: RunThread, network: str, feeds: Mapping[str, np.ndarray], priority: int,
              timeout: float | None, *, large: bool = False) -> dict[str, np.ndarray]:
    """One request's outputs. `large`: its feeds are checked (in `host.run`) off the loop."""
    answer = runs.submit(network, feeds, priority, timeout)
    if answer is not None:
        return await answer
    host = runs.host
    if large:
        future = await run_in_threadpool(host.run, network, feeds, priority, timeout,
                                         inline=False)
    else:
        future = host.run(network, feeds, priority, timeout, inline=False)
    return await answer_of(future)


async def maybe_offload(size: int, call: Callable[..., T], *args: object) -> T:
    """`call(*args)` on a worker thread when it handles over OFFLOAD_BYTES, else right here
    (a thread hand-off costs more than decoding a small tensor)."""
    if size > OFFLOAD_BYTES:
        return await run_in_threadpool(call, *args)
    return call(*args)
