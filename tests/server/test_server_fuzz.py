"""`prism serve` as a process: thousands of malformed requests each end in a 4xx with a
one-line message, a correct request still gets the right answer, the process never dies
and stops cleanly on Ctrl-C; and the command's own errors are one line."""

from __future__ import annotations

import http.client
import json
import random
import shutil
import socket
import urllib.parse

import numpy as np
import pytest

from app.cli import main
from app.server.runner import ServeProcess
from tests.support.dags import SAMPLES_DIR
from tests.support.servers import WAIT
from tests.support.serving import expected

X = np.zeros((1, 256), np.float32)


@pytest.fixture(scope="module")
def process(tmp_path_factory):
    """`prism serve` on a repository holding mlp, on a free port: (process, port)."""
    root = tmp_path_factory.mktemp("repo")
    (root / "mlp" / "1").mkdir(parents=True)
    shutil.copy(SAMPLES_DIR / "mlp.onnx", root / "mlp" / "1" / "model.onnx")
    (root / "secret").mkdir()
    with ServeProcess(["--model-repository", str(root), "--devices", "cpu:1"]) as serve:
        yield serve, int(serve.url.rsplit(":", 1)[1])


class Client:
    """One keep-alive connection, reopened if the server closed it."""

    def __init__(self, port: int):
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)

    def send(self, method: str, path: str, body: bytes | None = None,
             headers: dict | None = None) -> tuple[int, bytes]:
        for attempt in (0, 1):
            try:
                self.conn.request(method, path, body, headers or {})
                response = self.conn.getresponse()
                return response.status, response.read()
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)
                if attempt:
                    raise
        raise AssertionError("unreachable")


def _binary(header: dict, blob: bytes) -> tuple[bytes, dict]:
    text = json.dumps(header).encode()
    return text + blob, {"Inference-Header-Content-Length": str(len(text))}


def _malformed(rng: random.Random) -> tuple[str, str, bytes | None, dict]:
    """One request that must be refused: (method, path, body, headers)."""
    infer = "/v2/models/mlp/infer"
    good = {"name": "x", "shape": [1, 256], "datatype": "FP32"}
    blob = X.tobytes()
    kind = rng.randrange(9)
    if kind == 0:  # not JSON, or JSON of the wrong kind, or nested past any depth
        body = rng.choice([bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 64))),
                           b'{"inputs": [', b"[1, 2, 3]", b'"x"', b"null", b"",
                           b"[" * rng.randrange(100, 5000), b'{"inputs": {}}'])
        return "POST", infer, body, {"Content-Type": "application/json"}
    if kind == 1:  # wrong datatype, shape or data
        tensor = dict(good, data=[0.0] * 256)
        field, value = rng.choice([
            ("datatype", rng.choice(["FP64", "INT8", "BYTES", "fp32", "", None, 7, "BF16"])),
            ("shape", rng.choice([[1, 255], [256], [-1, 256], [1.5, 256], "1,256", [], None,
                                  [2**63, 2**63], [True, 256]])),
            ("data", rng.choice([[0.0] * 255, ["a"] * 256, [[0.0] * 256] * 2, {"a": 1}, None,
                                 [None] * 256, ["1e400"] * 256, "0.0"])),
            ("name", rng.choice(["y", "", None, 3, "x" * 1000])),
        ])
        tensor[field] = value
        # "1e400" as a number past float64's range, which JSON readers refuse (Infinity,
        # as Python's json writes an infinite float, is read as Triton reads it)
        body = json.dumps({"inputs": [tensor]}).encode().replace(b'"1e400"', b"1e400")
        return "POST", infer, body, {}
    if kind == 2:  # sizes that promise more than there is
        size = rng.choice([2**62, len(blob) + 1, -1, "4", 1.5, 2**40])
        header = {"inputs": [dict(good, shape=rng.choice([[1, 256], [2**20, 2**20]]),
                                  parameters={"binary_data_size": size})]}
        body, headers = _binary(header, blob)
        if rng.random() < 0.5:
            headers["Inference-Header-Content-Length"] = rng.choice(
                ["99999999999999999999", "-5", "abc", str(len(body) + 1), "1e3", " "])
        return "POST", infer, body, headers
    if kind == 3:  # a binary body cut short, or with bytes to spare
        body, headers = _binary({"inputs": [dict(good, parameters={"binary_data_size":
                                                                   len(blob)})]}, blob)
        cut = rng.randrange(1, len(body) - 1)
        return "POST", infer, body[:cut] if rng.random() < 0.8 else body + b"\0" * cut, headers
    if kind == 4:  # models that are not there
        name = "".join(rng.choice("abcxyz_-.é%") for _ in range(rng.randrange(1, 20)))
        return "POST", f"/v2/models/{urllib.parse.quote(name)}x/infer", b"{}", {}
    if kind == 5:  # loads from outside the repository, or of what is not a model
        name = rng.choice(["..", "%2e%2e", "..%2f..%2fetc", "secret", "%2fetc%2fpasswd",
                           "mlp%00", ".", "~root", "a" * 300, "con"])
        params = rng.choice([{}, {"file:1/model.onnx": "AAAA"}, {"config": "{"},
                             {"config": "[]"}, {"partition": "../x.toml"}, {"replicas": -2},
                             {"max_batch_size": "many"}])
        target = "mlp" if params else name
        return "POST", f"/v2/repository/models/{target}/load", json.dumps(
            {"parameters": params}).encode(), {}
    if kind == 6:  # parameters of the wrong type
        params = rng.choice([{"priority": "high"}, {"priority": -3}, {"timeout": -1},
                             {"timeout": 0.5}, {"binary_data_output": "yes"},
                             {"triton_anything": True}, [1, 2], "p"])
        body = {"inputs": [dict(good, data=[0.0] * 256)], "parameters": params}
        return "POST", infer, json.dumps(body).encode(), {}
    if kind == 7:  # outputs asked for wrongly
        outputs = rng.choice([[{"name": "nope"}], [{}], "logits", [{"name": "logits",
                              "parameters": {"binary_data": 1}}],
                              [{"name": "logits", "parameters": {"classification": 0}}],
                              [{"name": "logits", "parameters": {"classification": "3"}}]])
        body = {"inputs": [dict(good, data=[0.0] * 256)], "outputs": outputs}
        return "POST", infer, json.dumps(body).encode(), {}
    method, path = rng.choice([("GET", infer), ("DELETE", "/v2"), ("POST", "/v2/health/live"),
                               ("GET", "/v2/repository/index"), ("GET", "/v3/models"),
                               ("POST", "/v2/repository/index")])
    return method, path, b"[1]" if method == "POST" else None, {}


def test_malformed_requests_end_in_4xx_and_the_server_keeps_serving(process):
    serve, port = process
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    client = Client(port)
    statuses: dict[int, int] = {}
    for i in range(3000):
        method, path, body, headers = _malformed(rng)
        status, payload = client.send(method, path, body, headers)
        statuses[status] = statuses.get(status, 0) + 1
        assert 400 <= status < 500, (seed, i, method, path, (body or b"")[:200], payload[:300])
        message = json.loads(payload)["error"]
        assert message and "\n" not in message and "Traceback" not in message, (seed, i)
    assert serve.proc.poll() is None
    assert {400, 404} <= set(statuses), statuses
    x = np.random.default_rng().standard_normal((2, 256)).astype(np.float32)
    body, headers = _binary({"inputs": [{"name": "x", "shape": [2, 256], "datatype": "FP32",
                                         "parameters": {"binary_data_size": x.nbytes}}],
                             "parameters": {"binary_data_output": True}}, x.tobytes())
    status, payload = client.send("POST", "/v2/models/mlp/infer", body, headers)
    assert status == 200
    header_size = len(payload) - 2 * 10 * 4
    assert json.loads(payload[:header_size])["outputs"][0]["shape"] == [2, 10]
    got = np.frombuffer(payload[header_size:], "<f4").reshape(2, 10)
    np.testing.assert_allclose(got, expected(SAMPLES_DIR / "mlp.onnx", {"x": x})["logits"],
                               rtol=1e-5, atol=1e-6)


def test_ctrl_c_stops_the_process_cleanly(process):
    serve, port = process
    assert Client(port).send("GET", "/v2/health/ready")[0] == 200
    assert serve.stop() == 0  # a graceful shutdown, as on SIGTERM
    err = serve.proc.stderr.read()
    assert "SIGINT" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, part", [
    (["serve", "--devices", "cpu:1"], "nothing to serve"),
    (["serve", str(SAMPLES_DIR / "mlp.onnx"), "--devices", "cpu:1", "--host", "0.0.0.0"],
     "--token"),
    (["serve", "nope.onnx", "--devices", "cpu:1"], "nope.onnx"),
    (["serve", str(SAMPLES_DIR), "--devices", "cpu:1"], f"--model-repository {SAMPLES_DIR}"),
    (["serve", str(SAMPLES_DIR / "mlp.onnx"), "--devices", "cpu:1", "--model-repository",
      "/no/such/dir"], "not a directory"),
])
def test_serve_errors_are_one_line(capsys, argv, part):
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and part in err and "Traceback" not in err


def test_a_taken_port_is_one_line(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(SAMPLES_DIR / "mlp.onnx"), "--devices", "cpu:1",
                     "--port", str(port)]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"127.0.0.1:{port}" in err
