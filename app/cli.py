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
    parser.add_argument("model", help="path to an .onnx file")
    parser.add_argument("--devices", required=True,
                        help="cpu:4, cpu:2,sim:4:mem=64MB, or a TOML file with a table per device")
    parser.add_argument("--partition", default="balanced", metavar="MODE",
                        help=f"{', '.join(MODES)}, or a TOML/JSON node -> partition map "
                             "(user mode); default balanced")
    parser.add_argument("--bind", action="append", default=[], metavar="DIM=N",
                        help="value of a symbolic dimension for costing (default 1)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prism", description="Partition an ONNX network over several devices and run it.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    part = sub.add_parser("partition", help="plan how a model splits over devices")
    _add_model_args(part)
    part.add_argument("--json", action="store_true", help="print the plan as JSON")
    part.add_argument("--dot", metavar="FILE", help="write the plan as Graphviz to FILE")
    part.add_argument("--steps", action="store_true", help="print every partitioner step")
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
    run.set_defaults(handler="app.run_cmd:run")
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
