"""The one Graphviz writer (runtime/partition/dot.py), on every sample model."""

from __future__ import annotations

import json

import pytest

from runtime.devices import parse_devices
from runtime.graph import load_graph
from runtime.partition import partition
from runtime.partition.dot import (
    Ink,
    Outline,
    graph_dot,
    partition_dot,
    partition_edges,
    plan_dot,
    scheme_inks,
)
from tests.support.dags import SAMPLES_DIR as SAMPLES

DEVICES = "cpu:2,sim:2:mem=256MB"
INK = Ink("#112233", "#aabbcc")


def balanced(text: str) -> bool:
    return all(text.count(a) == text.count(b) for a, b in ("{}", "[]"))


@pytest.mark.parametrize("mode", ["balanced", "memory"])
def test_plan_drawings_cover_every_sample(mode: str) -> None:
    devices = parse_devices(DEVICES)
    for path in sorted(SAMPLES.glob("*.onnx")):
        graph = load_graph(path)
        outline = Outline.of(graph)
        plan = partition(graph, devices, mode)
        inks = dict.fromkeys((d.name for d in devices), INK)
        nodes = plan_dot(plan, inks, outline)
        parts = partition_dot(plan, inks, partition_edges(plan, outline))
        assert all(json.dumps(n.name) in nodes for n in graph.nodes), path.name
        assert nodes.count("subgraph") == len(plan.partitions)
        assert all(f"{p.name} @ {p.device}" in parts for p in plan.partitions), path.name
        assert nodes.count("shape=cds") == len(plan.transfers)
        crossing = sum(len(ts) for src, dst, ts in outline.edges
                       if plan.partition_of(src).device != plan.partition_of(dst).device)
        assert nodes.count('-> "copy:') == len(plan.transfers)  # each copy fed once
        assert nodes.count("style=dashed") == len(plan.transfers) + crossing  # and read
        assert balanced(nodes) and balanced(parts), path.name


def test_to_dot_colours_by_device_with_graphvizs_own_scheme() -> None:
    graph = load_graph(SAMPLES / "cnn.onnx")
    plan = partition(graph, parse_devices(DEVICES), "balanced")
    inks = scheme_inks(d.name for d in plan.devices)
    assert plan.to_dot(graph) == plan_dot(plan, inks, Outline.of(graph))
    assert len({ink.line for ink in inks.values()}) == len(plan.devices)
    for p in plan.partitions:
        assert f'color="{inks[p.device].line}"' in plan.to_dot()
    assert "\" -> \"" not in plan.to_dot()  # no graph, no edges


def test_graph_dot_draws_the_shown_nodes_in_their_inks() -> None:
    outline = Outline.of(load_graph(SAMPLES / "branchy.onnx"))
    names = list(outline.ops)
    own = {names[0]: INK}
    whole = graph_dot(outline, own, Ink("#000000", "#ffffff"), {names[0]: "p0"})
    assert whole.count('fillcolor="#aabbcc"') == 1 and whole.count('"#ffffff"') == len(names) - 1
    assert f"{outline.ops[names[0]]} [p0]" in whole
    assert whole.count("->") == len(outline.edges)
    shown = {names[0], *outline.successors[names[0]]}
    part = graph_dot(outline, own, INK, {}, shown)
    assert {n for n in names if f"{json.dumps(n)} [" in part} == shown
    assert part.count("->") == len(outline.successors[names[0]])
    assert balanced(whole) and balanced(part)
