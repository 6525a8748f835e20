"""Test helpers for bundles: the models, their feeds, device lists that make every mode
split, and bundles compiled once per session (shared across parametrized cases)."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runtime.bundle.writer import compile_bundle
from runtime.devices.config import DeviceConfig
from runtime.errors import PartitionError
from runtime.graph import Graph, load_graph
from runtime.host import HostManager
from runtime.inputs import input_specs, random_feeds
from runtime.partition import partition
from tests.support.dags import SAMPLE_NAMES, SAMPLES_DIR

REAL_DIR = Path(__file__).resolve().parents[1] / "real_models"
REAL_NAMES = ("bert", "gpt2", "resnet", "gru_loop")
MODELS = (*SAMPLE_NAMES, *REAL_NAMES)
MODES = ("memory", "balanced", "user")
VOCAB = 1000  # export.py's vocab_size for bert and gpt2

_TMP = Path(tempfile.mkdtemp(prefix="prism-bundles-"))
atexit.register(shutil.rmtree, _TMP, True)


def model_path(model: str) -> Path:
    return (SAMPLES_DIR if model in SAMPLE_NAMES else REAL_DIR) / f"{model}.onnx"


@functools.cache
def graph(model: str) -> Graph:
    return load_graph(model_path(model), name=model)


@functools.cache
def feeds(model: str) -> tuple[dict[str, np.ndarray], ...]:
    """Two fresh random feed sets per session (and a real model's saved set)."""
    rng = np.random.default_rng()
    if model in REAL_NAMES:
        with np.load(REAL_DIR / f"{model}.inputs.npz") as npz:
            saved = {k: npz[k] for k in npz.files}
        drawn = {}
        for k, v in saved.items():  # same dtypes and ranks, other sizes and values
            if v.dtype == np.int64 and v.ndim == 2:
                high = 2 if k == "token_type_ids" else VOCAB
                drawn[k] = rng.integers(0, high, (2, 7)) if k != "attention_mask" else \
                    np.ones((2, 7), np.int64)
            elif v.ndim == 0:
                drawn[k] = np.array(int(rng.integers(0, 4)), v.dtype)
            else:
                drawn[k] = rng.standard_normal((2, *v.shape[1:])).astype(v.dtype)
        return saved, drawn
    sets = [random_feeds(input_specs(graph(model)), rng, {"batch": 2}) for _ in range(2)]
    if model == "control_flow":  # If(ReduceSum(x) > 0): drive both branches
        for sign, f in zip((1.0, -1.0), sets, strict=True):
            f["x"] = (sign * np.abs(f["x"])).astype(np.float32)
    return tuple(sets)


def cpus(n: int, memory: int | None = None) -> list[DeviceConfig]:
    return [DeviceConfig(name=f"cpu{i}", backend="cpu", memory_bytes=memory) for i in range(n)]


@functools.cache
def devices(model: str, n: int, mode: str) -> tuple[DeviceConfig, ...]:
    """n cpu devices; for memory mode, as small as still fits, so it splits too."""
    if mode != "memory" or n == 1:
        return tuple(cpus(n))
    whole = sum(partition(graph(model), cpus(1), "memory").device_memory().values())
    for share in (0.6, 0.8):
        tight = cpus(n, int(whole * share))
        try:
            partition(graph(model), tight, "memory")
        except PartitionError:
            continue
        return tuple(tight)
    return tuple(cpus(n))


def user_map(model: str, n: int) -> dict:
    """The model order cut into n runs, one per device, at cuts whose crossing tensors
    all have known types."""
    g = graph(model)
    names = [node.name for node in g.nodes]

    def typed(cut: int) -> bool:
        early = set(names[:cut])
        return all(t in g.types for node in g.nodes[cut:] for t in node.reads
                   if g.producer.get(t) in early)

    cuts: list[int] = []
    for k in range(1, n):
        target = k * len(names) // n
        options = sorted(range((cuts[-1] if cuts else 0) + 1, len(names)),
                         key=lambda c: (abs(c - target), c))
        cut = next((c for c in options if typed(c)), None)
        if cut is not None:
            cuts.append(cut)
    bounds = [0, *cuts, len(names)]
    return {"partitions": {f"p{i}": f"cpu{i}" for i in range(len(bounds) - 1)},
            "nodes": {name: f"p{i}" for i in range(len(bounds) - 1)
                      for name in names[bounds[i]:bounds[i + 1]]}}


def partition_arg(model: str, n: int, mode: str) -> str | dict:
    return user_map(model, n) if mode == "user" else mode


@dataclass(frozen=True)
class Case:
    path: Path
    compiled: object  # runtime.bundle.writer.Compiled
    jit_plan: object
    jit_outputs: tuple[dict[str, np.ndarray], ...]


@functools.cache
def case(model: str, n: int, mode: str) -> Case:
    """The model compiled into a bundle, and the just-in-time path's plan and answers
    (HostManager) for the same devices, mode and feeds."""
    devs, how = list(devices(model, n, mode)), partition_arg(model, n, mode)
    path = _TMP / f"{model}-{n}-{mode}.prism"
    compiled = compile_bundle(graph(model), devs, path, partition=how)
    with HostManager(devs) as host:
        plan = host.add_network(model, graph(model), partition=how)
        futures = [host.run(model, f) for f in feeds(model)]
        outputs = tuple(f.result(timeout=60) for f in futures)
    return Case(path, compiled, plan, outputs)


def assert_identical(got: dict, want: dict, label: str) -> None:
    assert set(got) == set(want), f"{label}: outputs {sorted(got)} != {sorted(want)}"
    for name, value in want.items():
        assert got[name].dtype == value.dtype, f"{label}/{name}: dtype"
        np.testing.assert_array_equal(got[name], value, err_msg=f"{label}/{name}")


def rewrite(src: Path, dst: Path, change: dict, compression=zipfile.ZIP_STORED) -> Path:
    """A copy of a bundle with members replaced (bytes) or left out (None)."""
    with zipfile.ZipFile(src) as old, zipfile.ZipFile(dst, "w", compression) as new:
        for info in old.infolist():
            data = change.get(info.filename, old.read(info.filename))
            if data is not None:
                new.writestr(info.filename, data)
    return dst


def file_is_open(path: Path) -> bool:
    """Does this process hold `path` open (False where /proc cannot tell)?"""
    fds = Path("/proc/self/fd")
    return fds.is_dir() and any(os.path.realpath(fd) == str(Path(path).resolve())
                                for fd in fds.iterdir())
