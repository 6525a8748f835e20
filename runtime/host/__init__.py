"""The host: HostManager, the public face of the runtime (after Glow's HostManager).

It owns the networks as it serves them, admits requests (one admission check for every
path), holds the slots and the queue (`dispatch`), runs a one-partition request on the
caller's thread (`lean`), batches (`batching`) and times requests out (`deadlines`).
Loading is the provisioner's (`runtime.provision`), running a request over a plan the
executor's (`runtime.executor`).
"""

from typing import TYPE_CHECKING

from runtime.lazy import lazy_names

if TYPE_CHECKING:
    from runtime.host.manager import HostManager, HostStats

__all__ = ["HostManager", "HostStats"]

__getattr__ = lazy_names(__name__, dict.fromkeys(__all__, "runtime.host.manager"))
