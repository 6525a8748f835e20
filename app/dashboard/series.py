"""Figures over time in one-second bins ending now, as both dashboards chart them."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

WINDOW = 60  # seconds shown


@dataclass(frozen=True)
class Series:
    """One figure per second, oldest first; the last is the second ending now."""

    values: tuple[float, ...]

    @property
    def seconds_ago(self) -> tuple[int, ...]:
        return tuple(range(1 - len(self.values), 1))

    @property
    def peak(self) -> float:
        return max(self.values, default=0.0)


def binned(points: Iterable[tuple[float, float]], now: float, *,
           reduce: Callable[[Sequence[float]], float] = max, seconds: int = WINDOW) -> Series:
    """Points (time, value) in `seconds` one-second bins ending at `now`, each bin reduced
    to one figure (the deepest queue, the median latency); a bin with no point carries the
    one before, so a level holds until it is next measured."""
    bins: list[list[float]] = [[] for _ in range(seconds)]
    for ts, value in points:
        i = seconds - 1 - math.floor(now - ts)
        if 0 <= i < seconds:
            bins[i].append(value)
    out, carry = [], 0.0
    for b in bins:
        carry = float(reduce(b)) if b else carry
        out.append(carry)
    return Series(tuple(out))


def padded(counts: Sequence[float], seconds: int = WINDOW) -> Series:
    """Per-second counts already binned up to now (the last `seconds` of them), zero-padded
    in front to a full window."""
    tail = [float(c) for c in counts[-seconds:]]
    return Series(tuple([0.0] * (seconds - len(tail)) + tail))
