"""Devices: the in-process DeviceManager through the Device interface (load/unload with the
memory account, `call` with a completion callback, `run_now` on the caller's thread),
every backend on real small models, ordering, errors, events and close."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.cli import main
from runtime.devices import (
    DeviceConfig,
    DeviceManager,
    Program,
    open_device,
    parse_devices,
    supported_ops,
)
from runtime.devices.manager import on_device_thread
from runtime.devices.ray.actor import PartitionWorker
from runtime.devices.sim import SimDevice
from runtime.errors import DeviceMemoryError, ExecutionError, ProvisionError
from runtime.host import HostManager
from tests.support.classifiers import zipmap_classifier
from tests.support.fakes import blocking
from tests.support.hosts import cpu_burnt_after

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


def device(name="d0", backend="cpu", bus=None, **kw):
    """A real device of the backend's own kind (what a host opens)."""
    return open_device(DeviceConfig(name=name, backend=backend, **kw), bus)


def handmade(name="d0", bus=None, **functions) -> DeviceManager:
    """A DeviceManager whose programs compile to the hand-made functions given by name:
    `load("k", named("k"))` installs functions["k"]."""
    return DeviceManager(DeviceConfig(name=name), lambda program, config:
                         functions[program.name], bus)


def named(name: str, weight_bytes: int = 0) -> Program:
    return Program(b"", frozenset(), weight_bytes, 0, name=name)


def x(n: int) -> dict:
    return {"x": np.array(n)}


@pytest.fixture
def managers():
    made: list = []

    def make(*args, functions=None, **kw):
        made.append(handmade(*args, **kw, **functions) if functions is not None
                    else device(*args, **kw))
        for key in functions or ():
            made[-1].load(key, named(key))
        return made[-1]

    yield make
    for m in made:
        m.close(1.0)


@pytest.mark.parametrize("backend", ["cpu", "reference", "sim"])
def test_backend_runs_real_model_through_call_and_run_now(managers, backend):
    m = managers("d0", backend)
    assert isinstance(m, SimDevice) == (backend == "sim")  # each backend opens its kind
    model, w = matmul_relu()
    m.load("net/p0", Program.of(model, weight_bytes=w.nbytes, activation_bytes=1000))
    assert m.keys == ("net/p0",) and m.used_bytes == w.nbytes + 1000
    for run in (lambda feeds: blocking(m, "net/p0", feeds), lambda feeds: m.run_now(
            "net/p0", feeds)) * 2:
        feeds = {"x": RNG.standard_normal((5, 8)).astype(np.float32)}
        out = run(feeds)
        assert list(out) == ["y"]
        np.testing.assert_allclose(out["y"], np.maximum(feeds["x"] @ w, 0), rtol=1e-5,
                                   atol=1e-5)
    stats = m.stats()
    assert (stats.name, stats.backend, stats.runs, stats.queue_length) == ("d0", backend, 4, 0)
    assert stats.busy_seconds > 0 and stats.total_bytes == m.config.memory_bytes
    assert stats.used_bytes == m.used_bytes


def test_threads_that_do_not_spin_leave_the_cores_idle_between_runs(managers):
    """onnxruntime's intra-op threads spin after a run, waiting for the next; beside
    PyTorch's threads on the same cores (torch.compile's blocks) they starve them.
    `spin=0` makes them sleep: on a device, and in a Ray device's actor."""
    model, _ = matmul_relu(k=256, n=256)
    feeds = {"x": RNG.standard_normal((256, 256)).astype(np.float32)}
    burnt = {}
    for spin in (True, False):
        m = managers(f"d{int(spin)}", threads=2, spin=spin)
        m.load("k", Program.of(model, weight_bytes=0, activation_bytes=0))
        burnt["device", spin] = cpu_burnt_after(lambda m=m: blocking(m, "k", feeds))
        worker = PartitionWorker("ray0", 2, False, spin)  # what a Ray device's actor holds
        assert worker.load("k", model.SerializeToString(), 0.0)[0] is None
        burnt["actor", spin] = cpu_burnt_after(lambda w=worker: w.run("k", 1, 0.0, feeds, ()))
    for where in ("device", "actor"):
        assert burnt[where, False] < burnt[where, True] / 4, burnt


def one_node(node: onnx.NodeProto, weights: dict[str, np.ndarray], opset: int = 19
             ) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node], node.op_type, [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [onnx.ValueInfoProto(name=y) for y in node.output],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=9)


def assert_reference_runs_as_onnxruntime(m: DeviceManager, node: onnx.NodeProto,
                                         x: np.ndarray, opset: int = 19,
                                         **weights: np.ndarray) -> None:
    model = one_node(node, weights, opset)
    key = f"{node.op_type}/{len(m.keys)}"
    m.load(key, Program.of(model, weight_bytes=sum(w.nbytes for w in weights.values()),
                           activation_bytes=0))
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = blocking(m, key, {"x": x})
    for name, value in zip(node.output, want, strict=True):
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5,
                                   err_msg=f"{name} of {node}")


def random_conv_transpose() -> tuple[onnx.NodeProto, np.ndarray, dict[str, np.ndarray]]:
    """A ConvTranspose of fresh geometry: groups, explicit pads and output padding, or an
    output_shape within a stride of the windows' reach (cut, or padded with zeros)."""
    rank, group, per_in, per_out = (int(v) for v in RNG.integers(1, 4, 4))
    rank = min(rank, 2)
    kernel, strides, dilations, spatial = (RNG.integers(1, 4, rank), RNG.integers(1, 4, rank),
                                           RNG.integers(1, 3, rank), RNG.integers(1, 5, rank))
    attrs: dict = {"group": group, "strides": strides.tolist(), "dilations": dilations.tolist()}
    reach = strides * (spatial - 1) + (kernel - 1) * dilations + 1
    if RNG.random() < 0.5:
        attrs["pads"] = [int(RNG.integers(0, 2)) if r > 2 else 0 for r in [*reach, *reach]]
        attrs["output_padding"] = [int(RNG.integers(0, s)) for s in strides]
    else:
        attrs["output_shape"] = [max(1, int(r + RNG.integers(1 - s, s)))
                                 for r, s in zip(reach, strides, strict=True)]
    weights = {"w": RNG.standard_normal((group * per_in, per_out, *kernel)).astype(np.float32),
               "b": RNG.standard_normal(group * per_out).astype(np.float32)}
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    return node, RNG.standard_normal((2, group * per_in, *spatial)).astype(np.float32), weights


def test_the_reference_backend_runs_conv_transpose_as_onnxruntime(managers):
    """onnx's evaluator adds only the first group's bias to a depthwise one, fails on
    wider groups, and fails on an output_shape that cuts the output; 40 fresh geometries."""
    m = managers("d0", "reference")
    for _ in range(40):
        node, x, weights = random_conv_transpose()
        assert_reference_runs_as_onnxruntime(m, node, x, **weights)


def test_the_reference_backend_pools_ceil_mode_windows_as_onnxruntime(managers):
    """GoogLeNet's and SqueezeNet's MaxPools: onnx's evaluator grows the stride-1 one by
    two rows and columns."""
    m = managers("d0", "reference")
    x = RNG.standard_normal((1, 3, 13, 13)).astype(np.float32)
    for strides, pads in (([1, 1], [1, 1, 1, 1]), ([2, 2], [0, 0, 0, 0])):
        node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3],
                                strides=strides, pads=pads, ceil_mode=1)
        assert_reference_runs_as_onnxruntime(m, node, x)


def test_the_reference_backend_normalizes_every_channel_as_onnxruntime(managers):
    """onnx's evaluator's LRN loops over the batch axis where the channels are meant (odd
    sizes: onnxruntime takes no other)."""
    m = managers("d0", "reference")
    for size in (1, 3, 5):
        node = helper.make_node("LRN", ["x"], ["y"], size=size, alpha=0.5, bias=1.5)
        assert_reference_runs_as_onnxruntime(
            m, node, RNG.standard_normal((2, 6, 3, 4)).astype(np.float32))


def test_the_reference_backend_samples_grids_as_onnxruntime(managers):
    """Its own kernel: onnx's evaluator fails on opset 16's mode names (bilinear,
    bicubic), clips a cubic coordinate under border padding where onnxruntime and PyTorch
    clip each tap, and took 7 s for a (2, 16, 32, 32) image. 60 fresh geometries: 2-D
    under opset 16's names and 20's, 3-D (linear and nearest: onnxruntime samples no
    other), grids reaching past the input."""
    m = managers("d0", "reference")
    for _ in range(60):
        rank = int(RNG.integers(2, 4))
        opset = int(RNG.choice([16, 20])) if rank == 2 else 20
        modes = ("bilinear", "nearest", "bicubic") if opset == 16 else ("linear", "nearest",
                                                                        "cubic")
        node = helper.make_node("GridSample", ["x", "grid"], ["y"],
                                mode=str(RNG.choice(modes[:3 if rank == 2 else 2])),
                                padding_mode=str(RNG.choice(["zeros", "border", "reflection"])),
                                align_corners=int(RNG.integers(0, 2)))
        batch, channels = (int(v) for v in RNG.integers(1, 4, 2))
        x = RNG.standard_normal((batch, channels, *RNG.integers(1, 7, rank))).astype(np.float32)
        grid = RNG.uniform(-1.6, 1.6, (batch, *RNG.integers(1, 6, rank), rank))
        assert_reference_runs_as_onnxruntime(m, node, x, opset, grid=grid.astype(np.float32))


def test_the_reference_backend_gathers_elements_as_onnxruntime(managers):
    """onnx's evaluator fails on an axis longer than 64 and on indices smaller than the
    data off the axis; 30 fresh shapes, negative indices among them."""
    m = managers("d0", "reference")
    for _ in range(30):
        shape = [int(d) for d in RNG.integers(1, 90, int(RNG.integers(1, 4)))]
        axis = int(RNG.integers(-len(shape), len(shape)))
        taken = [int(RNG.integers(1, 8)) if k == axis % len(shape) else int(RNG.integers(1, d + 1))
                 for k, d in enumerate(shape)]
        node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)
        assert_reference_runs_as_onnxruntime(
            m, node, RNG.standard_normal(shape).astype(np.float32),
            i=RNG.integers(-shape[axis], shape[axis], taken).astype(np.int64))


def random_pool(op: str) -> onnx.NodeProto:
    """A pooling node of fresh geometry: explicit pads (any ceil_mode, MaxPool's dilations
    and indices) or SAME (onnxruntime sizes SAME as the spec does only without dilations,
    and refuses strides longer than the kernel)."""
    n = int(RNG.integers(1, 3))
    kernel = RNG.integers(1, 4, n)
    attrs: dict = {"kernel_shape": kernel.tolist(), "strides": RNG.integers(1, 4, n).tolist()}
    if RNG.random() < 0.25:
        attrs["auto_pad"] = str(RNG.choice(["SAME_UPPER", "SAME_LOWER"]))
        attrs["strides"] = RNG.integers(1, kernel + 1).tolist()
    else:
        attrs["pads"] = RNG.integers(0, kernel, (2, n)).ravel().tolist()
        attrs["ceil_mode"] = int(RNG.integers(0, 2))
        if op == "MaxPool":
            attrs["dilations"] = RNG.integers(1, 3, n).tolist()
    outputs = ["y"]
    if op == "MaxPool" and RNG.random() < 0.5:
        outputs.append("indices")
        attrs["storage_order"] = int(RNG.integers(0, 2))
    if op == "AveragePool":
        attrs["count_include_pad"] = int(RNG.integers(0, 2))
    if op == "LpPool":
        attrs["p"] = int(RNG.integers(1, 4))
    return helper.make_node(op, ["x"], outputs, **attrs)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
def test_the_reference_backend_pools_as_onnxruntime(managers, op):
    """onnx's evaluator sizes ceil_mode and SAME_LOWER windows otherwise, and counts
    LpPool's ceil_mode windows wrong; 40 fresh geometries each."""
    m = managers("d0", "reference")
    for _ in range(40):
        node = random_pool(op)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        reach = (np.array(attrs["kernel_shape"]) - 1) * attrs.get("dilations", 1) + 1
        spatial = [int(RNG.integers(r, r + 8)) for r in reach]
        assert_reference_runs_as_onnxruntime(
            m, node, RNG.standard_normal((2, 3, *spatial)).astype(np.float32))


def test_the_reference_backend_runs_tf2onnx_exports_nodes_as_onnxruntime(managers):
    """Nodes of Keras networks exported by tf2onnx, where onnx's evaluator answers
    otherwise or not at all: GlobalMaxPool over a sequence (it pooled the channels too),
    BatchNormalization at opsets 9-13 (it used the batch's statistics), Resize's
    `tf_half_pixel_for_nn` (unknown to it; UpSampling2D)."""
    m = managers("d0", "reference")
    for rank in (3, 4, 5):
        assert_reference_runs_as_onnxruntime(
            m, helper.make_node("GlobalMaxPool", ["x"], ["y"]),
            RNG.standard_normal(RNG.integers(1, 5, rank)).astype(np.float32))
    channels = int(RNG.integers(1, 6))
    stats = {k: RNG.uniform(0.5, 2, channels).astype(np.float32)
             for k in ("scale", "bias", "mean", "var")}
    for opset in (9, 13, 15):
        assert_reference_runs_as_onnxruntime(
            m, helper.make_node("BatchNormalization", ["x", *stats], ["y"],
                                epsilon=1e-3),
            RNG.standard_normal((2, channels, 3, 4)).astype(np.float32), opset, **stats)
    for mode in ("floor", "ceil", "round_prefer_floor", "round_prefer_ceil"):
        x = RNG.standard_normal((1, 2, *RNG.integers(1, 7, 2))).astype(np.float32)
        scales = np.array([1, 1, *RNG.choice([0.5, 1.5, 2, 3], 2)], np.float32)
        node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode="nearest",
                                coordinate_transformation_mode="tf_half_pixel_for_nn",
                                nearest_mode=mode)
        assert_reference_runs_as_onnxruntime(m, node, x, 11, scales=scales,
                                             roi=np.zeros(0, np.float32))


@pytest.mark.parametrize("opset", [7, 9])
def test_the_reference_backend_upsamples_as_onnxruntime(managers, opset):
    """Upsample, deprecated since opset 10 (its scales an attribute at 7, an input at 9):
    onnx's evaluator failed on `linear` and on a fractional nearest scale (torchvision's
    LR-ASPP exported at opset 9)."""
    m = managers("d0", "reference")
    for mode in ("nearest", "linear"):
        x = RNG.standard_normal((1, 2, *RNG.integers(1, 6, 2))).astype(np.float32)
        scales = np.array([1, 1, *RNG.choice([1, 1.5, 2, 2.5, 3], 2)], np.float32)
        if opset == 7:
            node = helper.make_node("Upsample", ["x"], ["y"], mode=mode,
                                    scales=scales.tolist())
            assert_reference_runs_as_onnxruntime(m, node, x, opset)
        else:
            node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode=mode)
            assert_reference_runs_as_onnxruntime(m, node, x, opset, scales=scales)


def test_the_reference_backend_stacks_a_loops_scan_outputs_as_onnxruntime(managers):
    """Each iteration's scan output is a slice of a new first axis (onnx's evaluator
    joined matrices along their rows and made scalars a column: tf2onnx's SimpleRNN)."""
    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Identity", ["go"], ["go_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=f),
         helper.make_node("Mul", ["x", "fi"], ["matrix"]),
         helper.make_node("ReduceSum", ["matrix", "rows"], ["vector"], keepdims=0),
         helper.make_node("ReduceSum", ["matrix"], ["scalar"], keepdims=0)], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("go", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(t, TensorProto.BOOL if t == "go_out" else f, None)
         for t in ("go_out", "matrix", "vector", "scalar")])
    node = helper.make_node("Loop", ["n", "go"], ["matrices", "vectors", "scalars"],
                            body=body)
    x = RNG.standard_normal(RNG.integers(1, 5, 2)).astype(np.float32)
    assert_reference_runs_as_onnxruntime(
        managers("d0", "reference"), node, x, 17, n=np.array(RNG.integers(1, 5)),
        go=np.array(True), rows=np.array([0]))


@pytest.mark.parametrize("opset", [10, 13, 18, 19])
def test_the_reference_backend_dequantizes_at_every_opset_as_onnxruntime(opset):
    """onnx's evaluator (1.23) keeps DequantizeLinear from opset 19 on only: a quantized
    model at 13, as onnxruntime's quantizer writes one, failed to load on the device.
    Per channel (axis) from 13 on."""
    f, rows = TensorProto.FLOAT, int(RNG.integers(1, 5))
    channel = opset >= 13
    w = RNG.integers(-127, 128, (6, 5)).astype(np.int8)
    scale = RNG.uniform(0.01, 0.1, 5 if channel else ()).astype(np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"],
                              **({"axis": 1} if channel else {})),
             helper.make_node("MatMul", ["xd", "wd"], ["y"])]
    weights = {"xs": np.array(0.05, np.float32), "xz": np.array(128, np.uint8), "w": w,
               "ws": scale}
    model = helper.make_model(helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", f, ["n", 6])],
        [helper.make_tensor_value_info("y", f, ["n", 5])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()]),
        opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    x = RNG.standard_normal((rows, 6)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with HostManager(parse_devices("reference:1")) as host:
        host.add_network("qdq", model)
        np.testing.assert_allclose(host.infer("qdq", {"x": x}, timeout=30)["y"], want,
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("text", [False, True], ids=["int_labels", "text_labels"])
def test_the_reference_backend_zips_class_scores_into_maps_as_onnxruntime(text, tmp_path,
                                                                          capsys):
    """onnx's evaluator has no ZipMap, which ends scikit-learn's, LightGBM's, XGBoost's
    and CatBoost's classifiers as exported: the reference device could not run them."""
    path = str(tmp_path / "classifier.onnx")
    onnx.save(zipmap_classifier(RNG, text), path)
    code = main(["run", path, "--devices", "reference:2", "--requests", "5", "--check"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "every output matches onnxruntime (5 answers" in out, out


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_unloadable_model_is_provision_error_and_frees(managers, backend):
    m = managers("d0", backend)
    with pytest.raises(ProvisionError) as info:
        m.load("net/bad", Program.of(bad_model(), 100, 0))
    assert "\n" not in str(info.value) and "d0" in str(info.value)
    assert m.used_bytes == 0 and m.keys == ()


def test_config_op_list_is_enforced(managers):
    m = managers("s0", "sim", supported_ops={"MatMul"})
    with pytest.raises(ProvisionError, match="Relu"):
        m.load("net/p0", Program.of(matmul_relu()[0], 10, 0))
    assert m.used_bytes == 0


def test_memory_refusal_before_compile_and_account_unchanged(managers):
    bus = Bus()
    m = managers("cpu0", memory_bytes=64 * MB, bus=bus)
    m.load("bert/p0", Program.of(matmul_relu()[0], 40 * MB, 12 * MB))
    before = (m.used_bytes, m.free_bytes, m.keys)
    # a model that would fail to compile: the memory refusal must come first
    with pytest.raises(DeviceMemoryError) as info:
        m.load("bert/p1", Program.of(bad_model(), 80 * MB, 4 * MB))
    # its 4 MB of activations fit in the 12 MB arena p0 already holds: 80 MB more
    assert str(info.value) == "bert/p1 needs 80.0 MB on cpu0, 12.0 MB free of 64.0 MB"
    assert (m.used_bytes, m.free_bytes, m.keys) == before
    with pytest.raises(ProvisionError, match="already loaded"):
        m.load("bert/p0", Program.of(matmul_relu()[0], 1, 0))
    assert m.unload("bert/p0") == 52 * MB
    assert m.unload("bert/p0") == 0
    assert (m.used_bytes, m.free_bytes, m.keys) == (0, 64 * MB, ())
    assert bus.of("device.memory") == [
        {"device": "cpu0", "used_bytes": 52 * MB, "total_bytes": 64 * MB},
        {"device": "cpu0", "used_bytes": 0, "total_bytes": 64 * MB}]


def test_call_runs_in_arrival_order_under_many_callers(managers):
    probe = Probe(hold=0.0005)
    m = managers("d0", functions={"k": probe})
    order_lock = threading.Lock()
    seq = iter(range(10_000))
    answered: list[int] = []
    all_in = threading.Event()

    def done(outputs, error):
        assert error is None
        answered.append(int(outputs["y"]))  # done runs on the device's one worker
        if len(answered) == 200:
            all_in.set()

    def caller():
        for _ in range(25):
            with order_lock:  # arrival order = sequence order
                m.call("k", x(next(seq)), None, done)

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all_in.wait(10)
    assert [n for n, _ in probe.calls] == answered == list(range(200))
    assert {name for _, name in probe.calls} == {"prism-d0"}
    assert m.stats().runs == 200


def inline(device, key, feeds, wait=0.0):
    """A run on the caller's thread: the device's one fast path."""
    return device.run_now(key, feeds, None, wait)


def test_run_now_runs_here_only_when_idle_and_not_on_a_device_thread(managers):
    gate = threading.Event()
    pa, pb, busy = Probe(), Probe(), Probe(gate=gate)
    a = managers("a", functions={"k": pa, "busy": busy})
    b = managers("b", functions={"k": pb})
    assert inline(b, "k", x(0)) == {"y": 0}
    assert pb.calls == [(0, threading.current_thread().name)]
    assert not on_device_thread()

    a.call("busy", x(0), None, lambda *_: None)  # a's worker holds it at the gate
    assert busy.entered.wait(5)
    assert inline(a, "k", x(9)) is None  # busy: the caller must queue instead
    nested, chained = [], threading.Event()

    def chain(outputs, error):  # on a's worker: b is idle, yet must not run here
        nested.append(inline(b, "k", {"x": outputs["y"] + 1}))
        b.call("k", {"x": outputs["y"] + 1}, None, lambda out, err: (
            nested.append(out), chained.set()))

    a.call("k", x(1), None, chain)
    assert a.stats().queue_length == 1
    gate.set()
    assert chained.wait(5)
    assert pa.calls[-1] == (1, "prism-a")
    assert nested == [None, {"y": 2}] and pb.calls[-1] == (2, "prism-b")


def test_a_waiting_caller_runs_on_its_own_thread_once_the_device_is_free(managers):
    gate = threading.Event()
    probe, busy = Probe(), Probe(gate=gate)
    a = managers("a", functions={"k": probe, "busy": busy})
    a.call("busy", x(0), None, lambda *_: None)  # the worker holds it at the gate
    assert busy.entered.wait(5)
    started = time.monotonic()
    assert inline(a, "k", x(1), wait=0.05) is None  # still busy when the wait ran out
    assert time.monotonic() - started >= 0.04 and probe.calls == []  # it did wait

    got: list = []
    waiter = threading.Thread(target=lambda: got.append(inline(a, "k", x(2), wait=5)),
                              name="waiter")
    waiter.start()
    time.sleep(0.05)
    assert got == []  # waiting for the device, not declined
    gate.set()
    waiter.join(5)
    assert got == [{"y": 2}] and probe.calls == [(2, "waiter")]
    assert a.stats().runs == 2


def test_close_lets_a_waiting_caller_go(managers):
    gate = threading.Event()
    busy = Probe(gate=gate)
    a = managers("a", functions={"k": Probe(), "busy": busy})
    a.call("busy", x(0), None, lambda *_: None)
    assert busy.entered.wait(5)  # the worker holds the device at the gate
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(inline(a, "k", x(1), wait=30)))
    waiter.start()
    time.sleep(0.05)
    closer = threading.Thread(target=a.close, args=(5.0,))
    closer.start()
    time.sleep(0.2)  # close has begun (its first step) and waits for the run in hand
    gate.set()
    waiter.join(5)
    closer.join(5)
    assert got == [None]  # declined: the device closed while it waited


class Forward:
    """Runs on the caller, and from inside sends onward to another device."""

    output_names = ("y",)

    def __init__(self, target: DeviceManager):
        self.target, self.nested = target, []
        self.landed = threading.Event()

    def run(self, feeds):
        assert on_device_thread()
        self.nested.append(self.target.run_now("k", feeds))  # declines: a device thread
        self.target.call("k", feeds, None, lambda out, err: (self.nested.append(out),
                                                             self.landed.set()))
        return {"y": feeds["x"]}


def test_an_inline_run_counts_as_a_device_thread(managers):
    pb = Probe()
    b = managers("b", functions={"k": pb})
    forward = Forward(b)
    a = managers("a", functions={"k": forward})
    assert inline(a, "k", x(5)) == {"y": 5}  # on this thread
    assert forward.landed.wait(5)
    assert forward.nested == [None, {"y": 5}] and pb.calls == [(5, "prism-b")]
    assert not on_device_thread()


def test_a_failing_run_fails_only_that_call(managers):
    bus = Bus()
    m = managers("cpu1", bus=bus, functions={"bert/p2": Raiser(), "ok": Probe()})
    with pytest.raises(ExecutionError) as info:
        blocking(m, "bert/p2", x(0), tag={"network": "bert", "request": 7})
    assert str(info.value) == "cpu1 failed running bert/p2: boom"
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(ExecutionError, match="boom"):
        inline(m, "bert/p2", x(0))
    with pytest.raises(ExecutionError, match=r"cpu1 .*nope"):
        inline(m, "nope", x(0))
    assert inline(m, "ok", x(4)) == {"y": 4} and blocking(m, "ok", x(3)) == {"y": 3}
    with pytest.raises(ExecutionError) as missing:
        blocking(m, "nope", x(0))
    assert "cpu1" in str(missing.value) and "nope" in str(missing.value)
    started, finished = bus.of("partition.run.started"), bus.of("partition.run.finished")
    assert started == [{"network": "bert", "request": 7, "device": "cpu1"}]
    assert finished[0]["ok"] is False and finished[0]["device"] == "cpu1"
    assert finished[0]["queue_wait"] >= 0 and finished[0]["run_seconds"] >= 0


class SlowBus(Bus):
    """Takes `hold` seconds over each `partition.run.started`: a subscriber's cost."""

    hold = 0.05

    def publish(self, kind, **fields):
        if kind == "partition.run.started":
            time.sleep(self.hold)
        super().publish(kind, **fields)


def test_a_runs_time_leaves_out_publishing_its_start(managers):
    bus = SlowBus()
    m = managers("cpu1", bus=bus, functions={"ok": Probe()})
    assert blocking(m, "ok", x(2), tag={"network": "n", "request": 1}) == {"y": 2}
    (finished,) = bus.of("partition.run.finished")
    assert finished["run_seconds"] < bus.hold <= finished["queue_wait"]
    assert m.recent_runs("ok")[1][0] == finished["run_seconds"]


@pytest.mark.parametrize("backend", ["cpu", "sim"])  # sim keeps time: its own `_invoke`
def test_run_now_computes_counts_its_runs_and_declines_once_unloaded_or_closed(managers,
                                                                               backend):
    m = managers("d0", backend)
    model, w = matmul_relu()
    program = Program.of(model, weight_bytes=w.nbytes, activation_bytes=1000)
    m.load("net/p0", program)
    feeds = {"x": RNG.standard_normal((5, 8)).astype(np.float32)}
    out = m.run_now("net/p0", feeds)
    np.testing.assert_allclose(out["y"], np.maximum(feeds["x"] @ w, 0), rtol=1e-5, atol=1e-5)
    assert m.run_now("net/p0", feeds, None, 0.5) is not None  # the device was given back
    assert m.stats().runs == 2 and m.stats().busy_seconds > 0
    m.unload("net/p0")
    with pytest.raises(ExecutionError, match="d0 failed running net/p0: net/p0 is not loaded"):
        m.run_now("net/p0", feeds)
    m.load("net/p0", program)
    m.close(1.0)
    assert m.run_now("net/p0", feeds) is None and m.run_now("net/p0", feeds, None, 0.5) is None
    assert m.stats().runs == 2  # what never ran is not counted


class Interrupting(Bus):
    """A bus on which publishing `kind` raises KeyboardInterrupt once: Ctrl-C landing while
    a run publishes its events (a signal can land on any line of the thread it is for)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind, self.fired = kind, False

    def publish(self, kind, **fields):
        super().publish(kind, **fields)
        if kind == self.kind and not self.fired:
            self.fired = True
            raise KeyboardInterrupt


@pytest.mark.parametrize("kind", ["partition.run.started", "partition.run.finished"])
def test_an_interrupt_while_a_run_publishes_leaves_the_device_free(managers, kind):
    """Inline, the interrupt reaches the caller; on the worker, it fails that run and a new
    worker takes over. Either way the device is free for the next run, which a run still
    holding it would refuse (run_now) or never start (call)."""
    m = managers("d0", bus=Interrupting(kind), functions={"k": Probe()})
    with pytest.raises(KeyboardInterrupt):
        m.run_now("k", x(1), tag={"request": 1})
    assert m.run_now("k", x(2), tag={"request": 2}) == {"y": 2}
    m.bus.fired = False
    with pytest.raises(ExecutionError, match="KeyboardInterrupt"):
        blocking(m, "k", x(3), tag={"request": 3})
    assert blocking(m, "k", x(4), tag={"request": 4}) == {"y": 4}
    assert m.run_now("k", x(5)) == {"y": 5}
    assert [f["request"] for f in m.bus.of("partition.run.finished")] == [1, 2, 3, 4]
    assert len(m.bus.of("device.worker.replaced")) == 1


def test_a_broken_callback_does_not_stop_the_device(managers):
    m = managers("d0", functions={"k": Probe()})
    m.call("k", x(1), None, lambda *_: 1 / 0)
    assert blocking(m, "k", x(2)) == {"y": 2}


def test_events_published_only_when_bus_active(managers):
    bus = Bus()
    bus.active = False
    m = managers("d0", bus=bus, functions={"k": Probe()})
    m.run_now("k", x(1), tag={"request": 1})
    blocking(m, "k", x(1), tag={"request": 1})
    assert bus.events == []


def test_sim_holds_for_est_seconds(managers):
    m = managers("s0", "sim")
    model, _ = matmul_relu()
    m.load("k", Program.of(model, 0, 0, est_seconds=0.02))
    batch = {"x": RNG.standard_normal((2, 8)).astype(np.float32)}
    for run in (lambda: m.run_now("k", batch), lambda: blocking(m, "k", batch)) * 2:
        t0 = time.perf_counter()
        run()
        wall = time.perf_counter() - t0
        assert 0.02 <= wall < 0.06


def test_sim_devices_overlap(managers):
    est = 0.1
    devs = [managers(f"s{i}", "sim") for i in range(4)]
    model, _ = matmul_relu()
    for d in devs:
        d.load("k", Program.of(model, 0, 0, est_seconds=est))
    batch = {"x": RNG.standard_normal((2, 8)).astype(np.float32)}
    with ThreadPoolExecutor(4) as pool:
        t0 = time.perf_counter()
        list(pool.map(lambda d: blocking(d, "k", batch), devs))
        wall = time.perf_counter() - t0
    assert est <= wall < 1.6 * est


def test_chained_callbacks_across_devices(managers):
    devs = [managers(f"d{i}", functions={"k": Probe(hold=0.0002)}) for i in range(4)]
    finals = []
    all_done = threading.Event()

    def hop(i):
        def done(outputs, error):
            assert error is None
            if i + 1 < len(devs):
                devs[i + 1].call("k", {"x": outputs["y"]}, None, hop(i + 1))
            else:
                finals.append(int(outputs["y"]))
                if len(finals) == 64:
                    all_done.set()
        return done

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: devs[0].call("k", x(n), None, hop(0)), range(64)))
    assert all_done.wait(10)
    assert sorted(finals) == list(range(64))


def test_close_fails_queued_and_is_bounded(managers):
    gate = threading.Event()
    slow = Probe(gate=gate)
    m = managers("d0", functions={"k": slow})
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(m.run_now, "k", x(0))  # inline, on the pool's thread
        assert slow.entered.wait(5)
        queued = [pool.submit(blocking, m, "k", x(i)) for i in (1, 2)]
        threading.Timer(0.1, gate.set).start()
        t0 = time.perf_counter()
        m.close(timeout=2.0)
        assert time.perf_counter() - t0 < 1.0
        assert first.result(5) == {"y": 0}  # the running job finished
        for f in queued:
            assert str(f.exception(5)) == "device d0 closed"
    with pytest.raises(ExecutionError, match="closed"):
        blocking(m, "k", x(3))
    assert m.run_now("k", x(3)) is None
    assert [n for n, _ in slow.calls] == [0]


def test_close_returns_within_bound_when_job_hangs(managers):
    gate = threading.Event()
    stuck = Probe(gate=gate)
    m = managers("d0", functions={"k": stuck})
    landed = threading.Event()
    m.call("k", x(1), None, lambda *_: landed.set())  # the worker runs the stuck job
    assert stuck.entered.wait(5)
    t0 = time.perf_counter()
    m.close(timeout=0.2)
    assert time.perf_counter() - t0 < 0.5
    gate.set()
    assert landed.wait(5)


def test_supported_ops():
    cpu = supported_ops("cpu")
    assert cpu is not None and {"Conv", "MatMul", "Relu", "Constant", "Gelu"} <= cpu
    ref = supported_ops("reference")
    assert ref is not None and {"Add", "MatMul", "Gelu"} <= ref and "OpRun" not in ref
    assert supported_ops("sim") is None
    assert supported_ops("cpu") is cpu  # cached
