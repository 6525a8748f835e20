"""Small Rich text helpers shared by the widgets: device chips and bars."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.widgets import Static

from runtime.units import human_seconds

BLOCKS = " ▏▎▍▌▋▊▉█"


def ink_on(hex_color: str) -> str:
    """Black or white, whichever reads better on `hex_color`."""
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return "#000000" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#ffffff"


def chip_style(color: str | None, *, bold: bool = False, selected: bool = False) -> Style:
    """Text on a device colour; None (unassigned) is plain, uncoloured text."""
    if color is None:
        return Style(dim=True, bold=bold, underline=selected)
    return Style(color=ink_on(color), bgcolor=color, bold=bold or selected,
                 underline=selected)


def bar(fraction: float, width: int, color: str = "#59a14f", empty: str = "#3a3a3a") -> Text:
    """A horizontal bar `width` cells wide, filled to `fraction` with eighth-cell steps;
    anything above zero shows at least a sliver."""
    fraction = min(1.0, max(0.0, fraction))
    eighths = round(fraction * width * 8)
    if fraction > 0 and eighths == 0:
        eighths = 1
    full, part = divmod(eighths, 8)
    filled = "█" * full + (BLOCKS[part] if part and full < width else "")
    text = Text(filled, style=Style(color=color, bgcolor=empty))
    text.append(" " * (width - len(filled)), style=Style(bgcolor=empty))
    return text


def set_text(widget: Static, text: Text) -> None:
    """Update a Static only when what it shows changes (an update re-lays the screen out)."""
    if widget.content != text:
        widget.update(text)


def seconds(value: float, count: int = 1) -> str:
    """A duration, or a dash when there is nothing measured yet."""
    return human_seconds(value) if count else "–"
