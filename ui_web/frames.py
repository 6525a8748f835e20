"""View-model rows and series as the pandas frames the live page draws. No Streamlit."""

from __future__ import annotations

import pandas as pd

from app.dashboard import DeviceRow, PartitionRow, ScheduleRow, Series, TrainingView
from runtime.units import human_bytes

MS = 1e3


def compact_bytes(n: float) -> str:
    """Like human_bytes, without a decimal once the figure has two digits: 217 KB."""
    text = human_bytes(n)
    number, _, unit = text.partition(" ")
    return f"{float(number):.0f} {unit}" if float(number) >= 10 else text


def devices_frame(rows: tuple[DeviceRow, ...]) -> pd.DataFrame:
    """One row per device: where it runs (backend, and node for a ray device), memory used
    (bar and text) and utilisation (bar), in percent."""
    return pd.DataFrame(
        [{"device": r.name if r.health == "ok" else f"{r.name} ({r.health})",
          "where": r.where, "memory": round(100 * r.memory_share, 1),
          "used": f"{compact_bytes(r.used_bytes)}/{compact_bytes(r.total_bytes)}",
          "utilisation": round(100 * r.utilisation, 1)} for r in rows],
        columns=["device", "where", "memory", "used", "utilisation"])


def partitions_frame(rows: tuple[PartitionRow, ...]) -> pd.DataFrame:
    """One row per partition of the running plan: the plan's estimate beside the measured
    run-time percentiles, in ms, and how far the estimate is off the median (%)."""
    return pd.DataFrame(
        [{"partition": f"{r.name} @ {r.device}", "nodes": r.nodes, "runs": r.runs,
          "est ms": r.est_seconds * MS, "p50 ms": r.p50 * MS,
          "est off %": None if r.off_by is None else 100 * r.off_by,
          "p95 ms": r.p95 * MS, "p99 ms": r.p99 * MS, "wait ms": r.mean_wait * MS}
         for r in rows],
        columns=["partition", "nodes", "runs", "est ms", "p50 ms", "est off %", "p95 ms",
                 "p99 ms", "wait ms"])


def schedule_frame(rows: tuple[ScheduleRow, ...]) -> pd.DataFrame:
    """A bundle's schedule table: one row per partition, tensor names comma-separated."""
    return pd.DataFrame(
        [{"partition": r.partition, "device": r.device, "reads": ", ".join(r.reads),
          "writes": ", ".join(r.writes), "after": ", ".join(r.after)} for r in rows],
        columns=["partition", "device", "reads", "writes", "after"])


def latency_long(parts: pd.DataFrame) -> pd.DataFrame:
    """One row per partition and percentile (columns partition, percentile, ms)."""
    long = parts.melt(id_vars="partition", value_vars=["p50 ms", "p95 ms", "p99 ms"],
                      var_name="percentile", value_name="ms")
    long["percentile"] = long["percentile"].str.removesuffix(" ms")
    return long


def series_frame(series: Series, column: str, scale: float = 1.0) -> pd.DataFrame:
    """A series as columns `seconds ago` and `column` (values times `scale`)."""
    return pd.DataFrame({"seconds ago": series.seconds_ago,
                         column: [v * scale for v in series.values]})


def loss_frame(view: TrainingView) -> pd.DataFrame:
    """The loss of every step so far (x: the step, counting from 1)."""
    return pd.DataFrame({"step": range(1, len(view.losses) + 1), "loss": list(view.losses)})


def timeline_frame(view: TrainingView) -> pd.DataFrame:
    """The latest step's runs, one row each: device, what it ran (F3, B3, U), from and to
    (ms since the step began)."""
    return pd.DataFrame(
        [{"device": b.device, "run": b.label, "phase": b.phase, "from ms": b.start * MS,
          "to ms": b.end * MS} for b in view.timeline],
        columns=["device", "run", "phase", "from ms", "to ms"])
