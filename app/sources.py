"""Where a dashboard's runtime comes from: embedded under live load, a recording, or a
running `prism serve` (`--connect`).

`prism tui` builds `SourceSettings` from its arguments; `prism web` hands them to its
Streamlit process through the environment (`to_env`, `from_env`), which opens the source.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.arguments import bindings
from app.dashboard.source import RuntimeSource
from app.defaults import DEFAULT_MODEL, default_devices
from app.live import LiveRuntime
from app.replay import Recording
from runtime.bundle.match import match_devices, parse_remap
from runtime.bundle.reader import is_bundle, read_bundle
from runtime.devices import parse_devices
from runtime.errors import BundleError, PrismError

ENV_PREFIX = "PRISM_WEB_"


@dataclass(frozen=True)
class SourceSettings:
    model: str | None = None
    devices: str | None = None
    mode: str = "balanced"
    rate: float | None = None
    concurrency: int | None = None
    seed: int | None = None
    replay: str | None = None  # a recording (JSON lines) to replay instead of running
    connect: str | None = None  # a running server's URL to attach to instead of running
    token: str | None = None  # its token, if it asks for one
    remap: str | None = None  # a bundle's renamed devices: "OLD=NEW,OLD=NEW"
    train: str | None = None  # a training run to run and show (TrainSettings as JSON)
    inputs: str | None = None  # one request's feeds (.npz) for the embedded runtime's load
    bind: str | None = None  # the model's symbolic dimensions' sizes: "DIM=N,DIM=N"

    def __post_init__(self) -> None:
        for flag, given in (("--inputs", self.inputs), ("--bind", self.bind)):
            if given is not None and (self.replay or self.connect or self.train):
                raise PrismError(f"{flag} is for a runtime run here; a replay, a server or a "
                                 f"training run has its own")
        if self.inputs is not None and not Path(self.inputs).is_file():
            raise PrismError(f"--inputs: no such file: {self.inputs}")
        if self.train is not None and (self.model or self.replay or self.connect):
            raise PrismError("a training run is its own source: MODEL, --replay and "
                             "--connect do not go with it")
        if self.connect is not None and (self.model or self.devices or self.replay or
                                         self.remap):
            raise PrismError("--connect attaches to a running server: MODEL, --devices, "
                             "--remap and --replay are the server's business")
        if self.remap is not None and not (self.model and is_bundle(self.model)):
            raise PrismError("--remap applies to bundles (NAME.prism); a model is planned "
                             "onto the devices as they are named")
        if self.replay is not None and not Path(self.replay).is_file():
            raise PrismError(f"--replay: no such file: {self.replay}")
        if self.replay is None and self.model is not None and is_bundle(self.model):
            _check_bundle(Path(self.model), self.devices, self.remaps)
        self.bindings  # noqa: B018 (a DIM the model's inputs lack fails here, as one line)

    @property
    def remaps(self) -> dict[str, str]:
        return parse_remap(self.remap.split(",")) if self.remap else {}

    @property
    def bindings(self) -> dict[str, int]:
        """`bind` as {DIM: N}, each DIM one of the model's inputs' (else a one-line error)."""
        return bindings(self.bind.split(","), self.model or str(DEFAULT_MODEL)) \
            if self.bind else {}

    def open(self) -> RuntimeSource:
        if self.train is not None:
            from app.train_run import TrainingRun, TrainSettings
            from app.train_source import TrainingSource

            return TrainingSource(TrainingRun(TrainSettings.from_json(self.train)))
        if self.connect is not None:
            from app.remote import RemoteSource

            return RemoteSource(self.connect, self.token)
        if self.replay is not None:
            return Recording(self.replay, self.model, self.devices, self.mode)
        return LiveRuntime(self.model, self.devices, self.mode, rate=self.rate,
                           concurrency=self.concurrency, seed=self.seed, remap=self.remaps,
                           inputs=self.inputs, bindings=self.bindings)

    def to_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """`env` with these settings in place of any it held."""
        out = {k: v for k, v in env.items() if not k.startswith(ENV_PREFIX)}
        out.update({ENV_PREFIX + k.upper(): str(v) for k, v in asdict(self).items()
                    if v is not None})
        return out

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SourceSettings:
        def get(name: str) -> str | None:
            return env.get(ENV_PREFIX + name.upper()) or None

        def number(name: str, kind: type[int] | type[float]) -> Any:
            text = get(name)
            return kind(text) if text is not None else None

        return cls(get("model"), get("devices"), get("mode") or "balanced",
                   number("rate", float), number("concurrency", int), number("seed", int),
                   get("replay"), get("connect"), get("token"), get("remap"), get("train"),
                   get("inputs"), get("bind"))


def _check_bundle(path: Path, devices: str | None, remap: Mapping[str, str]) -> None:
    """Refuse, in one line and before any dashboard starts, a bundle that is damaged or
    whose devices these cannot hold."""
    with read_bundle(path) as bundle:
        try:
            match_devices(bundle.manifest, parse_devices(devices or default_devices(path)),
                          remap)
        except BundleError as exc:
            raise BundleError(f"{path}: {exc}") from None
