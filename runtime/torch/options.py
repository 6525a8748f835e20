"""The backend's options, as `torch.compile(..., backend="prism", options={...})` gives them.

Read without torch: a bad key or value is refused in one line before anything is traced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from runtime.devices.spec import parse_devices
from runtime.errors import PrismError
from runtime.types import BatchingConfig

if TYPE_CHECKING:
    from runtime.devices.config import DeviceConfig
    from runtime.host.manager import HostManager

DEFAULT_DEVICES = "cpu:2"  # as PrismBackend: a graph is split over two cpu devices
KEYS = ("devices", "host", "partition", "replicas", "batching", "min_block_size",
        "torch_executed_ops", "custom_translation_table", "dry_run", "timeout")


@dataclass(frozen=True)
class OffloadOptions:
    """`devices`: a spec as `--devices` (`cpu:2`, `cpu:1,sim:2`, a TOML file), for a host
    this process shares among every graph asking for the same spec; `host`: a HostManager
    of the caller's instead (the caller closes it); `partition`, `replicas`, `batching`:
    as `HostManager.add_network`; `min_block_size`: blocks of fewer ATen operators stay in
    PyTorch; `torch_executed_ops`: operators kept in PyTorch (`aten.sin`, `aten.sub.Tensor`,
    `aten::sin`, `torch.ops.aten.sin.default` or the op itself); `custom_translation_table`:
    as `torch.onnx.export`'s, an operator overload -> its ONNX translation (an onnxscript
    function), for operators torch.onnx does not translate (a library's custom op) or
    translates otherwise: such an operator leaves PyTorch, undecomposed; `dry_run`:
    decide, export and plan, but run everything in PyTorch and print the report;
    `timeout`: seconds a block's run may take on the host (None: the host's own)."""

    devices: str | None = None
    host: HostManager | None = None
    partition: Any = None
    replicas: int | str | None = None
    batching: BatchingConfig | None = None
    min_block_size: int = 1
    torch_executed_ops: frozenset[str] = field(default_factory=frozenset)
    custom_translation_table: Mapping[Any, Any] = field(default_factory=dict)
    dry_run: bool = False
    timeout: float | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any] | OffloadOptions | None) -> OffloadOptions:
        if isinstance(options, OffloadOptions):
            return options
        options = dict(options or {})
        unknown = sorted(set(options) - set(KEYS))
        if unknown:
            raise PrismError(f"prism backend: unknown option(s) {', '.join(map(str, unknown))}; "
                             f"known: {', '.join(KEYS)}")
        if options.get("devices") is not None and options.get("host") is not None:
            raise PrismError("prism backend: give either devices or host, not both")
        size = options.get("min_block_size", 1)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise PrismError(f"prism backend: min_block_size must be a whole number >= 1, "
                             f"got {size!r}")
        host = options.get("host")
        if host is not None and not all(hasattr(host, a) for a in ("add_network", "run")):
            raise PrismError(f"prism backend: host must be a HostManager, got "
                             f"{type(host).__name__}")
        devices = options.get("devices")
        if devices is not None and not isinstance(devices, str):
            devices = str(devices)  # a pathlib.Path of a TOML file
        if devices is not None:  # refused here, not found later while tracing
            try:
                parse_devices(devices)
            except PrismError as exc:
                raise PrismError(f"prism backend: devices: {exc}") from None
        return cls(devices=devices, host=host, partition=options.get("partition"),
                   replicas=options.get("replicas"),
                   batching=BatchingConfig.of(options.get("batching")),
                   min_block_size=size,
                   torch_executed_ops=op_names(options.get("torch_executed_ops") or ()),
                   custom_translation_table=_translations(
                       options.get("custom_translation_table")),
                   dry_run=bool(options.get("dry_run", False)),
                   timeout=options.get("timeout"))

    @property
    def device_spec(self) -> str:
        return self.devices or DEFAULT_DEVICES

    def device_configs(self) -> list[DeviceConfig]:
        """The devices of `device_spec`, their onnxruntime threads sleeping between runs
        (`spin=0`): spinning, they starve PyTorch's threads on the same cores (Faster R-CNN
        on one device of two threads, on 2 cores: 205 ms a call spinning, 80 ms not)."""
        return [replace(d, spin=False) for d in parse_devices(self.device_spec)]


def _translations(table: object) -> dict[Any, Any]:
    """`custom_translation_table` checked: keys operator overloads (what a graph's nodes
    call: `torch.ops.mylib.op.default`, not `torch.ops.mylib.op`) or, as torch.onnx takes
    them, Python functions on sizes (`operator.floordiv`); values callables."""
    if table is None:
        return {}
    if not isinstance(table, Mapping):
        raise PrismError(f"prism backend: custom_translation_table must map operators to "
                         f"translations, got {type(table).__name__}")
    for op, translation in table.items():
        if hasattr(op, "overloads") or not callable(op):  # a packet matches no node
            hint = " (name an overload: .default)" if hasattr(op, "overloads") else ""
            raise PrismError(f"prism backend: custom_translation_table: {op!r} is not an "
                             f"operator overload{hint}")
        if not callable(translation) and not (
                isinstance(translation, list | tuple) and all(map(callable, translation))):
            raise PrismError(f"prism backend: custom_translation_table: the translation of "
                             f"{op_name(op)} is not a function")
    return dict(table)


def op_name(op: object) -> str:
    """An operator as the report names it: `aten.sub.Tensor` (an overload) or `aten.sub`
    (every overload), from an op object or any of the spellings PyTorch prints."""
    text = str(op).strip()
    text = text.removeprefix("torch.ops.").replace("::", ".")
    if "." not in text:
        text = f"aten.{text}"
    return text


def op_names(ops: Iterable[object] | str) -> frozenset[str]:
    if isinstance(ops, str):
        ops = [ops]
    return frozenset(op_name(op) for op in ops)
