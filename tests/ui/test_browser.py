"""`prism web` in a real browser: Debian's Chromium, headless, driven by Playwright.

Starts the server on a free loopback port, waits for the plan's SVG, checks the latency
figures move, uploads a broken model and sees the error while the figures keep moving,
and saves screenshots at 1280x800 to tests/artifacts/. No browser is downloaded.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.web_cmd import free_port

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
VIEWPORT = {"width": 1280, "height": 800}
READY_WITHIN = 60.0  # bound on waiting for `prism web` to draw a plan (a bound, not a bar)
SVG = '[data-testid="stGraphVizChart"] svg'
METRIC = '[data-testid="stMetricValue"]'

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (make test)"),
]


class Server:
    """`prism web` as a child process, its output read on a thread."""

    def __init__(self, port: int):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "web", "--port", str(port)], cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)

    def url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if match := re.search(r"Prism dashboard: (http://127\.0\.0\.1:\d+)", line):
                return match.group(1)
        raise AssertionError("prism web printed no URL:\n" + "".join(self.output))

    def stop(self, timeout: float = 15.0) -> int:
        """Ctrl-C, as a user would; a bounded wait, then kill."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        return self.proc.returncode


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Server, str]]:
    srv = Server(free_port())
    try:
        yield srv, srv.url(timeout=READY_WITHIN)
    finally:
        code = srv.stop()
        assert code == 0, "".join(srv.output)


@pytest.fixture(scope="module")
def page(server):
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport=VIEWPORT)
        finally:
            browser.close()


def _figures(page) -> list[str]:
    return page.locator(METRIC).all_inner_texts()


def _latency(page) -> list[str]:
    return _figures(page)[1:4]  # p50, p95, p99


def _wait_for_change(read, before: list[str], timeout: float = 8.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = read()
        if now != before:
            return now
    raise AssertionError(f"figures did not change in {timeout:.0f} s: {before}")


def test_dashboard_in_chromium(server, page) -> None:
    _, url = server
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(url)
    page.wait_for_selector(SVG, timeout=READY_WITHIN * 1000)
    page.wait_for_function(
        f"document.querySelectorAll('{METRIC}').length >= 5", timeout=10_000)
    assert page.locator(f"{SVG} g.cluster").count() >= 2  # a cluster per partition
    assert "copy " in page.locator(SVG).first.text_content()

    first = _latency(page)
    assert all(re.fullmatch(r"[\d.]+ (us|ms|s)", v) for v in first), first
    _wait_for_change(lambda: _latency(page), first)
    page.screenshot(path=ARTIFACTS / "web-live.png")

    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(
        files=[{"name": "broken.onnx", "mimeType": "application/octet-stream",
                "buffer": b"definitely not an onnx model"}])
    page.get_by_text("broken.onnx").wait_for(timeout=10_000)
    page.get_by_role("button", name="Apply").click()
    alert = page.locator('[data-testid="stAlert"]', has_text="Apply failed")
    alert.wait_for(timeout=20_000)
    assert "broken.onnx is not an ONNX model" in alert.inner_text()

    page.wait_for_function(  # the page re-runs after the failed apply: its figures again
        f"document.querySelectorAll('{METRIC}').length >= 5", timeout=10_000)
    requests = _figures(page)[4]
    after = _wait_for_change(lambda: _latency(page), _latency(page))
    assert int(_figures(page)[4].replace(",", "")) > int(requests.replace(",", ""))
    assert alert.is_visible() and after
    page.screenshot(path=ARTIFACTS / "web-error.png")

    page.get_by_text("Partition stepper").click()
    page.get_by_text("Only this step's nodes").wait_for(timeout=10_000)
    page.wait_for_selector(SVG, timeout=10_000)
    shown = page.get_by_text(re.compile(r"Step \d+ of \d+"))
    number, count = map(int, re.findall(r"\d+", shown.inner_text())[:2])
    assert number == count  # opens on the finished plan
    page.get_by_role("button", name="Previous").click()
    page.get_by_text(f"Step {count - 1} of {count}").wait_for(timeout=10_000)
    page.wait_for_timeout(500)  # let the graph redraw
    page.screenshot(path=ARTIFACTS / "web-stepper.png")
