"""DeviceManager and backends: real small models, memory account, ordering, errors, close."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime.devices import DeviceConfig, DeviceManager, supported_ops
from runtime.devices.manager import on_device_thread
from runtime.errors import DeviceMemoryError, ExecutionError, ProvisionError

MB = 1_000_000
RNG = np.random.default_rng()


def matmul_relu(k: int = 8, n: int = 4) -> tuple[onnx.ModelProto, np.ndarray]:
    w = RNG.standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "mm_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", n])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model, w


def bad_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"])], "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


class Probe:
    """A hand-made Function recording where and in which order it ran."""

    output_names = ("y",)

    def __init__(self, hold: float = 0.0, gate: threading.Event | None = None):
        self.hold, self.gate = hold, gate
        self.calls: list[tuple[int, str]] = []
        self.entered = threading.Event()
        self.lock = threading.Lock()

    def run(self, feeds):
        with self.lock:
            self.calls.append((int(feeds["x"]), threading.current_thread().name))
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(5.0)
        if self.hold:
            time.sleep(self.hold)
        return {"y": feeds["x"]}


class Raiser:
    output_names = ("y",)

    def run(self, feeds):
        raise ValueError("boom\nsecond line")


class Bus:
    active = True

    def __init__(self):
        self.events: list[tuple[str, dict]] = []
        self.lock = threading.Lock()

    def publish(self, kind, **fields):
        with self.lock:
            self.events.append((kind, fields))

    def of(self, kind):
        return [f for k, f in self.events if k == kind]


def device(name="d0", backend="cpu", bus=None, **kw) -> DeviceManager:
    return DeviceManager(DeviceConfig(name=name, backend=backend, **kw), bus)


@pytest.fixture
def managers():
    made: list[DeviceManager] = []

    def make(*args, **kw):
        made.append(device(*args, **kw))
        return made[-1]

    yield make
    for m in made:
        m.close(1.0)


@pytest.mark.parametrize("backend", ["cpu", "reference", "sim"])
def test_backend_runs_real_model(managers, backend):
    m = managers("d0", backend)
    model, w = matmul_relu()
    m.load("net/p0", model, weight_bytes=w.nbytes, activation_bytes=1000)
    assert m.keys == ("net/p0",) and m.used_bytes == w.nbytes + 1000
    for _ in range(3):
        x = RNG.standard_normal((5, 8)).astype(np.float32)
        out = m.run("net/p0", {"x": x}, timeout=5)
        assert list(out) == ["y"]
        np.testing.assert_allclose(out["y"], np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)
    stats = m.stats()
    assert (stats.name, stats.backend, stats.runs, stats.queue_length) == ("d0", backend, 3, 0)
    assert stats.busy_seconds > 0 and stats.total_bytes == m.config.memory_bytes


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_unloadable_model_is_provision_error_and_frees(managers, backend):
    m = managers("d0", backend)
    with pytest.raises(ProvisionError) as info:
        m.load("net/bad", bad_model(), 100, 0)
    assert "\n" not in str(info.value) and "d0" in str(info.value)
    assert m.used_bytes == 0 and m.keys == ()


def test_config_op_list_is_enforced(managers):
    m = managers("s0", "sim", supported_ops={"MatMul"})
    with pytest.raises(ProvisionError, match="Relu"):
        m.load("net/p0", matmul_relu()[0], 10, 0)
    assert m.used_bytes == 0


def test_memory_refusal_before_compile_and_account_unchanged(managers):
    bus = Bus()
    m = managers("cpu0", memory_bytes=64 * MB, bus=bus)
    m.load("bert/p0", matmul_relu()[0], 40 * MB, 12 * MB)
    before = (m.used_bytes, m.free_bytes, m.keys)
    # a model that would fail to compile: the memory refusal must come first
    with pytest.raises(DeviceMemoryError) as info:
        m.load("bert/p1", bad_model(), 80 * MB, 4 * MB)
    # its 4 MB of activations fit in the 12 MB arena p0 already holds: 80 MB more
    assert str(info.value) == "bert/p1 needs 80.0 MB on cpu0, 12.0 MB free of 64.0 MB"
    assert (m.used_bytes, m.free_bytes, m.keys) == before
    with pytest.raises(ProvisionError, match="already loaded"):
        m.load("bert/p0", matmul_relu()[0], 1, 0)
    assert m.evict("bert/p0") == 52 * MB
    assert m.evict("bert/p0") == 0
    assert (m.used_bytes, m.free_bytes, m.keys) == (0, 64 * MB, ())
    assert bus.of("device.memory") == [
        {"device": "cpu0", "used_bytes": 52 * MB, "total_bytes": 64 * MB},
        {"device": "cpu0", "used_bytes": 0, "total_bytes": 64 * MB}]


def test_fifo_under_many_submitters(managers):
    m = managers("d0")
    probe = Probe(hold=0.0005)
    m.load_function("k", probe)
    order_lock = threading.Lock()
    seq = iter(range(10_000))
    futures = []

    def submitter():
        for _ in range(25):
            with order_lock:  # arrival order = sequence order
                n = next(seq)
                futures.append(m.submit("k", {"x": np.array(n)}))

    threads = [threading.Thread(target=submitter) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    done, _ = wait(futures, timeout=10)
    assert len(done) == 200
    assert [n for n, _ in probe.calls] == list(range(200))
    assert m.stats().runs == 200


def test_inline_when_idle_and_not_from_worker(managers):
    a, b = managers("a"), managers("b")
    pa, pb = Probe(), Probe()
    a.load_function("k", pa)
    b.load_function("k", pb)
    assert b.run("k", {"x": np.array(0)}) == {"y": 0}
    assert pb.calls == [(0, threading.current_thread().name)]
    assert not on_device_thread()

    # from a's worker thread, b (idle) must hand off to its own worker
    gate = threading.Event()
    busy = Probe(gate=gate)
    a.load_function("busy", busy)
    holder = threading.Thread(target=a.run, args=("busy", {"x": np.array(0)}))
    holder.start()
    assert busy.entered.wait(5)
    nested = []
    chained = threading.Event()

    def chain(_):
        nested.append(b.submit("k", {"x": np.array(2)}))
        chained.set()

    f = a.submit("k", {"x": np.array(1)})
    f.add_done_callback(chain)
    gate.set()
    assert chained.wait(5)
    holder.join(5)
    assert pa.calls[-1] == (1, "prism-a")
    assert nested[0].result(5) == {"y": 2}
    assert pb.calls[-1] == (2, "prism-b")


class Forward:
    """Runs inline on the caller, and submits onward to another device from inside."""

    output_names = ("y",)

    def __init__(self, target: DeviceManager):
        self.target, self.nested = target, []

    def run(self, feeds):
        assert on_device_thread()
        self.nested.append(self.target.submit("k", feeds))
        return {"y": feeds["x"]}


def test_inline_run_counts_as_device_thread(managers):
    a, b = managers("a"), managers("b")
    pb = Probe()
    b.load_function("k", pb)
    forward = Forward(b)
    a.load_function("k", forward)
    assert a.run("k", {"x": np.array(5)}) == {"y": 5}  # inline on this thread
    assert forward.nested[0].result(5) == {"y": 5}
    assert pb.calls == [(5, "prism-b")]
    assert not on_device_thread()


def test_raise_fails_only_that_future(managers):
    bus = Bus()
    m = managers("cpu1", bus=bus)
    m.load_function("bert/p2", Raiser())
    m.load_function("ok", Probe())
    f = m.submit("bert/p2", {"x": np.array(0)}, tag={"network": "bert", "request": 7})
    err = f.exception(5)
    assert isinstance(err, ExecutionError)
    assert str(err) == "cpu1 failed running bert/p2: boom"
    assert isinstance(err.__cause__, ValueError)
    assert m.run("ok", {"x": np.array(4)}) == {"y": 4}
    missing = m.submit("nope", {"x": np.array(0)}).exception(5)
    assert "cpu1" in str(missing) and "nope" in str(missing)
    started, finished = bus.of("partition.run.started"), bus.of("partition.run.finished")
    assert started == [{"network": "bert", "request": 7, "device": "cpu1"}]
    assert finished[0]["ok"] is False and finished[0]["device"] == "cpu1"
    assert finished[0]["queue_wait"] >= 0 and finished[0]["run_seconds"] >= 0


def test_events_published_only_when_bus_active(managers):
    bus = Bus()
    bus.active = False
    m = managers("d0", bus=bus)
    m.load_function("k", Probe())
    m.run("k", {"x": np.array(1)})
    m.submit("k", {"x": np.array(1)}, tag={"request": 1}).result(5)
    assert bus.events == []


def test_sim_holds_for_est_seconds(managers):
    m = managers("s0", "sim")
    model, _ = matmul_relu()
    m.load("k", model, 0, 0, est_seconds=0.02)
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    for _ in range(3):
        t0 = time.perf_counter()
        m.run("k", {"x": x})
        wall = time.perf_counter() - t0
        assert 0.02 <= wall < 0.06


def test_sim_devices_overlap(managers):
    est = 0.1
    devs = [managers(f"s{i}", "sim") for i in range(4)]
    model, _ = matmul_relu()
    for d in devs:
        d.load("k", model, 0, 0, est_seconds=est)
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    with ThreadPoolExecutor(4) as pool:
        t0 = time.perf_counter()
        list(pool.map(lambda d: d.run("k", {"x": x}, timeout=5), devs))
        wall = time.perf_counter() - t0
    assert est <= wall < 1.6 * est


def test_chained_callbacks_across_devices(managers):
    devs = [managers(f"d{i}") for i in range(4)]
    for d in devs:
        d.load_function("k", Probe(hold=0.0002))
    finals = []
    all_done = threading.Event()

    def hop(i, n):
        def callback(f):
            if i + 1 < len(devs):
                devs[i + 1].submit("k", {"x": f.result()["y"]}).add_done_callback(hop(i + 1, n))
            else:
                finals.append(int(f.result()["y"]))
                if len(finals) == 64:
                    all_done.set()
        return callback

    def start(n):
        devs[0].submit("k", {"x": np.array(n)}).add_done_callback(hop(0, n))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(start, range(64)))
    assert all_done.wait(10)
    assert sorted(finals) == list(range(64))


def test_close_fails_queued_and_is_bounded(managers):
    m = managers("d0")
    gate = threading.Event()
    slow = Probe(gate=gate)
    m.load_function("k", slow)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(m.run, "k", {"x": np.array(0)})
        assert slow.entered.wait(5)
        queued = [m.submit("k", {"x": np.array(i)}) for i in (1, 2)]
        threading.Timer(0.1, gate.set).start()
        t0 = time.perf_counter()
        m.close(timeout=2.0)
        assert time.perf_counter() - t0 < 1.0
        assert first.result(5) == {"y": 0}  # the running job finished
    for f in queued:
        assert str(f.exception(1)) == "device d0 closed"
    late = m.submit("k", {"x": np.array(3)})
    assert isinstance(late.exception(1), ExecutionError)
    assert [n for n, _ in slow.calls] == [0]


def test_close_returns_within_bound_when_job_hangs(managers):
    m = managers("d0")
    gate = threading.Event()
    stuck = Probe(gate=gate)
    m.load_function("k", stuck)
    # make the worker (not the caller) run the stuck job: keep the device busy first
    busy_gate = threading.Event()
    m.load_function("busy", Probe(gate=busy_gate))
    t = threading.Thread(target=m.run, args=("busy", {"x": np.array(0)}))
    t.start()
    f = m.submit("k", {"x": np.array(1)})
    busy_gate.set()
    assert stuck.entered.wait(5)
    t0 = time.perf_counter()
    m.close(timeout=0.2)
    assert time.perf_counter() - t0 < 0.5
    gate.set()
    assert f.result(5) == {"y": 1}
    t.join(5)


def test_run_timeout_is_execution_error(managers):
    m = managers("d0")
    gate = threading.Event()
    m.load_function("busy", Probe(gate=gate))
    m.load_function("k", Probe())
    t = threading.Thread(target=m.run, args=("busy", {"x": np.array(0)}))
    t.start()
    time.sleep(0.02)
    with pytest.raises(ExecutionError, match="did not finish"):
        m.run("k", {"x": np.array(1)}, timeout=0.05)
    gate.set()
    t.join(5)


def test_supported_ops():
    cpu = supported_ops("cpu")
    assert cpu is not None and {"Conv", "MatMul", "Relu", "Constant", "Gelu"} <= cpu
    ref = supported_ops("reference")
    assert ref is not None and {"Add", "MatMul", "Gelu"} <= ref and "OpRun" not in ref
    assert supported_ops("sim") is None
    assert supported_ops("cpu") is cpu  # cached
