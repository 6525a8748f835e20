"""Weights left in the file a network was read from (`runtime.stored`)."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from benchmarks.common import relu_mlp
from runtime.devices import parse_devices
from runtime.errors import ModelLoadError
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.large import tensor_bytes
from runtime.stored import STORED_MIN, _delimited, stored_at, values

WIDTH, LAYERS = 64, 4  # 16 KB a weight


def _model(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """relu_mlp, its first weight kept in a typed field (float_data) rather than raw bytes,
    and a bias too small to leave in the file; and every initializer's values."""
    model = relu_mlp(WIDTH, LAYERS, rng)
    first = model.graph.initializer[0]
    typed = numpy_helper.to_array(first)
    first.CopyFrom(helper.make_tensor(first.name, first.data_type, typed.shape,
                                      typed.ravel().tolist(), raw=False))
    bias = rng.standard_normal(WIDTH // 4, np.float32)  # 64 bytes
    model.graph.initializer.append(numpy_helper.from_array(np.tile(bias, 4), "b"))
    out = model.graph.output[0].name
    model.graph.node.append(helper.make_node("Add", [out, "b"], ["y"]))
    model.graph.output[0].name = "y"
    return model, {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_a_network_loaded_from_one_file_keeps_its_weights_in_it(tmp_path):
    """Each raw weight of STORED_MIN bytes or more is a shell naming where its bytes lie in
    the .onnx file (read off protobuf's wire format); the graph holds under a tenth of
    their bytes; and the network answers as onnxruntime does on the file."""
    rng = np.random.default_rng()
    model, weights = _model(rng)
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    graph = load_graph(path)
    shells = {t.name for t in graph.model.graph.initializer if stored_at(t) is not None}
    assert shells == {n for n, t in graph.initializers.items()
                      if t.raw_data == b"" and tensor_bytes(t) >= STORED_MIN} - {"w0"} \
        == {f"w{i}" for i in range(1, LAYERS)}  # the typed and the small one stay in memory
    for name, init in graph.initializers.items():
        np.testing.assert_array_equal(values(init), weights[name])
    held = weights["w0"].nbytes + weights["b"].nbytes
    assert graph.model.ByteSize() - held < sum(weights[n].nbytes for n in shells) / 10
    feeds = {"x": rng.standard_normal((3, WIDTH)).astype(np.float32)}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    with HostManager(parse_devices("cpu:2")) as host:
        plan = host.add_network("mlp", str(path), partition="balanced", costs="model")
        assert len(plan.partitions) == 2
        np.testing.assert_allclose(host.run("mlp", feeds).result(30)["y"], want[0],
                                   rtol=1e-5, atol=1e-6)


def test_a_file_whose_graph_is_given_twice_keeps_its_weights_in_memory(tmp_path):
    """Protobuf merges a message given twice: no one place holds a weight's bytes, so none
    is left in the file, and the network loads and answers all the same."""
    rng = np.random.default_rng()
    model, _ = _model(rng)
    nodes = onnx.ModelProto(graph=onnx.GraphProto(node=model.graph.node[:]))
    del model.graph.node[:]
    path = tmp_path / "twice.onnx"
    path.write_bytes(model.SerializeToString() + nodes.SerializeToString())
    graph = load_graph(path)
    assert not any(stored_at(t) for t in graph.model.graph.initializer)
    feeds = {"x": rng.standard_normal((2, WIDTH)).astype(np.float32)}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("mlp", graph)
        np.testing.assert_allclose(host.run("mlp", feeds).result(30)["y"], want[0],
                                   rtol=1e-5, atol=1e-6)


def test_a_file_removed_or_renamed_over_after_the_load_is_read_as_it_was(tmp_path):
    """The graph keeps the files its weights stay in open: another model renamed over the
    file, then the file removed, partitions made again read the weights as loaded (as a
    model exported to a temporary folder, or a repository updated, leaves them)."""
    rng = np.random.default_rng()
    path = tmp_path / "mlp.onnx"
    onnx.save(_model(rng)[0], path)
    feeds = {"x": rng.standard_normal((2, WIDTH)).astype(np.float32)}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    graph = load_graph(path)
    onnx.save(_model(rng)[0], tmp_path / "other.onnx")
    os.replace(tmp_path / "other.onnx", path)
    with HostManager(parse_devices("cpu:2")) as host:
        for name in ("replaced", "removed"):
            host.add_network(name, graph, partition="balanced", costs="model")
            np.testing.assert_allclose(host.run(name, feeds).result(30)["y"], want[0],
                                       rtol=1e-5, atol=1e-6)
            path.unlink(missing_ok=True)


def test_a_file_naming_a_shell_of_its_own_is_read_as_onnx_reads_it(tmp_path):
    """A shell is Prism's own: a weight whose external data entry in a file (or bytes)
    names one, pointing at another file of the machine by its absolute path, is refused
    as onnx refuses that path, never read from the file it names."""
    rng = np.random.default_rng()
    elsewhere = tmp_path / "elsewhere.bin"
    elsewhere.write_bytes(rng.bytes(4 * WIDTH * WIDTH))
    model = relu_mlp(WIDTH, 2, rng)
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    size, mtime = os.stat(elsewhere).st_size, os.stat(elsewhere).st_mtime_ns
    for key, value in (("location", elsewhere), ("offset", 0), ("length", size),
                       ("prism.version", f"{size}:{mtime}")):
        weight.external_data.add(key=key, value=str(value))
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    refused = r"tensor name: w0\) should be a relative path, but it is an absolute path"
    with pytest.raises(ModelLoadError, match=refused) as raised:
        load_graph(path)
    assert str(raised.value).startswith(str(path))
    with pytest.raises(ModelLoadError, match=refused):
        load_graph(model.SerializeToString())


def test_a_weight_whose_fields_come_in_any_order_is_left_in_the_file(tmp_path):
    """The file is parsed with each large weight's raw bytes left out and the messages
    around them encoded again (`stored._without`): a tensor written by another tool, its
    raw bytes first and its name and dims after them, is a shell all the same, and the
    network answers as onnxruntime does on the file."""
    rng = np.random.default_rng()
    model = relu_mlp(WIDTH, 3, rng)
    first = model.graph.initializer[0]
    reordered = b"".join(onnx.TensorProto(**{key: getattr(first, key)}).SerializeToString()
                         for key in ("raw_data", "name", "dims", "data_type"))
    graph = onnx.GraphProto()
    graph.CopyFrom(model.graph)
    del graph.initializer[0]
    model.ClearField("graph")
    path = tmp_path / "reordered.onnx"
    path.write_bytes(model.SerializeToString() + _delimited(7, graph.SerializeToString()
                                                            + _delimited(5, reordered)))
    loaded = load_graph(path)
    assert all(stored_at(t) for t in loaded.model.graph.initializer)
    feeds = {"x": rng.standard_normal((2, WIDTH)).astype(np.float32)}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    with HostManager(parse_devices("cpu:2")) as host:
        host.add_network("mlp", loaded, partition="balanced", costs="model")
        got = host.run("mlp", feeds).result(30)
    np.testing.assert_allclose(got[loaded.outputs[0]], want[0], rtol=1e-5, atol=1e-6)


def test_a_model_saved_again_in_one_file_keeps_its_weights_in_it(tmp_path):
    """onnx reading external data in says each weight's data lies in the file itself
    (`data_location` set, to DEFAULT): saved again in one file, the weights are shells
    all the same, not kept in memory."""
    rng = np.random.default_rng()
    onnx.save(relu_mlp(WIDTH, 3, rng), tmp_path / "split.onnx", save_as_external_data=True,
              location="split.data", size_threshold=0)
    model = onnx.load(tmp_path / "split.onnx")
    assert all(t.HasField("data_location") for t in model.graph.initializer)
    onnx.save(model, tmp_path / "whole.onnx")
    graph = load_graph(tmp_path / "whole.onnx")
    for init, kept in zip(graph.model.graph.initializer, model.graph.initializer, strict=True):
        assert stored_at(init) is not None
        np.testing.assert_array_equal(values(init), numpy_helper.to_array(kept))


def test_a_weight_split_by_folding_stays_in_its_file(tmp_path):
    """A mixture of experts' stacked weights split one per expert (Split, Squeeze) fold to
    bytes of the file, in order: each is a shell naming them, not a copy the graph holds
    (a Qwen2-MoE export held 123 of its 132 MB so); a Transpose folds to new bytes, which
    the graph holds. The network answers as onnxruntime does on the file."""
    rng = np.random.default_rng()
    experts = rng.standard_normal((3, WIDTH, WIDTH)).astype(np.float32)
    split = [f"s{i}" for i in range(3)]
    nodes = [helper.make_node("Split", ["experts"], split, axis=0, num_outputs=3),
             *(helper.make_node("Squeeze", [s, "axis"], [f"w{i}"]) for i, s in enumerate(split)),
             helper.make_node("Transpose", ["w2"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "w0"], ["h0"]),
             helper.make_node("MatMul", ["h0", "w1"], ["h1"]),
             helper.make_node("MatMul", ["h1", "wt"], ["y"])]
    graph = helper.make_graph(
        nodes, "experts", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                         ["n", WIDTH])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", WIDTH])],
        [numpy_helper.from_array(experts, "experts"),
         numpy_helper.from_array(np.array([0], np.int64), "axis")])
    path = tmp_path / "experts.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    loaded = load_graph(path)
    weights = {t.name: t for t in loaded.model.graph.initializer}
    assert {"w0", "w1", "wt"} <= set(weights) and "experts" not in weights
    assert stored_at(weights["w0"]) and stored_at(weights["w1"]) and not stored_at(weights["wt"])
    for name, want in (("w0", experts[0]), ("w1", experts[1]), ("wt", experts[2].T)):
        np.testing.assert_array_equal(values(weights[name]), want)
    feeds = {"x": rng.standard_normal((2, WIDTH)).astype(np.float32)}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    with HostManager(parse_devices("cpu:2")) as host:
        host.add_network("experts", loaded, partition="balanced", costs="model")
        np.testing.assert_allclose(host.run("experts", feeds).result(30)["y"], want[0],
                                   rtol=1e-5, atol=1e-5)
