"""Turning command-line arguments into a graph, devices and a partition request (or, for a
bundle, the few settings that may change when it loads)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from runtime.bundle.match import parse_remap
from runtime.bundle.reader import is_bundle
from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import PrismError
from runtime.partition import MODES

if TYPE_CHECKING:
    from runtime.graph import Graph

T = TypeVar("T")


def bindings(pairs: list[str]) -> dict[str, int]:
    """`--bind` pairs (checked by the parser: DIM=N, N >= 1) -> {DIM: N}."""
    return {name: int(value) for name, _, value in (p.partition("=") for p in pairs)}


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


def load(args: argparse.Namespace) -> tuple[Graph, list[DeviceConfig]]:
    from runtime.graph import load_graph  # here: `prism run NAME.prism` never needs it

    devices = parse_devices(args.devices)
    graph = load_graph(args.model, bindings=bindings(args.bind), name=Path(args.model).stem)
    return graph, devices


def _batching(args: argparse.Namespace) -> dict | None:
    return None if not args.max_batch else {
        "max_batch_size": args.max_batch, "max_queue_delay_ms": args.max_delay_ms}


def network_options(args: argparse.Namespace) -> dict:
    """`add_network` (and `compile_bundle`) keywords for a model from the flags."""
    mode, user_map = mode_and_map(args.partition)
    return {"partition": user_map or mode, "bindings": bindings(args.bind),
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
    """A file a command will write, checked before any work: its folder must exist."""
    target = Path(path)
    try:
        if target.is_dir():
            raise PrismError(f"{flag} {path} is a folder; give a file name")
        if not target.parent.is_dir():
            raise PrismError(f"{flag} {path}: there is no folder {target.parent}")
    except OSError as exc:
        raise PrismError(f"{flag} {path}: {exc.strerror or exc}") from None
    return target


def writing(path: Path, flag: str, write: Callable[[], T]) -> T:
    """`write()`, with an OSError (no permission, disk full) as a one-line error."""
    try:
        return write()
    except OSError as exc:
        raise PrismError(f"cannot write {flag} {path}: {exc.strerror or exc}") from None
