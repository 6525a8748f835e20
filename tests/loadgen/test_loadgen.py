"""The load generator: closed loop (C clients) and open loop (Poisson at a rate), its
controls (pause, resume, scale, stop) and the random inputs it sends.

The generator is given a thin proxy of the host that counts requests in flight (from
run() until the future is done) and records every send's time and feeds.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from app.cli import main
from app.loadgen import LoadGenerator
from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import PrismError
from runtime.host import HostManager
from runtime.inputs import InputSpec, random_feeds
from tests.cli.test_cli import one_line_error
from tests.support.serving import MLP, WAIT, expected, idle, poll


class Counting:
    """Stands in for the host: forwards inputs() and run(), counting requests in flight."""

    def __init__(self, host: HostManager):
        self.host = host
        self.lock = threading.Lock()
        self.in_flight = 0
        self.peak = 0
        self.times: list[float] = []
        self.feeds: list[dict] = []

    def inputs(self, name: str):
        return self.host.inputs(name)

    def run(self, name, feeds, *args, **kw):
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.times.append(time.perf_counter())
            self.feeds.append(feeds)
        try:
            future = self.host.run(name, feeds, *args, **kw)
        except BaseException:
            self._done(None)
            raise
        future.add_done_callback(self._done)
        return future

    def _done(self, _future) -> None:
        with self.lock:
            self.in_flight -= 1

    def reset_peak(self) -> None:
        with self.lock:
            self.peak = self.in_flight

    @property
    def sent(self) -> int:
        with self.lock:
            return len(self.times)


def load_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("prism-load")]


def slow_sim(run_ms: float) -> list[DeviceConfig]:
    """One sim device on which an mlp run (~1.05 MFLOP) is held about `run_ms`."""
    return [DeviceConfig(name="sim0", backend="sim", peak_flops=1.05e6 / (run_ms / 1e3))]


@pytest.fixture
def no_leftover_threads():
    yield
    assert poll(lambda: not load_threads(), 5), load_threads()


@pytest.fixture
def proxy() -> Iterator[Counting]:
    """`m`, an mlp that batches (so no request runs on its sender's thread), on one slow sim
    device, behind a proxy counting the requests in flight."""
    with HostManager(slow_sim(10), max_queue=1000) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 4, "max_queue_delay_ms": 1})
        yield Counting(host)


# -- closed loop ---------------------------------------------------------------------------


def test_closed_loop_has_at_most_c_in_flight_on_a_batching_network(no_leftover_threads,
                                                                   proxy):
    # a batching network never runs a request on the sender's thread
    gen = LoadGenerator(proxy, "m", concurrency=8).start()
    try:
        time.sleep(0.4)
        assert proxy.peak == 8
        assert gen.stats.sent >= 16
    finally:
        gen.stop(timeout=5)
    assert load_threads() == []


def test_closed_loop_reaches_c_in_flight_when_runs_take_time(no_leftover_threads):
    """Four clients on a device where a run takes 20 ms: four requests should be out at
    once (three queued behind the one running), as with perf_analyzer."""
    with HostManager(slow_sim(20), max_queue=1000) as host:
        host.add_network("m", MLP)
        proxy = Counting(host)
        gen = LoadGenerator(proxy, "m", concurrency=4).start()
        try:
            time.sleep(0.4)
            peak, sent = proxy.peak, gen.stats.sent
        finally:
            gen.stop(timeout=5)
        assert peak <= 4
        assert peak == 4, f"at most {peak} of 4 clients' requests were ever in flight"
        assert sent >= 0.4 / 0.02 * 0.7  # the device is kept busy


def test_requests_budget_results_and_stats(no_leftover_threads):
    seen: list = []
    lock = threading.Lock()

    def on_result(feeds, outputs, error, latency):
        with lock:
            seen.append((feeds, outputs, error, latency))

    with HostManager(parse_devices("cpu:2")) as host:
        host.add_network("m", MLP)
        gen = LoadGenerator(host, "m", concurrency=4, requests=50, on_result=on_result,
                            bindings={"batch": 2}).start()
        assert gen.wait(timeout=WAIT)
        gen.stop(timeout=5)
        assert gen.stats.sent == gen.stats.ok == gen.stats.done == 50
        assert gen.stats.failed == gen.stats.rejected == 0
        assert len(gen.stats.latencies) == 50 and min(gen.stats.latencies) > 0
        assert len(seen) == 50
        for feeds, outputs, error, _ in seen:
            assert error is None
            want = expected(MLP, feeds)
            np.testing.assert_allclose(outputs["logits"], want["logits"], rtol=1e-4, atol=1e-5)


# -- open loop -----------------------------------------------------------------------------


class DrawnGaps:
    """A generator's random source, keeping every exponential gap it draws: the schedule
    is checked as drawn (a loaded machine's wall clock would blur its spread)."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.gaps = rng, []

    def exponential(self, scale: float) -> float:
        self.gaps.append(self.rng.exponential(scale))
        return self.gaps[-1]

    def __getattr__(self, name: str) -> object:
        return getattr(self.rng, name)


def test_open_loop_sends_at_the_rate_with_exponential_gaps(no_leftover_threads):
    rate = 300.0
    with HostManager(parse_devices("cpu:2"), max_queue=1000) as host:
        host.add_network("m", MLP)
        proxy = Counting(host)
        gen = LoadGenerator(proxy, "m", rate=rate)
        gen.rng = drawn = DrawnGaps(gen.rng)
        gen.start()
        t0 = time.perf_counter()
        time.sleep(1.0)
        gen.stop(timeout=5)
        elapsed = time.perf_counter() - t0
        assert load_threads() == []
        sent = gen.stats.sent
        assert 0.75 * rate * elapsed <= sent <= 1.25 * rate * elapsed, (sent, elapsed)
        gaps = np.array(drawn.gaps)
        assert len(gaps) >= sent
        cv = gaps.std() / gaps.mean()
        assert 0.75 <= cv <= 1.25, f"coefficient of variation {cv:.2f}, Poisson gives 1"
        assert abs(gaps.mean() - 1 / rate) < 0.3 / rate
        assert poll(lambda: gen.stats.done == sent, 5)
        assert gen.stats.ok == sent


def test_open_loop_keeps_its_rate_when_runs_are_slower_than_arrivals(no_leftover_threads):
    """Open loop means arrivals do not wait for answers: 100/s against a device that
    serves 50/s still sends ~100 in a second (the rest wait in the queue)."""
    rate = 100.0
    with HostManager(slow_sim(20), max_queue=1000) as host:
        host.add_network("m", MLP)
        proxy = Counting(host)
        gen = LoadGenerator(proxy, "m", rate=rate, timeout=0.3).start()
        time.sleep(1.0)
        sent = gen.stats.sent
        gen.stop(timeout=5)
        assert sent >= 0.7 * rate, f"sent {sent} in 1 s at rate {rate}"


# -- controls --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["closed", "open"])
def test_pause_stops_new_sends_and_resume_restarts(mode, no_leftover_threads):
    with HostManager(slow_sim(2), max_queue=1000) as host:
        host.add_network("m", MLP)
        proxy = Counting(host)
        kw = {"concurrency": 4} if mode == "closed" else {"rate": 200.0}
        gen = LoadGenerator(proxy, "m", **kw).start()
        try:
            assert poll(lambda: gen.stats.sent > 10, 5)  # a loaded machine may start slowly
            gen.pause()
            assert gen.paused
            time.sleep(0.1)  # answers in flight land; nothing new goes out
            assert poll(lambda: proxy.in_flight == 0, 5)
            held = gen.stats.sent
            time.sleep(0.3)
            assert gen.stats.sent == held == proxy.sent
            gen.resume()
            assert not gen.paused
            assert poll(lambda: gen.stats.sent > held + 10, 5), "resume did not restart"
        finally:
            gen.stop(timeout=5)


def test_scale_changes_the_open_loop_rate(no_leftover_threads):
    with HostManager(parse_devices("cpu:2"), max_queue=1000) as host:
        host.add_network("m", MLP)
        gen = LoadGenerator(host, "m", rate=100.0).start()
        try:
            time.sleep(0.05)
            a0 = gen.stats.sent
            time.sleep(0.6)
            slow = gen.stats.sent - a0
            gen.scale(3)
            assert gen.rate == pytest.approx(300.0)
            time.sleep(0.05)
            b0 = gen.stats.sent
            time.sleep(0.6)
            fast = gen.stats.sent - b0
        finally:
            gen.stop(timeout=5)
        assert 35 <= slow <= 90, slow
        assert 1.8 <= fast / slow <= 5.0, (slow, fast)


def test_scale_changes_the_closed_loop_client_count(no_leftover_threads, proxy):
    gen = LoadGenerator(proxy, "m", concurrency=2).start()
    try:
        time.sleep(0.2)
        assert proxy.peak == 2
        gen.scale(2)
        assert gen.concurrency == 4
        time.sleep(0.2)
        assert proxy.peak == 4
        gen.scale(0.5)
        assert gen.concurrency == 2
        time.sleep(0.1)  # the clients above the count finish their last request
        proxy.reset_peak()
        time.sleep(0.2)
        assert proxy.peak <= 2
    finally:
        gen.stop(timeout=5)


def test_scale_down_then_up_never_exceeds_the_client_count(no_leftover_threads, proxy):
    """Clients 2 and 3 still have a request out when the count drops to 2 and comes
    back to 4: each must continue as one client, not as two."""
    gen = LoadGenerator(proxy, "m", concurrency=4).start()
    try:
        time.sleep(0.2)
        assert proxy.peak == 4
        gen.scale(0.5)
        gen.scale(2)
        assert gen.concurrency == 4
        time.sleep(0.3)
        assert proxy.peak <= 4, f"{proxy.peak} requests in flight with 4 clients"
    finally:
        gen.stop(timeout=5)


@pytest.mark.parametrize("mode", ["closed", "open", "paused"])
def test_stop_returns_within_its_bound_and_leaves_no_load_thread(mode, no_leftover_threads):
    with HostManager(slow_sim(5), max_queue=1000) as host:
        host.add_network("m", MLP)
        kw = {"rate": 300.0} if mode == "open" else {"concurrency": 4}
        gen = LoadGenerator(host, "m", **kw).start()
        time.sleep(0.2)
        if mode == "paused":
            gen.pause()
            time.sleep(0.05)
        t0 = time.monotonic()
        gen.stop(timeout=1.0)
        took = time.monotonic() - t0
        assert took <= 1.2, took
        assert load_threads() == []
        sent = gen.stats.sent
        time.sleep(0.1)
        assert gen.stats.sent == sent
        assert poll(lambda: idle(host), 5)


def test_give_either_concurrency_or_rate():
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("m", MLP)
        with pytest.raises(PrismError):
            LoadGenerator(host, "m")
        with pytest.raises(PrismError):
            LoadGenerator(host, "m", concurrency=2, rate=10.0)


# -- random inputs -----------------------------------------------------------------------------


def text_model() -> onnx.ModelProto:
    """input_ids, attention_mask, token_type_ids (int64 [batch, seq]) -> float [batch, seq]."""
    names = ("input_ids", "attention_mask", "token_type_ids")
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
              for n in names]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])
    nodes = [helper.make_node("Cast", [n], [f"{n}_f"], name=f"cast_{n}", to=TensorProto.FLOAT)
             for n in names]
    nodes += [helper.make_node("Add", ["input_ids_f", "attention_mask_f"], ["s"], name="add1"),
              helper.make_node("Add", ["s", "token_type_ids_f"], ["y"], name="add2")]
    model = helper.make_model(helper.make_graph(nodes, "text", inputs, [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_random_inputs_have_the_right_dtype_and_shape(no_leftover_threads):
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("m", MLP)
        host.add_network("t", text_model())
        for network, bindings, count in (("m", {"batch": 3}, 20), ("m", None, 20),
                                         ("t", {"batch": 2, "seq": 5}, 30)):
            proxy = Counting(host)
            gen = LoadGenerator(proxy, network, concurrency=2, requests=count,
                                bindings=bindings).start()
            assert gen.wait(timeout=WAIT)
            gen.stop(timeout=5)
            assert gen.stats.ok == count, gen.stats.errors[:3]
            assert len(proxy.feeds) == count
            if network == "m":
                rows = (bindings or {}).get("batch", 1)
                for feeds in proxy.feeds:
                    assert set(feeds) == {"x"}
                    assert feeds["x"].dtype == np.float32 and feeds["x"].shape == (rows, 256)
                assert len({f["x"].tobytes() for f in proxy.feeds}) > 1, "inputs never vary"
                continue
            for feeds in proxy.feeds:
                assert set(feeds) == {"input_ids", "attention_mask", "token_type_ids"}
                for value in feeds.values():
                    assert value.dtype == np.int64 and value.shape == (2, 5)
                assert (feeds["attention_mask"] == 1).all()
                assert (feeds["token_type_ids"] == 0).all()
                assert feeds["input_ids"].min() >= 0
            ids = np.stack([f["input_ids"] for f in proxy.feeds])
            assert len(np.unique(ids)) > 1, "token ids never vary"


def _made_up_feeds(host: HostManager, network: str, rows: int) -> list[dict]:
    """The feeds a load generator made up for 40 requests of `rows` rows (`n`), every one
    answered."""
    proxy = Counting(host)
    gen = LoadGenerator(proxy, network, concurrency=2, requests=40, bindings={"n": rows}).start()
    assert gen.wait(timeout=WAIT)
    gen.stop(timeout=5)
    assert gen.stats.ok == 40, gen.stats.errors[:3]
    return proxy.feeds


def test_made_up_indices_stay_inside_the_table_they_index(no_leftover_threads, tmp_path):
    """An integer input that reaches a Gather (here through a Cast and an Unsqueeze)
    indexes its table: made-up values stay below its rows. Before, labels drawn up to 15
    into a table of ten embeddings failed most requests, and `prism run` with them."""
    rows = int(np.random.default_rng().integers(2, 12))
    table = np.random.default_rng().standard_normal((rows, 4)).astype(np.float32)
    nodes = [helper.make_node("Cast", ["label"], ["l64"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["l64", "one"], ["l2"]),
             helper.make_node("Gather", ["table", "l2"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "labels", [helper.make_tensor_value_info("label", TensorProto.INT32, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1, 4])],
        [onnx.numpy_helper.from_array(table, "table"),
         onnx.numpy_helper.from_array(np.array([1]), "one")]),
        opset_imports=[helper.make_opsetid("", 17)])
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("labels", model)
        assert [s.rows for s in host.inputs("labels")] == [rows]
        labels = np.concatenate([f["label"] for f in _made_up_feeds(host, "labels", 8)])
        assert labels.min() >= 0 and labels.max() == min(rows, 16) - 1
    path = tmp_path / "labels.onnx"
    onnx.save(model, path)
    assert main(["run", str(path), "--devices", "cpu:1", "--requests", "20", "--check"]) == 0


@pytest.mark.parametrize("case", ["axis past the table's rank", "a column of none"])
def test_indices_into_a_malformed_gather_are_left_for_onnxruntime_to_name(capsys, tmp_path,
                                                                          case):
    """Made-up values read a Gather as whole: one of axis 5 into a table of rank 2 raised
    IndexError, a column picked from an input 0 wide ZeroDivisionError (both fuzzed
    transformers exports). Such a model is onnxruntime's to refuse, in one line."""
    rng = np.random.default_rng()
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    if case == "a column of none":
        node = helper.make_node("Gather", ["boxes", "corner"], ["y"], axis=-1)
        inputs = [helper.make_tensor_value_info("boxes", i64, ["n", 0])]
        weights = [onnx.numpy_helper.from_array(np.array(0), "corner")]
    else:
        node = helper.make_node("Gather", ["table", "ids"], ["y"], axis=5)
        inputs = [helper.make_tensor_value_info("ids", i64, ["n"])]
        weights = [onnx.numpy_helper.from_array(
            rng.standard_normal((10, 4)).astype(np.float32), "table")]
    model = helper.make_model(helper.make_graph(
        [node], "malformed", inputs, [helper.make_tensor_value_info("y", f, None)], weights),
        opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "malformed.onnx"
    onnx.save(model, path)
    said = one_line_error(capsys, ["run", str(path), "--devices", "cpu:1", "--requests", "2"])
    assert said.startswith("prism: error: "), said


def test_made_up_token_ids_end_each_row_with_the_one_token_the_model_looks_for(
        no_leftover_threads, tmp_path):
    """BART's classifier reads the hidden state of each row's last end-of-sentence token
    (`ids == eos`, NonZero, GatherND, a Reshape to [batch, -1, width], the last): made-up
    ids held none in most requests and a different count in each row of a batch, and
    failed. They end each row with it, once, as a tokenizer ends a sentence; a padding
    mask (`ids != pad`) marks no token."""
    rng = np.random.default_rng()
    eos, rows = int(rng.integers(0, 15)), int(rng.integers(16, 40))
    table = rng.standard_normal((rows, 4)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["hidden"]),
             helper.make_node("Equal", ["ids", "eos"], ["is_eos"]),
             helper.make_node("NonZero", ["is_eos"], ["where"]),
             helper.make_node("Transpose", ["where"], ["at"], perm=[1, 0]),
             helper.make_node("GatherND", ["hidden", "at"], ["eos_states"]),
             helper.make_node("Shape", ["ids"], ["batch"], start=0, end=1),
             helper.make_node("Concat", ["batch", "rest"], ["by_row"], axis=0),
             helper.make_node("Reshape", ["eos_states", "by_row"], ["per_row"]),
             helper.make_node("Gather", ["per_row", "last"], ["y"], axis=1),
             helper.make_node("Equal", ["ids", "pad"], ["is_pad"]),
             helper.make_node("Not", ["is_pad"], ["mask"])]
    model = helper.make_model(helper.make_graph(
        nodes, "eos", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", "t"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, ["n", "t"])],
        [onnx.numpy_helper.from_array(table, "table"),
         onnx.numpy_helper.from_array(np.array(eos), "eos"),
         onnx.numpy_helper.from_array(np.array(eos + 1), "pad"),
         onnx.numpy_helper.from_array(np.array([-1, 4]), "rest"),
         onnx.numpy_helper.from_array(np.array(-1), "last")]),
        opset_imports=[helper.make_opsetid("", 17)])
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("eos", model)
        assert [s.ends_with for s in host.inputs("eos")] == [eos]
        ids = np.concatenate([f["ids"] for f in _made_up_feeds(host, "eos", 3)])
        assert (ids[:, -1] == eos).all() and ((ids == eos).sum(axis=1) == 1).all()
    path, bundle = tmp_path / "eos.onnx", tmp_path / "eos.prism"
    onnx.save(model, path)
    assert main(["compile", str(path), "--devices", "cpu:1", "--bind", "t=6", "-o",
                 str(bundle)]) == 0
    for source, bind in ((path, ["--bind", "t=6"]), (bundle, [])):
        assert main(["run", str(source), "--devices", "cpu:1", "--requests", "20", *bind,
                     "--check"]) == 0


def test_rows_of_no_tokens_end_with_none():
    """An end token to close each row with, in rows 0 long (a fuzzed BART's declared
    ids): no token to put it in, and made-up ids were an IndexError."""
    spec = InputSpec("input_ids", np.dtype(np.int64), ("batch", 0), ends_with=2)
    assert random_feeds([spec], np.random.default_rng())["input_ids"].shape == (1, 0)


def test_made_up_categories_are_ones_the_strict_one_hot_encoders_reading_them_know(
        no_leftover_threads, tmp_path):
    """scikit-learn's OneHotEncoder refuses a category it was not fitted on, and skl2onnx
    writes that as `zeros=0`: made-up words are drawn from the categories every encoder
    reading them knows, and codes whose columns are picked apart (by Gather, as skl2onnx
    does) column by column. Before, `prism run` on such a model failed every request
    ("Unknown Category")."""
    encode = functools.partial(helper.make_node, "OneHotEncoder", domain="ai.onnx.ml", zeros=0)
    nodes = [helper.make_node("Gather", ["codes", "c0"], ["a"], axis=1),
             helper.make_node("Gather", ["codes", "c1"], ["b"], axis=1),
             encode(["a"], ["ha"], cats_int64s=[3, 7, 11]),
             encode(["b"], ["hb"], cats_int64s=[20, 11, 7]),
             encode(["color"], ["hc"], cats_strings=["red", "green"]),
             helper.make_node("Concat", ["ha", "hb", "hc"], ["y"], axis=1)]
    model = helper.make_model(helper.make_graph(
        nodes, "onehot", [helper.make_tensor_value_info("codes", TensorProto.INT64, ["n", 2]),
                          helper.make_tensor_value_info("color", TensorProto.STRING, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
        [onnx.numpy_helper.from_array(np.array(i), f"c{i}") for i in (0, 1)]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("onehot", model)
        specs = host.inputs("onehot")
        assert [s.categories for s in specs] == [((3, 7, 11), (7, 11, 20)), (("green", "red"),)]
        assert [InputSpec.from_dict(s.to_dict()) for s in specs] == specs  # as a bundle keeps them
        feeds = _made_up_feeds(host, "onehot", 4)
        codes = np.concatenate([f["codes"] for f in feeds])
        assert [set(codes[:, j]) for j in (0, 1)] == [{3, 7, 11}, {7, 11, 20}]
        assert set(np.concatenate([f["color"] for f in feeds])) == {"red", "green"}
    path = tmp_path / "onehot.onnx"
    onnx.save(model, path)
    assert main(["run", str(path), "--devices", "cpu:1", "--requests", "20", "--check"]) == 0
