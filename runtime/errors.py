"""Typed errors. Every message is one line that names the thing at fault."""

from __future__ import annotations

import re

from runtime.units import human_bytes


class PrismError(Exception):
    """Base of every error Prism raises on purpose."""


class ModelLoadError(PrismError):
    """The model could not be read, checked or understood."""


class DeviceSpecError(PrismError):
    """A device list or device spec is malformed."""


class PartitionError(PrismError):
    """No valid plan exists for this model on these devices, or a plan is invalid."""


class DeviceMemoryError(PrismError):
    """A load does not fit a device: says bytes needed and free (also as `needed`, `free`
    and `total`, when the device's account said it)."""

    needed: int | None = None
    free: int | None = None
    total: int | None = None

    @classmethod
    def short(cls, what: str, device: str, needed: int, free: int, total: int
              ) -> DeviceMemoryError:
        error = cls(f"{what} needs {human_bytes(needed)} on {device}, {human_bytes(free)} "
                    f"free of {human_bytes(total)}")
        error.needed, error.free, error.total = needed, free, total
        return error


class ProvisionError(PrismError):
    """A partition could not be compiled or loaded onto a device."""


class BundleError(PrismError):
    """A bundle cannot be used: not a bundle, corrupted, truncated, from a newer format,
    or asking for devices this host cannot give."""


class ExecutionError(PrismError):
    """A run failed; names network, partition, device and cause."""

    partition: str | None = None  # set by the executor: where the first error came from
    device: str | None = None


class DeviceLostError(ExecutionError):
    """A run failed because its device's worker died under it (a `ray` actor lost): the
    request may be retried once on another replica."""


class InvalidInputError(PrismError):
    """Feeds do not match the network's inputs: wrong name, dtype or shape."""


class QueueFullError(PrismError):
    """The host's request queue is at `max_queue`."""

    @classmethod
    def at(cls, limit: int) -> QueueFullError:
        return cls(f"request queue is full ({limit} waiting); retry later or raise max_queue")


class NetworkNotFoundError(PrismError):
    """No network of that name is loaded."""


class NetworkExistsError(PrismError):
    """A network of that name is already loaded."""


class NetworkBusyError(PrismError):
    """The network still has requests outstanding."""


class RequestTimeoutError(PrismError):
    """A request passed its timeout, queued or running."""


class HostClosedError(PrismError):
    """The host is closed or closing and takes no more requests."""


class TrainingError(PrismError):
    """A model cannot be trained as asked: an op with no gradient rule, labels or data that
    do not fit it, no trainable weights, devices that cannot keep weights."""


# where onnxruntime's C++ threw ("/onnxruntime_src/...string_normalizer.cc:235
# onnxruntime::StringNormalizer::Locale::Locale(const std::string&)::<lambda()> "), which
# comes before what went wrong and would push it out of a short message
_CPP_SOURCE = re.compile(r"\S+\.(?:cc|cpp|h):\d+ [^()]*\([^()]*\)\S*(?: const)?"
                         r"(?: \[with [^\]]*\])? ")


def without_source(text: str) -> str:
    """`text` without the C++ source line and function an onnxruntime error starts with."""
    return _CPP_SOURCE.sub("", text, count=1)


def first_line(exc: BaseException) -> str:
    """An exception's first non-blank line, or its type's name: for one-line messages."""
    return next((without_source(line.strip()) for line in str(exc).splitlines()
                 if line.strip()), type(exc).__name__)


def described(exc: BaseException) -> str:
    """An exception's type and first line ("SystemExit: 3"), or its type alone when it
    says nothing more ("KeyboardInterrupt")."""
    line, name = first_line(exc), type(exc).__name__
    return name if line == name else f"{name}: {line}"


def drop_frames(exc: BaseException) -> None:
    """Clear the local variables of every frame `exc` and the errors behind it (its cause
    and context) still hold, so what they referenced (a mapped file's arrays, say) can go
    before the error does."""
    import traceback

    seen: set[int] = set()
    chain: BaseException | None = exc
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        traceback.clear_frames(chain.__traceback__)
        chain = chain.__cause__ or chain.__context__
