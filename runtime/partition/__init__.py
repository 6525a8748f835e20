"""Partitioner: graph + devices -> Plan, as a generator of steps a UI can replay.

    steps = partition_steps(graph, devices, "balanced")
    for step in steps: ...           # each decision, with its reason
    plan = partition(graph, devices, "balanced")   # or run it to the end

It owns placement (which backend may run which node), the split modes (`greedy` for
memory, `balanced`, `user`), the plan records and their validation, memory plans, the
drawings (`dot`), the plan a host makes for a network with its replicas (`planning`,
`replicas`), and each partition extracted as an ONNX sub-model (`submodel`).

Names load on first use (PEP 562): the plan records (`plan.py`) import lightly, so a host
loading a bundle has its Plan without the partitioner, the graph IR or networkx.
"""

from typing import TYPE_CHECKING

from runtime.lazy import lazy_names

if TYPE_CHECKING:  # the names as mypy and readers see them
    from runtime.partition.canonical import canonical_devices  # noqa: F401
    from runtime.partition.partitioner import partition, partition_steps  # noqa: F401
    from runtime.partition.plan import MODES, Partition, Plan, Transfer  # noqa: F401
    from runtime.partition.steps import Step, replay  # noqa: F401
    from runtime.partition.validate import validate_plan  # noqa: F401

_EXPORTS = {
    "canonical_devices": "runtime.partition.canonical",
    "partition": "runtime.partition.partitioner",
    "partition_steps": "runtime.partition.partitioner",
    "MODES": "runtime.partition.plan", "Partition": "runtime.partition.plan",
    "Plan": "runtime.partition.plan", "Transfer": "runtime.partition.plan",
    "Step": "runtime.partition.steps", "replay": "runtime.partition.steps",
    "validate_plan": "runtime.partition.validate",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_names(__name__, _EXPORTS)
