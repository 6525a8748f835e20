"""A plan learns while it serves (runtime/host/learning.py): estimates follow the run times
its partitions show under the load it gets, a plan whose stages come out unbalanced is
re-made on them and laid beside the one serving, and one that does not keep its promise
goes back. Served on real cpu devices; the learner looks more often than by default."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime.devices import DeviceConfig
from runtime.host import HostManager, learning
from runtime.partition.planning import same_assignment
from tests.support.serving import WAIT, Events, assert_same, expected, poll

WIDTH = 256  # wide enough that a split pays at batch 1 on a busy machine too
ROWS = 64  # a request's rows: the plan was costed at one


@pytest.fixture(autouse=True)
def eager(monkeypatch):
    monkeypatch.setattr(learning, "LOOK_SECONDS", 0.05)
    monkeypatch.setattr(learning, "MIN_RUNS", 60)


def rows_then_one(path, layers: int = 6) -> str:
    """x [batch, WIDTH] through `layers` MatMul+Relu, averaged over the batch, then `layers`
    more on the one row left: costed at batch 1 the halves weigh the same; served at
    ROWS rows, the first half weighs far more."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(2 * layers):
        if i == layers:
            nodes.append(helper.make_node("ReduceMean", [x], ["mean"], name="mean", axes=[0],
                                          keepdims=1))
            x = "mean"
        w = f"w{i}"
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32), w))
        nodes += [helper.make_node("MatMul", [x, w], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    graph = helper.make_graph(
        nodes, "rows_then_one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return str(path)


def cpus(n: int = 2) -> list[DeviceConfig]:
    return [DeviceConfig(name=f"cpu{i}", backend="cpu", memory_bytes=1 << 28) for i in range(n)]


def serve(host: HostManager, name: str, model: str, stop: threading.Event, clients: int = 2
          ) -> list:
    """Closed-loop clients of fresh ROWS-row requests until `stop`; every answer checked
    against plain onnxruntime. Returns the clients' futures (each ends with its count)."""
    def client() -> int:
        rng, done = np.random.default_rng(), 0
        while not stop.is_set():
            feeds = {"x": rng.standard_normal((ROWS, WIDTH)).astype(np.float32)}
            assert_same(host.run(name, feeds).result(timeout=WAIT), expected(model, feeds))
            done += 1
        return done

    pool = cf.ThreadPoolExecutor(clients)
    futures = [pool.submit(client) for _ in range(clients)]
    pool.shutdown(wait=False)
    return futures


def until(predicate, clients: list, timeout: float = 60) -> bool:
    """Poll `predicate` while the clients serve; a client that ended (its answer wrong, a
    request failed) ends the wait with its error."""
    met = poll(lambda: predicate() or any(f.done() for f in clients), timeout)
    for f in clients:
        if f.done():
            f.result()
    return met and predicate()


def served_until(host: HostManager, name: str, model: str, *predicates) -> None:
    """Serve (`serve`) until each of `predicates` holds in turn; then the clients stop,
    every answer of theirs checked."""
    stop = threading.Event()
    clients = serve(host, name, model, stop)
    try:
        for predicate in predicates:
            assert until(predicate, clients), (predicate, host.stats(), {
                d.name: d.keys for d in host.devices.values()})
    finally:
        stop.set()
    assert sum(f.result(timeout=WAIT) for f in clients) > 0


def keys_of(host: HostManager, name: str) -> set[str]:
    return {k for d in host.devices.values() for k in d.keys if k.split("/")[0].split("~")[0]
            == name}


def test_a_plan_served_at_other_shapes_is_remade_on_its_run_times_and_requests_never_fail(
        tmp_path):
    model = rows_then_one(tmp_path / "m.onnx")
    with HostManager(cpus(), max_queue=64) as host:
        learned = Events(host, kinds=("plan.learned",))
        first = host.add_network("m", model, bindings={"batch": 1}, costs="measured")
        assert len(first.partitions) == 2
        # re-made; then the new plan serves, and what the old one held left the devices
        served_until(host, "m", model, lambda: any(e["moved"] for e in learned.all()),
                     lambda: all("~" in k for k in keys_of(host, "m")))
        moved = next(e for e in learned.all() if e["moved"])
        assert "re-planned on them" in moved["reason"]
        assert set(moved["medians"]) == {p.name for p in first.partitions}
        now = host.plan("m")
        assert not same_assignment(now, first)
        # the half that runs every row was the slow one: the new plan gave it fewer nodes
        rows = first.partition_of("mm0")
        assert moved["medians"][rows.name] == max(moved["medians"].values())
        assert len(now.partition_of("mm0").nodes) < len(rows.nodes)
        assert host.stats().outstanding == {"m": 0}



def test_a_move_waits_for_a_second_look_to_find_a_better_plan_too(tmp_path, monkeypatch):
    """One look's imbalance (a slow second: a collection, a neighbour's burst) moves
    nothing. Every other look here sees its stages even: the plan never moves, though
    every look between finds the better plan; once looks agree, it moves."""
    real, looks, alternate = learning._medians, [0], [True]

    def medians(loaded, seen):
        got = real(loaded, seen)
        if got is None:
            return None
        looks[0] += 1
        if alternate[0] and looks[0] % 2 == 0:
            return dict.fromkeys(got, max(got.values()))
        return got

    monkeypatch.setattr(learning, "_medians", medians)
    model = rows_then_one(tmp_path / "m.onnx")

    def agree() -> bool:
        assert not any(e["moved"] for e in learned.all())
        assert any("confirmed by the next look" in e["reason"] for e in learned.all())
        alternate[0] = False
        return True

    with HostManager(cpus(), max_queue=64) as host:
        learned = Events(host, kinds=("plan.learned",))
        first = host.add_network("m", model, bindings={"batch": 1}, costs="measured")
        assert len(first.partitions) == 2
        served_until(host, "m", model, lambda: looks[0] >= 8, agree,
                     lambda: any(e["moved"] for e in learned.all()))
        assert not same_assignment(host.plan("m"), first)

def test_stages_apart_by_what_a_wait_could_make_keep_their_nodes_and_estimates_follow(
        tmp_path, monkeypatch):
    # A GIL wait as long as a second: no gap here is more than one could make
    monkeypatch.setattr(learning, "LOAD_WAIT_MAX", 1.0)
    model = rows_then_one(tmp_path / "m.onnx")
    with HostManager(cpus(), max_queue=64) as host:
        learned = Events(host, kinds=("plan.learned",))
        first = host.add_network("m", model, bindings={"batch": 1}, costs="measured")
        runs = Events(host, kinds=("partition.run.finished",))
        served_until(host, "m", model, learned.all)
        first_learned = learned.all()[0]
        assert not first_learned["moved"] and "estimates corrected" in first_learned["reason"]
        now = host.plan("m")
        assert same_assignment(now, first) and now.costs == "live"
        times: dict[str, list[float]] = {}
        for e in runs.all():
            times.setdefault(e["partition"], []).append(e["run_seconds"])
        for p in now.partitions:  # what its runs took under this load
            assert p.est_seconds == pytest.approx(np.median(times[p.name]), rel=0.3)
        rows = first.partition_of("mm0")  # not what one row takes
        assert now.partition(rows.name).est_seconds > 2 * rows.est_seconds


def test_a_remade_plan_that_runs_no_faster_goes_back_and_the_network_moves_no_more(
        tmp_path, monkeypatch):
    # A promise nothing keeps: any re-made plan is loaded, and none is found faster
    monkeypatch.setattr(learning, "GAIN", -1.0)
    model = rows_then_one(tmp_path / "m.onnx")
    with HostManager(cpus(), max_queue=64) as host:
        learned = Events(host, kinds=("plan.learned",))
        first = host.add_network("m", model, bindings={"batch": 1}, costs="measured")
        back: list[int] = []  # events when it went back

        def went_back() -> bool:
            seen = learned.all()
            if not back and any("back to that plan" in e["reason"] for e in seen):
                back.append(len(seen))
            return bool(back)

        served_until(host, "m", model, went_back, lambda: len(learned.all()) > back[0] + 1)
        seen = learned.all()
        moves = [e for e in seen if e["moved"]]
        assert len(moves) == 2 and "back to that plan" in moves[1]["reason"]
        assert same_assignment(host.plan("m"), first)
        assert not any(e["moved"] for e in seen[back[0]:])  # afterwards: estimates only


def test_removing_or_closing_while_a_plan_learns_leaves_nothing_loaded(tmp_path):
    model = rows_then_one(tmp_path / "m.onnx")
    with HostManager(cpus(), max_queue=64) as host:
        learned = Events(host, kinds=("plan.learned",))
        host.add_network("m", model, bindings={"batch": 1}, costs="measured")
        served_until(host, "m", model, learned.all)
        host.remove_network("m")
        assert poll(lambda: not keys_of(host, "m"), timeout=WAIT)
        assert all(d.used_bytes == 0 for d in host.devices.values())
        host.add_network("m", model, bindings={"batch": 1}, costs="measured")  # learns afresh
    assert not [t for t in threading.enumerate() if t.name == "prism-plan-learner"]
