"""The standalone driver: its imports, its policies under concurrency, and how it
refuses bad feeds, failing partitions, closed drivers and bundles it cannot run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from runtime.bundle.writer import compile_bundle
from runtime.devices import parse_devices
from runtime.driver import POLICIES, open_bundle
from runtime.errors import BundleError, ExecutionError, InvalidInputError, RequestTimeoutError
from runtime.host import HostManager
from tests.support.bundles import VOCAB, assert_identical, case, cpus, feeds, graph
from tests.support.hosts import cpu_burnt_after

ROOT = Path(__file__).resolve().parents[2]

IMPORT_PROBE = """
import json, sys
import numpy, onnxruntime
before = set(sys.modules)
from runtime.driver import open_bundle
with open_bundle(sys.argv[1], sys.argv[2]) as driver:
    feeds = dict(numpy.load(sys.argv[3]))
    out = driver.run(feeds)
print(json.dumps({"new": sorted(set(sys.modules) - before), "outputs": sorted(out)}))
"""


@pytest.mark.parametrize("policy", POLICIES)
def test_driver_imports_only_numpy_onnxruntime_and_the_reader(policy, tmp_path):
    """A fresh interpreter opens and runs a bundle; beyond numpy and onnxruntime it
    loads only the standard library and the driver's own few modules."""
    c = case("gpt2", 4, "balanced")
    np.savez(tmp_path / "feeds.npz", **feeds("gpt2")[0])
    done = subprocess.run([sys.executable, "-c", IMPORT_PROBE, str(c.path), policy,
                           str(tmp_path / "feeds.npz")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True)
    report = json.loads(done.stdout)
    assert report["outputs"] == sorted(c.jit_outputs[0])
    ours = {m for m in report["new"] if m.split(".")[0] == "runtime"}
    assert ours == {"runtime", "runtime.lazy", "runtime.driver", "runtime.bundle.driver",
                    "runtime.errors", "runtime.units", "runtime.inputs", "runtime.free_dims",
                    "runtime.bundle", "runtime.bundle.reader", "runtime.bundle.proto",
                    "runtime.devices", "runtime.devices.ort", "runtime.devices.ort.options",
                    "runtime.types", "runtime.request_memory", "runtime.machine"}
    others = {m.split(".")[0] for m in report["new"]} - {"runtime", "numpy", "onnxruntime"}
    assert others <= set(sys.stdlib_module_names) | {"_distutils_hack"}, others
    for heavy in ("onnx", "networkx", "textual", "streamlit", "rich", "app"):
        assert heavy not in report["new"]


@pytest.mark.parametrize("policy", ["parallel", "pipelined"])
def test_many_threads_at_once(policy):
    """8 threads x 6 requests each, all answered right: pipelined keeps many in flight,
    parallel takes them one at a time."""
    c = case("transformer", 4, "balanced")
    rng = np.random.default_rng()
    base = feeds("transformer")[0]
    requests = [{k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in base.items()}
                for _ in range(48)]
    with open_bundle(c.path, "serial") as serial:
        want = [serial.run(f) for f in requests]
    with open_bundle(c.path, policy) as driver, ThreadPoolExecutor(8) as pool:
        got = list(pool.map(driver.run, requests))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_identical(g, w, f"request {i}")


@pytest.mark.parametrize("policy", POLICIES)
def test_a_failing_partition_is_named_and_the_driver_serves_on(policy):
    c = case("gpt2", 4, "balanced")
    good = feeds("gpt2")[0]
    bad = {**good, "input_ids": np.full_like(good["input_ids"], VOCAB + 5)}  # past the table
    with open_bundle(c.path, policy) as driver:
        with pytest.raises(ExecutionError) as err:
            driver.run(bad)
        first = c.compiled.manifest["schedule"][0]
        assert (err.value.partition, err.value.device) == (first["partition"], first["device"])
        assert f"gpt2/{first['partition']} on {first['device']}" in str(err.value)
        assert "\n" not in str(err.value)
        assert_identical(driver.run(good), c.jit_outputs[0], "after a failure")


@pytest.mark.parametrize("policy", POLICIES)
def test_bad_feeds_are_refused_in_one_line(policy):
    c = case("gpt2", 2, "balanced")
    good = feeds("gpt2")[0]
    cases = {
        "missing": ({k: v for k, v in good.items() if k != "attention_mask"}, "missing"),
        "extra": ({**good, "nope": good["input_ids"]}, "no input 'nope'"),
        "dtype": ({**good, "input_ids": good["input_ids"].astype(np.int32)}, "expected int64"),
        "rank": ({**good, "input_ids": good["input_ids"][0]}, "input 'input_ids'"),
        "type": ([good], "must be a dict"),
    }
    with open_bundle(c.path, policy) as driver:
        for label, (bad, words) in cases.items():
            with pytest.raises(InvalidInputError) as err:
                driver.run(bad)
            assert words in str(err.value) and "\n" not in str(err.value), label


def test_a_request_past_its_timeout_ends_and_the_next_runs():
    c = case("resnet", 4, "balanced")
    big = {"pixels": np.random.default_rng().standard_normal((16, 3, 64, 64), np.float32)}
    with open_bundle(c.path, "pipelined") as driver:
        with pytest.raises(RequestTimeoutError):
            driver.run(big, timeout=0)
        assert_identical(driver.run(feeds("resnet")[0]), c.jit_outputs[0], "after a timeout")


def test_close_ends_every_request_and_refuses_more():
    c = case("transformer", 3, "balanced")
    driver = open_bundle(c.path, "pipelined")
    outcomes: list[str] = []
    lock = threading.Lock()

    def client() -> None:
        for _ in range(50):
            try:
                driver.run(feeds("transformer")[0], timeout=30)
                what = "answered"
            except BundleError:
                what = "closed"
            with lock:
                outcomes.append(what)

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    driver.close()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert len(outcomes) == 200  # every request ended, one way or the other
    assert not any(w.thread.is_alive() for w in driver._workers.values())
    with pytest.raises(BundleError, match="closed"):
        driver.run(feeds("transformer")[0])
    driver.close()  # twice is fine


def _open_files(path: Path) -> int:
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path.resolve()))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_a_partition_it_cannot_run_leaves_nothing_open(tmp_path):
    """A reference device's partition needs onnx's evaluator: the driver refuses the
    bundle in one line after loading the cpu partition before it, and nothing stays open."""
    path = tmp_path / "mixed.prism"
    devices = [*cpus(1), *parse_devices("reference:1")]
    names = [n.name for n in graph("mlp").nodes]
    mapping = {"partitions": {"p0": "cpu0", "p1": "reference0"},
               "nodes": {n: ("p0" if i < len(names) // 2 else "p1") for i, n in enumerate(names)}}
    compiled = compile_bundle(graph("mlp"), devices, path, partition=mapping)
    assert [r["backend"] for r in compiled.manifest["schedule"]] == ["cpu", "reference"]
    with pytest.raises(BundleError, match="reference") as err:
        open_bundle(path)
    assert "partition p1" in str(err.value) and "\n" not in str(err.value)
    assert _open_files(path) == 0


def test_constant_and_given_back_outputs_are_no_ones_to_change(tmp_path):
    """An output that is an initializer comes back on every request, from the host and
    from the driver, read-only: one caller cannot change what the next one gets. An
    output that is a graph input comes back a copy, as onnxruntime gives it."""
    rng = np.random.default_rng()
    w = rng.standard_normal((2, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "const",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, tmp_path / "const.onnx")
    bundle = compile_bundle(tmp_path / "const.onnx", parse_devices("cpu:1"),
                            tmp_path / "const.prism")
    feeds = {"x": rng.standard_normal((4, 3)).astype(np.float32)}
    with HostManager(parse_devices("cpu:1")) as host, open_bundle(bundle.path) as driver:
        host.add_network("model", tmp_path / "const.onnx")
        host.add_network("bundle", bundle.path)
        runs = [driver.run, *(lambda f, n=n: host.run(n, f).result(timeout=60)
                               for n in ("model", "bundle"))]
        for run in runs:
            first = run(feeds)
            with pytest.raises(ValueError, match="read-only"):
                first["w"][0, 0] = 7.0
            np.testing.assert_array_equal(run(feeds)["w"], w)
            given = feeds["x"].copy()
            first["x"][:] = 0.0
            np.testing.assert_array_equal(feeds["x"], given)


def test_a_bundle_of_devices_that_do_not_spin_runs_so(tmp_path):
    """`spin=0` is kept in the schedule: the driver's sessions sleep between runs too."""
    rng = np.random.default_rng()
    w = rng.standard_normal((256, 256)).astype(np.float32)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 256])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(body, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, tmp_path / "matmul.onnx")
    x = {"x": rng.standard_normal((256, 256)).astype(np.float32)}
    burnt = {}
    for spin in (True, False):
        bundle = compile_bundle(tmp_path / "matmul.onnx",
                                parse_devices(f"cpu:1:threads=2:spin={int(spin)}"),
                                tmp_path / f"spin{int(spin)}.prism")
        assert [row["spin"] for row in bundle.manifest["schedule"]] == [spin]
        with open_bundle(bundle.path, policy="serial") as driver:
            np.testing.assert_allclose(driver.run(x)["y"], x["x"] @ w, rtol=1e-4,
                                       atol=1e-3)
            burnt[spin] = cpu_burnt_after(lambda driver=driver: driver.run(x))
    assert burnt[False] < burnt[True] / 4, burnt
