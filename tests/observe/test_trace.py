"""Chrome traces (`--trace`, the server's trace endpoints) checked against the Trace Event
Format: slices, flows that pair and bind to slices, counters, named processes."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from app.cli import main
from runtime.devices import parse_devices
from runtime.host import HostManager
from runtime.observe.trace import ChromeTrace
from runtime.partition.plan import Plan
from tests.support.dags import SAMPLES_DIR
from tests.support.servers import call, serving

CNN = SAMPLES_DIR / "cnn.onnx"


def cross_device_edges(plan: Plan) -> int:
    """Producer -> consumer partition pairs on different devices: the flows one request
    draws."""
    made_by = {t: p for p in plan.partitions for t in p.outputs}
    return sum(len({made_by[t].name for t in p.inputs if t in made_by
                    and made_by[t].device != p.device}) for p in plan.partitions)


def check_format(doc: dict, plan: Plan, requests: int) -> None:
    events = doc["traceEvents"]
    assert {e["ph"] for e in events} <= {"X", "C", "M", "s", "f"}
    slices = [e for e in events if e["ph"] == "X"]
    for e in events:
        assert isinstance(e["pid"], int) and isinstance(e.get("ts", 0), int | float)
        assert e["ph"] == "M" or e["ts"] >= 0
    for e in slices:
        assert e["dur"] >= 0 and isinstance(e["tid"], int) and isinstance(e["name"], str)
    assert len(slices) == requests * len(plan.partitions)
    assert Counter(e["name"] for e in slices) == {p.name: requests for p in plan.partitions}
    by_device = {p.name: p.device for p in plan.partitions}
    named = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    for e in slices:
        assert named[e["pid"]] == by_device[e["name"]]  # one process per device
    flows: defaultdict[int, dict[str, dict]] = defaultdict(dict)
    for e in events:
        if e["ph"] in "sf":
            assert e["ph"] not in flows[e["id"]], "a flow id used twice"
            flows[e["id"]][e["ph"]] = e
    assert len(flows) == requests * cross_device_edges(plan)
    for pair in flows.values():
        start, finish = pair["s"], pair["f"]
        assert finish["bp"] == "e" and start["ts"] <= finish["ts"]
        assert start["pid"] != finish["pid"]
        for end in (start, finish):  # each end lies inside a slice of its own process
            assert any(s["pid"] == end["pid"] and s["tid"] == end["tid"]
                       and s["ts"] <= end["ts"] <= s["ts"] + s["dur"] for s in slices)
    counters = [e for e in events if e["ph"] == "C"]
    assert {e["name"] for e in counters} >= {"memory"}
    assert all(all(isinstance(v, int | float) for v in e["args"].values()) for e in counters)
    json.dumps(doc)  # plain JSON


def test_prism_run_writes_a_trace_perfetto_can_open(tmp_path: Path, capsys):
    path = tmp_path / "run.json"
    requests = int(np.random.default_rng().integers(6, 15))
    assert main(["run", str(CNN), "--devices", "cpu:2,sim:1", "--requests", str(requests),
                 "--concurrency", "3", "--trace", str(path)]) == 0
    assert "trace:" in capsys.readouterr().out
    with HostManager(parse_devices("cpu:2,sim:1")) as host:
        plan = host.add_network("cnn", CNN)  # the same plan: partitioning is deterministic
    doc = json.loads(path.read_text())
    check_format(doc, plan, requests)
    assert any(e["ph"] == "C" and e["name"] == "queue" for e in doc["traceEvents"])


def test_a_trace_of_nothing_is_still_a_trace():
    with HostManager(parse_devices("cpu:1")) as host:
        trace = ChromeTrace(host.bus)
        doc = trace.trace({})
        trace.close()
    assert doc["traceEvents"] == [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0,
                                   "args": {"name": "host"}}]


def test_the_server_takes_a_trace_between_start_and_stop():
    rng = np.random.default_rng()
    with serving("cpu:2", files=(("cnn", CNN),)) as (url, state):
        assert call(f"{url}/v2/prism/trace/stop", "POST")[0] == 400
        assert call(f"{url}/v2/prism/trace/start", "POST")[0] == 200
        n = int(rng.integers(3, 8))
        for _ in range(n):
            x = rng.standard_normal((1, 3, 32, 32), np.float32)
            status, _, body = call(f"{url}/v2/models/cnn/infer", "POST", {"inputs": [
                {"name": "image", "shape": [1, 3, 32, 32], "datatype": "FP32",
                 "data": x.ravel().tolist()}]})
            assert status == 200, body
        status, _, body = call(f"{url}/v2/prism/trace/stop", "POST")
        assert status == 200
        doc = json.loads(body)
        plan = state.host.plan("cnn")
        slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        assert len(slices) == n * len(plan.partitions)
        flows = [e for e in doc["traceEvents"] if e["ph"] == "s"]
        assert len(flows) == n * cross_device_edges(plan)
        assert call(f"{url}/v2/prism/trace/stop", "POST")[0] == 400  # stopped
