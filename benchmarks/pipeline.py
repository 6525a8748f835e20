"""Pipelining over sim devices: achieved throughput against the plan's ideal."""

from __future__ import annotations

from benchmarks.common import result
from benchmarks.serving import closed_loop
from runtime.devices import parse_devices

# A modest accelerator, so a stage takes about two milliseconds: long next to Prism's
# per-run cost, short enough to run thousands of requests in a few seconds.
SIM = "sim:4:flops=10G:bw=10G:link=10G"


def run(quick: bool = False) -> list[dict]:
    achieved, _, plan = closed_loop(parse_devices(SIM), "sample_models/cnn.onnx", 32,
                                    300 if quick else 2000)
    ideal = 1.0 / plan.bottleneck_seconds
    ratio = achieved / ideal
    return [result("4 sim devices, balanced cnn, 32 in flight: throughput / ideal", ratio, "x",
                   ">= 0.90", ratio >= 0.90,
                   f"{achieved:.0f}/s of ideal {ideal:.0f}/s (1 / bottleneck); {SIM}")]
