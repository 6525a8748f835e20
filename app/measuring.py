"""Progress while a first load measures a network on this machine (the measured cost
model times each node once, then caches): a transient Rich bar on stderr.

    with measuring(console) as progress:           # a plan made here: a callback
        plan_network(graph, devices, on_progress=progress)
    plan = add_network_measuring(host, console, name, model, **options)   # through a host
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import Progress

from app.console import progress_on
from runtime.host import HostManager
from runtime.partition import Plan

POLL = 0.1  # seconds between looks at the host's events while it loads


@contextmanager
def measuring(console: Console) -> Iterator[Callable[[str, int, int], None]]:
    """A progress callback `(what, done, total)`; the bar (`progress_on`: on a terminal
    only) starts with the first report, so a load that measures nothing prints nothing."""
    bar: Progress | None = None
    task = None

    def report(what: str, done: int, total: int) -> None:
        nonlocal bar, task
        if bar is None:
            bar = progress_on(console)
            bar.start()
            task = bar.add_task(what, total=total or None)
        assert task is not None
        bar.update(task, description=what, completed=done, total=total or None)

    try:
        yield report
    finally:
        if bar is not None:
            bar.stop()


def add_network_measuring(host: HostManager, console: Console, name: str, model: Any,
                          **options: Any) -> Plan:
    """`host.add_network(name, model, **options)`, showing the `cost.measure` events it
    publishes while it measures."""
    events = host.bus.subscribe(maxlen=10_000, kinds=("cost.measure",))
    result: dict[str, Any] = {}

    def load() -> None:
        try:
            result["plan"] = host.add_network(name, model, **options)
        except BaseException as exc:  # raised again on the caller's thread
            result["error"] = exc

    worker = threading.Thread(target=load, name="prism-load-network", daemon=True)
    try:
        with measuring(console) as report:
            worker.start()
            while worker.is_alive():
                worker.join(POLL)
                for event in events.drain():
                    report(event.get("what"), event.get("done"), event.get("total"))
    finally:
        events.close()
    if "error" in result:
        raise result["error"]
    return result["plan"]
