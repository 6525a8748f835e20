"""HostManager's public contract, as DESIGN.md writes it: the calls, the ways a model is
given, every field of a plan, the devices it is given (it owns and closes them) and their
stats."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json

import numpy as np
import onnx
import pytest

from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import ExecutionError, PrismError
from runtime.host import HostManager
from tests.support.fakes import FakeDevice, blocking
from tests.support.serving import MLP, TRANSFORMER, WAIT, Events, assert_same, expected, poll


def test_design_contract_verbatim():
    from runtime import DeviceConfig, HostManager  # exactly as DESIGN.md writes it

    rng = np.random.default_rng()
    devices = [DeviceConfig(name=f"cpu{i}", backend="cpu", memory_bytes=512 << 20)
               for i in range(4)]
    with HostManager(devices) as host:
        host.add_network("bert", str(TRANSFORMER), partition="balanced")
        plan = host.plan("bert")
        ids = rng.standard_normal((2, 16, 64)).astype(np.float32)
        future = host.run("bert", {"tokens": ids})
        assert isinstance(future, cf.Future)
        outputs = future.result(timeout=WAIT)
        assert_same(outputs, expected(TRANSFORMER, {"tokens": ids}))
        assert len(plan.partitions) > 1
        host.remove_network("bert")
        assert host.networks() == []


@pytest.mark.parametrize("source", ["path", "str", "proto", "bytes"])
def test_add_by_path_and_by_model_proto(source):
    model = {"path": TRANSFORMER, "str": str(TRANSFORMER), "proto": onnx.load(TRANSFORMER),
             "bytes": TRANSFORMER.read_bytes()}[source]
    devices = [DeviceConfig(name=f"cpu{i}", backend="cpu", memory_bytes=512 << 20)
               for i in range(4)]
    rng = np.random.default_rng()
    with HostManager(devices) as host:
        plan = host.add_network("bert", model, partition="balanced", annotations=None,
                                fallback=None, replicas=1, batching=None)
        assert plan is host.plan("bert")
        for _ in range(3):
            feeds = {"tokens": rng.standard_normal((2, 16, 64)).astype(np.float32)}
            assert_same(host.run("bert", feeds).result(timeout=WAIT),
                        expected(TRANSFORMER, feeds))
        assert_same(host.infer("bert", feeds), expected(TRANSFORMER, feeds))


def test_plan_fields():
    devices = [DeviceConfig(name=f"cpu{i}", backend="cpu", memory_bytes=512 << 20)
               for i in range(4)]
    for d in devices:
        for field in ("name", "backend", "memory_bytes", "threads", "peak_flops",
                      "mem_bandwidth", "link_bandwidth", "supported_ops"):
            assert hasattr(d, field), field
    with HostManager(devices) as host:
        plan = host.add_network("bert", TRANSFORMER, partition="balanced")
        graph = host.graph("bert")
        assert len(plan.partitions) == 4
        names = [n for p in plan.partitions for n in p.nodes]
        assert sorted(names) == sorted(graph.by_name) and len(set(names)) == len(names)
        produced = set(graph.inputs) | set(graph.initializers)
        for p in plan.partitions:  # topological order: inputs come from earlier partitions
            assert isinstance(p.name, str) and p.device in host.devices
            assert p.backend == "cpu"
            assert set(p.inputs) <= produced | set(graph.initializers), p.name
            produced |= set(p.outputs)
            assert p.weight_bytes >= 0 and p.activation_bytes > 0 and p.est_seconds > 0
        assert set(graph.outputs) <= produced
        assert plan.transfers
        for t in plan.transfers:
            assert {t.src, t.dst} <= set(host.devices) and t.src != t.dst
            assert isinstance(t.tensor, str) and t.bytes > 0 and t.est_seconds > 0
        assert plan.bottleneck_seconds > 0
        assert plan.bottleneck_seconds >= max(p.est_seconds for p in plan.partitions)
        d = json.loads(json.dumps(plan.to_dict()))
        assert [p["name"] for p in d["partitions"]] == [p.name for p in plan.partitions]
        for p in d["partitions"]:
            for field in ("name", "nodes", "device", "backend", "inputs", "outputs",
                          "weight_bytes", "activation_bytes", "est_seconds"):
                assert field in p, field
        for t in d["transfers"]:
            for field in ("tensor", "src", "dst", "bytes", "est_seconds"):
                assert field in t, field
        assert d["bottleneck_seconds"] == plan.bottleneck_seconds
        dot = plan.to_dot()
        assert dot.startswith("digraph") and dot.rstrip().endswith("}")
        assert dot.count("subgraph") == len(plan.partitions)


def test_dataclass_fields_are_named_as_designed():
    from runtime.partition import Partition, Transfer

    assert {"name", "nodes", "device", "backend", "inputs", "outputs", "weight_bytes",
            "activation_bytes", "est_seconds"} <= {f.name for f in dataclasses.fields(Partition)}
    assert {"tensor", "src", "dst", "bytes", "est_seconds"} <= {
        f.name for f in dataclasses.fields(Transfer)}


# -- devices the host is given ---------------------------------------------------------------


def test_devices_dict_and_stats():
    with HostManager(parse_devices("cpu:2,sim:2")) as host:
        assert set(host.devices) == {"cpu0", "cpu1", "sim0", "sim1"}
        plan = host.add_network("m", MLP, partition="balanced")
        used = {p.device: 0 for p in plan.partitions}
        for p in plan.partitions:
            used[p.device] += p.weight_bytes + p.activation_bytes
        for name, m in host.devices.items():
            s = m.stats()
            assert s.used_bytes == used.get(name, 0) == m.used_bytes
            assert s.total_bytes == m.config.memory_bytes
        host.run("m", {"x": np.ones((2, 256), np.float32)}).result(timeout=WAIT)
        assert sum(m.stats().runs for m in host.devices.values()) == len(plan.partitions)


def test_host_takes_device_instances_attaches_its_bus_and_closes_them():
    devices = [FakeDevice(config) for config in parse_devices("cpu:2")]
    host = HostManager(devices)
    with host:
        assert list(host.devices.values()) == devices
        assert all(d.bus is host.bus for d in devices)
        events = Events(host, kinds=("partition.run.finished", "device.memory"))
        plan = host.add_network("m", MLP, partition="balanced")
        feeds = {"x": np.random.default_rng().standard_normal((2, 256)).astype(np.float32)}
        assert_same(host.run("m", feeds).result(timeout=WAIT), expected(MLP, feeds))
        assert poll(lambda: len(events.of("partition.run.finished")) == len(plan.partitions))
        assert {e["device"] for e in events.of("device.memory")} == {
            p.device for p in plan.partitions}
    with pytest.raises(ExecutionError, match="closed"):
        blocking(devices[0], "anything", feeds)
    with pytest.raises(PrismError, match="cpu0"):
        HostManager([*parse_devices("cpu:1"), *parse_devices("cpu:1")])
