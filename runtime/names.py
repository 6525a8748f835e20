"""Unique names for what Prism adds to a model's graph (node names, tensor names)."""

from __future__ import annotations


def fresh_name(base: str, taken: set[str]) -> str:
    """`base`, else `base_1`, `base_2`, ...: the first not in `taken`, which it joins."""
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name
