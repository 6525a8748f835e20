"""DeviceConfig: what a device is, and the figures the cost model reads from it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from runtime.errors import DeviceSpecError

BACKENDS = ("cpu", "reference", "sim", "ray")
RAY_TIMINGS = ("cpu", "sim")  # what a `ray` device's actor is: onnxruntime at speed, or a sim
# onnxruntime starts every intra-op thread when a session is made: 1,024 took 46 s on
# the 2-core CI machine kind. 256 is more than any one host's cores today.
MAX_THREADS = 256

# Per-thread figures for `cpu`, measured once on the 2-core CI machine kind with
# onnxruntime 1.31 and one intra-op thread: 512x512 MatMul 107 GFLOP/s (we take 80,
# since real layers are smaller), streaming Add 38 GB/s (we take 25), 4.8 us per
# single-Relu run, memcpy 22 GB/s. A copy between host devices also pays a thread
# hand-off (~20 us). See docs/performance.md, "Cost model defaults".
CPU_FLOPS_PER_THREAD = 80e9
CPU_MEM_BANDWIDTH = 25e9
CPU_LAUNCH_SECONDS = 5e-6
HOST_LINK_BANDWIDTH = 20e9
HOST_LINK_LATENCY = 20e-6
# int8 on the same machine (AVX-512 VNNI): a 512x512 MatMulInteger ran at 660-700 GOP/s,
# 3.6-3.8x the float MatMul beside it; narrow layers gain less, so we take 3x float.
INT8_SPEEDUP = {"cpu": 3.0, "reference": 1.0, "sim": 4.0, "ray": 3.0}
# A `ray` device is an actor process: a copy to or from it is a Ray call, measured at
# about 1 ms per hop and some 1 GB/s for 1 MB tensors on the 2-core machine kind
# (benchmarks/ray_devices.py).
RAY_LINK_BANDWIDTH = 1e9
RAY_LINK_LATENCY = 1e-3
PRECISIONS = ("float", "int8")

# Defaults per backend: (peak_flops, mem_bandwidth, link_bandwidth, launch, link latency, memory)
_DEFAULTS: dict[str, tuple[float, float, float, float, float, int]] = {
    "cpu": (CPU_FLOPS_PER_THREAD, CPU_MEM_BANDWIDTH, HOST_LINK_BANDWIDTH,
            CPU_LAUNCH_SECONDS, HOST_LINK_LATENCY, 2 << 30),
    # onnx's reference evaluator is pure numpy plus Python per node: far slower.
    "reference": (CPU_FLOPS_PER_THREAD / 4, CPU_MEM_BANDWIDTH / 2, HOST_LINK_BANDWIDTH,
                  200e-6, HOST_LINK_LATENCY, 2 << 30),
    # A modest accelerator on a PCIe-like link.
    "sim": (2e12, 100e9, 12e9, 10e-6, 10e-6, 512 << 20),
    # An onnxruntime CPU session in an actor process, behind a Ray call.
    "ray": (CPU_FLOPS_PER_THREAD, CPU_MEM_BANDWIDTH, RAY_LINK_BANDWIDTH,
            CPU_LAUNCH_SECONDS, RAY_LINK_LATENCY, 2 << 30),
}


@dataclass(frozen=True)
class DeviceConfig:
    """One device. Figures left as None take the backend's defaults, so once built every
    figure is set (hence typed without None; the ignores are for the defaults alone)."""

    name: str
    backend: str = "cpu"
    memory_bytes: int = None  # type: ignore[assignment]
    threads: int = 1
    peak_flops: float = None  # type: ignore[assignment]
    mem_bandwidth: float = None  # type: ignore[assignment]
    link_bandwidth: float = None  # type: ignore[assignment]
    supported_ops: frozenset[str] | None = None
    launch_seconds: float = None  # type: ignore[assignment]
    link_latency: float = None  # type: ignore[assignment]
    int8_ops: float = None  # type: ignore[assignment]  # peak int8 ops/s; default: see below
    precisions: frozenset[str] | None = None  # what it computes in (None: float and int8)
    # `ray` only: "sim" makes the actor keep a sim device's modelled time (and figures);
    # the Ray node to place the actor on (IP or node id); Ray resources it asks for.
    timing: str = "cpu"
    node: str | None = None
    resources: tuple[tuple[str, float], ...] = ()
    # `cpu` and `ray`: onnxruntime's intra-op threads spin between runs (its default), which
    # is fastest while they have the cores to themselves; off where another thread pool
    # shares them (PyTorch's, under torch.compile), whose threads they would starve.
    spin: bool = True
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise DeviceSpecError(f"device name must be a non-empty string, got {self.name!r}")
        if self.backend not in BACKENDS:
            raise DeviceSpecError(
                f"device {self.name}: unknown backend {self.backend!r}; "
                f"choose one of {', '.join(BACKENDS)}")
        if not 1 <= self.threads <= MAX_THREADS:
            raise DeviceSpecError(f"device {self.name}: threads must be >= 1 and <= "
                                  f"{MAX_THREADS}, got {self.threads}")
        self._check_ray()
        if not isinstance(self.spin, bool):
            raise DeviceSpecError(f"device {self.name}: spin must be true or false, "
                                  f"got {self.spin!r}")
        figures = "sim" if self.backend == "ray" and self.timing == "sim" else self.backend
        flops, bw, link, launch, latency, memory = _DEFAULTS[figures]
        if figures != self.backend:  # a sim behind a Ray call: sim compute, Ray's link
            link, latency = RAY_LINK_BANDWIDTH, RAY_LINK_LATENCY
        scale = self.threads if figures in ("cpu", "ray") else 1
        defaults = {"peak_flops": flops * scale, "mem_bandwidth": bw, "link_bandwidth": link,
                    "launch_seconds": launch, "link_latency": latency, "memory_bytes": memory}
        for key, value in defaults.items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        if self.int8_ops is None:
            object.__setattr__(self, "int8_ops", self.peak_flops * INT8_SPEEDUP[figures])
        for key in ("memory_bytes", "peak_flops", "mem_bandwidth", "link_bandwidth", "int8_ops"):
            value = getattr(self, key)
            if not 0 < value < float("inf") or (key == "memory_bytes" and value < 1):
                raise DeviceSpecError(f"device {self.name}: {key} must be positive and "
                                      f"finite, got {value!r}")
        for key in ("launch_seconds", "link_latency"):
            if not 0 <= getattr(self, key) < float("inf"):
                raise DeviceSpecError(f"device {self.name}: {key} must be >= 0")
        object.__setattr__(self, "memory_bytes", int(self.memory_bytes))
        if self.supported_ops is not None:
            object.__setattr__(self, "supported_ops", frozenset(self.supported_ops))
        if self.precisions is not None:
            object.__setattr__(self, "precisions", frozenset(self.precisions))
            wrong = sorted(self.precisions - set(PRECISIONS)) or not self.precisions
            if wrong:
                raise DeviceSpecError(f"device {self.name}: precisions must be some of "
                                      f"{', '.join(PRECISIONS)}, got {sorted(self.precisions)}")

    def _check_ray(self) -> None:
        ray_fields = self.timing != "cpu" or self.node is not None or self.resources
        if ray_fields and self.backend != "ray":
            raise DeviceSpecError(f"device {self.name}: timing, node and resources are for "
                                  f"ray devices, not {self.backend}")
        if self.timing not in RAY_TIMINGS:
            raise DeviceSpecError(f"device {self.name}: timing must be one of "
                                  f"{', '.join(RAY_TIMINGS)}, got {self.timing!r}")
        pairs = self.resources.items() if isinstance(self.resources, dict) else self.resources
        try:
            resources = tuple(sorted((str(k), float(v)) for k, v in pairs))
        except (TypeError, ValueError):
            raise DeviceSpecError(f"device {self.name}: resources must map names to "
                                  f"amounts, got {self.resources!r}") from None
        if any(not 0 <= v < float("inf") for _, v in resources):
            raise DeviceSpecError(f"device {self.name}: resource amounts must be >= 0 and "
                                  f"finite, got {dict(resources)}")
        object.__setattr__(self, "resources", resources)

    def can_run(self, op_type: str) -> bool:
        return self.supported_ops is None or op_type in self.supported_ops

    def with_name(self, name: str) -> DeviceConfig:
        return replace(self, name=name)

    def figures(self) -> tuple:
        """Everything compared but the name: devices with equal figures are twins (a
        dictionary key, so a thousand devices group in one pass)."""
        return tuple(getattr(self, f) for f in _FIGURES)

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        if self.supported_ops is not None:
            out["supported_ops"] = sorted(self.supported_ops)
        if self.precisions is not None:
            out["precisions"] = sorted(self.precisions)
        out["resources"] = dict(self.resources)
        return out


_FIGURES = tuple(f.name for f in fields(DeviceConfig) if f.compare and f.name != "name")
