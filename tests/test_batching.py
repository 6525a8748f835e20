"""Dynamic batching (Triton semantics), priorities and timeouts under load.

Every input is fresh random data; every future.result() is bounded. Batches are read back
from `request.started` events: with batching on, one network's starts are all published by
its batcher thread, a batch's members one after another, so consecutive runs of
`batch_size` events are the batches.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import itertools
import threading
import time
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime.devices import DeviceConfig, parse_devices
from runtime.devices.backends import compiler
from runtime.errors import PrismError, RequestTimeoutError
from runtime.host import HostManager
from runtime.requests import Request, RequestQueue
from runtime.submodel import extract
from serving import (
    MLP,
    TRANSFORMER,
    WAIT,
    Events,
    Gate,
    assert_same,
    count_outcomes,
    expected,
    poll,
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


def wrap_function(host: HostManager, network: str, wrap) -> None:
    """Swap the only partition's loaded function for `wrap(fresh function)` through the
    DeviceManager's public evict/load_function; the byte account stays as it was."""
    [part] = host.plan(network).partitions
    key = f"{network}/{part.name}"
    [manager] = [m for m in host.devices.values() if key in m.keys]
    inner = compiler(manager.config.backend)(extract(host.graph(network), part),
                                             manager.config, 0.0)
    manager.evict(key)
    manager.load_function(key, wrap(inner), part.weight_bytes, part.activation_bytes)


class Shapes:
    """A function that records the shape of every run's first input."""

    def __init__(self, inner):
        self.inner, self.output_names = inner, inner.output_names
        self.seen: list[tuple[int, ...]] = []

    def run(self, feeds):
        self.seen.append(next(iter(feeds.values())).shape)
        return self.inner.run(feeds)


def mlp_feeds(rng, batch: int | None = None) -> dict:
    n = batch if batch is not None else int(rng.integers(1, 3))
    return {"x": rng.standard_normal((n, 256)).astype(np.float32)}


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
        assert poll(lambda: host._active == 0)


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
    with HostManager(parse_devices("cpu:1"), max_queue=1000) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 4, "max_queue_delay_ms": 5})
        shapes: list[Shapes] = []
        wrap_function(host, "m", lambda f: shapes.append(Shapes(f)) or shapes[-1])
        rng = np.random.default_rng()
        feeds = [mlp_feeds(rng, batch=2) for _ in range(64)]
        with cf.ThreadPoolExecutor(16) as pool:
            futures = list(pool.map(lambda f: host.run("m", f), feeds))
        for f, fut in zip(feeds, futures, strict=True):
            assert_same(fut.result(timeout=WAIT), expected(MLP, f))
        run_rows = [s[0] for s in shapes[0].seen]
        assert sum(run_rows) == 128
        assert max(run_rows) <= 4, f"batches of {Counter(run_rows)} rows with max_batch_size=4"



def test_a_request_larger_than_max_batch_size_is_refused():
    """Triton refuses a request whose batch dimension exceeds max_batch_size; it must not
    run as an oversized batch."""
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 4, "max_queue_delay_ms": 1})
        shapes: list[Shapes] = []
        wrap_function(host, "m", lambda f: shapes.append(Shapes(f)) or shapes[-1])
        rng = np.random.default_rng()
        try:
            error = host.run("m", mlp_feeds(rng, batch=6)).exception(timeout=WAIT)
        except PrismError as exc:
            error = exc
        assert isinstance(error, PrismError), f"a 6-row request ran: got {error!r}"
        assert "\n" not in str(error) and "4" in str(error) and "6" in str(error), str(error)
        assert all(s[0] <= 4 for s in shapes[0].seen), shapes[0].seen
        ok = mlp_feeds(rng, batch=4)  # exactly the maximum is fine
        assert_same(host.run("m", ok).result(timeout=WAIT), expected(MLP, ok))
        assert poll(lambda: host._active == 0)

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
        assert poll(lambda: host._active == 0)
        feeds = mlp_feeds(rng)
        assert_same(host.run("m", feeds).result(timeout=WAIT), expected(MLP, feeds))


def test_timeout_between_batch_forming_and_launch_does_not_kill_the_batcher():
    """A member whose deadline passes after the batcher took it from the queue but before
    the batch starts: its future is already finished, and the batch launch must skip it.
    The launch is delayed here to widen that window, which is otherwise microseconds."""
    host = HostManager([DeviceConfig(name="cpu0")])
    try:
        host.add_network("m", MLP, batching={"max_batch_size": 4, "max_queue_delay_ms": 1})
        batcher = host._networks["m"].batcher
        launch = batcher._launch
        delay = threading.Event()
        delay.set()

        def slow_launch(members):
            if delay.is_set():
                time.sleep(0.06)
            launch(members)

        batcher._launch = slow_launch
        rng = np.random.default_rng()
        doomed = host.run("m", mlp_feeds(rng), timeout=0.02)
        assert isinstance(doomed.exception(timeout=WAIT), RequestTimeoutError)
        time.sleep(0.1)
        delay.clear()
        feeds = mlp_feeds(rng)
        later = host.run("m", feeds)
        assert_same(later.result(timeout=3), expected(MLP, feeds))
        assert poll(lambda: host._active == 0, 2), f"_active stuck at {host._active}"
    finally:
        host.close(timeout=1)



def test_a_request_ending_while_its_batch_launches_is_reported_consistently(monkeypatch):
    """A deadline that passes after a member's future was marked running but before the
    launch records started_at: the failure says "in the queue" and request.started is
    then published after request.failed. The launch is slowed (concatenation) to widen
    a window that is otherwise microseconds."""
    import runtime.host

    concatenate = runtime.host.concatenate

    def slow_concatenate(members):
        time.sleep(0.06)
        return concatenate(members)

    monkeypatch.setattr(runtime.host, "concatenate", slow_concatenate)
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 4, "max_queue_delay_ms": 1})
        events = Events(host, kinds=("request.",))
        rng = np.random.default_rng()
        fut = host.run("m", mlp_feeds(rng), timeout=0.03)
        assert isinstance(fut.exception(timeout=WAIT), RequestTimeoutError)
        assert poll(lambda: host._active == 0, 5)
        [failed] = events.of("request.failed")
        started = events.of("request.started")
        if started:  # it did start: then it timed out running, and started came first
            assert "running" in failed["error"], failed["error"]
            assert events.seen.index(started[0]) < events.seen.index(failed)

# -- priorities -------------------------------------------------------------------------------


def test_priorities_with_batching_on():
    with HostManager(parse_devices("cpu:1"), max_active=1, max_queue=100) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 4, "max_queue_delay_ms": 1})
        gates: list[Gate] = []
        wrap_function(host, "m", lambda f: gates.append(Gate(f)) or gates[-1])
        gate = gates[0]
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
    with HostManager(parse_devices("cpu:1"), max_active=1, max_queue=200) as host:
        host.add_network("m", MLP)
        gates: list[Gate] = []
        wrap_function(host, "m", lambda f: gates.append(Gate(f)) or gates[-1])
        gate = gates[0]
        events = Events(host, kinds=("request.",))
        box: list = []
        blocker = threading.Thread(target=lambda: box.append(
            host.run("m", mlp_feeds(np.random.default_rng(), 1))), daemon=True)
        blocker.start()  # runs inline on its own thread and blocks there
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
        assert len(host._queue) == 100
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


def test_2000_batched_requests_with_cancellations_and_timeouts_end_once():
    devices = [DeviceConfig(name=f"sim{i}", backend="sim", peak_flops=2e9) for i in range(2)]
    with HostManager(devices, max_queue=5000) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 8, "max_queue_delay_ms": 1,
                                             "preferred_batch_sizes": [4]})
        events = Events(host, kinds=("request.",))
        lock = threading.Lock()
        records: list[tuple[str, dict, cf.Future]] = []

        def client(seed: int, count: int) -> None:
            rng = np.random.default_rng(seed)
            for _ in range(count):
                feeds = mlp_feeds(rng)
                r = rng.random()
                if r < 0.3:
                    how, fut = "timeout", host.run("m", feeds, timeout=rng.uniform(0.001, 0.03))
                elif r < 0.5:
                    how, fut = "cancel", host.run("m", feeds)
                    if rng.random() < 0.5:
                        time.sleep(rng.uniform(0, 0.002))
                    fut.cancel()
                else:
                    how, fut = "plain", host.run("m", feeds)
                with lock:
                    records.append((how, feeds, fut))

        with cf.ThreadPoolExecutor(4) as pool:
            for f in [pool.submit(client, i, 500) for i in range(4)]:
                f.result(timeout=WAIT)
        assert len(records) == 2000
        assert poll(lambda: all(f.done() for _, _, f in records), WAIT), \
            f"{sum(not f.done() for _, _, f in records)} futures left pending"
        outcomes = count_outcomes(records, MLP)
        assert min(outcomes["cancelled"], outcomes["timeout"], outcomes["result"]) > 0, outcomes
        assert poll(lambda: host._active == 0), f"host._active = {host._active}"
        assert poll(lambda: len(events.of("request.finished"))
                    + len(events.of("request.failed")) >= 2000)
        ended = Counter(e["request"] for e in itertools.chain(
            events.of("request.finished"), events.of("request.failed")))
        assert len(ended) == 2000 and set(ended.values()) == {1}
        assert len(events.of("request.finished")) == outcomes["result"]
        started = Counter(e["request"] for e in events.of("request.started"))
        assert set(started.values()) <= {1}
        assert any(e["batch_size"] > 1 for e in events.of("request.started"))
        feeds = {"x": np.random.default_rng().standard_normal((3, 256)).astype(np.float32)}
        assert_same(host.run("m", feeds).result(timeout=WAIT), expected(MLP, feeds))


def test_timeout_between_dequeue_and_start_does_not_break_the_releasing_caller():
    """Without batching: a queued request is taken from the queue by the thread that
    releases a place (here the caller of an earlier request that ran inline), then started.
    If its deadline passes in between, that caller's run() must still return its own
    future. The start is delayed here to widen a window that is otherwise microseconds."""
    devices = [DeviceConfig(name="sim0", backend="sim", peak_flops=2.1e7)]  # ~50 ms a run
    with HostManager(devices, max_active=1) as host:
        host.add_network("m", MLP)
        begin = host._begin

        def slow_begin(request, net):
            if not request.inline:  # a request taken from the queue
                time.sleep(0.1)
            begin(request, net)

        host._begin = slow_begin
        rng = np.random.default_rng()
        first = mlp_feeds(rng)
        box: list = []

        def caller() -> None:
            try:
                box.append(host.run("m", first))
            except Exception as exc:  # what the caller would see
                box.append(exc)

        thread = threading.Thread(target=caller, daemon=True)
        thread.start()
        assert poll(lambda: host._active == 1, 5)
        queued = host.run("m", mlp_feeds(rng), timeout=0.08)
        thread.join(WAIT)
        assert isinstance(queued.exception(timeout=WAIT), RequestTimeoutError)
        assert box and isinstance(box[0], cf.Future), f"the first caller's run() got {box}"
        assert_same(box[0].result(timeout=WAIT), expected(MLP, first))
        assert poll(lambda: host._active == 0, 5)


@contextlib.contextmanager
def one_batch_held():
    """A batching mlp on one cpu with one place, its first request's run held at a gate:
    (host, [gate], that request's future, rng)."""
    with HostManager(parse_devices("cpu:1"), max_active=1) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 4, "max_queue_delay_ms": 1})
        gates: list[Gate] = []
        wrap_function(host, "m", lambda f: gates.append(Gate(f)) or gates[-1])
        rng = np.random.default_rng()
        first = host.run("m", mlp_feeds(rng, 1))
        assert gates[0].entered.wait(5)
        yield host, gates, first, rng


def test_close_with_batched_requests_waiting_ends_every_one():
    with one_batch_held() as (host, gates, first, rng):
        waiting = [host.run("m", mlp_feeds(rng)) for _ in range(10)]
        opener = threading.Timer(0.3, gates[0].opened.set)
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
    with one_batch_held() as (host, gates, first, rng):
        waiting = [host.run("m", mlp_feeds(rng, 1)) for _ in range(8)]
        time.sleep(0.05)  # past the delay: a batch is ready, no place is free
        cpu = time.process_time()
        time.sleep(0.5)
        spent = time.process_time() - cpu
        gates[0].opened.set()
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
