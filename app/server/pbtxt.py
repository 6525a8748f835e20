"""Protocol-buffer text format (Triton's `config.pbtxt`) read without its schema.

Fields become dict keys; a field given more than once, or as `[a, b]`, becomes a list;
`{...}` and `<...>` are messages; quoted strings, numbers, true/false and enum names are
scalars. That is enough to read the few fields Prism takes from a model's configuration.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from runtime.errors import PrismError

_SKIP = re.compile(r"(?:\s+|#[^\n]*)*")  # blanks and comments
_TOKEN = re.compile(r"""("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'"""  # quoted strings
                    r"""|[{}<>\[\]:,;]|[^\s{}<>\[\]:,;"'#]+)""")  # punctuation, words
_CLOSE = {"{": "}", "<": ">"}


class ConfigError(PrismError):
    """A config.pbtxt that cannot be read."""


def parse(text: str) -> dict[str, Any]:
    tokens, pos = [], _SKIP.match(text).end()  # type: ignore[union-attr]
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ConfigError(f"config.pbtxt: cannot read from {text[pos:pos + 20]!r}")
        tokens.append(match.group())
        pos = _SKIP.match(text, match.end()).end()  # type: ignore[union-attr]
    tokens.reverse()  # read with pop()
    return _message(tokens, None)


def _message(tokens: list[str], end: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    while tokens and tokens[-1] != end:
        key = tokens.pop()
        if not re.fullmatch(r"[A-Za-z_][\w.]*", key):
            raise ConfigError(f"config.pbtxt: expected a field name, got {key!r}")
        if tokens and tokens[-1] == ":":
            tokens.pop()
        value = _value(tokens)
        if key in out:
            before = out[key] if isinstance(out[key], list) else [out[key]]
            value = before + (value if isinstance(value, list) else [value])
        out[key] = value
        if tokens and tokens[-1] in ",;":
            tokens.pop()
    if end is not None:
        if not tokens:
            raise ConfigError(f"config.pbtxt: a message is missing its closing {end!r}")
        tokens.pop()
    return out


def _value(tokens: list[str]) -> Any:
    if not tokens:
        raise ConfigError("config.pbtxt: a field is missing its value")
    token = tokens.pop()
    if token in _CLOSE:
        return _message(tokens, _CLOSE[token])
    if token == "[":
        items = []
        while tokens and tokens[-1] != "]":
            items.append(_value(tokens))
            if tokens and tokens[-1] == ",":
                tokens.pop()
        if not tokens:
            raise ConfigError("config.pbtxt: a list is missing its closing ']'")
        tokens.pop()
        return items
    if token[0] in "\"'":
        try:
            return ast.literal_eval(token)
        except (ValueError, SyntaxError):
            raise ConfigError(f"config.pbtxt: cannot read the string {token[:40]}") from None
    if token in ("true", "false", "True", "False"):
        return token.lower() == "true"
    for kind in (int, float):
        try:
            return kind(token)
        except ValueError:
            pass
    return token  # an enum name
