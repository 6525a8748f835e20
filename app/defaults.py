"""What a dashboard runs when told nothing: a bundled sample model, devices and load."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from runtime.bundle.reader import is_bundle, read_bundle
from runtime.devices.config import DeviceConfig

SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"
DEFAULT_MODEL = SAMPLES / "cnn.onnx"
DEFAULT_DEVICES = "cpu:2,sim:2:mem=256MB"
DEFAULT_RATE = 150.0  # requests/s, at most
LOAD_SHARE = 0.7  # of what the plan says its replicas can answer, for a slower network


def default_rate(bottleneck_seconds: float, replicas: int) -> float:
    """The live load a dashboard runs when told none: DEFAULT_RATE, or LOAD_SHARE of what
    the plan can answer when that is less (a heavy model of the user's own would else be
    swamped, its queue full and most requests failing)."""
    if bottleneck_seconds <= 0:
        return DEFAULT_RATE
    return round(min(DEFAULT_RATE, LOAD_SHARE * replicas / bottleneck_seconds), 1)


def sample_models() -> dict[str, Path]:
    """The bundled models by file name."""
    return {p.name: p for p in sorted(SAMPLES.glob("*.onnx"))}


def default_devices(model: Path) -> str:
    """DEFAULT_DEVICES; for a bundle, as many devices of each kind as it was compiled for,
    each with the memory its largest one needs when that is more than the kind's default."""
    if not is_bundle(model):
        return DEFAULT_DEVICES
    with read_bundle(model) as bundle:
        devices = bundle.manifest["devices"]
    kinds = Counter(d["kind"] for d in devices)
    spec = []
    for kind, count in kinds.items():
        need = max(d["memory_bytes"] for d in devices if d["kind"] == kind)
        roomy = need <= DeviceConfig(name=kind, backend=kind).memory_bytes
        spec.append(f"{kind}:{count}" + ("" if roomy else f":mem={need}"))
    return ",".join(spec)
