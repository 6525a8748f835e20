"""What a remote dashboard reads (`app.remote.RemoteSource`): the event stream and three
queries.

- `GET /v2/prism/events[?after=N][&window=S]`: server-sent events, one per bus event (`id:`
  its number, `data:` the event as JSON, as the recorder writes it), resuming after `N` or
  the `Last-Event-ID` header (default: from the first event kept). A response lasts
  `window` seconds (default 10, at most 60) and the client reconnects where it left off,
  as an EventSource does, so no stream outlives a shutdown.
- `GET /v2/prism/networks`: each network's plan, graph outline, mode, devices and bundle.
- `GET /v2/prism/networks/{network}/steps?mode=M`: the partitioner's steps in mode `M`.
- `GET /v2/prism/devices`: each device's counts, and the server's clock (`now`).
- `POST /v2/prism/trace/start`, `.../trace/stop`: take a Chrome trace (`runtime/observe/trace.py`)
  of what is served in between; stop answers with the trace's JSON.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import asdict

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from app.dashboard.source import MODES, PartitionSteps
from app.server.routes.body import json_response
from app.server.state import ServerState
from runtime.bundle.contents import open_contents
from runtime.errors import PrismError
from runtime.observe.trace import ChromeTrace
from runtime.partition.dot import Outline

PREFIX = "/v2/prism"
POLL_SECONDS = 0.05
WINDOW_SECONDS, MAX_WINDOW_SECONDS = 10.0, 60.0


def _number(request: Request, name: str, default: float, low: float, high: float) -> float:
    text = request.query_params.get(name)
    try:
        value = default if text is None else float(text)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:
        raise HTTPException(400, f"{name} must be a number from {low:g} to {high:g}, got {text!r}")
    return value


def outline_dict(outline: Outline) -> dict:
    return {"name": outline.name, "ops": outline.ops, "edges": outline.edges,
            "sizes": outline.sizes}


def routes(state: ServerState) -> list[BaseRoute]:
    host, log = state.host, state.events

    async def events(request: Request) -> Response:
        resume = request.headers.get("last-event-id") or request.query_params.get("after")
        try:
            after = int(resume) if resume is not None else 0
        except ValueError:
            raise HTTPException(400, f"after must be an event number, got {resume!r}") from None
        window = _number(request, "window", WINDOW_SECONDS, 0.0, MAX_WINDOW_SECONDS)

        async def stream(after: int) -> AsyncIterator[bytes]:
            end = time.monotonic() + window
            while True:
                lines = []
                for number, event in log.since(after):
                    lines.append(f"id: {number}\ndata: {event.to_json()}\n\n")
                    after = max(after, number)
                if lines:
                    yield "".join(lines).encode()
                if time.monotonic() >= end or state.closing:
                    return
                await asyncio.sleep(POLL_SECONDS)

        return StreamingResponse(stream(after), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    def network(name: str) -> dict:
        plan = host.plan(name)
        origin = host.bundle(name)
        served = state.catalog.of_network(name)
        return {"network": name, "model": str(served.source) if served else name,
                "mode": plan.mode, "devices": ",".join(d.name for d in plan.devices),
                "plan": plan.to_dict(), "outline": outline_dict(Outline.of(host.graph(name))),
                "bundle": None if origin is None else {
                    "path": str(origin.path), "manifest": origin.manifest,
                    "placed": dict(origin.devices)}}

    async def networks(request: Request) -> Response:
        return json_response(await asyncio.to_thread(
            lambda: [network(name) for name in host.networks()]))

    async def steps(request: Request) -> Response:
        name, mode = request.path_params["network"], request.query_params.get("mode", "")
        if mode not in MODES:
            raise HTTPException(400, f"mode must be one of {', '.join(MODES)}, got {mode!r}")

        def run() -> PartitionSteps:
            origin = host.bundle(name)
            if origin is not None and mode == host.plan(name).mode:
                return PartitionSteps.recorded(open_contents(origin.path), name)
            if not state.settings.devices:
                raise PrismError("this server was started without a device spec to "
                                 "partition in another mode")
            return PartitionSteps.run(host.graph(name), state.settings.devices, mode, name)

        try:
            found = await asyncio.to_thread(run)
        except PrismError as exc:
            raise HTTPException(400, str(exc)) from None
        return json_response({"model": found.model, "mode": found.mode,
                              "devices": found.devices,
                              "steps": [step.to_dict() for step in found.steps],
                              "plan": found.plan.to_dict(),
                              "outline": outline_dict(found.outline)})

    async def devices(request: Request) -> Response:
        return json_response({"now": time.monotonic(), "last_event": log.last, "devices": {
            name: asdict(device.stats()) for name, device in host.devices.items()}})

    async def trace_start(request: Request) -> Response:
        started = state.trace is None
        if started:
            state.trace = ChromeTrace(host.bus)
        return json_response({"tracing": True, "started": started})

    async def trace_stop(request: Request) -> Response:
        taken, state.trace = state.trace, None
        if taken is None:
            raise HTTPException(400, "no trace is being taken: POST /v2/prism/trace/start")
        document = await asyncio.to_thread(lambda: taken.trace(state.plans()))
        taken.close()
        return json_response(document)

    return [Route(f"{PREFIX}/trace/start", trace_start, methods=["POST"]),
            Route(f"{PREFIX}/trace/stop", trace_stop, methods=["POST"]),
            Route(f"{PREFIX}/events", events), Route(f"{PREFIX}/networks", networks),
            Route(f"{PREFIX}/networks/{{network}}/steps", steps),
            Route(f"{PREFIX}/devices", devices)]
