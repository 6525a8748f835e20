"""Triton's `model_warmup`: samples a model runs before it is served (its config.pbtxt,
or a load request's "config"). A sample names each input's data type and dims (a
batching model's without the batch dimension: the sample holds `batch_size` rows) and
its data: zeros, random values (as made-up inputs draw them), or a file of raw
row-major bytes in the model's `warmup/` folder (BYTES elements each after its 4-byte
length), as Triton reads them. Each sample runs `count` times, at least once, and one
failing fails the load, as Triton's does; the first is also what the load measures its
costs on (`add_network`'s `sample_feeds`), so a model taking only some values is timed
on values it takes. (`load_options` reads the samples from the configuration.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from app.server.tensors import DTYPES, TensorError, from_bytes
from runtime.errors import PrismError, first_line
from runtime.inputs import InputSpec, random_feeds

if TYPE_CHECKING:
    from runtime.host import HostManager

DATA = ("zero_data", "random_data", "input_data_file")  # what a sample input may hold
BYTES_MOST = 256 << 20  # a file of BYTES elements read at most
WARMUP_WAIT = 600.0  # seconds one warmup run may take


class WarmupError(PrismError):
    """A warmup sample that cannot be made, or that failed."""


@dataclass(frozen=True)
class WarmupInput:
    name: str
    datatype: str  # the protocol's: FP32, INT64, BYTES, ...
    dims: tuple[int, ...]
    data: str  # "zero_data", "random_data", or the file in the model's warmup/ folder


@dataclass(frozen=True)
class Warmup:
    name: str
    batch_size: int
    count: int
    inputs: tuple[WarmupInput, ...]


def warmup_feeds(sample: Warmup, batched: bool, read: Callable[[str, int], bytes],
                 rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One request's feeds for `sample` (`batched`: its rows before each input's dims;
    `read(file, most)`: a file of the model's warmup/ folder, as bytes)."""
    feeds = {}
    for given in sample.inputs:
        dtype = DTYPES[given.datatype]
        shape = (sample.batch_size, *given.dims) if batched else given.dims
        if given.data == "zero_data":
            feeds[given.name] = np.full(shape, "", object) if dtype.kind == "O" \
                else np.zeros(shape, dtype)
        elif given.data == "random_data":
            feeds.update(random_feeds([InputSpec(given.name, dtype, shape)], rng))
        else:
            try:
                count = math.prod(shape)
                most = BYTES_MOST if dtype.kind == "O" else count * dtype.itemsize
                data = read(given.data, most)
                if dtype.kind != "O" and len(data) != most:
                    raise TensorError(f"it holds {len(data)} bytes; input {given.name!r}, "
                                      f"{given.datatype} {list(shape)}, takes {most}")
                feeds[given.name] = from_bytes(given.name, memoryview(data), shape, count,
                                               dtype)
            except TensorError as exc:
                raise WarmupError(f"warmup {sample.name!r}, file {given.data}: "
                                  f"{exc}") from None
    return feeds


def warm(host: HostManager, network: str, samples: list[tuple[Warmup, dict]]) -> None:
    """Run each sample `count` times on the network; WarmupError at the first to fail."""
    for sample, feeds in samples:
        for _ in range(sample.count):
            try:
                host.run(network, feeds).result(WARMUP_WAIT)
            except Exception as exc:  # the request's error, or no answer in WARMUP_WAIT
                raise WarmupError(f"warmup {sample.name!r} failed: "
                                  f"{first_line(exc) or type(exc).__name__}") from None
