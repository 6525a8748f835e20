"""A block exports once per kind of input it is called with: a dynamic graph's block
exports with dynamic dimensions and serves every batch size from one network; weights
changed in place make it export again with the weights fed; tensors cross to numpy and
back without copies; the backend's own devices leave PyTorch the cores between runs."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import sympy  # type: ignore[import-untyped]
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._sympy.functions import (
    CeilToInt,
    FloatTrueDiv,
    FloorDiv,
    IntTrueDiv,
    PowByNatural,
    ToFloat,
    TruncToInt,
)
from torch.utils._sympy.interp import sympy_interp

from runtime.devices import parse_devices
from runtime.host import HostManager
from runtime.torch import OffloadWarning
from runtime.torch.block import OffloadedBlock
from runtime.torch.compiled import CompiledGraph, collecting
from runtime.torch.export import _SizeArithmetic
from runtime.torch.options import OffloadOptions
from runtime.torch.tensors import laid_out, layout_of, to_numpy, to_torch
from tests.support.hosts import cpu_burnt_after
from tests.support.torch_modules import fresh, fresh_weights, relative_error

_S = sympy.Symbol("s0", integer=True, positive=True)


def test_a_dynamic_graph_serves_new_batch_sizes_from_one_network(host):
    """Batch 1 and 8 are two graphs (dynamo specializes 1, then marks the batch dynamic);
    the second exports with a symbolic batch, so 5 and 13 reuse its network."""
    fresh_weights()
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 6)).eval()
    fast = torch.compile(model, backend="prism", options={"host": host})
    seen = []
    with torch.no_grad(), collecting() as reports:
        for batch in (1, 8, 5, 13):
            x = fresh(batch, 6)
            assert relative_error(fast(x), model(x)) < 1e-4
            seen.append(set(host.networks()))
    assert len(seen[1] - seen[0]) == 1 and seen[3] == seen[2] == seen[1]
    static, dynamic = reports  # batch 1, then every batch from 8 on
    ((fixed,),) = [b.variants for b in static.blocks.values()]
    ((symbolic,),) = [b.variants for b in dynamic.blocks.values()]
    assert list(fixed.inputs.values()) == [[1, 6]]
    assert list(symbolic.inputs.values()) == [[None, 6]]


def test_weights_changed_in_place_are_seen(host):
    """An optimizer step or load_state_dict changes weights in place; the block exports
    again (its weights fed on every call from then on) and answers as eager does."""
    fresh_weights()
    model = nn.Sequential(nn.Linear(5, 5), nn.Tanh()).eval()
    fast = torch.compile(model, backend="prism", options={"host": host})
    x = fresh(3, 5)
    with torch.no_grad(), collecting() as reports:
        before = fast(x)
        model[0].weight.mul_(-2.0)
        after = fast(x)
        assert relative_error(after, model(x)) < 1e-4
        y = fresh(3, 5)  # the export with fed weights serves what comes next
        assert relative_error(fast(y), model(y)) < 1e-4
    assert not torch.allclose(before, after)
    (report,) = reports
    block = next(iter(report.blocks.values()))
    assert block.state.startswith("weights changed") and len(block.variants) == 1


def test_weights_replaced_or_made_under_inference_mode_are_served(host):
    """`p.data = new` keeps the parameter and changes its storage: seen, as a version
    bump is. A module made under inference_mode has weights with no version counter: it
    runs (it crashed reading one)."""
    fresh_weights()
    model = nn.Sequential(nn.Linear(5, 5), nn.Tanh()).eval()
    fast = torch.compile(model, backend="prism", options={"host": host})
    x = fresh(3, 5)
    with torch.no_grad():
        before = fast(x)
        model[0].weight.data = fresh(5, 5)
        after = fast(x)
        assert relative_error(after, model(x)) < 1e-4 and not torch.allclose(before, after)
    with torch.inference_mode():
        made = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
        fast = torch.compile(made, backend="prism", options={"host": host})
        y = fresh(2, 4)
        assert relative_error(fast(y), made(y)) < 1e-4


def test_tensors_cross_without_copies():
    tensor = fresh(3, 4)
    array = to_numpy(tensor)
    assert np.shares_memory(array, tensor.numpy())
    strided = tensor.t()  # a view: numpy gets the same memory and strides
    assert np.shares_memory(to_numpy(strided), array)
    back = to_torch(array)
    assert back.data_ptr() == tensor.data_ptr()
    kept = np.arange(4.0, dtype=np.float32)
    assert to_torch(kept, copy=True).data_ptr() != kept.ctypes.data  # a constant the host keeps
    frozen = kept.copy()
    frozen.flags.writeable = False
    assert to_torch(frozen).data_ptr() != frozen.ctypes.data


def test_the_backends_own_devices_leave_the_cores_to_pytorch_between_runs():
    """The host the backend opens for `devices` makes its onnxruntime threads sleep
    between runs: spinning, they starve PyTorch's threads running the graph between
    blocks (Faster R-CNN on `cpu:1:threads=2`, 2 cores: 205 ms a call, 80 ms without).
    A host of the caller's keeps its devices as given."""
    spec = "cpu:1:threads=2"
    module = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)).eval()
    x = fresh(256, 256)
    with HostManager(parse_devices(spec)) as spinning, torch.no_grad():
        burnt = {}
        for options in ({"devices": spec}, {"host": spinning}):
            torch._dynamo.reset()
            fast = torch.compile(module, backend="prism", options=options)
            assert relative_error(fast(x), module(x)) < 1e-4
            burnt["host" in options] = cpu_burnt_after(lambda fast=fast: fast(x))
    assert burnt[False] < burnt[True] / 4, burnt


def test_outputs_take_the_layout_the_graph_was_traced_with():
    """A block's ONNX output is row-major; where PyTorch made a transposed layout, later
    `view`s may rely on it, so it is laid out again."""
    traced = torch.empty(4, 6, 5).transpose(0, 1)  # (6, 4, 5), memory order (1, 0, 2)
    layout = layout_of(traced)
    assert layout == (1, 0, 2)
    values = fresh(6, 4, 5)
    again = laid_out(values, layout)
    assert torch.equal(again, values) and again.stride() == traced.stride()
    assert layout_of(torch.empty(2, 3)) is None
    head = torch.empty(2, 1, 8, 16)  # a key head broadcast to 4, as transformers' repeat_kv
    assert layout_of(head.expand(2, 4, 8, 16)) is None
    assert layout_of(head.transpose(2, 3).expand(2, 4, 16, 8)) == (0, 1, 3, 2)
    assert layout_of(torch.empty(6, 1, 4).transpose(0, 2)) == (2, 1, 0)


def test_batching_serves_the_dynamic_graph_and_says_why_not_the_static_one(host):
    """`batching` needs a symbolic batch dimension: the batch-1 graph (static) runs
    unbatched after one warning line; the dynamic graph's network batches, and requests
    from several threads at once answer each with its own rows."""
    fresh_weights()
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    fast = torch.compile(model, backend="prism", options={
        "host": host, "batching": {"max_batch_size": 16, "max_queue_delay_ms": 2}})
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        one = fresh(1, 4)
        assert relative_error(fast(one), model(one)) < 1e-4
        eight = fresh(8, 4)
        assert relative_error(fast(eight), model(eight)) < 1e-4
    lines = [str(w.message) for w in caught if issubclass(w.category, OffloadWarning)]
    assert len(lines) == 1 and "runs unbatched" in lines[0], lines
    inputs = [fresh(n, 4) for n in (2, 3, 5, 7) * 4]

    def call(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # grad mode is per thread
            return fast(x)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(call, inputs))
    with torch.no_grad():
        for x, y in zip(inputs, answers, strict=True):
            assert relative_error(y, model(x)) < 1e-4


class _Decode(nn.Module):
    """One decoding step over a cache that grows a row a step: the block reads the new
    length (the cache's length + 1) as an int computed outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, cache: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        length = cache.shape[1] + 1
        full = torch.cat([cache, self.proj(token)], 1)
        return full * torch.arange(length, dtype=full.dtype)[None, :, None] / length


def test_a_size_computed_from_a_dynamic_one_keeps_the_block_dynamic(host):
    """A cache one row longer each step: after dynamo marks its length dynamic, every
    later length is served by the one variant exported (it exported again per length,
    ~2 s a token for a small Llama's generate)."""
    fresh_weights()
    model = _Decode().eval()
    fast = torch.compile(model, backend="prism", options={"host": host})
    with torch.no_grad(), collecting() as reports:
        for length in range(3, 9):
            cache, token = fresh(2, length, 4), fresh(2, 1, 4)
            assert relative_error(fast(cache, token), model(cache, token)) < 1e-4
    dynamic = reports[-1]
    assert [len(b.variants) for b in dynamic.blocks.values()] == [1]
    (variant,) = next(iter(dynamic.blocks.values())).variants
    assert any(None in dims for dims in variant.inputs.values())


def test_a_size_rounded_up_through_floats_keeps_the_block_dynamic(host):
    """torchvision pads a batch of images to `int(ceil(h / 32.0) * 32.0)`: a size built by
    float arithmetic on a dynamic one (`TruncToInt` of it, to the exporter), which the
    block computes from its input's shape. It exported as a sympy expression, so the
    block fell back to PyTorch at its first dynamic call (Faster R-CNN's transform)."""
    fresh_weights()
    layer = nn.Linear(8, 8)

    def model(x: torch.Tensor) -> torch.Tensor:
        rows = int(math.ceil(float(x.shape[0]) / 32.0) * 32.0)
        padded = x.new_full((rows, x.shape[1]), 0.0)
        padded[: x.shape[0]].copy_(x)
        return torch.tanh(layer(padded))

    fast = torch.compile(model, backend="prism", options={"host": host})
    with torch.no_grad(), collecting() as reports, \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (40, 50, 70):  # 50: dynamo makes the rows dynamic; 70: one more pad
            x = fresh(rows, 8)
            answer = fast(x)
            assert answer.shape == (32 * math.ceil(rows / 32), 8)
            assert relative_error(answer, model(x)) < 1e-5
    assert not [w.message for w in caught if issubclass(w.category, OffloadWarning)]
    (block,) = reports[-1].blocks.values()
    assert block.state == "offloaded" and len(block.variants) == 1, block.state


@pytest.mark.parametrize("expr", [
    TruncToInt(32.0 * ToFloat(CeilToInt(FloatTrueDiv(ToFloat(_S), 32.0)))),
    IntTrueDiv(_S, 3), FloatTrueDiv(1.0, ToFloat(_S)), PowByNatural(_S, 2),
    TruncToInt(ToFloat(_S) * 0.75) + FloorDiv(_S, 2)])
def test_size_arithmetic_gives_python_numbers(expr):
    """What a block computes its sizes with gives numbers (SymInts while exporting), never
    a sympy expression: the operations torch's Python reference left to sympy (truncation,
    integer true division) and others beside them."""
    for size in (1, 37, 224):
        got = sympy_interp(_SizeArithmetic, {_S: size}, expr)
        assert isinstance(got, int | float) and got == pytest.approx(float(expr.subs(_S, size)))


def _grown_and_paired(past: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    keys = torch.cat([past, token.tanh()], 1)
    n = keys.shape[1]  # read from the tensor cat makes: `sym_size(cat, 1)` in the graph
    return keys[:, :, None].expand(-1, n, 2, -1).reshape(keys.shape[0], n * 2, -1).softmax(1)


def _symbolic(fn: Callable, host, *examples: torch.Tensor) -> CompiledGraph:
    """`fn` traced with every dimension symbolic (sizes read as `aten.sym_size` where the
    graph first meets them), compiled over `host`."""
    return CompiledGraph(make_fx(fn, tracing_mode="symbolic")(*examples),
                         OffloadOptions.of({"host": host}))


def test_a_size_read_from_a_tensor_a_block_makes_stays_in_that_block(host):
    """A decode step's graph reads the grown cache's length from the tensor cat makes
    (a Llama with grouped-query attention repeats its keys so): the size and the
    arithmetic on it go into the block with their readers, one block, not three cut at
    each size."""
    graph = _symbolic(_grown_and_paired, host, fresh(2, 5, 4), fresh(2, 1, 4))
    for length in (3, 6, 9):
        past, token = fresh(2, length, 4), fresh(2, 1, 4)
        assert relative_error(graph(past, token), _grown_and_paired(past, token)) < 1e-5
    assert [len(b.variants) for b in graph.report.blocks.values()] == [1]


def _scaled_by_a_length(pairs: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    kept = torch.view_as_complex(pairs)  # complex: stays in PyTorch
    return (y * kept.shape[1]).tanh(), kept


def test_a_size_read_from_a_graph_input_goes_into_the_block(host):
    """The block reading a length that only an input beside it carries is fed that input
    for its size, so one variant serves every length (the size stayed in PyTorch and was
    fixed: a variant per length)."""
    graph = _symbolic(_scaled_by_a_length, host, fresh(3, 5, 2), fresh(3, 4))
    for length in (3, 6, 9):
        pairs, y = fresh(3, length, 2), fresh(3, 4)
        got, want = graph(pairs, y), _scaled_by_a_length(pairs, y)
        assert relative_error(got[0], want[0]) < 1e-5 and torch.equal(got[1], want[1])
    assert [len(b.variants) for b in graph.report.blocks.values()] == [1]
    assert [n.op for n in graph.report.kept_nodes] == ["aten.view_as_complex.default"]


def test_a_block_holds_its_weights_once(host):
    """The exported model becomes the host's graph as it is: one copy of the weights
    beside the sessions', not two (a 156M-parameter Llama's generate took 6.9 GB, then
    5.1)."""
    fresh_weights()
    linear = nn.Linear(8, 8).eval()
    graph = CompiledGraph(make_fx(lambda x: linear(x).relu())(fresh(2, 8)),
                          OffloadOptions.of({"host": host}))
    x = fresh(2, 8)
    with torch.no_grad():
        assert relative_error(graph(x), linear(x).relu()) < 1e-5
    (block,) = [m for m in graph.module.modules() if isinstance(m, OffloadedBlock)]
    (variant,) = block.variants
    assert variant.exported.model is host.graph(variant.network).model
