"""Measured times kept between loads, in the user's cache directory.

    cache = TimingsCache()                       # $PRISM_CACHE_DIR, else ~/.cache/prism
    timings = cache.get(graph, "ort-cpu/1")      # None the first time
    cache.put(graph, "ort-cpu/1", timings)

An entry is keyed by what the times depend on: the network's structure (its nodes, their
attributes, its tensors' types and shapes: not the weights' values), the shapes bound for
costing, the device kind (`model.kind_of`: onnxruntime on CPU at a thread count), Prism's
and onnxruntime's versions and the CPU model. Anything else (a new onnxruntime, another
machine) misses, and the network is measured again. A damaged or unreadable entry is a
miss too; a cache that cannot be written is skipped (the plan is made all the same).
The directory and its files: `runtime/user_cache.py`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import platform
from pathlib import Path

from runtime.cost.model import Timings
from runtime.graph import Graph
from runtime.user_cache import cache_dir, read_entry, write_entry
from runtime.versions import installed, versions

FORMAT = 2  # 2: a node computed from weights alone takes no share of its run's time


@functools.cache
def cpu_model() -> str:
    """The processor's model name (`/proc/cpuinfo` on Linux), else what platform says."""
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        for line in text.splitlines():
            if line.lower().startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine() or "unknown"


def fingerprint(graph: Graph) -> str:
    """The network's structure and bound shapes, not its weights' values."""
    digest = hashlib.sha256()
    for node in graph.model.graph.node:
        digest.update(node.SerializeToString(deterministic=True))
    for name in sorted(graph.tensors):
        t = graph.tensors[name]
        digest.update(f"{name}|{t.dtype}|{t.shape}|{graph.is_weight(name)}\n".encode())
    digest.update(json.dumps(sorted(graph.bindings.items())).encode())
    return digest.hexdigest()


def _machine() -> list[str]:
    """What every entry depends on besides the network: versions and the processor."""
    ours = versions(())
    return [ours["prism"], installed("onnxruntime"), ours["python"], cpu_model(), str(FORMAT)]


class TimingsCache:
    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else cache_dir()

    def key(self, graph: Graph, kind: str) -> str:
        context = [fingerprint(graph), kind, *_machine()]
        return hashlib.sha256("\n".join(context).encode()).hexdigest()[:32]

    def hop_path(self, kind: str) -> Path:
        digest = hashlib.sha256("\n".join(["hop", kind, *_machine()]).encode()).hexdigest()
        return self.directory / "costs" / f"hop-{digest[:32]}.json"

    def get_hop(self, kind: str) -> float | None:
        """The dispatch seconds measured for devices of `kind` (`ort-cpu/1`) on this machine."""
        try:
            return float(read_entry(self.hop_path(kind))["seconds"])
        except (KeyError, TypeError, ValueError):
            return None

    def put_hop(self, kind: str, seconds: float) -> Path | None:
        return write_entry(self.hop_path(kind), {"format": FORMAT, "kind": kind,
                                                 "cpu": cpu_model(), "seconds": seconds})

    def path(self, graph: Graph, kind: str) -> Path:
        return self.directory / "costs" / f"{self.key(graph, kind)}.json"

    def get(self, graph: Graph, kind: str) -> Timings | None:
        try:
            return Timings.from_dict(read_entry(self.path(graph, kind))["timings"])
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def put(self, graph: Graph, kind: str, timings: Timings) -> Path | None:
        """Store the times (atomically: a reader sees the old file or the new); the path,
        or None when the cache cannot be written."""
        entry = {"format": FORMAT, "network": graph.name, "kind": kind, "cpu": cpu_model(),
                 "onnxruntime": installed("onnxruntime"), "prism": versions(())["prism"],
                 "timings": timings.to_dict()}
        return write_entry(self.path(graph, kind), entry)
