"""Helpers the serving tests share: expected outputs, comparisons, polling, events."""

from __future__ import annotations

import concurrent.futures as cf
import functools
import itertools
import threading
import time
from collections import Counter

import numpy as np
import onnxruntime as ort

from runtime.errors import ExecutionError, RequestTimeoutError
from runtime.host import HostManager
from tests.support.dags import SAMPLES_DIR

WAIT = 30.0  # bound on every future.result(): nothing hangs
# Faults a request can carry in its feeds (`mark`; fakes.inject_marked makes a device obey
# them), each with what its request's error must say ("hold" holds the run past the
# request's timeout).
FAULTS: dict[str, str | None] = {
    "raise": "injected fault", "interrupt": "KeyboardInterrupt", "missing": "is missing",
    "dtype": "is float64 [", "shape": ", declared float32 [", "hold": None}
MARKS = {kind: 1000.0 + i for i, kind in enumerate(FAULTS)}
MLP = SAMPLES_DIR / "mlp.onnx"
CNN = SAMPLES_DIR / "cnn.onnx"
TRANSFORMER = SAMPLES_DIR / "transformer.onnx"


@functools.cache
def whole_model(path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def mlp_feeds(rng, batch: int | None = None) -> dict:
    n = batch if batch is not None else int(rng.integers(1, 3))
    return {"x": rng.standard_normal((n, 256)).astype(np.float32)}


def expected(path, feeds: dict) -> dict[str, np.ndarray]:
    """The whole model's outputs in plain onnxruntime."""
    session = whole_model(path)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name, value in want.items():
        assert got[name].shape == value.shape, name
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


def idle(host: HostManager) -> bool:
    """Nothing running and nothing waiting: every slot free, every queue empty."""
    stats = host.stats()
    return stats.slots_used == 0 and stats.queued == 0


def poll(predicate, timeout: float = 10.0, interval: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


class Events:
    """Accumulates everything a subscription drains, so a test can look back."""

    def __init__(self, host: HostManager, kinds=None, maxlen: int = 1_000_000):
        self.sub = host.bus.subscribe(maxlen=maxlen, kinds=kinds)
        self.seen: list = []

    def all(self) -> list:
        self.seen.extend(self.sub.drain())
        return self.seen

    def of(self, kind: str, network: str | None = None) -> list:
        return [e for e in self.all() if e.kind == kind
                and (network is None or e.get("network") == network)]

    def last_queued(self) -> int:
        return self.of("request.queued")[-1]["request"]

    def ran(self, request_id: int) -> bool:
        return any(e.kind == "partition.run.started" and e["request"] == request_id
                   for e in self.all())


def mark(feeds: dict, kind: str) -> dict:
    """Feeds carrying fault `kind` (in the first input's first column)."""
    next(iter(feeds.values()))[:, 0] = MARKS[kind]
    return feeds


def storm(host: HostManager, network: str, make, total: int = 2000, threads: int = 4,
          faults: float = 0.0) -> list:
    """`total` requests from `threads` threads: a `faults` share marked with a fault of a
    random kind, 30% with timeouts of 1-40 ms, 20% cancelled (at once or a moment later),
    the rest plain. Returns (how, feeds, future) records; the future is None when a
    KeyboardInterrupt from an inline run reached the sender."""
    lock, records = threading.Lock(), []
    kinds = list(FAULTS)

    def client(seed: int, count: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(count):
            feeds, r = make(rng), rng.random()
            how = kinds[rng.integers(len(kinds))] if r < faults else \
                "timeout" if r < faults + 0.3 else "cancel" if r < faults + 0.5 else "plain"
            kw = {"timeout": 0.005} if how == "hold" else \
                {"timeout": rng.uniform(0.001, 0.04)} if how == "timeout" else {}
            try:
                fut = host.run(network, mark(feeds, how) if how in FAULTS else feeds, **kw)
            except KeyboardInterrupt:
                fut = None
            if how == "cancel":
                if rng.random() < 0.5:
                    time.sleep(rng.uniform(0, 0.002))
                fut.cancel()
            with lock:
                records.append((how, feeds, fut))

    seeds = np.random.SeedSequence().generate_state(threads)
    with cf.ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(client, int(s), total // threads + (i < total % threads))
                  for i, s in enumerate(seeds)]:
            f.result(timeout=WAIT)
    assert len(records) == total
    return records


def count_outcomes(records: list, model) -> Counter:
    """`storm` records: every request ended exactly one way, as it should have (a fault
    fails its request with an ExecutionError naming partition, device and what, a held
    one times out), and the answers are right."""
    outcomes: Counter = Counter()
    for how, feeds, fut in records:
        if fut is None:
            assert how == "interrupt"
            outcomes["interrupted"] += 1
            continue
        if fut.cancelled():
            assert how == "cancel"
            outcomes["cancelled"] += 1
            continue
        err = fut.exception(timeout=0)
        if err is None:
            assert how not in FAULTS, how
            outcomes["result"] += 1
            assert_same(fut.result(timeout=0), expected(model, feeds))
        elif FAULTS.get(how):
            assert isinstance(err, ExecutionError) and FAULTS[how] in str(err), (how, err)
            assert err.partition and err.device and err.device in str(err), (how, err)
            outcomes[how] += 1
        else:
            assert isinstance(err, RequestTimeoutError), (how, err)
            assert how in ("timeout", "hold"), how
            outcomes["timeout"] += 1
    assert sum(outcomes.values()) == len(records)
    return outcomes


def check_storm(host: HostManager, network: str, make, events: Events, records: list, model
                ) -> Counter:
    """After a `storm`: every future done and right (`count_outcomes`), every request
    ended once in the events, the host idle and still serving."""
    futures = [f for _, _, f in records if f is not None]
    # (cf.wait() never counts a future cancelled before it ran as done)
    assert poll(lambda: all(f.done() for f in futures), WAIT), \
        f"{sum(not f.done() for f in futures)} futures left pending"
    outcomes = count_outcomes(records, model)
    assert poll(lambda: idle(host)), host.stats()
    assert poll(lambda: len(events.of("request.finished"))
                + len(events.of("request.failed")) >= len(records))
    ended = Counter(e["request"] for e in itertools.chain(
        events.of("request.finished"), events.of("request.failed")))
    assert len(ended) == len(records) and set(ended.values()) == {1}
    assert len(events.of("request.finished")) == outcomes["result"]
    feeds = make(np.random.default_rng())
    assert_same(host.run(network, feeds).result(timeout=WAIT), expected(model, feeds))
    return outcomes
