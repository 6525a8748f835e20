"""`prism bench --url URL`: a closed-loop load generator speaking the Open Inference Protocol,
as Triton's perf_analyzer: at each concurrency level C clients each send a request and wait
for its answer until N requests are answered. Reports throughput and latency percentiles per
level, and the server's own split of a request's time into queueing and compute, read from
its `/metrics` (Triton's counters) before and after each level.

Requests use Triton's binary tensor data extension both ways, random inputs drawn once per
level from the model's metadata (a small pool, as perf_analyzer reuses its data), or the
feeds of `--inputs FILE.npz` (perf_analyzer's `--input-data`); the client is aiohttp, one
connection per client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import partial

import aiohttp
import numpy as np
import orjson
from prometheus_client.parser import text_string_to_metric_families
from rich import box
from rich.table import Table

from app.console import plain_console, progress_on
from app.given_inputs import read_inputs
from app.server.tensors import DTYPES, INPUT_SPECS, to_bytes
from runtime.errors import PrismError
from runtime.free_dims import fixed_size
from runtime.inputs import InputSpec, random_feeds
from runtime.units import human_seconds

REQUEST_TIMEOUT = 60.0  # seconds one request may take before it counts as failed
POOL = 8  # distinct random requests per level
SPLIT = {"queue_us": "nv_inference_queue_duration_us",
         "compute_us": "nv_inference_compute_infer_duration_us",
         "request_us": "nv_inference_request_duration_us",
         "requests": "nv_inference_request_success"}


@dataclass(frozen=True)
class Level:
    concurrency: int
    requests: int  # answered with 200
    errors: int
    seconds: float
    requests_per_second: float
    p50_seconds: float
    p90_seconds: float
    p95_seconds: float
    p99_seconds: float
    server: dict[str, float] | None  # per request: queue_us, compute_us, request_us
    first_error: str | None = None
    shapes: dict[str, list[int]] = field(default_factory=dict)  # the inputs' shapes sent


def run(args: argparse.Namespace) -> int:
    token = args.token or os.environ.get("PRISM_TOKEN")
    shapes = {name: tuple(map(int, dims.split(",")))
              for name, _, dims in (text.rpartition("=") for text in args.shape)}
    levels = asyncio.run(bench(args.url.rstrip("/"), args.served_model, args.concurrency,
                               args.requests, token, quiet=args.json, inputs=args.inputs,
                               shapes=shapes))
    if args.json:
        print(json.dumps([asdict(level) for level in levels], indent=2))
    else:
        plain_console().print(_table(args.url, levels))
    return 0 if all(level.requests for level in levels) else 1


async def bench(url: str, model: str | None, levels: list[int], requests: int,
                token: str | None = None, quiet: bool = True, inputs: str | None = None,
                shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[Level]:
    """`inputs`: an .npz of the feeds to send, checked against the model's metadata, in
    place of random ones; `shapes`: the shapes to draw inputs in, for their variable
    dimensions (perf_analyzer's --shape)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    connector = aiohttp.TCPConnector(limit=max(levels))
    async with aiohttp.ClientSession(headers=headers, connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
                                     ) as session:
        model = model or await _only_model(session, url)
        metadata = await _get_json(session, "GET", f"{url}/v2/models/{model}")
        specs = _specs(metadata, shapes or {}, await _served_specs(session, url, model))
        given = read_inputs(inputs, model, specs) if inputs else None
        out = []
        with progress_on(plain_console(stderr=True), quiet=quiet) as progress:
            for clients in levels:
                task = progress.add_task(f"{model}, {clients} clients", total=requests)
                feed_sets = [given] if given is not None else [
                    random_feeds(specs, np.random.default_rng()) for _ in range(POOL)]
                level = await _level(session, f"{url}/v2/models/{model}",
                                     [_request(metadata, feeds) for feeds in feed_sets],
                                     clients, requests, partial(progress.advance, task))
                out.append(replace(level, shapes={k: list(np.shape(v))
                                                  for k, v in feed_sets[0].items()}))
        return out


async def _level(session: aiohttp.ClientSession, model_url: str,
                 bodies: list[tuple[bytes, dict]], clients: int, requests: int,
                 advance) -> Level:
    infer = f"{model_url}/infer"
    latencies: list[float] = []
    errors: list[str] = []
    remaining = clients  # a warm-up round first: connections opened, caches warm

    async def client() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            body, headers = bodies[remaining % len(bodies)]
            start = time.perf_counter()
            try:
                async with session.post(infer, data=body, headers=headers) as response:
                    payload = await response.read()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                status, payload = 0, str(exc).encode()
            if status == 200:
                latencies.append(time.perf_counter() - start)
            else:
                errors.append(_error_text(status, payload))

    await asyncio.gather(*(client() for _ in range(clients)))
    latencies.clear()
    errors.clear()
    before = await _split(session, model_url)
    remaining = requests
    counted = 0

    async def counting() -> None:
        nonlocal counted
        while counted < requests:
            await asyncio.sleep(0.1)
            done = len(latencies) + len(errors)
            for _ in range(done - counted):
                advance()
            counted = done

    start = time.perf_counter()
    ticker = asyncio.create_task(counting())
    await asyncio.gather(*(client() for _ in range(clients)))
    seconds = time.perf_counter() - start
    ticker.cancel()
    after = await _split(session, model_url)
    server = None
    if before is not None and after is not None and after["requests"] > before["requests"]:
        n = after["requests"] - before["requests"]
        server = {k: (after[k] - before[k]) / n for k in SPLIT if k != "requests"}
    p50, p90, p95, p99 = (np.percentile(latencies, [50, 90, 95, 99]) if latencies
                          else (0.0,) * 4)
    return Level(clients, len(latencies), len(errors), seconds, len(latencies) / seconds,
                 float(p50), float(p90), float(p95), float(p99), server,
                 errors[0] if errors else None)


async def _served_specs(session: aiohttp.ClientSession, url: str, model: str
                        ) -> dict[str, InputSpec]:
    """The inputs as a Prism server reads them (its configuration's `INPUT_SPECS`), by
    name; {} from any other server, or one that says nothing of them."""
    try:
        config = await _get_json(session, "GET", f"{url}/v2/models/{model}/config")
        text = config["parameters"][INPUT_SPECS]["string_value"]
        return {s.name: s for s in map(InputSpec.from_dict, json.loads(text))}
    except (PrismError, AttributeError, KeyError, TypeError, ValueError):
        return {}  # not a Prism server's, or not one this client reads


def _specs(metadata: dict, shapes: Mapping[str, tuple[int, ...]],
           served: Mapping[str, InputSpec] | None = None) -> list[InputSpec]:
    """The model's inputs as its metadata describes them (-1: a variable dimension), in
    `shapes` where given: each fits its input's rank and fixed dimensions. Where not, a
    Prism server's own reading of one (`served`: its dimensions' names, least sizes and
    value limits) draws it as `prism run` would, if it agrees with the metadata."""
    model, inputs = metadata.get("name", "the model"), {s["name"]: s for s in metadata["inputs"]}
    unknown = sorted(set(shapes) - set(inputs))
    if unknown:
        raise PrismError(f"--shape {unknown[0]}: {model} has no input named "
                         f"{unknown[0]!r}; its inputs are {', '.join(inputs)}")
    specs = []
    for name, spec in inputs.items():
        dtype = DTYPES.get(spec["datatype"])
        if dtype is None:
            raise PrismError(f"input {name!r} is {spec['datatype']}: the load generator "
                             f"sends none")
        served_shape, shape = spec["shape"], shapes.get(name)
        if shape is not None and (len(shape) != len(served_shape) or any(
                0 <= d != s for d, s in zip(served_shape, shape, strict=True))):
            raise PrismError(f"--shape {name}={','.join(map(str, shape))}: input {name!r} "
                             f"of {model} is served as {served_shape} (-1: any size)")
        own = (served or {}).get(name)
        if shape is None and own is not None and own.dtype == dtype and own.dims is not None \
                and _agree(own.dims, served_shape):
            specs.append(own)
            continue
        specs.append(InputSpec(name, dtype, shape or tuple(d if d >= 0 else None
                                                          for d in served_shape)))
    return specs


def _agree(dims: tuple, shape: list[int]) -> bool:
    """Do a server's dims say what its metadata's shape says (-1: a free one)?"""
    return len(dims) == len(shape) and all(
        (s < 0) == (fixed_size(d) is None) and (s < 0 or fixed_size(d) == s)
        for d, s in zip(dims, shape, strict=True))


def _request(metadata: dict, feeds: dict[str, np.ndarray]) -> tuple[bytes, dict]:
    """One binary request of `feeds` (random ones as the host's own load draws them,
    `random_feeds`: variable dimensions as 1, an image's sides 224), all outputs binary."""
    described, blobs = [], []
    for spec in metadata["inputs"]:
        array = feeds[spec["name"]]
        blob = to_bytes(array)
        described.append({"name": spec["name"], "shape": list(array.shape),
                          "datatype": spec["datatype"],
                          "parameters": {"binary_data_size": len(blob)}})
        blobs.append(blob)
    header = orjson.dumps({"inputs": described, "parameters": {"binary_data_output": True}})
    return b"".join((header, *blobs)), {"Inference-Header-Content-Length": str(len(header)),
                                        "Content-Type": "application/octet-stream"}


async def _only_model(session: aiohttp.ClientSession, url: str) -> str:
    index = await _get_json(session, "POST", f"{url}/v2/repository/index", {"ready": True})
    names = [row["name"] for row in index if row.get("state", "READY") == "READY"]
    if len(names) != 1:
        raise PrismError(f"{url} serves {len(names)} models ({', '.join(names) or 'none'}): "
                         f"pick one with --model")
    return names[0]


async def _get_json(session: aiohttp.ClientSession, method: str, url: str,
                    body: dict | None = None):
    try:
        async with session.request(method, url, json=body) as response:
            payload = await response.read()
            if response.status != 200:
                raise PrismError(f"{method} {url}: {_error_text(response.status, payload)}")
            return orjson.loads(payload)
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
        raise PrismError(f"cannot use {url}: {exc}") from None


async def _split(session: aiohttp.ClientSession, model_url: str) -> dict[str, float] | None:
    """The server's cumulative Triton counters for the model, or None without /metrics."""
    base, _, rest = model_url.partition("/v2/models/")
    model = rest.split("/")[0]
    try:
        async with session.get(f"{base}/metrics") as response:
            if response.status != 200:
                return None
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError):
        return None
    wanted = {v: k for k, v in SPLIT.items()}
    found = dict.fromkeys(SPLIT, 0.0)
    for family in text_string_to_metric_families(text):
        key = wanted.get(family.name)
        if key is not None:
            found[key] = sum(s.value for s in family.samples if s.labels.get("model") == model)
    return found


def _error_text(status: int, payload: bytes) -> str:
    try:
        message = orjson.loads(payload).get("error", "")
    except (orjson.JSONDecodeError, AttributeError):
        message = payload[:200].decode("utf-8", "replace")
    return f"HTTP {status}: {message}" if status else message


def _table(url: str, levels: list[Level]) -> Table:
    sent = ", ".join(f"{k} {v}" for k, v in levels[0].shapes.items()) if levels else ""
    table = Table(title=f"{url}: closed loop, binary tensors", box=box.SIMPLE_HEAD,
                  caption=f"inputs sent: {sent}" if sent else None)
    for col in ("clients", "req/s", "p50", "p90", "p95", "p99", "server queue",
                "server compute", "errors"):
        table.add_column(col, justify="right")
    for lv in levels:
        server = lv.server or {}
        table.add_row(str(lv.concurrency), f"{lv.requests_per_second:.0f}",
                      *(human_seconds(s) for s in (lv.p50_seconds, lv.p90_seconds,
                                                   lv.p95_seconds, lv.p99_seconds)),
                      *(human_seconds(server[k] / 1e6) if k in server else "-"
                        for k in ("queue_us", "compute_us")),
                      f"{lv.errors}" + (f" ({lv.first_error})" if lv.first_error else ""))
    return table
