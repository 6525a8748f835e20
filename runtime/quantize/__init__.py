"""Quantization on onnxruntime.quantization: calibration data, profiles, int8 models,
the accuracy-budget search and per-device precision."""

from runtime.quantize.data import QuantizeError, Samples, check_samples, read_samples
from runtime.quantize.narrow import slow_in_int8
from runtime.quantize.per_device import float_nodes_by_device
from runtime.quantize.quantizer import (
    FORMATS,
    METHODS,
    TYPES,
    Calibrated,
    QuantizeOptions,
    calibrate,
    prepare,
    profile,
    quantize,
)
from runtime.quantize.search import SearchResult, load_metric, parse_budget, search

__all__ = ["FORMATS", "METHODS", "TYPES", "Calibrated", "QuantizeError", "QuantizeOptions",
           "Samples", "SearchResult", "calibrate", "check_samples", "float_nodes_by_device",
           "load_metric", "parse_budget", "prepare", "profile", "quantize", "read_samples",
           "search", "slow_in_int8"]
