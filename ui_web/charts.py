"""Vega-Lite specs for the live page's charts, written as plain dicts.

st.line_chart and st.bar_chart build their specs through Altair, whose schema validation
costs tens of milliseconds a chart; the dashboard redraws every second in the process
that serves requests, so it hands Streamlit a finished spec instead.
"""

from __future__ import annotations

from typing import Any

Spec = dict[str, Any]
PERCENTILE_COLORS = {"p50": "#4e79a7", "p95": "#f28e2b", "p99": "#e15759"}


def line(x: str, y: str, y_title: str, *, whole_numbers: bool = False,
         x_title: str = "seconds ago") -> Spec:
    """A line over the last minute: `x` in seconds before now, `y` the figure (drawn as
    steps when it counts whole things, so it never dips between samples)."""
    y_axis: Spec = {"title": y_title, "tickMinStep": 1, "format": "d"} if whole_numbers \
        else {"title": y_title}
    return {
        "mark": {"type": "line", "interpolate": "step-after" if whole_numbers else "linear"},
        "encoding": {
            "x": {"field": x, "type": "quantitative", "title": x_title,
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


PHASE_COLORS = {"forward": "#4e79a7", "backward": "#f28e2b", "update": "#9e9e9e"}


def timeline(devices: list[str]) -> Spec:
    """A Gantt chart: one row per device, a bar per run from `from ms` to `to ms`, coloured
    by phase and labelled with the micro-batch; the gaps between bars are the bubble."""
    phases = list(PHASE_COLORS)
    return {
        "layer": [
            {"mark": {"type": "bar", "cornerRadius": 2, "height": {"band": 0.8}},
             "encoding": {"color": {"field": "phase", "type": "nominal", "title": None,
                                    "scale": {"domain": phases,
                                              "range": list(PHASE_COLORS.values())},
                                    "legend": {"orient": "top"}}}},
            {"mark": {"type": "text", "align": "left", "dx": 2, "color": "white",
                      "fontSize": 9},
             "encoding": {"text": {"field": "run"}}},
        ],
        "encoding": {
            "y": {"field": "device", "type": "nominal", "title": None, "sort": devices},
            "x": {"field": "from ms", "type": "quantitative", "title": "ms into the step"},
            "x2": {"field": "to ms"},
            "tooltip": [{"field": "device"}, {"field": "run"},
                        {"field": "from ms", "format": ".2f"},
                        {"field": "to ms", "format": ".2f"}],
        },
    }
