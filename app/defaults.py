"""What a dashboard runs when told nothing: a bundled sample model, devices and load."""

from __future__ import annotations

from pathlib import Path

SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"
DEFAULT_MODEL = SAMPLES / "cnn.onnx"
DEFAULT_DEVICES = "cpu:2,sim:2:mem=256MB"
DEFAULT_RATE = 150.0  # requests/s


def sample_models() -> dict[str, Path]:
    """The bundled models by file name."""
    return {p.name: p for p in sorted(SAMPLES.glob("*.onnx"))}
