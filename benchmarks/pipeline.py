"""Pipelining over sim devices: achieved throughput against the plan's ideal."""

from __future__ import annotations

import time

from app.loadgen import LoadGenerator
from benchmarks.common import result
from runtime.devices import parse_devices
from runtime.host import HostManager

# A modest accelerator, so a stage takes about two milliseconds: long next to Prism's
# per-run cost, short enough to run thousands of requests in a few seconds.
SIM = "sim:4:flops=10G:bw=10G:link=10G"


def sim_throughput(model: str, spec: str, clients: int, requests: int) -> tuple[float, float]:
    """(achieved requests/s, ideal 1 / bottleneck) for a balanced plan."""
    with HostManager(parse_devices(spec), max_active=clients, max_queue=4 * clients) as host:
        plan = host.add_network("m", model, partition="balanced")
        LoadGenerator(host, "m", concurrency=clients, requests=clients * 4).start().wait(60)
        load = LoadGenerator(host, "m", concurrency=clients, requests=requests)
        start = time.perf_counter()
        load.start().wait(300)
        wall = time.perf_counter() - start
        load.stop()
        if load.stats.failed:
            raise RuntimeError(f"{load.stats.failed} requests failed: {load.stats.errors[:1]}")
    return load.stats.ok / wall, 1.0 / plan.bottleneck_seconds


def run(quick: bool = False) -> list[dict]:
    achieved, ideal = sim_throughput("sample_models/cnn.onnx", SIM, 32, 300 if quick else 2000)
    ratio = achieved / ideal
    return [result("4 sim devices, balanced cnn, 32 in flight: throughput / ideal", ratio, "x",
                   ">= 0.90", ratio >= 0.90,
                   f"{achieved:.0f}/s of ideal {ideal:.0f}/s (1 / bottleneck); {SIM}")]
