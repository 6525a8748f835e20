"""When Prism cannot run part of a graph, PyTorch runs it: an operator the exporter fails
at, ONNX no device of the host runs, a host that stops answering. The answer is always
eager PyTorch's, with one warning line naming what stays behind; never an error, never a
hang. Options are checked before anything is traced."""

from __future__ import annotations

import copy
import logging
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx
from torch.onnx._internal.exporter import _core, _registration

import runtime.torch
from runtime.devices import DeviceConfig, supported_ops
from runtime.errors import PrismError
from runtime.host import HostManager
from runtime.torch import OffloadWarning
from runtime.torch.compiled import collecting
from runtime.torch.export import export_block, onnx_registry
from runtime.torch.options import OffloadOptions
from tests.support.torch_modules import fresh, relative_error


@torch.library.custom_op("prism_tests::fragile", mutates_args=())
def fragile(x: torch.Tensor) -> torch.Tensor:
    """Tripled. Its ONNX translation, registered in torch.onnx's registry, fails: the
    backend's support check passes, the export fails at it."""
    return x * 3


@fragile.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _translation(x):  # type: ignore[no-untyped-def]
    raise RuntimeError("prism_tests.fragile has no ONNX translation")


onnx_registry().register_op(torch.ops.prism_tests.fragile.default, _translation)
FRAGILE = "prism_tests.fragile.default"


def offload_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, OffloadWarning)]


def run(function, *args, **options):  # type: ignore[no-untyped-def]
    """Compile, call once without gradients; (answer, report, OffloadWarning lines)."""
    fast = torch.compile(function, backend="prism", options=options)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad(), \
            collecting() as reports:
        warnings.simplefilter("always")
        answer = fast(*args)
    (report,) = reports
    return answer, report, offload_warnings(caught)


def test_an_operator_the_export_fails_at_stays_in_pytorch_and_the_rest_runs(host):
    layers = nn.Sequential(nn.Linear(6, 6), nn.ReLU())

    def model(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(fragile(layers(x)))

    x = fresh(4, 6)
    answer, report, lines = run(model, x, host=host)
    assert relative_error(answer, model(x).detach()) < 1e-4
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert FRAGILE in lines[0] and "export failed" in lines[0]
    kept = {n.op: n.reason for n in report.kept_nodes}
    assert list(kept) == [FRAGILE] and "export failed" in kept[FRAGILE]
    assert report.offloaded and all(n in host.networks() for n in report.networks)


def test_a_block_that_cannot_be_exported_at_all_runs_in_pytorch(host):
    def model(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(fragile(x))

    x = fresh(3, 5)
    answer, report, lines = run(model, x, host=host, torch_executed_ops=["aten.relu"])
    assert torch.equal(answer, model(x))
    assert len(lines) == 1 and "runs in PyTorch" in lines[0] and FRAGILE in lines[0], lines
    assert not report.offloaded and not report.networks
    block = next(iter(report.blocks.values()))
    assert block.state.startswith("runs in PyTorch") and not block.variants


def test_what_no_device_runs_stays_in_pytorch():
    """Devices without Softmax: the softmax stays in PyTorch, the layers around it become
    two blocks of their own, each on the host."""
    ops = supported_ops("cpu") - {"Softmax"}
    devices = [DeviceConfig(name=f"npu{i}", backend="cpu", supported_ops=ops) for i in range(2)]
    model = nn.Sequential(nn.Linear(8, 16), nn.Softmax(-1), nn.Linear(16, 4)).eval()
    x = fresh(5, 8)
    with HostManager(devices) as narrow:
        answer, report, lines = run(model, x, host=narrow)
        assert relative_error(answer, model(x).detach()) < 1e-4
        assert len(lines) == 1 and "Softmax" in lines[0], lines
        kept = report.kept_nodes
        assert [n.op for n in kept] == ["aten._softmax.default"], report.table()
        assert "Softmax" in kept[0].reason
        live = [b for b in report.blocks.values() if b.variants]
        assert len(live) == 2 and all(b.parent == "b0" for b in live)
        assert sorted(narrow.networks()) == sorted(report.networks)


def test_a_host_that_stops_answering_hands_the_block_back_to_pytorch():
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU()).eval()
    gone = HostManager([DeviceConfig(name="cpu0", backend="cpu")])
    fast = torch.compile(model, backend="prism", options={"host": gone})
    x = fresh(2, 4)
    with torch.no_grad():
        assert relative_error(fast(x), model(x)) < 1e-4
        gone.close()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert relative_error(fast(x), model(x)) < 1e-4
    lines = offload_warnings(caught)
    assert len(lines) == 1 and "its run on Prism failed" in lines[0], lines


@pytest.mark.parametrize(("options", "words"), [
    ({"devices": "cpu:1", "colour": "blue"}, "unknown option(s) colour"),
    ({"devices": "cpu:1", "host": object()}, "either devices or host"),
    ({"host": object()}, "host must be a HostManager"),
    ({"min_block_size": 0}, "min_block_size must be a whole number"),
    ({"batching": {"max_batch": 4}}, "batching: unknown setting"),
    ({"devices": "gpu:9"}, "devices:"),
    ({"custom_translation_table": [print]}, "custom_translation_table must map"),
    ({"custom_translation_table": {torch.ops.aten.sin: print}}, "name an overload"),
    ({"custom_translation_table": {torch.ops.aten.sin.default: 3}}, "is not a function"),
    ({"custom_translation_table": {"aten.sin": print}}, "is not an operator overload"),
])
def test_bad_options_are_refused_in_one_line_before_tracing(options, words):
    with pytest.raises(PrismError) as caught:
        OffloadOptions.of(options)
    assert words in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(PrismError):
        runtime.torch.compile(nn.ReLU(), **options)


@torch.library.custom_op("prism_tests::soft_scaled", mutates_args=())
def soft_scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
    """A library's own operator: torch.onnx has no translation for it."""
    return x / (1 + x.abs()) * scale


@soft_scaled.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


def _soft_scaled_onnx(x, scale: float):  # type: ignore[no-untyped-def]
    from onnxscript.onnx_opset import opset18 as op

    return op.Mul(op.Softsign(x), op.CastLike(scale, x))


def _erfcx_onnx(x):  # type: ignore[no-untyped-def]
    from onnxscript.onnx_opset import opset18 as op

    return op.Mul(op.Exp(op.Mul(x, x)), op.Sub(op.CastLike(1.0, x), op.Erf(x)))


def test_a_custom_operator_given_its_translation_leaves_pytorch(host):
    """As torch.onnx.export's `custom_translation_table`: the operator a library brings
    (transformers' mixture-of-experts matmul), and one whose torchlib translation Prism
    refuses (erfcx's far tails), go into the block with their neighbours, where without
    the table the graph is cut around them."""
    layers = nn.Sequential(nn.Linear(6, 6), nn.ReLU())

    def model(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.special.erfcx(soft_scaled(layers(x), 1.5)))

    table = {torch.ops.prism_tests.soft_scaled.default: _soft_scaled_onnx,
             torch.ops.aten.special_erfcx.default: _erfcx_onnx}
    x = fresh(4, 6)
    answer, report, lines = run(model, x, host=host, custom_translation_table=table)
    assert relative_error(answer, model(x).detach()) < 1e-5 and not lines, lines
    assert not report.kept_nodes and len(report.blocks) == 1, report.table()
    torch._dynamo.reset()  # the same function compiled again, without the table
    _, alone, _ = run(model, x, host=host)
    assert [n.op for n in alone.kept_nodes] == ["prism_tests.soft_scaled.default",
                                                "aten.special_erfcx.default"]
    assert len(alone.blocks) == 2


def test_op_names_read_every_spelling():
    same = {"aten.sub.Tensor", "aten::sub.Tensor", "torch.ops.aten.sub.Tensor",
            str(torch.ops.aten.sub.Tensor)}
    assert OffloadOptions.of({"torch_executed_ops": same}).torch_executed_ops == {
        "aten.sub.Tensor"}
    assert OffloadOptions.of({"torch_executed_ops": ["relu", torch.ops.aten.relu]}
                             ).torch_executed_ops == {"aten.relu"}


def test_a_graph_pytorch_decomposes_wrongly_runs_in_pytorch(host):
    """multilabel_margin_loss is decomposed while AOT autograd lowers the graph, whatever
    table the backend gives, into something that differs from its kernel where a target
    holds -1 padding (its documented use): the graph runs in PyTorch, with a warning."""
    loss = torch.nn.functional.multilabel_margin_loss
    fast = torch.compile(lambda x, t: loss(x, t, reduction="none"), backend="prism",
                         options={"host": host})
    x = fresh(4, 3)
    target = torch.tensor([[0, 2, -1], [1, -1, -1], [2, 1, 0], [-1, 0, 0]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert relative_error(fast(x, target), loss(x, target, reduction="none")) < 1e-6
    (line,) = offload_warnings(caught)
    assert "multilabel_margin_loss" in line and "runs in PyTorch" in line


def test_blocks_share_one_registry_and_export_as_torch_onnx_export_does(host, monkeypatch):
    """torch.onnx.export builds its registry of translations at every call (half a second
    or more); blocks are exported by its own `_core.export` with one registry kept, which
    must give the model the public call gives."""
    build = _registration.ONNXRegistry.from_torchlib
    builds: list[object] = []
    monkeypatch.setattr(_registration.ONNXRegistry, "from_torchlib", staticmethod(
        lambda **kw: builds.append(kw) or build(**kw)))
    exports: list[tuple[tuple, dict, onnx.ModelProto]] = []
    real = _core.export

    def kept(*args, **kw):  # type: ignore[no-untyped-def]
        program = real(*args, **kw)
        exports.append((args, kw, program.model_proto))
        return program

    monkeypatch.setattr(_core, "export", kept)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3), nn.Tanh())
    x = fresh(4, 6)  # the ReLU kept in PyTorch: a block on either side of it
    answer, report, _ = run(model, x, host=host, torch_executed_ops=["aten.relu"])
    assert relative_error(answer, model(x).detach()) < 1e-5
    assert len(exports) == len(report.blocks) == 2, report.table()
    assert len(builds) <= 1, builds  # none if an earlier test built it
    monkeypatch.undo()
    for (wrapper, fed), kw, model_proto in exports:
        public = torch.onnx.export(wrapper, fed, dynamo=True, verbose=False, optimize=True,
                                   dynamic_shapes=kw["dynamic_shapes"])
        assert _without_stacks(public.model_proto) == _without_stacks(model_proto)


@pytest.mark.parametrize("in_place", [False, True], ids=["functional", "in place"])
def test_a_block_is_decomposed_again_only_where_that_changes_it(monkeypatch, in_place):
    """The exporter decomposes the program it traced, a trace of its own (0.6 s of a BERT
    block's 2.1 s export). A block is ATen, decomposed already: it goes on as traced (the
    test above: to the model the public call gives). One the exporter would change, an
    in-place operator say, is decomposed as the exporter does."""
    decompositions: list[tuple] = []
    decompose = torch.export.ExportedProgram.run_decompositions
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions",
                        lambda self, *a, **kw: decompositions.append(a) or decompose(self, *a,
                                                                                    **kw))

    def block(x: torch.Tensor) -> tuple[torch.Tensor]:
        y = x.clone()
        if in_place:
            y.add_(1.0)
        else:
            y = y + 1.0
        return (y * 2.0,)

    x = fresh(int(torch.randint(1, 9, ())), 4)
    exported = export_block(make_fx(block, tracing_mode="fake")(x), [x], frozenset())
    assert len(decompositions) == in_place
    session = ort.InferenceSession(exported.model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {exported.inputs[0][0]: x.numpy()})
    np.testing.assert_allclose(got, ((x + 1) * 2).numpy(), rtol=1e-6)


def _without_stacks(model: onnx.ModelProto) -> bytes:
    """The model's bytes, its nodes' metadata (the Python stack each was traced at) left
    out: it names the frames of whoever called the exporter."""
    model = copy.deepcopy(model)
    for node in model.graph.node:
        del node.metadata_props[:]
    return model.SerializeToString()


def test_a_block_is_timed_on_the_tensors_of_the_call_that_exported_it(host, monkeypatch,
                                                                       caplog):
    """Measured costs time a block on its call's own tensors: made-up ones can be values
    it refuses (torchvision's RoIAlign read a made-up box's image index as -1), and the
    roofline then stood in, with a warning that told a torch.compile user to `--bind`."""
    monkeypatch.setenv("PRISM_COSTS", "measured")
    table = nn.Embedding(1000, 4)

    def model(position: torch.Tensor) -> torch.Tensor:  # in [0, 1): a row, as a float
        return torch.tanh(table((position * 1000).long()))

    position = torch.rand(16)
    with caplog.at_level(logging.WARNING, logger="runtime"):
        answer, report, lines = run(model, position, host=host)
    assert relative_error(answer, model(position).detach()) < 1e-6 and not lines, lines
    assert report.offloaded and len(report.blocks) == 1, report.table()
    assert not [r.getMessage() for r in caplog.records if "roofline" in r.getMessage()]
