"""Every sample model, on 1..4 devices of each kind, in each mode, gives what plain
onnxruntime gives for the whole model (fresh random inputs, batch 2)."""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort
import pytest

from runtime.devices import parse_devices
from runtime.host import HostManager
from runtime.inputs import input_specs, random_feeds
from tests.support.dags import SAMPLE_NAMES, SAMPLES_DIR

RESULT_TIMEOUT = 30.0
REQUESTS = 3
BIG = ("mlp", "cnn", "transformer", "branchy")  # enough nodes that balanced really splits
# Per-device memory that forces a split in both modes, and the fewest devices it needs.
TIGHT = {"mlp": ("1.5MB", 3), "cnn": ("400KB", 3), "transformer": ("200KB", 3),
         "control_flow": ("15KB", 2)}


@functools.cache
def whole_model(name: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(SAMPLES_DIR / f"{name}.onnx"),
                                providers=["CPUExecutionProvider"])


def expected(name: str, feeds: dict) -> dict[str, np.ndarray]:
    session = whole_model(name)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def device_spec(model: str, kind: str, n: int) -> tuple[str, bool]:
    """The --devices spec, and whether its memory is tight enough to force a split."""
    if kind == "sim" and model in TIGHT and n >= TIGHT[model][1]:
        return f"sim:{n}:mem={TIGHT[model][0]}", True
    return f"{kind}:{n}", False


def request_feeds(model: str, specs, rng: np.random.Generator, count: int) -> list[dict]:
    feeds = [random_feeds(specs, rng, {"batch": 2}) for _ in range(count)]
    if model == "control_flow":  # If(ReduceSum(x) > 0): drive both branches
        for i, f in enumerate(feeds):
            sign = 1.0 if i % 2 == 0 else -1.0
            f["x"] = (sign * np.abs(f["x"])).astype(np.float32)
    return feeds


def check_runs(host: HostManager, network: str, model: str, count: int = REQUESTS) -> None:
    specs = input_specs(host.graph(network))
    rng = np.random.default_rng()
    feeds = request_feeds(model, specs, rng, max(count, 2 if model == "control_flow" else 1))
    futures = [host.run(network, f) for f in feeds]
    for f, fut in zip(feeds, futures, strict=True):
        got = fut.result(timeout=RESULT_TIMEOUT)
        want = expected(model, f)
        assert set(got) == set(want)
        for name, value in want.items():
            assert got[name].shape == value.shape, name
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{model}/{name}")


def check_plan(plan, devices, model: str, n: int, mode: str, tight: bool) -> None:
    names = {d.name for d in devices}
    assert {p.device for p in plan.partitions} <= names
    limits = {d.name: d.memory_bytes for d in devices}
    for dev, used in plan.device_memory().items():
        assert used <= limits[dev]
    if n > 1 and mode == "balanced" and model in BIG:
        assert len(plan.partitions) > 1, f"{model} on {n} devices did not split"
    if tight:
        assert len(plan.partitions) > 1, f"{model} fits {n} tight devices unsplit"


@pytest.mark.parametrize("mode", ["memory", "balanced"])
@pytest.mark.parametrize("kind", ["cpu", "sim"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("model", SAMPLE_NAMES)
def test_matches_onnxruntime(model, n, kind, mode):
    spec, tight = device_spec(model, kind, n)
    devices = parse_devices(spec)
    with HostManager(devices) as host:
        plan = host.add_network(model, SAMPLES_DIR / f"{model}.onnx", partition=mode)
        check_plan(plan, devices, model, n, mode, tight)
        check_runs(host, model, model)
        host.remove_network(model)
        assert all(m.used_bytes == 0 for m in host.devices.values())


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("model", ["mlp", "control_flow"])
def test_reference_backend_matches_onnxruntime(model, n):
    devices = parse_devices(f"reference:{n}")
    with HostManager(devices) as host:
        for mode in ("memory", "balanced"):
            plan = host.add_network(mode, SAMPLES_DIR / f"{model}.onnx", partition=mode)
            check_plan(plan, devices, model, n, mode, False)
            assert {p.backend for p in plan.partitions} == {"reference"}
            check_runs(host, mode, model, count=2)


@pytest.mark.parametrize("model", SAMPLE_NAMES)
def test_mixed_kinds_one_host(model):
    """cpu and sim devices in one host; the plan may use both."""
    devices = parse_devices("cpu:2,sim:2")
    with HostManager(devices) as host:
        plan = host.add_network(model, SAMPLES_DIR / f"{model}.onnx", partition="balanced")
        check_plan(plan, devices, model, 4, "balanced", False)
        check_runs(host, model, model)
