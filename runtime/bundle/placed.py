"""A bundle as a host loaded it: the open file its programs' weights are mapped from, its
manifest, and where its devices went on this host."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.bundle.reader import REQUEST_MEMORY, Bundle
from runtime.errors import BundleError
from runtime.request_memory import RequestMemory


@dataclass(frozen=True)
class LoadedBundle:
    """The bundle a network came from, as loaded: its manifest, where its devices went on
    this host, and the open file its programs' weights are mapped from."""

    path: str
    file: Bundle
    manifest: dict
    devices: dict[str, str]  # bundle device -> host device

    @property
    def schedule(self) -> list[dict]:
        """The schedule table (one row per partition: device, reads, writes, after) with
        this host's device names."""
        return [{**row, "device": self.devices.get(row["device"], row["device"])}
                for row in self.manifest["schedule"]]

    def request_memory(self) -> RequestMemory | None:
        """What a request needs at its sizes, as compiled (`request_memory.json`); None for a
        bundle of fixed sizes or one older than that member, and for one whose member
        cannot be read: a request is then let through unchecked, as it always was."""
        if REQUEST_MEMORY not in self.file.names():
            return None
        try:
            return RequestMemory.from_dict(self.file.json(REQUEST_MEMORY))
        except (BundleError, KeyError, TypeError, ValueError):
            return None

    def close(self) -> None:
        self.file.close()
