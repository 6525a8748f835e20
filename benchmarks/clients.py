"""Per-request cost under the clients users write: Python threads looping
`host.run(...).result()` and asyncio coroutines awaiting `host.run_async(...)`, each beside
two references measured in the same run: one onnxruntime session behind a lock (one run at
a time, as a device runs; asyncio clients reach it through the loop's default executor, as
asyncio code calls anything that blocks) and a minimal batcher (a queue, a Future per request,
concatenate, run, split), the smallest thing that batches."""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from benchmarks.common import result
from runtime.devices import DeviceConfig
from runtime.devices.ort.options import session_options
from runtime.host import HostManager

CLIENTS = 64
MAX_BATCH = 64
DELAY_S = 0.001
Feeds = dict[str, np.ndarray]


def mlp(widths: tuple[int, ...] = (64, 256, 256, 10), seed: int = 0) -> onnx.ModelProto:
    """The issue's MLP: Gemm+Relu layers, batch dimension free."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        inits += [numpy_helper.from_array(rng.standard_normal((b, a), np.float32) / a, f"w{i}"),
                  numpy_helper.from_array(np.zeros(b, np.float32), f"b{i}")]
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [f"g{i}"], transB=1))
        x = f"g{i}"
        if i < len(widths) - 2:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", widths[0]])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["n", widths[-1]])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


class LockedSession:
    """One onnxruntime session, one run at a time."""

    def __init__(self, model: onnx.ModelProto):
        self.session = ort.InferenceSession(model.SerializeToString(), session_options(1),
                                            providers=["CPUExecutionProvider"])
        self.lock = threading.Lock()

    def __call__(self, feeds: Feeds) -> list[np.ndarray]:
        with self.lock:
            return self.session.run(None, feeds)


class MinimalBatcher:
    """The 30-line batcher a user writes: requests join a queue with a Future each; one
    thread takes up to MAX_BATCH of them, waiting at most DELAY_S for more, concatenates,
    runs, splits and answers."""

    def __init__(self, model: onnx.ModelProto):
        self.session = LockedSession(model).session
        self.queue: queue.SimpleQueue[tuple[np.ndarray, Future]] = queue.SimpleQueue()
        self.worker = threading.Thread(target=self._loop, daemon=True)
        self.worker.start()

    def submit(self, x: np.ndarray) -> Future:
        future: Future = Future()
        self.queue.put((x, future))
        return future

    def _loop(self) -> None:
        while True:
            batch = [self.queue.get()]
            if batch[0][1] is None:
                return
            end = time.monotonic() + DELAY_S
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self.queue.get(timeout=max(0.0, end - time.monotonic())))
                except queue.Empty:
                    break
            xs = np.concatenate([x for x, _ in batch])
            (ys,) = self.session.run(None, {"x": xs})
            for i, (_, future) in enumerate(batch):
                future.set_result(ys[i:i + 1])

    def close(self) -> None:
        self.queue.put((np.empty(0), None))  # type: ignore[arg-type]
        self.worker.join(5)


def threads_rate(call: Callable[[], object], clients: int, per_client: int) -> float:
    """Requests/s of `clients` threads each calling `call` `per_client` times."""
    barrier = threading.Barrier(clients + 1)

    def client() -> None:
        barrier.wait()
        for _ in range(per_client):
            call()

    pool = [threading.Thread(target=client) for _ in range(clients)]
    for t in pool:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in pool:
        t.join()
    return clients * per_client / (time.perf_counter() - start)


def asyncio_rate(call: Callable[[], object], clients: int, per_client: int) -> float:
    """Requests/s of `clients` coroutines on one event loop each awaiting `call()`."""

    async def client() -> None:
        for _ in range(per_client):
            await call()  # type: ignore[misc]

    async def main() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return clients * per_client / (time.perf_counter() - start)

    return asyncio.run(main())


def _host(batched: bool) -> HostManager:
    host = HostManager([DeviceConfig(name="cpu0", backend="cpu", threads=1)])
    batching = {"max_batch_size": MAX_BATCH, "max_queue_delay_ms": DELAY_S * 1e3}
    host.add_network("mlp", mlp(), batching=batching if batched else None)
    return host


def measure(per_client: int, trials: int) -> dict[str, float]:
    """Requests/s of every contender, threads and asyncio, best of `trials` each, the
    contenders interleaved so drift on a shared machine hits all alike."""
    x = np.random.default_rng().standard_normal((1, 64), np.float32)
    feeds = {"x": x}
    locked, batcher = LockedSession(mlp()), MinimalBatcher(mlp())
    hosts = {True: _host(True), False: _host(False)}
    for host in hosts.values():  # warm-up: sessions, batch shapes
        threads_rate(lambda h=host: h.run("mlp", feeds).result(), CLIENTS, 20)

    async def batcher_async() -> object:
        return await asyncio.wrap_future(batcher.submit(x))

    async def locked_async() -> object:  # what asyncio code does with a blocking call
        return await asyncio.get_running_loop().run_in_executor(None, locked, feeds)

    contenders: dict[str, Callable[[], float]] = {
        "threads locked": lambda: threads_rate(lambda: locked(feeds), CLIENTS, per_client),
        "threads batcher": lambda: threads_rate(lambda: batcher.submit(x).result(), CLIENTS,
                                                per_client),
        "asyncio locked": lambda: asyncio_rate(locked_async, CLIENTS, per_client),
        "asyncio batcher": lambda: asyncio_rate(batcher_async, CLIENTS, per_client),
    }
    for batched, host in hosts.items():
        tag = "batched" if batched else "unbatched"
        contenders[f"threads {tag}"] = lambda h=host: threads_rate(
            lambda: h.run("mlp", feeds).result(), CLIENTS, per_client)
        contenders[f"asyncio {tag}"] = lambda h=host: asyncio_rate(
            lambda: h.run_async("mlp", feeds), CLIENTS, per_client)
    best = dict.fromkeys(contenders, 0.0)
    try:
        for _ in range(trials):
            for name, run in contenders.items():
                best[name] = max(best[name], run())
    finally:
        batcher.close()
        for host in hosts.values():
            host.close()
    return best


def run(quick: bool = False) -> list[dict]:
    rates = measure(per_client=100 if quick else 400, trials=1 if quick else 5)
    out = []
    for client in ("threads", "asyncio"):
        batched, batcher = rates[f"{client} batched"], rates[f"{client} batcher"]
        plain, locked = rates[f"{client} unbatched"], rates[f"{client} locked"]
        out.append(result(f"mlp 64-256-256-10, {CLIENTS} {client} clients: batched Prism / "
                          "minimal batcher", batched / batcher, "x", ">= 0.9x",
                          batched / batcher >= 0.9, f"{batched:.0f}/s vs {batcher:.0f}/s"))
        out.append(result(f"mlp 64-256-256-10, {CLIENTS} {client} clients: unbatched Prism / "
                          "one locked onnxruntime session", plain / locked, "x", ">= 0.8x",
                          plain / locked >= 0.8, f"{plain:.0f}/s vs {locked:.0f}/s"))
    return out


if __name__ == "__main__":
    for name, rate in measure(per_client=200, trials=1).items():
        print(f"{name:20s} {rate:10.0f}/s")
