"""The live page: plan DAG, devices, queue and throughput, per-partition latency, errors.

Everything below the title is one fragment that reruns about once a second; it polls the
shared runtime (never a runtime thread) and redraws from the LiveView.
"""

from __future__ import annotations

import html

import streamlit as st

from app.live import LiveView
from runtime.graph import Graph
from runtime.partition import Plan
from runtime.units import human_seconds
from ui_web import charts, frames, plan_dot
from ui_web.cached import shared_live

REFRESH_SECONDS = 1.0
DAG_HEIGHT = 470


def legend(plan: Plan) -> None:
    items = " ".join(
        f'<span style="white-space:nowrap;margin-right:0.8em">'
        f'<span style="display:inline-block;width:0.8em;height:0.8em;background:{color};'
        f'border-radius:2px;margin-right:0.3em"></span>{html.escape(name)}</span>'
        for name, color in plan.colors().items())
    copy = (f'<span style="white-space:nowrap;color:{plan_dot.COPY_COLOR}">'
            "- - ▸ copy between devices</span>")
    st.markdown(f'<div style="font-size:0.85em">{items} {copy}</div>', unsafe_allow_html=True)


def status_line(view: LiveView) -> str:
    n = len(view.plan.partitions) if view.plan else 0
    state = "paused" if view.paused else "running"
    return (f"**{view.network}** · {view.mode} · {n} partition{'s' * (n != 1)} on "
            f"`{view.devices_spec}` · load {view.load} ({state})")


def headline(view: LiveView) -> None:
    m = view.metrics
    cols = st.columns(5)
    cols[0].metric("Throughput", f"{m.throughput:.0f} req/s")
    cols[1].metric("Latency p50", human_seconds(m.latency.p50))
    cols[2].metric("Latency p95", human_seconds(m.latency.p95))
    cols[3].metric("Latency p99", human_seconds(m.latency.p99))
    cols[4].metric("Requests", f"{m.requests_finished:,}",
                   delta=f"{m.requests_failed} failed" if m.requests_failed else None,
                   delta_color="inverse")


def dag(view: LiveView, graph: Graph | None) -> None:
    if view.plan is None or graph is None:
        st.info("No plan yet.")
        return
    by_partition = st.toggle("Partition-level view", key="dag_partitions",
                             help="one box per partition instead of one per node")
    draw = plan_dot.partition_dot if by_partition else plan_dot.node_dot
    text = draw(view.plan, graph)
    with st.container(height=DAG_HEIGHT, border=True):
        st.graphviz_chart(text, width="content")
    legend(view.plan)


def devices(view: LiveView) -> None:
    st.dataframe(
        frames.devices_frame(view), hide_index=True, width="stretch",
        column_config={
            "device": st.column_config.TextColumn("Device", width=58),
            "memory": st.column_config.ProgressColumn(
                "Memory", min_value=0, max_value=100, format="%.1f%%", width=76),
            "used": st.column_config.TextColumn("Used / total", width=108),
            "utilisation": st.column_config.ProgressColumn(
                "Busy", min_value=0, max_value=100, format="%.0f%%", width=66,
                help="share of the last minute the device was running a partition"),
        })


def latency(view: LiveView) -> None:
    parts = frames.partitions_frame(view)
    if parts.empty:
        st.caption("No partition has run yet.")
        return
    st.vega_lite_chart(frames.latency_long(parts),
                       charts.grouped_bars("partition", "percentile", "ms", "run time (ms)"),
                       width="stretch")
    st.dataframe(parts, hide_index=True, width="stretch", column_config={
        name: st.column_config.NumberColumn(name, format="%.3f")
        for name in ("p50 ms", "p95 ms", "p99 ms", "wait ms", "est ms")})


def errors(view: LiveView) -> None:
    if not view.errors:
        st.caption("No errors.")
        return
    st.error("\n\n".join(f"`{e}`" for e in view.errors[-10:]))


@st.fragment(run_every=REFRESH_SECONDS)
def live() -> None:
    view, graph = shared_live().current()
    st.markdown(status_line(view))
    headline(view)
    left, right = st.columns([3, 2], gap="medium")
    with left:
        st.subheader("Plan", anchor=False)
        dag(view, graph)
    with right:
        st.subheader("Devices", anchor=False)
        devices(view)
        st.subheader("Queue depth", anchor=False)
        st.vega_lite_chart(frames.queue_depth_series(view),
                           charts.line("seconds ago", "queued", "queued", whole_numbers=True),
                           width="stretch", height=150)
        st.subheader("Throughput", anchor=False)
        st.vega_lite_chart(frames.throughput_series(view),
                           charts.line("seconds ago", "req/s", "req/s"),
                           width="stretch", height=150)
    st.subheader("Per-partition latency", anchor=False)
    latency(view)
    st.subheader("Errors", anchor=False)
    errors(view)


def render() -> None:
    live()
