"""Each PyTorch parameter one initializer of its own again, as an exporter wrote it.

    graph = owned(graph)       # what `Trainer` trains and writes out
    own_statistics(model.graph)  # in place: each BatchNorm's running statistics its own

A model whose weights are all `Constant` nodes (PaddlePaddle's) has them as initializers
(`weights_of_constants`). `runtime.train.gradients` differentiates the model as given (an
initializer several nodes read gets the sum of their gradients, as central differences on
the file would);
`gradients(owned(load_graph(path, fold=False)), ...)` gives PyTorch's parameters'
gradients.

PyTorch's exporters store equal initializers once. In a fresh network that merges
parameters PyTorch trains apart: every LayerNorm's scale is ones, every zeroed bias zeros,
a BatchNorm's running mean zeros like its bias. Trained as exported, one LayerNorm scale
would serve all of them and take the sum of their gradients. The exporters say what they
merged: TorchScript reads the kept initializer through an `Identity` named as the merged
parameter; dynamo records each node's module and FX node (`pkg.torch.onnx.name_scopes`,
`pkg.torch.onnx.fx_node`), which name the parameter a node read. Only a constant
fill is taken apart: random values equal in two places are one parameter read twice, as
tied embeddings are, and stay shared (`forward._shared_through_copies`). The other way,
an exporter folds a tie into copies (a tied LM head into the embedding's transpose): each
copy reads the one weight again (`tie_again`).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import re
from collections import Counter

import numpy as np
import onnx
from onnx import numpy_helper

from runtime.graph import Graph, copy_initializer, load_graph, reads_of
from runtime.names import fresh_name
from runtime.onnx_kinds import DEFAULT_DOMAINS, FLOATS
from runtime.stored import with_weights

# dynamo's metadata on each node: the modules it ran in, and the FX node it came from
SCOPES, FX_NODE = "pkg.torch.onnx.name_scopes", "pkg.torch.onnx.fx_node"


def owned(graph: Graph) -> Graph:
    """`graph` with each parameter and running statistic its own and each tie one weight;
    itself when they are already (every change adds or drops an initializer or a node)."""
    model = with_weights(graph.model)
    size = (len(model.graph.initializer), len(model.graph.node))
    constants = weights_of_constants(model.graph)
    own_statistics(model.graph)
    taken = [*constants, *own_weights(model.graph)]
    tie_again(model.graph)
    if size == (len(model.graph.initializer), len(model.graph.node)):
        return graph
    out = load_graph(model, name=graph.name, fold=False)
    out.folded = dataclasses.replace(out.folded, nodes=(*graph.folded.nodes, *taken))
    return out  # a map or annotation may name an Identity taken for a weight, as if folded


def weights_of_constants(graph: onnx.GraphProto) -> list[str]:
    """PaddlePaddle's exporter writes every weight as a `Constant` node (PP-OCR's text
    detector: 342 of them), so a model with no float initializer had no parameter to
    train. There, each float Constant of a dimension or more becomes an initializer named
    as its output, in place, as other exporters write weights (a scalar stays a constant,
    as a 0-d initializer does). The names of the nodes taken."""
    if any(t.data_type in FLOATS for t in graph.initializer):
        return []
    taken = []
    for node in list(graph.node):
        value = next((a.t for a in node.attribute if a.name == "value"), None) \
            if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS else None
        if value is not None and value.data_type in FLOATS and value.dims:
            copy_initializer(graph, value, node.output[0])
            graph.node.remove(node)
            taken.append(node.name)
    return taken


def _reads(graph: onnx.GraphProto) -> Counter[str]:
    """How often each tensor is read: each input slot, each subgraph, each graph output."""
    reads = Counter(o.name for o in graph.output)
    for n in graph.node:
        reads.update(t for t in n.input if t)
        reads.update(set(reads_of(n)).difference(n.input))
    return reads


def own_statistics(graph: onnx.GraphProto) -> None:
    """Each BatchNormalization's running statistics become initializers of its own, in
    place. TorchScript reads a fresh running mean through an Identity of a bias, dynamo
    reads one initializer in several slots (a BatchNorm's bias as its own running mean,
    another's scale as a running variance). Training updates a statistic where it is read,
    so shared it would be updated as a weight or by another BatchNorm's batch (DenseNet-121
    failed to build from either exporter). Any BatchNorm's, whatever its values."""
    inits = {t.name: t for t in graph.initializer}
    makers = {t: i for i, n in enumerate(graph.node) for t in n.output}
    reads = _reads(graph)
    gone: list[int] = []
    for node in graph.node:
        if node.op_type != "BatchNormalization" or node.domain not in DEFAULT_DOMAINS:
            continue
        for k, slot in ((3, "running_mean"), (4, "running_var")):
            t = node.input[k] if len(node.input) > k else ""
            i = makers.get(t)
            if t in inits and reads[t] > 1:  # shared: a copy for this one
                source, name = t, f"{node.name}/{slot}"
                node.input[k] = name
                reads[t] -= 1
            elif (i is not None and reads[t] == 1 and graph.node[i].op_type == "Identity"
                  and graph.node[i].input[0] in inits):  # the Identity goes
                source, name = graph.node[i].input[0], t
                gone.append(i)
            else:
                continue
            copy_initializer(graph, inits[source], name)
    for i in sorted(gone, reverse=True):
        del graph.node[i]


def _fill(tensor: onnx.TensorProto) -> bool:
    """A float tensor of two or more elements, all equal (ones, zeros): a fresh parameter."""
    if tensor.data_type not in FLOATS or np.prod(tensor.dims) < 2:
        return False
    values = numpy_helper.to_array(tensor)
    return bool((values == values.flat[0]).all())


def _metadata(node: onnx.NodeProto, key: str) -> str | None:
    return next((p.value for p in node.metadata_props if p.key == key), None)


def _modules(node: onnx.NodeProto) -> list[str]:
    """The modules a dynamo-exported node ran in, outermost first (its scopes end with
    the node's own name); none for a node of another exporter."""
    try:
        scopes = ast.literal_eval(_metadata(node, SCOPES) or "None")
    except (ValueError, SyntaxError):
        return []
    return [str(s) for s in scopes[:-1]] if isinstance(scopes, list) else []


def _placeholder(name: str) -> str:
    """What torch.export calls parameter `name` in an FX graph."""
    return "p_" + name.replace(".", "_")


def _named(node: onnx.NodeProto, t: str, module: str) -> str | None:
    """The PyTorch parameter `node`, of `module`, reads where it reads initializer `t`,
    if its FX node's arguments name it: `t` itself, or the one of its module's they name
    (`p_<module>_<field>`; by `t`'s field when they name several)."""
    field = t.rpartition(".")[2]
    fx = _metadata(node, FX_NODE) or ""
    named = set(re.findall(r"%(p_\w+)", fx.partition("args =")[2]))
    if _placeholder(t) in named:
        return t
    prefix = _placeholder(module) + "_" if module else "p_"
    others = {_placeholder(i) for i in node.input if i != t}
    own = sorted(p[len(prefix):] for p in named - others if p.startswith(prefix))
    if len(own) > 1:
        own = [f for f in own if f == field]
    return f"{module}.{own[0]}".lstrip(".") if len(own) == 1 else None


def _parameter(node: onnx.NodeProto, t: str, module: str) -> str:
    """`_named`, else its module's parameter of `t`'s field."""
    return _named(node, t, module) or f"{module}.{t.rpartition('.')[2]}".lstrip(".")


def own_weights(graph: onnx.GraphProto) -> list[str]:
    """Each constant-fill parameter an exporter merged into another gets its own
    initializer again, in place: a TorchScript `Identity` of a shared one becomes an
    initializer under the Identity's name; a dynamo initializer read for several
    parameters (each read's by its node's module and FX node, `_parameter`) stays its own
    parameter's, and each other parameter's reads read a copy under PyTorch's name. Equal
    values that are no fill (ConViT's identity-initialized projections) are taken apart
    only where the FX nodes name different parameters (`_named`): dynamo names a tied
    weight once. The names of the Identity nodes so taken out."""
    inits = {t.name: t for t in graph.initializer}
    reads = _reads(graph)
    merged = {t for t, n in reads.items() if n > 1 and t in inits
              and inits[t].data_type in FLOATS and np.prod(inits[t].dims) >= 2}
    shared = {t for t in merged if _fill(inits[t])}
    if not merged:
        return []
    taken = set(inits) | {t for n in graph.node for t in (*n.input, *n.output)}
    gone = []
    for i, node in enumerate(graph.node):
        if (node.op_type == "Identity" and node.domain in DEFAULT_DOMAINS
                and node.input[0] in shared and reads[node.input[0]] > 1
                and reads[node.output[0]] > 0
                and not any(o.name == node.output[0] for o in graph.output)):
            copy_initializer(graph, inits[node.input[0]], node.output[0])
            reads[node.input[0]] -= 1
            gone.append(i)
    names = [graph.node[i].name for i in gone]
    for i in reversed(gone):
        del graph.node[i]
    modules: set[str] = set()
    readers: dict[str, dict[str, list[tuple[onnx.NodeProto, int]]]] = {}
    for node in graph.node:
        scopes = _modules(node)
        modules.update(scopes)
        for k, t in enumerate(node.input):
            if t in merged and scopes:
                param = _parameter(node, t, scopes[-1]) if t in shared else \
                    _named(node, t, scopes[-1]) or t
                readers.setdefault(t, {}).setdefault(param, []).append((node, k))
    for t, by_param in readers.items():
        if len(by_param) < 2 or t.rpartition(".")[0] not in modules:
            continue  # one parameter, or no module's
        kept = t if t in by_param else next(iter(by_param))
        for param, slots in by_param.items():
            if param == kept:
                continue
            name = fresh_name(param, taken)
            copy_initializer(graph, inits[t], name)
            for node, k in slots:
                node.input[k] = name
    return names


def _key(values: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    data = np.ascontiguousarray(values).tobytes()
    return values.dtype.str, values.shape, hashlib.blake2b(data, digest_size=16).digest()


def _folded(name: str) -> bool:
    """Is the initializer an exporter's folded tensor (`onnx::MatMul_7`, `val_3`), not a
    parameter under its PyTorch name (`a.b`)?"""
    return "." not in name or name.startswith("onnx::")


def tie_again(graph: onnx.GraphProto) -> None:
    """Each initializer an exporter folded out of another, a copy or a matrix's transpose,
    is read as that one again (through a Transpose), in place: PyTorch trains a tied weight
    as one, its gradient the sum of its uses. TorchScript folds a tied LM head into a copy
    of the embedding's transpose; dynamo folds a shared layer's transposed weight once at
    each use (ALBERT). Random values are equal only when made so; fills are equal by
    chance and left to `own_weights`. Only a folded tensor is read as another: two
    parameters under their own names stay two, equal or not (ConViT's identity-initialized
    projections), as an exporter writes a tie once."""
    reads = _reads(graph)
    inner = {t for n in graph.node for t in set(reads_of(n)).difference(n.input)}
    outputs = {o.name for o in graph.output}
    weights = [t for t in graph.initializer if t.data_type in FLOATS and reads[t.name]
               and np.prod(t.dims) > 1 and t.name not in inner | outputs and not _fill(t)]
    shapes = Counter(tuple(t.dims) for t in weights)
    seen: dict[tuple[str, tuple[int, ...], bytes], str] = {}
    same: dict[str, str] = {}  # a folded initializer -> the tensor read in its place
    transposes: list[onnx.NodeProto] = []
    taken = {t.name for t in graph.initializer} | {
        t for n in graph.node for t in (n.name, *n.input, *n.output)}
    for t in sorted(weights, key=lambda t: _folded(t.name)):
        values = numpy_helper.to_array(t)
        if not _folded(t.name):  # a parameter, under its own name: its own
            seen.setdefault(_key(values), t.name)
        elif (key := _key(values)) in seen:
            same[t.name] = seen[key]
        elif values.ndim == 2 and shapes[tuple(t.dims[::-1])] and (
                source := seen.get(_key(values.T))):
            made = fresh_name(f"{source}/T", taken)
            transposes.append(onnx.helper.make_node("Transpose", [source], [made], name=made))
            seen[key] = same[t.name] = made
        else:
            seen[key] = t.name
    if not same:
        return
    for node in graph.node:
        for k, t in enumerate(node.input):
            node.input[k] = same.get(t, t)
    kept = [t for t in graph.initializer if t.name not in same]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = [*transposes, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
