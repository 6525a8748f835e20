"""Large models (`runtime/large.py`): past protobuf's 2 GB found by their tensors' dims,
shape inferred and checked on a shell of typed weights, and handed to onnxruntime with
their weights held in memory beside them (`devices/external.py`); below it loaded in
about twice their weights' memory.

Writing a 2 GB model costs a minute of disk here, so the limit is lowered instead: every
path a model past 2 GB takes is taken, by a model of a few hundred kilobytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime.devices.external as external
import runtime.large as large
from app.cli import main
from benchmarks.common import relu_mlp
from runtime.devices import parse_devices
from runtime.devices.device import Program
from runtime.devices.ort.sessions import cpu_session
from runtime.errors import ModelLoadError
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.partition.submodel import extract, held_extract
from runtime.provision.from_model import Programs
from runtime.stored import stored_at, values

WIDTH, LAYERS = 128, 6  # 64 KB a weight


def _mlp(path, rng: np.random.Generator) -> None:
    """A ReLU MLP with a symbolic batch, its weights in a file beside it."""
    onnx.save(relu_mlp(WIDTH, LAYERS, rng), path, save_as_external_data=True,
              location="mlp.data", size_threshold=0)


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "mlp.onnx"
    _mlp(path, np.random.default_rng())
    return path


def test_a_model_past_2_gb_is_known_by_its_dims_with_nothing_serialized():
    claimed = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 29])  # 2 GB, empty
    graph = helper.make_graph([], "g", [], [], [claimed])
    assert large.too_large(helper.make_model(graph))
    constant = helper.make_node("Constant", [], ["c"], value=claimed)
    assert large.too_large(helper.make_model(helper.make_graph([constant], "g", [], [])))
    small = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 20])
    assert not large.too_large(helper.make_model(helper.make_graph([], "g", [], [], [small])))


def test_past_the_limit_a_model_loads_plans_runs_and_checks_with_its_weights_beside_it(
        model, monkeypatch):
    plain = load_graph(model)
    monkeypatch.setattr(large, "LIMIT", 100 << 10)  # the model's 384 KB is past it
    monkeypatch.setattr(large, "ROOM", 0)
    graph = load_graph(model)
    assert large.too_large(graph.model)
    assert {n: (t.dtype, t.shape) for n, t in graph.tensors.items()} == \
        {n: (t.dtype, t.shape) for n, t in plain.tensors.items()}  # inferred on the shell
    rng = np.random.default_rng()
    feeds = {"x": rng.standard_normal((3, WIDTH)).astype(np.float32)}
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)
    with HostManager(parse_devices("cpu:2")) as host:
        plan = host.add_network("mlp", str(model), partition="balanced", costs="model")
        assert len(plan.partitions) == 2
        got = host.run("mlp", feeds).result(30)
        np.testing.assert_allclose(got["r5"], want[0], rtol=1e-5, atol=1e-6)
        part = plan.partitions[0]
        for program in (Program.of(extract(graph, part), part.weight_bytes, 0),
                        Programs(graph, plan)[part.name]):  # held as extracted
            assert sum(f.nbytes for f in program.external.values()) == part.weight_bytes
            assert len(program.model) < part.weight_bytes / 10
    whole = cpu_session(graph.model, stamp=True)  # what `prism run --check` compares with
    np.testing.assert_allclose(whole.run(None, feeds)[0], want[0], rtol=1e-5, atol=1e-6)


def test_weights_read_from_a_file_stay_there_and_are_handed_on_as_views_of_it(model):
    """A network loaded from a file holds none of its weights: each is a shell naming its
    place in the file, handed to onnxruntime as a view of that file, mapped. Once the file
    is written after the load, a partition made again is refused in one line naming the
    file, and the sessions made before answer on."""
    graph = load_graph(model)
    weights = sum(t.nbytes for n, t in graph.tensors.items() if graph.is_weight(n))
    assert all(stored_at(t) is not None for t in graph.model.graph.initializer)
    assert graph.model.ByteSize() < weights / 10
    rng = np.random.default_rng()
    feeds = {"x": rng.standard_normal((3, WIDTH)).astype(np.float32)}
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)
    with HostManager(parse_devices("cpu:2")) as host:
        plan = host.add_network("mlp", graph, partition="balanced", costs="model")
        np.testing.assert_allclose(host.run("mlp", feeds).result(30)["r5"], want[0],
                                   rtol=1e-5, atol=1e-6)
        for part in plan.partitions:
            _, held = held_extract(graph, part)
            assert held is not None and all(isinstance(f, np.memmap)
                                            for f in held.files.values())
        data = model.with_name("mlp.data")
        read = data.stat().st_mtime_ns
        data.write_bytes(bytes(data.stat().st_size))  # zeros, as long, written after the load
        os.utime(data, ns=(read + 10**9, read + 10**9))  # a second later, on any file system
        with pytest.raises(ModelLoadError, match=f"^{data} was written .* load the model again"):
            held_extract(graph, plan.partitions[0])
        np.testing.assert_allclose(host.run("mlp", feeds).result(30)["r5"], want[0],
                                   rtol=1e-5, atol=1e-6)


def test_a_model_handed_to_onnxruntime_holds_its_weights_beside_it(model):
    graph = load_graph(model)
    data, held = external.serialized(graph.model)
    weights = sum(values(t).nbytes for t in graph.model.graph.initializer)
    assert sum(f.nbytes for f in held.values()) == weights and len(data) < weights / 10
    rng = np.random.default_rng()
    feeds = {"x": rng.standard_normal((2, WIDTH)).astype(np.float32)}
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)
    session = cpu_session(data, external=held)
    np.testing.assert_allclose(session.run(None, feeds)[0], want[0], rtol=1e-5, atol=1e-6)


def test_onnxruntime_copies_weights_held_in_memory_so_nothing_keeps_them():
    """A session made from weights held in memory reads them no more: devices drop them
    (a model past 2 GB would otherwise be held twice). Should an onnxruntime release read
    them in place, this fails before anything frees memory a session uses. (An Add reads
    its weight as it is; a MatMul's may be packed into a copy anyway.)"""
    rng = np.random.default_rng()
    weight = rng.standard_normal((WIDTH, WIDTH)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [WIDTH, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [WIDTH, WIDTH])],
        [numpy_helper.from_array(weight, "w")])
    data, held = external.serialized(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]))
    held = {name: file.copy() for name, file in held.items()}  # writable, to zero below
    session = cpu_session(data, external=held)
    x = rng.standard_normal((WIDTH, WIDTH)).astype(np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x + weight)
    for file in held.values():
        file[:] = 0
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x + weight)


def test_past_the_limit_a_model_saves_with_its_weights_beside_it_and_quantizes(
        model, tmp_path, monkeypatch, capsys):
    """Before, `prism quantize` on a model past 2 GB stopped at its first save with
    `internal error: EncodeError`; and onnx.save, told to write the weights beside a
    model, moves them out of the ModelProto itself, so a second save found none."""
    monkeypatch.setattr(large, "LIMIT", 100 << 10)
    monkeypatch.setattr(large, "ROOM", 0)
    whole = load_graph(model).model
    rng = np.random.default_rng()
    feeds = {"x": rng.standard_normal((2, WIDTH)).astype(np.float32)}
    outputs = []
    for name in ("a.onnx", "b.onnx"):
        assert external.save(whole, tmp_path / name)
        assert (tmp_path / f"{name}.data").stat().st_size >= WIDTH * WIDTH * 4 * LAYERS
        session = ort.InferenceSession(str(tmp_path / name), providers=["CPUExecutionProvider"])
        outputs.append(session.run(None, feeds)[0])
    np.testing.assert_array_equal(*outputs)
    data, out = tmp_path / "calibration.npz", tmp_path / "int8.onnx"
    np.savez(data, x=rng.standard_normal((16, WIDTH)).astype(np.float32))
    monkeypatch.setattr(large, "LIMIT", 50 << 10)  # the int8 model's 96 KB is past it too
    assert main(["quantize", str(model), "--calibrate", str(data), "-o", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bytes_int8"] < report["bytes_float"] / 3  # each with its data beside it
    assert report["bytes_float"] > WIDTH * WIDTH * 4 * LAYERS
    assert (tmp_path / "int8.onnx.data").exists()
    int8 = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    # six int8 layers calibrated on 16 random rows: near float as a whole, not per element
    assert np.linalg.norm(int8 - outputs[0]) < 0.3 * np.linalg.norm(outputs[0])


def test_text_stays_inside_a_model_whose_weights_are_held_beside_it():
    """ONNX keeps no text in external data: a vocabulary stays in the model's bytes."""
    words = np.array([f"word{i}" for i in range(512)], dtype=object)
    weight = np.random.default_rng().standard_normal((WIDTH, WIDTH)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["vocabulary"], ["words"]),
         helper.make_node("MatMul", ["x", "w"], ["y"])], "text",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
        [helper.make_tensor_value_info("words", TensorProto.STRING, [512]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])],
        [numpy_helper.from_array(words, "vocabulary"), numpy_helper.from_array(weight, "w")])
    data, held = external.serialized(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert [f.nbytes for f in held.values()] == [weight.nbytes]
    x = np.ones((1, WIDTH), np.float32)
    got_words, got_y = cpu_session(data, external=held).run(None, {"x": x})
    assert list(got_words) == list(words)
    np.testing.assert_allclose(got_y, x @ weight, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kind", [TensorProto.INT4, TensorProto.UINT4, TensorProto.FLOAT8E4M3FN,
                                  TensorProto.UINT16, TensorProto.INT8])
def test_a_weight_kept_in_a_typed_field_is_held_as_external_data_keeps_it(kind):
    """Held, a weight's values go into an in-memory file as ONNX's external data keeps
    them. Before, a 4-bit weight in `int32_data` went one value a byte, and onnxruntime
    refused it: "external data size mismatch. Computed size: 2048, external_data.length:
    4096"."""
    rng = np.random.default_rng()
    low = -8 if kind == TensorProto.INT4 else 0
    values = rng.integers(low, low + 16, (64, 64)).astype(np.float32)
    stored = numpy_helper.to_array(numpy_helper.from_array(
        values.astype(helper.tensor_dtype_to_np_dtype(kind)), "w"))
    weight = helper.make_tensor("w", kind, stored.shape, stored.flatten().tolist(), raw=False)
    assert not weight.raw_data
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["w", "scale"], ["d"]),
         helper.make_node("MatMul", ["x", "d"], ["y"])], "typed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        [weight, numpy_helper.from_array(np.array(0.5, np.float32), "scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    feeds = {"x": rng.standard_normal((2, 64)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("typed", model, costs="model")
        np.testing.assert_array_equal(host.run("typed", feeds).result(30)["y"], want)

def test_a_large_initializer_too_short_for_its_dims_is_refused_naming_it(tmp_path):
    """Large weights are checked one at a time, not inside the whole model: the check must
    still see each one's data."""
    weight = numpy_helper.from_array(np.ones((1024, 1024), np.float32), "embedding.weight")
    weight.raw_data = weight.raw_data[:-4]  # one float short
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "embedding.weight"], ["y"])], "short",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1024])], [weight])
    path = tmp_path / "short.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(ModelLoadError, match=r"short\.onnx fails the ONNX checker: .*"
                       r"embedding\.weight\) raw_data size \(4194300 bytes\) is too small"):
        load_graph(path)


# Loads one network of WIDTH x WIDTH weights, LAYERS of them, over two cpu devices, after
# a small one (the imports and first sessions); prints its weights' bytes, then the
# process's growth at its peak and after the load, from the resident memory before it.
MEASURED_LOAD = """
import sys
import numpy as np, onnx
from benchmarks.common import relu_mlp
from runtime.devices import parse_devices
from runtime.host import HostManager

def status(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1]) << 10

path, small, width, layers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
onnx.save(relu_mlp(width, layers, np.random.default_rng()), path)
weights = layers * width * width * 4
with HostManager(parse_devices("cpu:2")) as host:
    host.add_network("small", small, costs="model")
    before = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")  # the peak starts again from here
    host.add_network("wide", path, partition="balanced", costs="model")
    assert len(host.plan("wide").partitions) == 2
    print(weights, status("VmHWM") - before, status("VmRSS") - before)
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's /proc only")
@pytest.mark.parametrize("width, layers", [(2048, 6), (360, 190)],
                         ids=["16 MB weights", "500 KB weights"])
def test_a_large_model_loads_in_about_its_weights(tmp_path, width, layers):
    """A network loaded from a file keeps its weights once, in its sessions (the graph's
    stay in the file); loading it adds the file's parsed copy and each partition's for a
    moment. Before, 96 MB over two devices left the process 3.9x its weights larger, and
    took 6x at the peak: the weights were serialized whole for shape inference and the
    checker, every partition's copy was made before the first loaded, and what sessions
    freed stayed in the heap; then 2x, and 3.2x at the peak, the graph holding a copy.
    Weights under 1 MB each went to shape inference (`inferable`), and the types read off
    its model kept a third copy alive (2.9x)."""
    small = Path(__file__).parents[2] / "sample_models" / "mlp.onnx"
    done = subprocess.run([sys.executable, "-c", MEASURED_LOAD, str(tmp_path / "wide.onnx"),
                           str(small), str(width), str(layers)], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    weights, peak, after = map(int, done.stdout.split())
    assert after < 1.4 * weights, (after / weights, peak / weights)
    assert peak < 3 * weights, (after / weights, peak / weights)


# Loads the network at argv[1], then its graph again at another batch, with the process's
# private writable memory (what RLIMIT_DATA counts: not a file's read-only mapping) held to
# argv[2] bytes over what it had after a small load (the imports); prints a digest of its
# last weight's values read back. Nothing else is made in the process first: memory freed
# would stay in its heap, for the load to take without the limit seeing it.
LIMITED_LOAD = """
import hashlib, resource, sys
from runtime.graph import load_graph
from runtime.stored import values

load_graph("sample_models/mlp.onnx")
data = next(int(l.split()[1]) << 10 for l in open("/proc/self/status") if l.startswith("VmData"))
resource.setrlimit(resource.RLIMIT_DATA, (data + int(sys.argv[2]), resource.RLIM_INFINITY))
graph = load_graph(sys.argv[1])
load_graph(graph, bindings={"n": 2})
resource.setrlimit(resource.RLIMIT_DATA, (resource.RLIM_INFINITY,) * 2)
print(hashlib.sha256(values(graph.model.graph.initializer[-1]).tobytes()).hexdigest())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="Linux's RLIMIT_DATA")
@pytest.mark.parametrize("external", [False, True], ids=["one file", "external data"])
def test_a_model_file_loads_without_a_copy_of_its_weights_in_memory(tmp_path, external):
    """No weight is read as the model loads, nor when its graph is made again at other
    sizes: 96 MB within a twentieth of that. A one-file model's protobuf is parsed from a
    mapping of the file with its raw weights left out (onnx.load read the bytes into
    memory, then parsed a copy: 2x the weights; parsed from a mapping of them, 1.2x), an
    external data file's are not read (every byte was, then dropped: a peak of 1.4x, and
    0.46 s of a 384 MB model's 0.46 s graph load)."""
    model = relu_mlp(2048, 6, np.random.default_rng())
    weights = sum(len(t.raw_data) for t in model.graph.initializer)
    last = numpy_helper.to_array(model.graph.initializer[-1]).tobytes()
    path = tmp_path / "m.onnx"
    onnx.save(model, path, save_as_external_data=external, location="m.data")
    done = subprocess.run([sys.executable, "-c", LIMITED_LOAD, str(path), str(weights // 20)],
                          capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.split() == [hashlib.sha256(last).hexdigest()]


# Times each partition of a 96 MB network over two cpu devices as a first load does; prints
# its weights' bytes and what giving the heap back then frees: what timing left in it.
MEASURED_TIMING = """
import numpy as np
from benchmarks.common import relu_mlp
from runtime.devices import parse_devices
from runtime.graph import load_graph
from runtime.heap import give_back
from runtime.partition import partition
from runtime.partition.measure import time_partitions

def rss():
    line = next(l for l in open("/proc/self/status") if l.startswith("VmRSS:"))
    return int(line.split()[1]) << 10

graph = load_graph(relu_mlp(2048, 6, np.random.default_rng()))
plan = partition(graph, parse_devices("cpu:2"), "balanced")
assert len(plan.partitions) == 2 and time_partitions(graph, plan)
timed = rss()
give_back()
print(6 * 2048 * 2048 * 4, timed - rss())
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux's /proc only")
def test_timing_partitions_gives_their_weights_back_to_the_system():
    """Each timed partition's sub-model holds its share of the weights, given back to the
    system after each. The last one's stayed referenced while the heap was given back, so
    half the weights stayed in the process through the load that follows."""
    done = subprocess.run([sys.executable, "-c", MEASURED_TIMING], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    weights, left = map(int, done.stdout.split())
    assert left < 0.2 * weights, left / weights


def test_past_the_limit_a_model_trains_and_saves_its_weights_beside_it(
        model, tmp_path, monkeypatch, capsys):
    """Gradients past the limit equal those below it, and `prism train -o` writes the
    trained weights beside the model (before, onnx.save failed past 2 GB)."""
    from runtime.train import gradients

    rng = np.random.default_rng()
    feeds = {"x": rng.standard_normal((8, WIDTH)).astype(np.float32)}
    target = rng.standard_normal((8, WIDTH))
    below = gradients(str(model), feeds, target, loss="mse")
    monkeypatch.setattr(large, "LIMIT", 100 << 10)
    monkeypatch.setattr(large, "ROOM", 0)
    past = gradients(str(model), feeds, target, loss="mse")
    assert below.keys() == past.keys()
    for name, value in below.items():
        np.testing.assert_allclose(past[name], value, rtol=1e-6, atol=1e-7)
    data, out = tmp_path / "train.npz", tmp_path / "trained.onnx"
    np.savez(data, x=rng.standard_normal((32, WIDTH)).astype(np.float32),
             y=rng.standard_normal((32, WIDTH)).astype(np.float32))
    assert main(["train", str(model), "--data", str(data), "--labels", "y", "--loss", "mse",
                 "--optimizer", "sgd", "--lr", "0.01", "--batch-size", "8", "--micro-batches",
                 "2", "--epochs", "1", "--devices", "cpu:2", "-o", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["complete"]
    assert (tmp_path / "trained.onnx.data").stat().st_size >= WIDTH * WIDTH * 4 * LAYERS
    trained = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert np.isfinite(trained.run(None, feeds)[0]).all()
