"""The models a server serves: each public name and version -> the host network behind it,
its file, load options and tensor metadata (the versions its version policy names). Loads
and unloads are blocking (run them off the event loop) and one at a time; lookups take no
lock.

A reload loads the new network beside the old one (`mlp#2`), switches the name over, then
removes the old network once its requests have ended (in the background if they take
longer than UNLOAD_WAIT), so a model keeps serving through a reload, and a failed reload
leaves the old one in place. A request that reached for the old network as it left goes
to the new one (`routes/infer.py`); the host's name for a network (`mlp#2`) never shows in
an error (`errors.in_public`).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from app.server.classify import top_classes
from app.server.errors import in_public
from app.server.load_options import LoadOptionError, LoadOptions, load_options
from app.server.repository import ModelRepository
from app.server.tensors import INPUT_SPECS, TensorError, config_type, datatype
from app.server.warmup import Warmup, warm, warmup_feeds
from runtime.errors import NetworkBusyError, NetworkNotFoundError, PrismError, first_line
from runtime.free_dims import fixed_size
from runtime.graph import Graph
from runtime.host import HostManager
from runtime.inputs import InputSpec, input_specs
from runtime.stored import file_version, held_in
from runtime.types import check_batchable

UNLOAD_WAIT = 30.0  # seconds an unload waits for the model's requests to end
log = logging.getLogger("prism.server")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    datatype: str
    shape: list[int]  # -1 for a dimension that varies

    def to_dict(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": self.shape}

    def config(self, batched: bool) -> dict:
        """As a Triton model configuration's `input`/`output` entry: a batching model's
        dims leave out the batch dimension."""
        return {"name": self.name, "data_type": config_type(self.datatype),
                "dims": self.shape[1:] if batched else self.shape}


@dataclass(frozen=True)
class Served:
    name: str
    version: str
    network: str  # the host's name for it
    source: Path
    options: LoadOptions
    inputs: list[InputSpec]
    outputs: list[TensorInfo]
    transfers: tuple[tuple[str, str, int], ...]  # per request: (src, dst, bytes), planned
    replicas: int = 1
    mode: str = "balanced"  # the plan's partition mode
    devices: tuple[tuple[str, str], ...] = ()  # (name, backend) of the devices it runs on
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # output -> classes
    # each file it was read from (the model's, those its weights stay in): its version then
    files: tuple[tuple[str, tuple[int, int] | None], ...] = ()

    def counted_rows(self, feeds: Mapping[str, np.ndarray]) -> int:
        """The inferences a request counts as in the host's events: its batch where the
        configuration batches without the host's batcher (which counts rows itself), one
        execution of that many rows, as Triton counts it; else 1."""
        if self.options.max_batch_size > 0 and not self.options.dynamic_batching:
            first = next(iter(feeds.values()), None)
            return len(first) if first is not None and first.ndim else 1
        return 1

    @property
    def platform(self) -> str:
        return "prism_bundle" if self.source.suffix == ".prism" else "onnxruntime_onnx"

    def metadata(self, versions: list[str]) -> dict:
        """Triton's model metadata; `versions`: every version of the model loaded."""
        return {"name": self.name, "versions": versions, "platform": self.platform,
                "inputs": [o.to_dict() for o in self.input_infos()],
                "outputs": [o.to_dict() for o in self.output_infos()]}

    def check_rows(self, feeds: Mapping[str, np.ndarray]) -> None:
        """With max_batch_size but no dynamic batcher (which says so itself), a request's
        batch may not exceed it, as Triton's default scheduler has it."""
        limit = self.options.max_batch_size
        if limit and not self.options.dynamic_batching:
            rows = max((len(v) for v in feeds.values() if getattr(v, "ndim", 0)), default=0)
            if rows > limit:
                raise TensorError(f"request to {self.name} has batch {rows}, more than its "
                                  f"max_batch_size {limit}")

    def input_infos(self) -> list[TensorInfo]:
        return [self._said(_info(s.name, s.dtype, s.dims), "input") for s in self.inputs]

    def output_infos(self) -> list[TensorInfo]:
        return [self._said(t, "output") for t in self.outputs]

    def _said(self, info: TensorInfo, kind: str) -> TensorInfo:
        """As the client sees it: a reshaped tensor has the configuration's dims."""
        reshaped = self._reshapes[kind].get(info.name)
        if reshaped is None:
            return info
        return replace(info, shape=[*([-1] if self.options.max_batch_size else []),
                                    *reshaped[0]])

    def to_model(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Feeds in the model's shapes: each input a configuration reshapes, reshaped."""
        return self._reshaped(feeds, "input")

    def to_client(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs in the configuration's dims, where it reshapes them."""
        return self._reshaped(outputs, "output")

    def classified(self, outputs: dict[str, np.ndarray], classes: Mapping[str, int]
                   ) -> dict[str, np.ndarray]:
        """Each output asked for as classes (`classes`: output -> how many) as its top
        classes' text (`classify.top_classes`), labelled where the configuration says."""
        batched = self.options.max_batch_size > 0
        return {name: top_classes(name, value, classes[name], batched,
                                  self.labels.get(name, ())) if name in classes else value
                for name, value in outputs.items()}

    @functools.cached_property
    def _reshapes(self) -> dict[str, dict[str, tuple[tuple[int, ...], tuple[int, ...]]]]:
        """kind -> tensor -> (the client's dims, the model's shape), where reshaped."""
        out: dict[str, dict[str, tuple[tuple[int, ...], tuple[int, ...]]]] = {
            "input": {}, "output": {}}
        for t in self.options.tensors:
            if t.reshape is not None and t.dims is not None:
                out[t.kind][t.name] = (t.dims, t.reshape)
        return out

    def _reshaped(self, tensors: dict[str, np.ndarray], kind: str) -> dict[str, np.ndarray]:
        reshapes = self._reshapes[kind]
        if not reshapes:
            return tensors  # the same dict: nothing to do on the hot path
        out = dict(tensors)
        for name, (dims, shape) in reshapes.items():
            if name not in out:
                continue
            value = np.asarray(out[name])
            target = shape if kind == "input" else dims
            batch = value.shape[:1] if self.options.max_batch_size and value.ndim else ()
            try:
                out[name] = value.reshape((*batch, *target))
            except ValueError:
                raise TensorError(f"{kind} {name!r}: shape {list(value.shape)} does not "
                                  f"reshape to {[*batch, *target]}") from None
        return out

    def config(self) -> dict:
        """The model configuration, as Triton answers `GET /v2/models/M/config`; its
        parameters also say the inputs as Prism reads them (`INPUT_SPECS`: dimension names,
        the least sizes the graph reads, value limits), for a client to make up requests
        the model takes as `prism run` does, where metadata says only -1."""
        batch = self.options.max_batch_size
        kinds = {backend for _, backend in self.devices}
        config: dict = {
            "name": self.name, "platform": self.platform,
            "backend": "prism" if self.source.suffix == ".prism" else "onnxruntime",
            "version_policy": self.options.versions.to_config(), "max_batch_size": batch,
            "input": [t.config(bool(batch)) for t in self.input_infos()],
            "output": [t.config(bool(batch)) for t in self.output_infos()],
            "instance_group": [{"name": self.name, "count": self.replicas,
                                "kind": "KIND_CPU" if kinds == {"cpu"} else "KIND_MODEL"}],
            "default_model_filename": self.source.name,
            "parameters": {"partition": {"string_value": self.mode},
                           "devices": {"string_value": ",".join(n for n, _ in self.devices)},
                           INPUT_SPECS: {"string_value": json.dumps(
                               [i.to_dict() for i in self.inputs
                                if i.name not in self._reshapes["input"]])}}}
        if batch and self.options.dynamic_batching:
            config["dynamic_batching"] = {
                "preferred_batch_size": list(self.options.preferred_batch_sizes),
                "max_queue_delay_microseconds": round(self.options.max_queue_delay_ms * 1000)}
        return config


def _versions_said(versions: Mapping[str, object]) -> str:
    ordered = sorted(versions, key=int)
    return f"version{'s' if len(ordered) > 1 else ''} {', '.join(ordered)}"


def _check_loaded(name: str, graph: Graph, options: LoadOptions) -> None:
    """What the configuration says of a model it must hold, as Triton checks it:
    - with max_batch_size the first dimension is the batch, dynamic batcher or not: every
      input and output must have a symbolic one (the host checks it for its batcher);
    - each `input` and `output` it lists is one the model has, of its data type and
      dims (a batching model's without the batch; -1 on either side matches any)."""
    if options.max_batch_size and not options.dynamic_batching:
        check_batchable(name, graph.declared_dims(graph.inputs),
                        graph.declared_dims(graph.outputs))
    model = {"input": {t.name: t for t in _infos(graph, graph.inputs)},
             "output": {t.name: t for t in _infos(graph, graph.outputs)}}
    for said in options.tensors:
        have = model[said.kind].get(said.name)
        if have is None:
            raise LoadOptionError(f"config {said.kind} {said.name!r}: {name} has no such "
                                  f"{said.kind} (its {said.kind}s: "
                                  f"{', '.join(model[said.kind])})")
        entry = have.config(bool(options.max_batch_size))
        if said.data_type is not None and said.data_type != entry["data_type"]:
            raise LoadOptionError(f"config {said.kind} {said.name!r}: data_type "
                                  f"{said.data_type}, but the model's is {entry['data_type']}")
        dims, shape = entry["dims"], said.dims if said.reshape is None else said.reshape
        if shape is not None and (len(shape) != len(dims) or any(
                a != b and -1 not in (a, b) for a, b in zip(shape, dims, strict=True))):
            what = "dims" if said.reshape is None else "reshape shape"
            raise LoadOptionError(f"config {said.kind} {said.name!r}: {what} {list(shape)}, "
                                  f"but the model's are {dims}")
        if said.reshape is not None and said.dims is not None and -1 not in (
                *said.dims, *said.reshape) and math.prod(said.dims) != math.prod(said.reshape):
            raise LoadOptionError(f"config {said.kind} {said.name!r}: dims {list(said.dims)} "
                                  f"do not reshape to {list(said.reshape)}")


def _info(name: str, dtype: np.dtype | str | None, dims: tuple | None) -> TensorInfo:
    """A tensor as metadata shows it: a dimension named by a number (torch's exporter names
    an image's channels `"3"`) is that number, as a client drawing inputs needs it."""
    shape = [-1 if (size := fixed_size(d)) is None else size for d in dims or ()]
    return TensorInfo(name, datatype(np.dtype(dtype) if dtype else None), shape)


def _infos(graph: Graph, names: list[str]) -> list[TensorInfo]:
    return [_info(n, graph.tensors[n].dtype if n in graph.tensors else None, _dims(graph, n))
            for n in names]


def _dims(graph: Graph, name: str) -> tuple | None:
    """A tensor's dims; a sequence's one element per item (`tensors.on_the_wire`)."""
    kind = graph.types.get(name)
    if kind is not None and kind.WhichOneof("value") == "sequence_type":
        return ("items",)
    return graph.tensors[name].dims if name in graph.tensors else None


class Catalog:
    def __init__(self, host: HostManager, repository: ModelRepository | None = None):
        self.host = host
        self.repository = repository
        # name -> version -> what serves it; replaced whole, never changed in place
        self._served: dict[str, dict[str, Served]] = {}
        self._by_network: dict[str, Served] = {}  # each network on the host: for metrics
        self._named: set[str] = set()  # models whose own name a network has had
        self._failed: dict[str, str] = {}  # name -> why its last load failed
        self._loading: set[str] = set()
        self._lock = threading.Lock()
        self._suffix = itertools.count(2)
        # called once a network is off the host, before its model's name for it goes:
        # the server's metrics fold the events it left
        self.on_removed: Callable[[], None] = lambda: None
        # called with (model, version) once a version stops being served (unloaded, or
        # dropped by its version policy): the server's metrics forget it, as Triton's do
        self.on_gone: Callable[[str, str], None] = lambda model, version: None

    def get(self, name: str, version: str | None = None) -> Served:
        """The model's `version`, or its newest loaded one (Triton's default)."""
        versions = self._served.get(name)
        if versions is None:
            loaded = ", ".join(sorted(self._served)) or "none"
            raise NetworkNotFoundError(f"unknown model {name!r} (loaded: {loaded})")
        served = versions.get(max(versions, key=int) if version is None else version)
        if served is None:
            raise NetworkNotFoundError(f"model {name!r} has no version {version!r} loaded "
                                       f"(it serves {_versions_said(versions)})")
        return served

    def versions(self, name: str) -> list[str]:
        """The model's loaded versions, newest first."""
        return sorted(self._served.get(name, {}), key=int, reverse=True)

    def served(self) -> list[Served]:
        return [s for versions in self._served.values() for s in versions.values()]

    def of_network(self, network: str) -> Served | None:
        """The model a host network serves (events name networks), None once the network
        is gone and its events are folded."""
        return self._by_network.get(network)

    def load(self, name: str, params: dict | None = None) -> Served:
        """Load (or reload) a model from the repository, with the load request's
        parameters over its config.pbtxt. All the versions its policy names load, or none
        does: as Triton does, a version failing unloads the versions this load made, and
        what served before serves on."""
        if self.repository is None:
            raise NetworkNotFoundError(f"cannot load {name!r}: the server has no model "
                                       f"repository (start it with --model-repository DIR)")
        entry = self.repository.get(name)
        options = load_options(entry.config, params)
        labels = self.repository.labels(name, options.tensors)
        rng, read = np.random.default_rng(), functools.partial(self.repository.warmup_file, name)
        samples = [(w, warmup_feeds(w, options.max_batch_size > 0, read, rng))
                   for w in options.warmups]
        wanted = options.versions.pick(name, entry.versions)
        with self._lock:
            current = self._served.get(name, {})
            made: dict[str, Served] = {}
            try:
                for version in wanted:
                    made[version] = self._made(name, entry.versions[version], options,
                                               version, current.get(version), labels, samples)
            except Exception:
                for version, served in made.items():
                    if served is not current.get(version):  # never served: no requests
                        self.host.remove_network(served.network)
                        self._removed(served.network)
                raise
            self._publish(name, made, current)
        return self.get(name)

    def add(self, name: str, path: Path, options: LoadOptions, version: str = "1") -> Served:
        """Serve the model file at `path` under `name` (a reload if the name is served)."""
        with self._lock:
            current = self._served.get(name, {})
            served = self._made(name, path, options, version, current.get(version))
            self._publish(name, {**current, version: served}, current)
            return served

    def _made(self, name: str, path: Path, options: LoadOptions, version: str,
              old: Served | None, labels: Mapping[str, tuple[str, ...]] | None = None,
              samples: list[tuple[Warmup, dict]] | None = None) -> Served:
        """`old` if it already serves this file with these options and labels, none of its
        files written since (Triton reloads a model whose files changed), else a network
        loaded, checked and warmed up (`samples`, the first also measured on) for it, not
        yet served. Called holding the lock."""
        labels = labels or {}
        if old is not None and (old.source, old.options, old.labels) == (path, options, labels) \
                and all(_version(file) == read for file, read in old.files):
            return old
        read = _version(path)  # before it is read: a write meanwhile is a change
        network = self._new_network_name(name)
        self._loading.add(name)
        try:
            measured_on = samples[0][1] if samples and path.suffix != ".prism" else None
            plan = self.host.add_network(network, str(path), **options.add_network(),
                                         sample_feeds=measured_on)
            try:
                _check_loaded(name, self.host.graph(network), options)
                warm(self.host, network, samples or [])
            except PrismError:
                self.host.remove_network(network)
                raise
        except Exception as exc:
            self._failed[name] = first_line(in_public(exc, name))
            raise
        finally:
            self._loading.discard(name)
        graph = self.host.graph(network)
        served = Served(name, version, network, path, options, input_specs(graph),
                        _infos(graph, graph.outputs),
                        tuple((t.src, t.dst, t.bytes) for t in plan.transfers),
                        self.host.replicas(network), plan.mode,
                        tuple(dict.fromkeys((d, self.host.devices[d].config.backend)
                                            for placed in self.host.placements(network)
                                            for d in placed.values())), labels,
                        tuple({str(path): read, **{at.path: at.version for at in
                                                   held_in(graph.model).values()}}.items()))
        self._by_network[network] = served
        return served

    def _new_network_name(self, name: str) -> str:
        """A host network name never given before, so a request holding an old one reaches
        nothing else: the model's own name the first time, then `name#N`, N counted over
        every model (a model name holding '#' always takes a number). Nothing is kept per
        reload."""
        if "#" not in name and name not in self._named:
            self._named.add(name)
            if name not in self.host.networks():
                return name
        while (network := f"{name}#{next(self._suffix)}") in self.host.networks():
            pass
        return network

    def _publish(self, name: str, versions: dict[str, Served],
                 current: dict[str, Served]) -> None:
        """Serve `versions` of `name` in one swap; then retire what they replaced, and
        what they dropped (gone for good: its metrics go too). Called holding the lock."""
        self._served = {**self._served, name: versions}
        self._failed.pop(name, None)
        for version, old in current.items():
            if versions.get(version) is not old:
                self._retire(old.network, gone=None if version in versions else old)

    def _retire(self, network: str, gone: Served | None = None) -> None:
        """Remove a network a reload replaced, once its requests have ended: here if they
        end within UNLOAD_WAIT, else on a thread of its own (the reload is done). `gone`:
        the version it served, no longer served at all."""
        try:
            self.host.remove_network(network, wait=True, timeout=UNLOAD_WAIT)
        except NetworkBusyError:
            threading.Thread(target=self._drain, args=(network, gone), daemon=True,
                             name=f"prism-drain-{network}").start()
            return
        self._removed(network, gone)

    def _removed(self, network: str, gone: Served | None = None) -> None:
        """`network` is off the host, its requests ended: the events they left are folded,
        then the network is forgotten (and `gone`, a version served no more, too)."""
        self.on_removed()
        self._by_network.pop(network, None)
        if gone is not None:
            self.on_gone(gone.name, gone.version)

    def _drain(self, network: str, gone: Served | None) -> None:
        while True:
            try:
                self.host.remove_network(network, wait=True, timeout=UNLOAD_WAIT)
                self._removed(network, gone)
                return
            except NetworkBusyError:
                log.warning("%s: requests to the replaced network still running", network)
            except PrismError:  # the host closed meanwhile
                return

    def unload(self, name: str) -> None:
        """Stop serving `name` once its requests have ended (a name in the repository but
        not loaded is already unloaded)."""
        with self._lock:
            versions = self._served.get(name)
            if versions is None:
                if self.repository is None or name not in self.repository.names():
                    self.get(name)  # raises: unknown model
                return
            self._served = {n: s for n, s in self._served.items() if n != name}
            for version, served in list(versions.items()):
                try:
                    self.host.remove_network(served.network, wait=True, timeout=UNLOAD_WAIT)
                except NetworkBusyError as exc:
                    self._served = {**self._served, name: versions}
                    raise in_public(exc, name) from None
                versions = {v: s for v, s in versions.items() if v != version}
                self._removed(served.network, served)

    def index(self, ready_only: bool = False) -> list[dict]:
        """Triton's repository index: every model in the repository or served, its state."""
        names = set(self._served) | set(self.repository.names() if self.repository else ())
        rows = []
        for name in sorted(names):
            if name in self._served:
                rows += [{"name": name, "version": version, "state": "READY", "reason": ""}
                         for version in self.versions(name)]
            elif not ready_only:
                state = "LOADING" if name in self._loading else "UNAVAILABLE"
                rows.append({"name": name, "state": state,
                             "reason": self._failed.get(name, "unloaded")})
        return rows


def _version(path: str | Path) -> tuple[int, int] | None:
    """A file's version (`file_version`), None when it cannot be read."""
    try:
        return file_version(path)
    except OSError:
        return None
