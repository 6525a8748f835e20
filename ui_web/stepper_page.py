"""The partition stepper: walk the partitioner's decisions one at a time.

A slider and previous/next buttons pick a step; the graph shows every node coloured by
the device of the partition it holds after that step, and the step's reason in words.
Each tab has its own Stepper (in session state), rebuilt when the running plan changes.
"""

from __future__ import annotations

import streamlit as st

from app.dashboard import Stepper
from app.dashboard.source import MODES
from ui_web.cached import shared_live
from ui_web.live_page import NODE_VIEW_LIMIT, legend

STEP_KEY = "step_number"  # 1-based, as shown
GRAPH_HEIGHT = 560


def current_stepper(mode: str) -> Stepper:
    """This tab's Stepper for the running network, devices and `mode`."""
    shared = shared_live()
    status = shared.view().status
    key = (status.network, status.devices, mode)
    held = st.session_state.get("stepper")
    if held is None or held[0] != key:
        held = (key, shared.stepper(mode))
        st.session_state["stepper"] = held
        st.session_state[STEP_KEY] = len(held[1])  # start on the finished plan (1-based)
    return held[1]


def _move(by: int, count: int) -> None:
    st.session_state[STEP_KEY] = max(1, min(count, st.session_state.get(STEP_KEY, 1) + by))


def render() -> None:
    st.header("Partition stepper", anchor=False)
    running = shared_live().view().status.mode
    mode = st.segmented_control("Mode", MODES, default=running, key="stepper_mode",
                                help="which partitioner to step through") or running
    stepper = current_stepper(mode)
    count = len(stepper)
    st.session_state[STEP_KEY] = max(1, min(count, st.session_state.get(STEP_KEY, count)))

    number = st.slider("Step", 1, count, key=STEP_KEY)
    prev_col, next_col, text_col = st.columns([1.4, 1.4, 7], vertical_alignment="center")
    prev_col.button("Previous", icon=":material/chevron_left:", key="step_prev",
                    on_click=_move, args=(-1, count), width="stretch", disabled=number <= 1)
    next_col.button("Next", icon=":material/chevron_right:", key="step_next",
                    on_click=_move, args=(1, count), width="stretch", disabled=number >= count)
    view = stepper.go(number - 1)

    total = len(stepper.outline.ops)
    text_col.markdown(f"**Step {number} of {count}** · `{view.step.kind}` · "
                      f"{total - view.unassigned} of {total} nodes assigned · "
                      f"{len(view.legend)} partitions open")
    st.info(view.step.reason, icon=":material/info:")
    only_step = st.toggle("Only this step's nodes and their neighbours", key="step_focus",
                          value=total > NODE_VIEW_LIMIT)
    with st.container(height=GRAPH_HEIGHT, border=True):
        st.graphviz_chart(stepper.dot(focus_only=only_step), width="content")
    legend(stepper.colors)
