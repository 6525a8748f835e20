"""`prism quantize MODEL (--profile P | --calibrate DATA.npz) -o OUT.onnx`: the model in
int8 by onnxruntime's static quantizer, optionally within an accuracy budget or with
the precision of each device it will run on."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import onnx
from rich import box
from rich.table import Table

from app.arguments import mode_and_map
from app.console import plain_console
from app.profile_cmd import load_model, progress_bar
from runtime.devices import parse_devices
from runtime.devices.external import save
from runtime.graph import file_bytes, load_graph
from runtime.partition import partition
from runtime.precision import DEQUANTIZE_OPS, QUANTIZE_OPS, node_precisions
from runtime.quantize import (
    Calibrated,
    QuantizeError,
    QuantizeOptions,
    Samples,
    calibrate,
    float_nodes_by_device,
    load_metric,
    parse_budget,
    prepare,
    read_samples,
    search,
    slow_in_int8,
)
from runtime.units import human_bytes, human_seconds


def _options(args: argparse.Namespace) -> QuantizeOptions:
    return QuantizeOptions(format=args.format, activations=args.activations,
                           weights=args.weights, per_channel=not args.per_tensor,
                           exclude_nodes=tuple(args.exclude), exclude_ops=tuple(args.exclude_op),
                           narrow_float=not args.quantize_narrow)


def _calibrated(args: argparse.Namespace, show) -> tuple[Calibrated, Samples | None]:
    """(prepared model with its profile, held-out samples or None)."""
    if args.profile:
        if args.accuracy_budget is not None:
            raise QuantizeError("--accuracy-budget needs --calibrate DATA.npz: the search "
                                "measures accuracy on a held-out share of it")
        show("preparing", 0, 1)
        return Calibrated(prepare(args.model), Path(args.profile), 0), None
    graph = load_model(args.model)
    samples = read_samples(args.calibrate, graph)
    held: Samples | None = None
    if args.accuracy_budget is not None:
        samples, held = samples.split(args.holdout)
    show("preparing", 0, 1)
    return calibrate(args.model, samples, args.method,
                     lambda done, total: show("calibrating", done, total)), held


def _counts(model: onnx.ModelProto) -> Counter:
    graph = load_graph(model)
    precisions = node_precisions(graph)
    return Counter(precisions[n.name] or "none" for n in graph.nodes
                   if n.op_type not in QUANTIZE_OPS | DEQUANTIZE_OPS)


def run(args: argparse.Namespace) -> int:
    if not 0 < args.holdout < 1:
        raise QuantizeError(f"--holdout must be between 0 and 1, got {args.holdout}")
    budget = None if args.accuracy_budget is None else parse_budget(args.accuracy_budget)
    options = _options(args)
    report: dict = {"model": args.model, "output": args.output, "format": options.format,
                    "activations": options.activations, "weights": options.weights,
                    "per_channel": options.per_channel}
    with progress_bar(args.json) as show:
        calibrated, held = _calibrated(args, show)
        with calibrated:
            prepared = load_graph(calibrated.prepared, name=Path(args.model).stem)
            devices = parse_devices(args.devices) if args.devices else None
            if devices:
                mode, user_map = mode_and_map(args.partition)
                if user_map:
                    raise QuantizeError("--partition for quantize takes memory or balanced")
                keep, _ = float_nodes_by_device(prepared, devices, mode, options.format)
                options = options.excluding(keep)
                report["float_by_device"] = keep
            if budget is not None:
                assert held is not None  # _calibrated keeps a held-out share for a budget
                metric = load_metric(args.metric, prepared)
                result = search(calibrated, held, budget, metric, options,
                                lambda done, total, what: show("accuracy search", done, total))
                model = result.model
                report["search"] = {
                    "metric": result.metric, "budget": budget, "held_out": held.count,
                    "loss_all_int8": result.quantized_loss, "loss": result.loss,
                    "kept_float": result.kept_float, "reasons": result.reasons,
                    "trials": result.trials, "candidates": result.candidates}
            else:
                model = calibrated.quantize(options)
    save(model, args.output)
    counts = _counts(model)
    report.update(float_for_speed=slow_in_int8(prepared) if options.narrow_float else [],
                  int8_nodes=counts.get("int8", 0), float_nodes=counts.get("float", 0),
                  excluded=list(options.exclude_nodes), excluded_ops=list(options.exclude_ops),
                  bytes_float=file_bytes(args.model), bytes_int8=file_bytes(args.output))
    if devices:
        report["bottleneck_seconds"] = {
            "float": partition(prepared, devices, mode).bottleneck_seconds,
            "int8": partition(load_graph(model), devices, mode).bottleneck_seconds}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return 0


def _print(report: dict) -> None:
    console = plain_console()
    console.print(f"{report['model']} -> {report['output']}: {report['int8_nodes']} compute "
                  f"nodes in int8, {report['float_nodes']} in float ({report['format']}, "
                  f"{report['activations']} activations, {report['weights']} weights "
                  f"{'per channel' if report['per_channel'] else 'per tensor'}); "
                  f"{human_bytes(report['bytes_float'])} -> {human_bytes(report['bytes_int8'])}",
                  highlight=False)
    if report["float_for_speed"]:
        console.print(f"kept in float, where onnxruntime's int8 kernels are slower: "
                      f"{', '.join(report['float_for_speed'])} (--quantize-narrow quantizes "
                      f"them too)", highlight=False)
    if report.get("float_by_device"):
        console.print(f"kept in float for devices without int8: "
                      f"{', '.join(report['float_by_device'])}", highlight=False)
    if "bottleneck_seconds" in report:
        b = report["bottleneck_seconds"]
        console.print(f"modelled bottleneck on the devices: float {human_seconds(b['float'])}, "
                      f"int8 {human_seconds(b['int8'])}", highlight=False)
    found = report.get("search")
    if found:
        console.print(f"accuracy budget {found['budget']:.2%} ({found['metric']} on "
                      f"{found['held_out']} held-out samples): all in int8 "
                      f"{found['loss_all_int8']:.2%}, answer {found['loss']:.2%}, "
                      f"{len(found['kept_float'])} of {found['candidates']} nodes back in float "
                      f"({found['trials']} trials)", highlight=False)
        if found["kept_float"]:
            table = Table(title="returned to float", box=box.SIMPLE_HEAD, pad_edge=False)
            table.add_column("node")
            table.add_column("why")
            for node in found["kept_float"]:
                table.add_row(node, found["reasons"][node])
            console.print(table)
