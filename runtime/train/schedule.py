"""Pipeline schedules: the order each stage runs its micro-batches' forwards and backwards,
and the step time a schedule allows given each program's time.

- `gpipe` (GPipe): every forward, then every backward. A stage holds all M micro-batches'
  activations at once; the idle bubble is (K-1)/(M+K-1) of the step for K stages.
- `1f1b` (PipeDream-flush): stage k runs K-k-1 forwards to fill the pipe, then one forward
  and one backward in turn, then the remaining backwards. The same bubble, but a stage
  holds at most K-k micro-batches' activations.

Each stage ends with its update once its last backward is done. An op also waits for
what it reads: a forward for the forwards before it in the graph, a backward for its own
forward and the backwards after it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from runtime.train.choices import SCHEDULES


@dataclass(frozen=True)
class Op:
    stage: int
    phase: str  # forward, backward, update
    micro: int  # the micro-batch (-1 for the update)

    @property
    def label(self) -> str:
        return f"{self.phase[0].upper()}{self.micro}" if self.micro >= 0 else "U"


def orders(schedule: str, stages: int, micro: int) -> list[list[Op]]:
    """Per stage, its ops in the order it runs them."""
    out = []
    for k in range(stages):
        f = [Op(k, "forward", m) for m in range(micro)]
        b = [Op(k, "backward", m) for m in range(micro)]
        if schedule == "gpipe":
            ops = f + b
        elif schedule == "1f1b":
            warm = min(stages - k - 1, micro)
            ops = f[:warm]
            for i in range(micro - warm):
                ops += [f[warm + i], b[i]]
            ops += b[micro - warm:]
        else:
            raise ValueError(f"unknown schedule {schedule!r}; choose {', '.join(SCHEDULES)}")
        out.append([*ops, Op(k, "update", -1)])
    return out


@dataclass(frozen=True)
class Links:
    """Which stages' forwards feed a stage (`before`), and whose backwards send it
    gradients (`after`)."""

    before: Mapping[int, frozenset[int]]
    after: Mapping[int, frozenset[int]]

    def needs(self, op: Op) -> list[Op]:
        if op.phase == "forward":
            return [Op(j, "forward", op.micro) for j in self.before[op.stage]]
        if op.phase == "backward":
            return [Op(op.stage, "forward", op.micro),
                    *(Op(j, "backward", op.micro) for j in self.after[op.stage])]
        return []


def simulate(plans: Sequence[Sequence[Op]], links: Links, seconds: Callable[[Op], float]
             ) -> float:
    """The step's length with every op taking `seconds(op)` and no time between a
    dependency ending and its reader starting: each stage's device runs its ops in order,
    each as soon as the device is free and what it reads exists."""
    end: dict[Op, float] = {}
    free = [0.0] * len(plans)
    at = [0] * len(plans)
    left = sum(len(p) for p in plans)
    while left:
        progressed = False
        for k, ops in enumerate(plans):
            while at[k] < len(ops):
                op = ops[at[k]]
                needs = links.needs(op)
                if any(n not in end for n in needs):
                    break
                start = max([free[k], *(end[n] for n in needs)])
                end[op] = free[k] = start + seconds(op)
                at[k] += 1
                left -= 1
                progressed = True
        if not progressed:
            raise ValueError("the schedule waits on itself")
    return max(end.values(), default=0.0)
