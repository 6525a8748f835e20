"""The forward pass as trained: the model's nodes (some rewritten for training by their
rules: batch statistics for BatchNormalization, argmax indices for MaxPool) followed by the
loss, with every float initializer a graph input (a weight), and the facts its gradient
rules read, probed on one real batch.

    fwd = TrainingForward.build(graph, feeds, labels, Loss("cross_entropy"))
    fwd.nodes, fwd.weights, fwd.statistics, fwd.facts
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from runtime.errors import TrainingError
from runtime.graph import Graph, default_opset, reads_of
from runtime.inputs import check_feeds, input_specs
from runtime.onnx_kinds import DEFAULT_DOMAINS, FLOATS
from runtime.opset_raise import raise_opset
from runtime.stored import with_weights
from runtime.train.emit import Emitter
from runtime.train.expand import expand_nodes
from runtime.train.facts import Facts, probe
from runtime.train.loss import LABELS, Loss
from runtime.train.owners import own_statistics
from runtime.train.registry import Rewriting, rule_for

TRAINING_OPSET = 17  # the oldest ai.onnx opset a training graph is written in
LOSS = "train/loss"
EXPANSIONS = 8  # rounds of `expand_nodes`, each probed: Ifs and bodies inside others
SHARED = "shared:"  # + a weight: the origin its copy serves (`_shared_through_copies`)


@dataclass(frozen=True)
class TrainingForward:
    graph: Graph  # the model as loaded (checked, nodes named)
    opset: int
    nodes: tuple[onnx.NodeProto, ...]  # forward (rewritten) then the loss
    origins: Mapping[str, str]  # node -> the model's node it computes (or the loss)
    weights: Mapping[str, np.ndarray]  # every float initializer, by name
    constants: tuple[onnx.TensorProto, ...]  # other initializers, and rewrites' constants
    statistics: Mapping[str, str]  # a running statistic -> the tensor of its next value
    inputs: tuple[str, ...]  # the data inputs
    prediction: str  # the model's first output
    loss: Loss
    facts: Facts
    batch: Mapping[str, np.ndarray]  # the batch it was probed on, labels (LABELS) included
    # the origin a shared weight's copy serves -> the model's nodes reading it
    shared: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.graph.name

    @property
    def trained(self) -> tuple[str, ...]:
        """Weights the optimizer updates: all but the running statistics and scalars. An
        exporter folds constants into 0-d initializers (a Pow's exponent, an attention's
        scale), which are not parameters: a parameter has at least one dimension."""
        return tuple(w for w in self.weights
                     if w not in self.statistics and self.weights[w].ndim > 0)

    @property
    def frozen(self) -> tuple[onnx.TensorProto, ...]:
        """Float initializers training leaves as they are (the scalars), as constants."""
        kept = set(self.trained) | set(self.statistics)
        return tuple(numpy_helper.from_array(v, w) for w, v in self.weights.items()
                     if w not in kept)

    def value_info(self, name: str) -> onnx.ValueInfoProto:
        shape = self.facts.shape(name)
        return helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(self.facts.dtype(name)), list(shape))

    @classmethod
    def build(cls, graph: Graph, feeds: Mapping[str, object], labels: object, loss: Loss,
              what: str = "labels") -> TrainingForward:
        """Checks feeds (one line naming the input) and labels (naming `what`), rewrites,
        appends the loss and probes it all on this batch."""
        model, served = training_opset(graph)  # served: a node added -> the model's node
        weights = float_initializers(model)
        if not weights:
            raise TrainingError(f"{graph.name} has no trainable weights (no float "
                                f"initializers)")
        arrays = check_feeds(graph.name, input_specs(graph), feeds)
        # what follows from the feeds or a parameter is data; a scalar stays a constant
        sources = set(arrays) | {w for w, v in weights.items() if v.ndim > 0}
        given = probe(model, arrays, sources)
        for _ in range(EXPANSIONS):
            model, more = expand_nodes(model, given, model_opset(model))
            if not more:
                break
            served.update((n, served.get(m, m)) for n, m in more.items())
            given = probe(model, arrays, sources)
        prediction = model.graph.output[0].name
        classes_last = loss.classes_last(labels, given.shape(prediction))
        label_array = loss.labels(labels, given.shape(prediction), given.dtype(prediction),
                                  what)
        e = Emitter(model_opset(model), prefix="train")
        nodes: list[onnx.NodeProto] = []
        origins: dict[str, str] = {}
        statistics: dict[str, str] = {}
        for node in model.graph.node:
            origin = served.get(node.name, node.name)
            rule = rule_for(node.op_type) if node.domain in DEFAULT_DOMAINS else None
            if rule is None or rule.rewrite is None:
                nodes.append(node)
                origins[node.name] = origin
                continue
            start = len(e.nodes)
            with e.serving(origin):
                updated = rule.rewrite(Rewriting(node, given, e))
            # a running statistic the graph computes has nothing to keep (timm's weight
            # standardization: a BatchNorm over a weight, its "running" inputs reductions
            # of that weight)
            statistics.update((s, t) for s, t in updated.items() if s in weights)
            nodes.extend(e.nodes[start:])
        written = len(e.nodes)
        loss.write(e, prediction, len(given.shape(prediction)), LOSS, classes_last)
        nodes.extend(e.nodes[written:])
        origins.update(e.origins)
        nodes, shared = _shared_through_copies(
            nodes, {w for w, v in weights.items() if v.ndim > 0}, e, origins)
        constants = (*[t for t in model.graph.initializer if t.name not in weights],
                     *e.initializers.values())
        trained = _forward_model(model, nodes, constants, weights, LABELS, label_array)
        feeds_all = {**arrays, LABELS: label_array}
        facts = probe(trained, feeds_all, sources | {LABELS})
        return cls(graph, model_opset(model), tuple(nodes), origins, weights,
                   tuple(constants), statistics, tuple(arrays), prediction, loss, facts,
                   feeds_all, shared)


def _forward_model(model: onnx.ModelProto, nodes: list[onnx.NodeProto],
                   constants: tuple[onnx.TensorProto, ...], weights: Mapping[str, np.ndarray],
                   labels: str, label_array: np.ndarray) -> onnx.ModelProto:
    """The training forward as a runnable model (weights as initializers), its outputs the
    prediction and the loss."""
    inputs = [i for i in model.graph.input if i.name not in weights
              and i.name not in {c.name for c in constants}]
    label_info = helper.make_tensor_value_info(
        labels, helper.np_dtype_to_tensor_dtype(label_array.dtype), list(label_array.shape))
    graph = helper.make_graph(
        nodes, model.graph.name, [*inputs, label_info],
        [model.graph.output[0], onnx.ValueInfoProto(name=LOSS)],
        initializer=[*constants, *(numpy_helper.from_array(v, k) for k, v in weights.items())])
    return helper.make_model(graph, opset_imports=list(model.opset_import),
                             ir_version=model.ir_version)


def model_opset(model: onnx.ModelProto) -> int:
    return default_opset(model) or 1


def training_opset(graph: Graph) -> tuple[onnx.ModelProto, dict[str, str]]:
    """The model at opset TRAINING_OPSET or later, its unread optional outputs left out,
    and each node the raise added -> the model's node it stands for. From 13 on, ai.onnx
    changed no op's meaning up to 17 (only added types and attributes), so the import is
    raised; an older model goes through onnx's version converter."""
    model = with_weights(graph.model)
    _drop_unread_outputs(model.graph)
    own_statistics(model.graph)
    opset = model_opset(model)
    if opset >= TRAINING_OPSET:
        return model, {}
    if opset >= 13:
        for o in model.opset_import:
            if o.domain in DEFAULT_DOMAINS:
                o.version = TRAINING_OPSET
        return model, {}
    try:
        converted = raise_opset(model, TRAINING_OPSET)
    except Exception as exc:
        raise TrainingError(f"{graph.name} is at opset {opset}; training needs 13 or later "
                            f"and onnx could not convert it ({str(exc).splitlines()[0]})"
                            ) from None
    return converted, _name_converted(converted.graph, model.graph)


def _name_converted(graph: onnx.GraphProto, before: onnx.GraphProto) -> dict[str, str]:
    """Names for the nodes onnx's version converter wrote without one (Constants holding
    what an attribute held, a Resize for an Upsample, Softmax's Flatten and Reshape);
    each stands for the model's node that wrote the same output, or else for the node its
    output is read by (in order, readers are named first), or else for the node after it."""
    wrote = {t: n.name for n in before.node for t in n.output if t}
    served: dict[str, str] = {}
    origin_of: dict[str, str] = {}  # tensor -> the model's node its first reader serves
    after = ""
    for i, node in reversed(list(enumerate(graph.node))):
        if not node.name:
            origin = next((known[t] for known in (wrote, origin_of) for t in node.output
                           if t in known), after)
            node.name = f"{origin}/converted{i}"
            served[node.name] = origin
        after = served.get(node.name, node.name)
        origin_of.update((t, after) for t in reads_of(node))
    return served


# Ops whose outputs after the first are optional extras (a Split's are not: their count
# is the number of parts)
OPTIONAL_OUTPUTS = frozenset({"BatchNormalization", "Dropout", "LayerNormalization",
                              "MaxPool", "SoftmaxCrossEntropyLoss"})


def _shared_through_copies(nodes: list[onnx.NodeProto], weights: set[str], e: Emitter,
                           origins: dict[str, str]
                           ) -> tuple[list[onnx.NodeProto], dict[str, tuple[str, ...]]]:
    """A weight read for several of the model's nodes reaches them all through one
    Identity, which serves `SHARED + weight`; the stages put it with its earliest reader
    (`stages.build_stages`, from the origin -> readers map returned). Wherever a plan puts
    the readers, the weight lives on one stage, its copy crosses to the others as an
    activation does, and its gradient crosses back into the one accumulator (tied
    embeddings; an exporter's one initializer for equal ones)."""
    readers: dict[str, dict[str, None]] = {}
    for node in nodes:
        for t in node.input:
            if t in weights:
                readers.setdefault(t, {})[origins[node.name]] = None
    shared = {t: tuple(r) for t, r in readers.items() if len(r) > 1}
    copies: dict[str, str] = {}
    out = []
    for t in shared:
        with e.serving(SHARED + t):
            copies[t] = e.op("Identity", [t])
        out.append(e.nodes[-1])
        origins[out[-1].name] = SHARED + t
    out += [_reading(n, copies) if copies.keys() & set(n.input) else n for n in nodes]
    return out, {SHARED + t: r for t, r in shared.items()}


def _reading(node: onnx.NodeProto, renamed: Mapping[str, str]) -> onnx.NodeProto:
    """A copy of `node` reading `renamed`'s new names for its inputs."""
    clone = onnx.NodeProto()
    clone.CopyFrom(node)
    for i, t in enumerate(clone.input):
        clone.input[i] = renamed.get(t, t)
    return clone


def _drop_unread_outputs(graph: onnx.GraphProto) -> None:
    """Trailing optional outputs nothing reads are left out (a BatchNormalization exported
    in training mode gives its running and saved statistics, which onnxruntime's inference
    kernel does not make and onnx's version converter refuses)."""
    read = {i for n in graph.node for i in reads_of(n)} | {o.name for o in graph.output}
    for node in graph.node:
        if node.op_type not in OPTIONAL_OUTPUTS:
            continue
        while len(node.output) > 1 and node.output[-1] not in read:
            del node.output[-1]


def float_initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The weights: float initializers, but for those only read as settings."""
    settings: set[str] = set()
    read: set[str] = set()
    for n in model.graph.node:
        positions = _SETTINGS.get(n.op_type, ())
        settings.update(t for i, t in enumerate(n.input) if i in positions)
        read.update(t for i, t in enumerate(n.input) if i not in positions)
        read.update(t for t in reads_of(n) if t not in n.input)  # from inside its subgraphs
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
            if t.data_type in FLOATS and (t.name in read or t.name not in settings)}


# Inputs that set how an op runs rather than feed it values (Resize's roi and scales)
_SETTINGS = {"Resize": (1, 2)}

