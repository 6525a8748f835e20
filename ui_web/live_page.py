"""The live page: plan DAG, devices, queue, throughput and latency, per-partition latency,
errors; for a network from a bundle, its schedule table.

Everything below the title is one fragment that reruns about once a second; it polls the
shared view model (never a runtime thread) and lays out the DashboardView.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path

import streamlit as st

from app.dashboard import DashboardView
from runtime.partition.dot import COPY
from runtime.units import human_seconds
from ui_web import charts, frames, sidebar
from ui_web.cached import shared_live

REFRESH_SECONDS = 1.0
DAG_HEIGHT = 470
# Nodes past which a plan is drawn a box per partition (and a step its own nodes) unless
# asked: the browser lays every node out again as it redraws, ~15 s for 1,600 of them.
NODE_VIEW_LIMIT = 300
CHART_HEIGHT = 150


def legend(colors: Mapping[str, str]) -> None:
    items = " ".join(
        f'<span style="white-space:nowrap;margin-right:0.8em">'
        f'<span style="display:inline-block;width:0.8em;height:0.8em;background:{color};'
        f'border-radius:2px;margin-right:0.3em"></span>{html.escape(name)}</span>'
        for name, color in colors.items())
    copy = f'<span style="white-space:nowrap;color:{COPY}">- - ▸ copy between devices</span>'
    st.markdown(f'<div style="font-size:0.85em">{items} {copy}</div>', unsafe_allow_html=True)


def status_line(view: DashboardView) -> str:
    s = view.status
    n = len(view.plan.partitions) if view.plan else 0
    if s.replay is not None:
        load = f"replay of `{Path(s.replay).name}`"
    elif s.training:
        load = "training"
    else:
        load = f"load {s.load.label} ({'paused' if s.load.paused else 'running'})"
    origin = f" · from bundle `{view.bundle.name}`" if view.bundle is not None else ""
    return (f"**{s.model}**{origin} · {s.mode} · {n} partition{'s' * (n != 1)} on "
            f"`{s.devices}` · {load}")


def headline(view: DashboardView) -> None:
    t = view.totals
    cols = st.columns(5)
    cols[0].metric("Throughput", f"{t.throughput:.0f} req/s")
    cols[1].metric("Latency p50", human_seconds(t.latency.p50))
    cols[2].metric("Latency p95", human_seconds(t.latency.p95))
    cols[3].metric("Latency p99", human_seconds(t.latency.p99))
    cols[4].metric("Requests", f"{t.finished:,}",
                   delta=f"{t.failed} failed" if t.failed else None, delta_color="inverse")


def dag(view: DashboardView) -> None:
    if view.drawing is None:
        st.info("No plan yet.")
        return
    by_partition = st.toggle("Partition-level view", key="dag_partitions",
                             value=len(view.drawing.outline.ops) > NODE_VIEW_LIMIT,
                             help="one box per partition instead of one per node")
    text = view.drawing.partition_dot if by_partition else view.drawing.node_dot
    with st.container(height=DAG_HEIGHT, border=True):
        st.graphviz_chart(text, width="content")
    legend(view.colors)


def devices(view: DashboardView) -> None:
    st.dataframe(
        frames.devices_frame(view.devices), hide_index=True, width="stretch",
        column_config={
            "device": st.column_config.TextColumn("Device", width=58),
            "where": st.column_config.TextColumn("Runs on", width=110,
                                                 help="backend, and the Ray node of a ray device"),
            "memory": st.column_config.ProgressColumn(
                "Memory", min_value=0, max_value=100, format="%.1f%%", width=76),
            "used": st.column_config.TextColumn("Used / total", width=108),
            "utilisation": st.column_config.ProgressColumn(
                "Busy", min_value=0, max_value=100, format="%.0f%%", width=66,
                help="share of the last minute the device was running a partition"),
        })


def over_time(view: DashboardView) -> None:
    """Queue depth, throughput and median latency over the last minute."""
    for title, series, column, scale, whole in (
            ("Queue depth", view.queue, "queued", 1.0, True),
            ("Throughput", view.throughput, "req/s", 1.0, False),
            ("Latency", view.latency, "p50 ms", frames.MS, False)):
        st.subheader(title, anchor=False)
        st.vega_lite_chart(frames.series_frame(series, column, scale),
                           charts.line("seconds ago", column, column, whole_numbers=whole),
                           width="stretch", height=CHART_HEIGHT)


def latency(view: DashboardView) -> None:
    parts = frames.partitions_frame(view.partitions)
    if parts.empty:
        st.caption("No partition has run yet.")
        return
    st.vega_lite_chart(frames.latency_long(parts),
                       charts.grouped_bars("partition", "percentile", "ms", "run time (ms)"),
                       width="stretch")
    st.dataframe(parts, hide_index=True, width="stretch", column_config={
        **{name: st.column_config.NumberColumn(name, format="%.3f")
           for name in ("p50 ms", "p95 ms", "p99 ms", "wait ms", "est ms")},
        "est off %": st.column_config.NumberColumn(
            "est off %", format="%+.0f%%",
            help="the plan's estimate against the measured median")})
    if view.status.changeable and not view.status.bundle:
        st.button("Re-plan from measurements", key="replan_measured",
                  icon=":material/speed:", on_click=_replan_measured,
                  help="plan again with each partition's measured median run time "
                       "(the new plan loads beside this one, then takes the load)")
        sidebar.show_result(sidebar.REPLAN_KEY)


def _replan_measured() -> None:
    st.session_state[sidebar.REPLAN_KEY] = shared_live().replan_measured()


def schedule(view: DashboardView) -> None:
    """A bundle's schedule: compiled ahead of time, not planned at load."""
    if view.bundle is None:
        return
    st.subheader("Schedule", anchor=False)
    st.caption(f"`{view.bundle.name}`, compiled ahead of time with {view.bundle.made_with}: "
               f"one row per partition, in the order a serial run takes")
    st.dataframe(frames.schedule_frame(view.bundle.schedule), hide_index=True, width="stretch")


def training(view: DashboardView) -> None:
    """A training run: where it is, its loss, and the latest step per device."""
    t = view.training
    if t is None:
        return
    st.subheader("Training", anchor=False)
    cols = st.columns(5)
    cols[0].metric("Epoch", f"{t.epoch}/{t.epochs}")
    cols[1].metric("Step", f"{t.steps_done}/{t.steps}")
    last = t.last
    cols[2].metric("Loss", f"{last.loss:.4f}" if last else "–")
    cols[3].metric("Step time", human_seconds(last.seconds) if last else "–",
                   help=f"ideal for {t.schedule}: "
                        f"{human_seconds(last.ideal_seconds) if last else '–'}")
    cols[4].metric("Bubble", f"{last.bubble:.0%}" if last else "–",
                   help="share of the stages' device time left idle in the step")
    if t.error:
        st.error(t.error)
    left, right = st.columns([2, 3], gap="medium")
    with left:
        st.vega_lite_chart(frames.loss_frame(t),
                           charts.line("step", "loss", "loss", x_title="step"),
                           width="stretch", height=CHART_HEIGHT)
    with right:
        st.vega_lite_chart(frames.timeline_frame(t), charts.timeline(list(t.devices)),
                           width="stretch", height=max(CHART_HEIGHT, 40 * len(t.devices)))
    st.caption(f"{len(t.devices)} stages, {t.schedule}, {t.micro_batches} micro-batches: "
               f"each device's forwards and backwards in the latest step; gaps are the "
               f"bubble")


def errors(view: DashboardView) -> None:
    if not view.errors:
        st.caption("No errors.")
        return
    st.error("\n\n".join(f"`{e}`" for e in view.errors[-10:]))


@st.fragment(run_every=REFRESH_SECONDS)
def live() -> None:
    view = shared_live().view()
    st.markdown(status_line(view))
    if view.training is not None:
        training(view)
    else:
        headline(view)
    left, right = st.columns([3, 2], gap="medium")
    with left:
        st.subheader("Plan", anchor=False)
        dag(view)
    with right:
        st.subheader("Devices", anchor=False)
        devices(view)
        over_time(view)
    st.subheader("Per-partition latency", anchor=False)
    latency(view)
    schedule(view)
    st.subheader("Errors", anchor=False)
    errors(view)


def render() -> None:
    live()
