"""`--inputs FILE.npz`: one request's feeds, read and checked against the model before
anything runs. `prism run`, `prism bench` and the dashboards' live load send them; a
model (not a bundle, placed already) is also costed at their shapes and its costs
measured on their values, as `prism partition` and `prism compile` do with them."""

from __future__ import annotations

import argparse
import zlib
from pathlib import Path
from typing import TYPE_CHECKING
from zipfile import BadZipFile

import numpy as np

from runtime.bundle.reader import is_bundle, read_bundle
from runtime.errors import InvalidInputError, PrismError
from runtime.inputs import (
    InputSpec,
    bound_to_feeds,
    check_feeds,
    input_specs,
    npz_problem,
    sizes_given,
)

if TYPE_CHECKING:
    from runtime.graph import Graph

# what numpy and zipfile raise on a damaged archive (RuntimeError: "encrypted")
NPZ_ERRORS = (OSError, ValueError, EOFError, RuntimeError, BadZipFile, NotImplementedError,
              zlib.error)


def read_inputs(path: str, network: str, specs: list[InputSpec]) -> dict[str, np.ndarray]:
    """The feeds in an .npz file, checked against the model's inputs before anything runs."""
    try:
        with open(path, "rb") as file:
            head = file.read(6)
            if not head.startswith(b"PK"):  # numpy would try it as a pickle or one array
                one = "one array (.npy), " if head == b"\x93NUMPY" else ""
                raise ValueError(f"{one}not an .npz archive of named arrays (numpy.savez)")
            file.seek(0)
            with np.load(file, allow_pickle=False) as stored:
                feeds = dict(stored)
    except NPZ_ERRORS as exc:
        raise PrismError(f"cannot read inputs {path}: {npz_problem(exc)}") from None
    try:
        return check_feeds(network, specs, feeds)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{path}: {exc}") from None


def given_inputs(args: argparse.Namespace, options: dict) -> dict[str, np.ndarray] | None:
    """`--inputs`' feeds, or None. For a model, `options` (`add_network`'s or
    `compile_bundle`'s keywords) take them: `bindings` each symbolic dimension they give a
    size, where `--bind` says none, and `sample_feeds` the feeds."""
    if not args.inputs:
        return None
    network, specs = model_inputs(args.model, options["bindings"])
    feeds = read_inputs(args.inputs, network, specs)
    if not is_bundle(args.model):
        options["bindings"] = {**sizes_given(specs, feeds), **(options["bindings"] or {})} \
            or None
        options["sample_feeds"] = feeds
    return feeds


def inputs_for(model: str | Path, path: str | Path) -> dict[str, np.ndarray]:
    """The feeds in `path`, checked against the inputs of `model` (a model or a bundle)."""
    network, specs = model_inputs(str(model), None)
    return read_inputs(str(path), network, specs)


def graph_given_inputs(args: argparse.Namespace, graph: Graph, bindings: dict | None
                       ) -> tuple[Graph, dict[str, np.ndarray] | None]:
    """A loaded graph bound at `--inputs`' shapes, and their feeds (None without them)."""
    if not args.inputs:
        return graph, None
    feeds = read_inputs(args.inputs, graph.name, input_specs(graph))
    return bound_to_feeds(graph, feeds, bindings)


def model_inputs(path: str, bindings: dict | None) -> tuple[str, list[InputSpec]]:
    """A model's or a bundle's name and inputs, read without a host."""
    if is_bundle(path):
        with read_bundle(path) as bundle:
            manifest = bundle.manifest
        return manifest["network"], [InputSpec.from_dict(i) for i in manifest["inputs"]]
    from runtime.graph import load_graph

    graph = load_graph(path, bindings=bindings, name=Path(path).stem)
    return graph.name, input_specs(graph)
