"""`/metrics`: the host's event bus, aggregated on a thread of its own into Prometheus text.

Triton's families keep Triton's names and labels (`model`, `version`; failures also by
`reason`), so dashboards built for Triton read Prism. Counters in microseconds are sums
over requests, as Triton's are:

    nv_inference_request_success / _failure        requests ended (failure: by reason)
    nv_inference_count / nv_inference_exec_count   rows inferred / executions (a batch: one)
    nv_inference_request_duration_us               queued to answered
    nv_inference_queue_duration_us                 waiting for a slot or a batch
    nv_inference_compute_infer_duration_us         started to answered (partitions, copies)
    nv_inference_pending_request_count             queued, not started (a gauge)

What Triton cannot break out, under `prism_`: per partition and device run time
(a histogram) and device queue wait, device busy time, planned transfer bytes between
devices, device memory, the host's queue depth and active slots, and events this
aggregator lost (the bus drops a slow subscriber's oldest events and says how many).
"""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import Metric
from prometheus_client.process_collector import ProcessCollector

from runtime.observe.events import Event, EventBus

KINDS = ("request.", "partition.run.finished", "device.memory", "queue.depth")
REASONS = {"RequestTimeoutError": "REJECTED", "CancelledError": "CANCELED",
           "ExecutionError": "BACKEND"}  # Triton's failure reasons; anything else: OTHER
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TRITON_COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached "
                                "requests)"),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in "
                                         "microseconds (includes cached requests)"),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds "
                                       "(includes cached requests)"),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in "
                                               "microseconds (does not include cached "
                                               "requests)"))
# prometheus-client names a counter's family NAME_total; Triton's counters have no suffix
_TOTAL = re.compile(rb"^(# (?:HELP|TYPE) nv_\w+)_total ", re.M)
RUN_BUCKETS = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
               0.1, 0.25, 0.5, 1.0, 2.5)


class _Triton:
    """Triton's per-model families, summed here and written by `collect`."""

    def __init__(self) -> None:
        self.sums: dict[str, defaultdict[tuple[str, str], float]] = {
            name: defaultdict(float) for name, _ in _TRITON_COUNTERS}
        self.failures: defaultdict[tuple[str, str, str], int] = defaultdict(int)
        self.rejected: defaultdict[tuple[str, str, str], int] = defaultdict(int)
        self.pending: dict[tuple[str, str], set[int]] = defaultdict(set)
        self.last: dict[tuple[str, str], float] = {}  # wall seconds of the last answer
        # (model, version, requests an execution held) -> [executions, compute seconds]
        self.batches: defaultdict[tuple[str, str, int], list[float]] = defaultdict(
            lambda: [0.0, 0.0])

    def collect(self) -> Iterator[Metric]:
        for name, text in _TRITON_COUNTERS:
            family = Metric(name, text, "counter")
            for (model, version), value in sorted(self.sums[name].items()):
                if name == "nv_inference_exec_count":
                    value = round(value)  # a batch's members each add 1/size
                family.add_sample(name, {"model": model, "version": version}, value)
            yield family
        family = Metric("nv_inference_request_failure", "Number of failed inference requests, "
                        "all batch sizes", "counter")
        failures = self.failures.copy()
        for key, count in list(self.rejected.items()):
            failures[key] += count
        for (model, version, reason), count in sorted(failures.items()):
            family.add_sample("nv_inference_request_failure",
                              {"model": model, "version": version, "reason": reason}, count)
        yield family
        family = Metric("nv_inference_pending_request_count", "Instantaneous number of pending "
                        "requests awaiting execution per-model.", "gauge")
        for (model, version), ids in sorted(self.pending.items()):
            family.add_sample("nv_inference_pending_request_count",
                              {"model": model, "version": version}, len(ids))
        yield family


class ServerMetrics:
    """Subscribes to `bus` and folds its events into metrics every `interval` seconds on its
    own thread (and once more before each scrape). `label(network)` names the model and
    version a network serves, and the transfers a request makes (None: not a model)."""

    def __init__(self, bus: EventBus, label: Callable[[str], tuple[str, str, tuple] | None],
                 interval: float = 0.25):
        self.label = label
        disable_created_metrics()  # no NAME_created series: Triton has none
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self._triton = _Triton()
        self.registry.register(self._triton)
        self.lost = Counter("prism_metrics_events_lost", "Events the metrics aggregator lost "
                            "(it fell behind the bus)", registry=self.registry)
        by_partition = ("model", "partition", "device")
        self.partition_run = Histogram("prism_partition_run_seconds", "Run time of one "
                                       "partition on its device", by_partition,
                                       buckets=RUN_BUCKETS, registry=self.registry)
        self.partition_wait = Counter("prism_partition_device_queue_seconds", "Time partitions "
                                      "waited for their device", by_partition,
                                      registry=self.registry)
        self.device_busy = Counter("prism_device_busy_seconds", "Time each device spent "
                                   "running partitions", ("device",), registry=self.registry)
        self.transfer = Counter("prism_transfer_bytes", "Bytes copied between devices, as the "
                                "plan has them per request, by finished request",
                                ("model", "src", "dst"), registry=self.registry)
        self.memory_used = Gauge("prism_device_memory_used_bytes", "Device memory in use",
                                 ("device",), registry=self.registry)
        self.memory_total = Gauge("prism_device_memory_total_bytes", "Device memory",
                                  ("device",), registry=self.registry)
        self.queue_depth = Gauge("prism_queue_depth", "Requests waiting for a slot",
                                 registry=self.registry)
        self.active = Gauge("prism_requests_active", "Requests holding a slot",
                            registry=self.registry)
        self._lock = threading.Lock()
        self._sub = bus.subscribe(maxlen=200_000, kinds=KINDS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True,
                                        name="prism-server-metrics")
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.catch_up()

    def catch_up(self) -> None:
        with self._lock:
            for event in self._sub.drain():
                self._fold(event)

    def _fold(self, ev: Event) -> None:
        kind = ev.kind
        if kind == "partition.run.finished":
            label = self.label(ev["network"])
            model = label[0] if label else ev["network"]
            self.partition_run.labels(model, ev["partition"], ev["device"]).observe(
                ev["run_seconds"])
            self.partition_wait.labels(model, ev["partition"], ev["device"]).inc(
                max(0.0, ev["queue_wait"]))
            self.device_busy.labels(ev["device"]).inc(ev["run_seconds"])
        elif kind.startswith("request."):
            label = self.label(ev["network"])
            if label is None:
                return
            key = label[:2]
            t = self._triton
            if kind == "request.queued":
                t.pending[key].add(ev["request"])
            elif kind == "request.started":
                t.pending[key].discard(ev["request"])
                t.sums["nv_inference_exec_count"][key] += 1 / max(1, ev["batch_size"])
            elif kind == "request.finished":
                sums = t.sums
                sums["nv_inference_request_success"][key] += 1
                sums["nv_inference_count"][key] += ev.get("rows", 1)
                sums["nv_inference_request_duration_us"][key] += ev["latency"] * 1e6
                sums["nv_inference_queue_duration_us"][key] += ev["queue_wait"] * 1e6
                sums["nv_inference_compute_infer_duration_us"][key] += ev["run_seconds"] * 1e6
                t.last[key] = time.time() - (time.monotonic() - ev.ts)
                # Triton's batch size is the rows an execution ran: each of a batch's
                # requests adds its rows' share of the execution
                rows, size = ev.get("rows", 1), ev.get("batch_rows", 1)
                share = rows / size if size else 1 / max(1, ev.get("batch_size", 1))
                batch = t.batches[(*key, size)]
                batch[0] += share
                batch[1] += ev["run_seconds"] * share
                for src, dst, size in label[2]:
                    self.transfer.labels(key[0], src, dst).inc(size)
            elif kind == "request.failed":
                t.pending[key].discard(ev["request"])
                t.failures[(*key, REASONS.get(ev.get("error_type", ""), "OTHER"))] += 1
        elif kind == "device.memory":
            self.memory_used.labels(ev["device"]).set(ev["used_bytes"])
            self.memory_total.labels(ev["device"]).set(ev["total_bytes"])
        elif kind == "queue.depth":
            self.queue_depth.set(ev["depth"])
            self.active.set(ev["active"])
        elif kind == "bus.lost":
            self.lost.inc(ev["lost"])
            self._triton.pending.clear()  # some starts went missing: count afresh

    def forget(self, model: str, version: str) -> None:
        """Drop a version no longer served from Triton's families, as Triton does on
        unload (the events it left are folded first)."""
        self.catch_up()
        with self._lock:
            t = self._triton
            counts: list[dict[tuple, Any]] = [*t.sums.values(), t.pending, t.failures,
                                               t.rejected, t.last, t.batches]
            for count in counts:
                for key in [k for k in count if k[:2] == (model, version)]:
                    del count[key]

    def rejected(self, model: str, version: str, reason: str) -> None:
        """A request refused before it reached the host (queue full, bad input). Called
        on the event loop, so it takes no lock (the fold may hold one for a while): only
        the loop writes these counts."""
        self._triton.rejected[(model, version, reason)] += 1

    def model_stats(self, model: str, version: str) -> dict[str, Any]:
        """Triton's statistics extension for one model version, from the same sums as
        its `nv_inference_*` families. Prism times a request's partitions and copies as
        one (`compute_infer`); input and output handling count with no time of their own."""
        self.catch_up()
        with self._lock:
            t, key = self._triton, (model, version)
            sums = {name: t.sums[name].get(key, 0.0) for name in t.sums}
            failed = sum(n for k, n in [*t.failures.items(), *t.rejected.items()]
                         if k[:2] == key)
            batches = sorted((k[2], v) for k, v in t.batches.items() if k[:2] == key)
            last = t.last.get(key)
        ok = round(sums["nv_inference_request_success"])

        def timed(count: float, micros: float = 0.0) -> dict[str, int]:
            return {"count": round(count), "ns": round(micros * 1e3)}

        return {"name": model, "version": version,
                "last_inference": 0 if last is None else round(last * 1e3),
                "inference_count": round(sums["nv_inference_count"]),
                "execution_count": round(sums["nv_inference_exec_count"]),
                "inference_stats": {
                    "success": timed(ok, sums["nv_inference_request_duration_us"]),
                    "fail": timed(failed), "queue": timed(ok, sums[
                        "nv_inference_queue_duration_us"]),
                    "compute_input": timed(ok),
                    "compute_infer": timed(ok, sums["nv_inference_compute_infer_duration_us"]),
                    "compute_output": timed(ok), "cache_hit": timed(0), "cache_miss": timed(0)},
                "batch_stats": [{"batch_size": size, "compute_input": timed(runs),
                                 "compute_infer": timed(runs, seconds * 1e6),
                                 "compute_output": timed(runs)}
                                for size, (runs, seconds) in batches],
                "memory_usage": []}

    def render(self) -> bytes:
        self.catch_up()
        with self._lock:
            return _TOTAL.sub(rb"\1 ", generate_latest(self.registry))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self._sub.close()
