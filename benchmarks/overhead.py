"""Prism's cost per request over plain onnxruntime: one cpu device, one partition; and two
cpu devices, two stages, for one caller waiting on each answer (`infer`, every stage on
its thread) and for a future from `run` (later stages on the devices' threads)."""

from __future__ import annotations

import numpy as np
import onnx

from benchmarks.common import median_seconds, relu_model, result
from runtime import DeviceConfig
from runtime.devices.ort.sessions import cpu_session, loadable
from runtime.host import HostManager
from runtime.inputs import input_specs, random_feeds


def _pair(model: onnx.ModelProto, repeats: int) -> tuple[float, float]:
    """Median latency of (plain onnxruntime, Prism), both one intra-op thread."""
    rng = np.random.default_rng()
    with HostManager([DeviceConfig(name="cpu0", backend="cpu", threads=1)]) as host:
        host.add_network("m", model, partition="balanced")
        feeds = random_feeds(input_specs(host.graph("m")), rng)
        session = cpu_session(loadable(model), threads=1)
        plain = median_seconds(lambda: session.run(None, feeds), repeats)
        prism = median_seconds(lambda: host.run("m", feeds).result(), repeats)
        plain = min(plain, median_seconds(lambda: session.run(None, feeds), repeats))
    return plain, prism


def _staged(model: onnx.ModelProto, repeats: int) -> tuple[float, float, float, int]:
    """Median latency of (plain onnxruntime at one thread, Prism's `infer`, Prism's
    `run(...).result()`) on two cpu devices of one thread, and the plan's partitions."""
    rng = np.random.default_rng()
    with HostManager([DeviceConfig(name=f"cpu{i}", backend="cpu", threads=1)
                      for i in range(2)]) as host:
        host.add_network("m", model, partition="balanced")
        feeds = random_feeds(input_specs(host.graph("m")), rng)
        session = cpu_session(loadable(model), threads=1)
        plain = median_seconds(lambda: session.run(None, feeds), repeats)
        waited = median_seconds(lambda: host.infer("m", feeds), repeats)
        future = median_seconds(lambda: host.run("m", feeds).result(), repeats)
        return plain, waited, future, len(host.plan("m").partitions)


def run(quick: bool = False) -> list[dict]:
    repeats = 300 if quick else 2000
    plain, prism = _pair(onnx.load("sample_models/transformer.onnx"), repeats)
    ratio = prism / plain
    out = [result("transformer, 1 cpu device: Prism / onnxruntime median latency", ratio, "x",
                  "<= 1.10x", ratio <= 1.10,
                  f"onnxruntime {plain * 1e6:.1f} us, Prism {prism * 1e6:.1f} us")]
    plain, prism = _pair(relu_model(), repeats * 2)
    added = (prism - plain) * 1e6
    out.append(result("single Relu, 1 cpu device: added median latency", added, "us",
                      "<= 25 us", added <= 25,
                      f"onnxruntime {plain * 1e6:.1f} us, Prism {prism * 1e6:.1f} us"))
    plain, waited, future, parts = _staged(onnx.load("sample_models/transformer.onnx"), repeats)
    out.append(result("transformer, 2 cpu devices, one caller: Prism infer / onnxruntime "
                      "median latency", waited / plain, "x", "reported", True,
                      f"onnxruntime 1 thread {plain * 1e6:.1f} us, Prism infer "
                      f"{waited * 1e6:.1f} us, run().result() {future * 1e6:.1f} us; "
                      f"{parts} partition(s)"))
    return out
