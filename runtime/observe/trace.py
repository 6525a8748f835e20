"""A run as a Chrome trace (the Trace Event Format's JSON object form), which Perfetto and
chrome://tracing open.

`ChromeTrace(bus)` subscribes to what a trace shows and keeps it; `trace(plans)` builds the
document: one process per device (named by a metadata event), a complete slice (`X`) per
partition run on it, a flow (`s` on the producer's slice, `f` on the consumer's, one id)
for every copy a request made from one device to another, and counters (`C`): the host's
queue depth and active requests, and each device's memory. The plans say which partition
feeds which; times are microseconds from the first event kept.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping
from typing import Any

from runtime.observe.events import Event, EventBus
from runtime.partition.plan import Plan

KINDS = ("partition.run.finished", "queue.depth", "device.memory")
HOST_PID = 0  # the process the host's own counters live in
KEEP = 1_000_000  # events kept; beyond, the oldest go (a `bus.lost` says how many)


def _producers(plan: Plan) -> dict[str, set[str]]:
    """partition -> the partitions whose outputs it reads."""
    made_by = {t: p.name for p in plan.partitions for t in p.outputs}
    return {p.name: {made_by[t] for t in p.inputs if t in made_by and made_by[t] != p.name}
            for p in plan.partitions}


class ChromeTrace:
    def __init__(self, bus: EventBus, keep: int = KEEP):
        self._subscription = bus.subscribe(maxlen=keep, kinds=KINDS)
        self._events: list[Event] = []
        self.lost = 0

    def collect(self) -> None:
        """Take what the bus has published since the last call (call it now and then on a
        long run: the subscription keeps at most `keep`)."""
        for event in self._subscription.drain():
            if event.kind == "bus.lost":
                self.lost += event["lost"]
            else:
                self._events.append(event)

    def close(self) -> None:
        self.collect()
        self._subscription.close()

    def trace(self, plans: Mapping[str, Plan]) -> dict[str, Any]:
        self.collect()
        events = self._events
        t0 = min((e.ts - e.get("run_seconds", 0.0) for e in events), default=0.0)
        pids: dict[str, int] = {}

        def pid(device: str) -> int:
            return pids.setdefault(device, len(pids) + 1)

        def us(seconds: float) -> float:
            return round((seconds - t0) * 1e6, 3)

        out: list[dict[str, Any]] = []
        runs: dict[tuple[str, Any], dict[str, tuple[float, float, str]]] = {}
        for e in events:
            if e.kind == "partition.run.finished":
                start, device = e.ts - e["run_seconds"], e["device"]
                out.append({"ph": "X", "name": e["partition"], "cat": e["network"],
                            "ts": us(start), "dur": round(e["run_seconds"] * 1e6, 3),
                            "pid": pid(device), "tid": 1,
                            "args": {"request": e["request"],
                                     "queue_wait_us": round(e["queue_wait"] * 1e6, 3)}})
                runs.setdefault((e["network"], e["request"]), {})[e["partition"]] = (
                    start, e.ts, device)
            elif e.kind == "queue.depth":
                out.append({"ph": "C", "name": "queue", "ts": us(e.ts), "pid": HOST_PID,
                            "args": {"depth": e["depth"], "active": e["active"]}})
            else:  # device.memory
                out.append({"ph": "C", "name": "memory", "ts": us(e.ts), "pid": pid(e["device"]),
                            "args": {"used_bytes": e["used_bytes"]}})
        out.extend(self._flows(runs, {n: _producers(p) for n, p in plans.items()}, pid, us))
        names = [("host", HOST_PID), *pids.items()]
        out.extend({"ph": "M", "name": "process_name", "pid": number, "tid": 0,
                    "args": {"name": name}} for name, number in names)
        return {"traceEvents": out, "displayTimeUnit": "ms",
                "otherData": {"producer": "prism", "events_lost": self.lost}}

    @staticmethod
    def _flows(runs: Mapping[tuple[str, Any], Mapping[str, tuple[float, float, str]]],
               producers: Mapping[str, Mapping[str, set[str]]], pid, us) -> list[dict]:
        """A flow per cross-device copy: from just inside the producer's slice to just
        inside the consumer's, so each end binds to its slice."""
        out: list[dict] = []
        ids = itertools.count(1)
        for (network, request), ran in runs.items():
            for consumer, (start, _, device) in ran.items():
                for producer in sorted(producers.get(network, {}).get(consumer, ())):
                    if producer not in ran or ran[producer][2] == device:
                        continue
                    _, end, source = ran[producer]
                    flow = {"name": "copy", "cat": network, "id": next(ids), "tid": 1,
                            "args": {"request": request, "from": producer, "to": consumer}}
                    out.append({**flow, "ph": "s", "ts": us(end) - 0.001, "pid": pid(source)})
                    out.append({**flow, "ph": "f", "bp": "e", "ts": us(start) + 0.001,
                                "pid": pid(device)})
        return out

    def write(self, path: str | os.PathLike[str], plans: Mapping[str, Plan]) -> int:
        """Write the trace; returns how many trace events it holds."""
        document = self.trace(plans)
        with open(path, "w", encoding="utf-8") as file:
            json.dump(document, file, separators=(",", ":"))
        return len(document["traceEvents"])
