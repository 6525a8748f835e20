"""load_graph: sources, node naming, symbolic dims, outer-scope reads, load errors."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys

import networkx as nx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from onnx import TensorProto, helper, numpy_helper

from app.cli import main
from runtime.cost import node_cost
from runtime.devices import parse_devices
from runtime.errors import DeviceMemoryError, ModelLoadError, PartitionError
from runtime.free_dims import AUDIO_SAMPLES, IMAGE_SIDE, VIDEO_FRAMES
from runtime.graph import Graph, load_graph
from runtime.host import HostManager
from runtime.inputs import InputSpec, input_specs, random_feeds
from runtime.least_sizes import least_sizes
from runtime.run_sizes import run_sizes
from tests.cli.test_cli import one_line_error
from tests.support.dags import (
    SAMPLE_NAMES,
    SAMPLES_DIR,
    box_reader,
    dag_models,
    genai_decoder,
    masked_cache_step,
    pixel_attention,
    random_dag_model,
    reads_of,
    spectrogram_stem,
    speech_frontend,
    upsampling_detector,
    video_stem,
    vit_stem,
)


def _runs_as_onnxruntime(capsys, source: str, requests: int = 3) -> None:
    """`prism run --check` of `source` on made-up inputs succeeds, every answer as
    onnxruntime's."""
    assert main(["run", source, "--devices", "cpu:2", "--requests", str(requests),
                 "--check"]) == 0, capsys.readouterr().err
    assert "every output matches onnxruntime" in capsys.readouterr().out


def summary(g: Graph) -> list[tuple]:
    return [(n.name, n.op_type, n.inputs, n.outputs, n.outer_inputs, n.index) for n in g.nodes]


def shapes(g: Graph) -> dict[str, tuple]:
    return {t: (v.shape, v.dims, v.dtype) for t, v in g.tensors.items()}


# ------------------------------------------------------------------------------------
# Sources
# ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_path_bytes_and_proto_give_the_same_graph(name):
    path = SAMPLES_DIR / f"{name}.onnx"
    proto = onnx.load(str(path))
    graphs = [load_graph(path), load_graph(str(path)), load_graph(path.read_bytes()),
              load_graph(proto)]
    first = graphs[0]
    assert first.nodes, "a sample model has nodes"
    for g in graphs[1:]:
        assert summary(g) == summary(first)
        assert shapes(g) == shapes(first)
        assert g.inputs == first.inputs and g.outputs == first.outputs
        assert set(g.initializers) == set(first.initializers)
        assert sorted(g.dag.edges) == sorted(first.dag.edges)
    assert [n.name for n in first.nodes] == [n.name for n in proto.graph.node]


def test_graph_basics_on_a_random_dag():
    model = random_dag_model(7, 25, batch="batch")
    g = load_graph(model)
    assert [n.name for n in g.nodes] == [n.name for n in model.graph.node]
    assert g.inputs == ["x"]
    assert g.outputs == [o.name for o in model.graph.output]
    assert set(g.initializers) == {t.name for t in model.graph.initializer}
    made = {t: n.name for n in g.nodes for t in n.outputs}
    edges = {(made[t], n.name) for n in g.nodes for t in reads_of(n) if t in made}
    assert set(g.dag.edges) == edges
    assert nx.is_directed_acyclic_graph(g.dag)
    for t, info in g.tensors.items():
        if info.shape is not None and info.dtype == "float32":
            assert g.tensor_bytes(t) == 4 * math.prod(info.shape)
    for t, init in g.initializers.items():
        assert g.tensor_bytes(t) == numpy_helper.to_array(init).nbytes
    assert g.tensor_bytes("no such tensor") == 0


def test_loading_a_proto_leaves_it_untouched():
    model = _unnamed_model()
    before = model.SerializeToString()
    g = load_graph(model)
    assert all(n.name for n in g.nodes)
    assert model.SerializeToString() == before
    assert all(not n.name for n in model.graph.node)


# ------------------------------------------------------------------------------------
# Node names
# ------------------------------------------------------------------------------------
def _unnamed_model(names: list[str] | None = None) -> onnx.ModelProto:
    ops = ["Relu", "Sigmoid", "Relu", "Tanh", "Relu", "Neg"]
    names = names if names is not None else [""] * len(ops)
    nodes, prev = [], "x"
    for i, (op, name) in enumerate(zip(ops, names, strict=True)):
        nodes.append(helper.make_node(op, [prev], [f"y{i}"], name=name))
        prev = f"y{i}"
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_unnamed_nodes_get_stable_unique_names():
    model = _unnamed_model()
    a = [n.name for n in load_graph(model).nodes]
    b = [n.name for n in load_graph(model.SerializeToString()).nodes]
    c = [n.name for n in load_graph(_unnamed_model()).nodes]
    assert a == b == c
    assert len(set(a)) == len(a) and all(a)


@pytest.mark.parametrize("names", [
    ["a", "a", "a", "b", "b", "c"],
    ["", "Relu_0", "", "Relu_2", "", ""],          # generated names would clash
    ["x_1", "x", "x", "x_1", "", "x_2"],           # renamed duplicate clashes with a later name
    ["Sigmoid_1", "", "n", "n", "n_3", "n_3_1"],
])
def test_duplicate_and_clashing_names_are_made_unique(names):
    model = _unnamed_model(names)
    g1, g2 = load_graph(model), load_graph(model)
    got = [n.name for n in g1.nodes]
    assert got == [n.name for n in g2.nodes]
    assert len(set(got)) == len(got) and all(got)
    # The first node to use a name keeps it.
    seen: set[str] = set()
    for name, new in zip(names, got, strict=True):
        if name and name not in seen:
            assert new == name
        seen.add(name)
    # The graph still wires up: a chain of len(names) nodes.
    assert nx.is_directed_acyclic_graph(g1.dag)
    assert g1.dag.number_of_edges() == len(names) - 1
    assert g1.node(got[-1]).op_type == "Neg"


# ------------------------------------------------------------------------------------
# Symbolic dims
# ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_symbolic_batch_binds_to_one_by_default_and_to_bindings(name):
    path = SAMPLES_DIR / f"{name}.onnx"
    g1 = load_graph(path)
    g8 = load_graph(path, bindings={"batch": 8})
    g3 = load_graph(path, default_dim=3)
    assert g8.bindings == {"batch": 8}
    batched = 0
    for t, info in g1.tensors.items():
        if t in g1.initializers:
            assert g8.tensors[t].shape == info.shape
            assert g8.tensor_bytes(t) == g1.tensor_bytes(t)
            continue
        if info.dims and info.dims[0] == "batch":
            batched += 1
            assert info.shape[0] == 1, t
            assert g8.tensors[t].dims == info.dims, "dims keep the symbol"
            assert g8.tensors[t].shape == (8, *info.shape[1:]), t
            assert g3.tensors[t].shape == (3, *info.shape[1:]), t
            assert g8.tensor_bytes(t) == 8 * g1.tensor_bytes(t) > 0
    inp = g1.inputs[0]
    assert g1.tensors[inp].dims[0] == "batch"
    assert g1.tensors[g1.outputs[0]].dims[0] == "batch"
    assert batched >= 3
    # Costs follow the bound shapes: every node but the batch-free ones costs more.
    flops1 = sum(node_cost(g1, n).flops for n in g1.nodes)
    flops8 = sum(node_cost(g8, n).flops for n in g8.nodes)
    assert flops8 > 4 * flops1


def test_bindings_on_a_random_dag_with_symbolic_batch():
    model = random_dag_model(11, 15, batch="batch")
    g1, g5 = load_graph(model), load_graph(model, bindings={"batch": 5})
    checked = 0
    for n in g1.nodes:
        if n.op_type in ("ReduceSum", "Greater"):  # the scalars feeding an If
            assert g1.tensors[n.outputs[0]].dims == ()
            continue
        for t in n.outputs:
            checked += 1
            assert g1.tensors[t].dims[0] == "batch"
            assert g5.tensors[t].dims == g1.tensors[t].dims
            assert g5.tensors[t].shape == (5, *g1.tensors[t].shape[1:])
    assert checked >= 10


def test_an_images_free_height_and_width_are_costed_and_made_up_at_a_side_networks_take():
    """1 for every other free dimension; the image side for a name an image input has as
    a side, on every input naming it; unnamed sides too (server metadata says -1)."""
    side = IMAGE_SIDE
    g = load_graph(upsampling_detector(["batch", 3, "height", "width"]))
    assert g.tensors["image"].shape == (1, 3, side, side)
    assert g.tensors["joined"].shape == (1, 16, side, side)
    assert load_graph(upsampling_detector(["batch", 3, "height", "width"]),
                      bindings={"height": 64}).tensors["joined"].shape == (1, 16, 64, side)
    specs = [InputSpec("nchw", np.dtype(np.float32), ("n", 3, "h", "w")),
             InputSpec("nhwc", np.dtype(np.float16), ("n", "h", "w", 4)),
             InputSpec("mask", np.dtype(np.int64), ("n", "h", "w")),
             InputSpec("tokens", np.dtype(np.int64), ("n", "t")),
             InputSpec("unnamed", np.dtype(np.float32), (None, 1, None, None)),
             InputSpec("text_line", np.dtype(np.float32), ("n", 3, 48, "width")),
             InputSpec("keys", np.dtype(np.float32), ("n", 4, "past", 64)),
             InputSpec("few_heads", np.dtype(np.float32), ("n", 2, "cached", 4)),
             InputSpec("no_image", np.dtype(np.float32), ("n", 5, "a", "b")),
             InputSpec("ints", np.dtype(np.int64), ("n", 3, "a", "b"))]
    rng = np.random.default_rng()
    shapes = {k: v.shape for k, v in random_feeds(specs, rng).items()}
    assert shapes == {"nchw": (1, 3, side, side), "nhwc": (1, side, side, 4),
                      "mask": (1, side, side), "tokens": (1, 1), "unnamed": (1, 1, side, side),
                      "text_line": (1, 3, 48, side), "keys": (1, 4, 1, 64),
                      "few_heads": (1, 2, 1, 4),
                      "no_image": (1, 5, 1, 1), "ints": (1, 3, 1, 1)}
    bound = random_feeds(specs, rng, {"h": 32, "t": 7})
    assert bound["nchw"].shape == (1, 3, 32, side) and bound["mask"].shape == (1, 32, side)
    assert bound["tokens"].shape == (1, 7)


@pytest.mark.parametrize(("dims", "shape"), [
    (["s99", "3", "s100", "s4"], (1, 3, IMAGE_SIDE, IMAGE_SIDE)),
    ([3, "height", "width"], (3, IMAGE_SIDE, IMAGE_SIDE)),
    (["batch_size", "num_channels", "height", "width"], (1, 3, IMAGE_SIDE, IMAGE_SIDE)),
], ids=["dynamo", "one_image", "optimum"])
def test_an_image_whose_channels_are_named_by_a_number_is_made_up_at_a_side_networks_take(
        capsys, tmp_path, dims, shape):
    """torch's dynamo exporter names an image's every dimension, its channels by their
    number (`[s99, "3", s100, s4]`): read as no image, the sides were made up 1 wide and
    an EfficientNet export failed every request, as this detector did. Nor was one image
    without a batch ([3, height, width], as the model zoo's Faster R-CNN takes it), nor
    one whose channels are free, sized by the convolution reading them (optimum's exports:
    [batch_size, num_channels, height, width], made up 1x1x1x1)."""
    model = upsampling_detector(dims)
    assert load_graph(model).tensors["image"].shape == shape
    specs = [InputSpec("nhwc", np.dtype(np.float32), ("n", "h", "w", "4")),
             InputSpec("keys", np.dtype(np.float32), ("n", "4", "past", "64"))]
    shapes = {k: v.shape for k, v in random_feeds(specs, np.random.default_rng()).items()}
    assert shapes == {"nhwc": (1, IMAGE_SIDE, IMAGE_SIDE, 4), "keys": (1, 4, 1, 64)}
    path = str(tmp_path / "dynamo_style.onnx")
    onnx.save(model, path)
    _runs_as_onnxruntime(capsys, path)


def test_a_waveforms_free_length_is_made_up_at_a_second_of_speech(capsys, tmp_path):
    """wav2vec2, HuBERT and WavLM read [batch, samples]: made up one sample long, their
    convolutions' kernels outgrew it and every request failed. A float mask sharing its
    tokens' length, or a length named by a sum, is no waveform."""
    model = speech_frontend(["batch", "samples"])
    assert load_graph(model).tensors["waveform"].shape == (1, AUDIO_SAMPLES)
    assert load_graph(model, bindings={"samples": 400}).tensors["waveform"].shape == (1, 400)
    specs = [InputSpec("tokens", np.dtype(np.int64), ("n", "t")),
             InputSpec("mask", np.dtype(np.float32), ("n", "t")),
             InputSpec("sums", np.dtype(np.float32), ("n", "t + 1")),
             InputSpec("features", np.dtype(np.float32), ("n", 5)),
             InputSpec("unnamed", np.dtype(np.float32), (None, None)),
             InputSpec("clip", np.dtype(np.float16), ("n", "length"))]
    shapes = {k: v.shape for k, v in random_feeds(specs, np.random.default_rng()).items()}
    assert shapes == {"tokens": (1, 1), "mask": (1, 1), "sums": (1, 2), "features": (1, 5),
                      "unnamed": (1, 1), "clip": (1, AUDIO_SAMPLES)}
    path = str(tmp_path / "speech.onnx")
    onnx.save(model, path)
    _runs_as_onnxruntime(capsys, path)


@pytest.mark.parametrize(("dims", "frames_first", "shape"), [
    (["n", 3, "t", "h", "w"], False, (1, 3, VIDEO_FRAMES, IMAGE_SIDE, IMAGE_SIDE)),
    ([1, "s59", "3", "224", "224"], True, (1, VIDEO_FRAMES, 3, 224, 224)),  # VideoMAE's
    ([1, "8", "3", "s4", "s17"], True, (1, 8, 3, IMAGE_SIDE, IMAGE_SIDE)),  # TimeSformer's
], ids=["torchvision", "videomae", "timesformer"])
def test_a_videos_free_length_and_sides_are_made_up_at_a_clip_networks_take(
        capsys, tmp_path, dims, frames_first, shape):
    """Rank 5 was no image: a clip was made up one frame of 1x1 (VideoMAE's export leaves
    its length free, TimeSformer's its sides), and every request failed."""
    model = video_stem(dims, frames_first)
    assert load_graph(model).tensors["clip"].shape == shape
    path = str(tmp_path / "video.onnx")
    onnx.save(model, path)
    _runs_as_onnxruntime(capsys, path, requests=2)


@pytest.mark.parametrize("layout", ["nchw", "nhwc", "clip of fixed sides", "clip of free sides",
                                    "frame by frame, sides sliced", "frame by frame, gathered"])
def test_a_vision_transformers_free_sides_are_made_up_at_its_position_embeddings_side(
        capsys, tmp_path, layout):
    """SigLIP at 384, or a ViT of any side but 224 (OWL-ViT's and DINOv2's small configs):
    made up 224, the patches outnumbered the position embedding and every request failed
    at its Add. The side is the one its embedding is for, whatever tokens come first; a
    clip's length too, where its sides are fixed (VideoMAE's and ViViT's small configs,
    made up 16 frames), and a clip patched frame by frame after a Reshape (TimeSformer's
    small config, made up 224 a side)."""
    rng = np.random.default_rng()
    patch, grid, extra = (int(n) for n in (rng.integers(2, 9), rng.integers(2, 13),
                                           rng.integers(0, 3)))
    side, length = grid * patch, 2 * int(rng.integers(1, 7))
    dims, shape, frames = {
        "nchw": (["batch", 3, "height", "width"], (1, 3, side, side), 0),
        "nhwc": (["s99", "s4", "s17", 3], (1, side, side, 3), 0),
        "clip of fixed sides": ([1, "s59", "3", str(side), str(side)],
                                (1, length, 3, side, side), length),
        "clip of free sides": (["n", length, 3, "h", "w"], (1, length, 3, side, side), length),
    }.get(layout, (["n", length, 3, "h", "w"], (1, length, 3, side, side), length))
    assert side != IMAGE_SIDE and length < VIDEO_FRAMES
    model = vit_stem(dims, patch, grid, extra, frames,
                     frame_by_frame=layout.rpartition(" ")[2] if "frame by" in layout else "")
    assert load_graph(model).tensors["pixels"].shape == shape
    path = str(tmp_path / "vit.onnx")
    onnx.save(model, path)
    _runs_as_onnxruntime(capsys, path, requests=2)


def test_a_spectrograms_free_sides_are_made_up_at_its_position_embeddings_count(
        capsys, tmp_path):
    """The audio spectrogram transformer patches [frames, mel bins] with overlapping
    patches into a grid that is no square (12 x 101 at AudioSet's 1024 frames of 128 bins)
    and joins 2 tokens in front: made up [1, 1, 1], every request failed at its Conv. The
    tokens joined are counted, the patches made into the grid nearest a square."""
    rng = np.random.default_rng()
    patch = int(rng.integers(3, 9))
    stride, rows, extra = int(rng.integers(1, patch + 1)), int(rng.integers(2, 5)), int(
        rng.integers(1, 3))
    cols = rows + int(rng.integers(1, 4))  # no square
    model = spectrogram_stem(patch, stride, rows, cols, extra)
    frames, mel = load_graph(model).tensors["spectrogram"].shape[1:]
    grid = sorted(((mel - patch) // stride + 1, (frames - patch) // stride + 1))
    assert grid[0] * grid[1] == rows * cols and grid[0] >= 2
    path = str(tmp_path / "spectrogram.onnx")
    onnx.save(model, path)
    _runs_as_onnxruntime(capsys, path, requests=2)


def test_a_signals_free_length_is_made_up_as_long_as_its_windows_need():
    """A keyword spotter's unpadded Conv1d over [batch, features, frames], made up 1 frame
    long, failed every request at its first convolution. The length is the least at
    which every window after it (convolutions and a pooling, strided, dilated, padded,
    rounding up or down) still takes a step: the least onnxruntime runs it at."""
    rng = np.random.default_rng()
    k1, s1, d1, k2, s2, k3, pad = (int(rng.integers(lo, hi)) for lo, hi in (
        (2, 8), (1, 4), (1, 3), (2, 5), (1, 4), (2, 8), (0, 3)))
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["c1"], strides=[s1], dilations=[d1]),
         helper.make_node("Relu", ["c1"], ["r1"]),
         helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[k2], strides=[s2],
                          ceil_mode=int(rng.integers(0, 2))),
         helper.make_node("Conv", ["p1", "w2"], ["c2"], pads=[pad, pad]),
         helper.make_node("GlobalAveragePool", ["c2"], ["y"])], "spotter",
        [helper.make_tensor_value_info("x", f, ["batch", 8, "frames"])],
        [helper.make_tensor_value_info("y", f, None)],
        [numpy_helper.from_array(rng.standard_normal((8, 8, k)).astype(np.float32), name)
         for name, k in (("w1", k1), ("w2", k3))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    seen = copy.deepcopy(model)  # every window's output, to see it is not empty
    seen.graph.output.extend(helper.make_tensor_value_info(t, f, None) for t in ("c1", "p1"))
    session = ort.InferenceSession(seen.SerializeToString(), providers=["CPUExecutionProvider"])

    def runs(frames: int) -> bool:
        try:
            outputs = session.run(None, {"x": np.zeros((1, 8, frames), np.float32)})
        except Exception:  # onnxruntime refuses some windows past their input
            return False
        return all(o.size for o in outputs)

    least = next(n for n in range(1, 1000) if runs(n))
    assert load_graph(model).tensors["x"].shape == (1, 8, least)


@pytest.mark.parametrize("shape, op, attributes", [
    (["batch", 3, 16, 16], "Conv", {"strides": [1]}),  # a patch embedding's, one axis short
    (["batch", 3, "frames"], "Conv", {"pads": [1]}),
    (["batch", 3, "frames"], "Conv", {"strides": [0]}),
    (["batch", 3, "frames"], "MaxPool", {"kernel_shape": [2], "pads": [1]}),
], ids=["strides", "pads", "stride 0", "pooling pads"])
def test_a_window_of_malformed_attributes_is_left_for_onnxruntime_to_name(
        capsys, tmp_path, shape, op, attributes):
    """Sizing made-up inputs read a window's attributes as whole (a fuzzed convolution's
    strides, one long for two axes: an IndexError from `prism partition`); onnx's checker
    passes such a node and onnxruntime names it, in one line."""
    rng = np.random.default_rng()
    f = TensorProto.FLOAT
    weight = numpy_helper.from_array(
        rng.standard_normal((3, 3, *[3] * (len(shape) - 2))).astype(np.float32), "w")
    first = helper.make_node("Relu", ["x"], ["h"]) if op == "Conv" else helper.make_node(
        "Conv", ["x", "w"], ["h"])  # a pooling is sized after a convolution
    window = helper.make_node(op, ["h", "w"] if op == "Conv" else ["h"], ["c"], name="window",
                              **attributes)
    model = helper.make_model(helper.make_graph(
        [first, window, helper.make_node("Relu", ["c"], ["y"])], "malformed",
        [helper.make_tensor_value_info("x", f, shape)],
        [helper.make_tensor_value_info("y", f, None)], [weight]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "malformed.onnx")
    onnx.save(model, path)
    assert load_graph(path).tensors["x"].shape[:2] == (1, 3)
    said = one_line_error(capsys, ["run", path, "--devices", "cpu:1", "--requests", "2"])
    assert said.startswith("prism: error: ") and "window" in said, said


def test_a_window_larger_than_its_input_costs_no_negative_size(capsys, tmp_path):
    """onnx's inference gives a convolution whose kernel passes its input a negative
    output side (a fuzzed MobileViT's: -999,941): costed at it, a node took negative
    time, and the balanced split indexed past its last node (IndexError). Such a size
    is unknown, and onnxruntime names the node."""
    rng = np.random.default_rng()
    side = int(rng.integers(2, 20))
    kernel = side + int(rng.integers(2, 10))  # an output side of -1 or less
    f = TensorProto.FLOAT
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]),
         helper.make_node("Conv", ["r", "w"], ["c"], name="window"),
         helper.make_node("Relu", ["c"], ["y"])], "larger",
        [helper.make_tensor_value_info("x", f, [1, 3, side, side])],
        [helper.make_tensor_value_info("y", f, None)],
        [numpy_helper.from_array(
            rng.standard_normal((4, 3, kernel, kernel)).astype(np.float32), "w")]),
        opset_imports=[helper.make_opsetid("", 17)])
    graph = load_graph(model)
    assert min(graph.tensors["c"].shape) >= 0, graph.tensors["c"].shape
    assert min(node_cost(graph, n).flops for n in graph.nodes) >= 0
    path = str(tmp_path / "larger.onnx")
    onnx.save(model, path)
    said = one_line_error(capsys, ["run", path, "--devices", "cpu:2", "--requests", "2"])
    assert said.startswith("prism: error: ") and "Conv" in said, said


def test_sizes_onnx_inference_leaves_unknown_are_found_by_onnxruntimes_symbolic_inference():
    """A Reshape to a shape computed through arithmetic onnx's inference does not follow
    left the pixels' count unknown, bound to 1: the scores over h * w pixels were costed,
    and held, as 1 x 1. onnxruntime's symbolic inference follows it."""
    h, w = (int(n) for n in np.random.default_rng().integers(2, 40, 2))
    graph = load_graph(pixel_attention(), bindings={"h": h, "w": w})
    assert graph.tensors["scores"].shape == (1, h * w, h * w)
    assert graph.tensors["scores"].dims[1] is not None  # a size found, not declared


# Loads `pixel_attention` at h and w (argv) and prints the scores' shape, and whether
# sympy (which onnxruntime's symbolic inference imports) was imported for it.
SYMBOLIC_LOAD = """
import json, sys
from runtime.graph import load_graph
from tests.support.dags import pixel_attention
graph = load_graph(pixel_attention(), bindings={"h": int(sys.argv[1]), "w": int(sys.argv[2])})
print(json.dumps({"scores": graph.tensors["scores"].shape, "sympy": "sympy" in sys.modules}))
"""


def test_a_later_process_reads_back_what_symbolic_inference_sized(tmp_path):
    """Importing sympy and inferring took 0.4 s of a new process's first load of GPT-2
    (0.97 s in all). A later process reads the sizes back, and a damaged entry costs
    inferring them again."""
    h, w = (str(n) for n in np.random.default_rng().integers(2, 40, 2))

    def load() -> dict:
        done = subprocess.run([sys.executable, "-c", SYMBOLIC_LOAD, h, w], capture_output=True,
                              text=True, timeout=120, cwd=SAMPLES_DIR.parent,
                              env={**os.environ, "PRISM_CACHE_DIR": str(tmp_path)})
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    scores = [1, int(h) * int(w), int(h) * int(w)]
    assert load() == {"scores": scores, "sympy": True}
    assert load() == {"scores": scores, "sympy": False}
    (kept,) = (tmp_path / "symbolic").iterdir()
    kept.write_text(kept.read_text().replace('"', "'", 3))
    assert load() == {"scores": scores, "sympy": True}
    assert load() == {"scores": scores, "sympy": False}


def test_symbolic_inference_prints_nothing_of_its_own(tmp_path):
    """Its numpy arithmetic warned on stderr ("divide by zero encountered") at a Slice of
    step 0, above the one line `prism run` says; onnxruntime names that node."""
    f = TensorProto.FLOAT
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Slice", ["x", "start", "end", "axis", "step"], ["y"], name="sliced")],
        "stepless", [helper.make_tensor_value_info("x", f, ["n", 8])],
        [helper.make_tensor_value_info("y", f, None)],
        [numpy_helper.from_array(np.array([v]), name) for name, v in
         (("start", 0), ("end", int(np.random.default_rng().integers(1, 8))), ("axis", 1),
          ("step", 0))]), opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / "stepless.onnx")
    onnx.save(model, path)
    done = subprocess.run([sys.executable, "-m", "app.cli", "run", path, "--devices", "cpu:1",
                           "--requests", "2"], capture_output=True, text=True, timeout=120,
                          cwd=SAMPLES_DIR.parent)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("prism: error: ") and "sliced" in done.stderr, done.stderr


def test_made_up_image_sides_halve_while_a_tensor_at_them_would_not_fit(
        capsys, tmp_path, monkeypatch):
    """Stable Diffusion's VAE decoder attends over every latent pixel: made up 224 a side,
    10 GB of scores, and the run was killed for want of memory (the UNet: 80 GB). Made-up
    image sides halve while a tensor at them passes a bound (1 GB; here 64 MB, for a light
    run): the sides free requests are made up at too."""
    from runtime import graph as loaded

    monkeypatch.setattr(loaded, "_MADE_UP_MOST", 64 << 20)
    model = pixel_attention()
    graph = load_graph(model)
    assert graph.tensors["image"].shape == (1, 3, 56, 56)  # 224: 10 GB, 112: 630 MB, 56: 39 MB
    assert graph.tensors["scores"].shape == (1, 56 * 56, 56 * 56)
    feeds = random_feeds(input_specs(graph), np.random.default_rng())
    assert feeds["image"].shape == (1, 3, 56, 56)
    bound = load_graph(model, bindings={"h": 224, "w": 224})  # what is bound, stays
    assert bound.tensors["image"].shape == (1, 3, 224, 224)
    path = str(tmp_path / "attention.onnx")
    onnx.save(model, path)
    _runs_as_onnxruntime(capsys, path, requests=2)


def _conv_of(dims: list) -> onnx.ModelProto:
    f = TensorProto.FLOAT
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["image", "w"], ["y"], name="conv")], "conv",
        [helper.make_tensor_value_info("image", f, dims)],
        [helper.make_tensor_value_info("y", f, None)],
        [numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w")]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_an_input_larger_than_the_machine_is_refused_before_shapes_are_inferred(capsys,
                                                                               tmp_path):
    """A request's inputs are held in this process. A Swin bound to a batch of 10,000,000
    ran onnx's shape inference for a minute, until the kernel killed it for want of memory;
    now a bound or declared input past the machine's memory is refused in one line."""
    from runtime.machine import machine_bytes

    memory = machine_bytes()
    side = 224 * 224 * 3 * 4  # bytes of one image at the made-up side
    batch = memory // (side // 16) * int(np.random.default_rng().integers(2, 5))
    model = _conv_of(["n", 3, "h", "w"])
    path = str(tmp_path / "conv.onnx")
    onnx.save(model, path)
    line = one_line_error(capsys, ["partition", path, "--devices", "cpu:2", "--costs", "model",
                                   "--bind", f"n={batch}"])
    assert f"input image at [{batch}, 3, 56, 56] needs " in line  # made-up sides halve first
    assert "this machine has" in line and "of it free" in line and "--bind" in line
    fixed = memory // side + 1
    with pytest.raises(DeviceMemoryError, match=rf"input image at \[{fixed}, 3, 224, 224\]"):
        load_graph(_conv_of([fixed, 3, 224, 224]))
    half = load_graph(model, bindings={"n": memory // side * 2})  # made-up sides halve to fit
    assert half.tensors["image"].shape[2:] == (56, 56)


def _computed_tokens(one: str, norm: bool = False) -> onnx.ModelProto:
    """Features [n, 8, h, w] flattened to [n, 8, h * w * 1], the 1 computed from h by `one`
    (Sign: as dynamo's exports compute `h // 4`, through Sign, Mod, Not, And; Pow, h^0:
    an op no inference computes a size with); `norm`: the features first divided by their
    ReduceL2 over the channels, as SigLIP's embeddings are."""
    consts = [numpy_helper.from_array(np.ones((8, 3, 1, 1), np.float32), "w"),
              *(numpy_helper.from_array(np.array([v], np.int64), name)
                for name, v in (("at0", 0), ("at1", 1), ("at2", 2), ("at3", 3), ("eight", 8),
                                ("zero", 0)))]
    normed = [helper.make_node("ReduceL2", ["raw", "at1"], ["norm"]),
              helper.make_node("Div", ["raw", "norm"], ["features"])]
    nodes = [helper.make_node("Conv", ["image", "w"], ["raw" if norm else "features"]),
             *(normed if norm else []),
             helper.make_node("Shape", ["features"], ["shape"]),
             *(helper.make_node("Gather", ["shape", f"at{a}"], [f"d{a}"]) for a in (0, 2, 3)),
             helper.make_node("Mul", ["d2", "d3"], ["pixels"]),
             helper.make_node(one, ["d2", "zero"][:2 if one == "Pow" else 1], ["one"]),
             helper.make_node("Mul", ["pixels", "one"], ["tokens"]),
             helper.make_node("Concat", ["d0", "eight", "tokens"], ["flat_shape"], axis=0),
             helper.make_node("Reshape", ["features", "flat_shape"], ["flat"]),
             helper.make_node("Transpose", ["flat"], ["tokens_first"], perm=[0, 2, 1])]
    model = helper.make_model(helper.make_graph(
        nodes, "computed_tokens",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["n", 3, "h", "w"])],
        [helper.make_tensor_value_info("tokens_first", TensorProto.FLOAT, None)], consts),
        opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize(("one", "norm"), [("Sign", False), ("Sign", True), ("Pow", False)])
def test_sizes_computed_through_ops_inference_does_not_follow_are_found(one, norm, monkeypatch):
    """Swin's, BEiT's, wav2vec2's dynamo exports (14 of 78 real exports) flatten their
    patches or frames to a length computed through floor division (Sign, Mod, Not, And),
    which neither onnx's nor onnxruntime's inference followed: bound to 1, their tokens
    were costed as one, 93-99% of their activations' bytes unseen. Symbolic inference now
    computes those ops on whole numbers, and sizes every reduction with axes as an input
    (SigLIP's ReduceL2 stopped it); a size still left is found by a run, where the inputs
    are a request's worth (a batch's is not run)."""
    from runtime import graph as loaded

    model = _computed_tokens(one, norm)
    rng = np.random.default_rng()
    h, w = (int(v) for v in rng.integers(8, 64, 2))
    graph = load_graph(model, bindings={"h": h, "w": w})
    names = [t for node in model.graph.node for t in node.output]
    ran = copy.deepcopy(model)
    ran.graph.output.extend(onnx.ValueInfoProto(name=t) for t in names)
    session = ort.InferenceSession(ran.SerializeToString(), providers=["CPUExecutionProvider"])
    image = rng.standard_normal((1, 3, h, w)).astype(np.float32)
    outputs = dict(zip([o.name for o in session.get_outputs()],
                       session.run(None, {"image": image}), strict=True))
    assert {t: graph.tensors[t].shape for t in names} == {t: outputs[t].shape for t in names}
    runs = []
    monkeypatch.setattr(loaded, "kept_sizes", lambda *args: runs.append(args) or {})
    batch = loaded._GUESSES_RUN_MOST // (3 * h * w * 4) + 1  # a batch's worth: not run
    flat = load_graph(model, bindings={"h": h, "w": w, "n": batch}).tensors["flat"].shape
    assert runs == [] and flat == (batch, 8, h * w if one == "Sign" else 1)


def _rows_counted_through_sign(source: str, width: str) -> list[onnx.NodeProto]:
    """`source` reshaped to `y` [rows, `width`'s value], its rows counted through a Sign, as
    dynamo counts with floor division: onnx's inference does not follow it, so symbolic
    inference must, through every op before it. Reads an `at0` ([0]) initializer."""
    return [helper.make_node("Shape", [source], ["shape"]),
            helper.make_node("Gather", ["shape", "at0"], ["rows"]),
            helper.make_node("Sign", ["rows"], ["one"]),
            helper.make_node("Mul", ["rows", "one"], ["counted"]),
            helper.make_node("Concat", ["counted", width], ["flat"], axis=0),
            helper.make_node("Reshape", [source, "flat"], ["y"])]


def test_a_split_into_a_sequence_is_sized_by_symbolic_inference(monkeypatch):
    """onnxruntime's SplitToSequence rule called an onnx helper gone in onnx 1.23 (and
    wrote one output per chunk): inference stopped there, and 10 of 75 timm exports had up
    to a quarter of their activations' bytes costed as one row. The sequence itself
    made every first load run the model, which cannot size a sequence."""
    from runtime import graph as loaded

    rng = np.random.default_rng()
    width, chunk = 8, int(rng.choice([1, 2, 4]))
    f = TensorProto.FLOAT
    consts = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
              (("chunk", chunk), ("first", 0), ("at0", [0]), ("width", [chunk]))]
    model = helper.make_model(helper.make_graph(
        [helper.make_node("SplitToSequence", ["x", "chunk"], ["parts"], axis=1),
         helper.make_node("SequenceAt", ["parts", "first"], ["part"]),
         *_rows_counted_through_sign("part", "width")], "split",
        [helper.make_tensor_value_info("x", f, ["n", width])],
        [helper.make_tensor_value_info("y", f, None)], consts),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    runs = []
    monkeypatch.setattr(loaded, "kept_sizes", lambda *args: runs.append(args) or {})
    rows = loaded._GUESSES_RUN_MOST // (width * 4) + int(rng.integers(1, 100))  # not run
    assert load_graph(model, bindings={"n": rows}).tensors["y"].shape == (rows, chunk)
    small = load_graph(model, bindings={"n": int(rng.integers(1, 9))})
    assert small.tensors["parts"].shape is None  # a sequence: no run sizes it
    assert runs == []  # nor is one run for it


def test_a_range_up_to_a_size_reshaped_to_a_scalar_is_sized(monkeypatch):
    """Dynamo makes a size a scalar by a Reshape to `[]`; onnxruntime's Reshape rule emptied
    its value, and the Range up to it stopped symbolic inference (timm's DaViT)."""
    from runtime import graph as loaded

    f = TensorProto.FLOAT
    consts = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
              (("at0", [0]), ("at1", [1]), ("scalar", np.zeros(0, np.int64)), ("zero", 0),
               ("one", 1))]
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Shape", ["x"], ["shape"]),
         helper.make_node("Gather", ["shape", "at0"], ["rows"]),
         helper.make_node("Reshape", ["rows", "scalar"], ["count"]),
         helper.make_node("Range", ["zero", "count", "one"], ["positions"]),
         helper.make_node("Cast", ["positions"], ["at"], to=f),
         helper.make_node("Unsqueeze", ["at", "at1"], ["column"]),
         helper.make_node("Add", ["x", "column"], ["y"])], "positions",
        [helper.make_tensor_value_info("x", f, ["n", 4])],
        [helper.make_tensor_value_info("y", f, None)], consts),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    monkeypatch.setattr(loaded, "kept_sizes", lambda *args: {})  # no run sizes it
    rows = int(np.random.default_rng().integers(2, 10_000))
    assert load_graph(model, bindings={"n": rows}).tensors["positions"].shape == (rows,)


def test_a_fold_into_an_image_keeps_its_batch(monkeypatch):
    """onnxruntime's symbolic inference has no rule for Col2Im (torch's `nn.Fold`): the
    batch after it became a symbol, and timm's VOLO had 49 tensors costed at a batch of 1
    past 64 MB of inputs (no run sizes them there)."""
    from runtime import graph as loaded

    f = TensorProto.FLOAT
    consts = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
              (("image", [4, 4]), ("block", [2, 2]), ("at0", [0]), ("pixels", [32]))]
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Col2Im", ["blocks", "image", "block"], ["folded"]),
         *_rows_counted_through_sign("folded", "pixels")], "fold",
        [helper.make_tensor_value_info("blocks", f, ["n", 8, 9])],
        [helper.make_tensor_value_info("y", f, None)], consts),
        opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    monkeypatch.setattr(loaded, "kept_sizes", lambda *args: {})  # no run sizes it
    rows = int(np.random.default_rng().integers(2, 10_000))
    tensors = load_graph(model, bindings={"n": rows}).tensors
    assert (tensors["folded"].shape, tensors["y"].shape) == ((rows, 2, 4, 4), (rows, 32))


def test_a_rank_five_cache_is_no_video():
    """Stacked keys and values ([2, batch, heads, past, head size]) with 3 or 4 heads."""
    specs = [InputSpec("kv", np.dtype(np.float32), (2, "batch", 4, "past", 64)),
             InputSpec("kv_t", np.dtype(np.float32), ("batch", 3, "past", "h", 64))]
    shapes = {k: v.shape for k, v in random_feeds(specs, np.random.default_rng()).items()}
    assert shapes == {"kv": (2, 1, 4, 1, 64), "kv_t": (1, 3, 1, 1, 64)}


def test_a_free_dimension_read_at_constant_indices_is_made_up_wide_enough(capsys, tmp_path):
    """LayoutLM's dynamo export leaves its boxes' 4 corners free ([s0, s45, s57]) and reads
    them at 0 to 3: made up 1 wide, every request failed. So did its bundle's."""
    model = box_reader(["batch", "boxes", "corners"])
    assert load_graph(model).tensors["boxes"].shape == (1, 1, 4)
    assert load_graph(model, bindings={"corners": 6}).tensors["boxes"].shape == (1, 1, 6)
    [spec] = input_specs(load_graph(model))
    assert random_feeds([spec], np.random.default_rng())["boxes"].shape == (1, 1, 4)
    path, bundle = str(tmp_path / "boxes.onnx"), str(tmp_path / "boxes.prism")
    onnx.save(model, path)
    assert main(["compile", path, "--devices", "cpu:2", "-o", bundle]) == 0
    for source in (path, bundle):
        capsys.readouterr()
        _runs_as_onnxruntime(capsys, source)


def test_a_convolutions_channels_are_the_least_its_input_is_read_at():
    """Through a transpose (NHWC in) and a normalisation, and in groups (a depthwise
    convolution reads 4 channels, 1 per group); a convolution of weights alone says
    nothing of the inputs."""
    f = TensorProto.FLOAT
    weights = [numpy_helper.from_array(np.zeros(shape, np.float32), name) for name, shape in
               (("w", (8, 3, 3, 3)), ("dw", (4, 1, 3, 3)), ("mean", (1, 3, 1, 1)))]
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["nhwc"], ["nchw"], perm=[0, 3, 1, 2]),
         helper.make_node("Sub", ["nchw", "mean"], ["centred"]),
         helper.make_node("Conv", ["centred", "w"], ["y"]),
         helper.make_node("Conv", ["planes", "dw"], ["z"], group=4),
         helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0, 2, 3]),
         helper.make_node("Conv", ["wt", "w"], ["of_weights"])], "convs",
        [helper.make_tensor_value_info("nhwc", f, ["n", "h", "w", "c"]),
         helper.make_tensor_value_info("planes", f, ["n", "c2", "h", "w"])],
        [helper.make_tensor_value_info(t, f, None) for t in ("y", "z", "of_weights")], weights)
    assert least_sizes(graph) == {"nhwc": {3: 3}, "planes": {1: 4}}


def test_a_dimension_declared_minus_one_is_free_as_onnxruntime_reads_it(capsys, tmp_path):
    """PaddlePaddle's exporter declares a dynamic dimension -1 (PP-OCR's direction
    classifier): the load sized a made-up input by it and failed, "negative dimensions
    are not allowed", as an internal error."""
    model = upsampling_detector([-1, 3, -1, -1])
    loaded = load_graph(model)
    assert loaded.tensors["image"].dims == (None, 3, None, None)
    assert loaded.tensors["image"].shape == (1, 3, IMAGE_SIDE, IMAGE_SIDE)
    path = str(tmp_path / "paddle_style.onnx")
    onnx.save(model, path)
    _runs_as_onnxruntime(capsys, path)


def test_a_dimension_named_as_a_sum_of_others_is_made_up_as_their_sum(capsys, tmp_path):
    """optimum names a decoder's attention mask [batch, past_sequence_length +
    sequence_length]: made up as 1 against keys of 1 + 1, GPT-2 and Llama exports failed
    every request (a Gather out of bounds). Here the mask is joined to the keys' means."""
    f = TensorProto.FLOAT
    total = "past_sequence_length + sequence_length"
    graph = helper.make_graph(
        [helper.make_node("Concat", ["past", "new"], ["keys"], axis=2),
         helper.make_node("ReduceMean", ["keys", "last"], ["means"], keepdims=0),
         helper.make_node("Unsqueeze", ["mask", "one"], ["row"]),
         helper.make_node("Concat", ["row", "means"], ["y"], axis=1)], "decoder",
        [helper.make_tensor_value_info("past", f, ["batch", 2, "past_sequence_length", 4]),
         helper.make_tensor_value_info("new", f, ["batch", 2, "sequence_length", 4]),
         helper.make_tensor_value_info("mask", f, ["batch", total])],
        [helper.make_tensor_value_info("y", f, None)],
        [numpy_helper.from_array(np.array([3], np.int64), "last"),
         numpy_helper.from_array(np.array([1], np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    specs = input_specs(load_graph(model))
    rng = np.random.default_rng()
    assert random_feeds(specs, rng)["mask"].shape == (1, 2)
    assert random_feeds(specs, rng, {"past_sequence_length": 5})["mask"].shape == (1, 6)
    assert load_graph(model, bindings={"sequence_length": 3}).tensors["mask"].shape == (1, 4)
    path = str(tmp_path / "decoder.onnx")
    onnx.save(model, path)
    assert main(["run", path, "--devices", "cpu:2", "--requests", "3", "--check"]) == 0, \
        capsys.readouterr().err


def test_onnxruntime_genai_decoders_are_made_up_at_their_head_size_and_total_length(
        capsys, tmp_path):
    """onnxruntime-genai's model builder (the ONNX of Phi-3, Llama, Qwen on the Hugging
    Face Hub) leaves its caches' head size free (`kv_cache_dim`) and names its mask's
    length `total_sequence_length`, which must be the caches' and the new tokens': made up
    1 and 1, every request failed in GroupQueryAttention. The head size is the packed
    projection's width over its heads, the total the sum, unless bound."""
    rng = np.random.default_rng()
    kv_heads = int(rng.integers(1, 3))
    heads, head_size = kv_heads * int(rng.integers(1, 3)), 8 * int(rng.integers(1, 3))
    model = genai_decoder(heads, kv_heads, head_size)
    tensors = load_graph(model).tensors
    assert tensors["past_key"].shape == (1, kv_heads, 1, head_size)
    assert tensors["attention_mask"].shape == (1, 2)
    specs = input_specs(load_graph(model))
    past, new = (int(n) for n in rng.integers(0, 9, 2))
    feeds = random_feeds(specs, rng, {"past_sequence_length": past, "sequence_length": new + 1})
    assert feeds["attention_mask"].shape == (1, past + new + 1)
    path = str(tmp_path / "decoder.onnx")
    onnx.save(model, path)
    _runs_as_onnxruntime(capsys, path)


@pytest.mark.parametrize("mask, cache", [("attention_mask", "past_key"),
                                         ("decoder_attention_mask", "cache_0_k"),
                                         ("attention_mask", None)])
def test_an_attention_mask_named_apart_is_made_up_as_long_as_the_keys_it_covers(
        capsys, tmp_path, mask, cache):
    """torch's exporter gives a transformers decoder's attention mask a length symbol of
    its own: made up 1, beside a cache of 1 and a token, every request failed (in a
    Gather reading the mask at each key's position), and load fell back to the roofline.
    A mask is as long as the cache and the new tokens (its tokens' alone, without a
    cache; a float input named for no cache is none)."""
    rng = np.random.default_rng()
    model = masked_cache_step("attention_mask" if mask == "attention_mask" else mask,
                              cache or "pixels")
    if mask != "attention_mask":  # its tokens: decoder_input_ids
        for node in model.graph.node:
            node.input[:] = ["decoder_input_ids" if i == "input_ids" else i for i in node.input]
        model.graph.input[0].name = "decoder_input_ids"
    specs = input_specs(load_graph(model))
    past, new = int(rng.integers(0, 9)), int(rng.integers(2, 9))
    feeds = random_feeds(specs, rng, {"past": past, "seq": new})
    assert feeds[mask].shape == (1, (past if cache else 0) + new)
    if cache is None:
        return  # a mask as long as the tokens covers no cache of 1: this model fails there
    path = str(tmp_path / "decoder.onnx")
    onnx.save(model, path)
    _runs_as_onnxruntime(capsys, path)


def test_caches_whose_lengths_are_named_apart_are_made_up_alike(capsys, tmp_path):
    """PyTorch's TorchScript exporter names each axis `dynamic_axes` lists apart
    (`past_0_k_2`, `past_0_v_2`, `attention_mask_1`): the caches must be as long as each
    other, and the mask as the keys it covers. Taken as no cache, the mask was made up 1
    beside caches of 1 and a token, and every request failed in a Gather."""
    rng = np.random.default_rng()
    model = masked_cache_step(cache="past_0_k")
    names = {"seq": "input_ids_1", "mask": "attention_mask_1", "past": "past_0_k_2"}
    for value in model.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in names:
                dim.dim_param = names[dim.dim_param]
    value_cache = copy.deepcopy(model.graph.input[2])
    value_cache.name = "past_0_v"
    value_cache.type.tensor_type.shape.dim[2].dim_param = "past_0_v_2"
    model.graph.input.append(value_cache)
    model.graph.node.append(helper.make_node("Concat", ["past_0_v", "k"], ["present_v"], axis=2))
    model.graph.output.append(helper.make_tensor_value_info("present_v", TensorProto.FLOAT, None))
    specs = input_specs(load_graph(model))
    new = int(rng.integers(2, 9))
    for past in (0, int(rng.integers(1, 9))):  # a bound length, none too, wins
        feeds = random_feeds(specs, rng, {"past_0_v_2": past, "input_ids_1": new})
        assert feeds["past_0_k"].shape[2] == feeds["past_0_v"].shape[2] == past
        assert feeds["attention_mask"].shape == (1, past + new)
    path = str(tmp_path / "decoder.onnx")
    onnx.save(model, path)
    _runs_as_onnxruntime(capsys, path)


def test_a_genai_decoders_present_caches_are_as_long_as_past_and_new_tokens():
    """onnxruntime's symbolic inference gives GroupQueryAttention's present caches the
    past's length (one buffer for both); run, they are past + new tokens long: a prefill
    of 512 tokens past 1 was costed caches of 1."""
    rng = np.random.default_rng()
    model = genai_decoder(4, 2, 8)
    past, new = (int(n) for n in rng.integers(1, 40, 2))
    graph = load_graph(model, bindings={"past_sequence_length": past, "sequence_length": new})
    feeds = random_feeds(input_specs(graph), rng, graph.bindings)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ran = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    assert {t: graph.tensors[t].shape for t in ran} == {t: v.shape for t, v in ran.items()}
    assert ran["present_key"].shape[2] == past + new


def test_a_dimension_named_by_a_number_is_made_up_as_that_number(capsys, tmp_path):
    """transformers' exporter names a decode step's cache heads and head size by numbers,
    [1, "2", "s53", "16"], where the new keys it joins them to have 2 and 16 fixed: made up
    as 1, every request failed (a Concat of mismatched dimensions)."""
    f, heads, size = TensorProto.FLOAT, int(np.random.default_rng().integers(2, 6)), 8
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["token", "split"], ["new"]),
         helper.make_node("Concat", ["past", "new"], ["keys"], axis=2)], "decode",
        [helper.make_tensor_value_info("past", f, [1, str(heads), "s53", str(size)]),
         helper.make_tensor_value_info("token", f, [1, heads * size])],
        [helper.make_tensor_value_info("keys", f, [1, heads, "s53 + 1", size])],
        [numpy_helper.from_array(np.array([1, heads, 1, size], np.int64), "split")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    loaded = load_graph(model)
    assert loaded.tensors["past"].shape == (1, heads, 1, size)
    assert random_feeds(input_specs(loaded), np.random.default_rng())["past"].shape == (
        1, heads, 1, size)
    path = str(tmp_path / "decode.onnx")
    onnx.save(model, path)
    assert main(["run", path, "--devices", "cpu:2", "--requests", "3", "--check"]) == 0, \
        capsys.readouterr().err


def test_unknown_binding_names_are_ignored():
    g = load_graph(SAMPLES_DIR / "mlp.onnx", bindings={"sequence": 4})
    assert g.tensors["x"].shape == (1, 256)


# ------------------------------------------------------------------------------------
# Outer-scope reads
# ------------------------------------------------------------------------------------
def test_if_node_lists_its_outer_scope_reads():
    g = load_graph(SAMPLES_DIR / "control_flow.onnx")
    node = g.node("if")
    assert node.op_type == "If"
    assert node.inputs == ("cond/greater",)
    assert set(node.outer_inputs) == {"fc1/relu", "if/then.weight", "if/else.weight",
                                      "if/else.scale"}
    assert set(node.reads) == {"cond/greater", *node.outer_inputs}
    assert g.producer["fc1/relu"] == "fc1/relu"
    assert g.dag.has_edge("fc1/relu", "if")
    assert "fc1/relu" in g.dag.edges["fc1/relu", "if"]["tensors"]
    assert g.dag.has_edge("cond/greater", "if")
    assert "if" in g.consumers["fc1/relu"]
    # Outer-scope weights count as the If node's weights.
    weights = sum(g.tensor_bytes(t) for t in ("if/then.weight", "if/else.weight",
                                              "if/else.scale"))
    assert weights == (64 * 16 * 2 + 1) * 4
    assert node_cost(g, node).weight_bytes == weights
    order = [n.name for n in g.nodes]
    assert order.index("fc1/relu") < order.index("if")


def _nested_if_model() -> onnx.ModelProto:
    """x -> Relu -> h; If(c) whose then-branch holds another If reading h and W."""
    f = TensorProto.FLOAT
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "W")
    inner_then = helper.make_graph(
        [helper.make_node("MatMul", ["h", "W"], ["it"], name="inner/then/mm")], "inner_then",
        [], [helper.make_tensor_value_info("it", f, [1, 4])])
    inner_else = helper.make_graph(
        [helper.make_node("Neg", ["local"], ["ie"], name="inner/else/neg")], "inner_else",
        [], [helper.make_tensor_value_info("ie", f, [1, 4])])
    outer_then = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["local"], name="outer/then/relu"),
         helper.make_node("If", ["c"], ["ot"], name="outer/then/if",
                          then_branch=inner_then, else_branch=inner_else)],
        "outer_then", [], [helper.make_tensor_value_info("ot", f, [1, 4])])
    outer_else = helper.make_graph(
        [helper.make_node("Identity", ["h"], ["oe"], name="outer/else/id")], "outer_else",
        [], [helper.make_tensor_value_info("oe", f, [1, 4])])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["h"], name="relu"),
         helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
         helper.make_node("Greater", ["s", "zero"], ["c"], name="greater"),
         helper.make_node("If", ["c"], ["z"], name="if", then_branch=outer_then,
                          else_branch=outer_else),
         helper.make_node("Add", ["z", "h"], ["y"], name="add")],
        "nested", [helper.make_tensor_value_info("x", f, [1, 4])],
        [helper.make_tensor_value_info("y", f, [1, 4])],
        initializer=[w, numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def test_nested_subgraphs_report_reads_from_every_outer_scope():
    g = load_graph(_nested_if_model())
    node = g.node("if")
    # h and W are read two scopes down, x one down; c too, but it is an explicit input
    # already; "local" is made inside the branch.
    assert set(node.outer_inputs) == {"h", "W", "x"}
    assert set(node.reads) == {"c", "h", "W", "x"}
    assert g.dag.has_edge("relu", "if") and g.dag.has_edge("greater", "if")
    assert "h" in g.dag.edges["relu", "if"]["tensors"]
    assert node_cost(g, node).weight_bytes == 64


# ------------------------------------------------------------------------------------
# Load errors
# ------------------------------------------------------------------------------------
def _one_line_error(source, **kw) -> str:
    with pytest.raises(ModelLoadError) as info:
        load_graph(source, **kw)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_missing_file(tmp_path):
    missing = tmp_path / "nowhere" / "model.onnx"
    message = _one_line_error(missing)
    assert str(missing) in message and "not found" in message


def test_folder_is_not_a_model(tmp_path):
    assert str(tmp_path) in _one_line_error(tmp_path)


@pytest.mark.parametrize("garbage", [b"this is not an onnx model at all", bytes(range(256))])
def test_file_that_is_not_onnx(tmp_path, garbage):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(garbage)
    message = _one_line_error(path)
    assert str(path) in message and "not an ONNX model" in message
    assert "not an ONNX model" in _one_line_error(garbage)


def test_model_failing_the_checker(tmp_path):
    model = onnx.load(str(SAMPLES_DIR / "mlp.onnx"))
    model.graph.node[0].input[0] = "undefined_tensor"
    path = tmp_path / "broken.onnx"
    onnx.save(model, str(path))
    for source in (model, path, model.SerializeToString()):
        message = _one_line_error(source)
        assert "checker" in message
    assert str(path) in _one_line_error(path)


def test_unknown_op_fails_the_checker():
    model = _unnamed_model()
    model.graph.node[2].op_type = "NoSuchOp"
    assert "checker" in _one_line_error(model)


def test_opset_99():
    model = onnx.load(str(SAMPLES_DIR / "mlp.onnx"))
    model.opset_import[0].version = 99
    message = _one_line_error(model)
    assert "opset" in message and "99" in message


def test_ir_version_too_new():
    model = _unnamed_model()
    model.ir_version = onnx.IR_VERSION + 1
    assert "IR version" in _one_line_error(model)


# ------------------------------------------------------------------------------------
# The random DAG helper itself (the other test files lean on it)
# ------------------------------------------------------------------------------------
@settings(max_examples=30)
@given(model=dag_models(1, 40))
def test_random_dag_models_are_well_formed(model):
    onnx.checker.check_model(model)
    assert model.ir_version == 9
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    g = load_graph(model)
    assert 1 <= len(g.outputs) <= 2
    for node in g.nodes:
        assert 1 <= len(node.inputs) <= 2 or node.op_type == "If"
        for t in node.outputs:
            assert t in g.outputs or g.consumers.get(t), f"{t} is never used"
            assert g.tensors[t].shape is not None
            assert g.tensors[t].dtype in ("float32", "bool")


def test_random_dag_models_vary_and_repeat():
    first = [random_dag_model(seed, 30).SerializeToString() for seed in range(8)]
    again = [random_dag_model(np.random.default_rng(seed), 30).SerializeToString()
             for seed in range(8)]
    assert first == again, "a seed gives the same model"
    assert len(set(first)) == 8
    graphs = [load_graph(m) for m in first]
    ops = {n.op_type for g in graphs for n in g.nodes}
    assert {"MatMul", "Concat", "Split", "If"} <= ops and len(ops) >= 10
    shared = sum(
        1 for g in graphs for w in g.initializers
        if len([n for n in g.nodes if w in n.reads]) > 1)
    assert shared >= 1, "some weight is read by two nodes"
    assert any(len(g.consumers.get(t, ())) > 1 for g in graphs for t in g.producer)
    assert any(n.outer_inputs for g in graphs for n in g.nodes)


@pytest.mark.parametrize("seed", range(3))
def test_random_dag_models_run_in_onnxruntime(seed):
    import onnxruntime as ort

    model = random_dag_model(seed, 25, batch="batch")
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    width = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    outs = session.run(None, {"x": np.ones((3, width), np.float32)})
    assert all(o.shape[0] == 3 for o in outs)


# ------------------------------------------------------------------------------------
# Sizes shape inference cannot give
# ------------------------------------------------------------------------------------
def _loop_reading_outer_scope(width: int) -> onnx.ModelProto:
    """A Loop whose body reads an outer tensor (as PyTorch's scripted loops do): onnx's
    shape inference gives its output, and what reads it, no shape."""
    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h", "w"], ["hw"]),
         helper.make_node("Add", ["hw", "x"], ["s"]), helper.make_node("Tanh", ["s"], ["h_out"]),
         helper.make_node("Identity", ["cond"], ["c"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("h", f, ["batch", width])],
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", f, ["batch", width])])
    weight = np.random.default_rng().standard_normal((width, width)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "go", "x"], ["looped"], body=body, name="loop"),
         helper.make_node("Relu", ["looped"], ["y"], name="relu")], "outer_scope_loop",
        [helper.make_tensor_value_info("x", f, ["batch", width]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", f, ["batch", width])],
        [numpy_helper.from_array(np.array(True), "go"), numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_tensor_inference_leaves_unsized_is_sized_by_a_run():
    """Unsized, the loop's output would cost nothing to copy between devices or to hold:
    one onnxruntime run at the bound shapes sizes it, and a cut there pays its bytes."""
    from runtime.devices import parse_devices
    from runtime.partition import partition

    rng = np.random.default_rng()
    batch, width = int(rng.integers(2, 9)), int(rng.integers(4, 33))
    g = load_graph(_loop_reading_outer_scope(width), bindings={"batch": batch})
    assert g.tensors["looped"].dims is None, "inference sized it: the test needs it unsized"
    assert g.tensors["looped"].shape == (batch, width)
    assert g.tensor_bytes("looped") == batch * width * 4
    plan = partition(g, parse_devices("cpu:2"), "user",
                     user_map={"partitions": {"a": "cpu0", "b": "cpu1"},
                               "nodes": {"loop": "a", "relu": "b"}})
    assert [(t.tensor, t.bytes) for t in plan.transfers] == [("looped", batch * width * 4)]


def test_a_sizing_run_that_fails_says_nothing(capfd):
    """A best-effort sizing run on made-up inputs may fail (here a pool over a vector);
    onnxruntime logged the failure to stderr, a second line under the CLI's one error
    line (found by the CLI fuzz test). What it gives then is the type onnxruntime infers."""
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["x"], ["y"])], "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    capfd.readouterr()
    assert run_sizes(model, ["y"]) == {"y": (np.dtype(np.float32), None)}
    assert capfd.readouterr().err == ""


def test_sizes_a_run_found_are_kept_for_the_next_load_of_that_model(monkeypatch, tmp_path):
    """A later load reads the sizes the first load's run found (a detection network's run
    is most of its load); a model of other weights is run again, as is a damaged entry.
    (onnxruntime's symbolic inference sizes this loop; here, as for ops it does not know,
    it does not.)"""
    import onnxruntime

    from runtime import graph

    monkeypatch.setattr(graph, "sharpened", lambda model, inferred: inferred)
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng()
    bound, width = {"batch": int(rng.integers(2, 9))}, int(rng.integers(4, 33))
    model, other_weights = (_loop_reading_outer_scope(width) for _ in range(2))
    sized = load_graph(model, bindings=bound).tensors["looped"].shape
    assert sized == (bound["batch"], width)
    (entry,) = (tmp_path / "sizes").iterdir()
    with monkeypatch.context() as no_runs:
        no_runs.setattr(onnxruntime, "InferenceSession", None)
        assert load_graph(model, bindings=bound).tensors["looped"].shape == sized
        assert load_graph(other_weights, bindings=bound).tensors["looped"].shape is None
    for damage in ("{", "[1]"):
        entry.write_text(damage)
        assert load_graph(model, bindings=bound).tensors["looped"].shape == sized
        assert entry.read_text() != damage


def test_a_model_too_large_for_half_the_machine_is_typed_not_run_at_load(monkeypatch,
                                                                          tmp_path):
    """Sizing runs the whole model at the sizes bound, at load: where its known tensors
    together pass half the machine's memory it is not run (the kernel's OOM killer), and
    what it would have sized keeps the type onnxruntime gives it as it loads."""
    from runtime import graph, run_sizes

    monkeypatch.setattr(graph, "sharpened", lambda model, inferred: inferred)
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng()
    bound, width = {"batch": int(rng.integers(2, 9))}, int(rng.integers(4, 33))
    model = _loop_reading_outer_scope(width)
    sized = load_graph(model, bindings=bound)
    assert sized.tensors["looped"].shape == (bound["batch"], width)
    held = sum(t.nbytes for t in sized.tensors.values())
    monkeypatch.setattr(graph, "machine_bytes", lambda: held)  # the run would need it all
    fed = []
    monkeypatch.setattr(run_sizes, "_feed", lambda *args: fed.append(args))
    looped = load_graph(model, bindings=bound).tensors["looped"]
    assert (looped.shape, looped.dtype, fed) == (None, "float32", [])


def test_a_tensor_typed_by_a_run_alone_crosses_devices():
    """onnx's shape inference leaves an ai.onnx.ml Normalizer's output untyped; the sizing
    run knew its type, but nothing declared it, so a partition reading it could not be
    made ("input 'n' has no known type": a scikit-learn forest over cpu and sim)."""
    graph = helper.make_graph(
        [helper.make_node("Normalizer", ["x"], ["n"], name="norm", domain="ai.onnx.ml",
                          norm="L1"),
         helper.make_node("Relu", ["n"], ["y"], name="relu")], "normalized",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 1)])
    assert "n" not in onnx.shape_inference.infer_shapes(model).graph.value_info
    rng = np.random.default_rng()
    x = rng.standard_normal((int(rng.integers(1, 6)), 3)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with HostManager(parse_devices("cpu:2")) as host:
        plan = host.add_network("normalized", model, annotations={"norm": "cpu0",
                                                                 "relu": "cpu1"})
        assert [t.tensor for t in plan.transfers] == ["n"]
        np.testing.assert_allclose(host.infer("normalized", {"x": x})["y"], want, rtol=1e-6)


def _rms_normed(op: str) -> onnx.ModelProto:
    """x -> `op` (an RMS norm over the last axis, in the default domain) -> MatMul, as
    onnxruntime's transformer optimizer writes T5's and Llama's norms."""
    rng = np.random.default_rng()
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "scale"], ["n"], name="rms", axis=-1, epsilon=1e-6),
         helper.make_node("MatMul", ["n", "w"], ["y"], name="proj")], "rms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(rng.uniform(.5, 1.5, 8).astype(np.float32), "scale"),
         numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_a_default_domain_op_onnxruntime_runs_and_onnx_does_not_know_loads():
    """onnxruntime runs SimplifiedLayerNormalization in the default domain (its optimizer
    writes it) though onnx has no schema for it: the checker, which refused the model,
    checks the rest. A device that cannot run it says so; an op neither knows is still
    refused by the checker, naming it."""
    model = _rms_normed("SimplifiedLayerNormalization")
    x = np.random.default_rng().standard_normal((3, 8)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with HostManager(parse_devices("cpu:1,reference:1")) as host:
        plan = host.add_network("rms", model, annotations={"proj": "reference0"})
        assert plan.partition_of("rms").device == "cpu0"
        np.testing.assert_allclose(host.infer("rms", {"x": x})["y"], want, rtol=1e-5)
    assert [n.domain for n in model.graph.node] == ["", ""]  # the caller's model as given
    with HostManager(parse_devices("reference:1")) as host, pytest.raises(
            PartitionError, match=r"rms \(SimplifiedLayerNormalization\) cannot run"):
        host.add_network("rms", model)
    with pytest.raises(ModelLoadError, match=r"fails the ONNX checker.*NoSuchNorm"):
        load_graph(_rms_normed("NoSuchNorm"))


@pytest.mark.parametrize(("op", "opset"), [("LayerNormalization", 14), ("ThresholdedRelu", 9)])
def test_an_op_onnxruntime_runs_below_the_opset_onnx_defines_it_at_loads(op, opset):
    """onnxruntime's transformer optimizer writes LayerNormalization into a model below
    opset 17, where onnx defines none (BERT and GPT-2 exports at opset 14, optimized); an
    old model holds ThresholdedRelu below opset 10, from when it was experimental.
    onnxruntime runs both; the checker refused the model."""
    rng = np.random.default_rng()
    normed = op == "LayerNormalization"
    node = helper.make_node(op, ["x", "scale", "shift"] if normed else ["x"], ["n"], name="op",
                            **({"axis": -1, "epsilon": 1e-5} if normed else {"alpha": 0.5}))
    graph = helper.make_graph(
        [node, helper.make_node("MatMul", ["n", "w"], ["y"], name="proj")], "older",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(rng.uniform(.5, 1.5, 8).astype(np.float32), "scale"),
         numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "shift"),
         numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=8)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with HostManager(parse_devices("cpu:2")) as host:
        host.add_network("older", model, annotations={"proj": "cpu1"})
        np.testing.assert_allclose(host.infer("older", {"x": x})["y"], want, rtol=1e-5)


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_a_model_whose_nodes_are_out_of_order_loads_sorted(name):
    """ONNX asks for nodes in order; onnxruntime sorts them itself, and its quantizer
    writes a Loop before the node making what its body reads. Before, such a model
    "fails the ONNX checker: Nodes in a graph must be topologically sorted"."""
    model = onnx.load(str(SAMPLES_DIR / f"{name}.onnx"))
    order = list(model.graph.node)
    np.random.default_rng().shuffle(order)
    del model.graph.node[:]
    model.graph.node.extend(order)
    graph = load_graph(model)
    made: set[str] = {*graph.inputs, *graph.initializers}
    for node in graph.nodes:
        assert set(node.reads) <= made, node.name
        made.update(node.outputs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = random_feeds(input_specs(graph), np.random.default_rng(), default_dim=2)
    want = session.run(None, feeds)
    with HostManager(parse_devices("cpu:2")) as host:
        host.add_network(name, model)
        got = host.infer(name, feeds)
    for out, value in zip(session.get_outputs(), want, strict=True):
        np.testing.assert_allclose(got[out.name], value, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rewire, said", [
    ({"relu": "dropped"}, r"node relu \(Relu\) reads 'dropped', which no node, initializer "
                          r"or graph input makes"),
    ({"add": "r"}, r"node add \(Add\) reads 'r', made by node relu, which cannot run before "
                   r"it: the graph has a cycle")])
def test_a_read_nothing_makes_first_is_named_as_such(rewire, said):
    """A node dropped, or a cycle: the checker said "must be topologically sorted" for
    both, of a graph Prism had just sorted."""
    nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Neg", ["r"], ["y"], name="neg")]
    for node in nodes:
        if node.name in rewire:
            node.input[0] = rewire[node.name]
    model = helper.make_model(helper.make_graph(
        nodes, "rewired", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
        opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelLoadError, match=f"^model fails the ONNX checker: {said}$"):
        load_graph(model)


@pytest.mark.parametrize("indexed", ["linear", "coordinates"])
def test_a_sparse_initializer_is_read_as_onnxruntime_reads_it(indexed):
    """ONNX's sparse initializers (its values and their indices, linear or one coordinate
    row per value): made dense at load, as onnxruntime makes them; Prism called the
    weight an input of no known type."""
    rng = np.random.default_rng()
    shape = (int(rng.integers(2, 9)), int(rng.integers(2, 9)))
    dense = np.where(rng.random(shape) < 0.3, rng.standard_normal(shape), 0).astype(np.float32)
    where = np.flatnonzero(dense)
    indices = where if indexed == "linear" else np.stack(np.unravel_index(where, shape), 1)
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(dense.ravel()[where], "w"),
                                       numpy_helper.from_array(indices.astype(np.int64)),
                                       list(shape))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
         helper.make_node("Relu", ["m"], ["y"], name="relu")], "sparse",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", shape[1]])])
    graph.sparse_initializer.append(sparse)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    np.testing.assert_array_equal(numpy_helper.to_array(load_graph(model).initializers["w"]),
                                  dense)
    x = rng.standard_normal((3, shape[0])).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with HostManager(parse_devices("cpu:1,reference:1")) as host:
        host.add_network("sparse", model, partition={"nodes": {"mm": "cpu0",
                                                               "relu": "reference0"}})
        got = host.infer("sparse", {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_tensor_typed_by_onnxruntime_alone_crosses_devices_though_made_up_inputs_fail(
        tmp_path):
    """onnx infers no type for ai.onnx.ml's Scaler, and the run that sizes such tensors
    failed: made-up text is no category a strict one-hot encoder (scikit-learn's
    default) knows. A partition reading the Scaler's output could not declare it."""
    rng = np.random.default_rng()
    ml = {"domain": "ai.onnx.ml"}
    colours = ["red", "green", "blue"]
    graph = helper.make_graph(
        [helper.make_node("OneHotEncoder", ["colour"], ["hot"], name="onehot",
                          cats_strings=colours, zeros=0, **ml),
         helper.make_node("Reshape", ["hot", "rows"], ["flat"], name="reshape"),
         helper.make_node("Scaler", ["size"], ["scaled"], name="scaler",
                          offset=rng.standard_normal(2).tolist(),
                          scale=rng.uniform(0.5, 2, 2).tolist(), **ml),
         helper.make_node("Concat", ["flat", "scaled"], ["features"], name="concat", axis=1)],
        "strict", [helper.make_tensor_value_info("colour", TensorProto.STRING, ["n", 1]),
                   helper.make_tensor_value_info("size", TensorProto.FLOAT, ["n", 2])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["n", 5])],
        [numpy_helper.from_array(np.array([-1, 3], np.int64), "rows")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 1)])
    loaded = load_graph(model)
    assert loaded.tensors["scaled"].dtype == "float32"
    assert loaded.types["scaled"].tensor_type.elem_type == TensorProto.FLOAT
    feeds = {"colour": rng.choice(colours, (4, 1)).astype(object),
             "size": rng.standard_normal((4, 2)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with HostManager(parse_devices("cpu:2")) as host:
        host.add_network("strict", model, partition={"nodes": {
            "onehot": "cpu0", "reshape": "cpu0", "scaler": "cpu0", "concat": "cpu1"}})
        np.testing.assert_allclose(host.infer("strict", feeds, timeout=30)["features"], want,
                                   rtol=1e-6)


def test_inputs_and_outputs_of_unknown_rank_load_as_onnxruntime_loads_them():
    """A graph input or output typed without a shape is a tensor of any rank to onnxruntime;
    onnx's checker wants a shape there, and Prism refused the model. The check still
    refuses what is wrong, and the model is left as it was."""
    untyped = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "any_rank", [untyped],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    loaded = load_graph(model)
    assert not any(v.type.tensor_type.HasField("shape")
                   for v in (*loaded.model.graph.input, *loaded.model.graph.output))
    rng = np.random.default_rng()
    x = rng.standard_normal(rng.integers(1, 4, int(rng.integers(1, 4)))).astype(np.float32)
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("any_rank", model)
        np.testing.assert_array_equal(host.infer("any_rank", {"x": x})["y"], np.maximum(x, 0))
    model.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(ModelLoadError, match="fails the ONNX checker"):
        load_graph(model)


def test_an_ir_3_model_whose_weights_are_not_inputs_loads_as_onnxruntime_loads_it():
    """Below IR version 4 onnx's checker wants every initializer listed as a graph input;
    onnxruntime runs the model without, and Prism refused it."""
    rng = np.random.default_rng()
    w = rng.standard_normal((3, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "ir3",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)], ir_version=3)
    assert load_graph(model).model.ir_version == 3
    x = rng.standard_normal((2, 3)).astype(np.float32)
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("ir3", model)
        np.testing.assert_allclose(host.infer("ir3", {"x": x})["y"], x @ w, rtol=1e-5)
