"""What a training graph's rules may take as known: every forward tensor's shape and dtype,
and the values of the small integer tensors (axes, starts, shapes) that do not depend on
the data.

They are found by running the forward once on a real batch with every tensor as an
output (`probe`), so shapes are exact for that batch size whatever the model declares
(a Reshape fed by Shape, a symbolic batch). A training graph is built for one batch
size; the trainer builds one per micro-batch size it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from runtime.devices.ort.sessions import cpu_session
from runtime.errors import ProvisionError, TrainingError, first_line
from runtime.graph import reads_of
from runtime.machine import usable_cpus

Shape = tuple[int, ...]
VALUES_KEPT = 4096  # largest integer tensor whose value a rule may read
FLOATS_KEPT = 8  # largest float one (a Resize's scales)
_KEPT = {"i": VALUES_KEPT, "u": VALUES_KEPT, "b": VALUES_KEPT, "f": FLOATS_KEPT}  # by kind
# Ops whose outputs do not depend on their inputs' values, only on their shapes
SHAPE_ONLY = frozenset({"Shape", "Size", "ConstantOfShape", "EyeLike"})


@dataclass(frozen=True)
class Facts:
    shapes: Mapping[str, Shape]
    dtypes: Mapping[str, np.dtype]
    values: Mapping[str, np.ndarray]  # integer tensors up to VALUES_KEPT, float FLOATS_KEPT
    data: frozenset[str]  # tensors whose values depend on feeds, labels or weights

    def shape(self, name: str) -> Shape:
        return self.shapes[name]

    def dtype(self, name: str) -> np.dtype:
        return self.dtypes[name]

    def constant(self, name: str, node: onnx.NodeProto, what: str) -> np.ndarray:
        """The value of `name`, read by `node` as its `what`; refused (one line) when it
        depends on the data, since the training graph is built once for every batch."""
        if name in self.data or name not in self.values:
            raise TrainingError(f"node {node.name} ({node.op_type}): its {what} ({name}) "
                                f"depends on the data; training needs it constant")
        return self.values[name]


def data_dependent(graph: onnx.GraphProto, sources: set[str]) -> frozenset[str]:
    """Tensors whose values follow from `sources` (feeds, weights) through nodes that read
    values, not only shapes."""
    reached = set(sources)
    for node in graph.node:
        if node.op_type not in SHAPE_ONLY and any(i in reached for i in reads_of(node)):
            reached.update(o for o in node.output if o)
    return frozenset(reached)


def probe(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
          sources: set[str]) -> Facts:
    """Run `model` once on `feeds` with every tensor an output; shapes, dtypes and small
    integer values of all of them. onnxruntime runs it, or onnx's reference evaluator
    where onnxruntime has no kernel for the model's types."""
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    known = {o.name for o in wide.graph.output}
    names = [o for n in wide.graph.node for o in n.output if o and o not in known]
    wide.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    run = run_model(wide, feeds)
    values = {k: v for k, v in run.items() if not isinstance(v, list)}
    values.update({t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer})
    values.update(feeds)
    shapes = {k: tuple(int(d) for d in np.shape(v)) for k, v in values.items()}
    dtypes = {k: np.asarray(v).dtype for k, v in values.items()}
    # a sequence has its tensors' type (a gradient would flow through it) and no one shape
    dtypes.update((k, np.asarray(v[0]).dtype) for k, v in run.items() if isinstance(v, list) and v)
    small = {k: np.asarray(v) for k, v in values.items()
             if np.size(v) <= _KEPT.get(np.asarray(v).dtype.kind, -1)}
    return Facts(shapes, dtypes, small, data_dependent(model.graph, sources))


def run_model(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
              ) -> dict[str, np.ndarray | list[np.ndarray]]:
    """Every output of one run (a sequence as the list of its tensors), on onnxruntime's
    CPU, else onnx's reference evaluator: where onnxruntime has no kernel for the model's
    types, or one that takes them and runs none (LSTM in float64 raises RuntimeException
    as it runs)."""
    from onnxruntime.capi.onnxruntime_pybind11_state import RuntimeException

    from runtime.devices.reference import evaluator

    names = [o.name for o in model.graph.output]
    try:  # quiet: a failure is this function's one-line error, not onnxruntime's log
        results = cpu_session(model, usable_cpus(), stamp=True).run(names, dict(feeds))
    except (ProvisionError, RuntimeException) as exc:
        try:
            with np.errstate(all="ignore"):
                results = evaluator(model).run(names, dict(feeds))
        except Exception as again:
            raise _failed(model, exc if isinstance(exc, RuntimeException) else again) \
                from None
    except Exception as exc:
        raise _failed(model, exc) from None
    return {n: v if isinstance(v, list) else np.asarray(v)
            for n, v in zip(names, results, strict=True)}


def _failed(model: onnx.ModelProto, exc: Exception) -> TrainingError:
    return TrainingError(f"{model.graph.name or 'model'}: the forward pass failed on the "
                         f"training batch: {first_line(exc)}")
