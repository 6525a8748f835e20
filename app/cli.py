"""`prism ...`: the command line. Errors print as one line, never a traceback.

This module is the console script's entry point, so its top level stays light: the
runtime (numpy, onnx, onnxruntime: about half a second) is imported inside `main`'s
error handling, where a Ctrl-C during the imports is a one-line "interrupted" too.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from app.paths import OutputError, check_outputs

MAX_CLIENTS = 10_000  # --concurrency: each client is a callback chain and queue places
MAX_DELAY_MS = 60_000  # --max-delay-ms: a batch never waits over a minute
MAX_DIM = 2**31 - 1  # --bind: a dimension ONNX Runtime and numpy index without overflow
MAX_QUEUE = 1_000_000  # serve --max-queue: each waiting request holds its feeds
MAX_BODY_MB = 1 << 20  # serve --max-body-mb: 1 TiB, past any one request
MAX_CONNECTIONS = 1_000_000  # serve --max-connections: past any one process's files
MAX_SECONDS = 3600.0  # serve's timeouts and grace period: an hour at most


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """A bad flag is one line too (exit status 2, argparse's usage error)."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(kind: type, low: float, high: float | None = None, *, above: bool = False
            ) -> Callable[[str], Any]:
    """An argparse type: a finite number of `kind` from `low` (or above it) to `high`."""
    what = "a whole number" if kind is int else "a number"
    bound = (f"above {low}" if above else f"of at least {low}") if high is None \
        else f"above {low} and at most {high}" if above else f"from {low} to {high}"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or (kind is float and not math.isfinite(value)) or value < low \
                or (above and value == low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {what} {bound}, got {text!r}")
        return value

    return parse


def _replicas(text: str) -> int | str:
    from runtime.partition.replicas import FILL

    if text in FILL:
        return text
    try:
        return _number(int, 1)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, "
                                         f"'saturate' or 'auto', got {text!r}") from None


def _pattern(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression: {exc}") from None
    return text


def _binding(text: str) -> str:
    name, _, value = text.partition("=")
    if not name or not value.isascii() or not value.isdigit() or int(value) > MAX_DIM:
        raise argparse.ArgumentTypeError(f"takes DIM=N with N a whole number from 0 to "
                                         f"{MAX_DIM}, got {text!r}")
    return text


def _shape(text: str) -> str:
    name, _, dims = text.rpartition("=")
    sizes = dims.split(",")
    if not name or not all(d.isascii() and d.isdigit() and int(d) <= MAX_DIM
                           for d in sizes):
        raise argparse.ArgumentTypeError(f"takes INPUT=D,D,... with each D a whole number "
                                         f"from 0 to {MAX_DIM}, got {text!r}")
    return text


def _add_model_args(parser: argparse.ArgumentParser, required: bool = True,
                    bundles: bool = False) -> None:
    """`bundles`: MODEL may be a .prism bundle, which needs no --devices."""
    from runtime.partition import MODES

    parser.add_argument("model", help="path to an .onnx file" + " or a .prism bundle" * bundles,
                        nargs=None if required else "?")
    parser.add_argument("--devices", required=required and not bundles,
                        help="cpu:4, cpu:2,sim:4:mem=64MB, or a TOML file with a table per device"
                             + "; a bundle: by default, devices like those it was compiled for"
                             * bundles)
    parser.add_argument("--partition", metavar="MODE",
                        help=f"{', '.join(MODES)}, or a TOML/JSON node -> partition map "
                             "(user mode); default balanced")
    _add_bind_arg(parser)
    parser.add_argument("--annotate", metavar="FILE.toml",
                        help="placement: [nodes] name = device/kind, [ops] op = device/kind, "
                             "fallback = device, or name = device/kind for a node or an op")
    parser.add_argument("--fallback", metavar="DEVICE",
                        help="device for nodes their preferred device cannot run")
    _add_costs_arg(parser)
    _add_ray_arg(parser)


def _add_bind_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", action="append", default=[], metavar="DIM=N", type=_binding,
                        help="value of a symbolic dimension for costing and made-up inputs "
                             "(default 1; an image input's height and width 224)")


def _add_inputs_arg(parser: argparse.ArgumentParser, sent: bool = True) -> None:
    """`--inputs`: one request's feeds, which a model is costed at and measured on (and
    `sent`, the load sends in place of made-up ones): for a model that takes only some
    sizes or values."""
    parser.add_argument("--inputs", metavar="FILE.npz",
                        help="one request's feeds" + " to send instead of made-up ones" * sent
                             + "; a model is costed at their shapes and measured on their "
                               "values (one that takes only some sizes or values)")


def _add_costs_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--costs", choices=("measured", "model"), default=None,
                        help="what plans are made with: measured (default: cpu and ray "
                             "devices' node times timed on this machine at the first load, "
                             "then cached) or model (the roofline)")


def _add_ray_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ray-address", metavar="ADDR|auto",
                        help="ray devices join the Ray cluster at ADDR (auto: this machine's); "
                             "by default Prism starts a local one and stops it on exit")


def _add_serving_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-batch", type=_number(int, 1), metavar="N",
                        help="dynamic batching: largest batch")
    parser.add_argument("--max-delay-ms", type=_number(float, 0, MAX_DELAY_MS), default=1.0,
                        metavar="D", help="dynamic batching: longest wait for a fuller batch, "
                                          "in milliseconds (default 1)")
    parser.add_argument("--replicas", type=_replicas, metavar="N|saturate|auto",
                        help="whole copies of the plan on twin devices (default 1, or a "
                             "bundle's own); auto: the device share per copy that models "
                             "the most requests a second")


def _add_connect_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--connect", metavar="URL",
                        help="attach to a running `prism serve` (http://HOST:PORT) instead "
                             "of running a model here")
    parser.add_argument("--token", metavar="T", help="the server's token, if it asks for one")


def _add_remap_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--remap", action="append", default=[], metavar="OLD=NEW",
                        help="a bundle: run what it placed on device OLD on this host's NEW "
                             "(default: devices matched by kind, memory and ops)")


def _counts(text: str) -> list[int]:
    """`1,8,64` -> [1, 8, 64]: client counts, from 1 to MAX_CLIENTS."""
    one = _number(int, 1, MAX_CLIENTS)
    try:
        return [one(part) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"give whole numbers from 1 to {MAX_CLIENTS}, "
                                         f"comma-separated; got {text!r}") from None


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
    parser = _Parser(
        prog="prism", description="Partition an ONNX network over several devices and run it.")
    parser.add_argument("--version", action=_Versions,
                        help="print the versions of Prism, Python, onnx, onnxruntime, numpy, "
                             "textual and streamlit, and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    part = sub.add_parser("partition", help="plan how a model splits over devices")
    _add_model_args(part)
    _add_inputs_arg(part, sent=False)
    part.add_argument("--json", action="store_true", help="print the plan as JSON")
    part.add_argument("--dot", metavar="FILE", help="write the plan as Graphviz to FILE")
    part.add_argument("--steps", action="store_true", help="print every partitioner step")
    part.add_argument("--explain", metavar="NODE", action="append", default=[],
                      help="print where NODE went and why")
    part.add_argument("--memory-plan", action="store_true",
                      help="print each device's activation memory plan")
    part.set_defaults(handler="app.partition_cmd:run")

    run = sub.add_parser("run", help="run a model under load and report latency")
    _add_model_args(run, bundles=True)
    run.add_argument("--requests", type=_number(int, 1), default=100, metavar="N")
    run.add_argument("--concurrency", type=_number(int, 1, MAX_CLIENTS), default=4, metavar="C",
                     help="clients, each waiting for its answer (closed loop)")
    run.add_argument("--check", action="store_true",
                     help="compare every answer with the whole model in plain onnxruntime")
    run.add_argument("--record", metavar="FILE.jsonl", help="record every event to a file")
    run.add_argument("--trace", metavar="FILE.json",
                     help="write a Chrome trace of the run (Perfetto, chrome://tracing)")
    run.add_argument("--json", action="store_true", help="print the figures as JSON")
    _add_inputs_arg(run)
    run.add_argument("--rate", type=_number(float, 0, above=True), metavar="R",
                     help="open loop: Poisson arrivals at R requests/s instead of clients")
    _add_serving_args(run)
    _add_remap_arg(run)
    run.set_defaults(handler="app.run_cmd:run")

    bench = sub.add_parser("bench", help="Prism against plain onnxruntime under the same load, "
                                         "or a running server over HTTP (--url)")
    _add_model_args(bench, required=False, bundles=True)
    bench.add_argument("--requests", type=_number(int, 1), default=1000, metavar="N")
    bench.add_argument("--concurrency", type=_counts, default=[8], metavar="C[,C...]",
                       help="closed-loop clients, for both runtimes; with --url, one run per "
                            "level (e.g. 1,8,64)")
    bench.add_argument("--json", action="store_true", help="print the figures as JSON")
    _add_inputs_arg(bench)
    _add_serving_args(bench)
    _add_remap_arg(bench)
    bench.add_argument("--url", help="load a running `prism serve` (or any Open Inference "
                                     "Protocol server) at URL instead; MODEL is then --model")
    bench.add_argument("--model", dest="served_model", metavar="M",
                       help="with --url: the model to load (default: the one served)")
    bench.add_argument("--token", help="with --url: the server's bearer token "
                                       "(default: $PRISM_TOKEN)")
    bench.add_argument("--shape", action="append", default=[], type=_shape,
                       metavar="INPUT=D,D,...",
                       help="with --url: the shape to send an input in, for its variable (-1) "
                            "dimensions (default 1; an image's sides 224), as perf_analyzer's "
                            "--shape")
    bench.set_defaults(handler="app.bench_cmd:run")

    serve = sub.add_parser("serve", help="serve models over HTTP: the Open Inference Protocol "
                                         "(KServe v2, as Triton) and Prometheus /metrics")
    serve.add_argument("models", nargs="*", metavar="MODEL",
                       help=".onnx/.prism files, or names in the model repository "
                            "(default: every model in it)")
    serve.add_argument("--devices", required=True,
                       help="cpu:4, cpu:2,sim:4:mem=64MB, or a TOML file with a table per device")
    serve.add_argument("--trace", metavar="FILE.json",
                       help="write a Chrome trace of everything served, when it stops")
    serve.add_argument("--model-repository", metavar="DIR",
                       help="Triton's layout (DIR/NAME/VERSION/model.onnx) or flat "
                            "(DIR/NAME.onnx); the load API loads only from here")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1; any other needs --token "
                            "or --insecure)")
    serve.add_argument("--port", type=_number(int, 0, 65535), default=8000,
                       help="default 8000; 0: a free one")
    serve.add_argument("--token", help="require 'Authorization: Bearer TOKEN' on every request "
                                       "but the health probes (default: $PRISM_TOKEN)")
    serve.add_argument("--health-needs-token", action="store_true",
                       help="ask for the token on /v2/health/live and /ready too (default: "
                            "open, for load balancers' and Kubernetes' probes)")
    serve.add_argument("--insecure", action="store_true",
                       help="allow a non-loopback --host without a token")
    serve.add_argument("--partition", choices=("balanced", "memory"),
                       help="partition mode for the models loaded at start (default balanced, "
                            "or the model's config.pbtxt)")
    _add_costs_arg(serve)
    _add_serving_args(serve)
    serve.add_argument("--max-queue", type=_number(int, 1, MAX_QUEUE), default=1024,
                       metavar="N", help="requests that may wait (default 1024); more get 503")
    serve.add_argument("--max-body-mb", type=_number(float, 0, MAX_BODY_MB, above=True),
                       default=64.0, metavar="MB", help="largest request body (default 64)")
    serve.add_argument("--grace-seconds", type=_number(float, 0, MAX_SECONDS), default=30.0,
                       metavar="S", help="on SIGTERM or Ctrl-C: how long requests in flight "
                                         "may take to finish before the rest get 503 "
                                         "(default 30, as Triton's --exit-timeout-secs)")
    serve.add_argument("--header-timeout", type=_number(float, 0, MAX_SECONDS, above=True),
                       default=10.0, metavar="S",
                       help="seconds a request's headers may take to arrive (default 10); "
                            "then 408 and the connection closes")
    serve.add_argument("--body-timeout", type=_number(float, 0, MAX_SECONDS, above=True),
                       default=30.0, metavar="S",
                       help="seconds a request's body may pause (default 30); then 408")
    serve.add_argument("--max-connections", type=_number(int, 1, MAX_CONNECTIONS),
                       default=1000, metavar="N",
                       help="open connections at most (default 1000); more get 503")
    serve.set_defaults(handler="app.serve_cmd:run")

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
                       help="activation type (default uint8: 1.6-1.8x faster here than "
                            "float; int8 was slower than float)")
    quant.add_argument("--weights", default="int8", choices=("uint8", "int8"))
    quant.add_argument("--per-tensor", action="store_true",
                       help="one weight scale per tensor (default: per output channel)")
    quant.add_argument("--method", default="minmax", choices=("minmax", "entropy", "percentile"),
                       help="calibration method with --calibrate (default minmax)")
    quant.add_argument("--exclude", action="append", default=[], metavar="NODE",
                       help="keep this node in float (repeatable)")
    quant.add_argument("--exclude-op", action="append", default=[], metavar="OP",
                       help="keep every node of this op type in float (repeatable)")
    quant.add_argument("--quantize-narrow", action="store_true",
                       help="quantize convolutions on fewer than 8 input channels too (by "
                            "default they stay in float: onnxruntime runs them slower in int8)")
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

    _add_train(sub)

    tui = sub.add_parser("tui", help="terminal dashboard: watch the runtime live, step "
                                     "through the partitioner")
    tui.add_argument("model", nargs="?", help="path to an .onnx file or a .prism bundle "
                                              "(default: a bundled sample CNN)")
    tui.add_argument("--devices", help="device spec (default cpu:2,sim:2:mem=256MB; for a "
                                       "bundle, the kinds it was compiled for)")
    _add_ray_arg(tui)
    tui.add_argument("--partition", default="balanced", choices=("balanced", "memory"),
                     metavar="MODE", help="balanced (default) or memory (a bundle keeps "
                                          "the mode it was compiled in)")
    tui_load = tui.add_mutually_exclusive_group()
    tui_load.add_argument("--rate", type=_number(float, 0, above=True), metavar="R",
                          help="open-loop load, requests per second (default 150)")
    tui_load.add_argument("--concurrency", type=_number(int, 1, MAX_CLIENTS), metavar="C",
                          help="closed-loop load: C clients, each waiting for its answer")
    tui.add_argument("--replay", metavar="FILE.jsonl",
                     help="show a recorded run instead of running (MODEL and --devices "
                          "should be those it was recorded with)")
    tui.add_argument("--seed", type=_number(int, 0), default=None,
                     help="seed for the load's inputs")
    _add_bind_arg(tui)
    _add_inputs_arg(tui)
    _add_remap_arg(tui)
    _add_connect_args(tui)
    tui.set_defaults(handler="app.tui_cmd:run")

    web = sub.add_parser("web", help="the live dashboard in a browser (Streamlit)")
    web.add_argument("model", nargs="?", help="path to an .onnx file or a .prism bundle "
                                              "(default: a bundled sample)")
    web.add_argument("--devices", metavar="SPEC",
                     help="cpu:4, cpu:2,sim:4:mem=64MB, or a TOML file (default: cpu:2,sim:2)")
    _add_ray_arg(web)
    _add_bind_arg(web)
    _add_inputs_arg(web)
    web.add_argument("--port", type=_number(int, 0, 65535), default=0, metavar="P",
                     help="port on 127.0.0.1 (default: a free one)")
    _add_remap_arg(web)
    _add_connect_args(web)
    web.set_defaults(handler="app.web_cmd:run")

    comp = sub.add_parser("compile", help="partition and compile a model ahead of time into "
                                          "one bundle file (NAME.prism)")
    _add_model_args(comp)
    _add_inputs_arg(comp, sent=False)
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
    conf.add_argument("-k", metavar="PATTERN", type=_pattern,
                      help="only tests whose name matches (regex)")
    conf.add_argument("--runtimes", default="prism,onnxruntime,reference", metavar="LIST",
                      help="comma list of prism, onnxruntime, reference (default all three)")
    conf.add_argument("--timeout", type=_number(float, 0, above=True), default=20.0,
                      metavar="S",
                      help="seconds a test may take before it counts as failed (default 20)")
    conf.add_argument("--failures", action="store_true",
                      help="list every test Prism fails, with its error")
    conf.set_defaults(handler="app.conformance_cmd:run")
    return parser


def _add_train(sub: argparse._SubParsersAction) -> None:
    from runtime.train.choices import LOSSES, OPTIMIZERS, SCHEDULES

    train = sub.add_parser("train", help="train a model over the devices, pipelined, and write "
                                         "it back as an inference model")
    train.add_argument("model", help="path to an .onnx file whose first output is the logits "
                                     "(cross_entropy) or the prediction (mse)")
    train.add_argument("--data", required=True, metavar="DATA.npz",
                       help="one array per model input and one of labels, samples along the "
                            "first axis")
    train.add_argument("--labels", required=True, metavar="NAME",
                       help="the array of DATA.npz holding the labels (class indices for "
                            "cross_entropy, one per token for a language model's logits; "
                            "targets for mse)")
    train.add_argument("--loss", default="cross_entropy", choices=LOSSES,
                       help="PyTorch's defaults: the mean over the batch (default "
                            "cross_entropy)")
    train.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS,
                       help="sgd, momentum (0.9) or adam (0.9, 0.999); default sgd")
    train.add_argument("--lr", type=_number(float, 0, above=True), default=0.01, metavar="LR",
                       help="learning rate (default 0.01)")
    train.add_argument("--batch-size", type=_number(int, 1), default=32, metavar="B",
                       help="samples per step (default 32); a last short batch is left out")
    train.add_argument("--micro-batches", type=_number(int, 1), default=1, metavar="M",
                       help="micro-batches per step, pipelined over the stages (default 1)")
    train.add_argument("--epochs", type=_number(int, 1), default=1, metavar="N",
                       help="passes over the data (default 1)")
    train.add_argument("--devices", required=True,
                       help="cpu:2, sim:4, ...: each partition of the plan is a stage")
    train.add_argument("--schedule", default="1f1b", choices=SCHEDULES,
                       help="gpipe (every forward, then every backward) or 1f1b (default)")
    train.add_argument("--seed", type=_number(int, 0), default=0,
                       help="seed of the shuffle (default 0)")
    train.add_argument("-o", "--output", required=True, metavar="TRAINED.onnx",
                       help="the trained model, written when every epoch has run")
    train.add_argument("--json", action="store_true", help="print the figures as JSON")
    watch = train.add_mutually_exclusive_group()
    watch.add_argument("--tui", action="store_true",
                       help="train under the terminal dashboard (q quits, stopping it)")
    watch.add_argument("--web", action="store_true",
                       help="train under the browser dashboard: the run starts when the "
                            "page is first opened (Ctrl-C stops it)")
    train.add_argument("--port", type=_number(int, 0, 65535), default=0, metavar="P",
                       help="with --web: port on 127.0.0.1 (default: a free one)")
    train.set_defaults(handler="app.train_cmd:run")


def _handler(path: str) -> Callable[[argparse.Namespace], int]:
    module, name = path.split(":")
    return getattr(__import__(module, fromlist=[name]), name)


def _say(label: str, message: str = "") -> None:
    """One line on stderr, as written: never read as markup, whatever the message holds."""
    if sys.stderr.isatty() and "NO_COLOR" not in os.environ:
        label = f"\x1b[1;31m{label}\x1b[0m"
    sys.stderr.write(" ".join((label, *message.split())) + "\n")
    sys.stderr.flush()


class _CtrlC:
    """Ctrl-C while the command's modules import is noted and acted on once they have
    loaded: onnx's C extension does not survive a KeyboardInterrupt raised while it
    initialises (the process dies of SIGSEGV or SIGABRT, 8 times in 10 when pressed just
    then), and another extension turns it into an ImportError. After the imports it is
    Python's own handler again, noting the press as well, so an error that a Ctrl-C
    caused still reads "interrupted". Only the main thread can own the handler."""

    def __init__(self) -> None:
        self.pressed = self.deferred = False
        self.previous: Any = None  # the SIGINT handler to put back

    def __call__(self, signum, frame) -> None:
        self.pressed = True
        if not self.deferred:
            signal.default_int_handler(signum, frame)

    def __enter__(self) -> _CtrlC:
        if threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self.deferred = True  # first: a press the moment it is installed is deferred too
            self.previous = signal.signal(signal.SIGINT, self)
        return self

    def resume(self) -> None:
        self.deferred = False
        if self.pressed:
            raise KeyboardInterrupt

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def main(argv: Sequence[str] | None = None) -> int:
    with _CtrlC() as ctrl_c:
        try:
            args = build_parser().parse_args(argv)  # imports the runtime (for MODES)
            if getattr(args, "ray_address", None):
                from runtime.devices.ray.cluster import use_address

                use_address(args.ray_address)
            check_outputs(args)
            command = _handler(args.handler)
            ctrl_c.resume()
            return command(args) or 0
        except KeyboardInterrupt:
            pass
        except BrokenPipeError:  # `prism ... | head`: the reader left; say nothing more
            with contextlib.suppress(OSError, ValueError):  # what flushes at exit goes nowhere
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        except MemoryError as exc:
            _say("prism: error:", f"out of memory: {exc}")
            return 1
        except Exception as exc:  # the CLI never shows a traceback
            if not ctrl_c.pressed:
                _say(*_described(exc))
                return 1
    _say("prism: interrupted")
    return 130


def _described(exc: Exception) -> tuple[str, str]:
    errors = sys.modules.get("runtime.errors")  # imported by whatever raised a PrismError
    if isinstance(exc, OutputError) or (errors is not None and isinstance(exc, errors.PrismError)):
        return "prism: error:", str(exc)
    if isinstance(exc, OSError) and exc.filename is not None:  # a path given
        return "prism: error:", f"{exc.filename}: {exc.strerror or exc}"
    return "prism: internal error:", f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    sys.exit(main())
