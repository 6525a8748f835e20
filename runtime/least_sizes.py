"""The sizes a graph reads its inputs at, where its declared shapes leave them free: made
up 1 (or an image's 224), a network reading more fails every request (`least_sizes`).
Read off the graph alone, before any run: a Gather's constant indices, a convolution's
input channels, the sides and frames a vision transformer's position embedding is for."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import onnx
from onnx import numpy_helper

from runtime.contrib_types import CONTRIB
from runtime.free_dims import VIDEO_FRAMES, Dims, fixed_size, image_sides
from runtime.onnx_kinds import DEFAULT_DOMAINS, FLOATS
from runtime.stored import stored_at


def shaped_inputs(graph: onnx.GraphProto) -> Iterator[tuple[onnx.ValueInfoProto, Dims, bool]]:
    """Each graph input with a tensor shape: its dims and whether it holds floats."""
    for value in graph.input:
        tensor = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor.HasField("shape"):
            yield value, tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or None
                               for d in tensor.shape.dim), tensor.elem_type in FLOATS


# ops a convolution's input may pass through from a graph input, its channels on the axis
# they were (a normalisation: (x - mean) / std; a cast)
_SAME_AXES = frozenset({"Cast", "Identity", "Sub", "Div", "Mul", "Add", "Neg", "Clip", "Relu"})
_LEAST_MOST = 1 << 16
_EXTRA_TOKENS = 8  # besides the patches, before a position embedding: class, distillation
_PATCH_WALK = 64  # tensors after the patches a position embedding is looked for among
_WINDOW_WALK = 4096  # tensors after a graph input's first convolution its windows are sized over
_WINDOWS = frozenset({"Conv", "MaxPool", "AveragePool", "LpPool"})
# ops whose output is as long as their (first) input along a spatial axis
_SAME_LENGTH = _SAME_AXES | {"BatchNormalization", "InstanceNormalization", "Dropout", "Sigmoid",
                             "Tanh", "LeakyRelu", "Elu", "Selu", "PRelu", "HardSigmoid",
                             "HardSwish", "Softplus", "Mish", "Gelu", "Concat"}


def least_sizes(graph: onnx.GraphProto) -> dict[str, dict[int, int]]:
    """Input -> axis -> the least size the graph reads it at:
    - a Gather at constant indices along it (LayoutLM's dynamo export leaves its boxes'
      last dimension free, [batch, sequence, s57], and reads it at 0 to 3);
    - a convolution's input channels, the input read directly, normalised or transposed
      (optimum names an image's channels too: [batch_size, num_channels, height, width]);
    - the sides (and a clip's frames) a vision transformer's position embedding is for
      (`_patch_sizes`): made up 224, SigLIP at 384, or any ViT of another size, failed at
      the embedding's Add;
    - the length every convolution and pooling window after it fits (`_windows_fit`),
      along an axis no image or video side (those are made up 224, `free_dims`).
    Made up 1 wide, every request of such a network failed."""
    shaped = list(shaped_inputs(graph))
    sizes = {v.name: [fixed_size(d) for d in dims] for v, dims, _ in shaped}
    declared = {v.name: (dims, floating) for v, dims, floating in shaped}
    ranks = {name: len(dims) for name, dims in sizes.items()}
    weights = {t.name: t for t in graph.initializer}
    made_by = {out: node for node in graph.node for out in node.output}
    read_by: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for tensor in node.input:
            read_by.setdefault(tensor, []).append(node)
    least: dict[str, dict[int, int]] = {}

    def need(name: str, axis: int, size: int) -> None:
        if size <= _LEAST_MOST:  # past it, a made-up input would not fit in memory
            axes = least.setdefault(name, {})
            axes[axis] = max(axes.get(axis, 1), size)

    for node in graph.node:
        if node.op_type not in ("Gather", "Conv") or node.domain not in DEFAULT_DOMAINS or \
                len(node.input) < 2 or node.input[1] not in weights:
            continue
        ints = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
        if node.op_type == "Gather" and node.input[0] in ranks and \
                stored_at(weights[node.input[1]]) is None:
            indices = numpy_helper.to_array(weights[node.input[1]])
            if indices.size and indices.dtype.kind in "iu":
                need(node.input[0], ints.get("axis", 0) % max(ranks[node.input[0]], 1),
                     max(int(indices.max()) + 1, -int(indices.min())))
        elif node.op_type == "Conv" and len(weights[node.input[1]].dims) > 1:
            found = _input_axes(node.input[0], len(weights[node.input[1]].dims), made_by,
                                weights, ranks)
            if found is None:
                continue
            name, axes = found
            if axes[1] is not None:
                need(name, axes[1], weights[node.input[1]].dims[1] * max(ints.get("group", 1), 1))
            spatial = [a for a in axes[2:] if a is not None]
            if len(spatial) == len(axes) - 2:
                patched = _patch_sizes(node, weights, made_by, read_by,
                                       [sizes[name][a] for a in spatial])
                for axis, size in zip(spatial, patched or [], strict=bool(patched)):
                    need(name, axis, size)
            dims, floating = declared[name]
            sides = image_sides(dims, floating, least.get(name, {}))  # made up 224
            for j, at in enumerate(axes[2:], start=2):
                if at is not None and sizes[name][at] is None and at not in sides and \
                        (fit := _windows_fit(node.input[0], j, read_by, weights)):
                    need(name, at, fit)
    for name, axis, size in _cache_heads(graph, made_by, weights, ranks):
        need(name, axis, size)
    return least


def _cache_heads(graph: onnx.GraphProto, made_by: Mapping[str, onnx.NodeProto],
                 weights: Mapping[str, onnx.TensorProto], ranks: Mapping[str, int]
                 ) -> Iterator[tuple[str, int, int]]:
    """(input, axis, size): the head size a GroupQueryAttention's key and value caches
    ([batch, kv heads, past, head size]) take, which onnxruntime-genai's model builder
    leaves free (`kv_cache_dim`): the query's width over its heads, a packed one's (key
    and value in it) over num_heads + 2 * kv_num_heads."""
    for node in graph.node:
        if node.op_type != "GroupQueryAttention" or node.domain != CONTRIB or \
                len(node.input) < 5:
            continue
        ints = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
        heads = ints.get("num_heads", 0) + (0 if node.input[1] else 2 * ints.get(
            "kv_num_heads", 0))
        width = _width(node.input[0], made_by, weights)
        if heads and width and width % heads == 0:
            yield from ((cache, 3, width // heads) for cache in node.input[3:5]
                        if ranks.get(cache) == 4)


def _width(tensor: str, made_by: Mapping[str, onnx.NodeProto],
           weights: Mapping[str, onnx.TensorProto]) -> int | None:
    """The last dimension of a projection's output: a MatMul's (int4: MatMulNBits') or a
    Gemm's columns, past a bias added or a cast."""
    for _ in made_by:  # a walk back, bounded however the graph is made
        node = made_by.get(tensor)
        if node is None:
            return None
        ints = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
        if node.op_type == "MatMulNBits":
            return ints.get("N")
        if node.op_type in ("MatMul", "Gemm") and node.input[1] in weights:
            dims = weights[node.input[1]].dims
            return dims[0] if ints.get("transB") else dims[-1]
        if node.op_type not in ("Add", "Cast", "Identity"):
            return None
        tensor = node.input[0] if node.input[0] not in weights else node.input[-1]
    return None


def _windows_fit(tensor: str, axis: int, read_by: Mapping[str, list[onnx.NodeProto]],
                 weights: Mapping[str, onnx.TensorProto]) -> int | None:
    """The least length along `axis` of `tensor` at which every convolution and pooling
    window after it, through ops keeping that axis, fits what reaches it (a keyword
    spotter's unpadded Conv1d over [batch, 40, frames], made up 1 frame, failed at its
    first convolution): the least `_fits`, found by doubling and halving."""
    if _fits(tensor, axis, 1, read_by, weights):
        return None
    high = 2
    while not _fits(tensor, axis, high, read_by, weights):
        if high > _LEAST_MOST:
            return None
        high *= 2
    low = high // 2  # does not fit
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if _fits(tensor, axis, middle, read_by, weights) else (
            middle, high)
    return high


def _fits(tensor: str, axis: int, length: int, read_by: Mapping[str, list[onnx.NodeProto]],
          weights: Mapping[str, onnx.TensorProto]) -> bool:
    """Does `tensor`, `length` long along `axis`, leave every window after it at least one
    step to take? Followed through the ops that keep the axis's length (`_SAME_LENGTH`) and
    the windows themselves, for `_WINDOW_WALK` tensors at most."""
    lengths, tensors = {tensor: length}, [tensor]
    while tensors and len(lengths) < _WINDOW_WALK:
        tensor = tensors.pop()
        for node in read_by.get(tensor, ()):
            size = lengths[tensor]
            if node.op_type in _WINDOWS and node.input[0] == tensor:
                size = _window_steps(node, axis - 2, size, weights)
                if size < 1:
                    return False
            elif node.op_type not in _SAME_LENGTH:  # a Concat along it: longer, not shorter
                continue
            for out in node.output[:1]:
                if lengths.get(out, size + 1) > size:  # the least that reaches it
                    lengths[out] = size
                    tensors.append(out)
    return True


@dataclass(frozen=True)
class _Window:
    """A Conv's or pooling's window along each spatial axis."""
    kernel: list[int]
    strides: list[int]
    pads: list[int]  # each axis's start, then each's end
    dilations: list[int]
    same: bool  # auto_pad SAME_UPPER or SAME_LOWER
    ceil: bool


def _window(node: onnx.NodeProto, weights: Mapping[str, onnx.TensorProto]) -> _Window | None:
    """`node`'s window, or None where its attributes do not make one (a length per axis,
    each at least 1, pads at least 0): a malformed node is for onnx's checker or
    onnxruntime to name."""
    lists = {a.name: list(a.ints) for a in node.attribute if a.type == onnx.AttributeProto.INTS}
    ints = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
    pad = next((a.s.decode() for a in node.attribute if a.name == "auto_pad"), "NOTSET")
    kernel = lists.get("kernel_shape") or (list(weights[node.input[1]].dims[2:])
                                           if len(node.input) > 1 and node.input[1] in weights
                                           else [])
    n = len(kernel)
    window = _Window(kernel, lists.get("strides") or [1] * n,
                     [0] * 2 * n if pad == "VALID" else lists.get("pads") or [0] * 2 * n,
                     lists.get("dilations") or [1] * n, pad in ("SAME_UPPER", "SAME_LOWER"),
                     bool(ints.get("ceil_mode")))
    whole = n and len(window.strides) == len(window.dilations) == n and \
        len(window.pads) == 2 * n and min(kernel + window.strides + window.dilations) >= 1 and \
        min(window.pads) >= 0
    return window if whole else None


def _window_steps(node: onnx.NodeProto, i: int, length: int,
                  weights: Mapping[str, onnx.TensorProto]) -> int:
    """How many steps a Conv's or pooling's window takes along its `i`-th spatial axis of
    `length`, as onnxruntime counts them (it refuses a Conv of none)."""
    window = _window(node, weights)
    if window is None or i >= len(window.kernel):
        return length
    stride = window.strides[i]
    if window.same:
        return -(-length // stride)
    span = (window.kernel[i] - 1) * window.dilations[i] + 1
    room = length + window.pads[i] + window.pads[i + len(window.kernel)] - span
    if node.op_type == "Conv":
        return room // stride + 1  # every window inside the input
    if not window.ceil:  # the last may overhang it by less than a stride:
        return int(room / stride) + 1  # onnxruntime divides rounding toward zero
    steps = -(-room // stride) + 1  # rounding up, no window starts past the input
    return steps - 1 if (steps - 1) * stride >= length + window.pads[i] else steps


def _input_axes(tensor: str, rank: int, made_by: Mapping[str, onnx.NodeProto],
                weights: Mapping[str, onnx.TensorProto], ranks: Mapping[str, int]
                ) -> tuple[str, list[int | None]] | None:
    """The graph input a convolution's input `tensor` (of `rank`) is, normalised,
    transposed, unsqueezed (a spectrogram given one channel, as the audio spectrogram
    transformer's is) or reshaped, and which of the input's axes each of the tensor's axes
    is (None: none alone, a batch merged with a video's frames to patch them one by one,
    as TimeSformer's embedding does, or an axis put in)."""
    axes: list[int | None] = list(range(rank))
    known: int | None = rank  # the walk's tensor's rank, unknown past a Reshape
    for _ in made_by:  # a walk back, bounded however the graph is made
        step = made_by.get(tensor)
        if tensor in ranks or step is None:
            break
        if step.op_type == "Reshape" and (parts := _shape_parts(step, made_by, weights)) \
                and len(parts) == len(axes):
            axes, known = [None if a is None else parts[a] for a in axes], None
            tensor = step.input[0]
            continue
        if step.op_type == "Unsqueeze" and known is not None and (
                put := _unsqueezed(step, weights, known)) is not None:
            axes = [None if a is None or a in put else a - sum(p < a for p in put) for a in axes]
            known, tensor = known - len(put), step.input[0]
            continue
        read = [t for t in step.input if t and t not in weights]
        perm = [list(a.ints) for a in step.attribute if a.name == "perm"]
        if len(read) != 1:
            break
        if step.op_type == "Transpose" and perm and len(perm[0]) == known:
            axes = [None if a is None else perm[0][a] for a in axes]
        elif step.op_type not in _SAME_AXES:
            break
        tensor = read[0]
    if tensor not in ranks or known not in (None, ranks[tensor]) or \
            any(a is not None and not 0 <= a < ranks[tensor] for a in axes):
        return None
    return tensor, axes


def _unsqueezed(node: onnx.NodeProto, weights: Mapping[str, onnx.TensorProto], rank: int
                ) -> set[int] | None:
    """The axes an Unsqueeze giving a tensor of `rank` puts in, where constant."""
    if len(node.input) > 1:
        put = numpy_helper.to_array(weights[node.input[1]]).reshape(-1).tolist() \
            if node.input[1] in weights else None
    else:
        put = next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
    return None if put is None else {int(a) % rank for a in put}


def _shape_parts(reshape: onnx.NodeProto, made_by: Mapping[str, onnx.NodeProto],
                 weights: Mapping[str, onnx.TensorProto]) -> list[int | None] | None:
    """A Reshape's target shape as a Concat of constants and one-element parts: for each
    element, the axis of the reshaped tensor's own shape it is (a `Shape` slice of it, or a
    `Gather` from its `Shape` at a constant index), else None (a constant, a product)."""
    concat = made_by.get(reshape.input[1]) if len(reshape.input) > 1 else None
    if concat is None or concat.op_type != "Concat":
        return None
    parts: list[int | None] = []
    for part in concat.input:
        source = made_by.get(part)
        while source is not None and source.op_type in ("Squeeze", "Unsqueeze", "Cast"):
            source = made_by.get(source.input[0])
        ints = {a.name: a.i for a in source.attribute} if source is not None else {}
        if source is not None and source.op_type == "Shape" and \
                source.input[0] == reshape.input[0] and ints.get("end") == ints.get("start", 0) + 1:
            parts.append(ints.get("start", 0))
        elif source is not None and source.op_type == "Gather" and source.input[1] in weights \
                and (shape := made_by.get(source.input[0])) is not None and \
                shape.op_type == "Shape" and shape.input[0] == reshape.input[0] and \
                not shape.attribute and weights[source.input[1]].dims in ([], [1]):
            parts.append(int(numpy_helper.to_array(weights[source.input[1]]).reshape(-1)[0]))
        else:
            parts += [None] * (math.prod(weights[part].dims) if part in weights else 1)
    return parts


def _patch_sizes(conv: onnx.NodeProto, weights: Mapping[str, onnx.TensorProto],
                 made_by: Mapping[str, onnx.NodeProto],
                 read_by: Mapping[str, list[onnx.NodeProto]], fixed: list[int | None]
                 ) -> list[int] | None:
    """The sizes along a convolution's spatial axes (`fixed`: the input's there, where
    known) that a vision transformer's position embedding is for: an unpadded convolution
    into patches of p x p pixels (kernel; a stride of s <= p, overlapping as the audio
    spectrogram transformer's; a video's tubelets, t frames deep, stride the kernel)
    whose tokens, a few nodes on, meet an Add of a constant [1, N, D] or [N, D] of its
    width D. N is the patches, times the clip's frames / t, and the tokens put in front of
    them (a class token, a distillation token): counted where they are constants joined
    to the patches, else up to `_EXTRA_TOKENS` tried. Patches a side of the input's fixed
    one, else a square g x g, else (the tokens in front counted) the two factors nearest
    a square, the larger last: (g - 1) * s + p pixels. A clip of fixed sides is as many
    frames as N holds, one of free sides `VIDEO_FRAMES` (or its fixed frames) long. (A ViT
    that interpolates its embedding takes any side; this one too.)"""
    window = _window(conv, weights)
    if window is None or len(window.kernel) not in (2, 3):
        return None
    kernel, strides = window.kernel, window.strides
    if kernel[-1] != kernel[-2] or strides[-1] != strides[-2] or strides[-1] > kernel[-1] \
            or strides[:-2] != kernel[:-2] or any(window.pads) or max(window.dilations) > 1:
        return None
    found = _embedding_tokens(conv, weights, made_by, read_by)
    if found is None:
        return None
    tokens, counted = found
    patch, stride = kernel[-1], strides[-1]
    if len(kernel) == 2:
        return _grid_sides(tokens, counted, patch, stride, fixed)
    if stride != patch:
        return None
    side = fixed[-1] if fixed[-1] == fixed[-2] else None
    for extra in [counted] if counted is not None else range(min(_EXTRA_TOKENS, tokens - 4) + 1):
        patches = tokens - extra
        if side is not None and side >= patch and patches % (side // patch) ** 2 == 0:
            return [patches // (side // patch) ** 2 * kernel[0], side, side]
        if side is None and (frames := fixed[0] or VIDEO_FRAMES) >= kernel[0]:
            grid = math.isqrt(patches // (frames // kernel[0]))
            if grid * grid * (frames // kernel[0]) == patches:
                return [frames, grid * patch, grid * patch]
    return None


def _grid_sides(tokens: int, counted: int | None, patch: int, stride: int,
                fixed: list[int | None]) -> list[int] | None:
    """An image's two sides for `tokens` (see `_patch_sizes`)."""
    def side(g: int) -> int:
        return (g - 1) * stride + patch

    extras = [counted] if counted is not None else range(min(_EXTRA_TOKENS, tokens - 4) + 1)
    for extra in extras:  # without a count, g >= 2: 4 patches at least
        patches = tokens - extra
        for known, axis in ((f, a) for a, f in enumerate(fixed) if f is not None):
            along = (known - patch) // stride + 1 if known >= patch else 0
            if along and patches > 0 and patches % along == 0:
                sides = [known, known]
                sides[1 - axis] = side(patches // along)
                return sides
        grid = math.isqrt(max(patches, 0))
        if grid and grid * grid == patches:
            return [side(grid)] * 2
    if counted is not None and tokens > counted:
        patches = tokens - counted
        rows = max(d for d in range(1, math.isqrt(patches) + 1) if patches % d == 0)
        return [side(rows), side(patches // rows)]
    return None


def _embedding_tokens(conv: onnx.NodeProto, weights: Mapping[str, onnx.TensorProto],
                      made_by: Mapping[str, onnx.NodeProto],
                      read_by: Mapping[str, list[onnx.NodeProto]]
                      ) -> tuple[int, int | None] | None:
    """N of the first constant [1, N, D] or [N, D] (D: the convolution's width) an Add
    among the `_PATCH_WALK` tensors after the convolution adds, and how many tokens the
    way there joined to the patches (a Concat of constant [1, k, D] tokens, expanded to
    the batch), None where one joined is not such a constant."""
    width = weights[conv.input[1]].dims[0]
    # tensor -> tokens joined on the way to it: None before any Concat, -1 past a Concat
    # of something other than constant tokens
    joined: dict[str, int | None] = {conv.output[0]: None}
    tensors = [conv.output[0]]

    def constant_tokens(tensor: str) -> int | None:
        step = made_by.get(tensor)
        while step is not None and step.op_type in ("Expand", "Tile", "Identity", "Cast"):
            tensor, step = step.input[0], made_by.get(step.input[0])
        dims = list(weights[tensor].dims) if tensor in weights else []
        return dims[-2] if len(dims) == 3 and dims[0] == 1 and dims[-1] == width else None

    while tensors and len(joined) < _PATCH_WALK:
        tensor = tensors.pop(0)
        for node in read_by.get(tensor, ()):
            if node.op_type == "Add":
                for w in (weights[t] for t in node.input if t in weights):
                    dims = list(w.dims)
                    if len(dims) in (2, 3) and dims[-1] == width and dims[:-2] in ([], [1]):
                        count = joined[tensor]
                        return dims[-2], None if count is None or count < 0 else count
            count = joined[tensor]
            if node.op_type == "Concat" and count != -1:
                more = [constant_tokens(t) for t in node.input if t != tensor]
                count = -1 if None in more else (count or 0) + sum(m or 0 for m in more)
            for out in node.output:
                if out not in joined:
                    joined[out] = count
                    tensors.append(out)
    return None
