"""Sidebar controls: model (a sample, or an uploaded model or bundle), devices, mode,
load, pause, Apply.

The form's widgets change nothing until Apply, which re-partitions and re-provisions the
running host in place; its outcome is kept in session state for the page to show.
Pause acts at once. A replay has no controls.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from app.dashboard import LoadSetting, Status
from app.dashboard.source import MODES
from app.defaults import sample_models
from ui_web.shared import Applied, SharedLive

RESULT_KEY = "apply_result"
REPLAN_KEY = "replan_result"  # shown beside its button: a fragment rerun does not reach the top
UPLOAD_GEN = "upload_generation"
DEFAULT_LOAD = LoadSetting(rate=100.0)
LOAD_KINDS = ("rate", "clients")


def _model_choices(status: Status) -> dict[str, Path]:
    choices = sample_models()
    current = Path(status.model_path)
    if current.resolve() not in {p.resolve() for p in choices.values()}:
        choices = {f"{current.name} (current)": current, **choices}
    return choices


def _defaults(status: Status, choices: dict[str, Path]) -> None:
    """Start this tab's form from what the runtime runs now."""
    load = status.load.setting or DEFAULT_LOAD
    model = Path(status.model_path).resolve()
    current = next((k for k, p in choices.items() if p.resolve() == model), next(iter(choices)))
    for key, value in (("ctl_model", current), ("ctl_devices", status.devices),
                       ("ctl_mode", status.mode if status.mode in MODES else MODES[0]),
                       ("ctl_load_kind", LOAD_KINDS[load.rate is None]),
                       ("ctl_rate", float(load.rate or 100.0)),
                       ("ctl_clients", int(load.clients or 4)), (UPLOAD_GEN, 0)):
        st.session_state.setdefault(key, value)
    if st.session_state["ctl_model"] not in choices:
        st.session_state["ctl_model"] = current


def _apply(shared: SharedLive, choices: dict[str, Path], upload) -> Applied:
    if upload is not None:
        model = shared.save_upload(upload.name, upload.getvalue())
    else:
        model = choices[st.session_state["ctl_model"]]
    if st.session_state["ctl_load_kind"] == LOAD_KINDS[0]:
        load = LoadSetting(rate=float(st.session_state["ctl_rate"]))
    else:
        load = LoadSetting(clients=int(st.session_state["ctl_clients"]))
    with st.spinner("Re-partitioning…"):
        result = shared.apply(model, st.session_state["ctl_devices"],
                              st.session_state["ctl_mode"], load)
    if upload is not None:
        st.session_state[UPLOAD_GEN] += 1  # empty the uploader for next time
    return result


def render(shared: SharedLive) -> None:
    status = shared.view().status
    if not status.changeable:
        with st.sidebar:
            st.header("Prism", anchor=False)
            if status.training:
                st.info(f"Training `{status.model}` on `{status.devices}`: a training run "
                        "trains as started.", icon=":material/model_training:")
            else:
                st.info(f"Replaying `{Path(status.replay or '').name}`: a recording cannot "
                        "be changed.", icon=":material/replay:")
        return
    choices = _model_choices(status)
    _defaults(status, choices)
    with st.sidebar:
        st.header("Prism", anchor=False)
        paused = status.load.paused
        st.button("Resume load" if paused else "Pause load", key="ctl_pause",
                  icon=":material/play_arrow:" if paused else ":material/pause:",
                  on_click=shared.toggle_pause, width="stretch")
        with st.form("controls", border=False):
            st.selectbox("Model", list(choices), key="ctl_model")
            upload = st.file_uploader(
                "…or upload an .onnx or a .prism bundle", type=["onnx", "prism"],
                key=f"ctl_upload_{st.session_state[UPLOAD_GEN]}",
                help="used instead of the model above when given")
            st.text_input("Devices", key="ctl_devices",
                          help="e.g. cpu:2,sim:2:mem=256MB or cpu:4")
            st.radio("Partition mode", MODES, key="ctl_mode", horizontal=True)
            st.radio("Load", LOAD_KINDS, key="ctl_load_kind", horizontal=True,
                     help="rate: requests arrive at random at this many per second (open "
                          "loop); clients: each sends its next request when answered")
            rate_col, clients_col = st.columns(2)
            rate_col.number_input("req/s", min_value=1.0, max_value=5000.0, step=10.0,
                                  key="ctl_rate")
            clients_col.number_input("clients", min_value=1, max_value=64, step=1,
                                     key="ctl_clients")
            applied = st.form_submit_button("Apply", type="primary", width="stretch")
        if applied:
            st.session_state[RESULT_KEY] = _apply(shared, choices, upload)


def show_result(key: str = RESULT_KEY) -> None:
    """The last Apply's (or re-plan's) outcome where it is kept: an error stays until the
    next one, a success shows once."""
    result: Applied | None = st.session_state.get(key)
    if result is None:
        return
    if result.error:
        st.error(f"**Apply failed; {result.message}.** {result.error}",
                 icon=":material/error:")
    else:
        st.session_state.pop(key)
        st.success(result.message, icon=":material/check_circle:")
