"""The onnxruntime session options every cpu partition runs under, just-in-time or from a
bundle: the two paths must agree for their answers to stay bit-identical. Imports only
onnxruntime, so the standalone bundle driver can use it."""

from __future__ import annotations

import onnxruntime as ort

# A quantized model's float region ends in a QuantizeLinear. onnxruntime's QDQ
# propagation copies that one above a MaxPool, which then runs on uint8 in NCHW, a
# generic kernel 30x slower than the float one; off, a float stem keeps its float pool
# (outputs equal either way: max commutes with quantizing). docs/architecture.md.
SESSION_CONFIG = {"optimization.disable_specified_optimizers": "QDQPropagationTransformer"}


def session_options(threads: int) -> ort.SessionOptions:
    """`threads` intra-op threads, one inter-op, sequential, quiet; full graph optimization
    (onnxruntime's default), which on a bundle's already optimized model adds only the
    machine-specific layout passes."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, int(threads))
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 4
    for key, value in SESSION_CONFIG.items():
        opts.add_session_config_entry(key, value)
    return opts
