"""The process-wide SharedLive, made once per server process with st.cache_resource."""

from __future__ import annotations

import atexit
import os

import streamlit as st

from app.dashboard import DashboardModel
from app.sources import SourceSettings
from ui_web.shared import SharedLive


def _release(shared: SharedLive) -> None:
    shared.close()


@st.cache_resource(show_spinner="Starting the runtime…", on_release=_release)
def _shared(settings: SourceSettings) -> SharedLive:
    shared = SharedLive(DashboardModel(settings.open()))
    atexit.register(shared.close)  # the server stopping never leaves a host half-open
    return shared


def shared_live() -> SharedLive:
    """The dashboard for what `prism web` asked for (an embedded runtime under live load, or
    a recording), one per settings."""
    return _shared(SourceSettings.from_env(os.environ))
