"""`ray` devices: each one a Ray actor process. One local Ray cluster (2 CPUs) serves the
whole session; hosts that are not killed into are shared by module.

Answers equal plain onnxruntime over two ray devices and over ray + cpu + sim; an actor
killed under load fails (or, with replicas, retries) exactly the runs in flight on it and
is replaced; a removed network leaves nothing in the actors; weights held beside a model
reach the actors, a bundle compiled for ray devices among them; ray loads only when a ray
device opens.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import DeviceLostError, DeviceSpecError, QueueFullError
from runtime.host import HostManager
from runtime.inputs import input_specs, random_feeds
from tests.support.dags import SAMPLE_NAMES, SAMPLES_DIR, outer_pairs
from tests.support.hosts import resident_bytes

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "real_models"
REAL_NAMES = ["bert", "gpt2", "resnet", "gru_loop"]  # as tests/real_models/test_real_models.py
MODELS = [*(("sample", n) for n in SAMPLE_NAMES), *(("real", n) for n in REAL_NAMES)]
WAIT = 60.0  # bound on any one answer


def model_path(kind: str, name: str) -> Path:
    return (SAMPLES_DIR if kind == "sample" else REAL) / f"{name}.onnx"


@pytest.fixture(scope="session")
def cluster():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR,
             log_to_driver=False)
    yield ray
    ray.shutdown()


def split_map(graph, devices: list[str]) -> dict:
    """A user map cutting the model order into one run of nodes per device, at cuts
    whose crossing tensors have types, so every device gets work."""
    nodes = [n.name for n in graph.nodes]
    index = {n: i for i, n in enumerate(nodes)}

    def typed(cut: int) -> bool:
        return all(t in graph.types for n in graph.nodes[cut:] for t in n.reads
                   if (p := graph.producer.get(t)) is not None and index[p] < cut)

    cuts, start = [], 0
    for k in range(1, len(devices)):
        want = len(nodes) * k // len(devices)
        cut = min((c for c in range(start + 1, len(nodes)) if typed(c)),
                  key=lambda c: abs(c - want), default=None)
        if cut is not None:
            cuts.append(cut)
            start = cut
    bounds = [0, *cuts, len(nodes)]
    parts = {f"p{i}": devices[i] for i in range(len(bounds) - 1)}
    return {"partitions": parts, "nodes": {n: f"p{i}" for i in range(len(bounds) - 1)
                                           for n in nodes[bounds[i]:bounds[i + 1]]}}


def fresh_feeds(host: HostManager, network: str, kind: str, name: str) -> dict:
    if kind == "real":  # token ids must stay inside the vocabulary: the saved set, shuffled
        with np.load(REAL / f"{name}.inputs.npz") as npz:
            feeds = {k: npz[k] for k in npz.files}
        rng = np.random.default_rng()
        return {k: rng.permutation(v.ravel()).reshape(v.shape) if v.ndim else v
                for k, v in feeds.items()}
    return random_feeds(input_specs(host.graph(network)), np.random.default_rng(),
                        {"batch": 2})


def check_against_onnxruntime(host: HostManager, devices: list[str], kind: str, name: str
                              ) -> None:
    path = model_path(kind, name)
    from runtime.graph import load_graph

    plan = host.add_network(name, str(path), partition=split_map(load_graph(str(path)),
                                                                  devices))
    try:
        assert {p.device for p in plan.partitions} == set(devices)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        feeds = [fresh_feeds(host, name, kind, name) for _ in range(3)]
        futures = [host.run(name, f) for f in feeds]
        for f, future in zip(feeds, futures, strict=True):
            got = future.result(WAIT)
            for out, want in zip(names, session.run(names, f), strict=True):
                assert isinstance(got[out], np.ndarray), out
                np.testing.assert_allclose(got[out], want, rtol=1e-4, atol=1e-5,
                                           err_msg=f"{name}/{out}")
    finally:
        host.remove_network(name)


@pytest.fixture(scope="module")
def two_ray(cluster):
    with HostManager(parse_devices("ray:2")) as host:
        yield host


@pytest.fixture(scope="module")
def mixed(cluster):
    with HostManager(parse_devices("ray:1,cpu:1,sim:1")) as host:
        yield host


@pytest.mark.parametrize("kind,name", MODELS)
def test_two_ray_devices_answer_as_onnxruntime(two_ray, kind, name):
    check_against_onnxruntime(two_ray, ["ray0", "ray1"], kind, name)


@pytest.mark.parametrize("kind,name", MODELS)
def test_ray_cpu_and_sim_together_answer_as_onnxruntime(mixed, kind, name):
    check_against_onnxruntime(mixed, ["ray0", "cpu0", "sim0"], kind, name)


def test_a_bundle_compiled_for_ray_devices_loads_on_them(two_ray, tmp_path):
    """Before: `prism compile --devices ray:2` stopped with `internal error: KeyError:
    'ray'`. The bundle's weights reach the actors as a held file (weights.bin)."""
    from runtime.bundle.writer import compile_bundle
    from runtime.graph import load_graph

    path = model_path("sample", "cnn")
    split = split_map(load_graph(str(path)), ["ray0", "ray1"])
    bundle = tmp_path / "cnn.prism"
    compile_bundle(str(path), parse_devices("ray:2"), bundle, partition=split, costs="model")
    plan = two_ray.add_network("cnn-bundle", str(bundle))
    try:
        assert {p.device for p in plan.partitions} == {"ray0", "ray1"}
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = fresh_feeds(two_ray, "cnn-bundle", "sample", "cnn")
        got = two_ray.run("cnn-bundle", feeds).result(WAIT)
        for name, want in zip([o.name for o in session.get_outputs()],
                              session.run(None, feeds), strict=True):
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5)
    finally:
        two_ray.remove_network("cnn-bundle")


def test_removing_a_network_frees_its_actors(two_ray):
    two_ray.add_network("mlp", str(SAMPLES_DIR / "mlp.onnx"),
                        partition=split_map(two_ray_graph("mlp"), ["ray0", "ray1"]))
    devices = [two_ray.devices[n] for n in ("ray0", "ray1")]
    assert all(d.held() and d.used_bytes > 0 for d in devices)
    two_ray.remove_network("mlp")
    assert [d.held() for d in devices] == [[], []]
    assert [d.used_bytes for d in devices] == [0, 0]
    assert all(d.stats().node for d in devices)  # where each actor runs


def test_an_outsized_request_gives_back_what_its_actor_took(two_ray):
    """The pairs (576 MB), made and read on ray0: its arena gives back what it grew by.
    (A tensor that large crossing to another actor goes through Ray's object store, whose
    shared pages count in both actors' resident memory while it holds it.)"""
    rng = np.random.default_rng()
    two_ray.add_network("outer", outer_pairs(),
                        annotations={n: "ray0" for n in ("column", "pairs", "sum")})
    try:
        def ask(n: int) -> None:
            x = rng.standard_normal((1, n)).astype(np.float32)
            y = two_ray.run("outer", {"x": x}).result(timeout=WAIT)["y"]
            np.testing.assert_allclose(y, (x.T @ x).sum(0), rtol=1e-3, atol=1e-2)

        for n in rng.integers(2, 300, 4):  # usual requests, and the arena they keep
            ask(int(n))
        pid = two_ray.devices["ray0"].info["pid"]
        before = resident_bytes(pid)
        ask(12_000 + int(rng.integers(100)))
        grown = resident_bytes(pid) - before
        assert grown < 128 << 20, grown
    finally:
        two_ray.remove_network("outer")


def two_ray_graph(name: str):
    from runtime.graph import load_graph

    return load_graph(str(SAMPLES_DIR / f"{name}.onnx"))


def serve_through_a_kill(host: HostManager, victim: str, requests: int = 240):
    """Send `requests` steadily from two threads; kill `victim`'s actor process a third of
    the way in. Returns the futures with their send times, the kill time, the events."""
    sub = host.bus.subscribe(maxlen=200_000)
    feeds = random_feeds(input_specs(host.graph("mlp")), np.random.default_rng(), {"batch": 2})
    sent: list[tuple[float, object]] = []
    lock = threading.Lock()
    killed: list[float] = []
    answered: dict[object, float] = {}  # future -> when it ended

    def client(count: int) -> None:
        for i in range(count):
            try:
                future = host.run("mlp", feeds, inline=False)
            except QueueFullError:  # refused, not accepted: the queue is bounded
                time.sleep(0.05)
                continue
            future.add_done_callback(lambda f: answered.setdefault(f, time.monotonic()))
            with lock:
                sent.append((time.monotonic(), future))
                if len(sent) == requests // 3 and not killed:
                    killed.append(time.monotonic())
                    os.kill(host.devices[victim].info["pid"], signal.SIGKILL)
            time.sleep(0.004 if i % 8 else 0.02)

    threads = [threading.Thread(target=client, args=(requests // 2,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    for _, future in sent:
        with contextlib.suppress(DeviceLostError):
            future.result(WAIT)
    first_ok = min(answered[f] for t, f in sent if t > killed[0] and f.exception(0) is None)
    print(f"kill -> first success of a request sent after it: {first_ok - killed[0]:.2f} s")
    return sent, killed[0], sub.drain(), feeds


def ended_once(events, accepted: int) -> Counter:
    ends = Counter(e.fields["request"] for e in events
                   if e.kind in ("request.finished", "request.failed"))
    assert len(ends) == accepted and set(ends.values()) == {1}
    return ends


def test_a_killed_actor_fails_its_runs_in_flight_and_is_replaced(cluster):
    with HostManager(parse_devices("ray:2")) as host:
        host.add_network("mlp", str(SAMPLES_DIR / "mlp.onnx"),
                         partition=split_map(two_ray_graph("mlp"), ["ray0", "ray1"]))
        sent, _, events, feeds = serve_through_a_kill(host, "ray1")
        failed = [f.exception(0) for _, f in sent if f.exception(0) is not None]
        assert all(isinstance(e, DeviceLostError) for e in failed), failed
        for error in failed:  # named: the device and the partition
            assert error.device == "ray1" and error.partition == "p1"
            assert "ray1" in str(error) and "mlp/p1" in str(error)
        ended_once(events, len(sent))
        kinds = [e.kind for e in events]
        assert "device.lost" in kinds and "device.restored" in kinds
        lost = next(e for e in events if e.kind == "device.lost")
        assert lost.fields["device"] == "ray1" and lost.fields["in_flight"] == len(failed)
        # serving resumed: everything sent after the replacement was up succeeded, and so
        # does a request now, on the new actor
        restored = next(e for e in events if e.kind == "device.restored")
        late = [f for t, f in sent if t > restored.ts]
        assert all(f.exception(0) is None for f in late)
        assert host.devices["ray1"].stats().health == "ok"
        assert host.infer("mlp", feeds)
        print(f"replacement took {restored.fields['seconds']:.2f} s; "
              f"{len(failed)} of {len(sent)} failed")


def test_a_replaced_actor_loads_the_weights_read_not_a_file_written_since(cluster, tmp_path):
    """Weights read from a model's external data file reach an actor as views of the file;
    the device keeps its own copy to load a replacement actor with, so a file written
    after the load changes nothing."""
    import onnx

    path = tmp_path / "mlp.onnx"
    onnx.save(onnx.load(str(SAMPLES_DIR / "mlp.onnx")), str(path), save_as_external_data=True,
              location="mlp.data", size_threshold=0)
    with HostManager(parse_devices("ray:2")) as host:
        host.add_network("mlp", str(path),
                         partition=split_map(two_ray_graph("mlp"), ["ray0", "ray1"]))
        feeds = random_feeds(input_specs(host.graph("mlp")), np.random.default_rng(),
                             {"batch": 2})
        want = host.infer("mlp", feeds)
        data = tmp_path / "mlp.data"
        read = data.stat().st_mtime_ns
        data.write_bytes(bytes(data.stat().st_size))
        os.utime(data, ns=(read + 10**9, read + 10**9))
        sub = host.bus.subscribe()
        os.kill(host.devices["ray1"].info["pid"], signal.SIGKILL)
        deadline, seen = time.monotonic() + WAIT, []
        while time.monotonic() < deadline and "device.restored" not in seen:
            with contextlib.suppress(DeviceLostError):
                host.infer("mlp", feeds)  # a run finds the actor gone
            seen += [e.kind for e in sub.drain()]
            time.sleep(0.1)
        assert "device.restored" in seen
        for name, value in want.items():
            np.testing.assert_array_equal(host.infer("mlp", feeds)[name], value)


def test_with_replicas_a_lost_run_retries_once_elsewhere(cluster):
    with HostManager(parse_devices("ray:2")) as host:
        host.add_network("mlp", str(SAMPLES_DIR / "mlp.onnx"), replicas=2)
        assert host.replicas("mlp") == 2
        victim = host.plan("mlp").partitions[0].device
        sent, _, events, _ = serve_through_a_kill(host, victim)
        assert all(f.exception(0) is None for _, f in sent)  # every one answered
        ended_once(events, len(sent))
        retried = [e.fields["request"] for e in events if e.kind == "request.retried"]
        assert len(retried) == len(set(retried))  # once each
        assert not [e for e in events if e.kind == "request.failed"]
        lost = next(e for e in events if e.kind == "device.lost")
        assert lost.fields["in_flight"] == len(retried)


def test_ray_specs():
    devices = parse_devices("ray:2:threads=1:mem=2GB,cpu:1")
    assert [(d.name, d.backend, d.memory_bytes, d.threads) for d in devices[:2]] == [
        ("ray0", "ray", 2_000_000_000, 1), ("ray1", "ray", 2_000_000_000, 1)]
    sim_like = parse_devices("ray:4:timing=sim")
    assert len(sim_like) == 4
    assert sim_like[0].peak_flops == DeviceConfig("s", backend="sim").peak_flops


def test_ray_toml(tmp_path):
    path = tmp_path / "devices.toml"
    path.write_text('[a]\nbackend = "ray"\nnode = "10.0.0.5"\nmemory = "1GB"\n'
                    '[a.resources]\nfast = 0.5\nCPU = 1\n[b]\nbackend = "cpu"\n')
    a, b = parse_devices(path)
    assert (a.backend, a.node, dict(a.resources)) == ("ray", "10.0.0.5",
                                                      {"CPU": 1.0, "fast": 0.5})
    assert b.backend == "cpu" and b.resources == ()
    assert DeviceConfig(**{**a.to_dict(), "name": "c"}).resources == a.resources


@pytest.mark.parametrize("spec,words", [
    ("cpu:1:timing=sim", "for ray devices"),
    ("ray:1:timing=gpu", "timing must be one of"),
])
def test_bad_ray_specs_are_one_line(spec, words):
    with pytest.raises(DeviceSpecError, match=words) as info:
        parse_devices(spec)
    assert "\n" not in str(info.value)


PROBE = """
import json, sys
import numpy as np
from runtime.devices import parse_devices
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.inputs import input_specs, random_feeds
from runtime.partition import partition
graph = load_graph(sys.argv[1])
plan = partition(graph, parse_devices("ray:2,cpu:1"), "balanced")
with HostManager(parse_devices("cpu:2")) as host:
    host.add_network("m", graph)
    host.infer("m", random_feeds(input_specs(graph), np.random.default_rng()))
print(json.dumps({"ray": sorted(m for m in sys.modules if m.split(".")[0] == "ray")}))
"""


def test_ray_loads_only_when_a_ray_device_opens():
    """Planning for ray devices and serving on others never imports ray."""
    done = subprocess.run([sys.executable, "-c", PROBE, str(SAMPLES_DIR / "mlp.onnx")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout) == {"ray": []}


def test_dashboards_show_ray_devices_with_their_node(cluster):
    """The view model's rows for a live runtime on ray devices carry the node; both
    dashboards show it."""
    from app.dashboard import DashboardModel
    from app.live import LiveRuntime
    from ui_tui.widgets.devices import device_lines
    from ui_web.frames import devices_frame

    # cpu0 too small for the model: the plan needs ray0, so its actor runs
    live = LiveRuntime(devices="ray:1,cpu:1:mem=64KB", start_load=False, seed=2)
    try:
        rows = {r.name: r for r in DashboardModel(live).poll().devices}
        node = live.host.devices["ray0"].info["node"]
        assert (rows["ray0"].node, rows["ray0"].where, rows["ray0"].health) == (
            node, f"ray @ {node}", "ok")
        assert rows["cpu0"].where == "cpu"
        assert f"ray @ {node}" in device_lines(tuple(rows.values()), 80).plain
        frame = devices_frame(tuple(rows.values()))
        assert list(frame["where"]) == [rows[n].where for n in frame["device"]]
    finally:
        live.close()


def test_a_second_network_plans_into_the_free_memory_of_ray_devices(cluster):
    """Two ray devices; the first network fills most of ray0. The second is planned into
    what is free, loads (planned against whole devices it was refused: "needs X on ray0,
    Y free"), names the actors that hold each partition, and answers as onnxruntime."""
    from tests.provision.test_free_memory import answers, need, planned_where_loaded

    memory = max(need("bert"), need("gpt2")) + need("gpt2") // 10
    devices = [DeviceConfig(name=f"ray{i}", backend="ray", memory_bytes=memory)
               for i in range(2)]
    with HostManager(devices) as host:
        host.add_network("bert", str(REAL / "bert.onnx"), devices=["ray0"])
        free = {d.name: d.free_bytes for d in host.devices.values()}
        events = host.bus.subscribe(kinds=("partition.planned", "provision.loaded"))
        plan = host.add_network("gpt2", str(REAL / "gpt2.onnx"))
        planned_where_loaded(events.drain(), "gpt2")
        assert host.plan("gpt2") == plan
        for p in plan.partitions:
            assert f"gpt2/{p.name}" in host.devices[p.device].held()  # asked of the actor
        for device, used in plan.device_memory().items():
            assert used <= free[device]
        answers(host, "gpt2")
        answers(host, "bert")


def test_ray_devices_charge_their_measured_hop(cluster, monkeypatch, tmp_path):
    """Measured costs on ray devices: their dispatch (a Ray call) is timed on the host's
    own actors, and every partition's stage pays it; the plan says it was measured."""
    from runtime.provision.hops import device_hops

    monkeypatch.setenv("PRISM_COSTS", "measured")
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    with HostManager(parse_devices("ray:2")) as host:
        hops = device_hops(host.devices)
        assert hops["ray"] > 0
        assert device_hops(host.devices)["ray"] == hops["ray"]  # once per device pair
        plan = host.add_network("mlp", str(SAMPLES_DIR / "mlp.onnx"))
        assert plan.costs == "measured"
        assert all(p.transfer_in_seconds >= hops["ray"] for p in plan.partitions)
        x = {"x": np.random.default_rng().standard_normal((1, 256)).astype(np.float32)}
        want = ort.InferenceSession(str(SAMPLES_DIR / "mlp.onnx")).run(None, x)[0]
        np.testing.assert_allclose(host.infer("mlp", x)["logits"], want, rtol=1e-4, atol=1e-5)
