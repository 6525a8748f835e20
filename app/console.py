"""A Rich console that prints text as written.

Plans and errors hold names Prism did not write (nodes and tensors from a model, devices
from a TOML file, paths): `[batch, 256]` or `[/x]` must not be read as markup, nor
`:ok:` as an emoji code. Styled words are `rich.text.Text`, never markup strings.
"""

from __future__ import annotations

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

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


def progress_on(console: Console, *more: ProgressColumn, quiet: bool = False,
                 transient: bool = True, description: str = "{task.description}") -> Progress:
    """A bar of (description, bar, done/total, `more`, elapsed) on `console`, drawn only on
    a terminal: elsewhere (a pipe, a log) rich leaves an empty line where it was, above
    the CLI's one error line."""
    return Progress(TextColumn(description, markup=False), BarColumn(), MofNCompleteColumn(),
                    *more, TimeElapsedColumn(), console=console, transient=transient,
                    disable=quiet or not console.is_terminal)
