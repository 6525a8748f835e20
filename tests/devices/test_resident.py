"""Resident tensors: what a device keeps between runs (a training stage's weights and
optimizer state), read and written by the programs it runs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from runtime.devices import parse_devices
from runtime.devices.backends import open_device
from runtime.devices.device import Device, Program
from runtime.errors import DeviceMemoryError, ExecutionError, ProvisionError

F = onnx.TensorProto.FLOAT


def accumulate(shape: list[int], out_shape: list[int] | None = None) -> Program:
    """acc_next = acc + x (written back to `acc`), and y = x * 2 returned."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["acc", "x"], ["acc_next"]),
         helper.make_node("Mul", ["x", "two"], ["y"]),
         helper.make_node("Reshape", ["acc_next", "shape"], ["acc_out"])], "acc",
        [helper.make_tensor_value_info("acc", F, shape),
         helper.make_tensor_value_info("x", F, shape)],
        [helper.make_tensor_value_info("y", F, shape),
         helper.make_tensor_value_info("acc_out", F, out_shape or shape)],
        [helper.make_tensor("two", F, [], [2.0]),
         helper.make_tensor("shape", onnx.TensorProto.INT64, [len(out_shape or shape)],
                            out_shape or shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return Program(model.SerializeToString(), frozenset({"Add", "Mul", "Reshape"}), 0, 64,
                   resident=("acc",), writes=(("acc_out", "acc"),))


@pytest.fixture(params=["cpu", "sim", "reference"])
def device(request) -> Device:
    device = open_device(parse_devices(f"{request.param}:1:mem=1MB")[0])
    yield device
    device.close()


def test_a_program_reads_and_writes_what_stays_on_the_device(device: Device) -> None:
    rng = np.random.default_rng()
    device.place({"acc": np.zeros(4, np.float32)})
    device.load("acc", accumulate([4]))
    xs = [rng.standard_normal(4).astype(np.float32) for _ in range(3)]
    for x in xs:
        out = device.run_now("acc", {"x": x})
        assert out is not None and set(out) == {"y"}  # the written output stays there
        np.testing.assert_allclose(out["y"], 2 * x)
    np.testing.assert_allclose(device.fetch(["acc"])["acc"], sum(xs), rtol=1e-6)


def test_resident_bytes_are_accounted_and_refused_when_full(device: Device) -> None:
    before = device.used_bytes
    device.place({"a": np.zeros(1000, np.float32)})
    assert device.used_bytes == before + 4000
    with pytest.raises(DeviceMemoryError, match="resident tensors needs"):
        device.place({"b": np.zeros(10**6, np.float32)})
    with pytest.raises(ProvisionError, match="a is already resident"):
        device.place({"a": np.zeros(1, np.float32)})
    assert device.used_bytes == before + 4000
    assert device.release(["a"]) == 4000 and device.used_bytes == before


def test_a_program_reading_what_is_not_resident_is_refused(device: Device) -> None:
    with pytest.raises(ProvisionError, match="reads acc, which is not resident"):
        device.load("acc", accumulate([4]))


def test_a_write_that_changes_shape_fails_the_run_and_keeps_the_tensor(device: Device) -> None:
    device.place({"acc": np.ones(4, np.float32)})
    device.load("acc", accumulate([4], out_shape=[2, 2]))
    with pytest.raises(ExecutionError, match="resident acc would change"):
        device.run_now("acc", {"x": np.ones(4, np.float32)})
    np.testing.assert_array_equal(device.fetch(["acc"])["acc"], np.ones(4))
