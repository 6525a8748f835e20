"""Kernel probes are kept in the user's cache: a later process reads back what an earlier
one found, refusals included, and a damaged or unwritable cache only costs probing again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from runtime.devices.ort import kept_probes

ROOT = Path(__file__).parents[2]

# Loads the model at argv[1] and prints what onnxruntime's CPU provider makes of each node,
# and how many probe sessions that took.
PLACE = """
import json, sys
from runtime.devices.ort import kernels
from runtime.graph import load_graph
made, probed = [], kernels._probed
kernels._probed = lambda *args: made.append(args) or probed(*args)
graph = load_graph(sys.argv[1])
problems = {n.name: kernels.ort_problem(n, graph) for n in graph.nodes}
print(json.dumps({"probes": len(made), "problems": problems}))
"""


def _model(path: Path) -> None:
    """An LRN of even size (onnxruntime's kernel refuses it as it initialises) between two
    nodes it runs; a random shape, so no earlier run of the suite probed these."""
    rng = np.random.default_rng()
    shape = [1, int(rng.integers(2, 64)), int(rng.integers(2, 64)), 3]
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("LRN", ["r"], ["n"], name="lrn", size=2),
         helper.make_node("Sigmoid", ["n"], ["y"], name="sigmoid")], "probed",
        [helper.make_tensor_value_info("x", f, shape)],
        [helper.make_tensor_value_info("y", f, shape)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _place(model: Path, cache: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", PLACE, str(model)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PRISM_CACHE_DIR": str(cache)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_later_process_reads_back_what_probes_found_refusals_included(tmp_path):
    _model(tmp_path / "m.onnx")
    first = _place(tmp_path / "m.onnx", tmp_path / "cache")
    assert first["probes"] == 3
    assert first["problems"]["relu"] is None and first["problems"]["sigmoid"] is None
    assert "LRN" in first["problems"]["lrn"] and "size" in first["problems"]["lrn"]
    later = _place(tmp_path / "m.onnx", tmp_path / "cache")
    assert later == {"probes": 0, "problems": first["problems"]}


def test_a_damaged_or_unwritable_cache_costs_probing_again_and_nothing_else(tmp_path):
    _model(tmp_path / "m.onnx")
    first = _place(tmp_path / "m.onnx", tmp_path / "cache")
    kept = next((tmp_path / "cache" / "probes").iterdir())
    lines = kept.read_text().splitlines()
    probe, error = json.loads(lines[0])
    kept.write_text("\n".join(["not json", json.dumps([probe, 3]), '{"a": 1}', "[1, 2, 3]",
                               *lines[1:], lines[0][:-5]]) + "\n")
    again = _place(tmp_path / "m.onnx", tmp_path / "cache")
    assert again == {"probes": 1, "problems": first["problems"]}
    assert json.loads(kept.read_text().splitlines()[-1]) == [probe, error]  # kept anew
    blocked = tmp_path / "a file"
    blocked.write_text("")  # the cache directory cannot be made
    assert _place(tmp_path / "m.onnx", blocked) == {"probes": 3, "problems": first["problems"]}


def test_a_file_grown_past_its_limit_is_started_anew(tmp_path, monkeypatch):
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kept_probes, "LIMIT", 1000)
    path = kept_probes._path()
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps([f"{i:032x}", None]) + "\n" for i in range(40)))
    assert kept_probes.found(f"{1:032x}") is None
    assert not path.exists()
    kept_probes.keep("a" * 32, "refused")
    assert kept_probes.found("a" * 32) == ("refused",)
    assert path.read_text() == json.dumps(["a" * 32, "refused"], separators=(",", ":")) + "\n"


def test_only_the_probes_looked_up_are_decoded(tmp_path, monkeypatch):
    """Decoding every line of a well-used file (112,000 probes) took 0.2 s of each new
    process's first load, more than the probes it saved on a small network."""
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng()
    keys = [f"{int(k):032x}" for k in rng.choice(1 << 60, 2000, replace=False)]
    errors = [None if rng.random() < 0.5 else f"refused {i}" for i in range(len(keys))]
    path = kept_probes._path()
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in zip(keys, errors, strict=True)))
    decoded = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda text, **kw: decoded.append(text) or loads(text, **kw))
    looked_up = rng.choice(len(keys), 3, replace=False)
    assert [kept_probes.found(keys[i]) for i in looked_up] == [(errors[i],) for i in looked_up]
    assert kept_probes.found("f" * 32) is None
    assert len([text for text in decoded if text.startswith("[")]) == 3
