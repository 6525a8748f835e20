"""The process-wide SharedLive, made once per server process with st.cache_resource."""

from __future__ import annotations

import atexit
import os

import streamlit as st

from app.live import LiveRuntime
from app.web_cmd import ENV_DEVICES, ENV_MODEL
from ui_web.shared import SharedLive


def _release(shared: SharedLive) -> None:
    shared.close()


@st.cache_resource(show_spinner="Starting the runtime…", on_release=_release)
def shared_live() -> SharedLive:
    """The embedded runtime under live load; model and devices from `prism web`."""
    live = LiveRuntime(model=os.environ.get(ENV_MODEL) or None,
                       devices=os.environ.get(ENV_DEVICES) or None)
    shared = SharedLive(live)
    atexit.register(shared.close)  # the server stopping never leaves a host half-open
    return shared
