"""LiveView -> the pandas frames the live page draws. Pure functions, no Streamlit."""

from __future__ import annotations

import numpy as np
import pandas as pd

from app.live import LiveView
from runtime.units import human_bytes

MS = 1e3


def compact_bytes(n: float) -> str:
    """Like human_bytes, without a decimal once the figure has two digits: 217 KB."""
    text = human_bytes(n)
    number, _, unit = text.partition(" ")
    return f"{float(number):.0f} {unit}" if float(number) >= 10 else text


def devices_frame(view: LiveView) -> pd.DataFrame:
    """One row per device: memory used (bar and text) and utilisation (bar)."""
    util = view.metrics.devices
    rows = []
    for name, d in view.devices.items():
        share = d.used_bytes / d.total_bytes if d.total_bytes else 0.0
        rows.append({
            "device": name,
            "memory": round(100 * share, 1),
            "used": f"{compact_bytes(d.used_bytes)}/{compact_bytes(d.total_bytes)}",
            "utilisation": round(100 * (util[name].utilisation if name in util else 0.0), 1),
        })
    return pd.DataFrame(rows, columns=["device", "memory", "used", "utilisation"])


def partitions_frame(view: LiveView) -> pd.DataFrame:
    """One row per partition of the running plan: run-time percentiles in ms."""
    stats = {p.partition: p for p in view.metrics.partitions.values()
             if p.network == view.network}
    rows = []
    for p in view.plan.partitions if view.plan else ():
        s = stats.get(p.name)
        rows.append({
            "partition": f"{p.name} @ {p.device}",
            "nodes": len(p.nodes),
            "runs": s.count if s else 0,
            "p50 ms": s.p50 * MS if s else 0.0,
            "p95 ms": s.p95 * MS if s else 0.0,
            "p99 ms": s.p99 * MS if s else 0.0,
            "wait ms": s.mean_queue_wait * MS if s else 0.0,
            "est ms": p.est_seconds * MS,
        })
    return pd.DataFrame(rows, columns=["partition", "nodes", "runs", "p50 ms", "p95 ms",
                                       "p99 ms", "wait ms", "est ms"])


def latency_long(parts: pd.DataFrame) -> pd.DataFrame:
    """One row per partition and percentile (columns partition, percentile, ms)."""
    long = parts.melt(id_vars="partition", value_vars=["p50 ms", "p95 ms", "p99 ms"],
                      var_name="percentile", value_name="ms")
    long["percentile"] = long["percentile"].str.removesuffix(" ms")
    return long


def queue_depth_series(view: LiveView, bucket: float = 1.0) -> pd.DataFrame:
    """Deepest queue in each `bucket` seconds (columns seconds ago, queued)."""
    points = view.metrics.queue_depth
    if not points:
        return pd.DataFrame({"seconds ago": [0.0], "queued": [0]})
    t = np.fromiter((p[0] for p in points), float, len(points)) - view.metrics.now
    d = np.fromiter((p[1] for p in points), int, len(points))
    bins = np.floor(t / bucket) * bucket
    frame = pd.DataFrame({"seconds ago": bins, "queued": d})
    return frame.groupby("seconds ago", sort=True, as_index=False).max()


def throughput_series(view: LiveView) -> pd.DataFrame:
    """Requests finished per second (columns seconds ago, req/s)."""
    series = view.metrics.throughput_series
    if not series:
        return pd.DataFrame({"seconds ago": [0.0], "req/s": [0.0]})
    return pd.DataFrame({"seconds ago": [round(t - view.metrics.now, 1) for t, _ in series],
                         "req/s": [c for _, c in series]})
