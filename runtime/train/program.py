"""A training graph: forward, loss and backward together, and any part of it as a model.

    tg = TrainingGraph.build(graph, feeds, labels, Loss("mse"))
    whole = tg.model(outputs=[LOSS, *tg.gradient_names])   # one model, weights as inputs
    part = tg.extract("stage0/backward", nodes, outputs)      # a stage's program

Weights are graph inputs, never initializers, so one compiled model serves every step
with whatever values the weights hold then (a device keeps them resident).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from runtime.devices.ort.sessions import loadable
from runtime.graph import Graph, reads_of
from runtime.onnx_kinds import DEFAULT_DOMAINS
from runtime.train.backward import SEED, Backward, differentiate
from runtime.train.forward import LOSS, TrainingForward
from runtime.train.loss import Loss


@dataclass(frozen=True)
class TrainingGraph:
    forward: TrainingForward
    backward: Backward

    @classmethod
    def build(cls, graph: Graph, feeds: Mapping[str, object], labels: object, loss: Loss,
              what: str = "labels", trained_only: bool = False) -> TrainingGraph:
        """`trained_only`: gradients of the weights the optimizer updates alone, none of
        the scalars (whose parts would meet across the stages that read them)."""
        fwd = TrainingForward.build(graph, feeds, labels, loss, what)
        return cls(fwd, differentiate(fwd, of=fwd.trained if trained_only else None))

    @property
    def nodes(self) -> tuple[onnx.NodeProto, ...]:
        return (*self.forward.nodes, *self.backward.nodes)

    @property
    def origins(self) -> dict[str, str]:
        return {**self.forward.origins, **self.backward.origins}

    def type_of(self, name: str) -> onnx.ValueInfoProto:
        """A tensor's declared type: forward tensors as probed, gradients as their tensor
        (a float16 tensor's gradient is float16 in a float32 network), the seed a scalar of
        the loss's dtype."""
        facts = self.forward.facts
        if name in facts.shapes:
            return self.forward.value_info(name)
        if name == SEED:
            dtype = facts.dtype(LOSS)
            return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype),
                                                 [])
        tensor = self.backward.tensor_of.get(name)
        dtype = facts.dtype(self.forward.prediction if tensor is None else tensor)
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype),
                                             None if tensor is None else
                                             list(facts.shape(tensor)))

    def extract(self, name: str, nodes: Sequence[onnx.NodeProto], outputs: Iterable[str],
                extra_nodes: Sequence[onnx.NodeProto] = (),
                extra_initializers: Sequence[onnx.TensorProto] = (),
                types: Mapping[str, onnx.ValueInfoProto] | None = None,
                frozen: Sequence[onnx.TensorProto] = ()) -> onnx.ModelProto:
        """A model running `nodes` (then `extra_nodes`), its inputs whatever they read and
        nobody among them writes, its outputs `outputs`; `types` declares tensors the
        training graph does not know, `frozen` weights held constant."""
        declared = dict(types or {})

        def typed(t: str) -> onnx.ValueInfoProto:
            return declared[t] if t in declared else self.type_of(t)

        every = [*nodes, *extra_nodes]
        constants = {t.name: t for t in (*self.forward.constants, *self.backward.initializers,
                                         *extra_initializers, *frozen)}
        written = {o for n in every for o in n.output if o}
        read = list(dict.fromkeys(i for n in every for i in reads_of(n)))
        inputs = [t for t in read if t not in written and t not in constants]
        used = [constants[t] for t in read if t in constants]
        outs = list(dict.fromkeys(outputs))
        for t in outs:  # an output passed straight through needs a node writing it
            if t not in written:
                raise ValueError(f"{name}: {t} is not computed here")
        graph = helper.make_graph(every, name, [typed(t) for t in inputs],
                                  [typed(t) for t in outs], initializer=used)
        source = self.forward.graph.model
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(
            "", self.forward.opset), *(o for o in source.opset_import
                                       if o.domain not in DEFAULT_DOMAINS)],
            ir_version=source.ir_version)
        return loadable(model)

    def model(self, outputs: Iterable[str]) -> onnx.ModelProto:
        """Forward, loss and backward as one model."""
        return self.extract(self.forward.name, self.nodes, outputs)

    def feeds(self, seed: float = 1.0) -> dict[str, np.ndarray]:
        """Everything the whole model reads for the batch it was built on: the data,
        labels, weights and seed."""
        dtype = self.forward.facts.dtype(LOSS)
        return {**self.forward.batch, **self.forward.weights,
                SEED: np.asarray(seed, dtype=dtype)}
