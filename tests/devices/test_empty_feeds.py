"""onnxruntime ends the process when an LSTM or GRU runs on an empty tensor (a batch of
0). Prism's runs of such a model fail instead, on the host, through a bundle's driver and
in a Ray device's worker, and everyone else is served on. Each case runs in its own interpreter:
if the guard breaks, that interpreter dies, not the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, tempfile
import numpy as np, onnx
from onnx import TensorProto as T, helper as h
from runtime.bundle.writer import compile_bundle
from runtime.devices import parse_devices
from runtime.devices.ray.actor import PartitionWorker
from runtime.driver import open_bundle
from runtime.errors import ExecutionError
from runtime.host import HostManager

op, hidden, size = sys.argv[1], 3, 4
gates = {"LSTM": 4, "GRU": 3}[op]
rng = np.random.default_rng()
weights = [h.make_tensor(n, T.FLOAT, [1, gates * hidden, k],
                         rng.standard_normal(gates * hidden * k).tolist())
           for n, k in (("W", size), ("R", hidden))]
graph = h.make_graph([h.make_node(op, ["x", "W", "R"], ["y"], hidden_size=hidden, name="rnn")],
                     "rnn", [h.make_tensor_value_info("x", T.FLOAT, ["seq", "batch", size])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["seq", 1, "batch", hidden])], weights)
model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
model.ir_version = 8
empty = {"x": np.zeros((2, 0, size), np.float32)}
good = {"x": rng.standard_normal((2, 1, size)).astype(np.float32)}

def refused(run):
    try:
        run(empty)
    except ExecutionError as exc:
        assert "empty input 'x'" in str(exc) and op in str(exc), exc
        return
    raise AssertionError("an empty batch ran")

with HostManager(parse_devices(sys.argv[2])) as host:
    host.add_network("rnn", model)
    refused(lambda f: host.run("rnn", f).result(timeout=60))
    assert host.run("rnn", good).result(timeout=60)["y"].shape == (2, 1, 1, hidden)
with tempfile.TemporaryDirectory() as tmp:
    onnx.save(model, f"{tmp}/rnn.onnx")
    bundle = compile_bundle(f"{tmp}/rnn.onnx", parse_devices("cpu:1"), f"{tmp}/rnn.prism")
    with open_bundle(bundle.path) as driver:
        refused(driver.run)
        assert driver.run(good)["y"].shape == (2, 1, 1, hidden)
worker = PartitionWorker("ray0", 1, False)  # what a Ray device's actor holds
assert worker.load("k", model.SerializeToString(), 0.0, [op]) == (None, ["y"])
status, _ = worker.run("k", 1, 0.0, empty, ())
assert status[0] and "empty input 'x'" in status[0], status
status, y = worker.run("k", 1, 0.0, good, ())
assert status[0] is None and y.shape == (2, 1, 1, hidden), status
print("served on")
"""


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_an_empty_batch_to_a_recurrent_network_fails_and_the_host_serves_on(op):
    done = subprocess.run([sys.executable, "-c", SCRIPT, op, "cpu:1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and "served on" in done.stdout, done.stderr[-2000:]
