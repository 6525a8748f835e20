"""The one-partition lean path: a request run on the caller's thread, its future born
finished, its outputs checked and its failures named as the general path's are; it steps
aside for a busy or closed device or a device's own thread. And request memory: an
answered request is freed without the garbage collector."""

from __future__ import annotations

import concurrent.futures as cf
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from runtime.devices import parse_devices
from runtime.errors import ExecutionError, InvalidInputError
from runtime.host import HostManager, lean
from tests.support.hosts import faked
from tests.support.serving import MLP, TRANSFORMER, WAIT, assert_same, expected, poll

# -- the lean path ---------------------------------------------------------------------------


def test_lean_path_outputs_errors_and_futures_behave_like_any_future():
    """A one-partition plan on an idle device runs on the caller's thread and returns a
    future born finished: it must work with every concurrent.futures helper, and a fault
    must still name partition and device."""
    rng = np.random.default_rng()
    with HostManager(parse_devices("cpu:1")) as host:
        plan = host.add_network("t", TRANSFORMER)
        assert len(plan.partitions) == 1
        feeds = [{"tokens": rng.standard_normal((2, 16, 64)).astype(np.float32)}
                 for _ in range(5)]
        futures = [host.run("t", f) for f in feeds]
        assert all(f.done() for f in futures), "the lean path should answer at once"
        done, pending = cf.wait(futures, timeout=WAIT)
        assert len(done) == 5 and not pending
        assert len(list(cf.as_completed(futures, timeout=WAIT))) == 5
        called = []
        futures[0].add_done_callback(called.append)
        assert called == [futures[0]] and not futures[0].cancel()
        for f, fut in zip(feeds, futures, strict=True):
            assert_same(fut.result(timeout=0), expected(TRANSFORMER, f))
    with faked("cpu:1") as host:
        [part] = host.add_network("t", TRANSFORMER).partitions
        host.devices[part.device].fail = lambda n, _: n == 2
        outcomes = [host.run("t", f) for f in feeds[:3]]
        assert all(f.done() for f in outcomes), "the lean path should answer at once"
        err = outcomes[1].exception(timeout=0)
        assert isinstance(err, ExecutionError) and f"t/{part.name}" in str(err)
        assert (err.partition, err.device) == (part.name, part.device)
        assert_same(outcomes[2].result(timeout=0), expected(TRANSFORMER, feeds[2]))
        stats = host.stats()
        assert (stats.slots_used, stats.queued, stats.outstanding) == (0, 0, {"t": 0})


def one_op(op: str, declared: list, *, shape: list[int] | None = None) -> onnx.ModelProto:
    """x [b, 4] -> `op` -> y, y declared as `declared` (Reshape: to the constant `shape`)."""
    inputs, inits = ["x"], []
    if shape is not None:
        inputs.append("shape")
        inits.append(onnx.numpy_helper.from_array(np.array(shape, np.int64), "shape"))
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"])], op.lower(),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, declared)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_the_lean_path_on_onnxruntime_checks_names_counts_and_steps_aside(monkeypatch):
    """On onnxruntime the lean path runs on the caller's thread: what comes back is checked
    against the declared outputs (a shape only a hint, as onnxruntime reads it), a failure
    names partition and device, its runs are the device's, bad feeds are refused before
    the device is waited for, and it steps aside (to the general path) for a closed device
    or a device's own thread."""
    rng = np.random.default_rng()
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("relu", one_op("Relu", ["b", 4]))
        host.add_network("narrow", one_op("Relu", ["b", 3]))  # declares fewer columns
        host.add_network("fold", one_op("Reshape", [3, "n"], shape=[3, -1]))
        device = host.devices["cpu0"]
        runs = device.stats().runs
        for rows in (1, 2, 5):
            x = rng.standard_normal((rows, 4)).astype(np.float32)
            future = host.run("relu", {"x": x})
            assert future.done(), "an idle device runs it on the caller's thread"
            np.testing.assert_array_equal(future.result(timeout=0)["y"], np.maximum(x, 0))
        assert device.stats().runs == runs + 3 and device.stats().busy_seconds > 0
        x = rng.standard_normal((2, 4)).astype(np.float32)  # a graph output's declared
        np.testing.assert_array_equal(host.infer("narrow", {"x": x})["y"], np.maximum(x, 0))
        x = rng.standard_normal((3, 4)).astype(np.float32)
        np.testing.assert_array_equal(host.infer("fold", {"x": x})["y"], x.reshape(3, -1))
        failed = host.run("fold", {"x": x[:2]}).exception(timeout=0)
        assert isinstance(failed, ExecutionError) and "cannot be reshaped" in str(failed)
        assert "\n" not in str(failed) and (failed.partition, failed.device) == ("p0", "cpu0")
        with pytest.raises(InvalidInputError, match="input 'x' of relu"):
            host.run("relu", {"x": x[:, :3]})
        assert host.run("relu", {"x": x}).done(), "refused feeds left the device held"
        monkeypatch.setattr(lean, "LEAN_WAIT", 60.0)  # were it to wait, it would wait long
        with device._running:  # the device busy: refused at once, not after waiting for it
            began = time.monotonic()
            with pytest.raises(InvalidInputError, match="input 'x' of relu"):
                host.run("relu", {"x": x[:, :3]})
            assert time.monotonic() - began < WAIT

        inner: list = []

        def again(_):  # on the device's worker: it must queue, not run here
            inner.append(host.run("relu", {"x": x}))
            inner.append(inner[0].done())

        with device._running:  # until the callback is on: it must run on the worker
            outer = host.run("relu", {"x": x}, inline=False)
            outer.add_done_callback(again)
        outer.result(timeout=WAIT)
        assert poll(lambda: len(inner) == 2) and inner[1] is False
        np.testing.assert_array_equal(inner[0].result(timeout=WAIT)["y"], np.maximum(x, 0))
        device.close(1.0)
        closed = host.run("relu", {"x": x}).exception(timeout=WAIT)
        assert isinstance(closed, ExecutionError) and "closed" in str(closed)


# -- request memory --------------------------------------------------------------------------


@pytest.mark.parametrize("batching", [None, {"max_batch_size": 4, "max_queue_delay_ms": 1}])
def test_an_answered_request_is_freed_without_the_garbage_collector(batching):
    """No reference cycle outlives a request: with the collector off, its future dies with
    the last reference to it (a cycle per request once cost a collection every few
    hundred requests)."""
    import gc
    import weakref

    rng = np.random.default_rng()
    with HostManager(parse_devices("cpu:2")) as host:
        host.add_network("m", MLP, batching=batching)
        host.infer("m", {"x": rng.standard_normal((1, 256)).astype(np.float32)})
        gc.collect()
        gc.disable()
        try:
            refs = []
            for inline in (True, False):
                future = host.run("m", {"x": rng.standard_normal((1, 256)).astype(np.float32)},
                                  timeout=WAIT, inline=inline)
                future.result(timeout=WAIT)
                refs.append(weakref.ref(future))
                del future
            assert poll(lambda: all(r() is None for r in refs)), "a request lives in a cycle"
        finally:
            gc.enable()
