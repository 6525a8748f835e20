"""`prism ...`: the command line. Errors print as one line, never a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from rich.console import Console

from runtime.errors import PrismError
from runtime.partition import MODES

stderr = Console(stderr=True)


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="path to an .onnx file (run and bench: or a .prism bundle)")
    parser.add_argument("--devices", required=True,
                        help="cpu:4, cpu:2,sim:4:mem=64MB, or a TOML file with a table per device")
    parser.add_argument("--partition", metavar="MODE",
                        help=f"{', '.join(MODES)}, or a TOML/JSON node -> partition map "
                             "(user mode); default balanced")
    parser.add_argument("--bind", action="append", default=[], metavar="DIM=N",
                        help="value of a symbolic dimension for costing (default 1)")
    parser.add_argument("--annotate", metavar="FILE.toml",
                        help="placement: [nodes] name = device/kind, [ops] op = device/kind, "
                             "fallback = device")
    parser.add_argument("--fallback", metavar="DEVICE",
                        help="device for nodes their preferred device cannot run")


def _add_serving_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-batch", type=int, metavar="N",
                        help="dynamic batching: largest batch")
    parser.add_argument("--max-delay-ms", type=float, default=1.0, metavar="D",
                        help="dynamic batching: longest wait for a fuller batch (default 1)")
    parser.add_argument("--replicas", metavar="N|saturate",
                        help="whole copies of the plan on twin devices (default 1, or a "
                             "bundle's own)")


def _add_remap_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--remap", action="append", default=[], metavar="OLD=NEW",
                        help="a bundle: run what it placed on device OLD on this host's NEW "
                             "(default: devices matched by kind, memory and ops)")


class _Versions(argparse.Action):
    """`prism --version`: Prism's version and its dependencies', one per line."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from runtime.versions import versions

        found = versions()
        width = max(map(len, found))
        sys.stdout.write("".join(f"{name:<{width}}  {v}\n" for name, v in found.items()))
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prism", description="Partition an ONNX network over several devices and run it.")
    parser.add_argument("--version", action=_Versions,
                        help="print the versions of Prism, Python, onnx, onnxruntime, numpy, "
                             "textual and streamlit, and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    part = sub.add_parser("partition", help="plan how a model splits over devices")
    _add_model_args(part)
    part.add_argument("--json", action="store_true", help="print the plan as JSON")
    part.add_argument("--dot", metavar="FILE", help="write the plan as Graphviz to FILE")
    part.add_argument("--steps", action="store_true", help="print every partitioner step")
    part.add_argument("--explain", metavar="NODE", action="append", default=[],
                      help="print where NODE went and why")
    part.add_argument("--memory-plan", action="store_true",
                      help="print each device's activation memory plan")
    part.set_defaults(handler="app.partition_cmd:run")

    run = sub.add_parser("run", help="run a model under load and report latency")
    _add_model_args(run)
    run.add_argument("--requests", type=int, default=100, metavar="N")
    run.add_argument("--concurrency", type=int, default=4, metavar="C",
                     help="clients, each waiting for its answer (closed loop)")
    run.add_argument("--check", action="store_true",
                     help="compare every answer with the whole model in plain onnxruntime")
    run.add_argument("--record", metavar="FILE.jsonl", help="record every event to a file")
    run.add_argument("--inputs", metavar="FILE.npz", help="feeds to use instead of random ones")
    run.add_argument("--rate", type=float, metavar="R",
                     help="open loop: Poisson arrivals at R requests/s instead of clients")
    _add_serving_args(run)
    _add_remap_arg(run)
    run.set_defaults(handler="app.run_cmd:run")

    bench = sub.add_parser("bench", help="Prism against plain onnxruntime under the same load")
    _add_model_args(bench)
    bench.add_argument("--requests", type=int, default=1000, metavar="N")
    bench.add_argument("--concurrency", type=int, default=8, metavar="C",
                       help="closed-loop clients, for both runtimes")
    bench.add_argument("--json", action="store_true", help="print the figures as JSON")
    _add_serving_args(bench)
    _add_remap_arg(bench)
    bench.set_defaults(handler="app.bench_cmd:run")

    prof = sub.add_parser("profile", help="record every tensor's range over calibration "
                                          "samples (the first phase of quantization)")
    prof.add_argument("model", help="path to a float .onnx file")
    prof.add_argument("--inputs", required=True, metavar="DATA.npz",
                      help="one array per model input, samples along the first axis")
    prof.add_argument("-o", "--output", required=True, metavar="PROFILE.json")
    prof.add_argument("--method", default="minmax", choices=("minmax", "entropy", "percentile"),
                      help="calibration method (default minmax)")
    prof.add_argument("--json", action="store_true", help="print the summary as JSON")
    prof.set_defaults(handler="app.profile_cmd:run")

    quant = sub.add_parser("quantize", help="quantize a float model to int8 "
                                            "(onnxruntime's static quantizer)")
    quant.add_argument("model", help="path to a float .onnx file")
    source = quant.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile", metavar="PROFILE.json", help="ranges from prism profile")
    source.add_argument("--calibrate", metavar="DATA.npz", help="profile and quantize at once")
    quant.add_argument("-o", "--output", required=True, metavar="OUT.onnx")
    quant.add_argument("--format", default="qdq", choices=("qdq", "qoperator"),
                       help="QuantizeLinear/DequantizeLinear pairs (default) or QLinear ops")
    quant.add_argument("--activations", default="uint8", choices=("uint8", "int8"),
                       help="activation type (default uint8: 1.3-2x faster here than float; "
                            "int8 was slower than float)")
    quant.add_argument("--weights", default="int8", choices=("uint8", "int8"))
    quant.add_argument("--per-tensor", action="store_true",
                       help="one weight scale per tensor (default: per output channel)")
    quant.add_argument("--method", default="minmax", choices=("minmax", "entropy", "percentile"),
                       help="calibration method with --calibrate (default minmax)")
    quant.add_argument("--exclude", action="append", default=[], metavar="NODE",
                       help="keep this node in float (repeatable)")
    quant.add_argument("--exclude-op", action="append", default=[], metavar="OP",
                       help="keep every node of this op type in float (repeatable)")
    quant.add_argument("--accuracy-budget", metavar="B",
                       help="e.g. 1%%: return the fewest nodes to float to stay within it")
    quant.add_argument("--metric", default="auto", metavar="M",
                       help="auto (top1 for classifiers, else max-rel), top1, max-rel, "
                            "FILE.py:FUNCTION or module:function")
    quant.add_argument("--holdout", type=float, default=0.25, metavar="F",
                       help="share of the calibration samples held out for the budget "
                            "(default 0.25)")
    quant.add_argument("--devices", metavar="SPEC", help="per-device precision: keep in float "
                       "what a plan over these devices puts on devices without int8")
    quant.add_argument("--partition", default="balanced", metavar="MODE",
                       help="with --devices: balanced (default) or memory")
    quant.add_argument("--json", action="store_true", help="print the summary as JSON")
    quant.set_defaults(handler="app.quantize_cmd:run")

    tui = sub.add_parser("tui", help="terminal dashboard: watch the runtime live, step "
                                     "through the partitioner")
    tui.add_argument("model", nargs="?", help="path to an .onnx file or a .prism bundle "
                                              "(default: a bundled sample CNN)")
    tui.add_argument("--devices", help="device spec (default cpu:2,sim:2:mem=256MB; for a "
                                       "bundle, the kinds it was compiled for)")
    tui.add_argument("--partition", default="balanced", choices=("balanced", "memory"),
                     metavar="MODE", help="balanced (default) or memory (a bundle keeps "
                                          "the mode it was compiled in)")
    tui_load = tui.add_mutually_exclusive_group()
    tui_load.add_argument("--rate", type=float, metavar="R",
                          help="open-loop load, requests per second (default 150)")
    tui_load.add_argument("--concurrency", type=int, metavar="C",
                          help="closed-loop load: C clients, each waiting for its answer")
    tui.add_argument("--replay", metavar="FILE.jsonl",
                     help="show a recorded run instead of running (MODEL and --devices "
                          "should be those it was recorded with)")
    tui.add_argument("--seed", type=int, default=None, help="seed for the load's inputs")
    tui.set_defaults(handler="app.tui_cmd:run")

    web = sub.add_parser("web", help="the live dashboard in a browser (Streamlit)")
    web.add_argument("model", nargs="?", help="path to an .onnx file or a .prism bundle "
                                              "(default: a bundled sample)")
    web.add_argument("--devices", metavar="SPEC",
                     help="cpu:4, cpu:2,sim:4:mem=64MB, or a TOML file (default: cpu:2,sim:2; "
                          "for a bundle, the kinds it was compiled for)")
    web.add_argument("--port", type=int, default=0, metavar="P",
                     help="port on 127.0.0.1 (default: a free one)")
    web.set_defaults(handler="app.web_cmd:run")

    comp = sub.add_parser("compile", help="partition and compile a model ahead of time into "
                                          "one bundle file (NAME.prism)")
    _add_model_args(comp)
    _add_serving_args(comp)
    comp.add_argument("-o", "--output", required=True, metavar="NAME.prism",
                      help="the bundle to write")
    comp.add_argument("--json", action="store_true", help="print the bundle's manifest as JSON")
    comp.set_defaults(handler="app.bundle_cmd:compile_command")
    export = sub.add_parser("export-onnx", help="a bundle's whole network as one ONNX file, "
                                                "each node tagged with its partition and device")
    export.add_argument("bundle", help="a .prism bundle")
    export.add_argument("-o", "--output", required=True, metavar="FILE.onnx")
    export.set_defaults(handler="app.bundle_cmd:export_command")

    conf = sub.add_parser("conformance", help="ONNX's backend test suite through Prism, "
                                              "onnxruntime and the reference evaluator")
    conf.add_argument("--suite", default="all",
                      choices=("node", "simple", "pytorch-converted", "pytorch-operator",
                               "real", "all"), help="which tests (default all)")
    conf.add_argument("--devices", metavar="SPEC",
                      help="Prism's devices (default cpu:2 plus a reference fallback)")
    conf.add_argument("--json", action="store_true", help="print results as JSON")
    conf.add_argument("-k", metavar="PATTERN", help="only tests whose name matches (regex)")
    conf.add_argument("--runtimes", default="prism,onnxruntime,reference", metavar="LIST",
                      help="comma list of prism, onnxruntime, reference (default all three)")
    conf.add_argument("--timeout", type=float, default=20.0, metavar="S",
                      help="seconds a test may take before it counts as failed (default 20)")
    conf.add_argument("--failures", action="store_true",
                      help="list every test Prism fails, with its error")
    conf.set_defaults(handler="app.conformance_cmd:run")
    return parser


def _handler(path: str) -> Callable[[argparse.Namespace], int]:
    module, name = path.split(":")
    return getattr(__import__(module, fromlist=[name]), name)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _handler(args.handler)(args) or 0
    except PrismError as exc:
        stderr.print(f"[bold red]prism: error:[/] {exc}", highlight=False, soft_wrap=True)
    except KeyboardInterrupt:
        stderr.print("prism: interrupted")
        return 130
    except Exception as exc:  # the CLI never shows a traceback
        stderr.print(f"[bold red]prism: internal error:[/] {type(exc).__name__}: {exc}",
                     highlight=False, soft_wrap=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
