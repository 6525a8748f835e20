"""Turning command-line arguments into a graph, devices and a partition request (or, for a
bundle, the few settings that may change when it loads)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.bundle.load import is_bundle
from runtime.bundle.match import parse_remap
from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import PrismError
from runtime.partition import MODES

if TYPE_CHECKING:
    from runtime.graph import Graph


def bindings(pairs: list[str]) -> dict[str, int]:
    out = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if not value.isdigit():
            raise PrismError(f"--bind takes DIM=N with N a whole number, got {pair!r}")
        out[name] = int(value)
    return out


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


def _replicas(args: argparse.Namespace) -> int | str | None:
    if args.replicas is None or args.replicas == "saturate":
        return args.replicas
    if not str(args.replicas).isdigit():
        raise PrismError(f"--replicas takes a whole number or 'saturate', got {args.replicas!r}")
    return int(args.replicas)


def _batching(args: argparse.Namespace) -> dict | None:
    return None if not args.max_batch else {
        "max_batch_size": args.max_batch, "max_queue_delay_ms": args.max_delay_ms}


def network_options(args: argparse.Namespace) -> dict:
    """`add_network` (and `compile_bundle`) keywords for a model from the flags."""
    mode, user_map = mode_and_map(args.partition)
    replicas = _replicas(args)
    return {"partition": user_map or mode, "bindings": bindings(args.bind),
            "annotations": args.annotate, "fallback": args.fallback,
            "batching": _batching(args), "replicas": 1 if replicas is None else replicas}


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
            "batching": _batching(args), "replicas": _replicas(args), "remap": remap}
