"""A training run in both dashboards: the view model built from its train.* events, the
terminal dashboard's training panel (loss, per-device step timeline with its bubbles) and
the browser dashboard's training section, each on a real run."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from app.dashboard import DashboardModel, TrainingTracker
from app.sources import ENV_PREFIX, SourceSettings
from app.train_run import TrainingRun, TrainSettings
from app.train_source import TrainingSource
from runtime.observe.events import EventBus
from tests.support.train_models import mlp
from ui_tui import PrismApp
from ui_tui.keys import key_enabled
from ui_tui.widgets.training import TrainingPanel, timeline_text

MICRO, EPOCHS = 4, 2


@pytest.fixture
def settings(tmp_path: Path) -> TrainSettings:
    rng = np.random.default_rng()
    onnx.save(mlp(rng, sizes=(6, 8, 8, 8, 3)), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((64, 6)).astype(np.float32),
             y=rng.integers(0, 3, 64))
    return TrainSettings(model=str(tmp_path / "m.onnx"), data=str(tmp_path / "d.npz"),
                         labels="y", devices="sim:3:flops=50M", batch_size=16,
                         micro_batches=MICRO, epochs=EPOCHS, schedule="gpipe",
                         output=str(tmp_path / "trained.onnx"))


def test_the_view_model_follows_a_run(settings: TrainSettings) -> None:
    bus = EventBus()
    seen = bus.subscribe(maxlen=100_000)
    run = TrainingRun(settings, bus)
    try:
        result = run.run_here()
    finally:
        run.close()
    tracker = TrainingTracker()
    tracker.feed(seen.drain())
    view = tracker.view()
    assert view is not None and view.finished and not view.error
    stages = result.stages
    assert view.devices == result.devices and len(view.devices) == stages == 3
    assert view.steps_done == view.steps == result.steps == EPOCHS * 4
    assert len(view.losses) == result.steps
    assert [e for e, _ in view.epoch_losses] == [1, 2]
    assert view.epoch_losses[-1][1] == pytest.approx(result.epochs[-1].loss)
    assert len(view.timeline) == stages * (2 * MICRO + 1)
    assert {(b.phase, b.micro_batch) for b in view.timeline if b.device == "sim0"} == {
        *(("forward", m) for m in range(MICRO)), *(("backward", m) for m in range(MICRO)),
        ("update", -1)}
    assert view.last is not None and view.last.seconds >= view.last.ideal_seconds * 0.5
    rows = timeline_text(view, {}, 80).plain.splitlines()
    assert [r.split()[0] for r in rows] == list(view.devices)
    assert all("U" in r for r in rows)
    # GPipe over 3 stages: the last stage idles while the first fills the pipe
    assert rows[-1].split(" ", 1)[1].lstrip().startswith("·") or "·" in rows[-1]
    assert (Path(settings.output or "")).is_file()


def test_the_terminal_dashboard_shows_the_run(settings: TrainSettings) -> None:
    run = TrainingRun(settings)
    app = PrismApp(DashboardModel(TrainingSource(run)))

    async def main() -> None:
        async with app.run_test(size=(100, 30)) as pilot:
            deadline = time.monotonic() + 60
            while not (app.view and app.view.training and app.view.training.finished):
                assert time.monotonic() < deadline, "the run did not finish"
                await pilot.pause(0.1)
            await pilot.pause(0.3)
            screen = app.dashboard
            assert screen.has_class("training")
            panel = screen.query_one(TrainingPanel)
            assert panel.display and panel.region.height > 0
            assert not screen.query_one("#bottom").display
            headline = str(screen.query_one("#training-headline").render())
            assert headline.startswith("done epoch 2/2") and "bubble" in headline
            assert "training" in str(screen.query_one("#status").render())
            timeline = str(screen.query_one("#timeline").render())
            assert all(d in timeline for d in ("sim0", "sim1", "sim2"))
            assert not key_enabled("pause", app.key_state())
            await pilot.press("q")

    try:
        asyncio.run(main())
    finally:
        app.model.close()
    assert not any(t.name == "prism-train" for t in threading.enumerate())


def test_the_browser_dashboard_shows_the_run(settings: TrainSettings,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from ui_web.cached import shared_live

    for key in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(key)
    for key, value in SourceSettings(train=settings.to_json()).to_env({}).items():
        monkeypatch.setenv(key, value)
    app_file = Path(__file__).resolve().parents[2] / "ui_web" / "dashboard.py"
    st.cache_resource.clear()
    try:
        shared = shared_live()
        deadline = time.monotonic() + 60
        while not (shared.view(max_age=0).training and shared.view().training.finished):
            assert time.monotonic() < deadline, "the run did not finish"
            time.sleep(0.1)
        at = AppTest.from_file(str(app_file), default_timeout=60).run()
        assert not at.exception, at.exception
        metrics = {m.label: m.value for m in at.metric}
        assert metrics["Epoch"] == "2/2" and metrics["Step"] == "8/8"
        assert float(metrics["Loss"]) == pytest.approx(shared.view().training.last.loss,
                                                       abs=1e-4)
        charts = [e.proto.spec for e in at.get("vega_lite_chart")]
        assert any('"x2"' in c for c in charts)  # the timeline's bars, from and to
        assert "Training" in at.sidebar.info[0].value
    finally:
        st.cache_resource.clear()  # closes the run and its devices
