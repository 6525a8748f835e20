"""The Ray cluster `ray` devices run on: joined, or started here and stopped after.

    use_address("auto")      # prism ... --ray-address auto: join a running cluster
    ray = acquire()          # each ray device, when it opens: connect once per process
    release()                # when it closes: the last one stops a cluster started here

Ray is imported here, on the first `acquire`, and nowhere else in the runtime, so a
process with no ray device never loads it. Ray connects once per process: if the caller
(a test session, a user's script) already called `ray.init`, that cluster is used and
left running.
"""

from __future__ import annotations

import logging
import os
import threading
from types import ModuleType

from runtime.errors import DeviceSpecError, first_line

_lock = threading.Lock()
_address: str | None = None  # None: start a local cluster
_users = 0  # ray devices open now
_owned = False  # whether this process started the cluster (and so stops it)


def use_address(address: str | None) -> None:
    """Join the cluster at `address` ("auto": the one this machine runs) from now on,
    rather than starting a local one."""
    global _address
    _address = address or None


def acquire() -> ModuleType:
    """The `ray` module, connected; one more device holds the cluster."""
    global _users, _owned
    try:
        import ray
    except ImportError:
        raise DeviceSpecError("ray devices need the ray package: pip install "
                              "'prism-runtime[ray]'") from None
    with _lock:
        if not ray.is_initialized():
            try:  # quiet: the actors' output and Ray's info lines stay in Ray's logs
                if _address is None:
                    ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False,
                             logging_level=logging.ERROR, log_to_driver=False)
                else:
                    ray.init(address=_address, logging_level=logging.ERROR,
                             log_to_driver=False)
            except Exception as exc:
                where = f"the Ray cluster at {_address}" if _address else "a local Ray cluster"
                raise DeviceSpecError(f"cannot start or join {where}: {first_line(exc)}"
                                      ) from None
            _owned = _address is None
        _users += 1
    return ray


def release() -> None:
    """One device fewer; the last one stops a cluster this process started."""
    global _users, _owned
    with _lock:
        _users = max(0, _users - 1)
        if _users or not _owned:
            return
        _owned = False
        import ray

        ray.shutdown()
