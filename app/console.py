"""A Rich console that prints text as written.

Plans and errors hold names Prism did not write (nodes and tensors from a model, devices
from a TOML file, paths): `[batch, 256]` or `[/x]` must not be read as markup, nor
`:ok:` as an emoji code. Styled words are `rich.text.Text`, never markup strings.
"""

from __future__ import annotations

from rich.console import Console


def plain_console(*, stderr: bool = False, width: int | None = None) -> Console:
    return Console(stderr=stderr, width=width, markup=False, emoji=False, highlight=False)
