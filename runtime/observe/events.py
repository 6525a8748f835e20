"""The event bus: every runtime step published as a small immutable record.

Publishing never blocks and costs one attribute check with no subscriber. Each subscriber
has its own bounded buffer; a full buffer drops its oldest event, and the next `drain()`
starts with a synthetic `bus.lost` event saying how many were dropped. UIs poll `drain()`
on their own timer, so no consumer code ever runs on a runtime thread.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TextIO

from runtime.errors import PrismError

EVENT_KINDS: dict[str, tuple[str, ...]] = {
    "network.loaded": ("network", "mode", "partitions", "devices", "nodes"),
    "partition.step": ("network", "index", "step", "reason", "partition", "device", "nodes"),
    "partition.planned": ("network", "mode", "partitions", "bottleneck_seconds",
                          "lower_bound_seconds", "costs"),
    # a plan serving learnt from its partitions' run times (runtime/host/learning.py):
    # their medians, and whether it was re-made (`moved`) or only re-estimated, and why
    "plan.learned": ("network", "moved", "reason", "medians", "bottleneck_seconds"),
    # the first load of a network measures its nodes on this machine: how far it has got
    "cost.measure": ("network", "what", "done", "total"),
    "provision.loaded": ("network", "partition", "device", "weight_bytes", "activation_bytes",
                         "seconds"),
    "provision.evicted": ("network", "partition", "device", "bytes"),
    "device.memory": ("device", "used_bytes", "total_bytes"),
    # a device in another process: its worker died (runs in flight on it failed), and
    # its replacement holds every program again
    "device.lost": ("device", "node", "error", "in_flight", "partitions"),
    "device.restored": ("device", "node", "seconds", "partitions"),
    "request.queued": ("network", "request", "priority", "queue_depth"),
    "request.started": ("network", "request", "queue_wait", "batch_size"),
    "partition.run.started": ("network", "request", "partition", "device"),
    "partition.run.finished": ("network", "request", "partition", "device", "queue_wait",
                               "run_seconds"),
    "request.finished": ("network", "request", "latency", "queue_wait", "run_seconds",
                         "batch_size"),
    "request.failed": ("network", "request", "error", "partition", "device"),
    # its device was lost under it: it runs once more on another replica
    "request.retried": ("network", "request", "error", "partition", "device"),
    "queue.depth": ("depth", "active"),
    "device.worker.replaced": ("device", "error"),
    # training (runtime/train): a run's settings and stages, each step, each stage's
    # forward, backward or update of a micro-batch on its device, each epoch, the end
    "train.started": ("network", "schedule", "micro_batches", "batch_size", "epochs",
                      "steps_per_epoch", "stages"),
    "train.step.started": ("network", "epoch", "step"),
    "train.stage.finished": ("network", "epoch", "step", "stage", "device", "phase",
                             "micro_batch", "start", "seconds", "held_bytes"),
    "train.step.finished": ("network", "epoch", "step", "loss", "seconds", "ideal_seconds",
                            "bubble", "peak_activation_bytes"),
    "train.epoch.finished": ("network", "epoch", "loss", "seconds", "steps"),
    "train.finished": ("network", "epochs", "loss", "step_seconds", "ideal_step_seconds",
                       "bubble"),
    "train.failed": ("network", "error"),
    "bus.lost": ("lost",),
}
"""The catalogue: kind -> fields every publisher of that kind sets (more may be added)."""

_monotonic = time.monotonic


class EventLogError(PrismError, ValueError):
    """A JSON-lines event log holds a line that is not an event."""


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):  # numpy scalars and arrays
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON-serialisable")


@dataclass(frozen=True, slots=True)
class Event:
    kind: str
    ts: float
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if type(self.fields) is not MappingProxyType:
            object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))

    def __reduce__(self) -> tuple[Any, ...]:  # a mappingproxy does not pickle
        return (Event, (self.kind, self.ts, dict(self.fields)))

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def to_json(self) -> str:
        if "kind" in self.fields or "ts" in self.fields:
            raise ValueError(f"{self.kind} event has a field named 'kind' or 'ts'")
        return json.dumps({"kind": self.kind, "ts": self.ts, **self.fields},
                          separators=(",", ":"), default=_json_default)

    @classmethod
    def from_json(cls, line: str) -> Event:
        d = json.loads(line)
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object, got {type(d).__name__}")
        kind, ts = d.pop("kind", None), d.pop("ts", None)
        if not isinstance(kind, str):
            raise ValueError("missing or non-string 'kind'")
        if isinstance(ts, bool) or not isinstance(ts, int | float):
            raise ValueError("missing or non-numeric 'ts'")
        return cls(kind, float(ts), MappingProxyType(d))


class Subscription:
    """One subscriber's bounded buffer. Create with `EventBus.subscribe`."""

    def __init__(self, bus: EventBus, maxlen: int, kinds: Iterable[str] | None) -> None:
        if maxlen < 1:
            raise ValueError(f"subscription maxlen must be >= 1, got {maxlen}")
        self.maxlen = maxlen
        self._bus = bus
        self._buf: deque[Event] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self._lost = 0
        self._pending_lost = 0
        self._lost_ts = 0.0
        names = None if kinds is None else tuple(kinds)
        self._all = names is None
        self._exact = frozenset(k for k in names or () if not k.endswith("."))
        self._prefixes = tuple(k for k in names or () if k.endswith("."))
        self._cache: dict[str, bool] = {}
        self.closed = False

    def _accepts(self, kind: str) -> bool:
        if self._all:
            return True
        hit = self._cache.get(kind)
        if hit is None:
            hit = kind in self._exact or kind.startswith(self._prefixes)
            if len(self._cache) < 4096:
                self._cache[kind] = hit
        return hit

    def _push(self, ev: Event) -> None:
        with self._lock:
            buf = self._buf
            if len(buf) == self.maxlen:
                self._lost += 1
                self._pending_lost += 1
                self._lost_ts = buf[0].ts
            buf.append(ev)

    def drain(self, limit: int | None = None) -> list[Event]:
        """Buffered events, oldest first; a `bus.lost` event leads if any were dropped.

        `limit` bounds the length of the returned list, the `bus.lost` event included.
        """
        if limit is not None and limit <= 0:
            return []
        with self._lock:
            buf, lost = self._buf, self._pending_lost
            out = [Event("bus.lost", self._lost_ts, {"lost": lost})] if lost else []
            self._pending_lost = 0
            if limit is None or limit - len(out) >= len(buf):
                out.extend(buf)
                buf.clear()
            else:
                out.extend(buf.popleft() for _ in range(limit - len(out)))
        return out

    @property
    def lost(self) -> int:
        """Events dropped since subscribing."""
        return self._lost

    def __len__(self) -> int:
        return len(self._buf)

    def close(self) -> None:
        """Stop receiving; events already buffered can still be drained."""
        if not self.closed:
            self.closed = True
            self._bus._unsubscribe(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventBus:
    def __init__(self) -> None:
        self._subs: tuple[Subscription, ...] = ()
        self._lock = threading.Lock()
        self.active = False  # anyone subscribed? publishers may skip costly fields if not

    def publish(self, kind: str, /, **fields: Any) -> None:
        subs = self._subs  # copy-on-write tuple: no lock on the hot path
        if not subs:
            return
        ev = None
        for sub in subs:
            if sub._accepts(kind):
                if ev is None:
                    ev = Event(kind, _monotonic(), MappingProxyType(fields))
                sub._push(ev)

    def subscribe(self, maxlen: int = 10_000,
                  kinds: Iterable[str] | None = None) -> Subscription:
        """Subscribe to every kind, or to `kinds`: exact kinds or prefixes ending in '.'."""
        sub = Subscription(self, maxlen, kinds)
        with self._lock:
            self._subs = (*self._subs, sub)
            self.active = True
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subs = tuple(s for s in self._subs if s is not sub)
            self.active = bool(self._subs)

    @property
    def subscribers(self) -> int:
        return len(self._subs)


def write_jsonl(events: Iterable[Event], fp: TextIO) -> int:
    """Write one JSON line per event; returns how many were written."""
    n = 0
    for ev in events:
        fp.write(ev.to_json() + "\n")
        n += 1
    return n


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[Event]:
    """Events from a JSON-lines file, in file order; blank lines are skipped."""
    with open(path, encoding="utf-8") as fp:
        for lineno, line in enumerate(fp, 1):
            if not line.strip():
                continue
            try:
                yield Event.from_json(line)
            except ValueError as e:  # JSONDecodeError is a ValueError
                raise EventLogError(f"{os.fspath(path)}:{lineno}: not an event: {e}") from None


class JsonlRecorder:
    """Appends a bus's events to a JSON-lines file from its own daemon thread.

    Starts on construction. Events that do not serialise are skipped and counted in
    `skipped`; a write error ends recording and is kept in `error`.
    """

    def __init__(self, bus: EventBus, path: str | os.PathLike[str], *, interval: float = 0.2,
                 kinds: Iterable[str] | None = None, maxlen: int = 100_000,
                 append: bool = False) -> None:
        self.path = path
        self.interval = interval
        self.written = 0
        self.skipped = 0
        self.error: BaseException | None = None
        self._fp = open(path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115
        self._sub = bus.subscribe(maxlen=maxlen, kinds=kinds)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="prism-jsonl-recorder",
                                        daemon=True)
        self._thread.start()

    @property
    def lost(self) -> int:
        return self._sub.lost

    def _write_batch(self) -> None:
        """Drain and write once; caller holds `_lock`."""
        if self._fp.closed or self.error is not None:
            return
        lines = []
        for ev in self._sub.drain():
            try:
                lines.append(ev.to_json() + "\n")
            except (TypeError, ValueError):
                self.skipped += 1
        if lines:
            try:
                self._fp.write("".join(lines))
                self._fp.flush()
            except OSError as e:
                self.error = e
                return
            self.written += len(lines)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                self._write_batch()
            if self.error is not None:
                return

    def stop(self, timeout: float = 2.0) -> bool:
        """Stop, write what is left and close the file; False if not done within `timeout`."""
        if self._stopped:
            return not self._thread.is_alive()
        self._stopped = True
        deadline = _monotonic() + timeout
        self._sub.close()
        self._stop.set()
        self._thread.join(max(0.0, deadline - _monotonic()))
        if not self._lock.acquire(timeout=max(0.0, deadline - _monotonic())):
            return False
        try:
            self._write_batch()
            self._fp.close()
        finally:
            self._lock.release()
        return not self._thread.is_alive()

    def __enter__(self) -> JsonlRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
