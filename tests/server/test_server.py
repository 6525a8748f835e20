"""`prism serve`: the Open Inference Protocol checked with clients no one here wrote
(tritonclient's HTTP client, urllib), answers equal to the host's own, the model
repository, errors, the token and body limit, and /metrics."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from app.http_bench import bench
from app.server.runner import check_exposure
from app.server.state import ServerSettings
from app.server.tensors import INPUT_SPECS
from runtime.errors import InvalidInputError, PrismError
from runtime.free_dims import AUDIO_SAMPLES, IMAGE_SIDE
from runtime.inputs import random_feeds
from tests.support.classifiers import zipmap_classifier
from tests.support.dags import (
    end_token_ids,
    end_token_model,
    even_rows_model,
    speech_frontend,
    upsampling_detector,
    vit_stem,
)
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

MODELS = ("mlp", "cnn", "transformer", "branchy", "control_flow")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Every sample model served from a repository on two cpu devices: (url, state)."""
    repository = make_repository(tmp_path_factory.mktemp("repository"))
    with serving("cpu:2", repository, models=MODELS) as (url, state):
        yield url, state


@pytest.fixture(scope="module")
def client(server):
    url, _ = server
    client = triton.InferenceServerClient(url.removeprefix("http://"),
                                          connection_timeout=WAIT, network_timeout=WAIT)
    yield client
    client.close()


def _feeds(state, name, rows: int = 1) -> dict[str, np.ndarray]:
    served = state.catalog.get(name)
    return random_feeds(served.inputs, np.random.default_rng(), {"batch": rows})


def _in_process(state, name, feeds) -> dict[str, np.ndarray]:
    return state.host.run(state.catalog.get(name).network, feeds).result(WAIT)


def _assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


# -- health and metadata -------------------------------------------------------------------


def test_health_and_server_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "prism"
    assert {"binary_tensor_data", "model_repository"} <= set(meta["extensions"])


@pytest.mark.parametrize("name", MODELS)
def test_model_metadata_describes_the_graph(client, server, name):
    _, state = server
    served = state.catalog.get(name)
    graph = state.host.graph(served.network)
    meta = client.get_model_metadata(name)
    assert meta["name"] == name and meta["versions"] == [served.version]
    assert [t["name"] for t in meta["inputs"]] == graph.inputs
    assert [t["name"] for t in meta["outputs"]] == graph.outputs
    for tensor in meta["inputs"]:
        dims = graph.tensors[tensor["name"]].dims
        assert tensor["shape"] == [d if isinstance(d, int) else -1 for d in dims]
    assert client.is_model_ready(name)
    assert client.is_model_ready(name, served.version)
    assert not client.is_model_ready(name, "99")
    assert not client.is_model_ready("no-such-model")


def test_newest_version_is_served(client):
    assert client.get_model_metadata("branchy")["versions"] == ["3"]
    assert client.get_model_metadata("branchy", "3")["name"] == "branchy"
    with pytest.raises(InferenceServerException, match="version '1'"):
        client.get_model_metadata("branchy", "1")


# -- inference -----------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("name", MODELS)
def test_tritonclient_answers_equal_the_hosts(client, server, name, binary):
    _, state = server
    feeds = _feeds(state, name, rows=2)
    inputs = []
    for key, array in feeds.items():
        tensor = triton.InferInput(key, list(array.shape), triton.np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    outputs = [triton.InferRequestedOutput(o.name, binary_data=binary)
               for o in state.catalog.get(name).outputs]
    result = client.infer(name, inputs, outputs=outputs, request_id="r-7")
    assert result.get_response()["id"] == "r-7"
    got = {o.name: result.as_numpy(o.name) for o in state.catalog.get(name).outputs}
    _assert_same(got, _in_process(state, name, feeds))


def test_urllib_json_binary_and_raw_requests(server):
    url, state = server
    feeds = _feeds(state, "mlp", rows=3)
    want = _in_process(state, "mlp", feeds)["logits"]
    infer = f"{url}/v2/models/mlp/infer"
    nested = {"inputs": [{"name": "x", "shape": [3, 256], "datatype": "FP32",
                          "data": feeds["x"].tolist()}]}  # nested lists, as numpy writes them
    status, _, body = call(infer, "POST", nested)
    assert status == 200
    out = json.loads(body)["outputs"][0]
    assert out["name"] == "logits" and out["datatype"] == "FP32" and out["shape"] == [3, 10]
    np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(3, 10), want,
                               rtol=1e-5, atol=1e-6)
    body, headers = binary_request(feeds)
    status, response_headers, payload = call(infer, "POST", body, headers)
    size = int(response_headers["Inference-Header-Content-Length"])
    header = json.loads(payload[:size])
    assert status == 200 and header["outputs"][0]["parameters"]["binary_data_size"] == 120
    np.testing.assert_allclose(np.frombuffer(payload[size:], "<f4").reshape(3, 10), want,
                               rtol=1e-5, atol=1e-6)
    status, response_headers, payload = call(
        infer, "POST", feeds["x"].tobytes(), {"Inference-Header-Content-Length": "0"})
    size = int(response_headers["Inference-Header-Content-Length"])
    assert status == 200 and json.loads(payload[:size])["outputs"][0]["shape"] == [3, 10]
    np.testing.assert_allclose(np.frombuffer(payload[size:], "<f4").reshape(3, 10), want,
                               rtol=1e-5, atol=1e-6)


def test_large_requests_decode_off_the_loop_and_answer_right(server):
    from app.server.calls import OFFLOAD_BYTES

    url, state = server
    rows = OFFLOAD_BYTES // (256 * 4) + 7  # a body past the offload threshold
    feeds = _feeds(state, "mlp", rows)
    _assert_same(_infer(url, "mlp", feeds), _in_process(state, "mlp", feeds))


def test_requested_outputs_and_versioned_path(server):
    url, state = server
    feeds = _feeds(state, "cnn")
    body = {"inputs": [{"name": "image", "shape": list(feeds["image"].shape),
                        "datatype": "FP32", "data": feeds["image"].ravel().tolist()}],
            "outputs": [{"name": "logits"}]}
    status, _, payload = call(f"{url}/v2/models/cnn/versions/1/infer", "POST", body)
    assert status == 200
    response = json.loads(payload)
    assert response["model_name"] == "cnn" and response["model_version"] == "1"
    body["outputs"] = [{"name": "nope"}]
    labels = {"model": "cnn", "version": "1"}
    counts = ("nv_inference_request_success", "nv_inference_exec_count")
    before = [metric(url, k, **labels) for k in counts]
    status, message = error_of(call(f"{url}/v2/models/cnn/infer", "POST", body))
    assert status == 400 and "'nope'" in message
    assert [metric(url, k, **labels) for k in counts] == before  # refused before it ran


def test_many_concurrent_clients_each_get_their_own_answer(server):
    url, state = server
    feeds = [_feeds(state, "mlp") for _ in range(48)]

    def one(f):
        body, headers = binary_request(f)
        status, response_headers, payload = call(f"{url}/v2/models/mlp/infer", "POST", body,
                                                 headers)
        size = int(response_headers["Inference-Header-Content-Length"])
        return status, np.frombuffer(payload[size:], "<f4").reshape(1, 10)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, feeds, timeout=WAIT))
    for f, (status, got) in zip(feeds, answers, strict=True):
        assert status == 200
        np.testing.assert_allclose(got, _in_process(state, "mlp", f)["logits"], rtol=1e-5,
                                   atol=1e-6)


# -- errors --------------------------------------------------------------------------------


def test_errors_have_tritons_status_and_one_line(server):
    url, _ = server
    infer = f"{url}/v2/models/mlp/infer"
    x = {"name": "x", "shape": [1, 256], "datatype": "FP32", "data": [0.5] * 256}
    cases = [
        (f"{url}/v2/models/ghost/infer", {"inputs": [x]}, 404, "ghost"),
        (infer, {"inputs": [{**x, "datatype": "FP64"}]}, 400, "float32"),
        (infer, {"inputs": [{**x, "shape": [1, 255]}]}, 400, "256"),
        (infer, {"inputs": [{**x, "name": "y"}]}, 400, "'y'"),
        (infer, {"inputs": [{**x, "datatype": "FP99"}]}, 400, "FP99"),
        (infer, {"inputs": [x], "parameters": {"priority": -1}}, 400, "priority"),
        (infer, {"inputs": [x], "parameters": {"triton_x": 1}}, 400, "reserved"),
        (f"{url}/v2/models/mlp/versions/7/infer", {"inputs": [x]}, 404, "version"),
    ]
    for target, body, status, part in cases:
        got, message = error_of(call(target, "POST", body))
        assert (got, part in message) == (status, True), (body, message)
    status, message = error_of(call(f"{url}/v2/nothing/here"))
    assert status == 404
    status, message = error_of(call(infer))  # GET on a POST route
    assert status == 405


def test_an_error_found_before_a_large_body_is_read_is_still_answered(server):
    """An unknown model with an 8 MB tensor: the 404 had been sent before the body was
    read, and the connection closed under the client, which saw a reset, not the answer;
    so too a path no route has, or a method its route does not take."""
    url, _ = server
    x = np.random.default_rng().random(1 << 21).astype(np.float32)  # 8 MB, 25 MB as JSON
    as_json = {"inputs": [{"name": "x", "shape": [x.size], "datatype": "FP32",
                           "data": x.tolist()}]}
    for body, headers in ((as_json, {}), binary_request({"x": x})):
        status, message = error_of(call(f"{url}/v2/models/ghost/infer", "POST", body,
                                        headers))
        assert status == 404 and "ghost" in message, message
    for path, expected in (("/v2/model/mlp/infer", 404), ("/v2/models/mlp/ready", 405)):
        status, _ = error_of(call(url + path, "POST", *binary_request({"x": x})))
        assert status == expected, path  # a mistyped path, a method the route has not


def test_a_client_that_waits_to_send_its_body_is_answered_without_sending_it(server):
    """`Expect: 100-continue`: an unknown model, a mistyped path, is answered at once; the
    8 MB the headers announce are never sent (the server had waited for them)."""
    url, _ = server
    for path in ("/v2/models/ghost/infer", "/v2/model/mlp/infer"):
        assert announced(url, path, 8 << 20) == 404, path


def test_timeout_is_504_and_a_full_queue_503():
    """A slow device (a sim at 20 MFLOP/s: ~50 ms per mlp request) and a queue of one."""
    from tests.support.dags import SAMPLES_DIR

    with serving("sim:1:flops=20M", files=(("mlp", SAMPLES_DIR / "mlp.onnx"),),
                 max_queue=1, max_active=1) as (url, _):
        infer = f"{url}/v2/models/mlp/infer"
        x = {"name": "x", "shape": [1, 256], "datatype": "FP32", "data": [0.5] * 256}
        status, message = error_of(call(infer, "POST", {"inputs": [x],
                                                        "parameters": {"timeout": 1000}}))
        assert status == 504 and "timed out" in message
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda _: call(infer, "POST", {"inputs": [x]}), range(12),
                                    timeout=WAIT))
        statuses = sorted(a[0] for a in answers)
        assert 200 in statuses and 503 in statuses and set(statuses) <= {200, 503}
        assert any("queue is full" in error_of(a)[1] for a in answers if a[0] == 503)
        assert metric(url, "nv_inference_request_failure", model="mlp", reason="REJECTED") \
            == statuses.count(503) + 1  # the full queue, and the timeout in the queue


# -- the model repository ------------------------------------------------------------------


def test_index_load_and_unload(client, server):
    url, state = server
    index = {row["name"]: row for row in client.get_model_repository_index()}
    assert set(MODELS) <= set(index) and index["branchy"]["version"] == "3"
    assert all(index[m]["state"] == "READY" for m in MODELS)
    # mlp's config.pbtxt asked for memory mode
    assert state.host.plan(state.catalog.get("mlp").network).mode == "memory"

    feeds = _feeds(state, "cnn")
    _assert_same(_infer(url, "cnn", feeds), _in_process(state, "cnn", feeds))
    assert metric(url, "nv_inference_request_success", model="cnn") >= 1
    client.unload_model("cnn")
    assert not client.is_model_ready("cnn")
    assert metric(url, "nv_inference_count", model="cnn") == 0  # as Triton forgets it
    row = {r["name"]: r for r in client.get_model_repository_index()}["cnn"]
    assert row["state"] == "UNAVAILABLE"
    ready = json.loads(call(f"{url}/v2/repository/index", "POST", {"ready": True})[2])
    assert "cnn" not in {r["name"] for r in ready} and "mlp" in {r["name"] for r in ready}
    status, _ = error_of(call(f"{url}/v2/models/cnn/infer", "POST", {"inputs": []}))
    assert status == 404

    # tritonclient passes Prism's options in a Triton model configuration
    config = {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 500},
              "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
              "parameters": {"devices": {"string_value": "cpu0,cpu1"}}}
    client.load_model("cnn", config=json.dumps(config))
    served = state.catalog.get("cnn")
    assert client.is_model_ready("cnn") and served.options.max_batch_size == 8
    assert state.host.replicas(served.network) == 2
    feeds = _feeds(state, "cnn", rows=3)
    _assert_same(_infer(url, "cnn", feeds), _in_process(state, "cnn", feeds))


def test_max_batch_size_alone_bounds_the_batch_as_tritons_default_scheduler(client, server):
    """A configuration with max_batch_size and no dynamic_batching: the config says so,
    a request of more rows is refused before it runs, one within it is answered, and no
    requests are joined. A model whose outputs have no batch dimension does not load."""
    url, state = server
    client.load_model("cnn", config=json.dumps({"max_batch_size": 2}))
    config = client.get_model_config("cnn")
    assert config["max_batch_size"] == 2 and "dynamic_batching" not in config
    feeds = _feeds(state, "cnn", rows=2)
    _assert_same(_infer(url, "cnn", feeds), _in_process(state, "cnn", feeds))
    image = _feeds(state, "cnn", rows=3)["image"]
    body = {"inputs": [{"name": "image", "shape": list(image.shape), "datatype": "FP32",
                        "data": image.ravel().tolist()}]}
    status, message = error_of(call(f"{url}/v2/models/cnn/infer", "POST", body))
    assert status == 400 and "max_batch_size 2" in message
    fixed = state.catalog.repository.root / "fixed" / "1"
    fixed.mkdir(parents=True)
    onnx.save(helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])]),
        opset_imports=[helper.make_opsetid("", 17)]), fixed / "model.onnx")
    status, message = error_of(call(f"{url}/v2/repository/models/fixed/load", "POST",
                                    {"parameters": {"config": json.dumps({"max_batch_size": 2})}}))
    assert status == 400 and "fixed first dimension" in message
    assert not client.is_model_ready("fixed") and "fixed" not in state.host.networks()
    shutil.rmtree(fixed.parent)
    client.load_model("cnn")  # as its repository configures it, for the tests after


def test_nan_and_infinities_cross_json_both_ways(client, server):
    """tritonclient writes NaN and infinities in JSON as Python's json does (NaN, Infinity,
    -Infinity); the server reads them and writes them back so, as Triton does, not as null
    (which a client reads back as NaN, losing the infinity)."""
    _, state = server
    folder = state.catalog.repository.root / "divide" / "1"
    folder.mkdir(parents=True)
    io = [helper.make_tensor_value_info(t, TensorProto.FLOAT, ["n"]) for t in "aby"]
    onnx.save(helper.make_model(helper.make_graph(
        [helper.make_node("Div", ["a", "b"], ["y"])], "divide", io[:2], io[2:]),
        opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx")
    rng = np.random.default_rng()
    a = rng.standard_normal(6).astype(np.float32)
    a[:3] = [np.nan, np.inf, -np.inf]
    b = np.where(rng.random(6) < 0.5, 0.0, rng.standard_normal(6) + 3).astype(np.float32)
    try:
        client.load_model("divide")
        inputs = [triton.InferInput(name, [6], "FP32") for name in "ab"]
        for tensor, value in zip(inputs, (a, b), strict=True):
            tensor.set_data_from_numpy(value, binary_data=False)
        result = client.infer("divide", inputs,
                              outputs=[triton.InferRequestedOutput("y", binary_data=False)])
        want = _in_process(state, "divide", {"a": a, "b": b})["y"]
        assert not np.isfinite(want).all()
        got = result.as_numpy("y")
        np.testing.assert_array_equal(got, want)  # NaN where NaN, each infinity signed
        assert "null" not in json.dumps(result.get_response())
    finally:
        client.unload_model("divide")
        shutil.rmtree(folder.parent)


def test_a_classifiers_zipmap_is_served_as_json_text_per_row(client, server):
    """A scikit-learn classifier's probabilities are a sequence of maps, which no datatype
    names (Triton refuses to load such a model): before, every request was `internal
    error: AttributeError`, even one asking only for the label."""
    _, state = server
    rng = np.random.default_rng()
    model = zipmap_classifier(rng)
    folder = state.catalog.repository.root / "classifier" / "1"
    folder.mkdir(parents=True)
    onnx.save(model, folder / "model.onnx")
    x = rng.standard_normal((5, 4)).astype(np.float32)
    label, maps = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"]).run(None, {"x": x})
    try:
        client.load_model("classifier")
        outputs = client.get_model_metadata("classifier")["outputs"]
        assert outputs[1] == {"name": "probabilities", "datatype": "BYTES", "shape": [-1]}
        for binary in (False, True):
            tensor = triton.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            result = client.infer("classifier", [tensor], outputs=[
                triton.InferRequestedOutput(n, binary_data=binary)
                for n in ("label", "probabilities")])
            np.testing.assert_array_equal(result.as_numpy("label"), label)
            texts = result.as_numpy("probabilities")
            assert texts.shape == (5,)
            for text, want in zip(texts, maps, strict=True):
                got = json.loads(text)
                assert sorted(got) == sorted(map(str, want))
                np.testing.assert_allclose([got[str(k)] for k in want], list(want.values()),
                                           rtol=1e-6)
        only = client.infer("classifier", [tensor],
                            outputs=[triton.InferRequestedOutput("label")])
        np.testing.assert_array_equal(only.as_numpy("label"), label)
    finally:
        client.unload_model("classifier")
        shutil.rmtree(folder.parent)


def _top(values: np.ndarray, count: int, labels: list[str]) -> list[str]:
    """Triton's classification text of one row: value to six decimals, index, label."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))[:count]
    return [f"{values[i]:f}:{i}" + (f":{labels[i]}" if i < len(labels) else "") for i in order]


def test_classification_gives_the_top_classes_as_triton_does(client, server):
    """tritonclient's `class_count`: per batch row for a batching model, labelled from
    the configuration's label_filename (one label fewer than classes: the last goes
    without); over the whole tensor for a model that does not batch. Was refused."""
    url, state = server
    assert "classification" in client.get_server_metadata()["extensions"]
    rng = np.random.default_rng()
    folder = state.catalog.repository.root / "scores"
    (folder / "1").mkdir(parents=True)
    weights = helper.make_tensor("w", TensorProto.FLOAT, [4, 6],
                                 rng.standard_normal(24).astype(np.float32).tolist())
    onnx.save(helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["scores"])], "scores",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 6])],
        [weights]), opset_imports=[helper.make_opsetid("", 17)]), folder / "1" / "model.onnx")
    labels = [f"kind {i}" for i in range(5)]
    (folder / "names.txt").write_text("\n".join(labels) + "\n")
    (folder / "config.pbtxt").write_text(
        'max_batch_size: 4\noutput [ { name: "scores" data_type: TYPE_FP32 dims: [ 6 ] '
        'label_filename: "names.txt" } ]\n')
    x = rng.standard_normal((3, 4)).astype(np.float32)
    try:
        client.load_model("scores")
        want = _in_process(state, "scores", {"x": x})["scores"]
        for binary in (False, True):
            tensor = triton.InferInput("x", [3, 4], "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            got = client.infer("scores", [tensor], outputs=[triton.InferRequestedOutput(
                "scores", binary_data=binary, class_count=4)]).as_numpy("scores")
            assert got.shape == (3, 4)
            assert [[v.decode() if binary else v for v in row] for row in got] == \
                [_top(row, 4, labels) for row in want]
    finally:
        client.unload_model("scores")
        shutil.rmtree(folder)
    feeds = _feeds(state, "mlp", rows=2)
    logits = _in_process(state, "mlp", feeds)["logits"]
    tensor = triton.InferInput("x", list(feeds["x"].shape), "FP32")
    tensor.set_data_from_numpy(feeds["x"])
    got = client.infer("mlp", [tensor], outputs=[triton.InferRequestedOutput(
        "logits", binary_data=False, class_count=50)]).as_numpy("logits")
    assert got.tolist() == _top(logits.ravel(), 50, [])  # mlp does not batch: one list
    body = {"inputs": [{"name": "x", "shape": list(feeds["x"].shape), "datatype": "FP32",
                        "data": feeds["x"].ravel().tolist()}],
            "outputs": [{"name": "logits", "parameters": {"classification": 0}}]}
    status, message = error_of(call(f"{url}/v2/models/mlp/infer", "POST", body))
    assert status == 400 and "'classification' must be a whole number >= 1" in message


def test_a_models_warmup_samples_run_before_it_serves_and_it_is_measured_on_them(server):
    """Triton's `model_warmup` was ignored: a model taking only some values (ids holding an
    end token) was measured on made-up ids, which it fails, and planned on the roofline.
    Each sample now runs `count` times before the model serves, the first is what its
    costs are measured on, and a sample that fails fails the load, naming it, as Triton's
    does; so does a data file of the wrong size."""
    url, state = server
    rng = np.random.default_rng()
    folder = state.catalog.repository.root / "ends"
    (folder / "1").mkdir(parents=True)
    (folder / "warmup").mkdir()
    onnx.save(end_token_model(), folder / "1" / "model.onnx")
    ids = end_token_ids(rng)
    (folder / "warmup" / "ids.raw").write_bytes(ids.astype("<i8").tobytes())
    count = int(rng.integers(2, 5))

    def load(data: str, dims: tuple[int, ...] = ids.shape) -> tuple:
        (folder / "config.pbtxt").write_text(
            f'model_warmup [ {{ name: "sample" count: {count} inputs {{ key: "ids" value: '
            f'{{ data_type: TYPE_INT64 dims: [ {", ".join(map(str, dims))} ] {data} }} }} }} ]\n')
        return call(f"{url}/v2/repository/models/ends/load", "POST",
                    {"parameters": {"costs": "measured"}})

    events = state.host.bus.subscribe(kinds=("request.finished",))
    try:
        status, _, body = load('input_data_file: "ids.raw"')
        assert status == 200, body
        served = state.catalog.get("ends")
        assert state.host.plan(served.network).costs == "measured"
        warmed = [e for e in events.drain() if e.get("network") == served.network]
        assert len(warmed) == count
        for data, dims, said in (
                ("zero_data: true", ids.shape, "warmup 'sample' failed: "),
                ('input_data_file: "ids.raw"', (ids.shape[0] + 1, ids.shape[1]),
                 f"file ids.raw: it holds {ids.nbytes} bytes; input 'ids', INT64"),
                ('input_data_file: "ids.raw"', (1, 1), "more than the 8 its input takes")):
            status, message = error_of(load(data, dims))
            assert status == 400 and said in message, message
            assert state.catalog.get("ends") is served  # what served before serves on
    finally:
        events.close()
        call(f"{url}/v2/repository/models/ends/unload", "POST", {})
        shutil.rmtree(folder)


def test_statistics_count_what_ran_as_tritons_extension_does(client, server):
    """tritonclient's get_inference_statistics (perf_analyzer reads it): 404 before. The
    configuration batches with Triton's default scheduler (no dynamic batcher), so each
    request's rows are inferences (they counted one a request) and each request is one
    execution of that many rows (batch_stats keyed them 1)."""
    url, state = server
    assert "statistics" in client.get_server_metadata()["extensions"]
    folder = state.catalog.repository.root / "counted"
    shutil.copytree(state.catalog.repository.root / "mlp", folder)
    (folder / "config.pbtxt").write_text("max_batch_size: 8\n")
    rows = int(np.random.default_rng().integers(2, 9))
    feeds = _feeds(state, "mlp", rows=rows)
    tensor = triton.InferInput("x", list(feeds["x"].shape), "FP32")
    tensor.set_data_from_numpy(feeds["x"])
    runs = int(np.random.default_rng().integers(3, 9))
    try:
        client.load_model("counted")
        for _ in range(runs):
            client.infer("counted", [tensor])
        bad = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32",
                           "data": [0.0] * 3}]}
        assert error_of(call(f"{url}/v2/models/counted/infer", "POST", bad))[0] == 400
        [stats] = client.get_inference_statistics("counted")["model_stats"]
        assert (stats["name"], stats["version"]) == ("counted", "1")
        done = stats["inference_stats"]
        assert done["success"]["count"] == done["queue"]["count"] == runs
        assert done["compute_infer"]["count"] == runs and done["fail"]["count"] == 1
        assert done["success"]["ns"] >= done["compute_infer"]["ns"] > 0
        assert (stats["inference_count"], stats["execution_count"]) == (rows * runs, runs)
        assert metric(url, "nv_inference_count", model="counted") == rows * runs
        # one execution of `rows` rows a request, as Triton's default scheduler runs it
        assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] \
            == [(rows, runs)]
        assert abs(stats["last_inference"] / 1e3 - time.time()) < 60
        assert done["success"]["count"] == metric(url, "nv_inference_request_success",
                                                  model="counted")
        assert client.get_inference_statistics("counted", "1")["model_stats"] == [stats]
        every = client.get_inference_statistics()["model_stats"]
        assert {(m["name"], m["version"]) for m in every} == {
            (s.name, s.version) for s in state.catalog.served()}
        with pytest.raises(InferenceServerException, match="nope"):
            client.get_inference_statistics("nope")
    finally:
        client.unload_model("counted")
        shutil.rmtree(folder)


def test_batch_statistics_count_each_execution_by_the_rows_it_ran(client, server):
    """Triton keys batch_stats by an execution's batch size in rows: two requests of 3
    rows that the dynamic batcher joined are one execution of 6 (before: of 2)."""
    url, state = server
    folder = state.catalog.repository.root / "joined"
    shutil.copytree(state.catalog.repository.root / "mlp", folder)
    (folder / "config.pbtxt").write_text(  # long enough for both to join
        "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 2000000 }\n")
    feeds = [_feeds(state, "mlp", rows=3) for _ in range(2)]
    try:
        client.load_model("joined")
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda f: _infer(url, "joined", f), feeds))
        for f, got in zip(feeds, answers, strict=True):
            _assert_same(got, _in_process(state, "mlp", f))
        [stats] = client.get_inference_statistics("joined")["model_stats"]
        assert (stats["inference_count"], stats["execution_count"]) == (6, 1)
        assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] \
            == [(6, 1)]
    finally:
        client.unload_model("joined")
        shutil.rmtree(folder)


@pytest.mark.parametrize(("said", "words"), [
    ({"input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1, 256]}]},
     "config input 'INPUT0': mlp has no such input (its inputs: x)"),
    ({"output": {"name": "y"}}, "config output 'y': mlp has no such output (its outputs: logits)"),
    ({"input": [{"name": "x", "data_type": "TYPE_INT64"}]},
     "config input 'x': data_type TYPE_INT64, but the model's is TYPE_FP32"),
    ({"input": [{"name": "x", "dims": [-1, 255]}]},
     "config input 'x': dims [-1, 255], but the model's are [-1, 256]"),
    ({"max_batch_size": 4, "input": [{"name": "x", "dims": [-1, 256]}]},
     "config input 'x': dims [-1, 256], but the model's are [256]"),
    ({"input": [{"data_type": "TYPE_FP32"}]}, "each input must be a message with a name"),
])
def test_config_tensors_the_model_lacks_are_refused(server, said, words):
    """As Triton checks a configuration's inputs and outputs against the model: a name it
    lacks, another data type or other dims refuse the load, and the model keeps serving."""
    url, state = server
    before = state.catalog.get("mlp")
    status, message = error_of(call(f"{url}/v2/repository/models/mlp/load", "POST",
                                    {"parameters": {"config": json.dumps(said)}}))
    assert status == 400 and words in message, message
    assert state.catalog.get("mlp") is before
    assert before.network in state.host.networks()


def test_config_tensors_that_match_load(client, server):
    """The repository's mlp lists its tensors (-1 matching any size); a batching config
    lists them without the batch dimension. With `reshape`, the client's tensors have the
    config's dims and the model's the reshape's shape, both ways, as Triton has it."""
    url, state = server
    said = {"max_batch_size": 4,
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [16, 16],
                       "reshape": {"shape": [256]}}],
            "output": [{"name": "logits", "dims": [2, 5], "reshape": {"shape": [-1]}}]}
    status, _, _ = call(f"{url}/v2/repository/models/mlp/load", "POST",
                        {"parameters": {"config": json.dumps(said)}})
    assert status == 200 and state.catalog.get("mlp").options.max_batch_size == 4
    meta = {t["name"]: t["shape"] for t in (*client.get_model_metadata("mlp")["inputs"],
                                             *client.get_model_metadata("mlp")["outputs"])}
    assert meta == {"x": [-1, 16, 16], "logits": [-1, 2, 5]}
    x = np.random.default_rng().standard_normal((3, 16, 16)).astype(np.float32)
    want = _in_process(state, "mlp", {"x": x.reshape(3, 256)})["logits"]
    _assert_same(_infer(url, "mlp", {"x": x}), {"logits": want.reshape(3, 2, 5)})
    for bad, words in ((dict(said["input"][0], dims=[16, 15]), "do not reshape to [256]"),
                       (dict(said["input"][0], reshape={"shape": [255]}),
                        "reshape shape [255], but the model's are [256]")):
        status, message = error_of(call(f"{url}/v2/repository/models/mlp/load", "POST", {
            "parameters": {"config": json.dumps(dict(said, input=[bad]))}}))
        assert status == 400 and words in message, message
    status, _, _ = call(f"{url}/v2/repository/models/mlp/load", "POST", {})
    assert status == 200 and state.catalog.get("mlp").options.max_batch_size == 0


def test_a_version_policy_serves_several_versions_side_by_side(client, server):
    """branchy has versions 1 and 3. `all` serves both: each answers at its own URL,
    metadata and the index list both, and a request without a version goes to the newest.
    A narrower policy then stops the version it drops; a version the repository lacks
    refuses the load."""
    url, state = server

    def load(policy: dict) -> tuple:
        return call(f"{url}/v2/repository/models/branchy/load", "POST",
                    {"parameters": {"config": json.dumps({"version_policy": policy})}})

    assert load({"all": {}})[0] == 200
    assert client.get_model_metadata("branchy")["versions"] == ["3", "1"]
    assert client.get_model_config("branchy")["version_policy"] == {"all": {}}
    rows = [(r["name"], r.get("version")) for r in client.get_model_repository_index()]
    assert ("branchy", "1") in rows and ("branchy", "3") in rows
    one, three = state.catalog.get("branchy", "1"), state.catalog.get("branchy", "3")
    assert one.network != three.network and state.catalog.get("branchy") is three
    feeds = _feeds(state, "branchy", rows=2)
    for version, served in (("1", one), ("3", three)):
        assert client.is_model_ready("branchy", version)
        _assert_same(_infer(url, f"branchy/versions/{version}", feeds),
                     state.host.run(served.network, feeds).result(WAIT))

    def answered(version: str) -> float:
        return metric(url, "nv_inference_request_success", model="branchy", version=version)

    assert answered("1") >= 1 and answered("3") >= 1
    assert load({"specific": {"versions": [1]}})[0] == 200  # a new config: a reload
    assert client.get_model_metadata("branchy")["versions"] == ["1"]
    now = state.catalog.get("branchy")
    assert now.version == "1" and not client.is_model_ready("branchy", "3")
    assert {one.network, three.network}.isdisjoint(state.host.networks())
    assert answered("3") == 0 and answered("1") >= 1  # metrics forget a version dropped
    _assert_same(_infer(url, "branchy", feeds), state.host.run(now.network, feeds).result(WAIT))
    status, message = error_of(load({"specific": {"versions": [2]}}))
    assert status == 404 and "no version '2'" in message, message
    assert state.catalog.get("branchy") is now
    assert call(f"{url}/v2/repository/models/branchy/load", "POST", {})[0] == 200
    assert client.get_model_metadata("branchy")["versions"] == ["3"]
    assert now.network not in state.host.networks() and answered("1") == 0


def test_load_parameters_reload_beside_the_old_network(server):
    url, state = server
    before = state.catalog.get("transformer")
    status, _, _ = call(f"{url}/v2/repository/models/transformer/load", "POST",
                        {"parameters": {"partition": "memory", "devices": "cpu1"}})
    assert status == 200
    after = state.catalog.get("transformer")
    assert after.network != before.network and before.network not in state.host.networks()
    plan = state.host.plan(after.network)
    assert {p.device for p in plan.partitions} == {"cpu1"} and plan.mode == "memory"
    feeds = _feeds(state, "transformer")
    _assert_same(_infer(url, "transformer", feeds), _in_process(state, "transformer", feeds))
    # the same load again changes nothing
    call(f"{url}/v2/repository/models/transformer/load", "POST",
         {"parameters": {"partition": "memory", "devices": "cpu1"}})
    assert state.catalog.get("transformer").network == after.network


def test_a_replicated_models_config_names_every_device_and_loads_back(server):
    """The configuration named only the plan's devices ("cpu0") beside two instances, so
    loading it back asked for two replicas on one device and failed."""
    url, state = server
    folder = state.catalog.repository.root / "twice"
    shutil.copytree(state.catalog.repository.root / "mlp", folder)
    try:
        status, _, _ = call(f"{url}/v2/repository/models/twice/load", "POST",
                            {"parameters": {"replicas": 2}})
        assert status == 200
        network = state.catalog.get("twice").network
        placed = state.host.placements(network)
        assert len(placed) == 2 and placed[0].keys() == placed[1].keys()
        assert {d for p in placed for d in p.values()} == {"cpu0", "cpu1"}
        assert [{p.name: p.device for p in state.host.plan(network).partitions}] == placed[:1]
        status, _, body = call(f"{url}/v2/models/twice/config")
        config = json.loads(body)
        assert config["parameters"]["devices"]["string_value"] == "cpu0,cpu1"
        assert config["instance_group"][0]["count"] == 2
        status, _, body = call(f"{url}/v2/repository/models/twice/load", "POST",
                               {"parameters": {"config": json.dumps(config)}})
        assert status == 200, body
        assert state.host.replicas(state.catalog.get("twice").network) == 2
    finally:
        call(f"{url}/v2/repository/models/twice/unload", "POST")
        shutil.rmtree(folder)


@pytest.mark.parametrize("name, params, status, part", [
    ("..", {}, 400, "plain name"),
    (".hidden", {}, 400, "plain name"),
    ("escape", {}, 404, "escape.onnx links out of it"),  # a link out of the repository
    ("inside", {}, 404, "not in the repository"),  # a folder linked out of it
    ("mlp", {"file:1/model.onnx": "AAAA"}, 400, "repository"),
    ("mlp", {"partition": "/etc/passwd"}, 400, "partition"),
    ("mlp", {"devices": "gpu7"}, 400, "gpu7"),
    ("mlp", {"replicas": "lots"}, 400, "replicas"),
    ("mlp", {"bogus": 1}, 400, "bogus"),
    ("mlp", {"version": "9"}, 404, "version"),
    ("mlp", {"config": json.dumps({"output": [{"name": "logits", "label_filename":
                                               "../../outside/model.onnx"}]})}, 400, "leads out"),
    ("mlp", {"config": json.dumps({"output": [{"name": "logits", "label_filename":
                                               "labels.txt"}]})}, 400, "labels of output"),
])
def test_loads_stay_inside_the_repository(server, name, params, status, part):
    url, state = server
    root = state.catalog.repository.root
    outside = root.parent / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "model.onnx").write_bytes((root / "cnn.onnx").read_bytes()
                                         if (root / "cnn.onnx").exists() else b"x")
    for link, target in (("escape.onnx", outside / "model.onnx"), ("inside", outside)):
        if not (root / link).is_symlink():
            os.symlink(target, root / link)
    (outside / "1").mkdir(exist_ok=True)
    (outside / "1" / "model.onnx").write_bytes(b"x")
    got, message = error_of(call(f"{url}/v2/repository/models/{name}/load", "POST",
                                 {"parameters": params}))
    assert got == status and part in message, message
    assert {"escape", "inside", ".hidden"}.isdisjoint(
        r["name"] for r in json.loads(call(f"{url}/v2/repository/index", "POST")[2]))


def _infer(url: str, name: str, feeds: dict) -> dict[str, np.ndarray]:
    body, headers = binary_request(feeds)
    status, response_headers, payload = call(f"{url}/v2/models/{name}/infer", "POST", body,
                                             headers)
    assert status == 200, payload[:200]
    size = int(response_headers["Inference-Header-Content-Length"])
    out, at = {}, size
    for tensor in json.loads(payload[:size])["outputs"]:
        n = tensor["parameters"]["binary_data_size"]
        dtype = {"FP32": "<f4", "INT64": "<i8"}[tensor["datatype"]]
        out[tensor["name"]] = np.frombuffer(payload[at:at + n], dtype).reshape(tensor["shape"])
        at += n
    return out


# -- the guard -----------------------------------------------------------------------------


def test_token_is_asked_on_every_endpoint_but_health():
    from tests.support.dags import SAMPLES_DIR

    token = "s3cr3t-" + os.urandom(8).hex()
    with serving("cpu:1", files=(("mlp", SAMPLES_DIR / "mlp.onnx"),),
                 settings=ServerSettings(token=token)) as (url, _):
        for path in ("/v2/health/live", "/v2/health/ready"):  # open for probes
            assert call(url + path)[0] == 200
        paths = ["/v2", "/v2/models/mlp", "/metrics", "/v2/models/mlp/config",
                 "/v2/models/mlp/ready", "/no/route"]
        for path in paths:
            for headers in ({}, {"Authorization": f"Bearer {token}x"},
                            {"Authorization": token}):
                status, message = error_of(call(url + path, headers=headers))
                assert status == 401 and "token" in message
        good = {"Authorization": f"Bearer {token}"}
        for path in paths[:-1]:
            assert call(url + path, headers=good)[0] == 200, path
        body, headers = binary_request({"x": np.ones((1, 256), np.float32)})
        assert call(f"{url}/v2/models/mlp/infer", "POST", body, headers)[0] == 401
        assert call(f"{url}/v2/models/mlp/infer", "POST", body, {**headers, **good})[0] == 200


def test_body_limit_by_length_and_by_chunks():
    from tests.support.dags import SAMPLES_DIR

    with serving("cpu:1", files=(("mlp", SAMPLES_DIR / "mlp.onnx"),),
                 settings=ServerSettings(max_body_bytes=2048)) as (url, _):
        status, message = error_of(call(f"{url}/v2/models/mlp/infer", "POST", b"x" * 4096))
        assert status == 413 and "2048" in message
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=WAIT)
        conn.request("POST", "/v2/models/mlp/infer", iter([b"{" * 1500] * 3),
                     encode_chunked=True)
        response = conn.getresponse()
        assert response.status == 413 and "2048" in json.loads(response.read())["error"]
        conn.close()
        body, headers = binary_request({"x": np.ones((1, 256), np.float32)})
        assert call(f"{url}/v2/models/mlp/infer", "POST", body, headers)[0] == 200
        bomb = zlib.compress(b"{" * 4096)  # small sent, over the limit decompressed
        status, message = error_of(call(f"{url}/v2/models/mlp/infer", "POST", bomb,
                                        {"Content-Encoding": "deflate"}))
        assert status == 413 and "2048" in message and "decompressed" in message


def test_a_body_over_the_limit_is_answered_413_not_reset():
    """8 MB to a 1 MB limit, by its length: the 413 had been sent at once and the connection
    closed under a client still sending, which saw a broken pipe (in chunks, it had not)."""
    from tests.support.dags import SAMPLES_DIR

    with serving("cpu:1", files=(("mlp", SAMPLES_DIR / "mlp.onnx"),),
                 settings=ServerSettings(max_body_bytes=1 << 20)) as (url, _):
        body = os.urandom(8 << 20)
        status, message = error_of(call(f"{url}/v2/models/mlp/infer", "POST", body))
        assert status == 413 and str(1 << 20) in message, message
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=WAIT)
        conn.request("POST", "/v2/models/mlp/infer",
                     iter(body[i:i + (1 << 16)] for i in range(0, len(body), 1 << 16)),
                     encode_chunked=True)
        response = conn.getresponse()
        assert response.status == 413
        conn.close()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_requests_as_tritonclient_sends_them(client, server, encoding):
    url, state = server
    feeds = _feeds(state, "mlp", rows=2)
    tensor = triton.InferInput("x", list(feeds["x"].shape), "FP32")
    tensor.set_data_from_numpy(feeds["x"])
    answer = client.infer("mlp", [tensor], request_compression_algorithm=encoding,
                          response_compression_algorithm=encoding)
    np.testing.assert_allclose(answer.as_numpy("logits"),
                               _in_process(state, "mlp", feeds)["logits"], rtol=1e-5, atol=1e-6)
    for headers, body, part in (({"Content-Encoding": "br"}, b"{}", "'br'"),
                                ({"Content-Encoding": encoding}, b"not compressed", encoding)):
        status, message = error_of(call(f"{url}/v2/models/mlp/infer", "POST", body, headers))
        assert status == 400 and part in message, message


def test_only_loopback_without_a_token():
    check_exposure("127.0.0.1", None, False)
    check_exposure("::1", None, False)
    check_exposure("localhost", None, False)
    check_exposure("0.0.0.0", "t", False)
    check_exposure("0.0.0.0", None, True)
    with pytest.raises(PrismError, match="--token"):
        check_exposure("0.0.0.0", None, False)
    with pytest.raises(PrismError, match="--token"):
        check_exposure("192.168.1.4", "", False)


# -- metrics -------------------------------------------------------------------------------


def test_metrics_count_what_happened(server):
    url, state = server
    labels = {"model": "control_flow", "version": "1"}
    before = {k: metric(url, k, **labels) for k in (
        "nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count",
        "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us")}
    failed = metric(url, "nv_inference_request_failure", **labels)
    plan = state.host.plan(state.catalog.get("control_flow").network)
    runs = {p.name: metric(url, "prism_partition_run_seconds_count", model="control_flow",
                           partition=p.name) for p in plan.partitions}
    for rows in (1, 2, 3):
        _infer(url, "control_flow", _feeds(state, "control_flow", rows))
    error_of(call(f"{url}/v2/models/control_flow/infer", "POST", {"inputs": [{}]}))
    after = {k: metric(url, k, **labels) for k in before}
    assert after["nv_inference_request_success"] - before["nv_inference_request_success"] == 3
    assert after["nv_inference_exec_count"] - before["nv_inference_exec_count"] == 3
    assert metric(url, "nv_inference_request_failure", **labels) - failed == 1
    spent = {k: after[k] - before[k] for k in before if k.endswith("_us")}
    assert 0 < spent["nv_inference_queue_duration_us"] < spent["nv_inference_request_duration_us"]
    assert 0 < spent["nv_inference_compute_infer_duration_us"] \
        <= spent["nv_inference_request_duration_us"]
    for p in plan.partitions:
        assert metric(url, "prism_partition_run_seconds_count", model="control_flow",
                      partition=p.name, device=p.device) - runs[p.name] == 3
    for name, device in state.host.devices.items():
        assert metric(url, "prism_device_memory_used_bytes", device=name) == \
            device.stats().used_bytes
    moved = sum(t.bytes for t in plan.transfers)
    assert metric(url, "prism_transfer_bytes", model="control_flow") >= 3 * moved
    text = call(f"{url}/metrics")[2].decode()
    assert "# TYPE nv_inference_request_success counter" in text  # Triton's names, no _total
    assert 'nv_inference_count{model="control_flow",version="1"}' in text


def test_batched_rows_and_executions():
    """Triton's counts under dynamic batching: a request of n rows is n inferences, and a
    batch of requests one execution."""
    from tests.support.dags import SAMPLES_DIR

    with serving("cpu:1") as (url, state):
        from app.server.load_options import load_options

        state.catalog.add("mlp", SAMPLES_DIR / "mlp.onnx", load_options(
            {}, {"max_batch_size": "16", "max_queue_delay_ms": "50"}))
        rows = [1, 2, 3] * 8
        with ThreadPoolExecutor(24) as pool:
            for got in pool.map(lambda n: _infer(url, "mlp", _feeds(state, "mlp", n)), rows,
                                timeout=WAIT):
                assert got["logits"].shape[1] == 10
        assert metric(url, "nv_inference_request_success", model="mlp") == len(rows)
        assert metric(url, "nv_inference_count", model="mlp") == sum(rows)
        assert 1 <= metric(url, "nv_inference_exec_count", model="mlp") < len(rows)


def test_a_policy_load_with_a_version_that_fails_loads_none(tmp_path):
    """Triton's all-or-nothing: version 1 is not a model, so loading both fails, the
    network this load made for version 2 is removed, and version 2 as it was serves on."""
    from tests.support.dags import SAMPLES_DIR

    for version, body in (("2", (SAMPLES_DIR / "mlp.onnx").read_bytes()), ("1", b"junk")):
        (tmp_path / "duo" / version).mkdir(parents=True)
        (tmp_path / "duo" / version / "model.onnx").write_bytes(body)
    with serving("cpu:2", tmp_path) as (url, state):
        def load(policy: dict) -> tuple:
            return call(f"{url}/v2/repository/models/duo/load", "POST",
                        {"parameters": {"config": json.dumps({"version_policy": policy})}})

        assert load({"specific": {"versions": [2]}})[0] == 200
        two, networks = state.catalog.get("duo"), state.host.networks()
        status, message = error_of(load({"all": {}}))  # version 2 reloads first: new policy
        assert status == 400 and "duo" in message, message
        assert state.catalog.get("duo") is two and state.catalog.versions("duo") == ["2"]
        assert state.host.networks() == networks
        feeds = _feeds(state, "duo")
        _assert_same(_infer(url, "duo", feeds), state.host.run(two.network, feeds).result(WAIT))


# -- the load generator --------------------------------------------------------------------


def test_bench_url_reports_levels_and_the_servers_split(server):
    import asyncio

    url, _ = server
    levels = asyncio.run(bench(url, "mlp", [1, 4], 40))
    assert [lv.concurrency for lv in levels] == [1, 4]
    for lv in levels:
        assert lv.requests == 40 and lv.errors == 0
        assert 0 < lv.p50_seconds <= lv.p90_seconds <= lv.p95_seconds <= lv.p99_seconds
        assert lv.server is not None and lv.server["compute_us"] > 0
        assert lv.server["queue_us"] + lv.server["compute_us"] <= lv.server["request_us"] * 1.01


def test_bench_url_sends_the_feeds_of_an_npz(client, server, tmp_path):
    """perf_analyzer's --input-data: a model taking only some sizes (an even number of
    rows) failed every random request, and `prism bench --url` had no other."""
    import asyncio

    url, state = server
    folder = state.catalog.repository.root / "pairs" / "1"
    folder.mkdir(parents=True)
    onnx.save(even_rows_model(), folder / "model.onnx")
    data, wrong = tmp_path / "rows.npz", tmp_path / "wrong.npz"
    np.savez(data, x=np.random.default_rng().standard_normal((6, 4)).astype(np.float32))
    np.savez(wrong, rows=np.zeros((6, 4), np.float32))
    try:
        client.load_model("pairs")
        [drawn] = asyncio.run(bench(url, "pairs", [2], 10))
        assert drawn.errors == 10
        [given] = asyncio.run(bench(url, "pairs", [2], 20, inputs=str(data)))
        assert given.requests == 20 and given.errors == 0, given.first_error
        with pytest.raises(InvalidInputError, match=f"{wrong}: .*'x'"):
            asyncio.run(bench(url, "pairs", [2], 10, inputs=str(wrong)))
    finally:
        client.unload_model("pairs")
        shutil.rmtree(folder.parent)


def test_a_dimension_named_by_a_number_is_served_as_that_number(client, server):
    """torch's dynamo exporter names an image's channels by their number ([s0, "3", s1,
    s2]): served as -1, `prism bench --url` drew no image, but 1x1x1x1 tensors, and every
    request of a detector failed."""
    import asyncio

    url, state = server
    folder = state.catalog.repository.root / "neck" / "1"
    folder.mkdir(parents=True)
    onnx.save(upsampling_detector(["s0", "3", "s1", "s2"]), folder / "model.onnx")
    try:
        client.load_model("neck")
        [image] = client.get_model_metadata("neck")["inputs"]
        assert image["shape"] == [-1, 3, -1, -1]
        [drawn] = asyncio.run(bench(url, "neck", [2], 10))
        assert drawn.requests == 10 and drawn.errors == 0, drawn.first_error
    finally:
        client.unload_model("neck")
        shutil.rmtree(folder.parent)


@pytest.mark.parametrize("kind", ["optimum image", "vision transformer", "waveform"])
def test_bench_url_draws_what_the_model_takes_as_prism_run_does(client, server, kind):
    """Served as -1 everywhere, an image whose channels are named (optimum's
    [batch_size, num_channels, height, width]) was drawn 1x1x1x1, a ViT at its own side
    224, a waveform one sample: every request failed. The configuration says the inputs
    as Prism reads them (`INPUT_SPECS`), and `prism bench --url` draws them as `run` does."""
    import asyncio

    url, state = server
    rng = np.random.default_rng()
    side = int(rng.integers(2, 9)) * 8
    model, shape = {
        "optimum image": (upsampling_detector(["batch_size", "num_channels", "h", "w"]),
                          [1, 3, IMAGE_SIDE, IMAGE_SIDE]),
        "vision transformer": (vit_stem(["n", "c", "h", "w"], 8, side // 8, 1),
                               [1, 3, side, side]),
        "waveform": (speech_frontend(["batch", "samples"]), [1, AUDIO_SAMPLES]),
    }[kind]
    folder = state.catalog.repository.root / "drawn" / "1"
    folder.mkdir(parents=True)
    onnx.save(model, folder / "model.onnx")
    try:
        client.load_model("drawn")
        [served] = client.get_model_metadata("drawn")["inputs"]
        assert set(served["shape"]) == {-1}
        config = client.get_model_config("drawn")
        assert INPUT_SPECS in config["parameters"]
        [drawn] = asyncio.run(bench(url, "drawn", [2], 10))
        assert drawn.requests == 10 and drawn.errors == 0, drawn.first_error
        assert drawn.shapes == {served["name"]: shape}
    finally:
        client.unload_model("drawn")
        shutil.rmtree(folder.parent)


def test_bench_url_sends_inputs_in_the_shapes_given(client, server):
    """perf_analyzer's --shape: a variable dimension was always sent as 1, so a model
    taking only some sizes failed every request, and a transformer was measured on one
    token. A shape that does not fit the input is refused by name."""
    import asyncio

    url, state = server
    folder = state.catalog.repository.root / "rows" / "1"
    folder.mkdir(parents=True)
    onnx.save(even_rows_model(), folder / "model.onnx")
    rows = 2 * int(np.random.default_rng().integers(1, 50))
    try:
        client.load_model("rows")
        [shaped] = asyncio.run(bench(url, "rows", [2], 20, shapes={"x": (rows, 4)}))
        assert shaped.requests == 20 and shaped.errors == 0, shaped.first_error
        assert shaped.shapes == {"x": [rows, 4]}
        for shapes, named in (({"x": (rows, 5)}, r"x=.*served as \[-1, 4\]"),
                              ({"x": (rows,)}, r"x=.*served as \[-1, 4\]"),
                              ({"y": (rows, 4)}, "no input named 'y'; its inputs are x")):
            with pytest.raises(PrismError, match=named):
                asyncio.run(bench(url, "rows", [2], 10, shapes=shapes))
    finally:
        client.unload_model("rows")
        shutil.rmtree(folder.parent)


def test_bench_url_draws_text_inputs(client, server):
    """A model reading text (a LabelEncoder): `prism bench --url` refused it ("draws
    numeric inputs only"); it draws inputs as the host's own load does now."""
    import asyncio

    url, state = server
    folder = state.catalog.repository.root / "encoder" / "1"
    folder.mkdir(parents=True)
    onnx.save(helper.make_model(helper.make_graph(
        [helper.make_node("LabelEncoder", ["color"], ["code"], domain="ai.onnx.ml",
                          keys_strings=["x", "y"], values_int64s=[7, 8], default_int64=-1)],
        "encoder", [helper.make_tensor_value_info("color", TensorProto.STRING, ["n"])],
        [helper.make_tensor_value_info("code", TensorProto.INT64, ["n"])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 2)]),
        folder / "model.onnx")
    try:
        client.load_model("encoder")
        [level] = asyncio.run(bench(url, "encoder", [2], 20))
        assert level.requests == 20 and level.errors == 0, level.first_error
    finally:
        client.unload_model("encoder")
        shutil.rmtree(folder.parent)


def test_a_load_runs_off_the_event_loop(server):
    """While a model loads, the server keeps answering."""
    url, state = server
    answered = []
    done = threading.Event()

    def load():
        call(f"{url}/v2/repository/models/branchy/load", "POST",
             {"parameters": {"partition": "memory", "version": "1"}})
        done.set()

    thread = threading.Thread(target=load)
    thread.start()
    while not done.is_set():
        answered.append(call(f"{url}/v2/health/live")[0])
    thread.join(WAIT)
    assert answered and set(answered) == {200}
    assert state.catalog.get("branchy").version == "1"


def test_runs_never_happen_on_the_event_loops_thread():
    """Every run is off the server's loop: on its run thread (the device idle) or on the
    device's worker (that thread busy), one request at a time or many at once."""
    from tests.support.fakes import FaultyManager
    from tests.support.serving import MLP

    with serving("cpu:1", files=(("mlp", MLP),), device_factory=FaultyManager) as (url, state):
        ran_on: list[str] = []
        state.host.devices["cpu0"].fail = lambda call, feeds: ran_on.append(
            threading.current_thread().name) or 0
        feeds = [_feeds(state, "mlp") for _ in range(40)]

        def one(f):
            body, headers = binary_request(f)
            return call(f"{url}/v2/models/mlp/infer", "POST", body, headers)[0]

        statuses = [one(f) for f in feeds[:10]]
        with ThreadPoolExecutor(8) as pool:
            statuses += list(pool.map(one, feeds[10:], timeout=WAIT))
    assert statuses == [200] * len(feeds) and len(ran_on) == len(feeds)
    assert "prism-server" not in ran_on and "prism-server-run" in ran_on


def test_a_failed_run_and_a_fault_of_the_servers_own_are_500_and_it_serves_on(monkeypatch):
    import app.server.routes.infer as route
    from tests.support.fakes import FaultyManager
    from tests.support.serving import MLP

    with serving("cpu:1", files=(("mlp", MLP),), device_factory=FaultyManager) as (url, state):
        state.host.devices["cpu0"].fail = lambda call, feeds: call == 1
        infer = f"{url}/v2/models/mlp/infer"
        body, headers = binary_request(_feeds(state, "mlp"))
        status, message = error_of(call(infer, "POST", body, headers))
        assert status == 500 and "cpu0" in message and "injected fault" in message
        with monkeypatch.context() as patched:
            patched.setattr(route, "encode_response", lambda *args: 1 / 0)
            status, message = error_of(call(infer, "POST", body, headers))
        assert status == 500 and message.startswith("internal error: ZeroDivisionError")
        assert call(infer, "POST", body, headers)[0] == 200
