"""The onnxruntime sessions every cpu partition runs in, just-in-time or from a bundle: the
two paths must agree for their answers to stay bit-identical. Imports only onnxruntime
and numpy, so the standalone bundle driver (and a host loading a bundle) can use it."""

from __future__ import annotations

import json
import tempfile
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

DISABLE_KEY = "optimization.disable_specified_optimizers"  # names joined by ";"
# A quantized model's float region ends in a QuantizeLinear. onnxruntime's QDQ
# propagation copies that one above a MaxPool, which then runs on uint8 in NCHW, a
# generic kernel 30x slower than the float one; off, a float stem keeps its float pool
# (outputs equal either way: max commutes with quantizing). docs/performance.md.
DISABLED = ("QDQPropagationTransformer",)
# onnxruntime (1.32) ends the process (a segfault) making a session of a float16 model in
# which a Transpose of the batch axes feeds a MatMul, on a CPU without float16 MatMul
# (x86): this fusion meets the Casts it puts around that MatMul, and the NCHWc layout
# pass then crashes. Prism's cuts make such sub-models of a float16 ViT. Off for models
# holding float16 only: their times stayed within run-to-run noise (ViT-B/16, ResNet-18,
# ConvNeXt-T, EfficientNet-B0), while float models lose up to 3% without it.
HALF_DISABLED = ("MatmulTransposeFusion",)

# A run's options giving back, as it ends, what the cpu arena holds free beyond its first
# region
ARENA_GIVEN_BACK = ort.RunOptions()
ARENA_GIVEN_BACK.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")


class ArenaDebt:
    """One session's runs' options: an outsized run (`runtime.types.OutsizedFeeds`) gives
    its arena back as it ends, but its outputs are arena memory too, freed only once the
    next stage or the caller lets them go: the first run after that gives them back. A
    run fed as much as the outsized one (its size come again, now usual: a fixed padded
    shape) forgives the debt and keeps its arena: paying it there gave back what the run
    after needed, which grew it again (60,000-sample clips: 1.85, 1.51, 1.31, 0.68 s).
    Runs of one session come one at a time."""

    __slots__ = ("fed", "lent")

    def __init__(self) -> None:
        self.lent: list[weakref.ref] = []  # outsized runs' outputs, while they live
        self.fed = 0  # bytes the last outsized run was fed

    def options(self, outsized: bool, fed: int) -> ort.RunOptions | None:
        """A run's options (`fed`: its feeds' bytes): to give back, when it is outsized or
        what it lent is gone."""
        if not (outsized or self.lent):  # the usual run: nothing owed
            return None
        if not outsized and fed >= self.fed:  # as large: its arena serves the ones to come
            self.lent = []
            return None
        alive = [output for output in self.lent if output() is not None]
        freed, self.lent = len(alive) < len(self.lent), alive
        return ARENA_GIVEN_BACK if outsized or freed else None

    def run(self, session_run: Callable[..., list], names: list[str], feeds: Mapping[str, Any],
            outsized: bool) -> list:
        """`session_run(names, feeds, options)` (a session's `run`), with the options this
        debt calls for."""
        fed = sum(v.nbytes for v in feeds.values() if type(v) is np.ndarray)
        values = session_run(names, feeds, self.options(outsized, fed))
        if outsized:
            self.lend(values, fed)
        return values

    def lend(self, outputs: Iterable[Any], fed: int) -> None:
        """An outsized run's outputs (`fed`: the bytes it was fed), to give back once they
        are gone."""
        self.lent += [weakref.ref(v) for v in outputs if type(v) is np.ndarray]
        self.fed = fed


# Ops onnxruntime ends the process on (std::terminate) when they run on an empty tensor,
# a batch of 0 say (LSTM and GRU, onnxruntime 1.32); `refuse_empty` turns that into an error
ABORTS_ON_EMPTY = frozenset({"LSTM", "GRU"})


def refuse_empty(ops: Iterable[str]) -> Callable[[Mapping[str, Any]], None] | None:
    """For a model holding an op in ABORTS_ON_EMPTY, a check of its feeds that raises
    ValueError naming an empty one; None for any other model (nothing to check)."""
    risky = sorted(ABORTS_ON_EMPTY.intersection(ops))
    if not risky:
        return None

    def check(feeds: Mapping[str, Any]) -> None:
        for name, value in feeds.items():
            if getattr(value, "size", 1) == 0:
                raise ValueError(f"{' and '.join(risky)} cannot run on empty input {name!r} "
                                 f"(shape {list(value.shape)}): onnxruntime would end the "
                                 f"process")

    return check


def session_options(threads: int, external: Mapping[str, np.ndarray] | None = None,
                    half: bool = False, optimized: bool = True, spin: bool = True
                    ) -> ort.SessionOptions:
    """`threads` intra-op threads, one inter-op, sequential, quiet; full graph optimization
    (onnxruntime's default), which on a bundle's already optimized model adds only the
    machine-specific layout passes. `external`: the files the model names as external
    data, held in memory (a bundle's weights.bin, weights held beside a large model):
    onnxruntime copies them into the session as it makes it, so they may go then
    (`tests/graph/test_large_models.py` holds it to that). `half`: the model holds float16
    (`graph.holds_half`), so HALF_DISABLED is off too. Not `optimized`: no graph
    optimization at all (what `prism run --check` compares a mismatch with). Not `spin`: the
    intra-op threads sleep between runs rather than spin (`DeviceConfig.spin`)."""
    opts = ort.SessionOptions()
    if not optimized:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = max(1, int(threads))
    opts.inter_op_num_threads = 1
    if not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 4
    opts.add_session_config_entry(DISABLE_KEY, ";".join(DISABLED + HALF_DISABLED * half))
    files = {name: data for name, data in (external or {}).items() if data.size}
    if files:
        opts.add_external_initializers_from_files_in_memory(
            list(files), list(files.values()), [data.size for data in files.values()])
    return opts


def new_session(model: bytes, threads: int, external: Mapping[str, np.ndarray] | None = None,
                half: bool = False, optimized: bool = True, spin: bool = True
                ) -> ort.InferenceSession:
    """A CPU session of a serialized model under `session_options`."""
    return ort.InferenceSession(model, session_options(threads, external, half, optimized, spin),
                                providers=["CPUExecutionProvider"])


def profiled_run(model: bytes, feeds: Mapping[str, object], runs: int = 1) -> list[dict]:
    """onnxruntime's profiler events (chrome trace records) of `runs` runs of a 1-thread
    session of `model` on `feeds`: per kernel its time and, in `args`, its op type and
    input shapes and sizes."""
    opts = session_options(1)
    opts.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="prism-profile-") as tmp:
        opts.profile_file_prefix = str(Path(tmp) / "run")
        session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            session.run(None, dict(feeds))
        return json.loads(Path(session.end_profiling()).read_text())
