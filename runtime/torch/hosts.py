"""The host a compiled graph's blocks run on: the caller's, or one this process shares.

Every graph compiled with the same `devices` spec shares one host, so a module with graph
breaks, or recompiled for a new shape, fills one set of devices (and one dashboard). The
shared hosts close when the process exits.
"""

from __future__ import annotations

import atexit
import threading

from runtime.host.manager import HostManager
from runtime.torch.options import OffloadOptions

_shared: dict[str, HostManager] = {}
_lock = threading.Lock()


def host_for(options: OffloadOptions) -> HostManager:
    """`options.host`, else the shared host of `options.device_spec` (opened now if new)."""
    if options.host is not None:
        return options.host
    spec = options.device_spec
    with _lock:
        host = _shared.get(spec)
        if host is None:
            host = _shared[spec] = HostManager(options.device_configs())
        return host


@atexit.register
def close_shared() -> None:
    with _lock:
        hosts = list(_shared.values())
        _shared.clear()
    for host in hosts:
        host.close(timeout=5.0)
