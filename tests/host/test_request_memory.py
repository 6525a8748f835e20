"""A request whose sizes make activations past the machine's memory is refused in one line
before it runs, and the host serves the next as before; what a request needs follows its
sizes through the expressions inference left in each tensor's dims."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from runtime import request_memory as request_memory_module
from runtime.bundle.writer import compile_bundle
from runtime.devices import parse_devices
from runtime.errors import InvalidInputError
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.partition import liveness
from runtime.partition.liveness import peak_activation_bytes, request_memory
from runtime.request_memory import RequestMemory, compiled_dim
from tests.support.dags import SAMPLES_DIR
from tests.support.serving import WAIT


def _outer() -> onnx.ModelProto:
    """Every pair of a clip's samples, summed over one side: activations grow with the
    square of its length, as attention over frames of audio does."""
    f = TensorProto.FLOAT
    return helper.make_model(helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["xt"], name="column"),
         helper.make_node("MatMul", ["xt", "x"], ["pairs"], name="pairs"),
         helper.make_node("ReduceSum", ["pairs", "axes"], ["y"], name="sum", keepdims=0)],
        "outer", [helper.make_tensor_value_info("x", f, [1, "n"])],
        [helper.make_tensor_value_info("y", f, None)],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [0])]),
        opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("compiled", [False, True], ids=["model", "bundle"])
def test_a_request_past_the_machines_memory_is_refused_and_the_host_serves_on(
        monkeypatch, tmp_path, compiled):
    """A machine of 64 MB, so that the request refused would run here if let through; a
    bundle refuses it as compiled, without loading its graph."""
    monkeypatch.setattr(liveness, "machine_bytes", lambda: 64 << 20)
    monkeypatch.setattr(request_memory_module, "machine_bytes", lambda: 64 << 20)
    long = 8192  # its pairs alone: 256 MB
    rng = np.random.default_rng()
    source = compile_bundle(_outer(), parse_devices("cpu:2"), tmp_path / "outer.prism",
                            costs="model").path if compiled else _outer()
    with HostManager(parse_devices("cpu:2")) as host:
        host.add_network("outer", source)
        for _ in range(2):  # refused again: a shape refused is no shape seen
            with pytest.raises(InvalidInputError) as refused:
                host.infer("outer", {"x": np.zeros((1, long), np.float32)})
            said = str(refused.value)
            assert "\n" not in said and f"x [1, {long}]" in said, said
            assert "(pairs alone 268.4 MB); this machine has 67.1 MB" in said, said
        x = rng.standard_normal((1, int(rng.integers(2, 300)))).astype(np.float32)
        np.testing.assert_allclose(host.run("outer", {"x": x}).result(timeout=WAIT)["y"],
                                   (x.T @ x).sum(0), rtol=1e-4, atol=1e-4)


def test_what_a_request_needs_follows_its_sizes():
    graph = load_graph(_outer())
    memory = request_memory(graph, limit=1 << 40)
    assert memory is not None
    n = int(np.random.default_rng().integers(1_000, 100_000))
    ratio = memory.needed({"n": 2 * n}) / memory.needed({"n": n})
    assert ratio == pytest.approx(4, rel=1e-3)  # the pairs, n squared, outweigh the rest


@pytest.mark.parametrize("path", sorted(SAMPLES_DIR.glob("*.onnx")), ids=lambda p: p.stem)
def test_at_the_sizes_bound_at_load_a_request_needs_what_the_plan_counts(path):
    graph = load_graph(path)
    memory = request_memory(graph, limit=1 << 40)
    if memory is None:  # every size fixed: no request chooses one
        assert not any(isinstance(d, str) for n in graph.inputs
                       for d in graph.tensors[n].dims or ())
        return
    assert memory.needed(memory.bound) == pytest.approx(
        peak_activation_bytes(graph, graph.nodes))


@pytest.mark.parametrize("path", sorted(SAMPLES_DIR.glob("*.onnx")), ids=lambda p: p.stem)
def test_what_a_bundle_keeps_of_it_needs_as_much_at_any_sizes(path):
    graph = load_graph(path)
    memory = request_memory(graph, [[n.name for n in graph.nodes[:3]],
                                    [n.name for n in graph.nodes[3:]]], limit=1 << 40)
    if memory is None:
        return
    kept = RequestMemory.from_dict(json.loads(json.dumps(memory.to_dict())), limit=1 << 40)
    rng = np.random.default_rng()
    for _ in range(5):
        sizes = {d: int(rng.integers(1, 4096)) for d in memory.bound}
        assert kept.needed(sizes) == memory.needed(sizes), sizes


def test_a_size_that_cannot_be_computed_at_a_requests_sizes_keeps_its_size_at_load():
    """`n // (m - 1)` at m = 1: that tensor counts as at load, and nothing is raised."""
    memory = RequestMemory(
        axes={"m": ("x", 0), "n": ("x", 1)}, bound={"m": 2, "n": 6}, names=("t",),
        dims=((compiled_dim("n // (m - 1)", 6, {"m": 0, "n": 0}), 3),), shapes=((6, 3),),
        itemsizes=np.array([4.0]), spans=np.array([[0, 0]]), parts=((0, 1),),
        limit=1 << 40)
    assert memory.needed({"m": 3, "n": 10}) == 5 * 3 * 4
    assert memory.needed({"m": 1, "n": 10}) == 6 * 3 * 4

