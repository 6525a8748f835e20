"""PyTorch offload: a module compiled with `backend="prism"` on one cpu device, against the
same module exported by hand and run in plain onnxruntime (what the backend adds per
call: dynamo's guards, AOT autograd's wrapper, the block's numpy hand-over and the host),
and against eager PyTorch. The block's network called through `host.run` directly splits
the added time into the host's share and PyTorch's (dynamo, AOT autograd, the block).
A training step (the forward offloaded, the backward in PyTorch) against eager's.
One thread everywhere; calls interleaved in rounds, so the
machine's load falls on all three alike; medians."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from benchmarks.common import result
from runtime.devices import DeviceConfig
from runtime.host import HostManager
from runtime.torch import reports


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10)).eval()


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).eval()


def interleaved(calls: dict[str, Callable[[], object]], rounds: int, per_round: int
                ) -> dict[str, float]:
    """Median seconds per call of each, measured in alternating rounds."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        for _ in range(20):
            call()
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(per_round):
                call()
            samples[name].append((time.perf_counter() - start) / per_round)
    return {name: float(np.median(s)) for name, s in samples.items()}


def _fresh_dynamo() -> None:
    """One thread, and dynamo's cache emptied: the modules are all `nn.Sequential`, whose
    one `forward` dynamo would otherwise trace again with dynamic sizes."""
    torch.set_num_threads(1)
    torch._dynamo.reset()


def _measure(name: str, module: nn.Module, x: torch.Tensor, rounds: int) -> list[dict]:
    _fresh_dynamo()
    with torch.no_grad():
        program = torch.onnx.export(module, (x,), dynamo=True, verbose=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(program.model_proto.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feed_name = session.get_inputs()[0].name
    with HostManager([DeviceConfig(name="cpu0", backend="cpu", threads=1)]) as host:
        fast = torch.compile(module, backend="prism", options={"host": host})
        with torch.no_grad():
            fast(x)
            (network,) = host.networks()
            (variant,) = [v for b in reports()[-1].blocks.values() for v in b.variants]
            (block_input,) = variant.inputs

            def plain() -> object:
                return torch.from_numpy(session.run(None, {feed_name: x.numpy()})[0])

            times = interleaved({"onnxruntime": plain, "prism": lambda: fast(x),
                                 "host": lambda: host.run(network, {block_input: x.numpy()}),
                                 "eager": lambda: module(x)}, rounds, 50)
    ort_us, prism_us, host_us, eager_us = (
        times[k] * 1e6 for k in ("onnxruntime", "prism", "host", "eager"))
    added = prism_us - ort_us
    detail = (f"onnxruntime {ort_us:.1f} us, prism {prism_us:.1f} us, eager PyTorch "
              f"{eager_us:.1f} us; of the {added:.1f} us added, the host's run of the block "
              f"{host_us - ort_us:.1f} us, PyTorch's dynamo, AOT autograd and the block "
              f"{prism_us - host_us:.1f} us (medians of {rounds} interleaved rounds of 50)")
    return [result(f"{name}: torch.compile(backend=prism) on 1 cpu device, added latency "
                   f"over the hand-exported module in onnxruntime", added, "us", "reported",
                   True, detail),
            result(f"{name}: prism / eager PyTorch latency", prism_us / eager_us, "x",
                   "reported", True, detail)]


def _training_step(name: str, module: nn.Module, x: torch.Tensor, rounds: int) -> dict:
    """A step's forward and backward, with the module's batch norms in training mode."""
    _fresh_dynamo()
    module.train()
    reference = copy.deepcopy(module)
    with HostManager([DeviceConfig(name="cpu0", backend="cpu", threads=1)]) as host:
        fast = torch.compile(module, backend="prism", options={"host": host})

        def step(model: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
            return lambda: model(x).square().mean().backward()

        times = interleaved({"prism": step(fast), "eager": step(reference)}, rounds, 5)
        (graph,) = reports()[-1:]
    prism_ms, eager_ms = times["prism"] * 1e3, times["eager"] * 1e3
    detail = (f"prism {prism_ms:.2f} ms, eager PyTorch {eager_ms:.2f} ms per step; "
              f"{len(graph.offloaded)} of {len(graph.nodes)} forward operators offloaded in "
              f"{len(graph.blocks)} block(s) (medians of {rounds} interleaved rounds of 5)")
    return result(f"{name}: training step, prism / eager PyTorch", prism_ms / eager_ms, "x",
                  "reported", True, detail)


def run(quick: bool = False) -> list[dict]:
    rounds = 15 if quick else 60
    rng = np.random.default_rng()
    out = _measure("mlp 64-256-256-10, batch 1", mlp(),
                   torch.from_numpy(rng.standard_normal((1, 64), dtype=np.float32)), rounds)
    out += _measure("cnn 3x32x32, batch 8", cnn(),
                    torch.from_numpy(rng.standard_normal((8, 3, 32, 32), dtype=np.float32)),
                    rounds)
    out.append(_training_step("cnn 3x32x32, batch 8", cnn(), torch.from_numpy(
        rng.standard_normal((8, 3, 32, 32), dtype=np.float32)), rounds // 3))
    return out
