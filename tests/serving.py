"""Helpers the serving tests share: expected outputs, comparisons, polling, events."""

from __future__ import annotations

import functools
import time
from collections import Counter

import numpy as np
import onnxruntime as ort

from dags import SAMPLES_DIR
from runtime.errors import RequestTimeoutError
from runtime.host import HostManager

WAIT = 30.0  # bound on every future.result(): nothing hangs
MLP = SAMPLES_DIR / "mlp.onnx"
CNN = SAMPLES_DIR / "cnn.onnx"
TRANSFORMER = SAMPLES_DIR / "transformer.onnx"


@functools.cache
def whole_model(path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


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


def count_outcomes(records: list, model) -> Counter:
    """(how, feeds, future) records of cancelled / timed-out / plain requests: every one
    ended exactly one way, and the answers are right."""
    outcomes: Counter = Counter()
    for how, feeds, fut in records:
        if fut.cancelled():
            assert how == "cancel"
            outcomes["cancelled"] += 1
            continue
        err = fut.exception(timeout=0)
        if err is None:
            outcomes["result"] += 1
            assert_same(fut.result(timeout=0), expected(model, feeds))
        else:
            assert isinstance(err, RequestTimeoutError), (how, err)
            assert how == "timeout"
            outcomes["timeout"] += 1
    assert sum(outcomes.values()) == len(records)
    return outcomes
