"""Turning command-line arguments into a graph, devices and a partition request (or, for a
bundle, the few settings that may change when it loads)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from app.paths import OutputError, writable
from runtime.bundle.match import parse_remap
from runtime.bundle.reader import is_bundle
from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import PrismError
from runtime.partition import MODES

if TYPE_CHECKING:
    from runtime.graph import Graph

T = TypeVar("T")


PROTOBUF_LIMIT = 2 << 30  # a model file larger than this holds no whole ONNX graph


def bindings(pairs: list[str], model: str | None = None) -> dict[str, int]:
    """`--bind` pairs (checked by the parser: DIM=N, N from 0) -> {DIM: N}. With `model`
    (an ONNX file), each DIM must name a symbolic dimension of one of its inputs."""
    found = {name: int(value) for name, _, value in (p.partition("=") for p in pairs)}
    known = _input_dims(model) if found and model else None
    unknown = sorted(set(found) - known) if known is not None else []
    if unknown:
        raise PrismError(f"--bind {unknown[0]}: the inputs of {model} have no dimension "
                         f"named {unknown[0]!r}; their symbolic dimensions are "
                         f"{', '.join(sorted(known or ())) or 'none (every one is fixed)'}")
    return found


def _input_dims(model: str) -> set[str] | None:
    """The symbolic dimensions of an ONNX model's inputs, read without its external data;
    None for a bundle, or a file the load proper will report on."""
    import onnx

    try:
        if is_bundle(model) or Path(model).stat().st_size > PROTOBUF_LIMIT:
            return None
        proto = onnx.load(model, load_external_data=False)
    except Exception:
        return None
    return {d.dim_param for v in proto.graph.input
            for d in v.type.tensor_type.shape.dim if d.dim_param}


def mode_and_map(partition: str | None) -> tuple[str, str | None]:
    """`balanced` (or None) -> (balanced, None); `map.toml` -> (user, map.toml)."""
    partition = partition or "balanced"
    if partition in MODES and not Path(partition).is_file():
        if partition == "user":
            raise PrismError("--partition user needs a map: pass the TOML or JSON file instead")
        return partition, None
    if Path(partition).suffix in (".toml", ".json"):
        return "user", partition
    raise PrismError(f"unknown partition mode {partition!r}; choose one of "
                     f"{', '.join(m for m in MODES if m != 'user')} or give a map file")


def run_devices(args: argparse.Namespace) -> list[DeviceConfig]:
    """`--devices`; without it, a bundle runs on devices like those it was compiled for."""
    if args.devices:
        return parse_devices(args.devices)
    if args.model and is_bundle(Path(args.model)):
        from app.defaults import default_devices

        return parse_devices(default_devices(Path(args.model)))
    raise PrismError(f"{args.model}: --devices SPEC is needed for an ONNX model (a .prism "
                     f"bundle runs on devices like those it was compiled for)")


def load(args: argparse.Namespace) -> tuple[Graph, list[DeviceConfig]]:
    from runtime.graph import load_graph  # here: `prism run NAME.prism` never needs it

    devices = parse_devices(args.devices)
    graph = load_graph(args.model, bindings=bindings(args.bind, args.model),
                       name=Path(args.model).stem)
    return graph, devices


def _batching(args: argparse.Namespace) -> dict | None:
    return None if not args.max_batch else {
        "max_batch_size": args.max_batch, "max_queue_delay_ms": args.max_delay_ms}


def network_options(args: argparse.Namespace) -> dict:
    """`add_network` (and `compile_bundle`) keywords for a model from the flags."""
    mode, user_map = mode_and_map(args.partition)
    return {"partition": user_map or mode, "bindings": bindings(args.bind, args.model),
            "annotations": args.annotate, "fallback": args.fallback,
            "batching": _batching(args), "replicas": args.replicas or 1, "costs": args.costs}


def load_options(args: argparse.Namespace) -> dict:
    """`add_network` keywords from the run/bench flags: a model's, or for a bundle the
    flags given (the host refuses those a compiled plan cannot take) and `--remap`."""
    remap = parse_remap(args.remap)
    if not is_bundle(args.model):
        if remap:
            raise PrismError("--remap applies to bundles (NAME.prism); a model is planned "
                             "onto the devices as they are named")
        return network_options(args)
    return {"partition": args.partition, "bindings": bindings(args.bind) or None,
            "annotations": args.annotate, "fallback": args.fallback,
            "batching": _batching(args), "replicas": args.replicas, "remap": remap,
            "costs": args.costs}


def output_file(path: str, flag: str) -> Path:
    """A file a command will write, checked before any work (`app.paths.writable`)."""
    try:
        return writable(Path(path), flag)
    except OutputError as exc:
        raise PrismError(str(exc)) from None


def writing(path: Path, flag: str, write: Callable[[], T]) -> T:
    """`write()`, with an OSError (no permission, disk full) as a one-line error."""
    try:
        return write()
    except OSError as exc:
        raise PrismError(f"cannot write {flag} {path}: {exc.strerror or exc}") from None
