"""One captured graph, compiled: split into blocks that run on the host, the rest in
PyTorch. Its networks leave the host when the graph is dropped (dynamo's cache reset, the
module collected)."""

from __future__ import annotations

import itertools
import queue
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from torch.fx import GraphModule

from runtime.torch.block import Context, install, remove_network
from runtime.torch.hosts import host_for
from runtime.torch.report import GraphReport
from runtime.torch.split import split
from runtime.torch.support import NodeSupport

if TYPE_CHECKING:
    from runtime.host.manager import HostManager
    from runtime.torch.options import OffloadOptions

_numbers = itertools.count(1)
_live: weakref.WeakSet[CompiledGraph] = weakref.WeakSet()
_collecting = threading.local()  # explain(): reports go to a list instead of stderr


class CompiledGraph:
    """What AOT autograd calls in place of the graph's forward (unboxed arguments)."""

    def __init__(self, gm: GraphModule, options: OffloadOptions):
        self.number = next(_numbers)
        host = None if options.dry_run else host_for(options)
        owner = host or options.host  # a dry run plans over the caller's host's devices too
        devices = [d.config for d in owner.devices.values()] if owner is not None \
            else options.device_configs()
        name = f"g{self.number}"
        self.ctx = Context(name, options, host, devices,
                           GraphReport(name, [d.name for d in devices], options.dry_run))
        result = split(gm, NodeSupport(options), options.min_block_size)
        install(result, self.ctx)
        self.module = result.module
        self._to_print = options.dry_run
        if host is not None:
            _start_janitor()
            weakref.finalize(self, _retire, host, self.ctx.networks)
        sink = getattr(_collecting, "reports", None)
        if sink is not None:
            sink.append(self.ctx.report)
            self._to_print = False
        _live.add(self)

    @property
    def report(self) -> GraphReport:
        return self.ctx.report

    def __call__(self, *args: Any) -> Any:
        outputs = self.module(*args)
        if self._to_print:  # a dry run shows its report once every block was planned
            self._to_print = False
            print(self.report.table(), file=sys.stderr)
        return outputs


_retired: queue.SimpleQueue[tuple[HostManager, list[str]]] = queue.SimpleQueue()
_on_hosts = 0  # graphs on a host whose networks are not unloaded yet
_janitor_lock = threading.Lock()


def _retire(host: HostManager, networks: list[str]) -> None:
    """A dropped graph's networks, handed to a thread of their own to unload: a finalizer
    runs wherever the collector does, maybe inside the host's own code."""
    _retired.put((host, list(networks)))  # SimpleQueue.put: safe from a finalizer


def _start_janitor() -> None:
    """One more graph on a host: the janitor runs until every such graph's networks are
    unloaded, so no thread outlives the graphs it serves."""
    global _on_hosts
    with _janitor_lock:
        _on_hosts += 1
        if _on_hosts == 1:
            threading.Thread(target=_unload_retired, name="prism-torch-janitor",
                             daemon=True).start()


def _unload_retired() -> None:
    global _on_hosts
    while True:
        host, networks = _retired.get()
        for name in networks:
            remove_network(host, name)
        with _janitor_lock:
            _on_hosts -= 1
            if _on_hosts == 0:
                return


def reports() -> list[GraphReport]:
    """The reports of the graphs compiled in this process and still alive, oldest first."""
    return [g.report for g in sorted(_live, key=lambda g: g.number)]


@contextmanager
def collecting() -> Iterator[list[GraphReport]]:
    """Within the block, compiled graphs hand their reports to the list it yields and
    print nothing (a dry run included)."""
    previous = getattr(_collecting, "reports", None)
    _collecting.reports = []
    try:
        yield _collecting.reports
    finally:
        _collecting.reports = previous
