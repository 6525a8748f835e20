"""A short recorded run for the replay tests: the dashboards' embedded runtime in one mode,
recording while a closed loop of two clients sends a few requests."""

from __future__ import annotations

from pathlib import Path

from app.live import LiveRuntime
from app.loadgen import LoadGenerator
from runtime.partition import Plan


def record_run(path: Path, mode: str, requests: int = 20, devices: str | None = None
               ) -> Plan:
    """Record `requests` answered requests to `path`; returns the plan they ran on."""
    live = LiveRuntime(devices=devices, mode=mode, start_load=False, seed=5)
    try:
        live.start_recording(path)
        load = LoadGenerator(live.host, live.network, concurrency=2, requests=requests, seed=1)
        load.start()
        assert load.wait(timeout=60), "the recorded load did not finish"
        load.stop()
        assert load.stats.ok == requests, load.stats.errors
        plan = live.plan()
        assert plan is not None
        return plan
    finally:
        live.close()  # stops the recording: every event is on disk
