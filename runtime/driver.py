"""The standalone driver's public name: `runtime.driver.open_bundle` (it lives in the
bundle room, `runtime/bundle/driver.py`). Imports numpy, onnxruntime and the bundle reader
only."""

from runtime.bundle.driver import POLICIES, Driver, open_bundle

__all__ = ["POLICIES", "Driver", "open_bundle"]
