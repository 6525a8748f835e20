"""Where the time goes: onnxruntime's profiler, float against `prism quantize`'s int8.

    .venv/bin/python -m benchmarks.op_profile resnet [--batch 1] [--runs 300] [--nodes]
    .venv/bin/python -m benchmarks.op_profile cnn --convs

Quantizes a benchmark model as benchmarks/quantized.py does, runs both versions in a
1-thread onnxruntime session with Prism's session options and profiling on, and prints
the kernel time per op type as onnxruntime ran them (after its fusions and layout
passes: QLinearConv, NCHWc Conv, Transpose, ...), the median over the runs of each node
(the first third dropped as warm-up), and the median run time. The profiler adds about
3 us to every kernel it times (a chain of tiny Relu kernels, measured first, is timed
with and without it); the `net` columns take that off. Absolute latency comes from
benchmarks/quantized.py.

`--convs` times one convolution of each shape the model chains (group 1, stride 1, as
many channels out as in) in float and in int8 without the profiler: chains of 1 and 5
Conv -> Relu of that shape, quantized the same way, their interleaved median run times'
difference over 4.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console
from rich.table import Table

from benchmarks.common import median_seconds
from benchmarks.quantized import MODELS, interleaved
from runtime.devices.ort.options import profiled_run, session_options
from runtime.graph import load_graph
from runtime.quantize import QuantizeOptions, calibrate, check_samples, prepare

Kernels = dict[str, tuple[str, float]]  # node -> (op type, median us)


def profile(model: onnx.ModelProto, feeds: dict[str, np.ndarray], runs: int
            ) -> tuple[Kernels, float]:
    """Each kernel's median time and the median run time, in microseconds."""
    events = profiled_run(model.SerializeToString(), feeds, runs)
    times: dict[str, list[float]] = defaultdict(list)
    ops: dict[str, str] = {}
    runs_us: list[float] = []
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            node = e["name"].removesuffix("_kernel_time")
            times[node].append(e["dur"])
            ops[node] = e["args"].get("op_name", "?")
        elif e.get("cat") == "Session" and e["name"] == "model_run":
            runs_us.append(e["dur"])
    keep = runs // 3
    return ({n: (ops[n], float(np.median(v[keep:]))) for n, v in times.items()},
            float(np.median(runs_us[keep:])))


def profiler_cost(kernels: int = 40) -> float:
    """Microseconds the profiler adds to each kernel: a chain of 1-element Relus, its
    profiled kernel times against its unprofiled run time per kernel."""
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(kernels)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info(
        "t0", TensorProto.FLOAT, [1])], [helper.make_tensor_value_info(
        f"t{kernels}", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    feeds = {"t0": np.ones(1, np.float32)}
    short = helper.make_model(helper.make_graph(nodes[:1], "one", graph.input, [
        helper.make_tensor_value_info("t1", TensorProto.FLOAT, [1])]), opset_imports=[
        helper.make_opsetid("", 17)], ir_version=9)
    plain = {k: ort.InferenceSession(m.SerializeToString(), session_options(1),
                                     providers=["CPUExecutionProvider"])
             for k, m in (("chain", model), ("one", short))}
    each = (median_seconds(lambda: plain["chain"].run(None, feeds), 2000) -
            median_seconds(lambda: plain["one"].run(None, feeds), 2000)) / (kernels - 1)
    profiled, _ = profile(model, feeds, 600)
    return float(np.median([us for _, us in profiled.values()])) - each * 1e6


def conv_chain(channels: int, size: int, kernel: int, length: int) -> onnx.ModelProto:
    """`length` Conv (channels -> channels, kernel x kernel, same size) -> Relu in a row."""
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(length):
        weights += [numpy_helper.from_array((rng.standard_normal(
            (channels, channels, kernel, kernel)) / (channels * kernel) ).astype(np.float32),
            f"w{i}"), numpy_helper.from_array(rng.standard_normal(channels).astype(
                np.float32) * 0.1, f"b{i}")]
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"],
                                   pads=[kernel // 2] * 4),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x = f"r{i}"
    shape = [1, channels, size, size]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
            x, TensorProto.FLOAT, shape)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def conv_shapes(path: str) -> list[tuple[int, int, int]]:
    """(channels, size, kernel) of each group-1 stride-1 Conv keeping its channel count."""
    graph = load_graph(prepare(path))
    found = []
    for node in graph.nodes:
        a = node.attributes
        w = graph.tensors[node.inputs[1]].shape if node.op_type == "Conv" else None
        x = graph.tensors[node.inputs[0]].shape if w else None
        if w and w[0] == w[1] and w[2] == w[3] and a.get("group", 1) == 1 and \
                set(a.get("strides", [1])) == {1} and x[2] == x[3]:
            found.append((w[0], x[2], w[2]))
    return sorted(set(found), key=found.index)


def time_convs(path: str, runs: int) -> Table:
    table = Table(title=f"{path}: one convolution (+ Relu), float and int8, batch 1, 1 "
                        f"thread (us; chains of 5 less chains of 1, over 4)")
    for column in ("channels", "size", "kernel", "float", "int8", "float / int8"):
        table.add_column(column, justify="right")
    for channels, size, kernel in conv_shapes(path):
        models = {}
        for length in (1, 5):
            chain = conv_chain(channels, size, kernel, length)
            data = np.random.default_rng(1).standard_normal((16, channels, size, size))
            with calibrate(chain, check_samples({"x": data.astype(np.float32)},
                                                load_graph(chain), "random")) as c:
                models[f"float{length}"], models[f"int8{length}"] = c.prepared, c.quantize(
                    QuantizeOptions(narrow_float=False))
        sessions = {k: ort.InferenceSession(m.SerializeToString(), session_options(1),
                                            providers=["CPUExecutionProvider"])
                    for k, m in models.items()}
        feeds = {"x": np.random.default_rng(2).standard_normal(
            (1, channels, size, size)).astype(np.float32)}
        t = interleaved({k: (lambda s=s, f=feeds: s.run(None, f)) for k, s in sessions.items()},
                        runs)
        each = {p: (t[f"{p}5"][0] - t[f"{p}1"][0]) / 4 * 1e6 for p in ("float", "int8")}
        table.add_row(str(channels), f"{size}x{size}", f"{kernel}x{kernel}",
                      f"{each['float']:.1f}", f"{each['int8']:.1f}",
                      f"{each['float'] / each['int8']:.2f}")
    return table


def _by_op(kernels: Kernels) -> dict[str, tuple[int, float]]:
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for op, us in kernels.values():
        out[op][0] += 1
        out[op][1] += us
    return {op: (n, us) for op, (n, us) in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--nodes", action="store_true", help="also list every int8 kernel")
    parser.add_argument("--convs", action="store_true",
                        help="time one convolution of each shape instead, float and int8")
    args = parser.parse_args()
    path = MODELS[args.model]
    if args.convs:
        Console().print(time_convs(path, args.runs))
        return
    graph = load_graph(path)
    name = graph.inputs[0]
    rng = np.random.default_rng()
    shape = graph.tensors[name].shape[1:]
    with calibrate(path, check_samples({name: rng.standard_normal((32, *shape)).astype(
            np.float32)}, graph, "random")) as c:
        models = {"float": c.prepared, "int8": c.quantize()}
    feeds = {name: rng.standard_normal((args.batch, *shape)).astype(np.float32)}
    found = {k: profile(m, feeds, args.runs) for k, m in models.items()}
    cost = profiler_cost()
    table = Table(title=f"{args.model}, batch {args.batch}, 1 thread: kernel time per op "
                        f"type (us, median of {args.runs} runs; net: less {cost:.1f} us of "
                        f"profiler per kernel)")
    table.add_column("op type")
    for k in found:
        for what in (f"{k} n", "us", "net"):
            table.add_column(what, justify="right")
    ops = {k: _by_op(kernels) for k, (kernels, _) in found.items()}
    order = sorted({op for o in ops.values() for op in o},
                   key=lambda op: -max(o.get(op, (0, 0.0))[1] for o in ops.values()))

    def cells(count: int, us: float) -> tuple[str, str, str]:
        return (str(count), f"{us:.0f}", f"{max(us - count * cost, 0):.0f}") if count else (
            "", "", "")

    for op in order:
        table.add_row(op, *(c for k in found for c in cells(*ops[k].get(op, (0, 0.0)))))
    table.add_row("all", *(c for k in found for c in cells(
        len(found[k][0]), sum(us for _, us in found[k][0].values()))))
    table.add_row("run", *(c for k in found for c in ("", f"{found[k][1]:.0f}", "")))
    console = Console()
    console.print(table)
    if args.nodes:
        for node, (op, us) in found["int8"][0].items():
            console.print(f"{us:8.1f}  {op:26} {node}", highlight=False)


if __name__ == "__main__":
    main()
