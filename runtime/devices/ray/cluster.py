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
import socket
import threading
from types import ModuleType

from runtime.errors import DeviceSpecError, first_line
from runtime.machine import usable_cpus

ADDRESS_ENV = "PRISM_RAY_ADDRESS"  # how the address reaches processes Prism starts
_lock = threading.Lock()
_users = 0  # ray devices open now
_owned = False  # whether this process started the cluster (and so stops it)


def use_address(address: str | None) -> None:
    """Join the cluster at `address` ("auto": the one this machine runs) from now on,
    rather than starting a local one (None: start one again). Kept in the environment,
    so `prism web`'s Streamlit process joins the same cluster."""
    if address:
        os.environ[ADDRESS_ENV] = address
    else:
        os.environ.pop(ADDRESS_ENV, None)


def acquire() -> ModuleType:
    """The `ray` module, connected; one more device holds the cluster."""
    global _users, _owned
    try:
        import ray
    except ImportError:
        raise DeviceSpecError("ray devices need the ray package: pip install "
                              "'prism-runtime[ray]'") from None
    with _lock:
        address = os.environ.get(ADDRESS_ENV) or None  # None: start a local cluster
        if not ray.is_initialized():
            try:  # quiet: the actors' output and Ray's info lines stay in Ray's logs
                if address is None:
                    ray.init(num_cpus=usable_cpus(), include_dashboard=False,
                             logging_level=logging.ERROR, log_to_driver=False)
                else:
                    _check_reachable(address)
                    ray.init(address=address, logging_level=logging.ERROR,
                             log_to_driver=False)
            except Exception as exc:
                where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
                raise DeviceSpecError(f"cannot start or join {where}: {first_line(exc)}"
                                      ) from None
            _owned = address is None
        _users += 1
    return ray


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """A HOST:PORT that answers no TCP connection fails here, in `timeout`: Ray itself
    retries it for minutes."""
    host, _, port = address.rpartition(":")
    if "://" in address or not port.isdigit():
        return  # "auto", or a client URL Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {address} ({exc.strerror or exc})"
                              ) from None


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
