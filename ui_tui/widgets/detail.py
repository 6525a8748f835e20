"""What a selected partition holds: device, nodes, inputs, outputs, weights and latency."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from app.dashboard import PartitionRow
from runtime.partition import Partition
from runtime.units import human_bytes, human_seconds
from ui_tui.paint import chip_style, seconds, set_text


def _names(values: tuple[str, ...], limit: int = 6) -> str:
    shown = ", ".join(values[:limit])
    return shown + (f", … {len(values) - limit} more" if len(values) > limit else "") or "–"


def detail_text(p: Partition, color: str, lat: PartitionRow | None) -> Text:
    text = Text()
    text.append(f" {p.name} ", style=chip_style(color, bold=True))
    text.append(f" on {p.device} ({p.backend}) · {len(p.nodes)} nodes · est "
                f"{human_seconds(p.est_seconds)}\n")
    text.append("latency ", style="bold")
    if lat is not None and lat.runs:
        text.append(f"p50 {seconds(lat.p50)} p95 {seconds(lat.p95)} p99 {seconds(lat.p99)} "
                    f"last {seconds(lat.last)} · {lat.runs:,} runs\n")
    else:
        text.append("no runs yet\n", style="dim")
    text.append("weights ", style="bold")
    text.append(f"{human_bytes(p.weight_bytes)} ({len(p.weights)}) · activations "
                f"{human_bytes(p.activation_bytes)}\n")
    text.append("in  ", style="bold")
    text.append(_names(p.inputs) + "\n")
    text.append("out ", style="bold")
    text.append(_names(p.outputs) + "\n")
    text.append("nodes ", style="bold")
    text.append(", ".join(p.nodes))
    return text


class PartitionDetail(Static):
    def show(self, p: Partition | None, color: str, lat: PartitionRow | None) -> None:
        set_text(self, detail_text(p, color, lat) if p is not None
                 else Text("select a partition in the DAG (↑/↓ or click)", style="dim"))
