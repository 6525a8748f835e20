"""Vega-Lite specs for the live page's charts, written as plain dicts.

st.line_chart and st.bar_chart build their specs through Altair, whose schema validation
costs tens of milliseconds a chart; the dashboard redraws every second in the process
that serves requests, so it hands Streamlit a finished spec instead.
"""

from __future__ import annotations

from typing import Any

Spec = dict[str, Any]
PERCENTILE_COLORS = {"p50": "#4e79a7", "p95": "#f28e2b", "p99": "#e15759"}


def line(x: str, y: str, y_title: str, *, whole_numbers: bool = False) -> Spec:
    """A line over the last minute: `x` in seconds before now, `y` the figure (drawn as
    steps when it counts whole things, so it never dips between samples)."""
    y_axis: Spec = {"title": y_title, "tickMinStep": 1, "format": "d"} if whole_numbers \
        else {"title": y_title}
    return {
        "mark": {"type": "line", "interpolate": "step-after" if whole_numbers else "linear"},
        "encoding": {
            "x": {"field": x, "type": "quantitative", "title": "seconds ago",
                  "axis": {"format": "d"}},
            "y": {"field": y, "type": "quantitative", "axis": y_axis,
                  "scale": {"zero": True}},
            "tooltip": [{"field": x, "type": "quantitative"},
                        {"field": y, "type": "quantitative"}],
        },
    }


def grouped_bars(category: str, group: str, value: str, value_title: str) -> Spec:
    """Horizontal bars: one row per `category`, one bar per `group` within it."""
    groups = list(PERCENTILE_COLORS)
    return {
        "height": {"step": 13},  # per bar: a partition's three bars take 39 px
        "mark": {"type": "bar", "cornerRadiusEnd": 2},
        "encoding": {
            "y": {"field": category, "type": "nominal", "title": None, "sort": None},
            "yOffset": {"field": group, "type": "nominal", "sort": groups},
            "x": {"field": value, "type": "quantitative", "title": value_title},
            "color": {"field": group, "type": "nominal", "title": None,
                      "scale": {"domain": groups, "range": list(PERCENTILE_COLORS.values())},
                      "legend": {"orient": "top"}},
            "tooltip": [{"field": category, "type": "nominal"},
                        {"field": group, "type": "nominal"},
                        {"field": value, "type": "quantitative", "format": ".3f"}],
        },
    }
