"""ONNX's backend test suite, run through Prism, onnxruntime and the reference evaluator.

A test is (model, data sets of inputs and expected outputs, rtol, atol), loaded the way
`onnx.backend.test.runner.Runner` loads it, and passes when a runtime's outputs match
by `Runner.assert_similar_outputs`. Tests run in a worker process, one at a time, so a
test that takes longer than its timeout is killed (counted as failed) and a crash takes
only the worker with it.
"""

from __future__ import annotations

import contextlib
import glob
import multiprocessing
import os
import re
import time
import unittest
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, cast

import numpy as np
import onnx
from onnx import numpy_helper

SUITES = ("node", "simple", "pytorch-converted", "pytorch-operator", "real")
RUNTIMES = ("prism", "onnxruntime", "reference")
TIMEOUT = 20.0


@dataclass(frozen=True)
class TestRef:
    suite: str
    name: str  # as the suite names it, e.g. test_abs (pytest adds _cpu)


@dataclass
class Outcome:
    ok: bool
    seconds: float
    error: str = ""


@dataclass
class TestResult:
    test: TestRef
    outcomes: dict[str, Outcome] = field(default_factory=dict)


def _quiet_cases(kind: str) -> list:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return load_model_tests(kind=kind)


def list_tests(suites: Sequence[str], pattern: str | None = None) -> list[TestRef]:
    """The suites' tests in a stable order, narrowed to names matching `pattern` (regex)."""
    regex = re.compile(pattern) if pattern else None
    out = []
    for suite in suites:
        for case in sorted(_quiet_cases(suite), key=lambda c: c.name):
            if regex is None or regex.search(case.name):
                out.append(TestRef(suite, case.name))
    return out


# -- loading one test ----------------------------------------------------------------


@dataclass
class LoadedTest:
    model: onnx.ModelProto
    data_sets: list[tuple[list[Any], list[Any]]]
    rtol: float
    atol: float
    model_dir: str | None


def _load_value(path: str, kind: onnx.TypeProto) -> Any:
    with open(path, "rb") as f:
        content = f.read()
    if kind.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(content)
        return numpy_helper.to_list(seq)
    if kind.HasField("optional_type"):
        opt = onnx.OptionalProto()
        opt.ParseFromString(content)
        return numpy_helper.to_optional(opt)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(content)
    return numpy_helper.to_array(tensor)


def _normal(value: Any) -> Any:
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def _light(case) -> LoadedTest:
    """A `real` test: a light model in onnx's data, fed the Runner's dummy inputs."""
    from onnx.backend.test.runner import Runner

    root = os.path.dirname(os.path.dirname(onnx.__file__))
    path = os.path.normpath(os.path.join(root, case.url))
    model = onnx.load(path)
    inits = {t.name for t in model.graph.initializer}
    inputs = [Runner.generate_dummy_data(x, seed=0, name=case.model_name)
              for x in model.graph.input if x.name not in inits]
    prefix = os.path.splitext(path)[0]
    outputs = [numpy_helper.to_array(onnx.load_tensor(f"{prefix}_output_{i}.pb"))
               for i in range(len(model.graph.output))]
    return LoadedTest(model, [(inputs, outputs)], case.rtol, case.atol, path)


def load_test(case) -> LoadedTest:
    """A TestCase record -> the model and its data sets, as onnx's Runner loads them."""
    if case.model_dir is None and case.model is not None:
        sets = [([_normal(v) for v in ins], [_normal(v) for v in outs])
                for ins, outs in case.data_sets]
        return LoadedTest(case.model, sets, case.rtol, case.atol, None)
    if case.model_dir is None:
        return _light(case)
    model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
    graph = model.graph
    sets = []
    for folder in sorted(glob.glob(os.path.join(case.model_dir, "test_data_set*"))):
        n_in = len(glob.glob(os.path.join(folder, "input_*.pb")))
        n_out = len(glob.glob(os.path.join(folder, "output_*.pb")))
        ins = [_load_value(os.path.join(folder, f"input_{i}.pb"), graph.input[i].type)
               for i in range(n_in)]
        outs = [_load_value(os.path.join(folder, f"output_{i}.pb"), graph.output[i].type)
                for i in range(n_out)]
        sets.append((ins, outs))
    return LoadedTest(model, sets, case.rtol, case.atol, case.model_dir)


# -- runtimes ------------------------------------------------------------------------


class _ReferenceRep:
    def __init__(self, model: onnx.ModelProto):
        from onnx.reference import ReferenceEvaluator

        self.evaluator = ReferenceEvaluator(model)
        inits = {t.name for t in model.graph.initializer}
        self.names = [i.name for i in model.graph.input if i.name not in inits]

    def run(self, inputs: list) -> list:  # every output, in order (no names asked)
        return cast(list, self.evaluator.run(None, dict(zip(self.names, inputs, strict=False))))


def _prepare(runtime: str, model: onnx.ModelProto, devices: str | None):
    if runtime == "prism":
        from runtime.onnx_backend import PrismBackend

        return PrismBackend.prepare(model, "CPU", devices=devices)
    if runtime == "onnxruntime":
        import onnxruntime.backend

        return onnxruntime.backend.prepare(model, "CPU")
    if runtime == "reference":
        return _ReferenceRep(model)
    raise ValueError(f"unknown runtime {runtime!r}; choose from {', '.join(RUNTIMES)}")


def _first_line(exc: BaseException) -> str:
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text[:300]


def run_test(runtime: str, test: LoadedTest, devices: str | None = None) -> Outcome:
    """Prepare, run every data set and compare, as onnx's Runner does."""
    from onnx.backend.test.runner import Runner

    start = time.perf_counter()
    rep = None
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            rep = _prepare(runtime, test.model, devices)
            for inputs, expected in test.data_sets:
                outputs = list(rep.run(inputs))
                Runner.assert_similar_outputs(expected, outputs, rtol=test.rtol,
                                              atol=test.atol, model_dir=test.model_dir)
    except unittest.SkipTest as exc:
        return Outcome(False, time.perf_counter() - start, f"skipped: {_first_line(exc)}")
    except Exception as exc:
        return Outcome(False, time.perf_counter() - start, _first_line(exc))
    finally:
        close = getattr(rep, "close", None)
        if close is not None:
            close()
    return Outcome(True, time.perf_counter() - start)


# -- the worker ----------------------------------------------------------------------


def _worker(conn, devices: str | None) -> None:
    import onnxruntime

    onnxruntime.set_default_logger_severity(4)  # failures are reported, not logged
    cases: dict[str, dict[str, Any]] = {}
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        runtime, suite, name = job
        if suite not in cases:
            cases[suite] = {c.name: c for c in _quiet_cases(suite)}
        try:
            test = load_test(cases[suite][name])
        except Exception as exc:
            conn.send(Outcome(False, 0.0, f"cannot load test: {_first_line(exc)}"))
            continue
        conn.send(run_test(runtime, test, devices))


class Worker:
    """A process running one test at a time; killed and replaced when one overruns."""

    def __init__(self, devices: str | None = None):
        self.devices = devices
        self._ctx = multiprocessing.get_context("spawn")
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._warm: set[str] = set()  # suites the current process has loaded

    def _start(self) -> Connection:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_worker, args=(child, self.devices), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        return parent

    def run(self, runtime: str, test: TestRef, timeout: float, warmup: float = 60.0
            ) -> Outcome:
        """Run one test; `warmup` extra seconds while the process first loads a suite."""
        conn = self._conn
        if self._proc is None or not self._proc.is_alive() or conn is None:
            conn = self._start()
        start = time.perf_counter()
        conn.send((runtime, test.suite, test.name))
        extra = 0.0 if test.suite in self._warm else warmup
        self._warm.add(test.suite)
        if conn.poll(timeout + extra):
            try:
                outcome = conn.recv()
            except (EOFError, OSError):
                self.stop()
                return Outcome(False, time.perf_counter() - start, "worker crashed")
            if outcome.seconds > timeout:
                outcome = Outcome(False, outcome.seconds, f"took {outcome.seconds:.1f} s, "
                                  f"over the {timeout:g} s timeout")
            return outcome
        self.stop()
        return Outcome(False, time.perf_counter() - start, f"timed out after {timeout:g} s")

    def stop(self) -> None:
        if self._proc is not None and self._conn is not None:
            if self._proc.is_alive():
                with contextlib.suppress(BrokenPipeError, OSError):
                    self._conn.send(None)
                self._proc.join(1.0)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()
            self._conn.close()
        self._proc, self._conn = None, None
        self._warm.clear()


def run_suite(tests: Sequence[TestRef], runtimes: Sequence[str], *, devices: str | None = None,
              timeout: float = TIMEOUT,
              on_result: Callable[[TestResult], None] | None = None) -> Iterator[TestResult]:
    """Every test through every runtime, one after another, in one worker process."""
    worker = Worker(devices)
    try:
        for test in tests:
            result = TestResult(test)
            for runtime in runtimes:
                result.outcomes[runtime] = worker.run(runtime, test, timeout)
            if on_result is not None:
                on_result(result)
            yield result
    finally:
        worker.stop()


# -- summary -------------------------------------------------------------------------


@dataclass
class SuiteSummary:
    suite: str
    tests: int = 0
    passed: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    ort_not_prism: list[str] = field(default_factory=list)
    prism_only: list[str] = field(default_factory=list)
    all_fail: list[str] = field(default_factory=list)

    def add(self, result: TestResult) -> None:
        self.tests += 1
        for runtime, outcome in result.outcomes.items():
            self.passed[runtime] = self.passed.get(runtime, 0) + outcome.ok
            self.seconds[runtime] = self.seconds.get(runtime, 0.0) + outcome.seconds
        ok = {r: o.ok for r, o in result.outcomes.items()}
        name = result.test.name
        if ok.get("onnxruntime") and ok.get("prism") is False:
            self.ort_not_prism.append(name)
        if ok.get("prism") and not any(v for r, v in ok.items() if r != "prism"):
            self.prism_only.append(name)
        if not any(ok.values()):
            self.all_fail.append(name)

    def to_dict(self) -> dict:
        return {"suite": self.suite, "tests": self.tests, "passed": self.passed,
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
                "onnxruntime_not_prism": self.ort_not_prism, "prism_only": self.prism_only,
                "all_fail": self.all_fail}


def summarize(results: Sequence[TestResult], suites: Sequence[str]) -> list[SuiteSummary]:
    by_suite = {s: SuiteSummary(s) for s in suites}
    for result in results:
        by_suite[result.test.suite].add(result)
    total = SuiteSummary("total")
    for result in results:
        total.add(result)
    return [*by_suite.values(), total]
