"""Training pipelined over sim devices: a step's throughput against one device doing the
same work, the measured step against the schedule's ideal, and the activations each
schedule holds.

A chain of equal Gemm + Relu layers on `sim` devices slow enough (250 MFLOP/s) that each
stage's run lasts milliseconds, long next to Prism's per-run cost and to the real compute
behind it on this small host. Four stages and one device train the same model on the same
batches, their steps interleaved (one each, in turn) so the shared machine's load falls on
both alike; the figures are medians over the steps.
"""

from __future__ import annotations

import statistics

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from benchmarks.common import result
from runtime.devices import parse_devices
from runtime.train.optimizers import Optimizer
from runtime.train.trainer import TrainConfig, Trainer

SIM = "sim:{n}:flops=250M"
WIDTH, LAYERS, STAGES, MICRO, ROWS = 128, 16, 4, 16, 8  # rows per micro-batch
IDEAL = STAGES * MICRO / (MICRO + STAGES - 1)  # 3.37: GPipe's bound on the speed-up


def chain(width: int = WIDTH, layers: int = LAYERS, seed: int = 0) -> onnx.ModelProto:
    """x [batch, width] -> `layers` Gemm + Relu -> logits [batch, width]."""
    rng = np.random.default_rng(seed)
    nodes, weights, x = [], [], "x"
    for i in range(layers):
        bound = 1 / np.sqrt(width)
        weights += [numpy_helper.from_array(rng.uniform(-bound, bound, (width, width)).astype(
            np.float32), f"w{i}"), numpy_helper.from_array(np.zeros(width, np.float32), f"b{i}")]
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [f"g{i}"], name=f"fc{i}"))
        x = f"g{i}"
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"], name=f"relu{i}"))
            x = f"r{i}"
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                       ["batch", width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", width])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _trainer(model: onnx.ModelProto, devices: int, schedule: str, x: np.ndarray,
             y: np.ndarray) -> Trainer:
    config = TrainConfig(optimizer=Optimizer("sgd", 0.01), batch_size=ROWS * MICRO,
                         micro_batches=MICRO, schedule=schedule, seed=None)
    return Trainer(model, {"x": x}, y, parse_devices(SIM.format(n=devices)), config)


def run(quick: bool = False) -> list[dict]:
    steps = 3 if quick else 8
    model = chain()
    rng = np.random.default_rng(0)
    batch = ROWS * MICRO
    x = rng.standard_normal((batch, WIDTH)).astype(np.float32)
    y = rng.integers(0, WIDTH, batch)
    rows = np.arange(batch)
    out = []
    peaks: dict[str, tuple[int, ...]] = {}
    per_micro: list[int] = []
    for schedule in ("gpipe", "1f1b"):
        with _trainer(model, STAGES, schedule, x, y) as four, \
                _trainer(model, 1, schedule, x, y) as one:
            assert len(four.pipeline.stages) == STAGES
            per_micro = [four.pipeline.kept_bytes(k) for k in range(STAGES)]
            modelled = four.pipeline.modelled_seconds()
            reports: dict[str, list] = {"four": [], "one": []}
            for step in range(steps + 1):  # the first of each is a warm-up
                for name, trainer in (("four", four), ("one", one)):
                    report = trainer.pipeline.step(trainer._micro_batches(rows), 0.01, step)
                    if step:
                        reports[name].append(report)
        t4 = statistics.median(r.seconds for r in reports["four"])
        t1 = statistics.median(r.seconds for r in reports["one"])
        ideal = statistics.median(r.ideal_seconds for r in reports["four"])
        peaks[schedule] = tuple(max(r.peak_activation_bytes[k] for r in reports["four"])
                                for k in range(STAGES))
        speed_up = t1 / t4
        detail = (f"{STAGES} stages, {MICRO} micro-batches of {ROWS}: step {t4 * 1e3:.1f} ms "
                  f"vs {t1 * 1e3:.1f} ms on one device (ideal {IDEAL:.2f}x), median of "
                  f"{steps} interleaved steps; {SIM.format(n=STAGES)}, {LAYERS} x Gemm "
                  f"{WIDTH}")
        out.append(result(f"train, 4 sim devices, {schedule}: step throughput / one device",
                          speed_up, "x", ">= 3.0", speed_up >= 3.0, detail))
        ratio = t4 / ideal
        out.append(result(f"train, 4 sim devices, {schedule}: measured step / schedule's ideal",
                          ratio, "x", "<= 1.10", ratio <= 1.10,
                          f"measured {t4 * 1e3:.1f} ms, ideal {ideal * 1e3:.1f} ms (the "
                          f"schedule on the measured run times, no host in between; on the "
                          f"modelled times {modelled * 1e3:.1f} ms, "
                          f"{t4 / modelled:.3f}x)"))
    held = max(p / m for p, m in zip(peaks["1f1b"], per_micro, strict=True))
    out.append(result("train, 4 sim devices: 1F1B peak activations per stage, in "
                      "micro-batches", held, "micro-batches", f"<= {STAGES} (GPipe: {MICRO})",
                      held <= STAGES and all(
                          g == MICRO * m for g, m in zip(peaks["gpipe"], per_micro,
                                                         strict=True)),
                      f"per stage 1F1B {list(peaks['1f1b'])} B, GPipe {list(peaks['gpipe'])} "
                      f"B"))
    return out
