"""A Rich console that prints text as written.

Plans and errors hold names Prism did not write (nodes and tensors from a model, devices
from a TOML file, paths): `[batch, 256]` or `[/x]` must not be read as markup, nor
`:ok:` as an emoji code. Styled words are `rich.text.Text`, never markup strings.
"""

from __future__ import annotations

import os

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

UNBOUNDED = 100_000  # columns of a console with no edge


def plain_console(*, stderr: bool = False, width: int | None = None) -> Console:
    """A console printing text as written. One that is not a terminal (a pipe, a file, a
    container's log) and is given no width (nor COLUMNS) has no edge: Rich would assume
    80 columns there, cutting a plan's cells to "weigh…" and wrapping lines a reader
    greps."""
    console = Console(stderr=stderr, width=width, markup=False, emoji=False, highlight=False)
    if width is None and not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = UNBOUNDED
    return console


def progress_on(console: Console, quiet: bool = False,
                description: str = "{task.description}") -> Progress:
    """A transient bar of (description, bar, done/total, elapsed) on `console`, drawn only
    on a terminal: elsewhere (a pipe, a log) rich leaves an empty line where it was, above
    the CLI's one error line."""
    return Progress(TextColumn(description, markup=False), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=True,
                    disable=quiet or not console.is_terminal)
