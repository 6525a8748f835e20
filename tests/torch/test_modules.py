"""Whole modules through `torch.compile(..., backend="prism")`: an MLP, a CNN with
BatchNorm, a transformer encoder block, an LSTM and a module with an operator ONNX cannot
express in its middle, at batch sizes 1 and 8, against eager PyTorch; the work done by
the host's devices, as its networks and its `partition.run.finished` events show.

Each module is compiled once for the file (export costs a second or so per block).
"""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import runtime.torch  # noqa: F401 (registers the backend; installed, the entry point does)
from runtime.host import HostManager
from runtime.observe.events import Subscription
from runtime.torch.compiled import collecting
from runtime.torch.report import GraphReport
from tests.support.torch_modules import (
    MODULES,
    finished_runs,
    fresh,
    fresh_weights,
    relative_error,
)

BATCHES = (1, 8)


@dataclass
class Compiled:
    module: torch.nn.Module
    errors: dict[int, float]        # batch size -> largest relative error against eager
    reports: list[GraphReport]      # the graphs the backend compiled for it
    runs: dict[str, int]            # network -> partition runs finished
    loaded: set[str]                # the host's networks right after the calls
    plans: dict[str, dict]          # network -> the host's plan of it, then


_compiled: dict[str, Compiled] = {}


def compile_and_call(name: str, host: HostManager, events: Subscription) -> Compiled:
    """Module `name` compiled and called at each batch size, once for the file."""
    if name not in _compiled:
        _compiled[name] = _compile_and_call(name, host, events)
    return _compiled[name]


@pytest.fixture(params=sorted(MODULES))
def compiled(request, host: HostManager, events: Subscription) -> Compiled:
    return compile_and_call(request.param, host, events)


def _compile_and_call(name: str, host: HostManager, events: Subscription) -> Compiled:
    make, row = MODULES[name]
    fresh_weights()
    module = make().eval()
    reference = copy.deepcopy(module)
    fast = torch.compile(module, backend="prism", options={"host": host})
    before = set(host.networks())
    finished_runs(events)  # what came before belongs to other tests
    errors = {}
    with torch.no_grad(), torch._dynamo.config.patch(allow_rnn=True), \
            collecting() as reports:
        for batch in BATCHES:
            x = fresh(batch, *row)
            errors[batch] = relative_error(fast(x), reference(x))
    loaded = set(host.networks())
    plans = {n: host.plan(n).to_dict() for n in loaded - before}
    return Compiled(module, errors, reports, finished_runs(events), loaded, plans)


def test_equals_eager_at_batch_1_and_8(compiled: Compiled):
    assert set(compiled.errors) == set(BATCHES)
    assert max(compiled.errors.values()) < 1e-4, compiled.errors


def test_the_host_runs_every_batch_size(compiled: Compiled, host: HostManager):
    """Each batch size was a graph of its own (dynamo specializes batch 1), and each graph
    ran on the host: its networks are there and their partitions ran."""
    assert len(compiled.reports) == len(BATCHES), [r.summary() for r in compiled.reports]
    for report in compiled.reports:
        assert report.offloaded, report.table()
        assert set(report.networks) <= compiled.loaded
        assert all(compiled.runs.get(n, 0) >= 1 for n in report.networks), compiled.runs


def test_blocks_are_planned_over_the_devices(compiled: Compiled, host: HostManager):
    """Every block's network is planned over the host's devices like any model (the plan
    the report shows is the host's); a block of a dozen ONNX nodes or more spans both."""
    variants = [v for r in compiled.reports for b in r.blocks.values() for v in b.variants]
    assert variants
    for variant in variants:
        plan = compiled.plans[variant.network]
        assert plan == variant.plan.to_dict()
        devices = {p["device"] for p in plan["partitions"]}
        assert devices <= set(host.devices)
        if sum(len(p["nodes"]) for p in plan["partitions"]) >= 12:
            assert devices == set(host.devices), plan


def test_the_operator_onnx_cannot_express_stays_in_pytorch(host: HostManager,
                                                           events: Subscription):
    """The custom operator in the middle of `Mystery` runs in PyTorch, with its reason;
    the layers before and after it are two blocks, both run on the host."""
    mystery = compile_and_call("mystery", host, events)
    assert max(mystery.errors.values()) < 1e-4
    for report in mystery.reports:
        kept = {n.op: n.reason for n in report.kept_nodes}
        assert list(kept) == ["prism_tests.mystery.default"], report.table()
        assert "ONNX cannot express it" in kept["prism_tests.mystery.default"]
        assert len(report.offloaded) == len(report.nodes) - 1
        assert len(report.blocks) == 2 and all(b.variants for b in report.blocks.values())
        assert all(mystery.runs.get(n) for n in report.networks), mystery.runs


@pytest.mark.parametrize("loss", ["cross_entropy", "embedding_bag_mean"])
def test_gradients_of_ops_whose_saved_outputs_onnx_gets_wrong_are_eagers(host, loss):
    """A mean cross-entropy's total_weight and an EmbeddingBag's bag sizes are outputs
    kept for the backward pass that torch.onnx's translations get wrong (gradients came
    out batch-size and bag-size times too large): those ops stay in PyTorch."""
    torch.manual_seed(int(np.random.default_rng().integers(1 << 31)))
    if loss == "cross_entropy":
        module = nn.Linear(6, 3)
        batch = (fresh(4, 6), torch.randint(0, 3, (4,)))

        def run(m, x, t):
            return F.cross_entropy(m(x), t)
    else:
        module = nn.EmbeddingBag(10, 4, mode="mean")
        batch = (torch.randint(0, 10, (3, 5)),)

        def run(m, ids):
            return m(ids).square().sum()
    reference = copy.deepcopy(module)
    fast = torch.compile(lambda *a: run(module, *a), backend="prism", options={"host": host})
    fast(*batch).backward()
    run(reference, *batch).backward()
    for (name, p), q in zip(module.named_parameters(), reference.parameters(), strict=True):
        assert relative_error(p.grad, q.grad) < 1e-4, name


def test_gradients_flow_through_an_offloaded_forward(host: HostManager):
    """With gradients on, the forward runs on the host and the backward in PyTorch: the
    gradients are eager PyTorch's."""
    make, row = MODULES["mlp"]
    module = make()
    reference = copy.deepcopy(module)
    fast = torch.compile(module, backend="prism", options={"host": host})
    x = fresh(4, *row)
    with collecting() as reports:
        fast(x).square().sum().backward()
    reference(x).square().sum().backward()
    (report,) = reports
    assert report.networks and not report.kept_nodes, report.table()
    for (name, p), q in zip(module.named_parameters(), reference.parameters(), strict=True):
        assert relative_error(p.grad, q.grad) < 1e-4, name


class _Broken(nn.Module):
    """Two graphs, split where library code turns dynamo off (`torch._dynamo.disable`)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch._dynamo.disable(torch.relu)(self.a(x))
        return self.b(h)


def test_threads_calling_a_compiled_module_at_new_sizes_get_eagers_answers(
        host: HostManager):
    """Threads serving one compiled module: each new batch size makes dynamo compile in one
    thread while a block exports in another, and the export traced with the process-wide
    state dynamo's compile was using: dynamo failed ("s75 is not tracked with proxy"),
    the call raised, or hung. An export now holds dynamo's own compile lock."""
    for _ in range(3):
        torch._dynamo.reset()
        fresh_weights()
        module = _Broken().eval()
        fast = torch.compile(module, backend="prism", options={"host": host})

        def call(i: int, fast=fast, module=module) -> float:
            x = fresh(1 + i % 8, 16)
            with torch.no_grad():
                return relative_error(fast(x), module(x))

        with ThreadPoolExecutor(8) as pool:
            errors = [f.result(timeout=120) for f in [pool.submit(call, i) for i in range(96)]]
        assert max(errors) < 1e-5
