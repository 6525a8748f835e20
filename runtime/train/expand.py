"""Nodes the training forward replaces before its rules see it, each by ai.onnx nodes
whose rules give its gradient (their names -> the node they stand for, which their
stage follows):

- an op that onnx defines as a function (Selu, Celu, Shrink, GroupNormalization,
  MeanVarianceNormalization, RMSNormalization, Attention, RotaryEmbedding, ...) and no
  rule covers: by its body, as onnxruntime's training expands them. The body is onnx's
  for the node's op version (Selu-6's is written in opset 18's ops); where its ops are
  other versions at the model's opset, onnx's version converter rewrites it. A body
  holding a subgraph stays whole (an op without a rule, refused as before).
- an If whose condition the batch's facts fix (not the data: a rank or a size, as
  TorchScript's exports test): by its taken branch.
- a Loop whose trip count they fix and whose condition stays true (TorchScript's
  EmbeddingBag), or whose condition its body computes from what they fix (TensorFlow's
  while loops: a counter below the sequence length): unrolled.
- a SplitToSequence read only by SequenceAt at positions they fix (torch.split and chunk
  in an unoptimized dynamo export): by a Split, each SequenceAt by an Identity of its
  piece, as onnxscript's optimizer rewrites them.

A body built from the node's input types (context-dependent), an If's condition or a
Loop's trip count needs facts of a run: the forward expands again after probing what it
expanded.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import defs, helper, numpy_helper, version_converter

from runtime.graph import reads_of
from runtime.onnx_kinds import DEFAULT_DOMAINS
from runtime.opset_raise import raise_opset
from runtime.train.facts import Facts
from runtime.train.registry import rule_for

UNROLLED = 512  # the most iterations a Loop is unrolled for


def expand_nodes(model: onnx.ModelProto, facts: Facts, opset: int
                 ) -> tuple[onnx.ModelProto, dict[str, str]]:
    """`model` with the nodes above replaced, and each new node's name -> the name of
    the node it stands for."""
    served: dict[str, str] = {}
    ids = itertools.count()
    pieces = _pieces(model.graph, facts, opset, ids)
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        start = len(nodes)
        nodes.extend(pieces.get(node.name) or _expanded(node, facts, opset, ids))
        if len(nodes) - start != 1 or nodes[start] is not node:
            served.update((n.name, node.name) for n in nodes[start:])
    if not served:
        return model, served
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, served


def _pieces(graph: onnx.GraphProto, facts: Facts, opset: int, ids: Iterator[int]
            ) -> dict[str, list[onnx.NodeProto]]:
    """Node name -> what replaces it, for each SplitToSequence whose sequence only
    SequenceAt nodes read, at positions the facts fix, and its readers."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for t in reads_of(node):
            readers.setdefault(t, []).append(node)
    outputs = {o.name for o in graph.output}
    out: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        if node.op_type != "SplitToSequence" or node.domain not in DEFAULT_DOMAINS or \
                node.output[0] in outputs or node.input[0] not in facts.shapes:
            continue
        reads = readers.get(node.output[0], [])
        at = [_fixed(r.input[1], facts) if r.op_type == "SequenceAt" and
              r.domain in DEFAULT_DOMAINS and list(r.input) == [node.output[0], r.input[1]]
              else None for r in reads]
        sizes, fixed = _split_sizes(node, facts), [int(a) for a in at if a is not None]
        if sizes is None or len(fixed) < len(at):
            continue
        prefix = f"{node.name}/f{next(ids)}"
        split = [*_split_node(node, sizes, prefix, opset)]
        parts = split[-1].output
        if not _given_split(node) and _attr(node, "keepdims", 1) == 0:
            squeezes = _squeezes(parts, prefix, _attr(node, "axis", 0), opset)
            split += squeezes
            parts = [n.output[0] for n in squeezes if n.op_type == "Squeeze"]
        out[node.name] = split
        for r, a in zip(reads, fixed, strict=True):
            out[r.name] = [helper.make_node("Identity", [parts[a % len(parts)]],
                                            [r.output[0]], name=f"{prefix}/{r.name}")]
    return out


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)


def _given_split(node: onnx.NodeProto) -> str:
    return node.input[1] if len(node.input) > 1 else ""


def _split_sizes(node: onnx.NodeProto, facts: Facts) -> list[int] | None:
    """The sizes of a SplitToSequence's pieces along its axis, if the facts fix them: its
    `split` sizes, pieces of `split` with the remainder last, or pieces of 1."""
    shape = facts.shape(node.input[0])
    length = shape[_attr(node, "axis", 0) % len(shape)] if shape else 0
    split = _whole(_given_split(node), facts) if _given_split(node) else np.asarray(1)
    if split is None or split.ndim > 1 or length == 0:
        return None
    if split.ndim == 1:
        return [int(v) for v in split]
    step = int(split)
    return [min(step, length - s) for s in range(0, length, step)] if step > 0 else None


def _split_node(node: onnx.NodeProto, sizes: list[int], prefix: str, opset: int
                ) -> Iterator[onnx.NodeProto]:
    """A Split of the node's input into pieces of `sizes`: its sizes an input from opset
    13, an attribute before."""
    axis, names = _attr(node, "axis", 0), [f"{prefix}/{i}" for i in range(len(sizes))]
    if opset < 13:
        yield helper.make_node("Split", [node.input[0]], names, axis=axis, split=sizes,
                               name=prefix)
        return
    yield helper.make_node("Constant", [], [f"{prefix}/sizes"], name=f"{prefix}/sizes",
                           value=numpy_helper.from_array(np.asarray(sizes, np.int64)))
    yield helper.make_node("Split", [node.input[0], f"{prefix}/sizes"], names, axis=axis,
                           name=prefix)


def _squeezes(parts: Sequence[str], prefix: str, axis: int, opset: int
              ) -> list[onnx.NodeProto]:
    """Each piece with its split axis squeezed away (SplitToSequence's keepdims=0)."""
    if opset < 13:
        return [helper.make_node("Squeeze", [p], [f"{p}/squeezed"], axes=[axis],
                                 name=f"{p}/squeezed") for p in parts]
    axes = helper.make_node("Constant", [], [f"{prefix}/axes"], name=f"{prefix}/axes",
                            value=numpy_helper.from_array(np.asarray([axis], np.int64)))
    return [axes, *(helper.make_node("Squeeze", [p, axes.output[0]], [f"{p}/squeezed"],
                                     name=f"{p}/squeezed") for p in parts)]


def _expanded(node: onnx.NodeProto, facts: Facts | None, opset: int, ids: Iterator[int]
              ) -> Iterator[onnx.NodeProto]:
    """`node`, or what replaces it (and what replaces those in turn)."""
    if node.domain not in DEFAULT_DOMAINS:
        yield node
        return
    if node.op_type in _DECIDED:
        inner = _DECIDED[node.op_type](node, facts, next(ids), opset) \
            if facts is not None else None
    else:
        body = _body(node, facts, opset) if rule_for(node.op_type) is None else None
        inner = _renamed(node, body, next(ids)) if body is not None else None
    if inner is None:
        yield node
        return
    for n in inner:
        yield from _expanded(n, None, opset, ids)


def _taken(node: onnx.NodeProto, facts: Facts, k: int, opset: int
           ) -> list[onnx.NodeProto] | None:
    """The branch an If takes, if its condition is fixed: its initializers as Constants,
    its nodes (renamed: another graph's names may repeat), its outputs into the If's."""
    condition = _fixed(node.input[0], facts)
    if condition is None:
        return None
    which = "then_branch" if bool(condition) else "else_branch"
    branch = next(a.g for a in node.attribute if a.name == which)
    if branch.sparse_initializer:
        return None
    out = [helper.make_node("Constant", [], [t.name], value=t, name=f"{node.name}/f{k}/{t.name}")
           for t in branch.initializer]
    kept = {o: o for n in branch.node for o in n.output}  # a nested subgraph may read them
    out += _copied(branch.node, kept, f"{node.name}/f{k}")
    out += [helper.make_node("Identity", [b.name], [o], name=f"{node.name}/f{k}/{o}")
            for b, o in zip(branch.output, node.output, strict=True) if o]
    return out


def _unrolled(node: onnx.NodeProto, facts: Facts, k: int, opset: int
              ) -> list[onnx.NodeProto] | None:
    """A Loop whose trip count is fixed (up to UNROLLED), its condition staying true
    (absent, or its body passing a fixed true one on through Identity or Cast) or
    computed from what the facts fix (`_counted`), as its body once per iteration: the
    iteration number and condition Constants, the carried values threaded through, each
    scan output's values stacked by Concat."""
    body = next(a.g for a in node.attribute if a.name == "body")
    if body.sparse_initializer or _holds_subgraphs(body.node):
        return None
    fixed = _fixed(node.input[0], facts) if node.input[0] else None
    trips = int(fixed) if fixed is not None and _stays_true(node, body, facts) else \
        _counted(node, body, facts, opset)
    if trips is None or not 0 < trips <= UNROLLED:
        return None
    carried = list(node.input[2:])
    scans: list[list[str]] = [[] for _ in body.output[1 + len(carried):]]
    out: list[onnx.NodeProto] = []

    def constant(name: str, value: np.ndarray) -> str:
        out.append(helper.make_node("Constant", [], [name], name=name,
                                    value=numpy_helper.from_array(value, name)))
        return name

    axis = constant(f"{node.name}/f{k}/axis", np.asarray([0], np.int64))
    for step in range(trips):
        prefix = f"{node.name}/f{k}/{step}"
        names = dict(zip((i.name for i in body.input), [
            constant(f"{prefix}/iteration", np.asarray(step, np.int64)),
            constant(f"{prefix}/condition", np.asarray(True)), *carried], strict=True))
        out += [helper.make_node("Constant", [], [names.setdefault(t.name, f"{prefix}/{t.name}")],
                                 value=t, name=f"{prefix}/{t.name}") for t in body.initializer]
        out += _copied(body.node, names, prefix)
        results = [names.get(o.name, o.name) for o in body.output[1:]]
        carried = results[:len(carried)]
        for stacked, value in zip(scans, results[len(carried):], strict=True):
            stacked.append(f"{prefix}/stacked{len(stacked)}:{value}")
            out.append(helper.make_node("Unsqueeze", [value, axis], [stacked[-1]],
                                        name=stacked[-1]))
    finals = [*(helper.make_node("Identity", [v], [o], name=f"{node.name}/f{k}/{o}")
                for v, o in zip(carried, node.output, strict=False) if o),
              *(helper.make_node("Concat", parts, [o], axis=0, name=f"{node.name}/f{k}/{o}")
                for parts, o in zip(scans, node.output[len(carried):], strict=True) if o)]
    return out + finals


def _counted(node: onnx.NodeProto, body: onnx.GraphProto, facts: Facts, opset: int
             ) -> int | None:
    """How many times the Loop runs, where its body computes its condition from the
    iteration number, constants, and outer or carried values the facts fix (TensorFlow's
    while loops through tf2onnx: a carried counter below the sequence length): those
    nodes alone, run once per iteration (onnx's evaluator). None where the condition reads
    the data, or the loop runs past UNROLLED."""
    ins, outs = [i.name for i in body.input], [o.name for o in body.output]
    starts = dict(zip(ins[2:], node.input[2:], strict=False))
    after = dict(zip(ins[2:], outs[1:], strict=False))  # a carried value -> its next
    made = {o: n for n in body.node for o in n.output}
    known = {t.name: numpy_helper.to_array(t) for t in body.initializer}
    state: dict[str, np.ndarray] = {}
    reads, seen = [outs[0]], set(ins[:2])
    while reads:
        t = reads.pop()
        if t in seen or t in known:
            continue
        seen.add(t)
        if t in made:
            reads += [i for i in made[t].input if i]
            continue
        value = _whole(starts.get(t, t), facts)  # a carried value starts at its input's
        if value is None:
            return None
        if t in starts:
            state[t] = value
            reads.append(after[t])
        else:
            known[t] = value
    entry = _whole(node.input[1], facts) if node.input[1] else np.asarray(True)
    limit = _whole(node.input[0], facts) if node.input[0] else np.asarray(UNROLLED + 1)
    if entry is None or limit is None:
        return None
    nexts = [after[t] for t in state]
    values = [helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(v.dtype), None)
              for t, v in [(ins[0], np.asarray(0, np.int64)), (ins[1], np.asarray(True)),
                           *state.items()]]
    graph = helper.make_graph([n for n in body.node if set(n.output) & seen], "condition",
                              values, [onnx.ValueInfoProto(name=t) for t in (outs[0], *nexts)],
                              [numpy_helper.from_array(np.asarray(v), t) for t, v in known.items()])
    from onnx.reference import ReferenceEvaluator  # here: most networks have no such loop

    run = ReferenceEvaluator(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", opset)]))
    trips, go = 0, bool(entry.reshape(-1)[0])
    while go and trips < int(limit.reshape(-1)[0]):
        if trips == UNROLLED:
            return None
        results: list[Any] = list(run.run(None, {ins[0]: np.asarray(trips, np.int64),
                                                 ins[1]: np.asarray(True), **state}))
        go, state, trips = bool(np.asarray(results[0]).reshape(-1)[0]), dict(
            zip(state, results[1:], strict=True)), trips + 1
    return trips


def _whole(name: str, facts: Facts) -> np.ndarray | None:
    """The whole value of `name` if the batch's facts fix it."""
    return None if name in facts.data or name not in facts.values else np.asarray(
        facts.values[name])


def _stays_true(node: onnx.NodeProto, body: onnx.GraphProto, facts: Facts) -> bool:
    """Is the Loop's condition true on entry and every body's condition out, a fixed
    true one or its condition in, through Identity or Cast only?"""
    if node.input[1] and not _fixed(node.input[1], facts):
        return False
    made = {o: n for n in body.node for o in n.output}
    t = body.output[0].name
    while t in made and made[t].op_type in ("Identity", "Cast"):
        t = made[t].input[0]
    return t == body.input[1].name or (t not in made and bool(_fixed(t, facts)))


def _fixed(name: str, facts: Facts) -> np.ndarray | None:
    """The value of `name` if the batch's facts fix it (a shape, not the data)."""
    value = _whole(name, facts)
    return None if value is None else value.reshape(-1)[0]


def _holds_subgraphs(nodes: Iterable[onnx.NodeProto]) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for n in nodes for a in n.attribute)


_DECIDED = {"If": _taken, "Loop": _unrolled}


def _body(node: onnx.NodeProto, facts: Facts | None, opset: int) -> onnx.FunctionProto | None:
    """onnx's function for `node` at `opset`, its attribute references resolved."""
    try:  # Any: onnx's stubs leave out OpSchema's function accessors
        schema: Any = defs.get_schema(node.op_type, opset)
    except defs.SchemaError:
        return None
    if (version := _version(schema.function_opset_versions, opset)) is not None:
        body = _proto(schema.get_function_with_opset_version(version))
    elif facts is not None and (version := _version(
            schema.context_dependent_function_opset_versions, opset)) is not None:
        types = [_type(name, facts).SerializeToString() for name in node.input]
        body = _proto(schema.get_context_dependent_function_with_opset_version(
            version, node.SerializeToString(), types))
    else:
        return None
    if not body.node or not _resolved(body, node, opset):
        return None
    return body if _same_at(body, version, opset) else _converted(body, node, facts, opset)


def _version(versions: list[int], opset: int) -> int | None:
    """The function version for `opset`: the latest at or before it, else the first."""
    before = [v for v in versions if v <= opset]
    return max(before) if before else min(versions, default=None)


def _proto(serialized: bytes | onnx.FunctionProto) -> onnx.FunctionProto:
    return onnx.FunctionProto.FromString(serialized) if isinstance(serialized, bytes) \
        else serialized


def _type(name: str, facts: Facts) -> onnx.TypeProto:
    if not name:
        return onnx.TypeProto()
    return helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(facts.dtype(name)),
                                         list(facts.shape(name)))


def _resolved(body: onnx.FunctionProto, node: onnx.NodeProto, opset: int) -> bool:
    """Put the node's attribute values (else the op's defaults) where the body refers to
    them, dropping references to neither; False for a body holding a subgraph."""
    values = {name: a.default_value
              for name, a in defs.get_schema(node.op_type, opset).attributes.items()
              if a.default_value.type != onnx.AttributeProto.UNDEFINED}
    values.update((a.name, a) for a in node.attribute)
    if _holds_subgraphs(body.node):
        return False
    for inner in body.node:
        kept = []
        for a in inner.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name not in values:
                    continue
                name, a = a.name, onnx.AttributeProto.FromString(
                    values[a.ref_attr_name].SerializeToString())
                a.name = name
            kept.append(a)
        del inner.attribute[:]
        inner.attribute.extend(kept)
    return True


def _same_at(body: onnx.FunctionProto, version: int, opset: int) -> bool:
    """Are the body's ops, written for opset `version`, the same ops at `opset`?"""
    try:
        return all(n.domain in DEFAULT_DOMAINS
                   and defs.get_schema(n.op_type, version).since_version
                   == defs.get_schema(n.op_type, opset).since_version for n in body.node)
    except defs.SchemaError:
        return False


def _converted(body: onnx.FunctionProto, node: onnx.NodeProto, facts: Facts | None,
               opset: int) -> onnx.FunctionProto | None:
    """The body in `opset`'s ops, by onnx's version converter (None where it cannot)."""
    typed = dict(zip(body.input, node.input, strict=False)) if facts is not None else {}
    inputs = [helper.make_value_info(i, _type(typed[i], facts)) if typed.get(i) and facts
              else onnx.ValueInfoProto(name=i) for i in body.input]
    graph = helper.make_graph(list(body.node), node.op_type, inputs,
                              [onnx.ValueInfoProto(name=o) for o in body.output])
    try:
        model = raise_opset(helper.make_model(graph, opset_imports=list(body.opset_import)),
                            opset)
    except (version_converter.ConvertError, onnx.checker.ValidationError, RuntimeError):
        return None
    del body.node[:]
    body.node.extend(model.graph.node)
    return body


def _renamed(node: onnx.NodeProto, body: onnx.FunctionProto, k: int) -> list[onnx.NodeProto]:
    """The body's nodes reading the node's inputs and writing its outputs, every other
    name fresh."""
    names = dict(zip(body.input, [*node.input, *[""] * len(body.input)], strict=False))
    names.update(zip(body.output, node.output, strict=False))
    return _copied(body.node, names, f"{node.name}/f{k}")


def _copied(nodes: Iterable[onnx.NodeProto], names: dict[str, str], prefix: str
            ) -> list[onnx.NodeProto]:
    """Copies of `nodes` named under `prefix`, reading `names`' names for what they read
    (others as they are: from around them), writing `names`' names or fresh ones under
    `prefix`, which `names` then holds."""
    out = []
    for index, inner in enumerate(nodes):
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        copy.name = f"{prefix}/{index}:{inner.op_type}"
        del copy.input[:], copy.output[:]
        copy.input.extend(names.get(t, t) for t in inner.input)
        copy.output.extend(names.setdefault(t, f"{prefix}/{t}") if t else "" for t in inner.output)
        out.append(copy)
    return out
