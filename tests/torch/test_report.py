"""The report: blocks, each operator offloaded or kept in PyTorch and why, each block's
plan over the devices; a dry run plans without loading anything and prints it."""

from __future__ import annotations

import json

import torch
from torch import nn

import runtime.torch
from tests.support.torch_modules import MODULES, fresh, fresh_weights, relative_error


def test_a_dry_run_plans_prints_and_loads_nothing(host, capsys):
    fresh_weights()
    make, row = MODULES["mystery"]
    model = make().eval()
    before = host.networks()
    fast = torch.compile(model, backend="prism", options={"host": host, "dry_run": True})
    x = fresh(4, *row)
    with torch.no_grad():
        assert relative_error(fast(x), model(x)) < 1e-4
    assert not set(host.networks()) - set(before)
    report = runtime.torch.reports()[-1]
    assert report.dry_run and not report.networks
    printed = capsys.readouterr().err
    assert printed.strip() == report.table()
    assert f"{len(report.offloaded)} of {len(report.nodes)} operators" in printed
    assert "prism_tests.mystery.default x1: ONNX cannot express it" in printed
    for block in report.blocks.values():
        (variant,) = block.variants
        assert {p.device for p in variant.plan.partitions} <= set(host.devices)
        assert variant.placed() in printed


def test_explain_says_what_would_run_where():
    """explain(): a dry run that returns the reports (one per captured graph) and prints
    nothing; torch_executed_ops and min_block_size keep operators in PyTorch, by name."""
    model = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 3), nn.Sigmoid())
    x = fresh(2, 6)
    (report,) = runtime.torch.explain(model, x, devices="cpu:2",
                                      torch_executed_ops=["aten.relu"])
    kept = {n.op: n.reason for n in report.kept_nodes}
    assert kept == {"aten.relu.default": "in torch_executed_ops"}
    assert len(report.blocks) == 2  # the relu cuts the layers in two
    assert report.devices == ["cpu0", "cpu1"]
    data = json.loads(json.dumps(report.to_dict()))
    assert data["operators"] == len(report.nodes) and data["offloaded"] == len(report.offloaded)
    assert all(v["plan"]["partitions"] for b in data["blocks"] for v in b["variants"])

    (small,) = runtime.torch.explain(model, x, devices="cpu:1", min_block_size=100)
    assert not small.offloaded and not small.blocks
    assert all("under min_block_size 100" in n.reason for n in small.kept_nodes)
