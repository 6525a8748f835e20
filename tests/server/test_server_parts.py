"""The server's pure parts: protocol tensors both ways for every datatype (against
tritonclient's own encoder), config.pbtxt, and load options."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
import tritonclient.http as triton

from app.server.classify import top_classes
from app.server.load_options import LoadOptionError, load_options
from app.server.pbtxt import ConfigError, parse
from app.server.tensors import (
    DTYPES,
    LARGE_JSON,
    InferRequest,
    TensorError,
    encode_response,
    parse_infer,
)
from app.server.warmup import warmup_feeds


def _random(datatype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dtype = DTYPES[datatype]
    if dtype.kind == "O":
        return np.array(["".join(map(chr, rng.integers(32, 0x2FF, rng.integers(0, 9))))
                         .encode() for _ in range(int(np.prod(shape)))],
                        dtype=object).reshape(shape)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("datatype", list(DTYPES))
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclients_requests_decode_to_its_arrays(datatype, binary):
    rng = np.random.default_rng()
    array = _random(datatype, (2, 3), rng)
    tensor = triton.InferInput("t", [2, 3], datatype)
    if datatype == "BYTES" and not binary:  # JSON carries text
        array = np.array([b.hex().encode() for b in array.ravel()], dtype=object).reshape(2, 3)
    tensor.set_data_from_numpy(array, binary_data=binary)
    body, header_length = triton.InferenceServerClient.generate_request_body([tensor])
    got = parse_infer(body if isinstance(body, bytes) else body.encode(),
                      None if header_length is None else str(header_length), []).feeds["t"]
    assert got.shape == (2, 3) and got.dtype == DTYPES[datatype]
    if datatype == "BYTES":  # text, as onnxruntime takes it, however it came
        assert list(got.ravel()) == [b.decode() for b in array.ravel()]
    else:
        np.testing.assert_array_equal(got, array)


@pytest.mark.parametrize("datatype", list(DTYPES))
@pytest.mark.parametrize("shape", [(3, 2), ()], ids=["matrix", "scalar"])
def test_responses_read_back_with_tritonclient(datatype, shape):
    rng = np.random.default_rng()
    array = _random(datatype, shape, rng)
    for binary in (False, True):
        request = InferRequest({}, None, binary, 1, None, "id-1")
        body, header_length = encode_response("m", "1", request, {"out": array})
        result = triton.InferResult.from_response_body(body, header_length=header_length)
        got = result.as_numpy("out")
        assert result.get_response()["id"] == "id-1"
        assert result.get_output("out")["shape"] == list(shape)
        if datatype == "BYTES" and not binary:
            assert [g.decode() if isinstance(g, bytes) else g for g in got.ravel()] == [
                b.decode("utf-8", "replace") for b in array.ravel()]
        else:
            np.testing.assert_array_equal(got, array)


def test_the_header_length_must_fit_the_body():
    for bad in ("-1", "x", "99"):
        with pytest.raises(TensorError, match="Inference-Header-Content-Length"):
            parse_infer(b"{}", bad, [])


def test_a_triton_config_becomes_load_options():
    config = parse("""
        name: "cnn"  # comments and both list forms
        max_batch_size: 16
        input [ { name: "image" data_type: TYPE_FP32 dims: [ 3, 32, 32 ] } ]
        dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 2500 }
        instance_group [ { count: 2 kind: KIND_CPU }, { count: 1 kind: KIND_CPU } ]
        parameters { key: "partition" value: { string_value: "memory" } }
        parameters { key: "devices" value: { string_value: "cpu0, cpu1" } }
    """)
    options = load_options(config, None)
    assert (options.max_batch_size, options.max_queue_delay_ms) == (16, 2.5)
    assert options.preferred_batch_sizes == (4, 8) and options.replicas == 3
    assert options.partition == "memory" and options.devices == ("cpu0", "cpu1")
    assert load_options(config, {"replicas": "auto"}).replicas == "auto"
    # a load request's own parameters win, its config replaces the file's
    assert load_options(config, {"partition": "balanced"}).partition == "balanced"
    assert options.dynamic_batching and options.add_network()["batching"]["max_batch_size"] == 16
    # max_batch_size alone bounds the batch (Triton's default scheduler), joins no requests
    replaced = load_options(config, {"config": json.dumps({"max_batch_size": 4})})
    assert replaced.max_batch_size == 4 and not replaced.dynamic_batching
    assert replaced.add_network()["batching"] is None and replaced.partition == "balanced"
    assert load_options({}, {"max_batch_size": 4}).dynamic_batching  # Prism's own parameter
    assert options.costs is None and options.add_network()["costs"] is None  # the default
    assert load_options(config, {"costs": "model"}).add_network()["costs"] == "model"


def test_warmup_samples_are_read_from_a_configuration_and_made_into_feeds():
    """Triton's `model_warmup`, from pbtxt or JSON: a batching model's sample holds
    `batch_size` rows of each input's dims; data zero, random, or raw bytes from a file
    (BYTES elements each after its length). What cannot be made is refused by name."""
    config = parse("""
        max_batch_size: 4
        model_warmup [ { name: "rows" batch_size: 3 count: 2
          inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 5 ] random_data: true } }
          inputs { key: "s" value: { data_type: TYPE_STRING dims: [ 2 ] input_data_file: "s" } }
          inputs { key: "n" value: { data_type: TYPE_INT8 dims: [ 1 ] zero_data: true } } } ]
    """)
    [sample] = load_options(config, None).warmups
    assert (sample.name, sample.batch_size, sample.count) == ("rows", 3, 2)
    as_json = {"max_batch_size": 4, "model_warmup": [{
        "name": "rows", "batch_size": 3, "count": 2, "inputs": {
            "x": {"data_type": "TYPE_FP32", "dims": [5], "random_data": True},
            "s": {"data_type": "TYPE_STRING", "dims": [2], "input_data_file": "s"},
            "n": {"data_type": "TYPE_INT8", "dims": [1], "zero_data": True}}}]}
    assert load_options(as_json, None).warmups == (sample,)
    texts = ["ab", "", "c", "de", "f", "ünï"]
    data = b"".join(len(t.encode()).to_bytes(4, "little") + t.encode() for t in texts)
    asked = []
    feeds = warmup_feeds(sample, True, lambda file, most: asked.append(file) or data,
                         np.random.default_rng())
    assert asked == ["s"] and feeds["x"].shape == (3, 5) and feeds["x"].dtype == np.float32
    assert feeds["s"].tolist() == [texts[0:2], texts[2:4], texts[4:6]]
    assert feeds["n"].tolist() == [[0]] * 3 and feeds["n"].dtype == np.int8
    for bad, named in (({"data_type": "TYPE_FP32", "dims": [2]}, "needs one of zero_data"),
                       ({"data_type": "TYPE_FP99", "zero_data": True}, "TYPE_FP99"),
                       ({"data_type": "TYPE_FP32", "dims": [-1], "zero_data": True}, "dims")):
        with pytest.raises(LoadOptionError, match=named):
            load_options({"model_warmup": {"name": "w", "inputs": {"x": bad}}}, None)


@pytest.mark.parametrize(("text", "kind", "picked"), [
    ("", "latest", ["7", "3"][:1]),
    ("version_policy: { latest: { num_versions: 2 } }", "latest", ["7", "3"]),
    ("version_policy { all { } }", "all", ["7", "3", "1"]),
    ("version_policy: { specific: { versions: [1, 7] } }", "specific", ["7", "1"]),
    ("version_policy: { specific { versions: 3 } }", "specific", ["3"])])
def test_a_version_policy_picks_the_versions_that_load(text, kind, picked):
    policy = load_options(parse(text), None).versions
    assert policy.kind == kind and policy.pick("m", {"1", "3", "7"}) == picked
    assert load_options({"version_policy": policy.to_config()}, None).versions == policy
    # the load parameter `version` picks one, whatever the configuration says
    assert load_options(parse(text), {"version": "3"}).versions.pick("m", {"1", "3"}) == ["3"]


@pytest.mark.parametrize("policy", [{"newest": {}}, {"latest": {"num_versions": 0}},
                                    {"specific": {"versions": []}}, "all",
                                    {"all": {}, "latest": {}}])
def test_a_bad_version_policy_is_refused(policy):
    with pytest.raises(LoadOptionError, match="version_policy"):
        load_options({"version_policy": policy}, None)


@pytest.mark.parametrize("text", ['name: "x', "a { b: 1", "a: [1, 2", "{", "a:"])
def test_a_broken_config_is_one_error(text):
    with pytest.raises(ConfigError, match=r"config\.pbtxt"):
        parse(text)


@pytest.mark.parametrize("params", [{"max_batch_size": -1}, {"max_queue_delay_ms": "soon"},
                                    {"preferred_batch_sizes": "4,x"}, {"devices": ""},
                                    {"config": "{"}, {"file:1/model.onnx": ""},
                                    {"costs": "roofline"},
                                    {"max_batch_size": 4, "preferred_batch_sizes": "2,8"}])
def test_bad_load_parameters_are_refused(params):
    with pytest.raises(LoadOptionError):
        load_options({}, params)


@pytest.mark.parametrize(("datatype", "data", "held"), [
    ("BOOL", ["false", "true"], "strings"), ("BOOL", [0, 1], "whole numbers"),
    ("INT64", [1.7, 2.0], "fractions"), ("INT64", ["1", "2"], "strings"),
    ("INT8", [1, 300], "from 1 to 300"), ("UINT64", [-1, 2**63], "out of its range"),
    ("FP32", [None, 1.0], "mixed"), ("FP32", ["1.5", "2"], "strings"),
    ("BYTES", [1, 2], "whole numbers")])
def test_json_data_of_another_type_is_refused_not_converted(datatype, data, held):
    """numpy would make True of "false" and 1 of 1.7; Triton refuses them, and so do we."""
    body = json.dumps({"inputs": [{"name": "t", "datatype": datatype, "shape": [2],
                                   "data": data}]}).encode()
    with pytest.raises(TensorError, match=f"data is not {datatype}: it holds .*{held}"):
        parse_infer(body, None, [])


def test_json_data_in_range_is_taken_exactly():
    rng = np.random.default_rng()
    for datatype in ("UINT64", "INT64", "INT8", "FP16", "BOOL"):
        array = _random(datatype, (3,), rng)
        body = json.dumps({"inputs": [{"name": "t", "datatype": datatype, "shape": [3],
                                       "data": array.tolist()}]}).encode()
        np.testing.assert_array_equal(parse_infer(body, None, []).feeds["t"], array)


def test_a_large_json_body_parses_within_a_few_times_its_size():
    """orjson reserves some 14x the text it reads: a 64 MB body took a gigabyte. Past
    LARGE_JSON the body is read by Python's json, which stays near 3x."""
    x = np.random.default_rng().standard_normal(LARGE_JSON // 14).astype(np.float32)
    body = json.dumps({"inputs": [{"name": "x", "shape": [len(x)], "datatype": "FP32",
                                   "data": x.tolist()}]}).encode()
    assert len(body) > LARGE_JSON
    tracemalloc.start()
    try:
        request = parse_infer(body, None, [])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(request.feeds["x"], x)
    assert peak < 4 * len(body), f"{peak / len(body):.1f}x the body"


def test_top_classes_break_ties_by_index_and_take_triton_types():
    """Equal values keep index order; unsigned values sort as they are (a negation would
    wrap them); an empty batch gives no rows; FP16 and BYTES are refused, as Triton does."""
    scores = np.array([[3, 250, 3, 0], [7, 7, 7, 9]], np.uint8)
    assert top_classes("s", scores, 3, True, ["a", "b"]).tolist() == [
        ["250:1:b", "3:0:a", "3:2"], ["9:3", "7:0:a", "7:1:b"]]
    assert top_classes("s", scores, 2, False).tolist() == ["250:1", "9:7"]
    rng = np.random.default_rng()
    values = rng.standard_normal((0, 5)).astype(np.float32)
    assert top_classes("s", values, 2, True).shape == (0, 2)
    for bad in (np.zeros(3, np.float16), np.array(["x"], dtype=object)):
        with pytest.raises(TensorError, match=r"'s' is (FP16|BYTES): classification takes"):
            top_classes("s", bad, 1, False)
