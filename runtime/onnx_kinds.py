"""What kind an ONNX node or tensor is, as the runtime asks it everywhere: an operator of
ONNX's own domain (by either of its two names), a float element type. Without importing
onnx: a device serving a bundle loads none (`test_the_host_loads_a_bundle_without_...`)."""

DEFAULT_DOMAINS = ("", "ai.onnx")
# TensorProto's FLOAT, FLOAT16, DOUBLE and BFLOAT16: numbers the ONNX standard fixes
FLOATS = frozenset({1, 10, 11, 16})
