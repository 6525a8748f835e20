"""Mutated sample models for the command-line fuzz test: each a hostile-but-fair file.

`mutant(rng)` picks a sample model and one mutation (byte flips, a truncated file, a
deleted, duplicated or rewired node, a renamed tensor, a changed attribute, op type,
input type, weight or opset) and returns (what was done, the file's bytes). Values stay small:
the fuzz looks for errors that escape, not for models that merely ask for a lot of memory.

`python -m tests.support.mutants SEED COUNT FOLDER SECONDS`, from the repository root,
runs COUNT cases through the CLI (`drive`); tests/cli/test_fuzz_cli.py starts it and
judges every outcome.
"""

from __future__ import annotations

import functools
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import AttributeProto, TensorProto

from tests.support.dags import SAMPLE_NAMES, SAMPLES_DIR

OP_TYPES = ("Relu", "Add", "MatMul", "Gemm", "Conv", "Softmax", "Identity", "Transpose",
            "Concat", "Reshape", "Sigmoid", "Flatten", "If", "Loop", "NoSuchOp")
ELEM_TYPES = tuple(v for k, v in TensorProto.DataType.items() if k != "UNDEFINED")


@functools.cache
def _sample(name: str) -> bytes:
    return (SAMPLES_DIR / f"{name}.onnx").read_bytes()


def _graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """The graph and every subgraph in it (If branches, Loop bodies)."""
    out = [graph]
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == AttributeProto.GRAPH else attr.graphs):
                out += _graphs(sub)
    return out


def _tensor_names(graph: onnx.GraphProto) -> list[str]:
    names = {*(i.name for i in graph.input), *(t.name for t in graph.initializer)}
    names.update(t for n in graph.node for t in (*n.input, *n.output) if t)
    return sorted(names)


def flip_bytes(rng: random.Random, data: bytes, _model) -> tuple[str, bytes]:
    buf = bytearray(data)
    where = [rng.randrange(len(buf)) for _ in range(rng.randint(1, 8))]
    for i in where:
        buf[i] = rng.randrange(256)
    return f"bytes changed at {where}", bytes(buf)


def truncate(rng: random.Random, data: bytes, _model) -> tuple[str, bytes]:
    cut = rng.randrange(len(data))
    return f"truncated to {cut} bytes", data[:cut]


def delete_node(rng: random.Random, _data, model: onnx.ModelProto) -> str:
    graph = rng.choice(_graphs(model.graph))
    i = rng.randrange(len(graph.node))
    name = graph.node[i].name
    del graph.node[i]
    return f"deleted node {name}"


def duplicate_node(rng: random.Random, _data, model: onnx.ModelProto) -> str:
    graph = model.graph
    node = rng.choice(graph.node)
    graph.node.insert(rng.randrange(len(graph.node) + 1), node)
    return f"node {node.name} twice"


def rewire(rng: random.Random, _data, model: onnx.ModelProto) -> str:
    """Point an input at another tensor (mostly one made earlier, so the checker passes
    and the runtime meets the wrong shape), or an output at another name."""
    graph = rng.choice(_graphs(model.graph))
    at = rng.randrange(len(graph.node))
    node = graph.node[at]
    earlier = [i.name for i in model.graph.input] + [t for n in graph.node[:at] for t in n.output]
    names = earlier if rng.random() < 0.7 else [*_tensor_names(model.graph), "", "nowhere"]
    if node.input and rng.random() < 0.8:
        i = rng.randrange(len(node.input))
        node.input[i] = rng.choice(names)
        return f"input {i} of {node.name} -> {node.input[i]!r}"
    i = rng.randrange(len(node.output))
    node.output[i] = rng.choice(names)
    return f"output {i} of {node.name} -> {node.output[i]!r}"


def rename_tensor(rng: random.Random, _data, model: onnx.ModelProto) -> str:
    """Rename a tensor everywhere it appears, or in only some of those places."""
    old = rng.choice(_tensor_names(model.graph))
    new = rng.choice([f"{old}_renamed", "", "x", "[bold]x[/]", old.upper(), "é/ü:0"])
    everywhere = rng.random() < 0.5
    for graph in _graphs(model.graph):
        for holder in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
            if holder.name == old and (everywhere or rng.random() < 0.5):
                holder.name = new
        for node in graph.node:
            for names in (node.input, node.output):
                for i, name in enumerate(names):
                    if name == old and (everywhere or rng.random() < 0.5):
                        names[i] = new
    return f"renamed {old!r} -> {new!r} ({'everywhere' if everywhere else 'in places'})"


def _small_value(rng: random.Random, attr: AttributeProto) -> None:
    kind = attr.type
    if kind == AttributeProto.INT:
        attr.i = rng.choice([-2, -1, 0, 1, 2, 3, 7, attr.i + 1])
    elif kind == AttributeProto.FLOAT:
        attr.f = rng.choice([0.0, -1.0, 1e-12, 1e6, float("nan"), float("inf"), attr.f * 2])
    elif kind == AttributeProto.INTS:
        values = list(attr.ints) or [1]
        values = rng.choice([values[:-1], [*values, 1], [rng.randint(-2, 7) for _ in values]])
        del attr.ints[:]
        attr.ints.extend(values)
    elif kind == AttributeProto.STRING:
        attr.s = rng.choice([b"", b"NOTSET", b"[x]", b"\xff\xfe"])
    else:  # a graph, tensor or list: give it the wrong kind of value
        attr.ClearField("g")
        attr.type = AttributeProto.INT
        attr.i = 1


def change_attribute(rng: random.Random, _data, model: onnx.ModelProto) -> str:
    graph = rng.choice(_graphs(model.graph))
    nodes = [n for n in graph.node if n.attribute] or list(graph.node)
    node = rng.choice(nodes)
    choice = rng.random()
    if node.attribute and choice < 0.7:
        attr = rng.choice(node.attribute)
        _small_value(rng, attr)
        return f"attribute {attr.name} of {node.name} changed"
    if node.attribute and choice < 0.85:
        attr = rng.choice(node.attribute)
        node.attribute.remove(attr)
        return f"attribute {attr.name} of {node.name} removed"
    node.attribute.append(onnx.helper.make_attribute(rng.choice(["axis", "bogus", "alpha"]),
                                                     rng.choice([0, 2, 1.5, "x"])))
    return f"attribute added to {node.name}"


def change_op(rng: random.Random, _data, model: onnx.ModelProto) -> str:
    graph = rng.choice(_graphs(model.graph))
    node = rng.choice(graph.node)
    node.op_type = rng.choice(OP_TYPES)
    if rng.random() < 0.2:
        node.domain = rng.choice(["com.microsoft", "nowhere.org", "ai.onnx.ml"])
    return f"{node.name} is now {node.domain}.{node.op_type}"


def change_input(rng: random.Random, _data, model: onnx.ModelProto) -> str:
    value = rng.choice([*model.graph.input, *model.graph.output])
    tensor = value.type.tensor_type
    if rng.random() < 0.5:
        tensor.elem_type = rng.choice(ELEM_TYPES)
        return f"{value.name} has element type {tensor.elem_type}"
    if not tensor.shape.dim:
        tensor.shape.dim.add().dim_value = 1
    dim = rng.choice(tensor.shape.dim)
    if rng.random() < 0.5:
        dim.dim_value = rng.choice([0, 1, 2, 3, 5])
    else:
        dim.dim_param = rng.choice(["batch", "n", "[n]", ""])
    return f"{value.name} has dims {[d.dim_value or d.dim_param for d in tensor.shape.dim]}"


def change_opset(rng: random.Random, _data, model: onnx.ModelProto) -> str:
    opset = rng.choice(model.opset_import)
    opset.version = rng.choice([1, 6, 11, 13, 999, opset.version - 1, opset.version + 1])
    if rng.random() < 0.2:
        model.ir_version = rng.choice([0, 3, 99])
    return f"opset {opset.domain or 'ai.onnx'} {opset.version}, IR {model.ir_version}"


def change_weight(rng: random.Random, _data, model: onnx.ModelProto) -> str:
    """An initializer whose dims, type or data no longer agree with each other."""
    weight = rng.choice(model.graph.initializer)
    choice = rng.random()
    if choice < 0.4 and weight.dims:
        i = rng.randrange(len(weight.dims))
        weight.dims[i] = rng.choice([0, 1, 2, weight.dims[i] + 1, weight.dims[i] * 2])
        return f"weight {weight.name} has dims {list(weight.dims)}"
    if choice < 0.7:
        weight.data_type = rng.choice(ELEM_TYPES)
        return f"weight {weight.name} has element type {weight.data_type}"
    weight.raw_data = weight.raw_data[: rng.randrange(len(weight.raw_data) + 1)]
    return f"weight {weight.name} has {len(weight.raw_data)} bytes of data"


ON_BYTES: tuple[Callable, ...] = (flip_bytes, truncate)
ON_MODEL: tuple[Callable, ...] = (delete_node, duplicate_node, rewire, rename_tensor,
                                  change_attribute, change_op, change_input, change_opset,
                                  change_weight)


def mutant(rng: random.Random) -> tuple[str, bytes]:
    """(sample: what was done, the mutated file's bytes)."""
    name = rng.choice(SAMPLE_NAMES)
    data = _sample(name)
    mutation = rng.choice(ON_BYTES + ON_MODEL * 2)  # the model-level ones twice as often
    if mutation in ON_BYTES:
        what, data = mutation(rng, data, None)
    else:
        model = onnx.load_from_string(data)
        what = mutation(rng, data, model)
        data = model.SerializeToString()
    return f"{name}: {what}", data


# -- the driver: cases in one child process, so a crash names its case --------------------


def _call(argv: list[str], seconds: float) -> tuple[int | None, str, str]:
    """`main(argv)` in-process with fds 1 and 2 caught (onnxruntime writes to them from
    C++), bounded by `seconds`: (exit status or None if it still runs, stdout, stderr)."""
    from app.cli import main

    box: dict = {}

    def call() -> None:
        try:
            box["code"] = main(argv)
        except SystemExit as done:
            box["code"] = done.code
        except BaseException as exc:  # counted as an escape: main must catch everything
            box["code"], box["raised"] = -1, f"{type(exc).__name__}: {exc}"

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        saved = os.dup(1), os.dup(2)
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(out.fileno(), 1), os.dup2(err.fileno(), 2)
        try:
            worker = threading.Thread(target=call, daemon=True)
            worker.start()
            worker.join(seconds)
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])
        out.seek(0), err.seek(0)
        text = err.read() + (f"\nraised {box['raised']}" if "raised" in box else "")
        return box.get("code"), out.read(), text


def drive(seed: int, count: int, folder: Path, seconds: float) -> None:
    """Each case: one mutant through `prism partition`, then, if it planned, `prism run
    --requests 2`. One JSON line per call in folder/results.jsonl, and a `start` line
    before it, so a crash or hang is known by its case."""
    rng = random.Random(seed)
    with open(folder / "results.jsonl", "w") as log:
        for case in range(count):
            what, data = mutant(rng)
            path = folder / f"case{case}.onnx"
            path.write_bytes(data)
            devices = rng.choice(["cpu:2", "cpu:1,sim:1", "cpu:1,reference:1"])
            for argv in (["partition", str(path), "--devices", devices],
                         ["run", str(path), "--devices", devices, "--requests", "2"]):
                record = {"case": case, "what": what, "argv": argv}
                log.write(json.dumps({**record, "start": True}) + "\n")
                log.flush()
                start = time.perf_counter()
                code, out, err = _call(argv, seconds)
                record.update(code=code, stdout=out[-2000:], stderr=err,
                              seconds=round(time.perf_counter() - start, 3))
                log.write(json.dumps(record) + "\n")
                log.flush()
                if code is None:
                    os._exit(3)  # a hung call holds the runtime: stop here
                if code != 0:
                    break
            else:
                path.unlink()  # keep only the files of cases that failed


if __name__ == "__main__":
    drive(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4]))
