"""`prism web [MODEL] [--devices SPEC] [--port P] [--connect URL]`: the Streamlit dashboard
on loopback, on an embedded runtime or attached to a running server.

Starts `streamlit run ui_web/dashboard.py` headless on 127.0.0.1, hands the model and devices
(or a recording to replay) to the app through the environment (`app.sources`), waits until
the server answers, prints the URL and stays in the foreground until Ctrl-C (or SIGTERM),
which stops the server cleanly.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import FrameType

from app.defaults import DEFAULT_MODEL
from app.given_inputs import inputs_for
from app.sources import SourceSettings
from runtime.devices import parse_devices
from runtime.errors import PrismError

HOST = "127.0.0.1"
APP_SCRIPT = Path(__file__).resolve().parent.parent / "ui_web" / "dashboard.py"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def streamlit_command(port: int) -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(APP_SCRIPT),
            "--server.address", HOST, "--server.port", str(port),
            "--server.headless", "true", "--server.fileWatcherType", "none",
            "--server.runOnSave", "false", "--browser.gatherUsageStats", "false",
            "--client.toolbarMode", "minimal", "--theme.base", "light",
            "--logger.level", "warning"]


def wait_until_up(url: str, proc: subprocess.Popen[bytes], timeout: float = START_TIMEOUT) -> None:
    """Until the server's health check answers; raises if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PrismError(f"the Streamlit server exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=1.0) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise PrismError(f"the Streamlit server did not answer at {url} within {timeout:.0f} s")


def stop(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> None:
    """SIGINT (what Ctrl-C sends), then SIGTERM, then SIGKILL, each with a bounded wait."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            continue


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _settings(args: argparse.Namespace) -> SourceSettings:
    model = None
    if args.model:
        path = Path(args.model).expanduser().resolve()
        if not path.is_file():
            raise PrismError(f"model {args.model} does not exist")
        model = str(path)
    if args.devices:
        parse_devices(args.devices)  # a bad spec fails here, as one line
    replay = getattr(args, "replay", None)  # `prism web --replay` once the CLI takes it
    inputs = str(Path(args.inputs).resolve()) if args.inputs else None
    settings = SourceSettings(model, args.devices,
                              replay=str(Path(replay).resolve()) if replay else None,
                              connect=args.connect, token=args.token,
                              remap=",".join(args.remap) or None, inputs=inputs,
                              bind=",".join(args.bind) or None)
    if settings.connect is not None:
        settings.open().close()  # an unreachable server fails here, as one line
    if inputs is not None:  # feeds that do not fit fail here, as one line
        inputs_for(model or DEFAULT_MODEL, inputs)
    return settings


def run(args: argparse.Namespace) -> int:
    return serve(_settings(args).to_env(os.environ), args.port)


def serve(env: dict[str, str], port: int = 0) -> int:
    """Run the dashboard with `env` (its source's settings) until Ctrl-C or SIGTERM."""
    port = port or free_port()
    url = f"http://{HOST}:{port}"
    proc = subprocess.Popen(streamlit_command(port), env=env)
    # Ctrl-C even when started in the background, where SIGINT may come in ignored
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        wait_until_up(url, proc)
        print(f"Prism dashboard: {url}  (Ctrl-C stops it)", flush=True)
        return proc.wait()
    except KeyboardInterrupt:
        print("prism web: stopping", flush=True)
        return 0
    finally:
        stop(proc)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
