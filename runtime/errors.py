"""Typed errors. Every message is one line that names the thing at fault."""


class PrismError(Exception):
    """Base of every error Prism raises on purpose."""


class ModelLoadError(PrismError):
    """The model could not be read, checked or understood."""


class DeviceSpecError(PrismError):
    """A device list or device spec is malformed."""


class PartitionError(PrismError):
    """No valid plan exists for this model on these devices, or a plan is invalid."""
