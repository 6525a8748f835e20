"""What every route reads: the host, the models it serves, the metrics, the settings."""

from __future__ import annotations

from dataclasses import dataclass

from app.server.catalog import Catalog
from app.server.event_log import EventLog
from app.server.prometheus import ServerMetrics
from app.server.repository import ModelRepository
from app.server.run_thread import RunThread
from runtime.host import HostManager
from runtime.observe.trace import ChromeTrace
from runtime.partition.plan import Plan

MAX_BODY_BYTES = 64 << 20  # Triton's default --http-max-input-size


@dataclass(frozen=True)
class ServerSettings:
    token: str | None = None  # None: no token asked for
    max_body_bytes: int = MAX_BODY_BYTES
    devices: str = ""  # the --devices spec, for a dashboard's stepper in another mode
    open_health: bool = True  # /v2/health/live and /ready answer without the token


@dataclass
class ServerState:
    host: HostManager
    catalog: Catalog
    metrics: ServerMetrics
    settings: ServerSettings
    events: EventLog
    runs: RunThread  # calls the host for the event loop
    ready: bool = False  # every model asked for at start is loaded
    closing: bool = False  # shutting down: event streams end
    trace: ChromeTrace | None = None  # a Chrome trace being taken (--trace, trace/start)

    def plans(self) -> dict[str, Plan]:
        """Every loaded network's plan (what a trace's flows follow)."""
        return {name: self.host.plan(name) for name in self.host.networks()}

    @classmethod
    def open(cls, host: HostManager, repository: ModelRepository | None = None,
             settings: ServerSettings | None = None) -> ServerState:
        """Subscribe the metrics first, so they see every model load."""
        catalog = Catalog(host, repository)

        def label(network: str) -> tuple[str, str, tuple] | None:
            served = catalog.of_network(network)
            return None if served is None else (served.name, served.version, served.transfers)

        metrics = ServerMetrics(host.bus, label)
        catalog.on_removed, catalog.on_gone = metrics.catch_up, metrics.forget
        return cls(host, catalog, metrics, settings or ServerSettings(), EventLog(host.bus),
                   RunThread(host))

    def close(self) -> None:
        self.ready, self.closing = False, True
        self.runs.close()
        self.metrics.close()
        self.events.close()
        if self.trace is not None:
            self.trace.close()
