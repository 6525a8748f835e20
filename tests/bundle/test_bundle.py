"""The bundle file: what it holds (plan, steps, memory plans, tables, weights once),
how damaged or foreign files are refused, export-onnx, device matching and the CLI."""

from __future__ import annotations

import hashlib
import json
import random
import re
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from app.cli import main
from runtime.bundle.contents import open_contents
from runtime.bundle.match import match_devices, needs, parse_remap
from runtime.bundle.plan_io import plan_from_dict, rename_devices
from runtime.bundle.reader import FORMAT_VERSION, MANIFEST, WEIGHTS, read_bundle
from runtime.bundle.writer import compile_bundle
from runtime.devices import DeviceConfig, parse_devices
from runtime.driver import open_bundle
from runtime.errors import BundleError
from runtime.host import HostManager
from runtime.partition import partition, partition_steps
from runtime.partition.memory_plan import memory_plans, memory_plans_dict
from runtime.partition.record import finish, tap
from runtime.partition.steps import replay
from runtime.versions import versions
from tests.support.bundles import (
    assert_identical,
    case,
    cpus,
    devices,
    feeds,
    file_is_open,
    graph,
    model_path,
    partition_arg,
    rewrite,
)
from tests.support.weights import SHARED_MAP, shared_weight_chain


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich must not wrap the lines we read


# -- what a bundle holds -----------------------------------------------------------------


@pytest.mark.parametrize("spec,mode", [("cpu:4", "balanced"), ("cpu:2,sim:2", "balanced"),
                                       ("sim:3:mem=400KB", "memory")])
def test_plan_round_trips_without_the_partitioner(spec, mode):
    plan = partition(graph("cnn"), parse_devices(spec), mode)
    again = plan_from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan and again.arenas == plan.arenas
    assert again.device_memory() == plan.device_memory()


def test_rename_devices_moves_a_plan_onto_other_names():
    plan = case("gpt2", 3, "balanced").compiled.plan
    names = {d.name: f"x{i}" for i, d in enumerate(plan.devices)}
    moved = rename_devices(plan, names)
    assert [p.device for p in moved.partitions] == [names[p.device] for p in plan.partitions]
    assert {(t.src, t.dst) for t in moved.transfers} == {
        (names[t.src], names[t.dst]) for t in plan.transfers}
    assert moved.device_memory() == {names[d]: b for d, b in plan.device_memory().items()}


@pytest.mark.parametrize("model,n,mode", [("branchy", 3, "balanced"), ("gpt2", 4, "balanced"),
                                          ("mlp", 3, "memory"), ("cnn", 4, "user")])
def test_bundle_holds_the_plan_steps_and_memory_plans(model, n, mode):
    c = case(model, n, mode)
    contents = open_contents(c.path)
    g = graph(model)
    assert contents.plan == c.jit_plan
    assert [(x.name, x.op_type) for x in contents.graph.nodes] == [
        (x.name, x.op_type) for x in g.nodes]
    assert contents.memory == json.loads(json.dumps(memory_plans_dict(memory_plans(
        c.jit_plan, g))))
    how = partition_arg(model, n, mode)
    steps = []
    finish(tap(partition_steps(g, list(devices(model, n, mode)), mode,
                               user_map=how if mode == "user" else None), steps.append))
    assert [s.to_dict() for s in contents.steps] == [s.to_dict() for s in steps]
    state = replay(contents.steps)  # the stepper, opened on a bundle, ends at the plan
    placed = {n: state.devices[state.assignment[n]] for n in state.assignment}
    assert placed == {n: p.device for p in contents.plan.partitions for n in p.nodes}


@pytest.mark.parametrize("model,n,mode", [("branchy", 4, "balanced"), ("gru_loop", 3, "user"),
                                          ("bert", 3, "memory")])
def test_schedule_and_requirement_tables(model, n, mode):
    c = case(model, n, mode)
    m, plan, g = c.compiled.manifest, c.compiled.plan, graph(model)
    assert m["format_version"] == FORMAT_VERSION and m["network"] == model
    assert m["created_with"] == versions(("onnx", "onnxruntime", "numpy"))
    assert [i["name"] for i in m["inputs"]] == g.inputs and m["outputs"] == g.outputs
    seen: list[str] = []
    written: dict[str, set[str]] = {}
    for row, part in zip(m["schedule"], plan.partitions, strict=True):
        assert (row["partition"], row["device"], row["backend"]) == (
            part.name, part.device, part.backend)
        assert set(row["after"]) <= set(seen)  # a row waits only for rows before it
        ready = set(g.inputs) | set(m["constants"]) | set().union(
            *(written[a] for a in row["after"]))
        assert set(row["reads"]) == set(part.inputs) <= ready
        written[row["partition"]] = set(row["writes"])
        seen.append(row["partition"])
    for req, part in zip(m["requirements"], plan.partitions, strict=True):
        assert req["kind"] == part.backend
        assert req["ops"] == sorted({g.node(x).op_type for x in part.nodes})
    assert {d["name"]: d["memory_bytes"] for d in m["devices"]} == {
        d: b for d, b in plan.device_memory().items() if any(
            p.device == d for p in plan.partitions)}


def _external_spans(bundle) -> dict[str, list[tuple[str, int, int]]]:
    """model member -> (initializer, offset, length) of each weight it keeps in weights.bin."""
    out = {}
    for name in bundle.names():
        if name.endswith(".onnx"):
            model = onnx.load_from_string(bundle.member(name))
            out[name] = [(i.name, int(d["offset"]), int(d["length"]))
                         for i in model.graph.initializer
                         if (d := {e.key: e.value for e in i.external_data})]
    return out


def test_weights_are_stored_once(tmp_path):
    """A weight two partitions read is in both their models, stored once in weights.bin:
    every distinct tensor once, every model naming a weight pointing at one copy."""
    path = tmp_path / "shared.prism"
    compiled = compile_bundle(shared_weight_chain(), cpus(2), path, partition=SHARED_MAP)
    uses = Counter(w for p in compiled.plan.partitions for w in p.weights)
    shared = [w for w, k in uses.items() if k > 1]
    assert shared == ["w"]
    with read_bundle(path) as bundle:
        spans = _external_spans(bundle)
        blob = bundle.weights()
        digest = {}
        for items in spans.values():
            for _, start, length in items:
                digest[start, length] = hashlib.sha256(blob[start:start + length]).hexdigest()
        assert len(set(digest.values())) == len(digest)  # no content stored twice
        for weight in shared:
            where = {(s, n) for items in spans.values() for w, s, n in items if w == weight}
            holders = [m for m, items in spans.items() if any(w == weight for w, _, _ in items)]
            assert len(where) == 1 and len(holders) >= 2, (weight, where, holders)
        info = compiled.manifest["weights"]
        assert info["bytes"] == blob.size < info["referenced_bytes"]


def test_export_onnx_tags_every_node_and_runs_like_the_original(tmp_path):
    c = case("gpt2", 4, "balanced")
    out = tmp_path / "plan.onnx"
    assert main(["export-onnx", str(c.path), "-o", str(out)]) == 0
    model = onnx.load(out)
    plan = c.compiled.plan
    for node in model.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        part = plan.partition_of(node.name)
        assert (meta["prism.partition"], meta["prism.device"]) == (part.name, part.device)
    onnx.checker.check_model(model)
    exported = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    original = ort.InferenceSession(str(model_path("gpt2")), providers=["CPUExecutionProvider"])
    f = feeds("gpt2")[1]
    for a, b in zip(exported.run(None, f), original.run(None, f), strict=True):
        np.testing.assert_array_equal(a, b)


def _split_before_and_in_a_loop() -> onnx.ModelProto:
    """Three Gathers covering an axis, before a Loop and in its body: onnxruntime fuses
    each three into a Split, names both Splits' outputs `split_output`, and cannot load
    the optimized model it writes (as torchvision's Mask R-CNN)."""
    f, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64

    def summed(x: str, prefix: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
        nodes = [onnx.helper.make_node("Gather", [x, f"{prefix}i{k}"], [f"{prefix}g{k}"],
                                       axis=1, name=f"{prefix}gather{k}") for k in range(3)]
        nodes.append(onnx.helper.make_node("Sum", [f"{prefix}g{k}" for k in range(3)],
                                           [f"{prefix}s"], name=f"{prefix}sum"))
        return nodes, [onnx.helper.make_tensor(f"{prefix}i{k}", i64, [], [k]) for k in range(3)]

    inner, inner_indices = summed("b_x", "b_")
    body = onnx.helper.make_graph(
        [onnx.helper.make_node("Neg", ["bx"], ["b_x"], name="bneg"), *inner,
         onnx.helper.make_node("Identity", ["c"], ["c_out"], name="keep")], "body",
        [onnx.helper.make_tensor_value_info("it", i64, []),
         onnx.helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        [onnx.helper.make_tensor_value_info("c_out", onnx.TensorProto.BOOL, []),
         onnx.helper.make_tensor_value_info("b_s", f, ["n"])], inner_indices)
    outer, outer_indices = summed("x", "m_")
    graph = onnx.helper.make_graph(
        [*outer, onnx.helper.make_node("Unsqueeze", ["m_s", "axis"], ["m_s1"], name="unsq"),
         onnx.helper.make_node("Add", ["x", "m_s1"], ["bx"], name="add"),
         onnx.helper.make_node("Loop", ["trip", "cond"], ["ys"], body=body, name="loop")],
        "split_in_loop",
        [onnx.helper.make_tensor_value_info("x", f, ["n", 3]),
         onnx.helper.make_tensor_value_info("trip", i64, []),
         onnx.helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])],
        [onnx.helper.make_tensor_value_info("m_s", f, ["n"]),
         onnx.helper.make_tensor_value_info("ys", f, ["t", "n"])],
        [*outer_indices, onnx.helper.make_tensor("axis", i64, [1], [1])])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


def _reads_back_optimized(model: onnx.ModelProto, folder: Path) -> bool:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(folder / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    try:
        ort.InferenceSession(opts.optimized_model_filepath, providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


def test_a_partition_onnxruntime_cannot_read_back_optimized_is_stored_as_extracted(tmp_path):
    """It compiles and runs as onnxruntime does, optimized as it loads (stored optimized
    by an onnxruntime that reads back what it writes)."""
    model = _split_before_and_in_a_loop()
    compiled = compile_bundle(model, cpus(1), tmp_path / "loop.prism")
    stored = "extended" if _reads_back_optimized(model, tmp_path) else "none"
    assert [row["optimization"] for row in compiled.manifest["schedule"]] == [stored]
    rng = np.random.default_rng()
    given = {"x": rng.standard_normal((int(rng.integers(1, 9)), 3)).astype(np.float32),
             "trip": np.array(int(rng.integers(1, 4))), "cond": np.array(True)}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, given)
    with open_bundle(compiled.path) as driver:
        got = driver.run(given)
    for name, expected in zip(["m_s", "ys"], want, strict=True):
        np.testing.assert_allclose(got[name], expected, rtol=1e-6)


# -- damaged and foreign files -----------------------------------------------------------


def _refused(path: Path, *words: str) -> str:
    with pytest.raises(BundleError) as err:
        open_bundle(path).close()
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text
    assert not file_is_open(path)  # nothing half-loaded: the file is closed again
    return text


def _spans(path: Path) -> dict[str, tuple[int, int]]:
    with read_bundle(path) as bundle:
        return dict(bundle._members)


def test_truncated_bundles_are_refused(tmp_path):
    src = case("mlp", 2, "balanced").path
    data = src.read_bytes()
    cuts = {0, 1, 21, len(data) // 2, len(data) - 1, len(data) - 22}
    for start, size in _spans(src).values():
        cuts |= {start, start + size // 2, start + size - 1}
    cuts |= set(random.sample(range(1, len(data)), 12))
    for cut in sorted(c for c in cuts if 0 <= c < len(data)):
        (tmp_path / "cut.prism").write_bytes(data[:cut])
        _refused(tmp_path / "cut.prism")


def test_a_flipped_byte_in_any_member_is_refused(tmp_path):
    src = case("mlp", 2, "balanced").path
    data = bytearray(src.read_bytes())
    for name, (start, size) in _spans(src).items():
        if not size:
            continue
        bad = bytearray(data)
        bad[start + random.randrange(size)] ^= 0x5A
        (tmp_path / "bad.prism").write_bytes(bad)
        _refused(tmp_path / "bad.prism", "corrupted", name)


def test_a_flipped_byte_anywhere_is_refused_or_harmless(tmp_path):
    """Outside the members' bytes (zip headers) a flip may hit a field nobody reads; then
    the bundle must still answer exactly as before."""
    c = case("mlp", 2, "balanced")
    data = c.path.read_bytes()
    for pos in random.sample(range(len(data)), 30):
        bad = bytearray(data)
        bad[pos] ^= 0xFF
        path = tmp_path / "flip.prism"
        path.write_bytes(bad)
        try:
            driver = open_bundle(path)
        except BundleError as exc:
            assert "\n" not in str(exc)
            continue
        with driver:
            assert_identical(driver.run(feeds("mlp")[0]), c.jit_outputs[0], f"flip at {pos}")


def test_foreign_newer_and_incomplete_bundles_are_refused(tmp_path):
    c = case("mlp", 2, "balanced")
    manifest = dict(c.compiled.manifest)
    newer = json.dumps({**manifest, "format_version": FORMAT_VERSION + 1}).encode()
    _refused(rewrite(c.path, tmp_path / "newer.prism", {MANIFEST: newer}),
             f"format {FORMAT_VERSION + 1}", "newer")
    other = json.dumps({**manifest, "format": "something-else"}).encode()
    _refused(rewrite(c.path, tmp_path / "other.prism", {MANIFEST: other}),
             "not a Prism bundle")
    _refused(rewrite(c.path, tmp_path / "none.prism", {MANIFEST: None}), "no manifest.json")
    _refused(rewrite(c.path, tmp_path / "zipped.prism", {}, zipfile.ZIP_DEFLATED),
             "compressed")
    row = manifest["schedule"][-1]
    _refused(rewrite(c.path, tmp_path / "gone.prism", {row["model"]: None}),
             f"no {row['model']}")
    _refused(rewrite(c.path, tmp_path / "junk.prism", {row["model"]: b"not a model"}),
             f"{row['model']} is not a model")
    _refused(rewrite(c.path, tmp_path / "noweights.prism", {WEIGHTS: None}), "no weights.bin")
    plain = tmp_path / "mlp.onnx"  # a copy: graphs loaded from the sample keep it open
    plain.write_bytes(model_path("mlp").read_bytes())
    _refused(plain, "not a Prism bundle")
    _refused(tmp_path / "missing.prism", "cannot open")


def test_a_bundle_whose_members_disagree_with_its_tables_is_refused_before_loading(tmp_path):
    """Two sub-models swapped (each a valid model, with valid checksums), or an input
    declaring more than an array holds: refused in one line when opened, by the driver
    and by a host alike, before any device loads anything."""
    c = case("gpt2", 4, "balanced")
    manifest = c.compiled.manifest
    first, second = manifest["schedule"][0], manifest["schedule"][1]
    with read_bundle(c.path) as bundle:
        a, b = bundle.member(first["model"]), bundle.member(second["model"])
    swapped = rewrite(c.path, tmp_path / "swapped.prism", {first["model"]: b, second["model"]: a})
    spec = manifest["inputs"][0]
    huge = json.dumps({**manifest, "inputs": [{**spec, "dims": [2**21, 2**21]},
                                              *manifest["inputs"][1:]]}).encode()
    vast = rewrite(c.path, tmp_path / "vast.prism", {MANIFEST: huge})
    for path, words in ((swapped, (first["model"], f"({first['partition']}) says")),
                        (vast, (repr(spec["name"]), "more than an array holds"))):
        _refused(path, *words)
        with HostManager(cpus(4)) as host:
            with pytest.raises(BundleError) as err:
                host.add_network("m", path)
            assert "\n" not in str(err.value) and all(w in str(err.value) for w in words)
            assert all(d.used_bytes == 0 for d in host.devices.values())
        assert not file_is_open(path)


# -- matching a bundle's devices to a host's -----------------------------------------------


def test_match_keeps_names_and_finds_renamed_devices():
    m = case("gpt2", 4, "balanced").compiled.manifest
    same = match_devices(m, cpus(4))
    assert same == {r["partition"]: r["device"] for r in m["schedule"]}
    host = [DeviceConfig(name=f"a{i}", backend="cpu", memory_bytes=64 << 20) for i in range(5)]
    moved = match_devices(m, host)
    assert set(moved) == set(same) and len(set(moved.values())) == 4
    pinned = match_devices(m, host, parse_remap(["cpu0=a4"]))
    assert pinned[m["schedule"][0]["partition"]] == "a4"


def test_partitions_on_one_bundle_device_stay_together():
    m = case("branchy", 2, "memory").compiled.manifest
    placed = match_devices(m, [DeviceConfig(name=f"z{i}", backend="cpu") for i in range(3)])
    for d in m["devices"]:
        assert len({placed[p] for p in d["partitions"]}) == 1


def test_match_errors_name_the_partition_and_what_is_missing():
    m = case("gpt2", 2, "balanced").compiled.manifest
    first = needs(m)[0]
    cases = [
        (parse_devices("sim:4"), [first.partitions[0], "no cpu device"]),
        (cpus(2, 1000), [first.partitions[0], "largest cpu device", "1.0 KB"]),
        ([DeviceConfig(name=f"c{i}", backend="cpu", supported_ops=["Add"]) for i in range(2)],
         [first.partitions[0], "does not run", sorted(first.ops - {"Add"})[0]]),
        (cpus(1), ["goes to another of the bundle's devices"]),
    ]
    for host, words in cases:
        with pytest.raises(BundleError) as err:
            match_devices(m, host)
        assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), (
            str(err.value), words)
    for remap, words in ((["cpu9=cpu0"], "no device cpu9"), (["cpu0=nope"], "no device nope"),
                         (["cpu0=cpu1", "cpu1=cpu1"], "two bundle devices")):
        with pytest.raises(BundleError, match=words):
            match_devices(m, cpus(2), parse_remap(remap))
    small = [*cpus(1), DeviceConfig(name="tiny", backend="cpu", memory_bytes=1000)]
    with pytest.raises(BundleError, match=re.escape("--remap cpu1=tiny: tiny has 1.0 KB")):
        match_devices(m, small, {"cpu1": "tiny"})
    with pytest.raises(BundleError, match="OLD=NEW"):
        parse_remap(["cpu0"])


def test_match_finds_a_fit_a_greedy_choice_would_miss():
    """b prefers the host device named b (its own name), but only that one can hold a:
    the matching moves b to y rather than fail."""
    manifest = {"devices": [{"name": "b", "kind": "cpu", "memory_bytes": 10, "partitions": ["p0"]},
                            {"name": "a", "kind": "cpu", "memory_bytes": 100,
                             "partitions": ["p1"]}],
                "requirements": [{"device": "b", "ops": ["Add"]}, {"device": "a", "ops": []}]}
    host = [DeviceConfig(name="b", backend="cpu", memory_bytes=200),
            DeviceConfig(name="y", backend="cpu", memory_bytes=50)]
    assert match_devices(manifest, host) == {"p0": "y", "p1": "b"}


# -- the command line ----------------------------------------------------------------------


def test_compile_prints_the_schedule_and_writes_a_bundle(capsys, tmp_path):
    out = tmp_path / "t.prism"
    assert main(["compile", str(model_path("transformer")), "--devices", "cpu:3",
                 "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}" in text and "stored for" in text and "onnxruntime" in text
    with open_bundle(out) as driver:
        for row in driver.bundle.manifest["schedule"]:
            assert row["partition"] in text
        assert set(driver.run(feeds("transformer")[0])) == set(graph("transformer").outputs)
    assert main(["compile", str(model_path("transformer")), "--devices", "cpu:4",
                 "--replicas", "2", "--max-batch", "4", "-o", str(out), "--json"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["replicas"] == 2 and manifest["batching"]["max_batch_size"] == 4
    assert len(manifest["devices"]) <= 2  # one copy's share of the devices


def test_cli_errors_are_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.prism"
    bad.write_bytes(b"PK" + bytes(100))
    for argv in (["export-onnx", str(bad), "-o", str(tmp_path / "x.onnx")],
                 ["compile", str(model_path("mlp")), "--devices", "cpu:2", "--partition",
                  "nope", "-o", str(tmp_path / "y.prism")],
                 ["compile", str(tmp_path / "none.onnx"), "--devices", "cpu:2",
                  "-o", str(tmp_path / "z.prism")]):
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 1 and len(err.rstrip("\n").splitlines()) == 1, err  # none before
        assert "Traceback" not in err + out
    assert not (tmp_path / "y.prism").exists() and not (tmp_path / "z.prism").exists()
