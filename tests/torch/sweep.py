"""The qualification sweep: every operator of PyTorch's own database (`op_db`, float32,
forward) compiled with the prism backend and compared against eager PyTorch.

    python -m tests.torch.sweep                 # every operator: writes the table
    python -m tests.torch.sweep --only add,sin  # some, printed, nothing written

Per operator, its first `SAMPLES` sample inputs, each compiled on its own (one shared
host of two cpu devices, min_block_size 1, no gradients); the operator is

- `offloaded`: every node of every sample ran on Prism, and every sample equals eager,
- `partly`: some nodes ran on Prism, others stayed in PyTorch (the report's reasons are
  kept), and every sample equals eager,
- `fell back`: nothing ran on Prism (the reasons are kept),
- `wrong`: some sample ran on Prism and differs from eager (must never be committed:
  such an operator goes into runtime/torch/refused.py and the sweep is rerun),
- `error`: the prism backend raised where the `aot_eager` backend does not,
- `dynamo`: PyTorch's own compiler fails on it (`aot_eager` raises too); not counted.

It writes `tests/torch/op_sweep.json` (the suite reruns a sample of it,
tests/torch/test_op_sweep.py) and `docs/torch_ops.md`. Rerun it after upgrading torch,
onnxscript or onnxruntime.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import multiprocessing
import sys
import tempfile
import time
import warnings
import zlib
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from runtime.devices.spec import parse_devices
from runtime.host.manager import HostManager
from runtime.torch.backend import prism
from runtime.torch.compiled import collecting
from runtime.torch.options import OffloadOptions

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "tests" / "torch" / "op_sweep.json"
DOC = ROOT / "docs" / "torch_ops.md"
SAMPLES = 3
RTOL, ATOL = 1e-4, 1e-5
OP_SECONDS = 180  # a bound per operator: the sweep never hangs on one
START_SECONDS = 120  # a worker's imports, before its first answer
PROGRESS = Path(tempfile.gettempdir()) / "prism-op-sweep.jsonl"
OUTCOMES = ("offloaded", "partly", "fell back", "wrong", "error", "dynamo")


@dataclass
class OpResult:
    outcome: str
    samples: int
    detail: str = ""


def op_db() -> list:
    """PyTorch's operator database. It imports torch's test harness, which needs the
    `expecttest` package only for its TestCase base class: a plain unittest.TestCase
    stands in when that package is missing (nothing here runs torch's tests)."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        import types
        import unittest

        shim = types.ModuleType("expecttest")
        shim.TestCase = unittest.TestCase  # type: ignore[attr-defined]
        sys.modules["expecttest"] = shim
    from torch.testing._internal.common_methods_invocations import op_db as database

    return [op for op in database if torch.float32 in op.supported_dtypes("cpu")]


def op_key(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def samples(op: Any, count: int = SAMPLES) -> list:
    """The operator's first `count` float32 samples, the same on every run."""
    torch.manual_seed(zlib.crc32(op_key(op).encode()))
    out = []
    for sample in op.sample_inputs("cpu", torch.float32, requires_grad=False):
        out.append(sample)
        if len(out) == count:
            break
    return out


def _as_function(op: Any, sample: Any) -> tuple[Any, list[torch.Tensor]]:
    """The sample as a function of its tensors alone (everything else held constant)."""
    leaves, spec = tree_flatten(((sample.input, *sample.args), sample.kwargs))
    where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def call(*tensors: torch.Tensor) -> Any:
        filled = list(leaves)
        for i, tensor in zip(where, tensors, strict=True):
            filled[i] = tensor
        args, kwargs = tree_unflatten(filled, spec)
        return op(*args, **kwargs)

    return call, [leaves[i] for i in where]


def _clones(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in tensors]  # an in-place operator changes its input


def run_sample(op: Any, sample: Any, options: OffloadOptions) -> tuple[bool, str | None, str]:
    """(ran on Prism, how it differs from eager or None, why nodes stayed in PyTorch)."""
    call, tensors = _as_function(op, sample)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what a sample warns of (stft without a window)
        expected = call(*_clones(tensors))
        # an operator whose values PyTorch leaves undefined (torch.empty_like: its memory
        # may happen to hold the same bytes twice) or draws at random differs from
        # itself: only its shapes and dtypes can be compared
        settled = "uninitialized" not in (getattr(op.op, "__doc__", None) or "") \
            and _differs(call(*_clones(tensors)), expected) is None
    torch._dynamo.reset()
    compiled = torch.compile(call, backend=functools.partial(prism, options=options),
                             dynamic=False)
    with collecting() as reports, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compiled(*_clones(tensors))
    offloaded = any(r.offloaded and r.networks for r in reports)
    kept = sorted({f"{op_}: {why}" for r in reports for (op_, why) in r.reasons()})
    if not reports:
        kept = ["dynamo captured no graph: it runs in eager PyTorch"]
    elif not any(r.nodes for r in reports):
        kept = ["its graph computes nothing (the output is the input, or a view of it)"]
    differs = _differs(got, expected) if settled else _differs(
        *(tree_map(_like, out) for out in (got, expected)))
    return offloaded, differs, "; ".join(kept)


def _like(value: Any) -> Any:
    """A tensor's shape and dtype, without its values."""
    return torch.zeros_like(value) if isinstance(value, torch.Tensor) else value


def _differs(got: Any, expected: Any) -> str | None:
    """How `got` differs from `expected` beyond the tolerances, or None."""
    try:
        torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL, equal_nan=True)
    except (AssertionError, TypeError, ValueError, RuntimeError) as exc:
        return " ".join(str(exc).split())[:200]
    return None


def _dynamo_fails(op: Any, sample: Any) -> bool:
    call, tensors = _as_function(op, sample)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(call, backend="aot_eager", dynamic=False)(*_clones(tensors))
    except Exception:
        return True
    return False


def check_op(op: Any, options: OffloadOptions, count: int = SAMPLES) -> OpResult:
    """Compile and compare the operator's samples; its outcome."""
    chosen = samples(op, count)
    ran, reasons = False, set()  # some node ran on Prism; why others stayed
    for sample in chosen:
        try:
            offloaded, differs, kept = run_sample(op, sample, options)
        except Exception as exc:
            text = str(exc)  # dynamo's wrapper names the backend first, then what it raised
            line = " ".join(text.split("raised:", 1)[-1].split())[:200]
            if _dynamo_fails(op, sample):
                return OpResult("dynamo", len(chosen), f"{type(exc).__name__}: {line}")
            return OpResult("error", len(chosen), f"{type(exc).__name__}: {line}")
        if offloaded and differs is not None:
            return OpResult("wrong", len(chosen), differs)
        ran |= offloaded
        if kept:
            reasons.add(kept)
    outcome = "fell back" if not ran else "partly" if reasons else "offloaded"
    return OpResult(outcome, len(chosen), "; ".join(sorted(reasons))[:400])


def _work(keys: list[str], results: Any) -> None:
    """In a worker process: check the operators in turn, sending (key, result) each."""
    database = {op_key(op): op for op in op_db()}
    with HostManager(parse_devices("cpu:2")) as host:
        options = OffloadOptions.of({"host": host})
        for key in keys:
            result = check_op(database[key], options)
            torch._dynamo.reset()
            gc.collect()  # the dropped graphs' networks leave the host
            results.send((key, asdict(result)))


def sweep(keys: list[str], progress: Path, log: Any) -> dict[str, OpResult]:
    """Every operator's outcome, checked in a worker process that is replaced when it dies
    or gives no answer within OP_SECONDS (that operator is then an `error`). Outcomes
    are appended to `progress` as they come, and a rerun takes up where it stopped."""
    results = {}
    if progress.exists():
        for line in progress.read_text().splitlines():
            key, result = json.loads(line)
            results[key] = OpResult(**result)
    todo = [k for k in keys if k not in results]
    spawn = multiprocessing.get_context("spawn")  # no fork of a process holding threads
    with progress.open("a") as out:

        def record(key: str, result: OpResult, seconds: float) -> None:
            results[key] = result
            out.write(json.dumps([key, asdict(result)]) + "\n")
            out.flush()
            print(f"[{len(results)}/{len(keys)}] {key}: {result.outcome} ({seconds:.1f} s) "
                  f"{result.detail[:120]}", file=log, flush=True)

        while todo:
            answers, sender = spawn.Pipe(duplex=False)
            worker = spawn.Process(target=_work, args=(todo, sender), daemon=True)
            worker.start()
            sender.close()
            wait = START_SECONDS + OP_SECONDS
            while todo:
                start = time.monotonic()
                try:
                    if not answers.poll(wait):
                        raise TimeoutError(f"no answer within {OP_SECONDS} s")
                    key, result = answers.recv()
                except (TimeoutError, EOFError) as exc:
                    what = str(exc) if isinstance(exc, TimeoutError) else "its worker died"
                    record(todo.pop(0), OpResult("error", SAMPLES, what),
                           time.monotonic() - start)
                    break
                todo.remove(key)
                record(key, OpResult(**result), time.monotonic() - start)
                wait = OP_SECONDS
            worker.kill()
            worker.join(10)
    return results


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("torch", "onnxscript", "onnxruntime", "onnx")}


def write(results: dict[str, OpResult], seconds: float) -> None:
    counts = Counter(r.outcome for r in results.values())
    TABLE.write_text(json.dumps({
        "versions": versions(), "samples_per_op": SAMPLES, "rtol": RTOL, "atol": ATOL,
        "seconds": round(seconds), "counts": {k: counts.get(k, 0) for k in OUTCOMES},
        "ops": {k: asdict(v) for k, v in sorted(results.items())}}, indent=1) + "\n")
    DOC.write_text(markdown(results, seconds))


def markdown(results: dict[str, OpResult], seconds: float) -> str:
    counts = Counter(r.outcome for r in results.values())
    tried = sum(counts[k] for k in OUTCOMES if k != "dynamo")
    vers = ", ".join(f"{k} {v}" for k, v in versions().items())
    lines = [
        "# PyTorch operators on Prism", "",
        "The qualification sweep (`python -m tests.torch.sweep`, "
        "`tests/torch/sweep.py`): every operator of PyTorch's operator database "
        "(`op_db`) that runs in float32 on the cpu, forward, its first "
        f"{SAMPLES} sample inputs each compiled with `backend=\"prism\"` (two cpu devices, "
        "`min_block_size` 1, no gradients) and compared with eager PyTorch "
        f"(rtol {RTOL}, atol {ATOL}). The table behind this page is "
        "`tests/torch/op_sweep.json`; `make test` reruns a random sample of it "
        "(`tests/torch/test_op_sweep.py`).", "",
        f"Measured with {vers}, in {seconds / 60:.0f} minutes.", "",
        "| outcome | operators |", "| --- | --- |",
        f"| tried | {tried} |",
        f"| offloaded whole, equal to eager | {counts['offloaded']} |",
        f"| partly offloaded, equal to eager | {counts['partly']} |",
        f"| fell back to PyTorch | {counts['fell back']} |",
        f"| wrong (offloaded, differs) | {counts['wrong']} |",
        f"| backend error | {counts['error']} |",
        f"| not compiled by PyTorch itself (`aot_eager` fails too; not counted) "
        f"| {counts['dynamo']} |", "",
        "An operator falls back when no node of any sample ran on Prism, and is partly "
        "offloaded when some did and others stayed in PyTorch; the reasons are the "
        "backend's report (an operator whose graph computes nothing, its output being its "
        "input or a view of it, falls back: PyTorch makes the view). Operators the sweep "
        "once found wrong are kept in PyTorch by `runtime/torch/refused.py`, for all "
        "arguments or for those that go wrong.", "",
    ]
    for outcome in ("wrong", "error", "fell back", "partly", "dynamo"):
        chosen = {k: r for k, r in results.items() if r.outcome == outcome}
        if not chosen:
            continue
        lines += [f"## {outcome} ({len(chosen)})", "", "| operator | why |", "| --- | --- |"]
        lines += [f"| `{k}` | {r.detail.replace('|', '/')[:300]} |"
                  for k, r in sorted(chosen.items())]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated operator keys; prints, writes nothing")
    parser.add_argument("--progress", type=Path, default=PROGRESS,
                        help=f"outcomes so far, taken up again (default {PROGRESS})")
    args = parser.parse_args()
    keys = [op_key(op) for op in op_db()]
    if args.only:
        wanted = set(args.only.split(","))
        keys = [k for k in keys if k in wanted]
        with tempfile.TemporaryDirectory() as scratch:
            for key, result in sweep(keys, Path(scratch) / "progress", sys.stdout).items():
                print(key, result)
        return
    start = time.monotonic()
    results = sweep(keys, args.progress, sys.stdout)
    write(results, time.monotonic() - start)
    args.progress.unlink()
    print(json.dumps(Counter(r.outcome for r in results.values())))


if __name__ == "__main__":
    main()
