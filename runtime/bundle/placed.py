"""A bundle as a host loaded it: the open file its programs' weights are mapped from, its
manifest, and where its devices went on this host."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.bundle.reader import Bundle


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

    def close(self) -> None:
        self.file.close()
