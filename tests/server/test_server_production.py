"""Issue 34, serving you can run in production: a request cannot make the server allocate
what it did not send, SIGTERM drains as Ctrl-C does and exits 0, a reload under load drops
nothing, a model file too large for the devices is refused unread, slow clients time out
and connections are capped, health probes need no token, every error is JSON (the HTTP
parser's own too), every number on the command line is checked and no command writes over
its input, and `GET /v2/models/M/config` answers as Triton's does.

Real parts throughout: a real server (on a thread, or `prism serve` as a process sent real
signals), clients that speak HTTP over sockets (tritonclient, urllib, raw bytes), fresh
random inputs; every wait is bounded."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from email.message import Message
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.http as triton
from onnx import helper, numpy_helper

import app.serve_cmd
import app.server.routes.infer
from app.cli import main
from app.server.protocol import Limits
from app.server.runner import ServeProcess
from app.server.state import ServerSettings
from app.server.tensors import DTYPES, parse_infer
from runtime.errors import PrismError
from tests.cli.test_cli import one_line_error
from tests.support.hosts import resident_bytes
from tests.support.servers import (
    WAIT,
    announced,
    binary_request,
    call,
    error_of,
    make_repository,
    metric,
    serving,
)
from tests.support.serving import MLP, assert_same, expected, mlp_feeds, poll

# One sim device holding each of mlp's runs for its modelled time: ~2 s a request (mlp is
# seven kernels), long enough to be in flight when a signal comes.
SLOW = "sim:1:launch_seconds=0.3"
SLOWER = "sim:1:launch_seconds=0.5"


# -- helpers -----------------------------------------------------------------------------------


def infer(url: str, feeds: dict, model: str = "mlp") -> tuple[int, Message, dict | str]:
    """(status, headers, outputs) of one binary request, or the error for a status not 200."""
    body, headers = binary_request(feeds)
    status, response_headers, payload = call(f"{url}/v2/models/{model}/infer", "POST", body,
                                             headers)
    if status != 200:
        return status, response_headers, error_of((status, response_headers, payload))[1]
    return status, response_headers, decode(payload, response_headers)


def decode(payload: bytes, headers: Message) -> dict[str, np.ndarray]:
    size = int(headers["Inference-Header-Content-Length"])
    out, at = {}, size
    for tensor in json.loads(payload[:size])["outputs"]:
        n = tensor["parameters"]["binary_data_size"]
        out[tensor["name"]] = np.frombuffer(payload[at:at + n], "<f4").reshape(tensor["shape"])
        at += n
    return out


def raw(port: int, data: bytes, wait: float = WAIT) -> bytes:
    """Everything the server sends on one connection after `data`, until it closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(data)
        return read_to_close(sock)


def read_to_close(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def json_error(response: bytes) -> tuple[int, str]:
    """(status, message) of a raw HTTP response whose body must be `{"error": one line}`."""
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    assert headers.get("content-type") == "application/json", response[:300]
    message = json.loads(body)["error"]
    assert isinstance(message, str) and message and "\n" not in message, body
    return int(lines[0].split()[1]), message


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@contextlib.contextmanager
def peak_rss() -> Iterator[list[int]]:
    """The most this process's resident memory grew over the block (bytes), sampled every
    5 ms on a thread of its own (ru_maxrss is a peak over the whole session)."""
    base, peak, done = resident_bytes(), [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], resident_bytes() - base)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join(WAIT)


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now (its children, theirs, ...)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError), \
                    open(f"/proc/{entry}/stat") as stat:
                parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        children = {p for p, pp in parents.items() if pp == parent}
        found |= children
        todo.extend(children)
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to read its status has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def requests_taken(url: str) -> int:
    """Requests the host has taken, from the server's event stream (a run on the lean path
    is first seen starting its partition)."""
    stream = call(f"{url}/v2/prism/events?window=0")[2].decode()
    events = [json.loads(line.removeprefix("data: ")) for line in stream.splitlines()
              if line.startswith("data: ")]
    return len({e["request"] for e in events if e["kind"] in (
        "request.queued", "partition.run.started")})


def two_requests_in_flight(serve: ServeProcess, pool: ThreadPoolExecutor, rng):
    """Two requests sent to a one-device server, returned once the host has both (one runs,
    one waits for the device): [(feeds, future of (status, headers, outputs))]."""
    sent = []
    for _ in range(2):
        feeds = mlp_feeds(rng, 1)
        sent.append((feeds, pool.submit(infer, serve.url, feeds)))
    assert poll(lambda: requests_taken(serve.url) >= 2, WAIT, 0.02)
    return sent


# -- 1: a request cannot make the server allocate what it did not send --------------------------


@pytest.fixture(scope="module")
def mlp_server():
    with serving("cpu:1", files=(("mlp", MLP),)) as (url, state):
        yield url, state


@pytest.mark.parametrize("count", [200_000_000, 2**40])
def test_bytes_declaring_more_elements_than_it_sends_is_400_before_any_allocation(mlp_server,
                                                                                   count):
    """Before: 2e8 BYTES elements in a 200-byte request took 1.5 GB and 1.5 s on the event
    loop (health stalled); 2**40 was a 500 MemoryError."""
    url, _ = mlp_server
    blob = b"".join(len(s).to_bytes(4, "little") + s for s in (b"abc", b"de") * 20)
    header = json.dumps({"inputs": [{"name": "x", "shape": [count], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(blob)}}]}).encode()
    slowest, stop = [0.0], threading.Event()

    def probe() -> None:  # the server keeps answering everyone else meanwhile
        while not stop.is_set():
            start = time.monotonic()
            assert call(f"{url}/v2/health/live")[0] == 200
            slowest[0] = max(slowest[0], time.monotonic() - start)

    with peak_rss() as grew, ThreadPoolExecutor(1) as pool:
        probing = pool.submit(probe)
        start = time.monotonic()
        status, message = error_of(call(f"{url}/v2/models/mlp/infer", "POST", header + blob,
                                        {"Inference-Header-Content-Length": str(len(header))}))
        took = time.monotonic() - start
        time.sleep(0.05)
        stop.set()
        probing.result(WAIT)
    assert status == 400 and "'x'" in message and str(count) in message, message
    assert str(len(blob)) in message and "BYTES" in message, message
    assert took < 1.0 and slowest[0] < 1.0, (took, slowest)
    assert grew[0] < 200 << 20, f"resident memory grew {grew[0] >> 20} MB"


@pytest.mark.parametrize("datatype", sorted(DTYPES))
def test_every_datatype_is_held_to_the_bytes_sent(mlp_server, datatype):
    url, _ = mlp_server
    rng = np.random.default_rng()
    blob = rng.bytes(8 * int(rng.integers(1, 4)))
    shape = [2**20, 2**20]
    header = json.dumps({"inputs": [{"name": "x", "shape": shape, "datatype": datatype,
                                     "parameters": {"binary_data_size": len(blob)}}]}).encode()
    status, message = error_of(call(f"{url}/v2/models/mlp/infer", "POST", header + blob,
                                    {"Inference-Header-Content-Length": str(len(header))}))
    assert status == 400 and "'x'" in message and str(len(blob)) in message, message
    feeds = mlp_feeds(rng)  # and it serves on
    status, _, got = infer(url, feeds)
    assert status == 200
    assert_same(got, expected(MLP, feeds))


def test_binary_bytes_bodies_decode_off_the_event_loop(mlp_server, monkeypatch):
    """A BYTES element decodes one by one: 64 KB of them (16,384 elements) is milliseconds
    of work, done on a worker thread; small numeric bodies stay on the loop."""
    url, _ = mlp_server
    decoded_on: list[str] = []

    def parse(*args):
        decoded_on.append(threading.current_thread().name)
        return parse_infer(*args)

    monkeypatch.setattr(app.server.routes.infer, "parse_infer", parse)
    count = 16_384
    blob = b"".join(len(s).to_bytes(4, "little") + s
                    for s in (os.urandom(int(n)) for n in np.random.default_rng().integers(
                        0, 1, count, endpoint=True)))
    header = json.dumps({"inputs": [{"name": "x", "shape": [count], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(blob)}}]}).encode()
    status, message = error_of(call(f"{url}/v2/models/mlp/infer", "POST", header + blob,
                                    {"Inference-Header-Content-Length": str(len(header))}))
    assert status == 400 and "x" in message  # decoded, then refused: mlp takes FP32
    feeds = mlp_feeds(np.random.default_rng())
    assert infer(url, feeds)[0] == 200
    assert decoded_on[0] != "prism-server" and decoded_on[1] == "prism-server", decoded_on


# -- 2: SIGTERM and SIGINT alike drain, write the trace, close the host, exit 0 ------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_drains_requests_in_flight_writes_the_trace_and_exits_0(tmp_path, sig):
    """Before: SIGTERM exited 143 at once; no trace, no host closed, no answer."""
    trace = tmp_path / "trace.json"
    rng = np.random.default_rng()
    with ServeProcess([str(MLP), "--devices", SLOW, "--trace", str(trace)]) as serve, \
            ThreadPoolExecutor(2) as pool:
        sent = two_requests_in_flight(serve, pool, rng)
        family = descendants(serve.proc.pid)
        serve.proc.send_signal(sig)
        assert poll(lambda: refused(port_of(serve.url)), WAIT, 0.05)  # stops accepting
        for feeds, answer in sent:  # ... and answers what it holds
            status, _, got = answer.result(WAIT)
            assert status == 200, got
            assert_same(got, expected(MLP, feeds))
        assert serve.proc.wait(WAIT) == 0
        err = serve.proc.stderr.read()  # type: ignore[union-attr]
    assert sig.name in err and "Traceback" not in err, err
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)  # the runs are in it
    assert poll(lambda: not any(alive(p) for p in family), WAIT), "orphans left"


def test_what_outlasts_the_grace_period_is_answered_503_and_it_exits_0():
    rng = np.random.default_rng()
    with ServeProcess([str(MLP), "--devices", SLOWER, "--grace-seconds", "1"]) as serve, \
            ThreadPoolExecutor(2) as pool:
        sent = two_requests_in_flight(serve, pool, rng)
        start = time.monotonic()
        serve.proc.send_signal(signal.SIGTERM)
        for _, answer in sent:
            status, headers, message = answer.result(WAIT)
            assert status == 503 and "1 s" in str(message), message
            assert headers["Content-Type"] == "application/json"
        assert serve.proc.wait(WAIT) == 0
        assert time.monotonic() - start < 1 + app.serve_cmd.CLOSE_SECONDS + 5
        assert "Traceback" not in serve.proc.stderr.read()  # type: ignore[union-attr]


def test_ray_devices_stop_on_sigterm_with_exit_0_and_no_process_left():
    """Before: Ray's own SIGTERM handler made it exit 15."""
    rng = np.random.default_rng()
    with ServeProcess([str(MLP), "--devices", "ray:1"]) as serve:
        feeds = mlp_feeds(rng)
        status, _, got = infer(serve.url, feeds)
        assert status == 200
        assert_same(got, expected(MLP, feeds))
        family = descendants(serve.proc.pid)
        assert family, "ray runs its actors in processes of their own"
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(WAIT) == 0
    assert poll(lambda: not any(alive(p) for p in family), WAIT), \
        [p for p in family if alive(p)]


# -- 3: a reload under load drops nothing and names no internal network --------------------------


def test_reloads_under_load_fail_no_request_and_errors_name_the_model(tmp_path):
    """Before: 38 of 24,712 requests failed with 404 `network 'mlp#16' is being removed`."""
    repository = make_repository(tmp_path)
    with serving("cpu:2", repository, models=("mlp",)) as (url, state):
        host, port = "127.0.0.1", port_of(url)
        stop, lock, results = threading.Event(), threading.Lock(), []

        def client(seed: int) -> None:
            rng = np.random.default_rng(seed)
            conn = http.client.HTTPConnection(host, port, timeout=WAIT)
            while not stop.is_set():  # some bodies over 256 KB: decoded off the loop
                feeds = mlp_feeds(rng, int(rng.choice([1, 2, 300])))
                body, headers = binary_request(feeds)
                conn.request("POST", "/v2/models/mlp/infer", body, headers)
                response = conn.getresponse()
                with lock:
                    results.append((feeds, response.status, response.headers,
                                    response.read()))
            conn.close()

        with ThreadPoolExecutor(4) as pool:
            clients = [pool.submit(client, int(s))
                       for s in np.random.SeedSequence().generate_state(4)]
            reloads, deadline = 0, time.monotonic() + WAIT
            while (reloads < 21 or len(results) < 1000) and time.monotonic() < deadline:
                before = state.catalog.get("mlp").network  # each load a reload: the
                mode = ("balanced", "memory")[reloads % 2]  # pbtxt asked for memory mode
                status, _, body = call(f"{url}/v2/repository/models/mlp/load", "POST",
                                       {"parameters": {"partition": mode}})
                assert status == 200, body
                assert state.catalog.get("mlp").network != before
                reloads += 1
            stop.set()
            for done in clients:
                done.result(WAIT)
        assert reloads >= 21 and len(results) >= 1000, (reloads, len(results))
        failed = [(status, payload[:200]) for _, status, _, payload in results if status != 200]
        assert not failed, f"{len(failed)} of {len(results)} failed: {failed[:3]}"
        for feeds, _, headers, payload in results:
            assert_same(decode(payload, headers), expected(MLP, feeds))
        if state.catalog.get("mlp").network == "mlp":  # reload once more: to "mlp#N"
            assert call(f"{url}/v2/repository/models/mlp/load", "POST", {"parameters": {
                "partition": ("balanced", "memory")[reloads % 2]}})[0] == 200
        assert state.host.networks() == [state.catalog.get("mlp").network] != ["mlp"]
        # an error about the model names it, not the network the host serves it by now
        bad = {"inputs": [{"name": "y", "shape": [1, 256], "datatype": "FP32",
                           "data": [0.0] * 256}]}
        status, message = error_of(call(f"{url}/v2/models/mlp/infer", "POST", bad))
        assert status == 400 and "mlp" in message and "#" not in message, message


def test_a_model_file_written_over_serves_on_as_loaded_until_it_is_loaded_again(tmp_path):
    """A model read from a file leaves its weights there (`runtime.stored`): written over,
    the model answers as it was loaded (its sessions hold the weights), and `load` with
    the same parameters serves the new file, as Triton reloads a model whose files
    changed (before, the network serving kept serving: nothing had changed but the file)."""
    repository = make_repository(tmp_path)
    path = tmp_path / "mlp" / "1" / "model.onnx"
    loaded = tmp_path / "loaded.onnx"
    loaded.write_bytes(path.read_bytes())
    rng = np.random.default_rng()
    model = onnx.load(path)
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(
            numpy_helper.to_array(init) * rng.uniform(0.5, 2.0), init.name))
    with serving("cpu:2", repository, models=("mlp",)) as (url, _):
        def answers(want: Path) -> None:
            feeds = mlp_feeds(rng, 3)
            body, headers = binary_request(feeds)
            status, got_headers, payload = call(f"{url}/v2/models/mlp/infer", "POST", body,
                                                headers)
            assert status == 200, payload
            assert_same(decode(payload, got_headers), expected(want, feeds))

        stamp = path.stat().st_mtime_ns + 10**9  # a second later, on any file system
        onnx.save(model, path)
        os.utime(path, ns=(stamp, stamp))
        answers(loaded)
        status, _, body = call(f"{url}/v2/repository/models/mlp/load", "POST", {})
        assert status == 200, body
        answers(path)


def test_reloads_keep_nothing_of_the_networks_they_replace_and_count_every_request(tmp_path):
    """Before: the catalog kept every network it had served (~4 KB a reload of mlp), so a
    server reloading on a schedule grew for ever. Now a network's label goes with it, once
    the metrics have folded the events its requests left."""
    repository = make_repository(tmp_path)
    with serving("cpu:2", repository, models=("mlp",), files=(("mlp#3", MLP),)) as (url, state):
        rng, catalog = np.random.default_rng(), state.catalog
        networks, answered = [catalog.get("mlp#3").network], 0
        for reload in range(6):
            network = catalog.get("mlp").network
            networks.append(network)
            for _ in range(int(rng.integers(3, 9))):
                state.host.run(network, mlp_feeds(rng)).result(WAIT)
                answered += 1
            # at once: the last requests' events are still waiting to be folded
            catalog.load("mlp", {"partition": ("balanced", "memory")[reload % 2]})
        networks.append(catalog.get("mlp").network)
        assert len(set(networks)) == len(networks), networks  # no name given twice
        assert [catalog.of_network(n) is None for n in networks[1:-1]] == [True] * 6
        assert catalog.of_network(networks[-1]) is catalog.get("mlp")
        assert metric(url, "nv_inference_request_success", model="mlp") == answered


# -- 4: a model file too large for the devices is refused unread --------------------------------


@pytest.mark.parametrize("size", [256 << 20, 20 << 30], ids=["256MB", "20GB"])
def test_a_model_file_larger_than_free_device_memory_is_refused_unread(tmp_path, size):
    """Before: a 20 GB sparse file took 37.6 s and 21 GB of memory before its 400."""
    (tmp_path / "huge" / "1").mkdir(parents=True)
    huge = tmp_path / "huge" / "1" / "model.onnx"
    with open(huge, "wb") as file:
        file.truncate(size)  # sparse: takes no disk, reads as zeros
    with serving("cpu:2:mem=64MB", tmp_path) as (url, _), peak_rss() as grew:
        start = time.monotonic()
        status, message = error_of(call(f"{url}/v2/repository/models/huge/load", "POST"))
        took = time.monotonic() - start
    assert status == 400 and str(huge) in message, message
    assert str(size) in message and str(2 * 64_000_000) in message, message
    assert took < 2.0 and grew[0] < 64 << 20, (took, grew[0])


def test_external_weights_count_before_they_are_read_and_load_when_they_fit(tmp_path):
    count = 32 << 20  # float32 weights: 128 MiB, in a sparse file (no disk, zeros)
    weights = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[count],
                               data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", "big.weights"), ("offset", "0"), ("length", str(4 * count))):
        weights.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "big",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [count])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [count])], [weights])
    big = tmp_path / "big.onnx"
    big.write_bytes(helper.make_model(graph).SerializeToString())
    with open(tmp_path / "big.weights", "wb") as file:
        file.truncate(4 * count)
    small = tmp_path / "mlp_external.onnx"  # mlp, its weights beside it
    onnx.save_model(onnx.load(MLP), small, save_as_external_data=True,
                    all_tensors_to_one_file=True, location="mlp.weights", size_threshold=1024)
    assert small.stat().st_size < 100_000 < (tmp_path / "mlp.weights").stat().st_size
    with serving("cpu:1:mem=64MB", tmp_path, models=("mlp_external",)) as (url, state), \
            peak_rss() as grew:
        status, message = error_of(call(f"{url}/v2/repository/models/big/load", "POST"))
        free = state.host.devices["cpu0"].free_bytes  # 64 MB less mlp's
        assert status == 400 and str(big.stat().st_size + 4 * count) in message, message
        assert f"{free} bytes" in message and grew[0] < 64 << 20, (message, grew[0])
        feeds = mlp_feeds(np.random.default_rng())
        status, _, got = infer(url, feeds, "mlp_external")
        assert status == 200
        assert_same(got, expected(MLP, feeds))


# -- 5: slow clients time out, connections are capped -------------------------------------------


def test_half_sent_requests_are_answered_408_and_closed():
    """Before: 2,000 half-sent requests were held open for 75 s, none closed."""
    limits = Limits(header_timeout=0.5, body_timeout=0.5)
    with serving("cpu:1", files=(("mlp", MLP),), limits=limits) as (url, _):
        port = port_of(url)
        starts = [b"", b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Le",
                  b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 9000"
                  b"\r\n\r\n{\"inputs\": ["]
        held = []
        for i in range(60):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(starts[i % 3])
            held.append((i % 3, sock))
        feeds = mlp_feeds(np.random.default_rng())
        status, _, got = infer(url, feeds)  # everyone else is served meanwhile
        assert status == 200
        assert_same(got, expected(MLP, feeds))
        start = time.monotonic()
        for kind, sock in held:
            with sock:
                status, message = json_error(read_to_close(sock))
            assert status == 408, message
            assert ("body" if kind == 2 else "headers") in message, message
        assert time.monotonic() - start < 3.0


def test_connections_over_the_cap_are_answered_503_but_health_probes():
    limits = Limits(max_connections=8)
    with serving("cpu:1", files=(("mlp", MLP),), limits=limits) as (url, _):
        port = port_of(url)
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(8)]
        status, message = json_error(raw(port, b"GET /v2/models/mlp HTTP/1.1\r\n"
                                               b"Host: x\r\n\r\n"))
        assert status == 503 and "8 connections" in message, message
        for probe in (b"live", b"ready"):  # an orchestrator must not restart a busy server
            answer = raw(port, b"GET /v2/health/" + probe + b" HTTP/1.1\r\nHost: x\r\n"
                         b"Connection: close\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
        for sock in idle:
            sock.close()
        assert poll(lambda: call(f"{url}/v2/health/live")[0] == 200, WAIT, 0.05)


def test_the_limits_are_flags_with_defaults():
    args = _serve_args([str(MLP), "--devices", "cpu:1"])
    assert (args.header_timeout, args.body_timeout, args.max_connections,
            args.grace_seconds) == (10.0, 30.0, 1000, 30.0)
    assert Limits() == Limits(header_timeout=10.0, body_timeout=30.0, max_connections=1000,
                              grace_seconds=30.0)
    args = _serve_args([str(MLP), "--devices", "cpu:1", "--header-timeout", "2",
                        "--body-timeout", "3", "--max-connections", "7", "--grace-seconds", "0"])
    assert (args.header_timeout, args.body_timeout, args.max_connections,
            args.grace_seconds) == (2.0, 3.0, 7, 0.0)


def _serve_args(argv: list[str]):
    from app.cli import build_parser

    return build_parser().parse_args(["serve", *argv, "--port", "0"])


# -- 6: health probes need no token; the scheme in any case ---------------------------------------


def test_health_is_open_and_the_bearer_scheme_is_case_insensitive():
    """Before: health asked for the token, and `bearer` in lower case was refused."""
    token = "t-" + os.urandom(8).hex()
    with serving("cpu:1", files=(("mlp", MLP),), settings=ServerSettings(token=token)) as (
            url, _):
        for path in ("/v2/health/live", "/v2/health/ready"):
            assert call(url + path)[0] == 200
        assert call(f"{url}/v2/models/mlp")[0] == 401
        for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
            assert call(f"{url}/v2/models/mlp",
                        headers={"Authorization": f"{scheme} {token}"})[0] == 200, scheme
        for wrong in (f"Basic {token}", f"Bearer{token}", f"Bearer {token.upper()}", token):
            assert error_of(call(f"{url}/v2/models/mlp",
                                 headers={"Authorization": wrong}))[0] == 401, wrong
        x = np.random.default_rng().random((1 << 21,)).astype(np.float32)  # 8 MB
        body, headers = binary_request({"x": x})  # refused, answered though not read
        assert error_of(call(f"{url}/v2/models/mlp/infer", "POST", body, headers))[0] == 401
        assert announced(url, "/v2/models/mlp/infer", len(body)) == 401  # and not sent
        client = triton.InferenceServerClient(url.removeprefix("http://"),
                                              connection_timeout=WAIT, network_timeout=WAIT)
        assert client.is_server_live() and client.is_server_ready()  # no token sent
        client.close()
    closed = ServerSettings(token=token, open_health=False)
    with serving("cpu:1", files=(("mlp", MLP),), settings=closed) as (url, _):
        assert error_of(call(f"{url}/v2/health/ready"))[0] == 401
        assert call(f"{url}/v2/health/ready",
                    headers={"Authorization": f"bearer {token}"})[0] == 200
    assert _serve_args([str(MLP), "--devices", "cpu:1", "--health-needs-token"]
                       ).health_needs_token


# -- 7: every error is JSON: a load configuration's, and the HTTP parser's own ---------------------


@pytest.mark.parametrize("delay", ["x", None, -5, 1.5, [], {}])
def test_a_bad_max_queue_delay_is_a_400_naming_it(tmp_path, delay):
    """Before: "x" or null was a 500 TypeError."""
    repository = make_repository(tmp_path)
    with serving("cpu:1", repository) as (url, _):
        config = {"max_batch_size": 4,
                  "dynamic_batching": {"max_queue_delay_microseconds": delay}}
        status, message = error_of(call(f"{url}/v2/repository/models/mlp/load", "POST",
                                        {"parameters": {"config": json.dumps(config)}}))
        assert status == 400 and "max_queue_delay_microseconds" in message, message
        status, _, _ = call(f"{url}/v2/repository/models/mlp/load", "POST", {"parameters": {
            "config": json.dumps({**config, "dynamic_batching": {
                "max_queue_delay_microseconds": "250"}})}})  # protobuf's JSON: a string
        assert status == 200


@pytest.mark.parametrize("request_bytes, found", [
    (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1e30\r\n\r\n",
     "Content-Length"),
    (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 99999999999999999999\r\n\r\n", "Content-Length"),
    (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"zz\r\nabc\r\n", "chunk"),
    (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"3\r\n{\"inputs\r\n", "chunk"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "method"),  # TLS to a plain port
    (b"GET /v2 HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n", "header"),
], ids=["length-1e30", "length-overflow", "chunk-size", "chunk-framing", "tls", "header"])
def test_the_http_parsers_own_refusals_are_json(mlp_server, request_bytes, found):
    """Before: uvicorn answered these in plain text."""
    url, _ = mlp_server
    status, message = json_error(raw(port_of(url), request_bytes))
    assert status == 400 and found.lower() in message.lower(), message
    assert call(f"{url}/v2/health/ready")[0] == 200  # and serves on


# -- 9: every number on the command line is checked; no command writes over its input -------------


@pytest.mark.parametrize("extra, flag", [
    (["--port", "99999"], "--port"), (["--port", "-1"], "--port"),
    (["--max-body-mb", "nan"], "--max-body-mb"), (["--max-body-mb", "-1"], "--max-body-mb"),
    (["--max-body-mb", "0"], "--max-body-mb"), (["--max-queue", "-1"], "--max-queue"),
    (["--grace-seconds", "-1"], "--grace-seconds"), (["--grace-seconds", "inf"],
                                                     "--grace-seconds"),
    (["--header-timeout", "0"], "--header-timeout"), (["--body-timeout", "nan"],
                                                      "--body-timeout"),
    (["--max-connections", "0"], "--max-connections"),
    (["--bind", "batch=100000000000000000000"], "--bind"),
])
def test_serve_numbers_are_range_checked_in_one_line(capsys, monkeypatch, extra, flag):
    """Before: --port 99999 and nan were "internal error"s; -1 was accepted."""
    def started(*args, **kwargs):
        raise AssertionError("it served")  # (a value let through would serve for ever)

    monkeypatch.setattr(app.serve_cmd, "HostManager", started)
    argv = ["serve", str(MLP), "--devices", "cpu:1", *extra]
    if flag == "--bind":  # serve takes no --bind: run's, with the same check
        argv = ["run", str(MLP), "--devices", "cpu:1", *extra]
    line = one_line_error(capsys, argv, status=2)
    assert f"argument {flag}" in line, line


def test_a_bind_naming_no_dimension_of_the_model_is_refused(capsys):
    line = one_line_error(capsys, ["partition", str(MLP), "--devices", "cpu:1", "--bind",
                                   "nosuchdim=3"])
    assert "--bind nosuchdim" in line and "batch" in line, line


def test_a_model_linked_out_of_the_repository_is_named_as_skipped_not_lost(
        capsys, monkeypatch, tmp_path):
    """A model file linked in from elsewhere is refused (models load only from inside the
    repository); the server started without it and said nothing, and asked for by name
    it was "not a model in" the repository. So too, in Triton's layout, a version's model
    file or folder linked in (these went unnamed as well)."""
    repository, elsewhere = tmp_path / "repository", tmp_path / "elsewhere"
    repository.mkdir(), elsewhere.mkdir()
    (elsewhere / "mlp.onnx").write_bytes(MLP.read_bytes())
    (repository / "linked.onnx").symlink_to(elsewhere / "mlp.onnx")
    (repository / "kept.onnx").write_bytes(MLP.read_bytes())
    (repository / "versioned" / "1").mkdir(parents=True)
    (repository / "versioned" / "1" / "model.onnx").symlink_to(elsewhere / "mlp.onnx")
    (repository / "folder").mkdir()
    (repository / "folder" / "3").symlink_to(elsewhere)
    (elsewhere / "model.onnx").write_bytes(MLP.read_bytes())
    monkeypatch.setattr(app.serve_cmd, "HostManager", _refused)
    assert main(["serve", "--devices", "cpu:1", "--model-repository", str(repository)]) == 1
    err = capsys.readouterr().err
    for link, target in (("linked.onnx", "mlp.onnx"), ("versioned/1/model.onnx", "mlp.onnx"),
                         ("folder/3", "")):
        assert f"prism: skipped {repository / link}: it links out of the model " \
               f"repository, to {(elsewhere / target).resolve()}" in err, err
    assert "kept.onnx" not in err
    for name, link, target in (("linked", "linked.onnx", "mlp.onnx"),
                               ("versioned", "versioned/1/model.onnx", "mlp.onnx")):
        line = one_line_error(capsys, ["serve", name, "--devices", "cpu:1",
                                       "--model-repository", str(repository)])
        assert f"{repository / link} links out of it, to {elsewhere / target}" in line, line


def _refused(*args, **kwargs):
    raise PrismError("no host in this test")


def test_serve_refuses_a_trace_it_cannot_write_before_serving(capsys, monkeypatch):
    started = []
    monkeypatch.setattr(app.serve_cmd, "HostManager", lambda *a, **k: started.append(1))
    line = one_line_error(capsys, ["serve", str(MLP), "--devices", "cpu:1", "--port", "0",
                                   "--trace", "/proc/x.json"])
    assert "--trace /proc/x.json" in line and not started, line


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bundle") / "mlp.prism"
    assert main(["compile", str(MLP), "--devices", "cpu:1", "-o", str(path), "--json"]) == 0
    return path


def _link(kind: str, target: Path, at: Path) -> Path:
    if kind == "symlink":
        at.symlink_to(target)
    elif kind == "hardlink":
        os.link(target, at)
    else:
        return target
    return at


@pytest.mark.parametrize("kind", ["same", "symlink", "hardlink"])
@pytest.mark.parametrize("command", ["export-onnx", "compile", "run --trace", "run --record",
                                     "partition --dot", "quantize", "profile", "train",
                                     "train --data"])
def test_no_command_writes_over_its_input(capsys, tmp_path, bundle, command, kind):
    """Before: `export-onnx b.prism -o b.prism`, `compile m.onnx -o m.onnx` and `run --trace
    m.onnx` destroyed their input and exited 0."""
    model = tmp_path / "m.onnx"
    model.write_bytes(MLP.read_bytes())
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=mlp_feeds(np.random.default_rng(), 4)["x"])
    source = {"export-onnx": tmp_path / "b.prism", "profile": inputs,
              "train --data": inputs}.get(command, model)
    if command == "export-onnx":
        source.write_bytes(bundle.read_bytes())
    target = _link(kind, source, tmp_path / f"out{source.suffix}")
    argv = {
        "export-onnx": ["export-onnx", str(source), "-o", str(target)],
        "compile": ["compile", str(model), "--devices", "cpu:1", "-o", str(target)],
        "run --trace": ["run", str(model), "--devices", "cpu:1", "--trace", str(target)],
        "run --record": ["run", str(model), "--devices", "cpu:1", "--record", str(target)],
        "partition --dot": ["partition", str(model), "--devices", "cpu:1", "--dot",
                            str(target)],
        "quantize": ["quantize", str(model), "--calibrate", str(inputs), "-o", str(target)],
        "profile": ["profile", str(model), "--inputs", str(inputs), "-o", str(target)],
        **{train: ["train", str(model), "--data", str(inputs), "--labels", "y", "--devices",
                   "cpu:1", "-o", str(target)] for train in ("train", "train --data")},
    }[command]
    before = hashlib.sha256(source.read_bytes()).hexdigest()
    line = one_line_error(capsys, argv)
    assert "would overwrite" in line and str(target) in line, line
    assert hashlib.sha256(source.read_bytes()).hexdigest() == before


def test_two_outputs_naming_one_file_are_refused(capsys, tmp_path):
    out = tmp_path / "out.json"
    line = one_line_error(capsys, ["run", str(MLP), "--devices", "cpu:1", "--trace", str(out),
                                   "--record", str(out)])
    assert "--record and --trace" in line or "--trace and --record" in line, line
    assert not out.exists()


# -- 11: the model configuration as Triton answers it; the startup table fits a log ----------------


def test_model_config_as_tritons(tmp_path):
    """Before: GET /v2/models/M/config was 404."""
    repository = make_repository(tmp_path)
    with serving("cpu:2", repository, models=("mlp", "cnn")) as (url, state):
        client = triton.InferenceServerClient(url.removeprefix("http://"),
                                              connection_timeout=WAIT, network_timeout=WAIT)
        config = client.get_model_config("mlp")
        assert config["name"] == "mlp" and config["platform"] == "onnxruntime_onnx"
        assert config["backend"] == "onnxruntime" and config["max_batch_size"] == 0
        assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 256]}]
        assert config["output"] == [{"name": "logits", "data_type": "TYPE_FP32",
                                     "dims": [-1, 10]}]
        assert "dynamic_batching" not in config
        assert config["instance_group"] == [{"name": "mlp", "count": 1, "kind": "KIND_CPU"}]
        assert config["parameters"]["partition"] == {"string_value": "memory"}  # its pbtxt
        triton_config = {"max_batch_size": 8, "dynamic_batching": {
            "max_queue_delay_microseconds": 300, "preferred_batch_size": [4, 8]},
            "instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
        client.load_model("cnn", config=json.dumps(triton_config))
        config = client.get_model_config("cnn", "1")
        assert config["max_batch_size"] == 8
        assert config["dynamic_batching"] == triton_config["dynamic_batching"]
        assert config["instance_group"][0]["count"] == 2
        graph = state.host.graph(state.catalog.get("cnn").network)
        (tensor,) = config["input"]
        assert tensor["dims"] == list(graph.tensors[tensor["name"]].dims[1:])  # batch left out
        status, message = error_of(call(f"{url}/v2/models/nope/config"))
        assert status == 404 and "nope" in message
        client.close()


def test_the_startup_table_is_whole_when_stdout_is_not_a_terminal(tmp_path):
    """Before: Rich cut it to 80 columns, the file column wrapped or went."""
    deep = tmp_path / ("a_folder_with_a_rather_long_name_" * 3) / "mlp.onnx"
    deep.parent.mkdir()
    deep.write_bytes(MLP.read_bytes())
    with ServeProcess([str(deep), "--devices", "cpu:1"], columns=None) as serve:
        printed = "".join(serve.printed)
        assert str(deep) in printed, printed
        row = next(line for line in serve.printed if str(deep) in line)
        assert row.split()[:2] == ["mlp", "1"], row
        assert "stops it." in serve.printed[-1]  # the serving line, whole, on one line
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(WAIT) == 0
