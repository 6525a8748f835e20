"""Dynamic batching (Triton semantics), priorities and timeouts under load.

Every input is fresh random data; every future.result() is bounded. Batches are read back
from `request.started` events: with batching on, one network's starts are all published by
its batcher thread, a batch's members one after another, so consecutive runs of
`batch_size` events are the batches.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
import time
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import (
    ExecutionError,
    InvalidInputError,
    PrismError,
    QueueFullError,
    RequestTimeoutError,
)
from runtime.executor.requests import Request, RequestQueue
from runtime.host import HostManager
from runtime.host.batching import Batcher, BatchingConfig, alike_but_first
from runtime.inputs import InputSpec, ValueType
from tests.support.classifiers import zipmap_classifier
from tests.support.fakes import FakeDevice, FaultySim, Gate, inject_marked
from tests.support.hosts import faked
from tests.support.serving import (
    FAULTS,
    MLP,
    TRANSFORMER,
    WAIT,
    Events,
    assert_same,
    check_storm,
    expected,
    idle,
    mlp_feeds,
    poll,
    storm,
)

# -- helpers -------------------------------------------------------------------------------


def batches(started: list) -> list[list]:
    """Consecutive request.started events grouped into batches by their batch_size."""
    out, i = [], 0
    while i < len(started):
        size = started[i]["batch_size"]
        group = started[i:i + size]
        assert len(group) == size and {e["batch_size"] for e in group} == {size}, \
            f"request.started events at {i} do not form a batch of {size}"
        out.append(group)
        i += size
    return out


class Sender:
    """Sends from several threads with random sleeps; records (request id, feeds, future,
    submit time). run() calls are serialised by a lock, so the n-th request.queued event
    is the n-th recorded request."""

    def __init__(self, host: HostManager, network: str, events: Events):
        self.host, self.network, self.events = host, network, events
        self.lock = threading.Lock()
        self.sent: list[tuple[dict, cf.Future, float, dict]] = []

    def send(self, feeds: dict, **kw) -> cf.Future:
        with self.lock:
            submit = time.monotonic()
            future = self.host.run(self.network, feeds, **kw)
            self.sent.append((feeds, future, submit, kw))
        return future

    def random_arrival(self, make_feeds, total: int, threads: int, max_sleep: float = 0.002,
                       **kw) -> None:
        def client(seed: int, count: int) -> None:
            rng = np.random.default_rng(seed)
            for _ in range(count):
                time.sleep(rng.uniform(0, max_sleep))
                self.send(make_feeds(rng), **kw)

        per = [total // threads + (i < total % threads) for i in range(threads)]
        seeds = np.random.SeedSequence().generate_state(threads)
        with cf.ThreadPoolExecutor(threads) as pool:
            for f in [pool.submit(client, int(s), n) for s, n in zip(seeds, per, strict=True)]:
                f.result(timeout=WAIT)

    def ids(self) -> list[int]:
        """Request ids in send order (from request.queued events)."""
        queued = [e["request"] for e in self.events.of("request.queued", self.network)]
        assert len(queued) == len(self.sent)
        return queued


def rows(feeds: dict) -> int:
    return len(next(iter(feeds.values())))


def seq_model(width: int = 8, out: int = 4) -> tuple[onnx.ModelProto, np.ndarray]:
    """x [batch, seq, width] -> Relu(x @ W) [batch, seq, out]; batch and seq symbolic."""
    w = np.random.default_rng().standard_normal((width, out)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", out])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="matmul"),
         helper.make_node("Relu", ["h"], ["y"], name="relu")],
        "seq", [x], [y], initializer=[numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model, w


def run_rows(host: HostManager) -> list[int]:
    """The batch dimension of every run on cpu0 (a fake device), in order."""
    return [shape[0] for _, shape, _ in host.devices["cpu0"].runs]


def transformer_feeds(rng) -> dict:
    n = int(rng.integers(1, 3))
    return {"tokens": rng.standard_normal((n, 16, 64)).astype(np.float32)}


# -- batched == unbatched ------------------------------------------------------------------


@pytest.mark.parametrize(("path", "make"), [(MLP, mlp_feeds), (TRANSFORMER, transformer_feeds)],
                         ids=["mlp", "transformer"])
def test_batched_equals_unbatched_request_by_request(path, make):
    with HostManager(parse_devices("cpu:2"), max_queue=1000) as host:
        host.add_network("b", path, batching={"max_batch_size": 8, "max_queue_delay_ms": 5})
        host.add_network("u", path)
        events = Events(host, kinds=("request.",))
        sender = Sender(host, "b", events)
        sender.random_arrival(make, total=200, threads=4)
        ids = sender.ids()
        by_id = {}
        for rid, (feeds, future, _, _) in zip(ids, sender.sent, strict=True):
            got = future.result(timeout=WAIT)
            alone = host.run("u", feeds).result(timeout=WAIT)  # the same runtime, unbatched
            assert_same(got, alone)
            assert_same(got, expected(path, feeds))
            by_id[rid] = feeds
        assert poll(lambda: len(events.of("request.started", "b")) == 200)
        groups = batches(events.of("request.started", "b"))
        assert sum(map(len, groups)) == 200
        assert max(map(len, groups)) <= 8
        assert any(len(g) > 1 for g in groups), "nothing was batched"
        mixed = [g for g in groups if len({rows(by_id[e["request"]]) for e in g}) == 2]
        assert mixed, "no batch mixed requests of 1 and 2 rows"
        assert poll(lambda: idle(host))


def test_only_inputs_fixed_but_in_their_first_dimension_skip_the_batch_key():
    """A batcher compares no keys when checked feeds cannot differ but in their first
    dimension: every input a tensor of a known dtype with the rest of its shape fixed."""
    f32, i64 = np.dtype("float32"), np.dtype("int64")
    fixed = InputSpec("x", f32, ("batch", 3, 4))
    assert alike_but_first([fixed, InputSpec("ids", i64, (None, 7))])
    for odd in (InputSpec("s", f32, ("batch", "seq", 8)), InputSpec("u", f32, None),
                InputSpec("d", None, ("batch", 4)), InputSpec("n", f32, ("batch", None)),
                InputSpec("q", None, None, ValueType("sequence", elem=ValueType("tensor")))):
        assert not alike_but_first([fixed, odd]), odd


def test_requests_with_different_non_batch_shapes_never_share_a_batch():
    model, w = seq_model()
    with HostManager(parse_devices("cpu:1"), max_queue=1000) as host:
        host.add_network("s", model, batching={"max_batch_size": 8, "max_queue_delay_ms": 5})
        events = Events(host, kinds=("request.",))
        sender = Sender(host, "s", events)

        def make(rng) -> dict:
            seq = int(rng.choice([3, 5]))
            n = int(rng.integers(1, 3))
            return {"x": rng.standard_normal((n, seq, 8)).astype(np.float32)}

        sender.random_arrival(make, total=200, threads=4)
        ids = sender.ids()
        by_id = {}
        for rid, (feeds, future, _, _) in zip(ids, sender.sent, strict=True):
            got = future.result(timeout=WAIT)["y"]
            np.testing.assert_allclose(got, np.maximum(feeds["x"] @ w, 0), rtol=1e-5,
                                       atol=1e-6)
            by_id[rid] = feeds
        assert poll(lambda: len(events.of("request.started", "s")) == 200)
        groups = batches(events.of("request.started", "s"))
        seqs_per_batch = [{by_id[e["request"]]["x"].shape[1] for e in g} for g in groups]
        assert all(len(s) == 1 for s in seqs_per_batch), "a batch mixed seq 3 and seq 5"
        assert {3, 5} <= {s for g, (s,) in zip(groups, seqs_per_batch, strict=True)
                          if len(g) > 1}, "both shapes should have been batched"
        assert not events.of("request.failed")


# -- batching batches, within its limits ---------------------------------------------------


def _closed_loop(host: HostManager, network: str, clients: int, each: int) -> list:
    """`clients` threads, each sending `each` requests one after another; returns
    (feeds, outputs) pairs."""
    out, lock = [], threading.Lock()

    def client(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(each):
            feeds = mlp_feeds(rng, batch=1)
            got = host.run(network, feeds).result(timeout=WAIT)
            with lock:
                out.append((feeds, got))

    seeds = np.random.SeedSequence().generate_state(clients)
    with cf.ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(client, int(s)) for s in seeds]:
            f.result(timeout=WAIT)
    return out


def test_32_concurrent_senders_get_batched_and_max_batch_size_holds():
    with HostManager(parse_devices("cpu:1"), max_queue=1000) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 8, "max_queue_delay_ms": 5})
        events = Events(host, kinds=("request.started",))
        results = _closed_loop(host, "m", clients=32, each=8)
        for feeds, got in results[::16]:
            assert_same(got, expected(MLP, feeds))
        assert poll(lambda: len(events.of("request.started")) == 32 * 8)
        sizes = [e["batch_size"] for e in events.of("request.started")]
        assert max(sizes) <= 8
        batched = sum(s > 1 for s in sizes)
        assert batched >= 0.75 * len(sizes), Counter(sizes)
        batches(events.of("request.started"))  # the starts group into whole batches


def test_a_request_larger_than_a_batch_is_refused_and_the_rest_served():
    rng = np.random.default_rng()
    top = int(rng.integers(2, 9))
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("m", MLP, batching={"max_batch_size": top, "max_queue_delay_ms": 1})
        with pytest.raises(InvalidInputError, match=f"request to m has batch {top + 1}, more "
                                                    f"than its max_batch_size {top}"):
            host.run("m", mlp_feeds(rng, top + 1))
        feeds = mlp_feeds(rng, top)
        assert_same(host.run("m", feeds).result(timeout=WAIT), expected(MLP, feeds))
        assert idle(host)


def test_preferred_batch_sizes_are_honoured():
    preferred, top, delay_ms = (3, 6), 8, 20.0
    with HostManager(parse_devices("cpu:1"), max_queue=1000) as host:
        host.add_network("m", MLP, batching={"max_batch_size": top,
                                             "max_queue_delay_ms": delay_ms,
                                             "preferred_batch_sizes": list(preferred)})
        events = Events(host, kinds=("request.started",))
        _closed_loop(host, "m", clients=32, each=6)
        # and a straggler, alone: it must wait out the delay, then go as a batch of 1
        rng = np.random.default_rng()
        lone = mlp_feeds(rng, batch=1)
        assert_same(host.run("m", lone).result(timeout=WAIT), expected(MLP, lone))
        assert poll(lambda: len(events.of("request.started")) == 32 * 6 + 1)
        groups = batches(events.of("request.started"))
        sizes = Counter(len(g) for g in groups)
        assert max(sizes) <= top
        for g in groups:
            if len(g) < preferred[0]:  # smaller than any preferred size: only after the delay
                assert max(e["queue_wait"] for e in g) >= delay_ms / 1e3 * 0.999, g
            else:
                assert len(g) in (*preferred, top), sizes
        assert groups[-1][0]["batch_size"] == 1
        assert sum(n for s, n in sizes.items() if s in (*preferred, top)) >= 0.8 * len(groups)


def test_max_batch_size_bounds_the_concatenated_batch_dimension():
    """Triton counts max_batch_size (and preferred sizes) in rows of the batch dimension:
    four requests of 2 rows are a batch of 8, which max_batch_size=4 does not allow."""
    with faked(max_queue=1000) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 4, "max_queue_delay_ms": 5})
        rng = np.random.default_rng()
        feeds = [mlp_feeds(rng, batch=2) for _ in range(64)]
        with cf.ThreadPoolExecutor(16) as pool:
            futures = list(pool.map(lambda f: host.run("m", f), feeds))
        for f, fut in zip(feeds, futures, strict=True):
            assert_same(fut.result(timeout=WAIT), expected(MLP, f))
        rows = run_rows(host)
        assert sum(rows) == 128
        assert max(rows) <= 4, f"batches of {Counter(rows)} rows with max_batch_size=4"



def test_a_request_larger_than_max_batch_size_is_refused():
    """Triton refuses a request whose batch dimension exceeds max_batch_size; it must not
    run as an oversized batch."""
    with faked() as host:
        host.add_network("m", MLP, batching={"max_batch_size": 4, "max_queue_delay_ms": 1})
        rng = np.random.default_rng()
        try:
            error = host.run("m", mlp_feeds(rng, batch=6)).exception(timeout=WAIT)
        except PrismError as exc:
            error = exc
        assert isinstance(error, PrismError), f"a 6-row request ran: got {error!r}"
        assert "\n" not in str(error) and "4" in str(error) and "6" in str(error), str(error)
        assert all(rows <= 4 for rows in run_rows(host)), run_rows(host)
        ok = mlp_feeds(rng, batch=4)  # exactly the maximum is fine
        assert_same(host.run("m", ok).result(timeout=WAIT), expected(MLP, ok))
        assert poll(lambda: idle(host))

# -- refusals --------------------------------------------------------------------------------


def _tiny(x_dims, y_dims, reduce: bool = False) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, y_dims)
    node = (helper.make_node("ReduceSum", ["x"], ["y"], name="sum", keepdims=0) if reduce
            else helper.make_node("Relu", ["x"], ["y"], name="relu"))
    model = helper.make_model(helper.make_graph([node], "tiny", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize(("model", "tensor"), [
    (_tiny([1, 4], [1, 4]), "x"),
    (_tiny([4], [4]), "x"),
    (_tiny(["batch", 4], [], reduce=True), "y"),
], ids=["fixed-batch", "no-batch-axis", "scalar-output"])
def test_model_without_dynamic_batch_dimension_is_refused(model, tensor):
    with HostManager(parse_devices("cpu:2")) as host:
        with pytest.raises(PrismError) as info:
            host.add_network("t", model, batching={"max_batch_size": 4})
        message = str(info.value)
        assert "\n" not in message
        assert repr(tensor) in message, message
        assert "batch" in message
        assert host.networks() == []
        assert all(m.used_bytes == 0 for m in host.devices.values())
        host.add_network("t", model)  # the name is free and the model loads unbatched
        assert host.networks() == ["t"]


def test_a_classifiers_maps_batch_one_a_row_and_other_sequences_are_refused():
    """A ZipMap's sequence has one map a row (skl2onnx's default classifier): it batches,
    each request getting its rows' maps back. It was refused ("has no shape"). A sequence
    of tensors need not follow the rows, so it still is."""
    rng = np.random.default_rng()
    model = zipmap_classifier(rng)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    with HostManager(parse_devices("cpu:2")) as host:
        events = Events(host, kinds=("request.started",))
        host.add_network("c", model, batching={"max_batch_size": 8, "max_queue_delay_ms": 50})
        xs = [rng.standard_normal((int(rng.integers(1, 4)), 4)).astype(np.float32)
              for _ in range(16)]
        futures = [host.run("c", {"x": x}) for x in xs]
        for x, future in zip(xs, futures, strict=True):
            got, (labels, maps) = future.result(WAIT), session.run(None, {"x": x})
            np.testing.assert_array_equal(got["label"], labels)
            assert [list(m) for m in got["probabilities"]] == [list(m) for m in maps]
            # batched rows run other kernels than a request's alone: float noise
            np.testing.assert_allclose([list(m.values()) for m in got["probabilities"]],
                                       [list(m.values()) for m in maps], rtol=1e-5,
                                       atol=1e-7)
        assert poll(lambda: len(events.of("request.started", "c")) == 16)
        assert max(e["batch_size"] for e in events.of("request.started", "c")) > 1
        del model.graph.output[0]  # the maps alone, a row a request: the split's fast path
        host.add_network("maps", model, batching={"max_batch_size": 8,
                                                  "max_queue_delay_ms": 50})
        futures = [host.run("maps", {"x": x[:1]}) for x in xs]
        for x, future in zip(xs, futures, strict=True):
            [want] = session.run(["probabilities"], {"x": x[:1]})
            assert [list(m) for m in future.result(WAIT)["probabilities"]] == \
                [list(m) for m in want]
        f = TensorProto.FLOAT
        listed = helper.make_model(helper.make_graph(
            [helper.make_node("SequenceConstruct", ["x", "x"], ["both"])], "listed",
            [helper.make_tensor_value_info("x", f, ["n", 4])],
            [helper.make_tensor_sequence_value_info("both", f, None)]),
            opset_imports=[helper.make_opsetid("", 17)])
        with pytest.raises(PrismError, match="output 'both' has no shape"):
            host.add_network("listed", listed, batching={"max_batch_size": 8})


def test_a_batch_output_that_does_not_split_by_rows_fails_each_member():
    """A device giving a map where the maps of each row belong (the output check only
    looks for a sequence) killed the batcher's thread on the split: no member ever ended."""
    rng = np.random.default_rng()
    with faked("cpu:1") as host:
        host.add_network("c", zipmap_classifier(rng),
                         batching={"max_batch_size": 8, "max_queue_delay_ms": 20})
        host.devices["cpu0"].mangle = lambda call, feeds, outputs: {
            **outputs, "probabilities": dict(enumerate(outputs["probabilities"]))}
        futures = [host.run("c", {"x": rng.standard_normal((2, 4)).astype(np.float32)})
                   for _ in range(6)]
        for future in futures:
            error = future.exception(WAIT)
            assert isinstance(error, ExecutionError) and "'probabilities'" in str(error)


@pytest.mark.parametrize("config", [{"max_batch_size": 0}, {"max_queue_delay_ms": -1},
                                    {"max_batch": 4}])
def test_bad_batching_settings_are_refused(config):
    with HostManager(parse_devices("cpu:1")) as host:
        with pytest.raises(PrismError) as info:
            host.add_network("m", MLP, batching=config)
        assert "\n" not in str(info.value)
        assert host.networks() == []


# -- timeouts with batching on ----------------------------------------------------------------


def test_request_never_waits_past_timeout_plus_one_batch_run():
    # mlp is ~1.05 MFLOP: at 2.1e7 FLOP/s one run (of any batch) is held ~50 ms
    devices = [DeviceConfig(name="sim0", backend="sim", peak_flops=2.1e7)]
    slack = 0.05
    with HostManager(devices, max_queue=1000) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 8, "max_queue_delay_ms": 2})
        events = Events(host, kinds=("request.", "partition.run.finished"))
        sender = Sender(host, "m", events)
        ended: dict[int, float] = {}

        def make(rng) -> dict:
            return mlp_feeds(rng)

        rng = np.random.default_rng()
        timeouts = [0.02] * 50 + list(rng.choice([0.02, 0.5], 30))

        def client(seed: int, mine: list[float]) -> None:
            r = np.random.default_rng(seed)
            for t in mine:
                time.sleep(r.uniform(0, 0.002))
                fut = sender.send(make(r), timeout=float(t))
                fut.add_done_callback(lambda f: ended.setdefault(id(f), time.monotonic()))

        with cf.ThreadPoolExecutor(4) as pool:
            for f in [pool.submit(client, i, timeouts[i::4]) for i in range(4)]:
                f.result(timeout=WAIT)
        outcomes = Counter()
        for _, fut, _, _ in sender.sent:
            err = fut.exception(timeout=WAIT)
            assert err is None or isinstance(err, RequestTimeoutError), err
            outcomes["timeout" if err else "result"] += 1
        assert outcomes["timeout"] > 0 and outcomes["result"] > 0, outcomes
        runs = [e["run_seconds"] for e in events.of("partition.run.finished")]
        assert runs, "no batch ran"
        batch_run = max(runs)
        assert 0.03 < batch_run < 0.5, batch_run
        for _, fut, submit, kw in sender.sent:
            late = ended[id(fut)] - (submit + kw["timeout"] + batch_run)
            assert late <= slack, f"ended {late * 1e3:.1f} ms past timeout + one batch run"
        # a request that timed out in the queue never started
        started = {e["request"] for e in events.of("request.started")}
        queued_out = [e["request"] for e in events.of("request.failed")
                      if "in the queue" in e["error"]]
        assert queued_out, "no request timed out while queued"
        assert not started & set(queued_out), "requests timed out 'in the queue' had started"
        assert poll(lambda: idle(host))
        feeds = mlp_feeds(rng)
        assert_same(host.run("m", feeds).result(timeout=WAIT), expected(MLP, feeds))


def test_a_batch_whose_members_ended_meanwhile_gives_its_slot_back_and_batching_goes_on():
    """Between forming a batch and launching it a member may end (a deadline, a
    cancellation): the launch skips it, and a batch left with nobody gives back its slot
    at once. Driven through the Batcher's own interface: requests cancelled before it
    starts them stand for that window, deterministically."""
    rng = np.random.default_rng()
    slots, begun, ended = [1], [], []
    lock = threading.Lock()

    def take_slot() -> bool:
        with lock:
            if not slots[0]:
                return False
            slots[0] -= 1
            return True

    def finish(request, outputs, error) -> None:
        with lock:
            slots[0] += request.slot  # the batch holds the slot
        ended.append((request, outputs, error))

    def begin(batch, done) -> None:
        begun.append(batch)
        done(batch, {"y": batch.feeds["x"] * 2}, None)

    batcher = Batcher("m", BatchingConfig(max_batch_size=4, max_queue_delay_ms=1), 2,
                      take_slot=take_slot, begin=begin, finish=finish)
    try:
        doomed = [Request("m", mlp_feeds(rng, 1), rows=1) for _ in range(3)]
        for r in doomed:
            assert r.future.cancel()  # cancelled, not yet ended: the batcher finds out late
            batcher.push(r)
        assert poll(lambda: len(ended) == 1, 5), "the empty batch never gave its slot back"
        [(batch, outputs, error)] = ended
        assert batch.members == [] and outputs is None and error is None and not begun
        assert slots == [1]
        kept = Request("m", mlp_feeds(rng, 2), rows=2)
        batcher.push(kept)
        assert poll(lambda: len(ended) == 2, 5), "the batcher stopped batching"
        assert begun[0].members == [kept] and kept.future.running()
        np.testing.assert_array_equal(ended[1][1]["y"], kept.feeds["x"] * 2)
        assert slots == [1]
    finally:
        batcher.close()


def test_a_request_timing_out_while_its_batch_runs_is_reported_running_after_it_started():
    """A member's deadline that passes while its batch runs: it fails as "running", and
    its request.started came first (started_at and the event precede the run)."""
    with faked(max_active=1) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 4, "max_queue_delay_ms": 1})
        gate = host.devices["cpu0"].gate = Gate()
        events = Events(host, kinds=("request.",))
        rng = np.random.default_rng()
        fut = host.run("m", mlp_feeds(rng), timeout=0.05)
        assert gate.entered.wait(5)
        assert isinstance(fut.exception(timeout=WAIT), RequestTimeoutError)
        gate.opened.set()
        assert poll(lambda: idle(host), 5)
        [failed] = events.of("request.failed")
        [started] = events.of("request.started")
        assert "running" in failed["error"], failed["error"]
        assert events.seen.index(started) < events.seen.index(failed)
        feeds = mlp_feeds(rng)
        assert_same(host.run("m", feeds).result(timeout=WAIT), expected(MLP, feeds))

# -- priorities -------------------------------------------------------------------------------


def test_priorities_with_batching_on():
    with faked(max_active=1, max_queue=100) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 4, "max_queue_delay_ms": 1})
        gate = host.devices["cpu0"].gate = Gate()
        events = Events(host, kinds=("request.",))
        rng = np.random.default_rng()
        first = host.run("m", mlp_feeds(rng, 1))
        assert gate.entered.wait(5), "the first batch never reached the device"
        sent = []
        for p in rng.permutation([0] * 6 + [1] * 6):
            feeds = mlp_feeds(rng)
            sent.append((int(p), feeds, host.run("m", feeds, priority=int(p)),
                         events.last_queued()))
        time.sleep(0.05)  # well past the delay: every batch is ready, none can start
        gate.opened.set()
        first.result(timeout=WAIT)
        for _, feeds, fut, _ in sent:
            assert_same(fut.result(timeout=WAIT), expected(MLP, feeds))
        prio = {rid: p for p, _, _, rid in sent}
        assert poll(lambda: len(events.of("request.started")) == 13)
        groups = batches(events.of("request.started"))[1:]  # after the one at the gate
        order = [prio[e["request"]] for g in groups for e in g]
        assert order == sorted(order), f"priority-1 started before priority-0: {order}"
        batch_of = {e["request"]: i for i, g in enumerate(groups) for e in g}
        last_high = max(batch_of[rid] for p, _, _, rid in sent if p == 0)
        first_low = min(batch_of[rid] for p, _, _, rid in sent if p == 1)
        assert last_high <= first_low
        # FIFO among equals
        for level in (0, 1):
            ids = [rid for p, _, _, rid in sent if p == level]
            assert [e["request"] for g in groups for e in g if prio[e["request"]] == level] \
                == ids


def test_priority_order_without_batching_under_load():
    with faked(max_active=1, max_queue=200) as host:
        host.add_network("m", MLP)
        gate = host.devices["cpu0"].gate = Gate()
        events = Events(host, kinds=("request.",))
        box: list = []
        blocker = threading.Thread(target=lambda: box.append(host.run(
            "m", mlp_feeds(np.random.default_rng(), 1), inline=False)), daemon=True)
        blocker.start()  # holds the one slot, its run held on the device's worker
        assert gate.entered.wait(5)
        lock = threading.Lock()
        sent: list = []

        def client(seed: int) -> None:
            r = np.random.default_rng(seed)
            for _ in range(25):
                time.sleep(r.uniform(0, 0.002))
                feeds, p = mlp_feeds(r), int(r.integers(0, 2))
                fut = host.run("m", feeds, priority=p)
                with lock:
                    sent.append((p, feeds, fut))

        with cf.ThreadPoolExecutor(4) as pool:
            for f in [pool.submit(client, i) for i in range(4)]:
                f.result(timeout=WAIT)
        assert host.stats().queued == 100
        gate.opened.set()
        blocker.join(WAIT)
        box[0].result(timeout=WAIT)
        for _, feeds, fut in sent:
            assert_same(fut.result(timeout=WAIT), expected(MLP, feeds))
        queued = {e["request"]: (e["priority"], i)
                  for i, e in enumerate(events.of("request.queued"))}
        assert poll(lambda: len(events.of("request.started")) == 101)
        order = [queued[e["request"]] for e in events.of("request.started")[1:]]
        assert [p for p, _ in order] == sorted(p for p, _ in order)
        assert {p for p, _ in order} == {0, 1}
        for level in (0, 1):  # FIFO among equals
            seq = [i for p, i in order if p == level]
            assert seq == sorted(seq)


# -- every accepted request ends exactly once -------------------------------------------------


@pytest.mark.parametrize("factory", [FakeDevice, FaultySim], ids=["fake", "sim"])
def test_2000_batched_requests_with_faults_cancellations_and_timeouts_end_once(factory):
    """Faults of every kind among cancels and timeouts: a faulted batch's members run again
    alone, so only the marked ones fail, each once, with its own error."""
    devices = [DeviceConfig(name=f"sim{i}", backend="sim", peak_flops=2e9) for i in range(2)]
    with HostManager(devices, max_queue=5000, device_factory=factory) as host:
        plan = host.add_network("m", MLP, batching={"max_batch_size": 8,
                                                    "max_queue_delay_ms": 1,
                                                    "preferred_batch_sizes": [4]})
        inject_marked(host.devices[plan.partitions[0].device])
        events = Events(host, kinds=("request.",))
        records = storm(host, "m", mlp_feeds, faults=0.1)
        outcomes = check_storm(host, "m", mlp_feeds, events, records, MLP)
        assert min(outcomes[k] for k in ("cancelled", "timeout", "result", *FAULTS)
                   if k != "hold") > 0, outcomes
        started = Counter(e["request"] for e in events.of("request.started"))
        assert set(started.values()) <= {1}
        assert any(e["batch_size"] > 1 for e in events.of("request.started"))


def test_a_request_that_ended_after_leaving_its_queue_does_not_start():
    """The thread that frees a slot takes the next queued request and starts it; if the
    request's deadline passed (or it was cancelled) in between, starting it must decline
    quietly, so that thread's own run() still returns its future."""
    timed_out, cancelled, fresh = (Request("m", {}) for _ in range(3))
    assert timed_out.claim()
    timed_out.settle(None, RequestTimeoutError("late"))
    assert cancelled.future.cancel()
    assert not timed_out.start() and not cancelled.start()
    assert fresh.start() and fresh.future.running()
    assert not fresh.start()  # once


@contextlib.contextmanager
def one_batch_held():
    """A batching mlp on one cpu with one place, its first request's run held at a gate:
    (host, gate, that request's future, rng)."""
    with faked(max_active=1) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 4, "max_queue_delay_ms": 1})
        gate = host.devices["cpu0"].gate = Gate()
        rng = np.random.default_rng()
        first = host.run("m", mlp_feeds(rng, 1))
        assert gate.entered.wait(5)
        yield host, gate, first, rng


def test_close_with_batched_requests_waiting_ends_every_one():
    with one_batch_held() as (host, gate, first, rng):
        waiting = [host.run("m", mlp_feeds(rng)) for _ in range(10)]
        opener = threading.Timer(0.3, gate.opened.set)
        opener.start()
        t0 = time.monotonic()
        host.close(timeout=0.1)
        assert time.monotonic() - t0 < 5
        opener.join(WAIT)
        assert first.exception(timeout=WAIT) is None or isinstance(first.exception(), PrismError)
        for fut in waiting:
            err = fut.exception(timeout=WAIT)
            assert err is None or type(err).__name__ == "HostClosedError", err
        assert sum(f.exception() is not None for f in waiting) > 0


def test_batcher_does_not_poll_while_a_ready_batch_waits_for_a_place():
    """Every place freed wakes the batcher (place_freed), so while the device is busy a
    ready batch should wait, not re-check the clock every 0.1 ms on a 2-core host."""
    with one_batch_held() as (host, gate, first, rng):
        waiting = [host.run("m", mlp_feeds(rng, 1)) for _ in range(8)]
        time.sleep(0.05)  # past the delay: a batch is ready, no place is free
        cpu = time.process_time()
        time.sleep(0.5)
        spent = time.process_time() - cpu
        gate.opened.set()
        first.result(timeout=WAIT)
        for fut in waiting:
            fut.result(timeout=WAIT)
        assert spent < 0.02, f"{spent * 1e3:.0f} ms of CPU in 500 ms with nothing to do"


def test_a_request_taken_out_and_pushed_back_keeps_its_place():
    """The batcher pops requests to form a batch and pushes back those of another shape:
    they must come out again in their own order, ahead of later arrivals."""
    rng = np.random.default_rng()
    queue = RequestQueue()
    made = [Request("m", {}, priority=int(p)) for p in rng.integers(0, 3, 12)]
    for r in made:
        queue.push(r)
    taken = [queue.pop() for _ in range(5)]
    for r in rng.permutation(taken):
        queue.push(r)
    order = [queue.pop() for _ in range(len(made))]
    assert order == sorted(made, key=lambda r: (r.priority, r.id))
    assert queue.pop() is None and len(queue) == 0


# -- admission without the host's lock ------------------------------------------------------


def test_a_batcher_refuses_past_max_queue_and_serves_what_it_took():
    with faked(max_active=1, max_queue=3) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 4, "max_queue_delay_ms": 1})
        gate = host.devices["cpu0"].gate = Gate()
        rng = np.random.default_rng()
        first_feeds = mlp_feeds(rng, 1)
        first = host.run("m", first_feeds)
        assert gate.entered.wait(WAIT)
        sent = [mlp_feeds(rng, 1) for _ in range(3)]
        queued = [host.run("m", f) for f in sent]
        with pytest.raises(QueueFullError, match=r"full \(3 waiting\)"):
            host.run("m", mlp_feeds(rng, 1))
        assert host.stats().outstanding == {"m": 4}
        gate.opened.set()
        for feeds, future in zip([first_feeds, *sent], [first, *queued], strict=True):
            assert_same(future.result(timeout=WAIT), expected(MLP, feeds))
        assert poll(lambda: idle(host) and host.stats().outstanding == {"m": 0})


def submit_storm(host: HostManager, stop: threading.Event, threads: int = 6
                 ) -> tuple[list, list, list[threading.Thread]]:
    """Threads each sending to "m" and waiting for the answer, until `stop` or refused:
    (accepted (feeds, future), refused errors, the threads)."""
    accepted: list = []
    refused: list = []

    def send(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            feeds = mlp_feeds(rng, 1)
            try:
                future = host.run("m", feeds)
            except PrismError as exc:
                refused.append(exc)
                return
            accepted.append((feeds, future))
            future.exception(timeout=WAIT)

    pool = [threading.Thread(target=send, args=(int(s),))
            for s in np.random.default_rng().integers(0, 2**31, threads)]
    for t in pool:
        t.start()
    return accepted, refused, pool


def test_requests_sent_while_the_host_closes_each_end_once_or_are_refused():
    host = HostManager(parse_devices("cpu:1"))
    host.add_network("m", MLP, batching={"max_batch_size": 8, "max_queue_delay_ms": 2})
    stop = threading.Event()
    accepted, refused, pool = submit_storm(host, stop)
    assert poll(lambda: len(accepted) > 200)
    host.close(timeout=5)
    stop.set()
    for t in pool:
        t.join(WAIT)
    assert refused and {type(e).__name__ for e in refused} <= {"HostClosedError"}
    ended = Counter()
    for feeds, future in accepted:
        error = future.exception(timeout=WAIT)
        ended[type(error).__name__ if error else "ok"] += 1
        if error is None:
            assert_same(future.result(), expected(MLP, feeds))
    assert set(ended) <= {"ok", "HostClosedError"} and ended["ok"] > 0, ended


def test_remove_network_waits_for_requests_sent_meanwhile_or_they_are_refused():
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 8, "max_queue_delay_ms": 2})
        stop = threading.Event()
        accepted, refused, pool = submit_storm(host, stop)
        assert poll(lambda: len(accepted) > 200)
        host.remove_network("m", wait=True, timeout=WAIT)
        stop.set()
        for t in pool:
            t.join(WAIT)
        # every request it took ran: none was dropped with the network
        for feeds, future in accepted:
            assert_same(future.result(timeout=WAIT), expected(MLP, feeds))
        assert refused and {type(e).__name__ for e in refused} == {"NetworkNotFoundError"}
        assert host.networks() == []


def test_the_queue_keeps_priority_then_arrival_order_through_any_mix_of_operations():
    """Random pushes, pops, discards and push-backs against a sorted list."""
    rng = np.random.default_rng()
    queue, model, taken = RequestQueue(), [], []
    for _ in range(2000):
        op = rng.integers(0, 4)
        if op == 0:
            r = Request("m", {}, priority=int(rng.integers(0, 3)), queued_at=time.monotonic())
            queue.push(r)
            model.append(r)
        elif op == 1:
            got = queue.pop()
            want = min(model, key=lambda r: (r.priority, r.id), default=None)
            assert got is want
            if got is not None:
                model.remove(got)
                taken.append(got)
        elif op == 2 and model:
            r = model[int(rng.integers(0, len(model)))]
            assert queue.discard(r) and not queue.discard(r)
            model.remove(r)
        elif op == 3 and taken:  # a batch's member pushed back
            r = taken.pop(int(rng.integers(0, len(taken))))
            queue.push(r)
            model.append(r)
        assert len(queue) == len(model)
        firsts = [min((r for r in model if r.priority == p), key=lambda r: r.id)
                  for p in {r.priority for r in model}]
        assert queue.oldest() is min(firsts, key=lambda r: r.queued_at, default=None)
    assert queue.drain() == sorted(model, key=lambda r: (r.priority, r.id))
