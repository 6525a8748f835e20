"""A bundle loaded by the host: no partitioner and no onnx at load, devices matched by
requirement or remapped, the bundle's serving settings, every backend, and refusals in
one line with nothing loaded, every device's memory as it was and the file let go."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from runtime.bundle.reader import FORMAT_VERSION, MANIFEST, WEIGHTS, read_bundle
from runtime.bundle.writer import compile_bundle
from runtime.devices import DeviceConfig, parse_devices
from runtime.driver import open_bundle
from runtime.errors import BundleError, DeviceMemoryError, PrismError, ProvisionError
from runtime.host import HostManager
from runtime.inputs import input_specs, random_feeds
from tests.support.bundles import (
    assert_identical,
    case,
    cpus,
    feeds,
    file_is_open,
    graph,
    model_path,
    rewrite,
)
from tests.support.classifiers import zipmap_classifier

ROOT = Path(__file__).resolve().parents[2]

IMPORT_PROBE = """
import json, sys
import numpy, onnxruntime
before = set(sys.modules)
from runtime.devices import parse_devices
from runtime.host import HostManager
from runtime.inputs import input_specs, random_feeds
with HostManager(parse_devices("cpu:4")) as host:
    host.add_network("net", sys.argv[1])
    out = host.run("net", dict(numpy.load(sys.argv[2]))).result(timeout=60)
print(json.dumps({"new": sorted(set(sys.modules) - before), "outputs": sorted(out)}))
"""


def test_the_host_loads_a_bundle_without_partitioner_graph_or_onnx(tmp_path):
    """In a fresh interpreter the host loads and runs a bundle: none of what plans a
    model (the partitioner, the graph IR, sub-model extraction, the cost model) is
    imported, nor onnx, networkx or anything of the dashboards."""
    c = case("gpt2", 4, "balanced")
    np.savez(tmp_path / "feeds.npz", **feeds("gpt2")[0])
    done = subprocess.run([sys.executable, "-c", IMPORT_PROBE, str(c.path),
                           str(tmp_path / "feeds.npz")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True)
    report = json.loads(done.stdout)
    assert report["outputs"] == sorted(c.jit_outputs[0])
    new = set(report["new"])
    assert not {m.split(".")[0] for m in new} & {"onnx", "networkx", "textual", "streamlit",
                                                 "rich", "app", "ui_tui", "ui_web"}
    for heavy in ("runtime.graph", "runtime.partition.partitioner", "runtime.partition.build",
                  "runtime.partition.submodel", "runtime.partition.planning",
                  "runtime.provision.from_model", "runtime.cost",
                  "runtime.bundle.writer", "runtime.bundle.contents"):
        assert heavy not in new, heavy


def used(host: HostManager) -> dict[str, tuple[int, tuple[str, ...]]]:
    return {name: (d.used_bytes, d.keys) for name, d in host.devices.items()}


def test_devices_are_matched_by_requirement_and_remapped():
    c = case("gpt2", 3, "balanced")
    bundle_devices = [d["name"] for d in c.compiled.manifest["devices"]]
    host_devices = [DeviceConfig(name=f"dev{i}", backend="cpu") for i in range(3)]
    with HostManager(host_devices) as host:
        plan = host.add_network("auto", c.path)
        placed = [p.device for p in plan.partitions]
        assert set(placed) <= {"dev0", "dev1", "dev2"}
        assert len(set(placed)) == len(bundle_devices)
        assert [r["device"] for r in host.bundle("auto").schedule] == placed
        assert [d.name for d in plan.devices] == list(dict.fromkeys(placed))
        pinned = bundle_devices[0]
        plan = host.add_network("pinned", c.path, remap={pinned: "dev2"})
        on_pinned = {r["partition"] for r in c.compiled.manifest["schedule"]
                     if r["device"] == pinned}
        assert {p.device for p in plan.partitions if p.name in on_pinned} == {"dev2"}
        for name in ("auto", "pinned"):
            assert_identical(host.infer(name, feeds("gpt2")[1]), c.jit_outputs[1], name)
        assert host.bundle("auto").path == str(c.path)


def test_the_bundle_graph_and_origin_are_there_on_demand():
    c = case("branchy", 2, "balanced")
    with HostManager(cpus(2)) as host:
        host.add_network("aot", c.path)
        host.add_network("jit", model_path("branchy"))
        assert host.bundle("jit") is None
        g = host.graph("aot")  # loaded from the bundle's network.onnx
        assert [n.name for n in g.nodes] == [n.name for n in graph("branchy").nodes]
        assert [s.name for s in host.inputs("aot")] == [s.name for s in host.inputs("jit")]


def test_every_backend_and_modelled_time_load_from_a_bundle(tmp_path):
    """cpu, sim and reference partitions from one bundle answer as the just-in-time path
    does on the same devices."""
    devs = parse_devices("cpu:1,sim:1,reference:1")
    notes = {"ops": {"Relu": "reference", "MaxPool": "sim"}}
    path = tmp_path / "cnn.prism"
    compiled = compile_bundle(graph("cnn"), devs, path, annotations=notes)
    assert {r["backend"] for r in compiled.manifest["schedule"]} == {"cpu", "sim", "reference"}
    with HostManager(devs) as host:
        host.add_network("jit", model_path("cnn"), annotations=notes)
        host.add_network("aot", path)
        for f in feeds("cnn"):
            assert_identical(host.infer("aot", f), host.infer("jit", f), "cnn mixed")


def test_a_sequence_of_maps_passes_between_and_out_of_bundle_partitions(tmp_path):
    """A bundle keeps no types of the tensors between partitions, so its outputs were
    checked to be arrays: a classifier's ZipMap output failed every request ("returned
    a bad result ... is a list"). Split so the sequence also crosses out of a stage."""
    rng = np.random.default_rng()
    model = zipmap_classifier(rng)
    devs = parse_devices("cpu:2")
    path = tmp_path / "classifier.prism"
    compile_bundle(model, devs, path, annotations={"zipmap": "cpu1", "scaler": "cpu0",
                                                   "linear": "cpu0"})
    x = rng.standard_normal((3, 4)).astype(np.float32)
    label, maps = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with HostManager(devs) as host:
        host.add_network("aot", path)
        assert len(host.plan("aot").partitions) == 2
        for got in (host.infer("aot", {"x": x}), open_bundle(path).run({"x": x})):
            np.testing.assert_array_equal(got["label"], label)
            assert [list(m) for m in got["probabilities"]] == [list(m) for m in maps]
            np.testing.assert_allclose([list(m.values()) for m in got["probabilities"]],
                                       [list(m.values()) for m in maps], rtol=1e-6)


def test_replicas_and_batching_come_from_the_bundle(tmp_path):
    path = tmp_path / "mlp.prism"
    compile_bundle(graph("mlp"), cpus(4), path, replicas=2,
                   batching={"max_batch_size": 4, "max_queue_delay_ms": 20})
    rng = np.random.default_rng()
    requests = [random_feeds(input_specs(graph("mlp")), rng) for _ in range(16)]
    with open_bundle(path) as driver:
        wanted = [driver.run(f) for f in requests]
    with HostManager(cpus(4)) as host:
        events = host.bus.subscribe()
        host.add_network("m", path)
        assert host.replicas("m") == 2
        answers = [f.result(timeout=60) for f in [host.run("m", r) for r in requests]]
        sizes = [e["batch_size"] for e in events.drain() if e.kind == "request.started"]
        host.add_network("one", path, replicas=1)
        assert host.replicas("one") == 1
    assert max(sizes) > 1, sizes  # some requests went together
    for got, want in zip(answers, wanted, strict=True):  # batched: the same up to rounding
        assert set(got) == set(want)
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6)


def test_bundle_placement_cannot_be_changed_at_load():
    c = case("mlp", 2, "balanced")
    with HostManager(cpus(2)) as host:
        for kw, words in (({"partition": "memory"}, r"partitioned \(balanced\)"),
                          ({"annotations": {"ops": {"Relu": "cpu"}}}, "annotations"),
                          ({"bindings": {"batch": 4}}, "bindings")):
            with pytest.raises(PrismError, match=words) as err:
                host.add_network("m", c.path, **kw)
            assert "\n" not in str(err.value)
        with pytest.raises(PrismError, match="remap applies to bundles"):
            host.add_network("m", model_path("mlp"), remap={"cpu0": "cpu1"})
        host.add_network("m", c.path, partition="balanced")  # its own mode is fine
        assert host.networks() == ["m"]


def _memory_hog(c) -> tuple[list[DeviceConfig], str]:
    """Devices where the bundle fits once, with its last device sized to hold it once
    only: a second load fills every other device and then fails on that one."""
    need = {d["name"]: d["memory_bytes"] for d in c.compiled.manifest["devices"]}
    last = c.compiled.manifest["schedule"][-1]["device"]
    devs = [DeviceConfig(name=d.name, backend="cpu",
                         memory_bytes=need.get(d.name, 1 << 20) * (1 if d.name == last else 3))
            for d in cpus(len(need))]
    return devs, last


@pytest.mark.parametrize("fault", ["junk partition", "device full", "no such device",
                                   "too small"])
def test_a_failed_load_leaves_every_device_as_it_was(fault, tmp_path):
    """Partitions load in order; when a later one fails, every one loaded is unloaded:
    each device's bytes and keys are as before, the file is closed, and the network
    already there keeps serving."""
    c = case("gpt2", 4, "balanced")
    devs, last = _memory_hog(c)
    path = rewrite(c.path, tmp_path / "copy.prism", {})  # "first" holds c.path open
    if fault == "junk partition":  # it reads and writes what its row says: it only fails
        devs = cpus(4)               # to compile, once the partitions before it have loaded
        row = c.compiled.manifest["schedule"][-1]
        with read_bundle(c.path) as bundle:
            junk = onnx.load_from_string(bundle.member(row["model"]))
        junk.graph.node[0].op_type = "NoSuchOp"
        path = rewrite(c.path, tmp_path / "junk.prism", {row["model"]: junk.SerializeToString()})
    elif fault == "no such device":
        devs = [d for d in devs if d.name != last]
    elif fault == "too small":
        devs = [DeviceConfig(name=d.name, backend="cpu", memory_bytes=1000) for d in devs]
    expected = {"junk partition": (ProvisionError, c.compiled.manifest["schedule"][-1][
        "partition"]), "device full": (DeviceMemoryError, f"on {last}"),
        "no such device": (BundleError, "goes to another"), "too small": (BundleError, "needs")}
    error, words = expected[fault]
    with HostManager(devs) as host:
        if fault in ("junk partition", "device full"):
            host.add_network("first", c.path)
        before = used(host)
        with pytest.raises(error) as err:
            host.add_network("second", path)
        text = str(err.value)
        assert "\n" not in text and words in text, text
        assert used(host) == before
        assert host.networks() == (["first"] if "first" in str(before) else [])
        assert not file_is_open(path)
        if host.networks():
            assert_identical(host.infer("first", feeds("gpt2")[0]), c.jit_outputs[0], "first")


def test_damaged_foreign_and_newer_bundles_are_refused_in_one_line(tmp_path):
    c = case("mlp", 2, "balanced")
    manifest = c.compiled.manifest
    data = c.path.read_bytes()
    (tmp_path / "cut.prism").write_bytes(data[:len(data) // 2])
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0x5A
    (tmp_path / "flip.prism").write_bytes(flipped)
    newer = json.dumps({**manifest, "format_version": FORMAT_VERSION + 1}).encode()
    broken = json.dumps({**manifest, "schedule": [{"partition": "p0"}]}).encode()
    cases = {
        tmp_path / "cut.prism": "truncated",
        tmp_path / "flip.prism": "corrupted",
        rewrite(c.path, tmp_path / "newer.prism", {MANIFEST: newer}): "newer than this Prism",
        rewrite(c.path, tmp_path / "broken.prism", {MANIFEST: broken}): "malformed",
        rewrite(c.path, tmp_path / "noweights.prism", {WEIGHTS: None}): "no weights.bin",
        tmp_path / "missing.prism": "cannot open",
    }
    with HostManager(cpus(2)) as host:
        host.add_network("ok", c.path)
        before = used(host)
        for path, words in cases.items():
            with pytest.raises(BundleError) as err:
                host.add_network("bad", path)
            assert "\n" not in str(err.value) and words in str(err.value), (path, err.value)
            assert str(path.name) in str(err.value)
            assert used(host) == before and host.networks() == ["ok"]
            assert not file_is_open(path)


def test_removing_a_bundle_network_frees_its_devices_and_its_file():
    c = case("transformer", 3, "memory")
    with HostManager(list(c.compiled.plan.devices)) as host:
        before = used(host)
        host.add_network("t", c.path)
        assert file_is_open(c.path) and used(host) != before
        host.remove_network("t")
        assert used(host) == before
        assert not file_is_open(c.path)
