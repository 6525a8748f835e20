"""`prism train`: a real model trained from a random start to a real accuracy, the figures
`--json` promises, and bad input refused in one line with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from app.cli import main
from benchmarks.digits import digits_cnn, digits_images
from tests.support.train_models import mlp

JSON_KEYS = {"epochs", "stages", "micro_batches", "step_seconds", "ideal_step_seconds",
             "bubble", "peak_activation_bytes"}


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("digits")
    train_x, train_y, test_x, test_y = digits_images()
    np.savez(folder / "digits.npz", image=train_x, label=train_y, test_image=test_x,
             test_label=test_y)
    onnx.save(digits_cnn(seed=0), folder / "cnn.onnx")
    return folder


def train(folder: Path, *extra: str, out: str = "trained.onnx") -> list[str]:
    return ["train", str(folder / "cnn.onnx"), "--data", str(folder / "digits.npz"),
            "--labels", "label", "-o", str(folder / out), *extra]


def test_a_cnn_trained_over_two_devices_classifies_digits(digits: Path, capsys) -> None:
    """From a random start, over 2 devices, pipelined: at least 95% on the held-out
    digits, read back by plain onnxruntime."""
    code = main(train(digits, "--devices", "cpu:2", "--optimizer", "adam", "--lr", "0.003",
                      "--batch-size", "32", "--micro-batches", "4", "--epochs", "6",
                      "--schedule", "1f1b", "--json"))
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) >= JSON_KEYS
    assert report["stages"] == 2 and report["micro_batches"] == 4
    assert [e["epoch"] for e in report["epochs"]] == list(range(1, 7))
    assert report["epochs"][-1]["loss"] < report["epochs"][0]["loss"] / 4
    assert len(report["peak_activation_bytes"]) == 2
    assert report["ideal_step_seconds"] > 0 and report["step_seconds"] > 0
    assert 0 <= report["bubble"] < 1
    data = np.load(digits / "digits.npz")
    session = ort.InferenceSession(str(digits / "trained.onnx"),
                                   providers=["CPUExecutionProvider"])
    logits = session.run(None, {"image": data["test_image"]})[0]
    assert float(np.mean(logits.argmax(1) == data["test_label"])) >= 0.95


def test_the_tables_show_epochs_stages_and_the_schedule(digits: Path, capsys) -> None:
    code = main(train(digits, "--devices", "sim:2", "--batch-size", "64", "--micro-batches",
                      "8", "--schedule", "gpipe", "--optimizer", "momentum",
                      out="table.onnx"))
    assert code == 0
    out = capsys.readouterr().out
    assert "epoch" in out and "loss" in out and "sim0" in out and "sim1" in out
    assert "ideal for the schedule" in out and "bubble" in out
    assert (digits / "table.onnx").is_file()


def _mlp_data(folder: Path, **arrays: np.ndarray) -> Path:
    rng = np.random.default_rng()
    onnx.save(mlp(rng), folder / "cnn.onnx")
    data = {"x": rng.standard_normal((32, 6)).astype(np.float32),
            "y": rng.integers(0, 3, 32), **arrays}
    np.savez(folder / "digits.npz", **data)
    return folder


@pytest.mark.parametrize(("arrays", "flags", "says"), [
    ({}, ["--labels", "missing"], "has no array 'missing' for the labels"),  # the last wins
    ({"x": np.zeros((32, 6))}, [], "input 'x' of cnn: expected float32"),
    ({"x": np.zeros((32, 4), np.float32)}, [], "input 'x' of cnn: expected"),
    ({"y": np.zeros(32)}, [], "integer class labels"),
    ({"y": np.zeros(30, np.int64)}, [], "x has 32 rows but y has 30"),
    ({}, ["--loss", "mse"], "mse takes float targets"),
    ({}, ["--micro-batches", "3", "--batch-size", "8"], "does not split into 3"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, capsys, arrays: dict,
                                                  flags: list[str], says: str) -> None:
    folder = _mlp_data(tmp_path, **arrays)
    argv = ["train", str(folder / "cnn.onnx"), "--data", str(folder / "digits.npz"),
            "--labels", "y", "--devices", "cpu:2", "--batch-size", "8",
            "-o", str(folder / "out.onnx"), *flags]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert not (folder / "out.onnx").exists()


def test_a_model_without_weights_is_refused(tmp_path: Path, capsys) -> None:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "bare",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                             ["n", 3])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT,
                                                             ["n", 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=9), tmp_path / "bare.onnx")
    np.savez(tmp_path / "d.npz", x=np.zeros((8, 3), np.float32), y=np.zeros(8, np.int64))
    assert main(["train", str(tmp_path / "bare.onnx"), "--data", str(tmp_path / "d.npz"),
                 "--labels", "y", "--devices", "cpu:1", "--batch-size", "4",
                 "-o", str(tmp_path / "out.onnx")]) == 1
    err = capsys.readouterr().err.strip()
    assert "bare has no trainable weights" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out.onnx").exists()


def test_an_output_that_cannot_be_written_is_refused_before_training(tmp_path: Path,
                                                                     capsys) -> None:
    folder = _mlp_data(tmp_path)
    assert main(["train", str(folder / "cnn.onnx"), "--data", str(folder / "digits.npz"),
                 "--labels", "y", "--devices", "cpu:1", "--batch-size", "8",
                 "-o", str(tmp_path / "nowhere" / "out.onnx")]) == 1
    assert "no folder" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--optimizer", "lbfgs"], ["--schedule", "zigzag"],
                                   ["--lr", "0"], ["--micro-batches", "0"], ["--tui", "--web"]])
def test_bad_flags_are_usage_errors(tmp_path: Path, capsys, flags: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["train", "m.onnx", "--data", "d.npz", "--labels", "y", "--devices", "cpu:1",
              "-o", str(tmp_path / "o.onnx"), *flags])
    assert info.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
