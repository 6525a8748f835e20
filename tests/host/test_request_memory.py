"""A request whose sizes make activations past the machine's memory is refused in one line
before it runs, and the host serves the next as before; what a request needs follows its
sizes through the expressions inference left in each tensor's dims."""

from __future__ import annotations

import json
import threading
import weakref

import numpy as np
import pytest
from onnx import TensorProto, helper

from runtime import machine
from runtime import request_memory as request_memory_module
from runtime.bundle.writer import compile_bundle
from runtime.devices import parse_devices
from runtime.devices.cpu import OrtFunction
from runtime.driver import open_bundle
from runtime.errors import InvalidInputError
from runtime.executor.requests import Request
from runtime.graph import load_graph
from runtime.host import HostManager, lean
from runtime.host.batching import concatenate
from runtime.partition import liveness
from runtime.partition.liveness import peak_activation_bytes, request_memory
from runtime.request_memory import RequestMemory, compiled_dim
from runtime.types import OutsizedFeeds
from runtime.units import human_bytes
from tests.support.dags import SAMPLES_DIR, outer_pairs
from tests.support.hosts import resident_bytes
from tests.support.serving import WAIT


@pytest.mark.parametrize("compiled", [False, True], ids=["model", "bundle"])
def test_a_request_past_the_machines_memory_is_refused_and_the_host_serves_on(
        monkeypatch, tmp_path, compiled):
    """A machine of 64 MB, so that the request refused would run here if let through; a
    bundle refuses it as compiled, without loading its graph."""
    monkeypatch.setattr(liveness, "machine_bytes", lambda: 64 << 20)
    monkeypatch.setattr(request_memory_module, "machine_bytes", lambda: 64 << 20)
    monkeypatch.setattr(machine, "free_bytes", lambda: 40 << 20)
    long = 8192  # its pairs alone: 256 MB
    rng = np.random.default_rng()
    source = compile_bundle(outer_pairs(), parse_devices("cpu:2"), tmp_path / "outer.prism",
                            costs="model").path if compiled else outer_pairs()
    with HostManager(parse_devices("cpu:2")) as host:
        host.add_network("outer", source)
        for _ in range(2):  # refused again: a shape refused is no shape seen
            with pytest.raises(InvalidInputError) as refused:
                host.infer("outer", {"x": np.zeros((1, long), np.float32)})
            said = str(refused.value)
            assert "\n" not in said and f"x [1, {long}]" in said, said
            assert "(pairs alone 268.4 MB); this machine has 67.1 MB, 41.9 MB of it free" \
                in said, said
        x = rng.standard_normal((1, int(rng.integers(2, 300)))).astype(np.float32)
        np.testing.assert_allclose(host.run("outer", {"x": x}).result(timeout=WAIT)["y"],
                                   (x.T @ x).sum(0), rtol=1e-4, atol=1e-4)


def test_what_a_request_needs_follows_its_sizes():
    graph = load_graph(outer_pairs())
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



@pytest.mark.parametrize(("devices", "annotations"), [
    ("cpu:1", None), ("cpu:2", {"pairs": "cpu0", "sum": "cpu1"})], ids=["lean", "two stages"])
def test_an_outsized_request_gives_back_the_memory_it_took(devices, annotations):
    """onnxruntime's arena keeps what a run grew it by: without giving it back, one long
    clip among short ones leaves the process holding its pairs (576 MB) for good. A stage
    whose output is that long gives it back as its first run after the output is gone
    ends."""
    rng = np.random.default_rng()

    def usual() -> None:
        host.infer("outer", {"x": rng.standard_normal((1, rng.integers(2, 300))
                                                      ).astype(np.float32)})

    with HostManager(parse_devices(devices)) as host:
        host.add_network("outer", outer_pairs(), annotations=annotations)
        for _ in range(4):  # usual requests, and the arena they keep
            usual()
        before = resident_bytes()
        for ask in (host.infer, lambda *a: host.run(*a).result(timeout=WAIT)):
            x = rng.standard_normal((1, 12_000 + int(rng.integers(100)))).astype(np.float32)
            np.testing.assert_allclose(ask("outer", {"x": x})["y"], (x.T @ x).sum(0),
                                       rtol=1e-3, atol=1e-2)
            # the first usual request gives the pairs back, unless the worker that made
            # them is still answering (its frames hold them) as that request's first stage
            # starts on the caller's thread: then the next one does (a fresh clone, 610 MB)
            for _ in range(3):
                usual()
                grown = resident_bytes() - before
                if grown < 128 << 20:
                    break
            assert grown < 128 << 20, human_bytes(grown)


def test_what_a_requests_stages_passed_is_gone_before_its_caller_wakes(monkeypatch):
    """An outsized request's pairs, passed from one stage to the next, are given back by
    the first run after they are gone. They were still held as the answer woke its caller
    (by the request's values and the device's last job), and the caller's next request
    then kept them: a fresh clone's run of the test above read 614 MB."""
    made: list[weakref.ref] = []
    run = OrtFunction.run
    monkeypatch.setattr(OrtFunction, "run", lambda self, feeds: _kept_refs(
        run(self, feeds), made))
    caller, seen = threading.get_ident(), []
    rng = np.random.default_rng()
    with HostManager(parse_devices("cpu:2")) as host:
        host.add_network("outer", outer_pairs(), annotations={"pairs": "cpu0", "sum": "cpu1"})
        while not seen or seen[-1][0] == caller:  # until the answer came after the callback
            made.clear()
            x = rng.standard_normal((1, 3000 + int(rng.integers(100)))).astype(np.float32)
            future = host.run("outer", {"x": x})
            future.add_done_callback(lambda _: seen.append(
                (threading.get_ident(), [ref() is not None for ref in made])))
            np.testing.assert_allclose(future.result(timeout=WAIT)["y"], (x.T @ x).sum(0),
                                       rtol=1e-3, atol=1e-2)
    assert seen[-1][1] == [False], seen


def _kept_refs(outputs: dict[str, np.ndarray], made: list[weakref.ref]
               ) -> dict[str, np.ndarray]:
    made.extend(weakref.ref(v) for k, v in outputs.items() if k == "pairs")
    return outputs


def test_an_outsized_size_that_comes_again_keeps_its_arena():
    """A fixed padded shape: its first request is outsized and gives its arena back; the
    next, that size again and usual now, keeps what it grew for the ones after it. It had
    paid the first one's debt, giving back what the third then grew again."""
    rng = np.random.default_rng()

    def ask(n: int) -> None:
        x = rng.standard_normal((1, n)).astype(np.float32)
        np.testing.assert_allclose(host.infer("outer", {"x": x})["y"], (x.T @ x).sum(0),
                                   rtol=1e-3, atol=1e-2)

    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("outer", outer_pairs())
        for n in rng.integers(2, 300, 4):  # usual requests, and the arena they keep
            ask(int(n))
        before, n = resident_bytes(), 12_000 + int(rng.integers(100))
        ask(n)
        given_back = resident_bytes() - before
        ask(n)
        kept = resident_bytes() - before
        pairs = n * n * 4
        assert given_back < 128 << 20 and kept > pairs * 0.9, (
            human_bytes(given_back), human_bytes(kept), human_bytes(pairs))


def test_an_outsized_answer_is_given_back_once_its_caller_lets_it_go():
    """The pairs themselves answered (576 MB of the arena's): given back by the first run
    after the caller dropped them, not by one while it still held them."""
    model = outer_pairs()
    model.graph.output.append(helper.make_tensor_value_info("pairs", TensorProto.FLOAT, None))
    rng = np.random.default_rng()

    def ask(n: int) -> dict[str, np.ndarray]:
        return host.infer("outer", {"x": rng.standard_normal((1, n)).astype(np.float32)})

    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("outer", model)
        for n in rng.integers(2, 300, 4):
            ask(int(n))
        before = resident_bytes()
        held = ask(12_000 + int(rng.integers(100)))
        ask(int(rng.integers(2, 300)))  # while the pairs are held
        assert held["pairs"].nbytes > 512 << 20
        del held
        ask(int(rng.integers(2, 300)))
        grown = resident_bytes() - before
        assert grown < 128 << 20, human_bytes(grown)


@pytest.mark.parametrize("policy", ["serial", "pipelined"])
def test_the_driver_refuses_and_gives_back_as_the_host_does(monkeypatch, tmp_path, policy):
    """A bundle run by the standalone driver: a request past the machine refused in one
    line (here a machine of 2 GB), an outsized one's pairs given back; before, the first
    ran into whatever memory there was, and the second left the driver holding 576 MB."""
    path = compile_bundle(outer_pairs(), parse_devices("cpu:2"), tmp_path / "outer.prism",
                          annotations={"pairs": "cpu0", "sum": "cpu1"}, costs="model").path
    rng = np.random.default_rng()

    def ask(n: int) -> None:
        x = rng.standard_normal((1, n)).astype(np.float32)
        np.testing.assert_allclose(driver.run({"x": x})["y"], (x.T @ x).sum(0), rtol=1e-3,
                                   atol=1e-2)

    monkeypatch.setattr(request_memory_module, "machine_bytes", lambda: 2 << 30)
    with open_bundle(path, policy) as driver:
        with pytest.raises(InvalidInputError) as refused:
            driver.run({"x": np.zeros((1, 30_000), np.float32)})
        assert "\n" not in str(refused.value) and "this machine has 2.1 GB" in str(refused.value)
        for n in rng.integers(2, 300, 4):
            ask(int(n))
        before = resident_bytes()
        ask(12_000 + int(rng.integers(100)))
        ask(int(rng.integers(2, 300)))
        grown = resident_bytes() - before
        assert grown < 128 << 20, human_bytes(grown)


def test_a_request_the_lean_path_declines_is_admitted_once(monkeypatch):
    """Declined by the lean path (its device busy past LEAN_WAIT), a request went down the
    general path checked and admitted again: an outsized one counted as its own second
    coming, so its memory was kept."""
    monkeypatch.setattr(lean, "LEAN_WAIT", 0.05)
    admitted = []
    real = RequestMemory.admit
    monkeypatch.setattr(RequestMemory, "admit", lambda self, *a: admitted.append(a) or real(
        self, *a))
    rng = np.random.default_rng()
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("outer", outer_pairs())
        for n in rng.choice(np.arange(2, 300), 4, replace=False):  # the usual requests
            host.infer("outer", {"x": rng.standard_normal((1, n)).astype(np.float32)})
        x = rng.standard_normal((1, 12_000 + int(rng.integers(100)))).astype(np.float32)
        busy = host.devices["cpu0"]._running
        assert busy.acquire(timeout=WAIT)
        try:
            future = host.run("outer", {"x": x})
        finally:
            busy.release()
        np.testing.assert_allclose(future.result(timeout=WAIT)["y"], (x.T @ x).sum(0),
                                   rtol=1e-3, atol=1e-2)
    assert [a for a in admitted if a[1]["x"] == x.shape] == [("outer", {"x": x.shape})]


def test_a_request_is_outsized_until_requests_that_size_are_usual():
    """Outsized against the short clips; usual once it comes again (a fixed padded shape
    keeps its arena), or once long clips of other lengths have come."""
    memory = request_memory(load_graph(outer_pairs()), limit=1 << 40)
    assert memory is not None
    rng = np.random.default_rng()

    def outsized(n: int) -> bool:
        return memory.admit("outer", {"x": (1, n)})

    assert not any(outsized(int(n)) for n in rng.choice(np.arange(2, 300), 4, replace=False))
    first, second, third = (int(n) for n in rng.choice(np.arange(12_000, 13_000), 3,
                                                          replace=False))  # 576-676 MB
    assert [outsized(first) for _ in range(3)] == [True, False, False]
    assert outsized(second)
    for n in rng.choice(np.arange(9_000, 11_000), 4, replace=False):  # long clips come
        outsized(int(n))
    assert not outsized(third)
    limited = request_memory(load_graph(outer_pairs()), limit=1 << 30)
    assert limited is not None
    limited.admit("outer", {"x": (1, int(rng.integers(2, 300)))})
    for _ in range(2):
        with pytest.raises(InvalidInputError):  # refused: not a usual request either
            limited.admit("outer", {"x": (1, int(rng.integers(20_000, 30_000)))})
    assert limited.admit("outer", {"x": (1, first)})


def test_a_batch_holding_an_outsized_request_is_outsized():
    plain = {"x": np.zeros((1, 4), np.float32)}
    members = [Request("b", plain), Request("b", OutsizedFeeds(plain))]
    assert type(concatenate(members)) is OutsizedFeeds
    assert type(concatenate(members[:1])) is dict
