"""Messages the app and its widgets post each other: small dataclasses (thread workers post
them back to the UI thread, where Textual delivers them)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from app.dashboard import Stepper
from runtime.partition import Plan


@dataclass
class Repartitioned(Message):
    """A re-partition (new mode, devices or model) finished; `error` says why it did not."""

    what: str
    plan: Plan | None = None
    error: str | None = None


@dataclass
class StepperReady(Message):
    """The partitioner's steps for the present graph, devices and mode, ready to walk."""

    stepper: Stepper | None = None
    error: str | None = None


@dataclass
class PartitionSelected(Message):
    """The DAG's selection moved to partition `name`."""

    name: str
