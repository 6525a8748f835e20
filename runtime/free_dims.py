"""The sizes made-up inputs give a model's free (symbolic) dimensions where nobody said one
(`--bind`): 1, one sample or one token, except an image's or a video's height and width,
a video's length and a waveform's. At 1x1 most vision networks fail: a detector's
upsampled features no longer line up with the ones it joins them to, a convolution's
kernel outgrows its input. Those take the side such networks are trained at, 224:
ImageNet's, and a multiple of the strides and patches they divide it by (32, 16, 14). A
video network's first convolution spans 2 or 3 frames: a clip takes 16. A speech
network's convolutions (wav2vec2, HuBERT, WavLM: 400 samples to their first frame) fail
on one sample: a waveform takes one second at 16 kHz, the rate their processors resample
to. A decoder's attention mask covers its cache and its new tokens: it takes their sum."""

from __future__ import annotations

import ast
import collections
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeGuard

IMAGE_SIDE = 224
VIDEO_FRAMES = 16  # VideoMAE's and torchvision's video networks' clips
AUDIO_SAMPLES = 16_000
_CHANNELS = (1, 3, 4)  # grey, RGB, RGBA
_LINE = 8  # the least fixed height under which a free width is a text line's

Dims = Sequence[int | str | None]


def image_axes(dims: Dims | None, floating: bool) -> dict[int, int]:
    """An image or a video input's free axes and the sizes they are made up at.

    An image: a float tensor of rank 4, its channels (1, 3 or 4) first (NCHW) or last
    (NHWC), or of rank 3 without the batch, channels first (CHW: torchvision's detectors
    and the model zoo's Faster and Mask R-CNN take one image so), its height and width
    free, or its width alone under a text line's height (PP-OCR's recognizers read [N, 3,
    48, W]; 1 wide, nothing). Not a free height under a fixed width, nor a width under a
    height of a few: key caches [batch, heads, past, head size] take those shapes. Sides
    are made up IMAGE_SIDE.

    A video: a float tensor of rank 5, its channels second ([N, C, T, H, W], torchvision's
    and PyTorchVideo's) or third ([N, T, C, H, W], transformers'), its height and width
    free, or fixed and equal: sides are made up IMAGE_SIDE, a free length VIDEO_FRAMES."""
    if not floating or dims is None or len(dims) not in (3, 4, 5):
        return {}
    sizes = [fixed_size(d) for d in dims]
    if len(dims) == 3:  # one image, no batch: [C, H, W]
        layouts: tuple[tuple[int, tuple[int, int]], ...] = ((0, (1, 2)),)
    elif len(dims) == 4:
        layouts = ((1, (2, 3)), (3, (1, 2)))
    else:
        height, width = sizes[3:]
        for channels, frames in ((1, 2), (2, 1)):
            if sizes[channels] in _CHANNELS and height == width:
                free = {a: IMAGE_SIDE for a in (3, 4) if sizes[a] is None}
                return free | ({frames: VIDEO_FRAMES} if sizes[frames] is None else {})
        return {}
    for channels, (height, width) in layouts:
        tall = sizes[height]
        if sizes[channels] in _CHANNELS and sizes[width] is None:
            if tall is None:
                return {height: IMAGE_SIDE, width: IMAGE_SIDE}
            if tall >= _LINE:
                return {width: IMAGE_SIDE}
    return {}


def fixed_size(dim: int | str | None) -> int | None:
    """A dimension's size when it is fixed: a number, or named by one (torch's dynamo
    exporter names an image's channels `"3"`: `[s99, "3", s100, s4]`)."""
    if isinstance(dim, int):
        return dim
    return int(dim) if dim is not None and dim.strip().isdigit() else None


def _waveform_length(dims: Dims, floating: bool) -> str | None:
    """A waveform input's length, [batch, samples]: the name of a float tensor's second
    and last dimension, or None."""
    name = dims[1] if floating and len(dims) == 2 else None
    return name if _plain(name) else None


def _plain(dim: int | str | None) -> TypeGuard[str]:
    """Is `dim` a free dimension's own name, not a size, a sum or a number?"""
    return isinstance(dim, str) and bool(dim.strip()) and _computed(dim, {}, 1) is None


def image_sides(dims: Dims, floating: bool, least: Mapping[int, int]) -> dict[int, int]:
    """`image_axes`, a named dimension's least size standing in for it: an image's channels
    may be free, sized by the convolution reading them."""
    return image_axes([least.get(a, d) if isinstance(d, str) else d
                       for a, d in enumerate(dims)], floating)


def free_sizes(inputs: Iterable[tuple[str, Dims | None, bool, Mapping[int, int]]],
               bindings: Mapping[str, int], default: int = 1) -> dict[str, int]:
    """Named free dimensions' sizes for inputs given as (name, dims, floating, least: axis
    -> the least size the graph reads it at): `bindings`; an image's or a video's made-up
    size (`image_axes`) for a name it has as a side or a length, so every input naming it
    agrees; a waveform's length for a name no other input has (a text model's float mask
    shares its tokens' length, or its embeddings'); no name under its least; and for an
    attention mask's length named apart, the length of the keys it covers (`_mask_lengths`)."""
    given = [(name, dims or (), floating, least) for name, dims, floating, least in inputs]
    named = collections.Counter(d for _, dims, _, _ in given for d in set(dims) if d)
    sizes = {length: AUDIO_SAMPLES for _, dims, floating, _ in given
             if (length := _waveform_length(dims, floating)) and named[length] == 1}
    sizes |= {str(dims[a]): size for _, dims, floating, least in given
              for a, size in image_sides(dims, floating, least).items() if dims[a]}
    for _, dims, _, least in given:
        for a, size in least.items():
            dim = dims[a] if a < len(dims) else None
            if _plain(dim):
                sizes[dim] = max(sizes.get(dim, default), size)
    sizes |= bindings
    for length, (pasts, new) in _mask_lengths(given, named).items():
        bound = [bindings[p] for p in pasts if p in bindings]  # a bound one wins
        past = max(bound or [sizes.get(p, default) for p in pasts], default=0)
        sizes |= {p: past for p in pasts if p not in bindings}
        if length not in bindings:
            sizes[length] = past + sizes.get(new, default)
    return sizes


def made_up_shape(dims: Dims, floating: bool, sizes: Mapping[str, int], default: int = 1
                  ) -> tuple[int, ...]:
    """One input's shape: fixed sizes as they are, named ones from `sizes` (`free_sizes`,
    where a named image side is), a name that is arithmetic over others or a number
    (`_computed`), an unnamed image side or video length as `image_axes` makes it, any
    other `default`."""
    sides = image_axes(dims, floating)
    return tuple(d if isinstance(d, int) else int(sizes[d]) if d is not None and d in sizes
                 else _computed(d, sizes, default) or (default if d else sides.get(a, default))
                 for a, d in enumerate(dims))


_MASK = "attention_mask"
_CACHES = ("past", "cache")  # what a key or value cache's input name holds


def _mask_lengths(given: Sequence[tuple[str, Dims, bool, Mapping[int, int]]],
                  named: Mapping[int | str, int]
                  ) -> dict[str, tuple[tuple[str, ...], str]]:
    """An attention mask's length where no other input names it ([batch, L], an input
    named `PREFIX` + "attention_mask") -> the names of the key cache's length (none: no
    cache) and the new tokens' (`PREFIX` + "input_ids" or "inputs_embeds", axis 1), which
    it must be the sum of: it covers every key. onnxruntime-genai's model builder names it
    `total_sequence_length` (Phi-3's, Llama's, Qwen's ONNX), torch's exporter a symbol of
    its own; made up 1 beside a cache of 1 and a token, it failed every request. A key
    cache: a float input [batch, heads, past, head size] whose name says so (`_CACHES`),
    all of them of one length, named once or, each by a name no other input has, as
    PyTorch's TorchScript exporter names the axes `dynamic_axes` lists (`past_0_k_2`)."""
    by_name = {name: dims for name, dims, _, _ in given}
    names = {dims[2] for name, dims, floating, _ in given if floating and len(dims) == 4
             and any(c in name.lower() for c in _CACHES) and _plain(dims[2])}
    pasts = tuple(sorted(names)) if len(names) == 1 or all(named[n] == 1 for n in names) else ()
    lengths = {}
    for name, dims, _, _ in given:
        if name.endswith(_MASK) and len(dims) == 2 and _plain(dims[1]) and \
                named[dims[1]] == 1 and dims[1] not in pasts:
            prefix = name[:-len(_MASK)]
            tokens = by_name.get(prefix + "input_ids") or by_name.get(prefix + "inputs_embeds")
            if tokens is not None and len(tokens) > 1 and _plain(tokens[1]):
                lengths[dims[1]] = (pasts, tokens[1])
    return lengths


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv}


def _computed(name: str | None, sizes: Mapping[str, int], default: int) -> int | None:
    """A dimension named by arithmetic over others, as optimum names an attention mask's
    `past_sequence_length + sequence_length`: its size from theirs (a mask as long as
    the keys it covers); or named by a number, as transformers' exporter names a key
    cache's heads and head size (`[1, "2", "s53", "16"]`): that number. None for a plain
    name, or a size under 1."""
    if name is None or not (any(op in name for op in "+-*/") or name.strip().isdigit()):
        return None

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Name):
            return int(sizes.get(node.id, default))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        raise ValueError(name)

    try:
        size = value(ast.parse(name, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None
    return size if size >= 1 else None
