"""Helpers the server tests share: a model repository on disk, a server on a thread, and a
plain HTTP client (urllib) that never raises on a status."""

from __future__ import annotations

import contextlib
import http.client
import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from app.server.app import create_app
from app.server.protocol import Limits
from app.server.repository import ModelRepository
from app.server.runner import ServerThread, bind
from app.server.state import ServerSettings, ServerState
from runtime.devices import parse_devices
from runtime.host import HostManager
from tests.support.dags import SAMPLES_DIR

WAIT = 30.0  # bound on every HTTP call and future


def make_repository(root: Path) -> Path:
    """Triton's layout (mlp with a config.pbtxt; branchy in versions 1 and 3) and the flat
    one (cnn, transformer, control_flow)."""
    (root / "mlp" / "1").mkdir(parents=True)
    shutil.copy(SAMPLES_DIR / "mlp.onnx", root / "mlp" / "1" / "model.onnx")
    (root / "mlp" / "config.pbtxt").write_text(
        'name: "mlp"  # Prism reads a few fields\nplatform: "onnxruntime_onnx"\n'
        'parameters { key: "partition" value: { string_value: "memory" } }\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 256 ] } ]\n'
        'output { name: "logits" data_type: TYPE_FP32 dims: [ -1, -1 ] }\n')
    for version in ("1", "3"):
        (root / "branchy" / version).mkdir(parents=True)
        shutil.copy(SAMPLES_DIR / "branchy.onnx", root / "branchy" / version / "model.onnx")
    for name in ("cnn", "transformer", "control_flow"):
        shutil.copy(SAMPLES_DIR / f"{name}.onnx", root / f"{name}.onnx")
    return root


@contextlib.contextmanager
def serving(devices: str, repository: Path | None = None, models: tuple[str, ...] = (),
            files: tuple[tuple[str, Path], ...] = (), settings: ServerSettings | None = None,
            limits: Limits | None = None, **host_options) -> Iterator[tuple[str, ServerState]]:
    """A HostManager on `devices` behind a server on a free loopback port: (url, state)."""
    from app.server.load_options import LoadOptions

    with HostManager(parse_devices(devices), **host_options) as host:
        state = ServerState.open(host, ModelRepository(repository) if repository else None,
                                 settings)
        try:
            for name in models:
                state.catalog.load(name)
            for name, path in files:
                state.catalog.add(name, path, LoadOptions())
            state.ready = True
            with ServerThread(create_app(state), bind("127.0.0.1", 0), limits) as server:
                yield server.url, state
        finally:
            state.close()


def call(url: str, method: str = "GET", body: bytes | dict | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Message, bytes]:
    """(status, headers (any case), body) of one request; a dict body is sent as JSON."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=WAIT) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers, error.read()


def error_of(status_body: tuple[int, Message, bytes]) -> tuple[int, str]:
    """(status, message) of an error response: one line under "error"."""
    status, _, body = status_body
    message = json.loads(body)["error"]
    assert isinstance(message, str) and message and "\n" not in message, body
    return status, message


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples (name as written, e.g. `nv_inference_count` or
    `prism_partition_run_seconds_count`) whose labels include `labels`."""
    _, _, body = call(f"{url}/metrics")
    total = 0.0
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name.removesuffix("_total") == name.removesuffix("_total") and all(
                    sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def binary_request(feeds: dict[str, np.ndarray], outputs_binary: bool = True
                   ) -> tuple[bytes, dict[str, str]]:
    """A body in Triton's binary tensor data extension, built by hand."""
    from app.server.tensors import datatype

    described, blobs = [], []
    for name, array in feeds.items():
        blob = np.ascontiguousarray(array).tobytes()
        described.append({"name": name, "shape": list(array.shape),
                          "datatype": datatype(array.dtype),
                          "parameters": {"binary_data_size": len(blob)}})
        blobs.append(blob)
    header = json.dumps({"inputs": described,
                         "parameters": {"binary_data_output": outputs_binary}}).encode()
    return header + b"".join(blobs), {"Inference-Header-Content-Length": str(len(header)),
                                      "Content-Type": "application/octet-stream"}


def announced(url: str, path: str, size: int, headers: dict[str, str] | None = None) -> int:
    """The status a POST of `size` bytes gets when its client waits for `100 Continue`
    before sending them (`Expect`, as curl does past 1 MB) and is answered first: the
    body is never sent, so an answer awaited past the timeout raises."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        connection.putrequest("POST", path)
        for key, value in {"Content-Type": "application/json", **(headers or {}),
                           "Expect": "100-continue", "Content-Length": str(size)}.items():
            connection.putheader(key, value)
        connection.endheaders()
        return connection.getresponse().status
    finally:
        connection.close()
