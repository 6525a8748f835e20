"""What a model loads with: Triton's model configuration (the repository's config.pbtxt,
or a load request's "config" JSON, which replaces it) and the load request's own
parameters, which win -> `HostManager.add_network` keywords.

From the configuration: `version_policy` picks the versions that load (the newest one by
default; the load parameter `version` picks one), `max_batch_size` bounds every request's
first dimension, and with
`dynamic_batching` (`max_queue_delay_microseconds`, `preferred_batch_size`) turns on
Prism's batching (the load parameter `max_batch_size` turns it on by itself), the
`instance_group` counts are replicas, and `parameters` (`partition`, `devices`,
`replicas`) are Prism's own, and `model_warmup` the samples it runs before it serves
(`warmup.py`). Load parameters: partition, devices, replicas,
max_batch_size, max_queue_delay_ms, preferred_batch_sizes, version, config, costs
(`measured` or `model`: the cost model the plan is made with). Values may be strings, as
Triton's clients send them.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.server.tensors import DTYPES, config_type, from_config_type
from app.server.warmup import DATA, Warmup, WarmupInput
from runtime.cost import COSTS
from runtime.errors import NetworkNotFoundError, PrismError
from runtime.partition.replicas import FILL

PARAMETERS = ("partition", "devices", "replicas", "max_batch_size", "max_queue_delay_ms",
              "preferred_batch_sizes", "version", "config", "costs")
MODES = ("balanced", "memory")  # a user map would name a file: not over the network


class LoadOptionError(PrismError):
    """A load parameter or configuration field Prism cannot use."""


@dataclass(frozen=True)
class VersionPolicy:
    """Which of a model's versions load, Triton's `version_policy`: the `latest` `count`,
    `all`, or the `specific` ones."""
    kind: str = "latest"
    count: int = 1
    versions: tuple[str, ...] = ()

    def pick(self, model: str, available: Collection[str]) -> list[str]:
        """The versions to load, newest first."""
        newest = sorted(available, key=int, reverse=True)
        if self.kind == "all":
            return newest
        if self.kind == "latest":
            return newest[:self.count]
        missing = [v for v in self.versions if v not in available]
        if missing:
            raise NetworkNotFoundError(f"model {model!r} has no version {missing[0]!r} in the "
                                       f"repository (it has {', '.join(newest)})")
        return sorted(self.versions, key=int, reverse=True)

    def to_config(self) -> dict[str, Any]:
        if self.kind == "latest":
            return {"latest": {"num_versions": self.count}}
        if self.kind == "all":
            return {"all": {}}
        return {"specific": {"versions": [int(v) for v in self.versions]}}


def _version_policy(value: Any) -> VersionPolicy:
    """From a configuration's `version_policy` (JSON or pbtxt: one of latest, all,
    specific)."""
    if not isinstance(value, Mapping) or len(value) != 1 or \
            next(iter(value)) not in ("latest", "all", "specific"):
        raise LoadOptionError(f"config: version_policy {value!r} must be one of "
                              f"{{latest: {{num_versions: N}}}}, {{all: {{}}}}, "
                              f"{{specific: {{versions: [...]}}}}")
    kind, body = next(iter(value.items()))
    body = body if isinstance(body, Mapping) else {}
    if kind == "latest":
        return VersionPolicy(count=_whole(body.get("num_versions", 1),
                                          "version_policy latest num_versions", 1))
    if kind == "all":
        return VersionPolicy("all")
    versions = body.get("versions", [])
    versions = versions if isinstance(versions, list) else [versions]
    if not versions:
        raise LoadOptionError("config: version_policy specific lists no versions")
    return VersionPolicy("specific", versions=tuple(
        str(_whole(v, "version_policy specific version", 1)) for v in versions))


@dataclass(frozen=True)
class ConfigTensor:
    """A configuration's `input` or `output` entry: what it says the model has (None: not
    said), checked against the model once loaded (`catalog`)."""
    kind: str  # "input" or "output"
    name: str
    data_type: str | None
    dims: tuple[int, ...] | None  # None: not said
    reshape: tuple[int, ...] | None = None  # the model's shape, the client's being `dims`
    label_filename: str | None = None  # an output's class labels, a file in the model's folder


@dataclass(frozen=True)
class LoadOptions:
    versions: VersionPolicy = VersionPolicy()  # the load parameter `version`: that one
    partition: str = "balanced"
    devices: tuple[str, ...] | None = None
    replicas: int | str = 1
    max_batch_size: int = 0  # 0: requests carry no batch dimension
    dynamic_batching: bool = False  # requests joined in batches of up to max_batch_size
    max_queue_delay_ms: float = 1.0
    preferred_batch_sizes: tuple[int, ...] = ()
    costs: str | None = None  # None: the host's default (measured)
    tensors: tuple[ConfigTensor, ...] = ()
    warmups: tuple[Warmup, ...] = ()  # `model_warmup`: run before it serves

    def add_network(self) -> dict[str, Any]:
        """Keywords for `HostManager.add_network`."""
        batching = None if not (self.max_batch_size and self.dynamic_batching) else {
            "max_batch_size": self.max_batch_size, "max_queue_delay_ms": self.max_queue_delay_ms,
            "preferred_batch_sizes": list(self.preferred_batch_sizes)}
        return {"partition": self.partition, "devices": self.devices,
                "replicas": self.replicas, "batching": batching, "costs": self.costs}


def load_options(config: Mapping[str, Any], params: Mapping[str, Any] | None) -> LoadOptions:
    params = dict(params or {})
    for key in params:
        if key.startswith("file:"):
            raise LoadOptionError(f"load parameter {key!r}: uploading model files is not "
                                  f"supported; models load only from the model repository")
        if key not in PARAMETERS:
            raise LoadOptionError(f"unknown load parameter {key!r}; known: "
                                  f"{', '.join(PARAMETERS)}")
    if "config" in params:
        config = _json_config(params.pop("config"))
    found: dict[str, Any] = {}
    if _whole(config.get("max_batch_size", 0), "max_batch_size", 0):
        found["max_batch_size"] = config["max_batch_size"]
    if found and "dynamic_batching" in config:
        dynamic = config["dynamic_batching"] or {}
        if not isinstance(dynamic, Mapping):
            raise LoadOptionError("config: dynamic_batching must be a message")
        found["dynamic_batching"] = True
        delay = _whole(dynamic.get("max_queue_delay_microseconds", 1000),
                       "dynamic_batching.max_queue_delay_microseconds", 0)
        found["max_queue_delay_ms"] = delay / 1000
        found["preferred_batch_sizes"] = dynamic.get("preferred_batch_size", [])
    groups = config.get("instance_group")
    if groups:
        groups = groups if isinstance(groups, list) else [groups]
        found["replicas"] = sum(_whole(g.get("count", 1), "instance_group count", 1)
                                for g in groups if isinstance(g, Mapping))
    if config.get("version_policy") is not None:
        found["version_policy"] = _version_policy(config["version_policy"])
    found.update(_config_parameters(config.get("parameters")))
    found.update(params)
    if "max_batch_size" in params:
        found["dynamic_batching"] = True
    return replace(_checked(found), tensors=_config_tensors(config), warmups=warmups(config))


def _config_tensors(config: Mapping[str, Any]) -> tuple[ConfigTensor, ...]:
    out = []
    for kind in ("input", "output"):
        entries = config.get(kind) or []
        for entry in entries if isinstance(entries, list) else [entries]:
            if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
                raise LoadOptionError(f"config: each {kind} must be a message with a name")
            what = f"config {kind} {entry['name']!r}"
            dims = _dims(entry.get("dims"), f"{what} dims")
            reshape = entry.get("reshape")
            if reshape is not None:
                if not isinstance(reshape, Mapping) or dims is None:
                    raise LoadOptionError(f"{what}: reshape must be {{shape: [...]}}, with dims")
                reshape = _dims(reshape.get("shape", []), f"{what} reshape shape")
            data_type = entry.get("data_type")
            labels = entry.get("label_filename")
            if labels is not None and not isinstance(labels, str):
                raise LoadOptionError(f"{what}: label_filename must be a file name")
            out.append(ConfigTensor(kind, entry["name"], None if data_type is None
                                    else str(data_type), dims, reshape, labels))
    return tuple(out)


def _dims(value: Any, what: str, low: int = -1) -> tuple[int, ...] | None:
    if value is None:
        return None
    return tuple(_whole(d, what, low) for d in (value if isinstance(value, list) else [value]))


def _json_config(text: Any) -> dict[str, Any]:
    try:
        config = json.loads(text) if isinstance(text, str) else text
    except ValueError as exc:
        raise LoadOptionError(f"load parameter 'config' is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise LoadOptionError("load parameter 'config' must be a JSON object")
    return config


def _config_parameters(value: Any) -> dict[str, Any]:
    """A configuration's `parameters`: Prism's own, each {string_value} or plain."""
    return {key: wrapped.get("string_value") if isinstance(wrapped, Mapping) else wrapped
            for key, wrapped in _pairs(value) if key in ("partition", "devices", "replicas")}


def _checked(found: dict[str, Any]) -> LoadOptions:
    options: dict[str, Any] = {}
    if "partition" in found:
        if found["partition"] not in MODES:
            raise LoadOptionError(f"partition {found['partition']!r}: use one of "
                                  f"{', '.join(MODES)}")
        options["partition"] = found["partition"]
    if "devices" in found:
        devices = found["devices"]
        names = devices.split(",") if isinstance(devices, str) else devices
        if not isinstance(names, list) or not all(isinstance(n, str) and n.strip()
                                                  for n in names):
            raise LoadOptionError(f"devices {devices!r}: give device names, comma-separated")
        options["devices"] = tuple(n.strip() for n in names)
    if "replicas" in found:
        replicas = found["replicas"]
        options["replicas"] = replicas if replicas in FILL else \
            _whole(replicas, "replicas", 1)
    if "max_batch_size" in found:
        options["max_batch_size"] = _whole(found["max_batch_size"], "max_batch_size", 0)
        options["dynamic_batching"] = bool(found.get("dynamic_batching"))
    if "max_queue_delay_ms" in found:
        try:
            delay = float(found["max_queue_delay_ms"])
        except (TypeError, ValueError):
            delay = -1.0
        if not 0 <= delay <= 60_000:
            raise LoadOptionError(f"max_queue_delay_ms {found['max_queue_delay_ms']!r}: give "
                                  f"milliseconds from 0 to 60000")
        options["max_queue_delay_ms"] = delay
    if "preferred_batch_sizes" in found:
        sizes = found["preferred_batch_sizes"]
        sizes = sizes.split(",") if isinstance(sizes, str) else sizes
        sizes = sizes if isinstance(sizes, list) else [sizes]
        options["preferred_batch_sizes"] = tuple(_whole(s, "preferred_batch_sizes", 1)
                                                 for s in sizes if s != "")
    over = [size for size in options.get("preferred_batch_sizes", ())
            if size > options.get("max_batch_size", 0)]
    if over and options.get("dynamic_batching"):  # as Triton refuses such a configuration
        raise LoadOptionError(f"preferred batch size {over[0]} is over max_batch_size "
                              f"{options['max_batch_size']}")
    if "costs" in found:
        if found["costs"] not in COSTS:
            raise LoadOptionError(f"costs {found['costs']!r}: use one of {', '.join(COSTS)}")
        options["costs"] = found["costs"]
    if "version_policy" in found:
        options["versions"] = found["version_policy"]
    if "version" in found:
        options["versions"] = VersionPolicy("specific", versions=(
            str(_whole(found["version"], "version", 1)),))
    return LoadOptions(**options)


def _whole(value: Any, what: str, low: int) -> int:
    try:
        number = int(value) if isinstance(value, int | str) and not isinstance(value, bool) \
            else None
    except ValueError:
        number = None
    if number is None or number < low:
        raise LoadOptionError(f"{what} {value!r}: give a whole number of at least {low}")
    return number


def warmups(config: Mapping[str, Any]) -> tuple[Warmup, ...]:
    """The configuration's `model_warmup` samples; LoadOptionError naming what is wrong."""
    entries = config.get("model_warmup") or []
    out = []
    for i, entry in enumerate(entries if isinstance(entries, list) else [entries]):
        if not isinstance(entry, Mapping):
            raise LoadOptionError(f"config: model_warmup {i} must be a message")
        name = str(entry.get("name", i))
        batch = _whole(entry.get("batch_size", 1), f"warmup {name!r} batch_size", 1)
        count = max(_whole(entry.get("count", 1), f"warmup {name!r} count", 0), 1)
        inputs = tuple(_input(name, key, value) for key, value in _pairs(entry.get("inputs")))
        if not inputs:
            raise LoadOptionError(f"config: warmup {name!r} names no inputs")
        out.append(Warmup(name, batch, count, inputs))
    return tuple(out)


def _pairs(value: Any) -> list[tuple[Any, Any]]:
    """A map field's entries: pbtxt gives [{key, value}] (one entry: {key, value}), JSON
    {key: value}."""
    if isinstance(value, Mapping) and set(value) == {"key", "value"}:
        value = [value]
    if isinstance(value, Mapping):
        return list(value.items())
    return [(p.get("key"), p.get("value")) for p in (value if isinstance(value, list) else [])
            if isinstance(p, Mapping)]


def _input(sample: str, name: Any, spec: Any) -> WarmupInput:
    what = f"warmup {sample!r} input {name!r}"
    if not isinstance(name, str) or not isinstance(spec, Mapping):
        raise LoadOptionError(f"config: {what} must be a message under the input's name")
    kind = from_config_type(spec.get("data_type"))
    if kind is None:
        raise LoadOptionError(f"config: {what}: data_type {spec.get('data_type')!r} is none "
                              f"of {', '.join(map(config_type, DTYPES))}")
    dims = _dims(spec.get("dims", []), f"{what} dims", 0) or ()
    given = [d for d in DATA if spec.get(d) not in (None, False)]
    if len(given) != 1:
        raise LoadOptionError(f"config: {what} needs one of {', '.join(DATA)}")
    data = given[0] if given[0] != "input_data_file" else str(spec["input_data_file"])
    return WarmupInput(name, kind, dims, data)
