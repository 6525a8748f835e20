"""The dashboards' colours: one per device, in the order the plan lists its devices."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from runtime.partition.dot import Ink

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")  # Tableau 10
NO_COLOR = "#808080"  # a device the plan does not name (seen only in a recording's events)
UNASSIGNED = Ink("#9e9e9e", "#dddddd")  # a node no partition holds yet


def device_colors(devices: Iterable[str]) -> dict[str, str]:
    return {d: PALETTE[i % len(PALETTE)] for i, d in enumerate(devices)}


def tint(color: str, amount: float = 0.6) -> str:
    """`color` (#rrggbb) mixed with white: 0 is the colour, 1 is white."""
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(c + (255 - c) * amount):02x}" for c in (r, g, b))


def inks(colors: Mapping[str, str]) -> dict[str, Ink]:
    """Each colour as a Graphviz ink: outlined in the colour, filled with a light tint of it."""
    return {name: Ink(c, tint(c)) for name, c in colors.items()}
