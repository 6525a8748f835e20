"""A Rich console that prints text as written.

Plans and errors hold names Prism did not write (nodes and tensors from a model, devices
from a TOML file, paths): `[batch, 256]` or `[/x]` must not be read as markup, nor
`:ok:` as an emoji code. Styled words are `rich.text.Text`, never markup strings.
"""

from __future__ import annotations

from rich.console import Console, RenderableType
from rich.measure import Measurement

UNBOUNDED = 100_000  # columns to measure a renderable's natural width in


def plain_console(*, stderr: bool = False, width: int | None = None) -> Console:
    return Console(stderr=stderr, width=width, markup=False, emoji=False, highlight=False)


def fit_width(console: Console, renderable: RenderableType) -> None:
    """Widen a console that is not a terminal (a pipe, a file, a container's log) to what
    `renderable` needs, so a table is not cut to the 80 columns Rich assumes there."""
    if console.is_terminal:
        return
    need = Measurement.get(console, console.options.update_width(UNBOUNDED), renderable)
    console.width = max(console.width, need.maximum)
