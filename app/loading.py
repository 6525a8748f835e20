"""Turning command-line arguments into a graph, devices and a partition request."""

from __future__ import annotations

import argparse
from pathlib import Path

from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import PrismError
from runtime.graph import Graph, load_graph
from runtime.partition import MODES


def bindings(pairs: list[str]) -> dict[str, int]:
    out = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if not value.isdigit():
            raise PrismError(f"--bind takes DIM=N with N a whole number, got {pair!r}")
        out[name] = int(value)
    return out


def mode_and_map(partition: str) -> tuple[str, str | None]:
    """`balanced` -> (balanced, None); `map.toml` -> (user, map.toml)."""
    if partition in MODES and not Path(partition).is_file():
        if partition == "user":
            raise PrismError("--partition user needs a map: pass the TOML or JSON file instead")
        return partition, None
    if Path(partition).suffix in (".toml", ".json"):
        return "user", partition
    raise PrismError(f"unknown partition mode {partition!r}; choose one of "
                     f"{', '.join(m for m in MODES if m != 'user')} or give a map file")


def load(args: argparse.Namespace) -> tuple[Graph, list[DeviceConfig]]:
    devices = parse_devices(args.devices)
    graph = load_graph(args.model, bindings=bindings(args.bind), name=Path(args.model).stem)
    return graph, devices


def network_options(args: argparse.Namespace) -> dict:
    """`add_network` keywords from the run/bench flags."""
    mode, user_map = mode_and_map(args.partition)
    batching = None if not args.max_batch else {
        "max_batch_size": args.max_batch, "max_queue_delay_ms": args.max_delay_ms}
    if args.replicas != "saturate" and not str(args.replicas).isdigit():
        raise PrismError(f"--replicas takes a whole number or 'saturate', got {args.replicas!r}")
    return {"partition": user_map or mode, "bindings": bindings(args.bind),
            "annotations": args.annotate, "fallback": args.fallback, "batching": batching,
            "replicas": args.replicas if args.replicas == "saturate" else int(args.replicas)}
