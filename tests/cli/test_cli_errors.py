"""Issue 19, the command line: every bad argument or file is a named one-line error, text
is printed as written, `--check` says only what it compared, and Ctrl-C at any time is
"prism: interrupted". Each case goes through the real CLI (`main`, or the console script
where the process matters)."""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import app.partition_cmd
import app.run_cmd
import runtime.partition.placement as placement
from app.cli import MAX_CLIENTS, MAX_DELAY_MS, main
from app.run_cmd import difference
from runtime import DeviceConfig, HostManager
from runtime.devices.spec import MAX_DEVICES
from runtime.errors import ModelLoadError
from runtime.graph import load_graph
from runtime.inputs import input_specs
from tests.cli.test_cli import MLP, PRISM, TRANSFORMER, _wide, one_line_error
from tests.support.dags import even_rows_model

__all__ = ["_wide"]  # autouse: rich must not wrap the lines we read

def _save(model: onnx.ModelProto, path: Path) -> str:
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return str(path)


def _model(nodes, inputs, outputs, inits=(), name="g") -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, list(inits)),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _vec(name: str, dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


# -- text is printed as written ----------------------------------------------------------------


def test_markup_in_a_device_spec_is_named_not_parsed(capsys):
    line = one_line_error(capsys, ["partition", MLP, "--devices", "cpu:2:mem=[/x]"])
    assert "'[/x]'" in line


def test_brackets_in_an_error_survive(capsys, tmp_path):
    [spec] = input_specs(load_graph(MLP))
    path = tmp_path / "inputs.npz"
    np.savez(path, **{spec.name: np.zeros((1, 256))})  # float64, the model takes float32
    line = one_line_error(capsys, ["run", MLP, "--devices", "cpu:1", "--inputs", str(path)])
    assert "float32 [batch, 256]" in line and "float64 [1, 256]" in line, line


NAMES = ["[bold]fc[/]", "[/x]", "tensor :smile: [red]"]


def test_names_from_the_model_print_as_written(capsys, tmp_path):
    """Node, tensor, model and device names that look like Rich markup or emoji codes:
    tables, steps, --explain, the progress bar and the run's tables show them verbatim."""
    w = numpy_helper.from_array(np.random.default_rng().standard_normal((8, 8)).astype(
        np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], [NAMES[2]], name=NAMES[0]),
             helper.make_node("Relu", [NAMES[2]], ["y"], name=NAMES[1])]
    model = _save(_model(nodes, [_vec("x", ["batch", 8])], [_vec("y", ["batch", 8])], [w]),
                  tmp_path / "[m].onnx")
    devices = tmp_path / "devices.toml"
    devices.write_text('["[dev]"]\nbackend = "cpu"\n["[/dev]"]\nbackend = "cpu"\n')
    split = tmp_path / "split.json"  # one node per device, so the tensor is copied
    split.write_text(json.dumps({"partitions": {"p0": "[dev]", "p1": "[/dev]"},
                                 "nodes": {NAMES[0]: "p0", NAMES[1]: "p1"}}))
    common = ["--devices", str(devices), "--partition", str(split)]
    assert main(["partition", model, *common, "--steps", "--explain", NAMES[0]]) == 0
    out = capsys.readouterr().out
    for name in [*NAMES, "[dev]", "[/dev]", "[m]"]:
        assert name in out, name
    assert main(["run", model, *common, "--requests", "3"]) == 0
    out = capsys.readouterr().out
    assert "[dev]" in out and "[m]/p1" in out


# -- numbers are checked -----------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "flag", "limit"), [
    (["run", MLP, "--devices", "cpu:1", "--concurrency", "0"], "--concurrency",
     f"from 1 to {MAX_CLIENTS}"),
    (["run", MLP, "--devices", "cpu:1", "--concurrency", "-1"], "--concurrency", "from 1"),
    (["run", MLP, "--devices", "cpu:1", "--concurrency", str(MAX_CLIENTS + 1)],
     "--concurrency", str(MAX_CLIENTS)),
    (["run", MLP, "--devices", "cpu:1", "--rate", "-3"], "--rate", "above 0"),
    (["run", MLP, "--devices", "cpu:1", "--rate", "0"], "--rate", "above 0"),
    (["run", MLP, "--devices", "cpu:1", "--rate", "nan"], "--rate", "above 0"),
    (["run", MLP, "--devices", "cpu:1", "--requests", "-5"], "--requests", "at least 1"),
    (["run", MLP, "--devices", "cpu:1", "--requests", "0"], "--requests", "at least 1"),
    (["run", MLP, "--devices", "cpu:1", "--max-batch", "0"], "--max-batch", "at least 1"),
    (["run", MLP, "--devices", "cpu:1", "--max-delay-ms", "-1"], "--max-delay-ms",
     str(MAX_DELAY_MS)),
    (["run", MLP, "--devices", "cpu:1", "--replicas", "0"], "--replicas", "'auto'"),
    (["bench", MLP, "--devices", "cpu:1", "--requests", "-1"], "--requests", "at least 1"),
    (["partition", MLP, "--devices", "cpu:1", "--bind", "batch=-1"], "--bind", "from 0 to"),
    (["partition", MLP, "--devices", "cpu:1", "--bind", "batch=²"], "--bind", "whole number"),
    (["bench", "--url", "http://127.0.0.1:1", "--shape", "x=2,-1"], "--shape", "from 0 to"),
    (["bench", "--url", "http://127.0.0.1:1", "--shape", "x"], "--shape", "INPUT=D,D"),
    (["tui", "--concurrency", "0"], "--concurrency", "from 1"),
    (["tui", "--seed", "-1"], "--seed", "at least 0"),
    (["web", "--port", "70000"], "--port", "65535"),
    (["conformance", "--timeout", "0"], "--timeout", "above 0"),
    (["conformance", "-k", "["], "-k", "regular expression"),
])
def test_bad_numbers_are_refused_naming_the_limit(capsys, argv, flag, limit):
    """Before: --concurrency 0, -1 and --rate -3 hung, --requests -5 did nothing, exit 0."""
    line = one_line_error(capsys, argv, status=2)
    assert f"argument {flag}" in line and limit in line, line


@pytest.mark.parametrize(("argv", "named"), [
    (["--bind", "seq=128"], r"--bind is for a model run here \(send .* --shape INPUT=D"),
    ([MLP], r"MODEL is for a model run here \(name a served model with --model M\)"),
    (["--devices", "cpu:2"], "--devices is for a model run here$"),
])
def test_bench_url_refuses_flags_for_a_model_run_here(capsys, argv, named):
    """`prism bench --url` ignored them: `--bind seq=128` sent a sequence of 1, the model
    file named was not the model measured."""
    line = one_line_error(capsys, ["bench", "--url", "http://127.0.0.1:1", *argv])
    assert re.search(named, line), line


def test_bench_shape_is_for_url(capsys):
    line = one_line_error(capsys, ["bench", MLP, "--devices", "cpu:1", "--shape", "x=1,4"])
    assert line.endswith("--shape is for --url; a model run here takes its symbolic "
                         "dimensions' sizes with --bind DIM=N"), line


@pytest.mark.parametrize("spec", ["cpu:99999", f"cpu:{MAX_DEVICES},sim:1", "cpu:0",
                                  "cpu:1:threads=100000", "cpu:²"])
def test_device_counts_are_bounded(capsys, spec):
    line = one_line_error(capsys, ["partition", MLP, "--devices", spec])
    assert "devices" in line or "threads" in line or "option" in line, line


def test_placement_asks_once_per_kind_of_device(monkeypatch):
    """Placement asks whether a device runs a node once per kind of device (backend and
    op list), not once per device, so thousands of twins cost what two do (it was
    quadratic: cpu:10000 took 5 s, cpu:30000 36 s)."""
    calls = []
    real = placement.unsupported
    monkeypatch.setattr(placement, "unsupported", lambda *a: calls.append(1) or real(*a))
    graph = load_graph(TRANSFORMER)
    counts = []
    for n in (2, MAX_DEVICES):
        calls.clear()
        placement.place(graph, [DeviceConfig(f"cpu{i}") for i in range(n)],
                        placement.Annotations())
        counts.append(len(calls))
    assert counts[0] == counts[1] == len(graph.nodes)


def test_partition_at_the_device_limit(capsys):
    assert main(["partition", TRANSFORMER, "--devices", f"cpu:{MAX_DEVICES}", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert len(plan["devices"]) == MAX_DEVICES
    assert sorted(n for p in plan["partitions"] for n in p["nodes"]) == sorted(
        n.name for n in load_graph(TRANSFORMER).nodes)


# -- errors that escaped as "internal error" ---------------------------------------------------


@pytest.mark.parametrize(("text", "needle"), [
    ("nodes = 5", "nodes must be a table"),
    ('[ops]\nGemm = 5', "ops.Gemm must name a device"),
    ("fallback = 3", "fallback must be a device name"),
])
def test_malformed_annotations(capsys, tmp_path, text, needle):
    path = tmp_path / "notes.toml"
    path.write_text(text + "\n")
    line = one_line_error(capsys, ["partition", MLP, "--devices", "cpu:2", "--annotate",
                                   str(path)])
    assert needle in line and str(path) in line, line


@pytest.mark.parametrize("devices", ["cpu:1", "cpu:1,reference:1"])
def test_onnxruntime_says_what_went_wrong_before_where_in_its_source(capsys, tmp_path,
                                                                     devices):
    """onnxruntime's C++ errors open with the source line and function that threw; the
    one line keeps what went wrong (a locale no machine has), on the placement probe
    (cpu alone) and on --check's whole-model session (the reference device runs it)."""
    text = helper.make_tensor_value_info
    model = helper.make_model(helper.make_graph(
        [helper.make_node("StringNormalizer", ["words"], ["lower"], name="normalize",
                          case_change_action="LOWER", locale="zz_NOWHERE.UTF-8")], "g",
        [text("words", TensorProto.STRING, [3])], [text("lower", TensorProto.STRING, [3])]),
        opset_imports=[helper.make_opsetid("", 17)])
    line = one_line_error(capsys, ["run", _save(model, tmp_path / "m.onnx"), "--devices",
                                   devices, "--check", "--requests", "1"])
    assert "Failed to construct locale with name:zz_NOWHERE.UTF-8" in line, line
    assert ".cc:" not in line and "<lambda()>" not in line, line


@pytest.mark.parametrize(("name", "text", "needle"), [
    ("map.toml", "nodes = 5", "nodes must be a table"),
    ("map.toml", "default = [1]", "default must name a partition"),
    ("map.json", "[1, 2]", "expected an object"),
    ("map.toml", "[partiton]\nx = \"cpu0\"", "unknown key(s) ['partiton']"),
])
def test_malformed_partition_maps(capsys, tmp_path, name, text, needle):
    path = tmp_path / name
    path.write_text(text + "\n")
    line = one_line_error(capsys, ["partition", MLP, "--devices", "cpu:2", "--partition",
                                   str(path)])
    assert needle in line, line


@pytest.mark.parametrize("flag", ["--devices", "--annotate"])
def test_a_toml_file_that_is_not_utf8(capsys, tmp_path, flag):
    path = tmp_path / "bad.toml"
    path.write_bytes(b"\xff\xfe[cpu0]\n")
    argv = ["partition", MLP, "--devices", "cpu:2", flag, str(path)]
    assert str(path) in one_line_error(capsys, argv)


def _npz_cases(tmp_path: Path) -> dict[str, bytes]:
    [spec] = input_specs(load_graph(MLP))
    good = tmp_path / "good.npz"
    np.savez_compressed(good, **{spec.name: np.random.default_rng().standard_normal(
        (1, 256)).astype(np.float32)})
    data = good.read_bytes()
    flipped = bytearray(data)
    for i in range(40, len(data) // 2):  # inside the compressed member
        flipped[i] ^= 0x5A
    npy = tmp_path / "one.npy"
    np.save(npy, np.zeros((1, 256), np.float32))
    return {"junk": b"not an archive", "empty": b"", "truncated": data[: len(data) // 2],
            "flipped": bytes(flipped), "npy": npy.read_bytes()}


@pytest.mark.parametrize("case", ["junk", "empty", "truncated", "flipped", "npy"])
def test_unreadable_inputs(capsys, tmp_path, monkeypatch, case):
    path = tmp_path / "inputs.npz"
    path.write_bytes(_npz_cases(tmp_path)[case])
    started = []
    monkeypatch.setattr(app.run_cmd, "HostManager", lambda *a, **k: started.append(1))
    line = one_line_error(capsys, ["run", MLP, "--devices", "cpu:1", "--inputs", str(path)])
    assert f"cannot read inputs {path}" in line and not started, line
    if case in ("junk", "npy"):
        assert "numpy.savez" in line


@pytest.mark.parametrize("flag", ["--record", "--dot"])
def test_output_into_a_missing_folder(capsys, tmp_path, monkeypatch, flag):
    """Refused before any work: no host starts, no plan is made."""
    target = tmp_path / "nowhere" / "out.txt"
    started = []
    monkeypatch.setattr(app.run_cmd, "HostManager", lambda *a, **k: started.append(1))
    monkeypatch.setattr(app.partition_cmd, "load", lambda *a, **k: started.append(1))
    command = "run" if flag == "--record" else "partition"
    line = one_line_error(capsys, [command, MLP, "--devices", "cpu:1", flag, str(target)])
    assert flag in line and str(target.parent) in line and not started, line
    line = one_line_error(capsys, [command, MLP, "--devices", "cpu:1", flag, str(tmp_path)])
    assert "folder" in line and not started


def _not_utf8(tmp_path: Path) -> tuple[Path, str]:
    """mlp.onnx with a byte of its first node's name made invalid UTF-8."""
    model = onnx.load(MLP)
    model.graph.node[0].name = "Q" * 12  # a run of bytes found once in the file
    data = model.SerializeToString()
    at = data.index(b"Q" * 12)
    path = tmp_path / "bad_utf8.onnx"
    path.write_bytes(data[:at] + b"\xff" + data[at + 1:])
    return path, "model.graph.node[0].name"


def test_a_model_with_invalid_utf8(capsys, tmp_path):
    path, field = _not_utf8(tmp_path)
    for command in (["partition"], ["run", "--requests", "2"]):
        line = one_line_error(capsys, [command[0], str(path), "--devices", "cpu:1",
                                       *command[1:]])
        assert field in line and "UTF-8" in line and str(path) in line, line
    with HostManager([DeviceConfig("cpu0")]) as host:
        for source in (str(path), path.read_bytes()):
            with pytest.raises(ModelLoadError, match=re.escape(field)):
                host.add_network("bad", source)


@pytest.mark.parametrize("damage", ["missing", "short"])
def test_external_data_missing_or_short_is_named(capsys, tmp_path, damage):
    """A model whose weights live in a side file: the error names the model and the
    tensor its side file cannot give, not "is not an ONNX model"."""
    rng = np.random.default_rng()
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w0")
    model = _model([helper.make_node("MatMul", ["x", "w0"], ["y"])], [_vec("x", [1, 64])],
                   [_vec("y", [1, 64])], [w])
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, path, save_as_external_data=True, location="w.data",
                    size_threshold=0)
    data = tmp_path / "w.data"
    if damage == "missing":
        data.unlink()
    else:
        data.write_bytes(data.read_bytes()[:100])
    line = one_line_error(capsys, ["partition", str(path), "--devices", "cpu:1"])
    assert str(path) in line and "external data" in line and "w0" in line, line
    assert "not an ONNX model" not in line


# -- --check says what it compared -------------------------------------------------------------


def test_check_with_no_answer_claims_nothing(capsys, tmp_path):
    """Every request fails (a Reshape that cannot hold the bound batch): one line saying
    so, and no "every output matches"."""
    shape = numpy_helper.from_array(np.array([3], np.int64), "shape")
    model = _save(_model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                         [_vec("x", ["n"])], [_vec("y", [3])], [shape]), tmp_path / "r.onnx")
    line = one_line_error(capsys, ["run", model, "--devices", "cpu:1", "--requests", "3",
                                   "--check"])
    assert "3 of 3 requests failed" in line, line
    assert "matches" not in capsys.readouterr().out


def test_check_counts_twin_nans_as_equal(capsys, tmp_path):
    """0/0 is NaN in both runtimes: that output matches; the other one is compared too."""
    nodes = [helper.make_node("Sub", ["x", "x"], ["zero"]),
             helper.make_node("Div", ["zero", "zero"], ["nan"]),
             helper.make_node("Relu", ["x"], ["relu"])]
    model = _save(_model(nodes, [_vec("x", ["batch", 4])],
                         [_vec("nan", ["batch", 4]), _vec("relu", ["batch", 4])]),
                  tmp_path / "nan.onnx")
    code = main(["run", model, "--devices", "cpu:2", "--requests", "4", "--check"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert re.search(r"^check: every output matches onnxruntime \(4 answers", out, re.M), out


def test_check_compares_a_scalar_output(capsys, tmp_path):
    """A 0-d output (a mean over everything, as TensorFlow's reduce_mean exports) is
    compared like any other; its gap was once a numpy scalar that no mask could write."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], keepdims=0),
             helper.make_node("Relu", ["x"], ["relu"])]
    model = _save(_model(nodes, [_vec("x", ["batch", 4])],
                         [_vec("mean", []), _vec("relu", ["batch", 4])]), tmp_path / "mean.onnx")
    code = main(["run", model, "--devices", "cpu:2", "--requests", "3", "--check"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert re.search(r"^check: every output matches onnxruntime \(3 answers", out, re.M), out


def test_difference_tells_nan_on_one_side_from_nan_on_both():
    rng = np.random.default_rng()
    want = rng.standard_normal(5).astype(np.float32)
    want[2] = np.nan
    assert difference(want.copy(), want) == (0.0, None)
    got = want.copy()
    got[2] = 1.0
    assert difference(got, want)[0] == np.inf and difference(got, want)[1]
    inf = np.array([np.inf, -np.inf], np.float32)
    assert difference(inf, inf.copy()) == (0.0, None)
    assert difference(want[:4], want)[1]  # another shape


def test_difference_compares_a_zipmaps_class_scores_within_their_floats_room():
    rng = np.random.default_rng()
    scores = rng.random(3).astype(np.float32)
    want = dict(zip("abc", scores.tolist(), strict=True))  # as onnxruntime gives a map
    ulp = dict(zip("abc", np.nextafter(scores, np.float32(2)).tolist(), strict=True))
    f32 = np.dtype(np.float32)
    assert difference([ulp], [want], f32)[1] is None
    assert difference([{**want, "a": want["a"] + 1e-3}], [want], f32)[1] == "largest error 0.001"
    assert difference([dict(zip("abd", scores.tolist(), strict=True))], [want], f32) == (
        np.inf, "a map of other keys")


def test_difference_gives_room_in_proportion_to_the_output_not_to_each_element():
    rng = np.random.default_rng()
    want = (40 * rng.standard_normal(1000)).astype(np.float32)  # logits of a real network
    want[0] = 0.0
    got = want.copy()
    got[0] = 2e-5  # summed in another order: an error the size of the terms, near zero
    assert difference(got, want)[1] is None
    got[0] = 0.05  # a real error still fails
    assert difference(got, want)[1] is not None
    small = want / np.abs(want).max()  # below 1, the room is the absolute one
    off = small.copy()
    off[0] = 2e-5
    assert difference(off, small)[1] is not None


# -- the console script ------------------------------------------------------------------------


def _extension_file(module: str) -> str:
    """The shared library a package's C extension loads from (found, not assumed)."""
    package = importlib.import_module(module)
    found = [m.__file__ for name, m in sys.modules.items()
             if name.startswith(module + ".") and getattr(m, "__file__", "")
             and m.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))]
    assert found, package
    return os.path.basename(found[0])


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")
@pytest.mark.parametrize("package", ["numpy", "onnx", "onnxruntime"])
def test_ctrl_c_while_the_runtime_imports(package):
    """SIGINT as soon as the package's C extension is mapped, i.e. in the middle of the
    imports, which run inside main's guard: "prism: interrupted", status 130, nothing
    else (pressed while onnx's extension initialised, it used to kill the process)."""
    library = _extension_file(package)
    # SIGINT as a terminal leaves it: a suite run as a background job ignores it, and so
    # would the child (Python then installs no KeyboardInterrupt)
    proc = subprocess.Popen([str(PRISM), "partition", TRANSFORMER, "--devices", "cpu:2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    try:
        while library not in Path(f"/proc/{proc.pid}/maps").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, "never loaded"
            time.sleep(0.001)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert (proc.returncode, err) == (130, "prism: interrupted\n"), err
    assert out == ""


def test_a_closed_pipe_is_not_an_error_to_report():
    """`prism partition ... --json | head -c 1`: no traceback, no "Exception ignored"."""
    proc = subprocess.Popen([str(PRISM), "partition", TRANSFORMER, "--devices",
                             f"cpu:{MAX_DEVICES}", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.read(1)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert err == "" and proc.returncode in (0, 1), err


def test_every_request_failing_on_made_up_inputs_says_which_and_how_to_give_others(
        capsys, tmp_path):
    """A model taking only some sizes (an even number of rows here; PP-OCR's recognizer,
    text lines 48 high): the error said what onnxruntime said, not that the inputs were
    made up nor how to give real ones."""
    model = _save(even_rows_model(), tmp_path / "pairs.onnx")
    line = one_line_error(capsys, ["run", model, "--devices", "cpu:1", "--requests", "2"])
    assert line.endswith("(on made-up inputs: x [1, 4]; give yours with --inputs FILE.npz, "
                         "or sizes with --bind DIM=N)"), line
    assert main(["run", model, "--devices", "cpu:1", "--requests", "2", "--bind", "rows=2",
                 "--check"]) == 0
    np.savez(tmp_path / "rows.npz", x=np.random.default_rng().standard_normal(
        (3, 4)).astype(np.float32))
    line = one_line_error(capsys, ["run", model, "--devices", "cpu:1", "--requests", "2",
                                   "--inputs", str(tmp_path / "rows.npz")])
    assert "made-up" not in line and "2 of 2 requests failed" in line, line
