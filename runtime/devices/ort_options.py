"""The onnxruntime session options every cpu partition runs under, just-in-time or from a
bundle: the two paths must agree for their answers to stay bit-identical. Imports only
onnxruntime, so the standalone bundle driver can use it."""

from __future__ import annotations

import onnxruntime as ort


def session_options(threads: int) -> ort.SessionOptions:
    """`threads` intra-op threads, one inter-op, sequential, quiet; full graph optimization
    (onnxruntime's default), which on a bundle's already optimized model adds only the
    machine-specific layout passes."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, int(threads))
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 4
    return opts
