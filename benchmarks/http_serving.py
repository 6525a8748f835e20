"""`prism serve` measured as users call it: `prism serve` in its own process, clients in
this one. Round trips use Python's http.client on one keep-alive connection (the leanest
real HTTP/1.1 client, binary tensors both ways); load uses `prism bench --url`'s
generator (aiohttp, one connection per client). Each ratio's two sides run in this run.

`python -m benchmarks.http_serving plain MODEL [THREADS]` serves one onnxruntime session
behind the same HTTP stack (the same uvicorn, guard, tensor decoding and encoding), the
baseline of the last figure and the round trip's reference (what the stack alone adds).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import sys
import tempfile
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.http_bench import bench
from app.server.errors import HANDLERS
from app.server.guard import Guard
from app.server.runner import ServeProcess, ServerThread, bind
from app.server.state import MAX_BODY_BYTES
from app.server.tensors import encode_response, parse_infer
from benchmarks.common import median_seconds, result
from benchmarks.exports import legacy_bert
from runtime import DeviceConfig
from runtime.devices.ort.sessions import cpu_session, loadable
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.inputs import input_specs, random_feeds

MLP, CNN = "sample_models/mlp.onnx", "sample_models/cnn.onnx"


def _binary(feeds: Mapping[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    described, blobs = [], []
    for name, array in feeds.items():
        described.append({"name": name, "shape": list(array.shape), "datatype": "FP32",
                          "parameters": {"binary_data_size": array.nbytes}})
        blobs.append(array.tobytes())
    header = json.dumps({"inputs": described,
                         "parameters": {"binary_data_output": True}}).encode()
    return header + b"".join(blobs), {"Inference-Header-Content-Length": str(len(header)),
                                      "Content-Type": "application/octet-stream"}


def _poster(url: str, body: bytes, headers: dict[str, str]
            ) -> tuple[http.client.HTTPConnection, Callable[[], None]]:
    """One keep-alive connection to `url` and a call that posts one mlp request on it."""
    where = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=30)

    def post() -> None:
        conn.request("POST", "/v2/models/mlp/infer", body, headers)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")

    return conn, post


def round_trip(repeats: int) -> dict:
    """p50 of in-process `host.run`, of the same request to `prism serve`, and to one plain
    onnxruntime session behind the same HTTP stack (what the stack alone adds), mlp on one
    cpu device; interleaved in two halves, so drift on a shared machine hits all three."""
    with HostManager([DeviceConfig(name="cpu0", backend="cpu", threads=1)]) as host, \
            ServeProcess([MLP, "--devices", "cpu:1"]) as serve, \
            ServeProcess.python(["-m", "benchmarks.http_serving", "plain", MLP, "1"]) as plain:
        host.add_network("mlp", MLP)
        feeds = random_feeds(input_specs(host.graph("mlp")), np.random.default_rng())
        body, headers = _binary(feeds)
        calls = {"in_process": lambda: host.run("mlp", feeds).result(30)}
        conns = []
        for key, url in (("http", serve.url), ("plain_http", plain.url)):
            conn, calls[key] = _poster(url, body, headers)
            conns.append(conn)
        times: dict[str, list[float]] = {key: [] for key in calls}
        for _ in range(2):
            for key, call in calls.items():
                times[key].append(median_seconds(call, repeats // 2, warmup=200))
        for conn in conns:
            conn.close()
    return {key: min(found) for key, found in times.items()}


def _throughput(url: str, model: str, clients: int, requests: int) -> float:
    level = asyncio.run(bench(url, model, [clients], requests))[0]
    if level.errors:
        raise RuntimeError(f"{url} {model}: {level.errors} errors: {level.first_error}")
    return level.requests_per_second


def batching(requests: int) -> dict[str, tuple[float, float]]:
    """Requests/s at 64 clients, unbatched and batched (max 32, 2 ms), per model."""
    out: dict[str, list[float]] = {"mlp": [], "cnn": []}
    for extra in ([], ["--max-batch", "32", "--max-delay-ms", "2"]):
        with ServeProcess([MLP, CNN, "--devices", "cpu:1", *extra]) as serve:
            for model in out:
                out[model].append(_throughput(serve.url, model, 64, requests))
    return {m: (plain, batched) for m, (plain, batched) in out.items()}


def pipelined_vs_plain(requests: int, clients: int = 16) -> tuple[float, float]:
    """Requests/s of cnn: `prism serve` on 2 cpu devices (1 thread each), and one
    onnxruntime session with 2 threads behind the same HTTP stack."""
    with ServeProcess([CNN, "--devices", "cpu:2"]) as serve:
        prism = _throughput(serve.url, "cnn", clients, requests)
    with ServeProcess.python(["-m", "benchmarks.http_serving", "plain", CNN]) as serve:
        plain = _throughput(serve.url, "cnn", clients, requests)
    return prism, plain


SERVINGS = {"batching": ["--max-batch", "16", "--max-delay-ms", "2"],
            "replicas": ["--replicas", "2"],
            "batching + replicas": ["--replicas", "2", "--max-batch", "16", "--max-delay-ms", "2"]}


def bert_servings(requests: int, clients: int = 32, rounds: int = 2) -> dict[str, float]:
    """Requests/s of a BERT-style encoder (4 layers, hidden 256, seq 128, dynamic batch) on
    `prism serve` over 2 cpu devices, batched, replicated, and both: the best of `rounds`
    interleaved rounds each."""
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "bert.onnx"
        onnx.save(legacy_bert(batch="batch"), model)
        best = dict.fromkeys(SERVINGS, 0.0)
        for _ in range(rounds):
            for name, flags in SERVINGS.items():
                with ServeProcess([str(model), "--devices", "cpu:2", *flags]) as serve:
                    _throughput(serve.url, "bert", clients, clients)  # warm-up
                    best[name] = max(best[name], _throughput(serve.url, "bert", clients,
                                                             requests))
    return best


def plain_app(model: str, threads: int = 2) -> Starlette:
    """One onnxruntime session behind the server's own guard, tensor decoding and
    encoding, runs on worker threads: `prism serve` without Prism."""
    graph = load_graph(model)
    session = cpu_session(loadable(graph.model), threads=threads)
    specs = input_specs(graph)
    names = [o.name for o in session.get_outputs()]
    metadata = {"name": Path(model).stem, "versions": ["1"], "platform": "onnxruntime_onnx",
                "inputs": [{"name": s.name, "datatype": "FP32",
                            "shape": [d if isinstance(d, int) else -1 for d in s.dims or ()]}
                           for s in specs], "outputs": []}

    async def infer(request: Request) -> Response:
        body = await request.body()
        parsed = parse_infer(body, request.headers.get("inference-header-content-length"),
                             specs)
        values = await run_in_threadpool(session.run, names, parsed.feeds)
        content, header = encode_response("cnn", "1", parsed, dict(zip(names, values,
                                                                        strict=True)))
        return Response(content, headers={"Inference-Header-Content-Length": str(header)}
                        if header is not None else None)

    async def meta(request: Request) -> Response:
        return Response(json.dumps(metadata), media_type="application/json")

    return Starlette(routes=[Route("/v2/models/{model}/infer", infer, methods=["POST"]),
                             Route("/v2/models/{model}", meta)],
                     middleware=[Middleware(Guard, token=None, max_body_bytes=MAX_BODY_BYTES)],
                     exception_handlers=HANDLERS)


def run(quick: bool = False) -> list[dict]:
    scale = 1 if quick else 4
    trip = round_trip(1000 * scale)
    added = (trip["http"] - trip["in_process"]) * 1e6
    out = [result("mlp over HTTP (prism serve, http.client, binary tensors): p50 added to "
                  "in-process host.run", added, "us", "<= 300 us", added <= 300,
                  f"in-process {trip['in_process'] * 1e6:.0f} us, HTTP "
                  f"{trip['http'] * 1e6:.0f} us, one onnxruntime session behind the same "
                  f"HTTP stack {trip['plain_http'] * 1e6:.0f} us; Triton's C++ server adds "
                  f"~41 us")]
    for model, (plain, batched) in batching(1000 * scale).items():
        ratio = batched / plain
        out.append(result(f"{model} over HTTP, 64 clients: batched (max 32) / unbatched "
                          f"throughput", ratio, "x", "> 1x", ratio > 1,
                          f"{batched:.0f}/s vs {plain:.0f}/s (aiohttp clients)"))
    served = bert_servings(60 * scale)
    both, alone = served["batching + replicas"], max(served["batching"], served["replicas"])
    out.append(result("BERT-style encoder over HTTP, 32 clients, 2 cpu devices: batching + "
                      "replicas / the better of either alone", both / alone, "x", ">= 1x",
                      both / alone >= 1, ", ".join(f"{k} {v:.1f}/s" for k, v in
                                                    served.items())))
    prism, plain = pipelined_vs_plain(250 * scale)
    ratio = prism / plain
    out.append(result("cnn over HTTP, 16 clients: prism serve on 2 cpu devices / one "
                      "onnxruntime session (2 threads), same HTTP stack", ratio, "x",
                      ">= 0.95x", ratio >= 0.95, f"{prism:.0f}/s vs {plain:.0f}/s"))
    return out


if __name__ == "__main__":  # python -m benchmarks.http_serving plain MODEL [THREADS]
    if sys.argv[1:2] != ["plain"] or len(sys.argv) not in (3, 4):
        sys.exit("usage: python -m benchmarks.http_serving plain MODEL [THREADS]")
    with ServerThread(plain_app(sys.argv[2], int(sys.argv[3]) if len(sys.argv) == 4 else 2),
                      bind("127.0.0.1", 0)) as server:
        print(f"plain onnxruntime on {server.url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: ServeProcess.stop
            server.thread.join()
