"""Errors: nodes that fit nowhere, too few devices, bad modes, bad device specs and files."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from app.cli import main
from runtime import HostManager
from runtime.devices import DeviceConfig, parse_devices, parse_size
from runtime.errors import DeviceSpecError, PartitionError, PrismError
from runtime.graph import Graph, load_graph
from runtime.partition import partition
from runtime.units import human_bytes
from tests.support.dags import (
    SAMPLES_DIR,
    Reference,
    biggest_node,
    pixel_attention,
    sample_graph,
)

NEEDS = re.compile(r"node (\S+) needs ([0-9.]+) MB; the largest device has ([0-9.]+) MB")


def big_weight_graph(width: int = 1000) -> Graph:
    """x [1, width] -> Relu -> MatMul with a width x width weight (4 MB at 1000) -> Relu."""
    w = numpy_helper.from_array(np.zeros((width, width), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"], name="pre"),
         helper.make_node("MatMul", ["a", "W"], ["b"], name="big/matmul"),
         helper.make_node("Relu", ["b"], ["y"], name="post")], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return load_graph(model)


# ------------------------------------------------------------------------------------
# Nodes that fit nowhere
# ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["memory", "balanced"])
def test_node_whose_weights_exceed_every_device(mode):
    graph = big_weight_graph()
    devices = [DeviceConfig(name="small", memory_bytes=1_000_000),
               DeviceConfig(name="larger", backend="sim", memory_bytes=2_000_000)]
    with pytest.raises(PartitionError) as info:
        partition(graph, devices, mode)
    message = str(info.value)
    match = NEEDS.fullmatch(message)
    assert match, message
    need = Reference(graph).memory(["big/matmul"])
    assert need == 4_000_000 + 2 * 4_000  # the weight, its input and its output
    assert match.groups() == ("big/matmul", f"{need / 1e6:.1f}", "2.0")


def test_a_node_too_large_at_the_sizes_it_was_costed_at_names_them(capsys, tmp_path):
    """Attention over every pixel needs its scores' bytes, (h * w)^2 floats: the refusal
    names the sizes the inputs were costed at, bound or made up, since other sizes change
    what a node needs."""
    side = int(np.random.default_rng().integers(160, 225))
    graph = load_graph(pixel_attention(), bindings={"h": side, "w": side})
    with pytest.raises(PartitionError) as info:
        partition(graph, parse_devices("cpu:2"), "balanced")
    assert str(info.value).endswith(f" (at image [1, 3, {side}, {side}]: other sizes with "
                                    "--bind DIM=N, or bindings)"), info.value
    need = re.match(r"node \S+ needs ([0-9.]+) GB; the largest device has", str(info.value))
    assert need and float(need.group(1)) >= round(side**4 * 4 / 1e9, 1)  # the scores alone
    path = tmp_path / "attention.onnx"
    onnx.save(pixel_attention(), path)
    assert main(["partition", str(path), "--devices", "cpu:2", "--bind", f"h={side}",
                 "--bind", f"w={side}"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"(at image [1, 3, {side}, {side}]" in err, err


def test_largest_device_counts_only_devices_that_run_the_node():
    graph = big_weight_graph()
    devices = [DeviceConfig(name="huge", backend="sim", memory_bytes=10**9,
                            supported_ops=frozenset({"Relu"})),
               DeviceConfig(name="cpu0", memory_bytes=3_000_000)]
    with pytest.raises(PartitionError) as info:
        partition(graph, devices, "balanced")
    match = NEEDS.fullmatch(str(info.value))
    assert match and match.group(1) == "big/matmul" and match.group(3) == "3.0", info.value


def test_node_no_device_can_run():
    graph = big_weight_graph()
    devices = [DeviceConfig(name="relu_only", backend="sim", supported_ops=frozenset({"Relu"}))]
    with pytest.raises(PartitionError) as info:
        partition(graph, devices, "memory")
    message = str(info.value)
    assert "big/matmul" in message and "MatMul" in message and "cannot run" in message
    assert "relu_only" in message


def test_the_same_graph_fits_once_a_device_is_big_enough():
    graph = big_weight_graph()
    devices = [DeviceConfig(name="small", memory_bytes=1_000_000),
               DeviceConfig(name="big", memory_bytes=4_100_000)]
    for mode in ("memory", "balanced"):
        plan = partition(graph, devices, mode)
        assert plan.partition_of("big/matmul").device == "big"


# ------------------------------------------------------------------------------------
# Too few devices
# ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["memory", "balanced"])
@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_too_few_devices(mode, name):
    graph = sample_graph(name)
    cap = int(biggest_node(graph) * 1.05)
    devices = [DeviceConfig(name=f"d{i}", memory_bytes=cap) for i in range(2)]
    assert not Reference(graph).feasible([n.name for n in graph.nodes], devices)
    with pytest.raises(PartitionError) as info:
        partition(graph, devices, mode)
    assert "too few devices" in str(info.value)
    assert "\n" not in str(info.value)
    if mode == "balanced":  # what was needed and what there was, in bytes
        assert human_bytes(2 * cap) in str(info.value), str(info.value)


def test_enough_devices_of_the_same_size_do_fit():
    graph = sample_graph("mlp")
    cap = int(biggest_node(graph) * 1.05)
    devices = [DeviceConfig(name=f"d{i}", memory_bytes=cap) for i in range(len(graph.nodes))]
    for mode in ("memory", "balanced"):
        plan = partition(graph, devices, mode)
        assert all(p.memory_bytes <= cap for p in plan.partitions)


# ------------------------------------------------------------------------------------
# Modes and device lists
# ------------------------------------------------------------------------------------
def test_unknown_mode():
    graph = sample_graph("mlp")
    with pytest.raises(PartitionError) as info:
        partition(graph, parse_devices("cpu:2"), "fastest")
    message = str(info.value)
    assert "fastest" in message and all(m in message for m in ("memory", "balanced", "user"))


def test_a_host_told_an_unknown_mode_names_the_modes_and_the_missing_map():
    with HostManager(parse_devices("cpu:2")) as host, pytest.raises(PartitionError) as info:
        host.add_network("m", SAMPLES_DIR / "mlp.onnx", partition="fastest")
    message = str(info.value)
    assert "'fastest' is neither a mode (memory, balanced) nor a map file" in message, message


def test_no_devices_and_repeated_names():
    graph = sample_graph("mlp")
    with pytest.raises(PartitionError, match="no devices"):
        partition(graph, [], "balanced")
    with pytest.raises(PartitionError, match="repeat"):
        partition(graph, [DeviceConfig(name="a"), DeviceConfig(name="a", backend="sim")])


def test_errors_are_prism_errors():
    assert issubclass(PartitionError, PrismError) and issubclass(DeviceSpecError, PrismError)


# ------------------------------------------------------------------------------------
# Device specs
# ------------------------------------------------------------------------------------
def test_compact_spec():
    devices = parse_devices("cpu:2,sim:4:mem=64MB")
    assert [d.name for d in devices] == ["cpu0", "cpu1", "sim0", "sim1", "sim2", "sim3"]
    assert [d.backend for d in devices] == ["cpu"] * 2 + ["sim"] * 4
    assert all(d.memory_bytes == 64_000_000 for d in devices[2:])
    assert devices[0].memory_bytes == DeviceConfig(name="c").memory_bytes
    more = parse_devices("cpu:threads=4,cpu,sim:ops=Add+Relu:flops=1e12:link=2GB")
    assert [d.name for d in more] == ["cpu0", "cpu1", "sim0"]
    assert more[0].threads == 4 and more[0].peak_flops == 4 * more[1].peak_flops
    assert more[2].supported_ops == frozenset({"Add", "Relu"})
    assert more[2].peak_flops == 1e12 and more[2].link_bandwidth == 2e9
    spun = parse_devices("cpu:threads=2:spin=0,cpu:spin=yes,cpu")
    assert [d.spin for d in spun] == [False, True, True]


@pytest.mark.parametrize("text, value", [
    ("64MB", 64e6), ("1GiB", 2**30), ("2.5T", 2.5e12), ("512kib", 512 * 1024), ("1e9", 1e9),
    (" 3 mb ", 3e6), ("7", 7), (4096, 4096),
])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("size", ["999", "12.5KB", "1.5MB", "2.1GB", "2TB", "3.5PB", "8.5e28"])
def test_sizes_read_back_as_they_are_written(size):
    """Byte counts are shown in the units `--devices` reads, TB and PB included (a 2 TB
    device showed "2000.0 GB"; a size from a corrupt shape, 29 digits of GB)."""
    shown = human_bytes(parse_size(size))
    assert len(shown) <= 12 and (float(shown.split()[0]) < 1000 or shown.endswith("PB")), shown
    assert parse_size(shown.replace(" ", "")) == pytest.approx(parse_size(size), rel=0.01)


def test_parse_size_takes_rates_per_second():
    """parse_size strips a "/s" suffix (bandwidths: link=12GB/s), but its pattern
    never lets "/" through, so the suffix is rejected instead."""
    assert parse_size("12GB/s") == 12e9
    assert parse_devices("sim:link=12GB/s")[0].link_bandwidth == 12e9


@pytest.mark.parametrize("spec, needle", [
    ("gpu:2", "unknown device kind 'gpu'"),
    ("cpu:2,tpu", "unknown device kind 'tpu'"),
    ("cpu:mem=lots", "cannot read size 'lots'"),
    ("sim:2:mem=64XB", "cannot read size"),
    ("cpu:2:colour=red", "unknown option 'colour'"),
    ("cpu:0", "no devices"),
    ("", "no devices"),
    ("cpu:mem=0", "memory_bytes must be positive"),
    ("cpu:threads=0", "threads must be >= 1"),
    ("cpu:spin=maybe", "spin must be 0 or 1, got 'maybe'"),
    ("sim:link=0", "link_bandwidth must be positive"),
])
def test_bad_specs(spec, needle):
    with pytest.raises(DeviceSpecError) as info:
        parse_devices(spec)
    assert needle in str(info.value)


@pytest.mark.parametrize("spec", [
    "cpu:threads=two",       # int() of a word
    "cpu:threads=1.5",
    "cpu:mem=1.2.3",         # the size pattern takes it, float() does not
    "cpu:mem=.",
    "cpu:mem=1e400",         # inf bytes: int(inf) overflows
    "cpu:mem=1e-3",          # rounds to 0 bytes after the positivity check
])
def test_malformed_values_are_device_spec_errors(spec):
    with pytest.raises(DeviceSpecError):
        parse_devices(spec)


_KINDS = st.sampled_from(["cpu", "sim", "reference", "gpu", "", "CPU"])
_KEYS = st.sampled_from(["mem", "memory", "threads", "flops", "bw", "link", "ops", "colour",
                         ""])
_VALUES = st.text(alphabet="0123456789.eE+-kKMGTiBb/s", max_size=8)


@st.composite
def spec_strings(draw) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        part = [draw(_KINDS)]
        if draw(st.booleans()):
            part.append(str(draw(st.integers(0, 3))))
        for _ in range(draw(st.integers(0, 2))):
            part.append(f"{draw(_KEYS)}={draw(_VALUES)}")
        parts.append(":".join(part))
    return ",".join(parts)


@settings(max_examples=300)
@given(spec_strings())
def test_any_spec_string_parses_or_raises_device_spec_error(spec):
    try:
        devices = parse_devices(spec)
    except DeviceSpecError as exc:
        assert "\n" not in str(exc)
        return
    assert devices and len({d.name for d in devices}) == len(devices)
    assert all(d.memory_bytes >= 1 for d in devices)


# ------------------------------------------------------------------------------------
# Device files
# ------------------------------------------------------------------------------------
TOML_DEVICES = """\
[fast]
backend = "sim"
memory = "64MB"
supported_ops = ["MatMul", "Relu"]

[host]
threads = 2
spin = false

[roomy]
backend = "sim"
mem = "1GiB"
link = "2GB"
"""


def test_toml_file_one_table_per_device(tmp_path):
    path = tmp_path / "devices.toml"
    path.write_text(TOML_DEVICES)
    for source in (path, str(path)):
        devices = parse_devices(source)
        assert [(d.name, d.backend) for d in devices] == [
            ("fast", "sim"), ("host", "cpu"), ("roomy", "sim")]
        fast, host, roomy = devices
        assert fast.memory_bytes == 64_000_000
        assert fast.supported_ops == frozenset({"MatMul", "Relu"})
        assert fast.can_run("MatMul") and not fast.can_run("Add")
        assert fast.peak_flops == DeviceConfig(name="s", backend="sim").peak_flops
        assert host.threads == 2 and host.supported_ops is None and not host.spin
        assert fast.spin and roomy.spin
        assert host.memory_bytes == DeviceConfig(name="c").memory_bytes
        assert roomy.memory_bytes == 2**30 and roomy.link_bandwidth == 2e9
    # The parsed devices plan: the restricted device gets only what it can run.
    graph = big_weight_graph(100)
    plan = partition(graph, devices, "balanced")
    for p in plan.partitions:
        if p.device == "fast":
            assert {graph.node(n).op_type for n in p.nodes} <= {"MatMul", "Relu"}


def test_toml_file_with_a_devices_table(tmp_path):
    path = tmp_path / "nested.toml"
    path.write_text('[devices.a]\nbackend = "cpu"\n\n[devices.b]\nbackend = "sim"\n'
                    'memory = "128MiB"\n')
    devices = parse_devices(path)
    assert [(d.name, d.backend, d.memory_bytes) for d in devices] == [
        ("a", "cpu", DeviceConfig(name="c").memory_bytes), ("b", "sim", 128 << 20)]


@pytest.mark.parametrize("text, needle", [
    ('[a]\nbackend = "cpu"\n\n[a]\nbackend = "sim"\n', "cannot read device file"),  # duplicate
    ('["cpu0"]\n\n[cpu0]\nthreads = 2\n', "cannot read device file"),  # same name, quoted
    ("a = 5\n", "must be a table"),
    ('[a]\nbackend = "gpu"\n', "unknown backend 'gpu'"),
    ('[a]\nmemory = "lots"\n', "cannot read size"),
    ('[a]\nmemory = -5\n', "memory_bytes must be positive"),
    ('[a]\ncolour = "red"\n', "unknown option 'colour'"),
    ("", "no devices"),
    ("[a\n", "cannot read device file"),
])
def test_bad_toml_files(tmp_path, text, needle):
    path = tmp_path / "devices.toml"
    path.write_text(text)
    with pytest.raises(DeviceSpecError) as info:
        parse_devices(path)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text", [
    '[a]\nthreads = "x"\n',
    '[a]\nlaunch_seconds = "soon"\n',
    "devices = 5\n",
    "devices = [1, 2]\n",
])
def test_malformed_toml_values_are_device_spec_errors(tmp_path, text):
    path = tmp_path / "devices.toml"
    path.write_text(text)
    with pytest.raises(DeviceSpecError):
        parse_devices(path)


def test_missing_device_file(tmp_path):
    missing = tmp_path / "absent.toml"
    with pytest.raises(DeviceSpecError) as info:
        parse_devices(missing)
    assert str(missing) in str(info.value) and "not found" in str(info.value)


def test_duplicate_device_names_from_python_are_rejected_by_the_partitioner():
    graph = sample_graph("mlp")
    devices = [*parse_devices("cpu:2"), DeviceConfig(name="cpu0", backend="sim")]
    with pytest.raises(PartitionError, match="repeat"):
        partition(graph, devices, "memory")
