"""`prism partition` and `prism run`, called in-process, plus the console script once."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import app.run_cmd
from app.cli import main
from runtime.devices import parse_devices
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.inputs import input_specs, sizes_given
from runtime.observe.events import read_jsonl
from runtime.partition import partition_steps
from runtime.partition.steps import STEP_KINDS
from tests.support.dags import (
    SAMPLES_DIR,
    end_token_ids,
    end_token_model,
    even_rows_model,
    kv_cache_step,
    upsampling_detector,
)

TRANSFORMER = str(SAMPLES_DIR / "transformer.onnx")
MLP = str(SAMPLES_DIR / "mlp.onnx")
CNN = str(SAMPLES_DIR / "cnn.onnx")
PRISM = Path(sys.executable).with_name("prism")


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich must not wrap the lines we read


def one_line_error(capsys, argv: list[str], status: int = 1) -> str:
    """Run the CLI; it must fail with `status` (2: a bad flag) and one line on stderr."""
    try:
        code = main(argv)
    except SystemExit as done:  # argparse
        code = done.code
    out, err = capsys.readouterr()
    assert code == status, (out, err)
    assert "Traceback" not in out + err and "internal error" not in err
    lines = err.rstrip("\n").splitlines()  # no line before it either (a bar's leftover)
    assert len(lines) == 1, err
    return lines[0]


# -- prism partition ---------------------------------------------------------------------------


def test_partition_json_holds_every_node_once(capsys):
    assert main(["partition", TRANSFORMER, "--devices", "cpu:4", "--partition", "balanced",
                 "--json"]) == 0
    out, _ = capsys.readouterr()
    plan = json.loads(out)
    assert len(plan["partitions"]) == 4
    nodes = [n for p in plan["partitions"] for n in p["nodes"]]
    graph_nodes = [n.name for n in load_graph(TRANSFORMER).nodes]
    assert Counter(nodes) == Counter(graph_nodes)
    assert {p["device"] for p in plan["partitions"]} <= {"cpu0", "cpu1", "cpu2", "cpu3"}
    for p in plan["partitions"]:
        for field in ("name", "nodes", "device", "backend", "inputs", "outputs",
                      "weight_bytes", "activation_bytes", "est_seconds"):
            assert field in p
    assert plan["bottleneck_seconds"] > 0 and plan["transfers"]


def test_partition_table(capsys):
    assert main(["partition", TRANSFORMER, "--devices", "cpu:2", "--partition", "memory"]) == 0
    out, _ = capsys.readouterr()
    assert "memory plan" in out and "bottleneck" in out


def test_partition_prints_the_lower_bound_and_the_costs_it_used(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    assert main(["partition", TRANSFORMER, "--devices", "cpu:2", "--costs", "model",
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["costs"] == "model"
    assert 0 < plan["lower_bound_seconds"] <= plan["bottleneck_seconds"]
    assert main(["partition", TRANSFORMER, "--devices", "cpu:2", "--costs", "measured"]) == 0
    out = capsys.readouterr().out
    assert "(measured costs)" in out and "lower bound:" in out and "above it" in out
    assert list((tmp_path / "costs").glob("*.json"))  # measured once, kept in the cache
    with pytest.raises(SystemExit) as info:
        main(["partition", TRANSFORMER, "--devices", "cpu:2", "--costs", "guess"])
    assert info.value.code == 2


@pytest.mark.parametrize("case", ["missing", "not_onnx", "bad_devices", "too_big",
                                  "unknown_mode"])
def test_partition_errors_are_one_line(capsys, tmp_path, case):
    junk = tmp_path / "junk.onnx"
    junk.write_text("this is not a model\n")
    argv = {
        "missing": ["partition", str(tmp_path / "missing.onnx"), "--devices", "cpu:2"],
        "not_onnx": ["partition", str(junk), "--devices", "cpu:2"],
        "bad_devices": ["partition", MLP, "--devices", "gpu:2"],
        "too_big": ["partition", MLP, "--devices", "cpu:2:mem=100KB"],
        "unknown_mode": ["partition", MLP, "--devices", "cpu:2", "--partition", "fastest"],
    }[case]
    line = one_line_error(capsys, argv)
    assert "error" in line
    expect = {"missing": "missing.onnx", "not_onnx": "junk.onnx", "bad_devices": "gpu",
              "too_big": "needs", "unknown_mode": "fastest"}[case]
    assert expect in line, line
    assert "internal error" not in line


def test_partition_dot_has_a_cluster_per_partition(capsys, tmp_path):
    dot = tmp_path / "plan.dot"
    assert main(["partition", TRANSFORMER, "--devices", "cpu:3", "--json", "--dot",
                 str(dot)]) == 0
    plan = json.loads(capsys.readouterr().out)
    text = dot.read_text()
    assert text.startswith("digraph") and text.rstrip().endswith("}")
    clusters = re.findall(r'subgraph "cluster_([^"]+)"', text)
    assert sorted(clusters) == sorted(p["name"] for p in plan["partitions"])
    assert len(clusters) == 3
    for p in plan["partitions"]:
        for n in p["nodes"]:
            assert json.dumps(n) in text


def test_partition_steps_prints_every_step(capsys):
    devices = parse_devices("cpu:3")
    steps = list(partition_steps(load_graph(TRANSFORMER), devices, "balanced"))
    assert main(["partition", TRANSFORMER, "--devices", "cpu:3", "--steps"]) == 0
    out, _ = capsys.readouterr()
    pattern = re.compile(rf"^\s*(\d+)\s+({'|'.join(STEP_KINDS)})\b", re.MULTILINE)
    printed = pattern.findall(out)
    assert [(int(i), k) for i, k in printed] == [(s.index, s.kind) for s in steps]
    assert printed[-1][1] == "planned"


# -- prism run ---------------------------------------------------------------------------------


def test_run_check_prints_tables(capsys):
    code = main(["run", TRANSFORMER, "--devices", "cpu:3", "--requests", "200",
                 "--concurrency", "8", "--check"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in out + err
    for title in ("requests", "partitions", "devices"):
        assert title in out
    for device in ("cpu0", "cpu1", "cpu2"):
        assert device in out
    assert re.search(r"^\s*200\s+0\s+0\b", out, re.MULTILINE), out  # done, failed, rejected
    assert re.search(r"^check:", out, re.MULTILINE)


def test_run_json_holds_the_tables_figures_beside_the_plans_estimates(capsys):
    """`--json` prints the figures alone on stdout; each partition's estimate is its plan's
    (the suite plans on the roofline, so `prism partition` makes the same plan)."""
    assert main(["partition", TRANSFORMER, "--devices", "cpu:2", "--json"]) == 0
    planned = {f"transformer/{p['name']}": p["est_seconds"]
               for p in json.loads(capsys.readouterr().out)["partitions"]}
    code = main(["run", TRANSFORMER, "--devices", "cpu:2", "--requests", "40", "--check",
                 "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    figures = json.loads(out)
    assert figures["requests"]["done"] == 40 and figures["requests"]["failed"] == 0
    assert figures["check"]["answers"] == 40 and figures["check"]["mismatch"] is None
    parts = {p["partition"]: p for p in figures["partitions"]}
    assert {k: p["est_seconds"] for k, p in parts.items()} == planned
    assert all(p["runs"] == 40 and p["p50_seconds"] > 0 for p in parts.values()), parts
    assert sum(d["runs"] for d in figures["devices"]) == 40 * len(parts)
    assert main(["run", TRANSFORMER, "--devices", "cpu:2", "--requests", "5"]) == 0
    out = capsys.readouterr().out
    header = next(line.split() for line in out.splitlines() if "queue wait" in line)
    assert header[header.index("est") + 1] == "p50", out  # the estimate beside the run


def test_run_with_replicas_gives_each_replicas_runs_on_its_own_device(capsys):
    """Two replicas of a plan: each partition has a row per device that ran it,
    those devices are where the host placed it, and the rows' runs add up to the
    requests."""
    code = main(["run", TRANSFORMER, "--devices", "cpu:4", "--replicas", "2", "--requests",
                 "60", "--concurrency", "8", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = json.loads(out)["partitions"]
    by_partition: dict[str, dict[str, int]] = {}
    for row in rows:
        name, _, device = row["partition"].removeprefix("transformer/").partition("@")
        assert device == row["device"], row
        by_partition.setdefault(name, {})[device] = row["runs"]
    assert by_partition and all(len(d) == 2 for d in by_partition.values()), rows
    assert all(sum(d.values()) == 60 for d in by_partition.values()), rows
    devices = [d for ran in by_partition.values() for d in ran]
    assert len(set(devices)) == len(devices)  # no device runs two of them


def test_run_tables_count_its_requests_not_the_runs_a_first_load_times_its_plan_by(
        capsys, monkeypatch, tmp_path):
    """Measured costs, nothing cached: the first load sends a burst through its plan,
    which the partition and device tables must not count as the run's."""
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    code = main(["run", TRANSFORMER, "--devices", "cpu:2", "--costs", "measured",
                 "--requests", "30"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert list((tmp_path / "costs").glob("*.json"))  # it did measure
    parts = re.findall(r"^\s*transformer/p\d+\s+cpu\d\s+(\d+)\s", out, re.MULTILINE)
    devices = re.findall(r"^\s*cpu\d\s+(\d+)\s", out, re.MULTILINE)
    assert len(parts) >= 2 and len(devices) == 2, out
    assert {int(runs) for runs in parts + devices} == {30}, out


def test_a_detector_of_free_image_size_runs_on_made_up_images_it_can_take(capsys, tmp_path):
    """At 1x1, the made-up size of a free dimension, the neck's Concat fails."""
    path = str(tmp_path / "neck.onnx")
    onnx.save(upsampling_detector(["batch", 3, "height", "width"]), path)
    code = main(["run", path, "--devices", "cpu:2", "--requests", "3", "--check"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert re.search(r"^check: every output matches onnxruntime", out, re.MULTILINE), out


@pytest.mark.parametrize("devices", ["cpu:2", "cpu:1,reference:1"])
def test_a_first_decoder_step_plans_and_runs_on_an_empty_cache(capsys, tmp_path, devices):
    """--bind refused 0, so a decoder's first step, whose key cache is empty (past 0, as
    LLM exports take it), could not be planned or run on made-up inputs."""
    path = str(tmp_path / "kv.onnx")
    onnx.save(kv_cache_step(), path)
    seq = int(np.random.default_rng().integers(1, 6))
    code = main(["run", path, "--devices", devices, "--partition", "memory", "--requests", "3",
                 "--bind", "past=0", "--bind", f"seq={seq}", "--check"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert re.search(r"^check: every output matches onnxruntime", out, re.MULTILINE), out


def test_check_of_a_model_only_a_reference_device_runs_says_so(capsys, tmp_path):
    """A bfloat16 MatMul: onnxruntime's CPU provider has no kernel, the reference device
    runs it. --check, which needs onnxruntime to run it whole, says that in one line."""
    w = helper.make_tensor("w", TensorProto.BFLOAT16, [8, 8], vals=[1.0] * 64)
    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
             helper.make_node("MatMul", ["xb", "w"], ["yb"]),
             helper.make_node("Cast", ["yb"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "bf16", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["n", 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["n", 8])], [w])
    path = str(tmp_path / "bf16.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert main(["run", path, "--devices", "reference:1", "--requests", "3"]) == 0
    capsys.readouterr()
    assert main(["run", path, "--devices", "reference:1", "--requests", "3", "--check"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("prism: error: --check compares with bf16 "
                                                   "whole in onnxruntime, which cannot run it")
    assert "without --check" in err


def test_run_record_writes_every_request(capsys, tmp_path):
    record = tmp_path / "events.jsonl"
    code = main(["run", MLP, "--devices", "cpu:2", "--requests", "100", "--concurrency", "4",
                 "--record", str(record)])
    _, err = capsys.readouterr()
    assert code == 0, err
    events = list(read_jsonl(record))
    assert events
    queued = {e["request"] for e in events if e.kind == "request.queued"}
    finished = Counter(e["request"] for e in events if e.kind == "request.finished")
    assert len(queued) == 100
    assert set(finished) == queued and set(finished.values()) == {1}
    assert any(e.kind == "partition.run.finished" for e in events)


@pytest.mark.parametrize(("perturbed", "told"), [
    ("both", r"onnxruntime with its graph optimizations off differs from itself by "
             r"[0-9.e-]+\n"),  # float32's few units in the last place, told without a verdict
    ("optimized", r"differs from itself by 0.5: rounding noise this model amplifies\n")])
def test_run_failed_check_names_output_and_error(capsys, monkeypatch, perturbed, told):
    """And how far onnxruntime's own answer moves without its graph optimizations: here
    onnxruntime is perturbed in both sessions (a fault), or in its optimized one alone."""
    real = app.run_cmd.cpu_session

    class Perturbed:
        def __init__(self, session):
            self.session = session

        def get_outputs(self):
            return self.session.get_outputs()

        def run(self, names, feeds):
            return [np.asarray(v) + 0.5 for v in self.session.run(names, feeds)]

    monkeypatch.setattr(app.run_cmd, "cpu_session", lambda *a, **k: Perturbed(real(*a, **k))
                        if perturbed == "both" or k.get("optimized", True) else real(*a, **k))
    code = main(["run", TRANSFORMER, "--devices", "cpu:2", "--requests", "10",
                 "--concurrency", "2", "--check"])
    out, err = capsys.readouterr()
    assert code != 0
    assert "Traceback" not in out + err
    assert "'hidden'" in err and "largest error 0.5;" in err, err
    assert re.search(told, err), err
    assert not re.search(r"^check:", out, re.MULTILINE)


def test_run_bad_devices_is_one_line(capsys):
    line = one_line_error(capsys, ["run", MLP, "--devices", "cpu:0x"])
    assert "error" in line


# -- the console script ------------------------------------------------------------------------


def test_console_script(tmp_path):
    assert PRISM.exists()
    done = subprocess.run([str(PRISM), "partition", MLP, "--devices", "cpu:2", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert sorted(n for p in plan["partitions"] for n in p["nodes"]) == sorted(
        n.name for n in load_graph(MLP).nodes)
    bad = subprocess.run([str(PRISM), "partition", str(tmp_path / "nope.onnx"), "--devices",
                          "cpu:2"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    helped = subprocess.run([str(PRISM), "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0
    assert "partition" in helped.stdout and "run" in helped.stdout


def test_bench_compares_prism_with_plain_onnxruntime(capsys):
    args = ["bench", str(SAMPLES_DIR / "mlp.onnx"), "--devices", "cpu:1", "--requests", "200",
            "--concurrency", "8", "--max-batch", "8", "--json"]
    assert main(args) == 0
    figures = json.loads(capsys.readouterr().out)
    prism, plain = figures["prism"], figures["onnxruntime"]
    assert prism["requests_per_second"] > 0 and plain["requests_per_second"] > 0
    assert figures["ratio"] == pytest.approx(
        prism["requests_per_second"] / plain["requests_per_second"])
    assert 0 < prism["p50_seconds"] <= prism["p99_seconds"]
    with pytest.raises(SystemExit) as done:
        main(["bench", str(SAMPLES_DIR / "mlp.onnx"), "--devices", "cpu:1", "--replicas", "two"])
    assert done.value.code == 2 and "--replicas" in capsys.readouterr().err


def test_bench_sends_the_feeds_of_an_npz_to_prism_and_onnxruntime_alike(capsys, tmp_path):
    """A model taking only some sizes failed every made-up request under `prism bench`,
    which had no way to be given real ones."""
    path, data = str(tmp_path / "pairs.onnx"), tmp_path / "rows.npz"
    onnx.save(even_rows_model(), path)
    np.savez(data, x=np.random.default_rng().standard_normal((4, 4)).astype(np.float32))
    line = one_line_error(capsys, ["bench", path, "--devices", "cpu:1", "--requests", "20"])
    assert "requests failed" in line and line.endswith(
        "(on made-up inputs: x [1, 4]; give yours with --inputs FILE.npz, or sizes with "
        "--bind DIM=N)"), line
    assert main(["bench", path, "--devices", "cpu:1", "--requests", "50", "--concurrency", "2",
                 "--inputs", str(data), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["prism"]["requests_per_second"] > 0 and figures["ratio"] > 0


@pytest.mark.parametrize("command", ["run", "bench", "partition", "compile"])
@pytest.mark.parametrize("takes", ["some sizes", "some values"])
def test_a_model_given_inputs_is_costed_and_measured_on_them(capsys, caplog, tmp_path, command,
                                                            takes):
    """`--inputs` fed the requests, but the plan was costed, and its costs measured, on
    made-up inputs: one row, which the first model refuses, or ids without an end token,
    which the second does, so the roofline stood in; a transformer sent 128 tokens was
    planned for one. `partition` and `compile` take them too."""
    path, data = str(tmp_path / "model.onnx"), tmp_path / "inputs.npz"
    rng = np.random.default_rng()
    if takes == "some sizes":
        onnx.save(even_rows_model(), path)
        rows = 2 * int(rng.integers(1, 20))
        np.savez(data, x=rng.standard_normal((rows, 4)).astype(np.float32))
        assert sizes_given(input_specs(load_graph(path)), dict(np.load(data))) == {"rows": rows}
    else:
        onnx.save(end_token_model(), path)
        np.savez(data, ids=end_token_ids(rng))
    output = ["-o", str(tmp_path / "model.prism")] if command == "compile" else []
    load = ["--requests", "10"] if command in ("run", "bench") else []
    with caplog.at_level("WARNING"):
        assert main([command, path, "--devices", "cpu:2", *load, *output, "--costs",
                     "measured", "--inputs", str(data)]) == 0, capsys.readouterr().err
    assert not [r for r in caplog.records if "roofline" in r.getMessage()], caplog.text


# -- first contact -----------------------------------------------------------------------------


def _cnn_inputs(tmp_path: Path, **arrays) -> str:
    path = tmp_path / "inputs.npz"
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.parametrize("case", ["dtype", "name", "shape"])
def test_run_refuses_bad_inputs_before_anything_starts(capsys, tmp_path, monkeypatch, case):
    """A feeds file that does not fit the model is refused in one line on stderr, before a
    host exists: no run starts, no table is printed."""
    [spec] = input_specs(load_graph(CNN))
    shape = tuple(d if isinstance(d, int) else 1 for d in spec.dims)
    good = np.random.default_rng().standard_normal(shape).astype(spec.dtype)
    arrays = {"dtype": {spec.name: good.astype(np.int32)},
              "name": {"picture": good},
              "shape": {spec.name: good[..., :-1]}}[case]
    started = []
    monkeypatch.setattr(app.run_cmd, "HostManager", lambda *a, **k: started.append(1))
    line = one_line_error(capsys, ["run", CNN, "--devices", "cpu:1", "--requests", "5",
                                   "--inputs", _cnn_inputs(tmp_path, **arrays)])
    out = capsys.readouterr().out
    assert not started and not out
    assert "inputs.npz" in line and {"dtype": "int32", "name": "'picture'",
                                     "shape": spec.name}[case] in line


def test_run_with_good_inputs_uses_them(capsys, tmp_path):
    [spec] = input_specs(load_graph(CNN))
    shape = tuple(d if isinstance(d, int) else 1 for d in spec.dims)
    feeds = {spec.name: np.random.default_rng().standard_normal(shape).astype(spec.dtype)}
    code = main(["run", CNN, "--devices", "cpu:2", "--requests", "6", "--concurrency", "2",
                 "--check", "--inputs", _cnn_inputs(tmp_path, **feeds)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert re.search(r"^\s*6\s+0\s+0\b", out, re.MULTILINE), out


def _label_encoder(path) -> None:
    """Text in ("color", [N, 1]) -> class codes (an ai.onnx.ml LabelEncoder)."""
    graph = helper.make_graph(
        [helper.make_node("LabelEncoder", ["color"], ["code"], domain="ai.onnx.ml",
                          keys_strings=["red", "green", "blue"], values_int64s=[0, 1, 2],
                          default_int64=-1)], "encoder",
        [helper.make_tensor_value_info("color", TensorProto.STRING, ["N", 1])],
        [helper.make_tensor_value_info("code", TensorProto.INT64, ["N", 1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("ai.onnx.ml", 2)]),
              str(path))


def test_text_inputs_saved_as_numpy_strings_run(capsys, tmp_path):
    """np.savez keeps text as fixed-width strings (<U5): they were refused as "expected
    object [N, 1], got <U5 [3, 1]"; object arrays load only as pickles and are refused
    saying how to save text instead."""
    model, path = tmp_path / "encoder.onnx", tmp_path / "inputs.npz"
    _label_encoder(model)
    words = np.random.default_rng().choice(["red", "green", "blue", "mauve"], (3, 1))
    np.savez(path, color=words)
    assert main(["run", str(model), "--devices", "cpu:1", "--requests", "4", "--check",
                 "--inputs", str(path)]) == 0, capsys.readouterr().err
    assert "every output matches onnxruntime" in capsys.readouterr().out
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("encoder", str(model))
        want = [["red", "green", "blue"].index(w) if w in ("red", "green", "blue") else -1
                for w in words.ravel()]
        for given in (words, np.char.encode(words), words.tolist()):
            assert host.infer("encoder", {"color": given})["code"].ravel().tolist() == want
    np.savez(path, color=words.astype(object), allow_pickle=True)
    line = one_line_error(capsys, ["run", str(model), "--devices", "cpu:1", "--inputs",
                                   str(path)])
    assert "object arrays" in line and "no dtype=object" in line, line


def test_tables_into_a_pipe_keep_every_cell_and_line_whole(tmp_path):
    """Rich takes a pipe to be 80 columns wide: `prism partition > plan.txt` cut cells to
    "weigh…" and long tensor names, and wrapped the lines under the tables."""
    long = "/encoder/layer.0/attention/self/query/MatMul_output_" + "x" * 60
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], [long], name="first"),
         helper.make_node("Neg", [long], ["y"], name="second")], "long_names",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])])
    model, notes = tmp_path / "long.onnx", tmp_path / "split.toml"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    notes.write_text('[nodes]\nfirst = "cpu0"\nsecond = "cpu1"\n')
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run([str(PRISM), "partition", str(model), "--devices", "cpu:2",
                           "--annotate", str(notes)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert long in done.stdout and "…" not in done.stdout, done.stdout
    assert any(line.startswith("bottleneck: ") and line.rstrip().endswith("per request")
               for line in done.stdout.splitlines()), done.stdout


def test_check_compares_a_random_output_by_dtype_and_shape(capsys, tmp_path):
    """onnxruntime gives a RandomNormalLike other values each run, so --check failed on
    every model that samples ("largest error 1.71"); its other outputs are still compared
    by value, and so is a random op inside a branch found."""
    f = TensorProto.FLOAT
    branch = helper.make_graph([helper.make_node("RandomUniformLike", ["x"], ["u"])], "then",
                               [], [helper.make_tensor_value_info("u", f, ["n", 4])])
    plain = helper.make_graph([helper.make_node("Identity", ["x"], ["v"])], "else", [],
                              [helper.make_tensor_value_info("v", f, ["n", 4])])
    graph = helper.make_graph(
        [helper.make_node("RandomNormalLike", ["x"], ["noise"]),
         helper.make_node("Add", ["x", "noise"], ["noisy"]),
         helper.make_node("Relu", ["x"], ["kept"]),
         helper.make_node("If", ["flag"], ["picked"], then_branch=branch, else_branch=plain)],
        "sampler", [helper.make_tensor_value_info("x", f, ["n", 4]),
                    helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(t, f, ["n", 4]) for t in ("noisy", "kept", "picked")])
    model = tmp_path / "sampler.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    assert app.run_cmd.random_outputs(load_graph(str(model))) == {
        "noisy": "RandomNormalLike", "picked": "RandomUniformLike"}
    assert main(["run", str(model), "--devices", "cpu:2", "--requests", "6", "--check"]) == 0
    assert "noisy comes from RandomNormalLike: its dtype and shape compared only" in \
        capsys.readouterr().out
    check = app.run_cmd.OutputCheck(load_graph(str(model)))
    x = np.random.default_rng().standard_normal((3, 4)).astype(np.float32)
    feeds = {"x": x, "flag": np.asarray(False)}
    answer = {"noisy": x + 9, "kept": np.maximum(x, 0), "picked": x}
    check(feeds, answer, None, 0.0)
    assert check.mismatch is None and check.compared == 1
    check(feeds, {**answer, "noisy": x[:2]}, None, 0.0)  # a random output of another shape
    assert "'noisy'" in (check.mismatch or "")
    check = app.run_cmd.OutputCheck(load_graph(str(model)))
    check(feeds, {**answer, "kept": x}, None, 0.0)  # values still count where not random
    assert "'kept'" in (check.mismatch or "")


def test_version_names_prism_and_its_dependencies(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    found = dict(line.split(maxsplit=1) for line in out.splitlines())
    assert set(found) == {"prism", "python", "onnx", "onnxruntime", "numpy", "textual",
                          "streamlit"}
    assert found["onnxruntime"] == ort.__version__ and found["onnx"] == onnx.__version__
    assert found["python"] == platform.python_version()
