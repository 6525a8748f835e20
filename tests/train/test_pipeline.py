"""The pipelined training step: it equals the unpipelined full-batch step, keeps weights on
their devices, runs stages at once, holds what each schedule promises, and runs on every
device kind."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from runtime.devices import parse_devices
from runtime.devices.config import DeviceConfig
from runtime.errors import ProvisionError, TrainingError
from runtime.graph import load_graph
from runtime.observe.events import EVENT_KINDS, Event, EventBus
from runtime.train import loss_and_gradients
from runtime.train.optimizers import Optimizer
from runtime.train.pipeline import _links
from runtime.train.trainer import TrainConfig, Trainer
from tests.support.fakes import FakeDevice
from tests.support.train_models import (
    FRESH_FORMS,
    attention,
    batch_for,
    cnn,
    exported,
    fresh,
    functions,
    interleaved,
    mlp,
    tied,
)

WEIGHTS_ATOL = 1e-5


def with_weights(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        if t.name in weights:
            t.CopyFrom(numpy_helper.from_array(weights[t.name], t.name))
    return out


class Reference:
    """The unpipelined step, written here from PyTorch's definitions: the full batch's
    gradients (`runtime.train.gradients`, checked against central differences elsewhere),
    then the optimizer in numpy."""

    def __init__(self, optimizer: Optimizer, weights: dict[str, np.ndarray]) -> None:
        self.o, self.t = optimizer, 0
        self.w = {k: v.astype(np.float64) for k, v in weights.items()}
        self.state = {k: [np.zeros_like(v), np.zeros_like(v)] for k, v in self.w.items()}

    def step(self, grads: dict[str, np.ndarray]) -> None:
        o = self.o
        self.t += 1
        for name, g in grads.items():
            g = g.astype(np.float64)
            a, b = self.state[name]
            if o.kind == "sgd":
                update = g
            elif o.kind == "momentum":
                a[...] = o.momentum * a + g
                update = a
            else:
                a[...] = o.beta1 * a + (1 - o.beta1) * g
                b[...] = o.beta2 * b + (1 - o.beta2) * g * g
                update = (a / (1 - o.beta1 ** self.t)) / (
                    np.sqrt(b / (1 - o.beta2 ** self.t)) + o.eps)
            self.w[name] = self.w[name] - o.lr * update


def data_for(model: onnx.ModelProto, rng: np.random.Generator, rows: int, classes: int
             ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    return batch_for(model, rng, rows), rng.integers(0, classes, rows)


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_stages_reading_the_wrong_way_are_refused_at_once(phase: str) -> None:
    """A forward reading a later stage's output, or a backward an earlier stage's, would
    wait on itself until the step's timeout: refused as the pipeline is built."""
    def stage(index: int, reads: tuple[str, ...], gives: tuple[str, ...]) -> Any:
        sides = {p: SimpleNamespace(feeds=(), outputs=()) for p in ("forward", "backward")}
        sides[phase] = SimpleNamespace(feeds=reads, outputs=gives)
        return SimpleNamespace(index=index, partition=f"p{index}", program=sides.__getitem__,
                               **sides)

    first, second = (("from_p1",), ()), ((), ("from_p1",))
    if phase == "backward":  # gradients flow back: a backward reading an earlier one's
        first, second = ((), ("from_p0",)), (("from_p0",), ())
    with pytest.raises(TrainingError, match=rf"p\d\)'s {phase} reads from_p\d from stage "
                                            r"\d's: the stages would wait on each other"):
        _links([stage(0, *first), stage(1, *second)])


def test_a_weight_and_a_scalar_read_on_both_stages_later_reader_first():
    """The copy of a shared weight goes with its earliest stage's reader, not its first
    in the graph (there, the second stage's: the first stage read from the second, and
    the step waited out its timeout); a scalar's readers take it as a constant, with no
    gradient whose parts meet across the stages. Same weights as the full-batch step."""
    rng = np.random.default_rng()
    model, user_map = interleaved(rng)
    data, labels = data_for(model, rng, 8, 3)
    opt = Optimizer("sgd", lr=0.1)
    config = TrainConfig(optimizer=opt, batch_size=8, micro_batches=2, epochs=1,
                         partition=user_map, seed=None)
    with Trainer(model, data, labels, parse_devices("cpu:2"), config) as trainer:
        plan = trainer.pipeline.plan
        assert (plan.partition_of("b_mul").name, plan.partition_of("a_mul").name) == (
            "second", "first")
        before = trainer.pipeline.weights()
        report = trainer.pipeline.step(trainer._micro_batches(np.arange(8)), opt.lr, 0,
                                       timeout=30)
        got = trainer.pipeline.weights()
    want_loss, grads = loss_and_gradients(model, data, labels)
    assert report.loss == pytest.approx(want_loss, abs=1e-5)
    for w in ("w0", "b0", "shared", "w1", "b1"):
        np.testing.assert_allclose(got[w], before[w] - 0.1 * grads[w], atol=WEIGHTS_ATOL,
                                   rtol=0, err_msg=w)
    assert "s" not in got  # a constant, not trained


@pytest.mark.parametrize(("schedule", "optimizer", "devices", "name", "ignored"), [
    ("gpipe", "sgd", "cpu:3", "mlp", False), ("1f1b", "momentum", "sim:3", "mlp", True),
    ("1f1b", "adam", "cpu:2", "attention", False),
    ("gpipe", "adam", "cpu:2,sim:2", "cnn_plain", False),
    ("1f1b", "momentum", "sim:3", "exported", False),
    ("1f1b", "adam", "cpu:2", "tied", False), ("gpipe", "sgd", "sim:3", "tied", True),
    ("1f1b", "sgd", "cpu:2", "functions", False),
])
def test_pipelined_steps_equal_full_batch_steps(schedule: str, optimizer: str, devices: str,
                                               name: str, ignored: bool) -> None:
    """Same loss and weights within 1e-5, step after step (the optimizer's state too).
    With labels of -100 (ignored) spread unevenly, micro-batches weigh by the labels they
    count, so the step is still the full batch's mean, one of no labels included. Each
    step's reference starts from the pipeline's weights: from its own, 1e-7 apart, a Relu
    input within that of zero (one run in ~100) flips and parts the two by 1e-3."""
    rng = np.random.default_rng()
    model = {"mlp": lambda: mlp(rng), "attention": lambda: attention(rng),
             "cnn_plain": lambda: cnn(rng, batch_norm=False),
             "exported": lambda: exported_plain(rng), "tied": lambda: tied(rng),
             "functions": lambda: functions(rng)}[name]()
    classes = model.graph.output[0].type.tensor_type.shape.dim[1].dim_value
    batch, micro, steps = 12, 4, 3
    data, labels = data_for(model, rng, batch * steps, classes)
    if ignored:  # a third at random, and the first micro-batch whole (its mean is 0 / 0)
        labels[rng.choice(batch * steps, batch * steps // 3, replace=False)] = -100
        labels[:batch // micro] = -100
    opt = Optimizer(optimizer, lr=0.05 if optimizer != "adam" else 0.01)
    config = TrainConfig(optimizer=opt, batch_size=batch, micro_batches=micro, epochs=1,
                         schedule=schedule, seed=None)
    with Trainer(model, data, labels, parse_devices(devices), config) as trainer:
        assert len(trainer.pipeline.stages) > 1
        if name == "tied":  # one weight, read on two stages: its copy crosses, its gradient too
            plan = trainer.pipeline.plan
            assert plan.partition_of("first") != plan.partition_of("last")
        ref = Reference(opt, {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
                              if t.data_type == onnx.TensorProto.FLOAT and t.dims})
        for step in range(steps):
            rows = np.arange(step * batch, (step + 1) * batch)
            before = trainer.pipeline.weights()
            report = trainer.pipeline.step(trainer._micro_batches(rows), opt.lr, step)
            ref.w = {k: before[k].astype(np.float64) for k in ref.w}
            current = with_weights(model, {k: before[k] for k in ref.w})
            want_loss, grads = loss_and_gradients(current, {k: v[rows] for k, v in data.items()},
                                                  labels[rows])
            ref.step({w: g for w, g in grads.items() if w in ref.w})
            assert report.loss == pytest.approx(want_loss, abs=1e-5)
            got = trainer.pipeline.weights()
            for w, value in ref.w.items():
                np.testing.assert_allclose(got[w], value, atol=WEIGHTS_ATOL, rtol=0,
                                           err_msg=f"{w} after step {step}")


def exported_plain(rng: np.random.Generator) -> onnx.ModelProto:
    """`exported` without its batch norm (whose statistics are per micro-batch)."""
    model = exported(rng)
    node = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    node.CopyFrom(helper.make_node("Identity", [node.input[0]], [node.output[0]],
                                   name=node.name))
    kept = [t for t in model.graph.initializer if not t.name.startswith("bn.")]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


def spied(trainer: Trainer) -> list[tuple[str, set[str], set[str]]]:
    """Every run the trainer's devices are given: (key, feed names, output names)."""
    seen: list[tuple[str, set[str], set[str]]] = []
    for device in trainer.devices.values():
        original = device.call

        def call(key, feeds, tag, done, original=original):
            def landed(outputs, error):
                seen.append((key, set(feeds), set(outputs or {})))
                done(outputs, error)
            original(key, feeds, tag, landed)

        device.call = call  # type: ignore[method-assign]
    return seen


def test_weights_and_optimizer_state_stay_on_their_devices() -> None:
    rng = np.random.default_rng()
    model = mlp(rng)
    data, labels = data_for(model, rng, 32, 3)
    config = TrainConfig(optimizer=Optimizer("adam", 0.01), batch_size=16, micro_batches=4,
                         epochs=2, schedule="1f1b")
    with Trainer(model, data, labels, parse_devices("sim:3"), config) as trainer:
        seen = spied(trainer)
        trainer.run()
        weights = {t.name for t in model.graph.initializer}
        moved = [(key, (feeds | outs) & weights) for key, feeds, outs in seen
                 if (feeds | outs) & weights]
        assert seen and not moved
        for stage in trainer.pipeline.stages:
            device = trainer.devices[stage.device]
            resident = sum(v.nbytes for v in stage.resident.values())
            assert device.stats().used_bytes >= resident > 0


def test_stages_run_at_once_on_their_devices() -> None:
    rng = np.random.default_rng()
    model = mlp(rng, sizes=(8, 8, 8, 8, 4))
    data, labels = data_for(model, rng, 32, 4)
    config = TrainConfig(batch_size=32, micro_batches=8, schedule="gpipe")
    devices = parse_devices("sim:4:flops=20M")  # each run held for about a millisecond
    with Trainer(model, data, labels, devices, config) as trainer:
        report = trainer.run() and trainer.reports[0]
    spans = [(r.device, r.start, r.start + r.seconds) for r in report.records if r.seconds]
    overlapping = {(a[0], b[0]) for a in spans for b in spans
                   if a[0] != b[0] and a[1] < b[2] and b[1] < a[2]}
    assert len({d for pair in overlapping for d in pair}) >= 3


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_activations_held_per_schedule(schedule: str) -> None:
    """GPipe holds all M micro-batches' activations in the first stage; 1F1B at most
    K - k in stage k."""
    rng = np.random.default_rng()
    model = mlp(rng, sizes=(8, 8, 8, 8, 4))
    micro = 8
    data, labels = data_for(model, rng, 32, 4)
    config = TrainConfig(batch_size=32, micro_batches=micro, schedule=schedule)
    with Trainer(model, data, labels, parse_devices("cpu:4"), config) as trainer:
        result = trainer.run()
        one = [trainer.pipeline.kept_bytes(k) for k in range(len(trainer.pipeline.stages))]
    k = result.stages
    assert k == 4
    for stage, (peak, each) in enumerate(zip(result.peak_activation_bytes, one, strict=True)):
        held = micro if schedule == "gpipe" else min(k - stage, micro)
        assert peak == held * each, (stage, peak, each)


@pytest.mark.parametrize("spec", ["cpu:2", "sim:2", "reference:2"])
def test_every_device_kind_trains(spec: str) -> None:
    rng = np.random.default_rng(7)
    model = cnn(rng)
    data, labels = data_for(model, rng, 24, 5)
    config = TrainConfig(optimizer=Optimizer("momentum", 0.05), batch_size=8,
                         micro_batches=2, epochs=2, seed=3)
    with Trainer(model, data, labels, parse_devices("cpu:1"), config) as trainer:
        want = trainer.run()
    with Trainer(model, data, labels, parse_devices(spec), config) as trainer:
        got = trainer.run()
        assert got.stages == 2
    for a, b in zip(got.epochs, want.epochs, strict=True):
        assert a.loss == pytest.approx(b.loss, abs=1e-5)


@pytest.mark.parametrize("shared", ["no", "identity", "slots"])
def test_batch_norm_running_statistics_are_updated(shared: str) -> None:
    """BatchNormalization straight on the input: its running mean after one step is
    0.9 * 0 + 0.1 * the batch's per-channel mean, its variance likewise (unbiased).
    `shared`: as PyTorch's exporters write a fresh BatchNorm, one initializer for equal
    ones: the running mean an Identity of the bias and the variance of the scale
    (TorchScript), or the bias and scale read again as the statistics (dynamo)."""
    rng = np.random.default_rng()
    c = 3
    weights = {"s": np.ones(c, np.float32), "b": np.zeros(c, np.float32),
               "m": np.zeros(c, np.float32), "v": np.ones(c, np.float32),
               "w": rng.standard_normal((c * 4, 2)).astype(np.float32)}
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Flatten", ["n"], ["f"]),
             helper.make_node("MatMul", ["f", "w"], ["y"])]
    if shared != "no":
        del weights["m"], weights["v"]
    if shared == "identity":
        nodes[:0] = [helper.make_node("Identity", ["b"], ["m"]),
                     helper.make_node("Identity", ["s"], ["v"])]
    if shared == "slots":
        nodes[0] = helper.make_node("BatchNormalization", ["x", "s", "b", "b", "s"], ["n"],
                                    name="bn")
    graph = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, ["batch", c, 2, 2])], [helper.make_tensor_value_info(
            "y", onnx.TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    x = rng.standard_normal((8, c, 2, 2)).astype(np.float32) * 3 + 1
    config = TrainConfig(batch_size=8, micro_batches=1, seed=None)
    with Trainer(model, {"x": x}, rng.integers(0, 2, 8), parse_devices("cpu:1"),
                 config) as trainer:
        trainer.run()
        trained = {t.name: numpy_helper.to_array(t)
                   for t in trainer.trained_model().graph.initializer}
    mean, var = ("bn/running_mean", "bn/running_var") if shared == "slots" else ("m", "v")
    np.testing.assert_allclose(trained[mean], 0.1 * x.mean(axis=(0, 2, 3)), atol=1e-5)
    np.testing.assert_allclose(trained[var], 0.9 + 0.1 * x.var(axis=(0, 2, 3), ddof=1),
                               atol=1e-4)


@pytest.mark.parametrize("form", [f for f in FRESH_FORMS if f != "separate"])
def test_parameters_an_exporter_stored_once_train_apart(form: str) -> None:
    """Pipelined over two devices, a fresh network as an exporter wrote it trains as
    PyTorch holds it, each parameter its own and the tied matrix one, and is written out
    so."""
    rng = np.random.default_rng()
    seed = int(rng.integers(1 << 30))
    data, labels = data_for(fresh(np.random.default_rng(seed)), rng, 16, 3)
    config = TrainConfig(optimizer=Optimizer("sgd", lr=0.5), batch_size=8, micro_batches=2,
                         seed=0)
    trained = []
    for model in (fresh(np.random.default_rng(seed)), fresh(np.random.default_rng(seed), form)):
        with Trainer(model, data, labels, parse_devices("cpu:2"), config) as trainer:
            trainer.run()
            trained.append({t.name: numpy_helper.to_array(t)
                            for t in trainer.trained_model().graph.initializer})
    want, got = trained
    assert not np.allclose(want["ln1.weight"], want["ln2.weight"])
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, atol=WEIGHTS_ATOL, err_msg=name)


@pytest.mark.parametrize("form", FRESH_FORMS)
def test_a_map_of_the_files_nodes_places_a_network_training_owns_apart(form: str) -> None:
    """A map written for the file, every node named and no default, places the network
    as trained: a TorchScript Identity taken for its parameter is named as a folded node
    is, and the tied weight's transpose read again goes with its first reader."""
    rng = np.random.default_rng()
    model = fresh(rng, form)
    names = [n.name for n in load_graph(model, fold=False).nodes]
    half = int(rng.integers(1, len(names)))
    user_map = {"partitions": {"a": "cpu0", "b": "cpu1"},
                "nodes": {n: "a" if i < half else "b" for i, n in enumerate(names)}}
    data, labels = data_for(model, rng, 16, 3)
    config = TrainConfig(batch_size=8, micro_batches=2, partition=user_map)
    with Trainer(model, data, labels, parse_devices("cpu:2"), config) as trainer:
        trainer.run()
        placed = {n: p.name for p in trainer.plan.partitions for n in p.nodes}
        graph = trainer.costed
    for node, part in placed.items():
        reader = min(graph.consumers.get(graph.by_name[node].writes[0], [node]),
                     key=[n.name for n in graph.nodes].index)
        assert part == user_map["nodes"].get(node, placed[reader]), node


def test_a_stage_whose_outputs_the_loss_never_reads_does_nothing() -> None:
    """The loss reads the first output; a stage holding only a second output's branch
    (Keras' image-resize model, three outputs) has nothing to send: it runs no forward
    (onnxruntime refused a run that asks for no output), and its weight stays as it was."""
    rng = np.random.default_rng()
    weights = {f"w{i}": rng.standard_normal((4, 3)).astype(np.float32) for i in range(2)}
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w0"], ["y"], name="first"),
         helper.make_node("MatMul", ["x", "w1"], ["z"], name="second")], "two_outputs",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, ["batch", 3]) for t in "yz"],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    user_map = {"partitions": {"a": "cpu0", "b": "cpu1"}, "nodes": {"first": "a", "second": "b"}}
    config = TrainConfig(loss="mse", batch_size=4, micro_batches=2, partition=user_map)
    data = {"x": rng.standard_normal((8, 4)).astype(np.float32)}
    with Trainer(model, data, rng.standard_normal((8, 3)).astype(np.float32),
                 parse_devices("cpu:2"), config) as trainer:
        trainer.run()
        trained = {t.name: numpy_helper.to_array(t)
                   for t in trainer.trained_model().graph.initializer}
    assert not np.allclose(trained["w0"], weights["w0"])
    np.testing.assert_array_equal(trained["w1"], weights["w1"])


def test_a_float16_gradient_crosses_stages_as_float16() -> None:
    """An autocast export: float32 in, a float16 layer, cast back, a float32 head. Split
    between the two, the gradient sent back is the float16 activation's (it was declared
    the prediction's float32, and onnxruntime refused the first stage's backward); on one
    stage, Adam steps both weights, its rate and step count in float32 (they were held in
    the first weight's float16). The split run trains as the one-stage run does."""
    rng = np.random.default_rng()
    weights = {"w0": rng.standard_normal((4, 6)).astype(np.float16),
               "w1": rng.standard_normal((6, 3)).astype(np.float32)}
    half = onnx.TensorProto.FLOAT16
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["xh"], name="down", to=half),
         helper.make_node("MatMul", ["xh", "w0"], ["h"], name="layer"),
         helper.make_node("Cast", ["h"], ["hf"], name="up", to=onnx.TensorProto.FLOAT),
         helper.make_node("MatMul", ["hf", "w1"], ["y"], name="head")], "autocast",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = {"x": rng.standard_normal((8, 4)).astype(np.float32)}
    labels = rng.standard_normal((8, 3)).astype(np.float32)
    user_map = {"partitions": {"a": "cpu0", "b": "cpu1"},
                "nodes": {"down": "a", "layer": "a", "up": "b", "head": "b"}}
    trained = []
    for stages, partition in ((1, {}), (2, {"partition": user_map})):
        config = TrainConfig(loss="mse", batch_size=4, micro_batches=2, epochs=2,
                             optimizer=Optimizer("adam", 1e-2), **partition)
        with Trainer(model, data, labels, parse_devices(f"cpu:{stages}"), config) as trainer:
            assert len(trainer.pipeline.stages) == stages and trainer.run()
            trained.append({t.name: numpy_helper.to_array(t)
                            for t in trainer.trained_model().graph.initializer})
    one, split = trained
    for w, before in weights.items():
        assert split[w].dtype == before.dtype and not np.array_equal(split[w], before)
        np.testing.assert_allclose(split[w].astype(np.float32), one[w].astype(np.float32),
                                   rtol=1e-3, atol=1e-3, err_msg=w)


def _clipped_mlp(opset: int, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """MatMul, Clip, Unsqueeze, Squeeze, MatMul, with what `opset` writes as attributes
    (9: Clip's bounds and the axes) or as inputs (17)."""
    if opset < 11:
        bounds, axes = [], {"axes": [1]}
        clip, unsqueeze, squeeze = {"min": -1.0, "max": 1.0}, ["c"], ["u"]
    else:
        bounds, axes = [numpy_helper.from_array(np.float32(v), n) for n, v in
                        (("lo", -1.0), ("hi", 1.0))] + [
            numpy_helper.from_array(np.array([1], np.int64), "axis")], {}
        clip, unsqueeze, squeeze = {}, ["c", "axis"], ["u", "axis"]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w0"], ["a"], name="first"),
         helper.make_node("Clip", ["a", *(["lo", "hi"] if bounds else [])], ["c"],
                          name="clip", **clip),
         helper.make_node("Unsqueeze", unsqueeze, ["u"], name="unsqueeze", **axes),
         helper.make_node("Squeeze", squeeze, ["s"], name="squeeze", **axes),
         helper.make_node("MatMul", ["s", "w1"], ["y"], name="second")], f"clipped{opset}",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()] + bounds)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_an_opset_9_model_trains_split_as_its_opset_17_twin() -> None:
    """onnx's version converter raises an old model to the training opset and writes the
    nodes it adds (a Constant for each attribute that became an input) without names: a
    stage could not be found for them, and torchvision's exports at opset 9 or 11 did not
    train. Each now serves the model's node that reads it."""
    rng = np.random.default_rng()
    weights = {"w0": rng.standard_normal((4, 6)).astype(np.float32),
               "w1": rng.standard_normal((6, 3)).astype(np.float32)}
    data = {"x": rng.standard_normal((8, 4)).astype(np.float32)}
    labels = rng.standard_normal((8, 3)).astype(np.float32)
    user_map = {"partitions": {"a": "cpu0", "b": "cpu1"},
                "nodes": {"first": "a", "clip": "a", "unsqueeze": "b", "squeeze": "b",
                          "second": "b"}}
    config = TrainConfig(loss="mse", batch_size=4, micro_batches=2, partition=user_map)
    trained = []
    for opset in (9, 17):
        with Trainer(_clipped_mlp(opset, weights), data, labels, parse_devices("cpu:2"),
                     config) as trainer:
            trainer.run()
            trained.append({t.name: numpy_helper.to_array(t)
                            for t in trainer.trained_model().graph.initializer})
    old, new = trained
    for w in weights:
        assert not np.array_equal(old[w], weights[w])
        np.testing.assert_allclose(old[w], new[w], rtol=1e-6, atol=1e-6, err_msg=w)


def test_every_stage_step_is_an_event() -> None:
    rng = np.random.default_rng()
    model = mlp(rng)
    data, labels = data_for(model, rng, 32, 3)
    bus = EventBus()
    seen = bus.subscribe(maxlen=100_000)
    config = TrainConfig(batch_size=16, micro_batches=4, epochs=2)
    with Trainer(model, data, labels, parse_devices("cpu:3"), config, bus=bus) as trainer:
        result = trainer.run()
    got = seen.drain()
    kinds = [e.kind for e in got]
    steps = result.steps
    assert kinds.count("train.started") == 1 and kinds.count("train.finished") == 1
    assert kinds.count("train.epoch.finished") == 2
    assert kinds.count("train.step.started") == kinds.count("train.step.finished") == steps
    stage_steps = [e for e in got if e.kind == "train.stage.finished"]
    assert len(stage_steps) == steps * result.stages * (2 * 4 + 1)
    assert {e["phase"] for e in stage_steps} == {"forward", "backward", "update"}
    runs = [e for e in got if e.kind == "partition.run.finished"]
    assert runs and all(e["network"] == trainer.name for e in runs)
    for e in got:
        assert not set(EVENT_KINDS.get(e.kind, ())) - set(e.fields), e.kind
        assert Event.from_json(e.to_json()) == e


def test_the_trained_model_runs_in_plain_onnxruntime_and_learned() -> None:
    import onnxruntime as ort

    rng = np.random.default_rng(5)
    model = mlp(rng, sizes=(6, 16, 16, 3))
    x = rng.standard_normal((96, 6)).astype(np.float32)
    labels = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)
    config = TrainConfig(optimizer=Optimizer("adam", 0.02), batch_size=16, micro_batches=2,
                         epochs=15)
    with Trainer(model, {"x": x}, labels, parse_devices("cpu:2"), config) as trainer:
        result = trainer.run()
        trained = trainer.trained_model()
    assert result.epochs[-1].loss < 0.5 * result.epochs[0].loss
    session = ort.InferenceSession(trained.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    accuracy = float(np.mean(session.run(None, {"x": x})[0].argmax(1) == labels))
    assert accuracy > 0.8
    assert [n.op_type for n in trained.graph.node] == [n.op_type for n in model.graph.node]


# -- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "says"), [
    ({"data": {}}, "no array 'x'"),
    ({"labels": np.zeros(31, np.int64)}, "x has 32 rows but labels has 31"),
    ({"data": {"x": np.zeros((32, 6), np.float64)}}, "'x'"),
    ({"data": {"x": np.zeros((32, 5), np.float32)}}, "'x'"),
    ({"labels": np.zeros((32, 3))}, "integer class labels"),
    ({"config": {"batch_size": 64}}, "32 samples are fewer than one batch of 64"),
    ({"config": {"batch_size": 16, "micro_batches": 3}}, "does not split into 3"),
    ({"config": {"schedule": "zigzag"}}, "unknown schedule"),
])
def test_bad_input_is_one_line(change: dict, says: str) -> None:
    rng = np.random.default_rng()
    model = mlp(rng)
    data = change.get("data", {"x": rng.standard_normal((32, 6)).astype(np.float32)})
    labels = change.get("labels", rng.integers(0, 3, 32))
    with pytest.raises(Exception) as info:
        config = TrainConfig(**{"batch_size": 8, **change.get("config", {})})
        Trainer(model, data, labels, parse_devices("cpu:2"), config)
    assert says in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, TrainingError) or "input" in str(info.value)


def test_a_model_of_a_fixed_batch_says_the_batch_size_it_takes() -> None:
    """torch.onnx.export(dynamo=True) without dynamic shapes fixes the batch: a batch
    split into micro-batches of another size was refused as "expected int64 [2, 10],
    got int64 [4, 10]", naming neither the batch size nor the one that fits."""
    rng = np.random.default_rng()
    model = mlp(rng)
    rows = int(rng.integers(2, 5))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = rows
    micro = int(rng.integers(2, 4))
    config = TrainConfig(batch_size=(rows + 1) * micro, micro_batches=micro)
    data = {"x": rng.standard_normal((32, 6)).astype(np.float32)}
    with pytest.raises(TrainingError, match=rf"^input 'x' of .* takes {rows} rows at a time "
                                            rf".* make the batch size {rows * micro}$"):
        Trainer(model, data, rng.integers(0, 3, 32), parse_devices("cpu:2"), config)
    with Trainer(model, data, rng.integers(0, 3, 32), parse_devices("cpu:2"),
                 TrainConfig(batch_size=rows * micro, micro_batches=micro)) as trainer:
        assert trainer.config.micro_size == rows


def test_a_device_that_cannot_keep_weights_is_refused() -> None:
    """A device of another kind (a Ray actor, a fake) keeps no resident tensors."""
    device = FakeDevice(DeviceConfig("fake0"))
    try:
        with pytest.raises(ProvisionError, match=r"fake0 .* cannot keep tensors between runs"):
            device.place({"w": np.zeros(2)})
    finally:
        device.close()


def test_a_weight_standardized_by_a_training_batch_norm_trains_over_two_stages() -> None:
    """timm's ScaledStdConv2d as TorchScript writes it: a BatchNormalization in training
    mode over the reshaped weight, its "running" inputs reductions of that weight. Such
    statistics are computed, not kept: the trainer built no stage for them before (a
    KeyError). The weight's gradient flows through the standardization."""
    rng = np.random.default_rng()
    out, cin = 4, 3
    weights = {"w": rng.standard_normal((out, cin, 3, 3)).astype(np.float32),
               "gain": np.ones(out, np.float32), "zero": np.zeros(out, np.float32),
               "rows": np.array([1, out, -1]), "kernel": np.array([out, cin, 3, 3])}
    nodes = [helper.make_node("Reshape", ["w", "rows"], ["wr"]),
             helper.make_node("ReduceMean", ["wr"], ["mean"], axes=[0, 2], keepdims=0),
             helper.make_node("Mul", ["wr", "wr"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["var"], axes=[0, 2], keepdims=0),
             helper.make_node("BatchNormalization", ["wr", "gain", "zero", "mean", "var"],
                              ["ws"], training_mode=1, momentum=1.0, name="standardize"),
             helper.make_node("Reshape", ["ws", "kernel"], ["k"]),
             helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("GlobalAveragePool", ["c"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["y"], name="flat")]
    model = helper.make_model(helper.make_graph(
        nodes, "std_conv", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                          ["batch", cin, 6, 6])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", out])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()]),
        opset_imports=[helper.make_opsetid("", 15)], ir_version=8)
    x = rng.standard_normal((8, cin, 6, 6)).astype(np.float32)
    labels = rng.integers(0, out, 8)
    grads = loss_and_gradients(model, {"x": x}, labels)[1]
    # along the gradient, where the difference is largest: along a random direction it
    # was within float32's resolution of the loss and missed 2 % (worst of 60 draws here
    # 1.6e-2, along the gradient 7e-5)
    direction = grads["w"]
    step = 1e-2 / np.linalg.norm(direction)
    ahead, behind = (loss_and_gradients(with_weights(model, {"w": weights["w"] + s * direction}),
                                        {"x": x}, labels)[0] for s in (step, -step))
    numeric = (ahead - behind) / (2 * step)
    assert float((grads["w"] * direction).sum()) == pytest.approx(numeric, rel=1e-3)
    split = {"default": "p0", "partitions": {"p0": "cpu0", "p1": "cpu1"},
             "nodes": dict.fromkeys(["pool", "flat"], "p1")}
    config = TrainConfig(optimizer=Optimizer("sgd", lr=0.1), batch_size=4, micro_batches=2,
                         partition=split, seed=0)
    with Trainer(model, {"x": x}, labels, parse_devices("cpu:2"), config) as trainer:
        result = trainer.run()
        assert result.stages == 2 and np.isfinite(result.epochs[-1].loss)
        trained = {t.name: numpy_helper.to_array(t)
                   for t in trainer.trained_model().graph.initializer}
    assert not np.allclose(trained["w"], weights["w"])
    assert {"mean", "var"}.isdisjoint(trained)


def test_weights_written_as_constant_nodes_train_as_initializers_do() -> None:
    """PaddlePaddle's exporter writes every weight as a Constant node (PP-OCR's text
    detector): "has no trainable weights" before. Trained, they move exactly as the same
    weights written as initializers do; a scalar Constant stays a constant."""
    rng = np.random.default_rng()
    weights = {"w1": rng.standard_normal((6, 8)).astype(np.float32),
               "b1": rng.standard_normal(8).astype(np.float32),
               "w2": rng.standard_normal((8, 3)).astype(np.float32)}
    half = np.array(0.5, np.float32)
    layers = [helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
              helper.make_node("Add", ["m1", "b1"], ["a1"], name="add1"),
              helper.make_node("Relu", ["a1"], ["r1"], name="relu"),
              helper.make_node("Mul", ["r1", "half"], ["h1"], name="scale"),
              helper.make_node("MatMul", ["h1", "w2"], ["y"], name="mm2")]
    io = ([helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 6])],
          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 3])])

    def model(as_constants: bool) -> onnx.ModelProto:
        values = {**weights, "half": half}
        constants = [helper.make_node("Constant", [], [k], name=f"const_{k}",
                                      value=numpy_helper.from_array(v, k))
                     for k, v in values.items()] if as_constants else []
        inits = [] if as_constants else [numpy_helper.from_array(v, k) for k, v in values.items()]
        return helper.make_model(helper.make_graph([*constants, *layers], "paddle_style", *io,
                                                   inits),
                                 opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    x = rng.standard_normal((16, 6)).astype(np.float32)
    targets = rng.standard_normal((16, 3)).astype(np.float32)
    config = TrainConfig(loss="mse", optimizer=Optimizer("sgd", lr=0.05), batch_size=8,
                         micro_batches=2, epochs=3, seed=0,
                         partition={"default": "p0", "partitions": {"p0": "cpu0", "p1": "cpu1"},
                                    "nodes": {"scale": "p1", "mm2": "p1"}})
    trained = []
    for as_constants in (True, False):
        with Trainer(model(as_constants), {"x": x}, targets, parse_devices("cpu:2"),
                     config) as trainer:
            result = trainer.run()
            assert result.stages == 2
            assert result.epochs[-1].loss < result.epochs[0].loss
            trained.append({t.name: numpy_helper.to_array(t)
                            for t in trainer.trained_model().graph.initializer})
    from_constants, from_initializers = trained
    assert set(weights) <= set(from_constants)
    for name, start in weights.items():
        assert not np.allclose(from_constants[name], start)
        np.testing.assert_allclose(from_constants[name], from_initializers[name], rtol=1e-5,
                                   atol=1e-6)
    assert float(from_constants.get("half", half)) == 0.5
